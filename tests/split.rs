//! Weights larger than one storage-buffer binding (vk/split.rs): the split
//! limit is lowered so small weights come in several parts, and matmul
//! (GEMV and tiled, with bias) and embedding must still match the reference
//! exactly as an unsplit weight does. The real case, Gemma 3's 189 MB
//! embedding on lavapipe's 128 MiB range, is in tests/gemma3.rs.

mod common;

use common::{download_f32, rand_f32, upload_f32, upload_u32};
use vkllm::backend::ComputeBackend;
use vkllm::quants::quantize_row;
use vkllm::vk::VulkanBackend;
use vkllm::{reference, DType};

/// `rows x cols` of `dtype` bytes quantized from random values.
fn weight_bytes(dtype: DType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let vals = rand_f32(rows * cols, seed);
    let rb = dtype.row_bytes(cols).unwrap();
    let mut out = vec![0u8; rows * rb];
    for (src, dst) in vals.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
        quantize_row(dtype, src, dst).unwrap();
    }
    out
}

/// A backend whose weights split into parts of at most `limit` bytes.
fn backend(limit: u64) -> Option<VulkanBackend> {
    let mut b = common::vulkan_backend()?;
    b.set_weight_part_limit(limit);
    Some(b)
}

/// Dispatches of one pass running `f`.
fn dispatches(b: &mut VulkanBackend, f: impl FnOnce(&mut VulkanBackend)) -> u32 {
    b.begin_pass().unwrap();
    f(b);
    b.end_pass().unwrap();
    b.stats().dispatches
}

#[test]
fn split_matmul_matches_reference() {
    // 300 rows in parts of at most 64 (Q8_0: 8 blocks of 36 packed bytes a
    // row at 256 columns): 5 parts, the last one short.
    let (rows, cols) = (300, 256);
    for dtype in [DType::Q8_0, DType::F32, DType::Q4K, DType::Q6K, DType::F16] {
        let packed_row = match dtype {
            DType::Q8_0 => 8 * 36,
            DType::Q6K => 212,
            _ => dtype.row_bytes(cols).unwrap(),
        } as u64;
        let Some(mut b) = backend(64 * packed_row) else {
            return;
        };
        let wb = weight_bytes(dtype, rows, cols, 11);
        let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
        let bias = rand_f32(rows, 12);
        let bb = upload_f32(&mut b, &bias);
        // GEMV (m ≤ 4) and tiled GEMM (m > 4, partial tiles on both edges).
        for m in [1, 3, 70] {
            let x = rand_f32(m * cols, 13 + m as u64);
            let xb = upload_f32(&mut b, &x);
            let yb = b.alloc(m * rows * 4).unwrap();
            let n = dispatches(&mut b, |b| b.matmul(&w, Some(&bb), &xb, &yb, m).unwrap());
            assert_eq!(n, 5, "{dtype}: one dispatch per part");
            let got = download_f32(&mut b, &yb, m * rows);
            let want = reference::matmul(dtype, &wb, rows, cols, Some(&bias), &x, m).unwrap();
            let err = common::max_abs_diff(&got, &want);
            // f32 sums of 256 terms of |w·x| ≤ 1 each.
            assert!(err < 1e-3, "{dtype} m={m}: max error {err}");
            b.free(xb);
            b.free(yb);
        }
        b.free_weight(w);
    }
}

#[test]
fn split_embedding_matches_reference() {
    let (rows, cols) = (100, 64);
    let dtype = DType::Q8_0;
    // 2 blocks of 36 packed bytes a row; parts of 16 rows: 7 parts.
    let Some(mut b) = backend(16 * 72) else {
        return;
    };
    let wb = weight_bytes(dtype, rows, cols, 21);
    let table = b.upload_weight(dtype, rows, cols, &wb).unwrap();
    // First and last rows of parts, repeats, the table's last row.
    let ids = [0u32, 15, 16, 31, 99, 47, 48, 16, 96, 63, 64, 0];
    let idb = upload_u32(&mut b, &ids);
    let out = b.alloc(ids.len() * cols * 4).unwrap();
    let n = dispatches(&mut b, |b| {
        b.embedding(&table, &idb, &out, ids.len()).unwrap()
    });
    assert_eq!(n, 7, "one dispatch per part");
    let got = download_f32(&mut b, &out, ids.len() * cols);
    let want = reference::embedding(dtype, &wb, rows, cols, &ids).unwrap();
    assert!(common::max_abs_diff(&got, &want) <= 1e-6);

    // An id past the whole table is still caught (no part holds it).
    let bad = upload_u32(&mut b, &[3, 100]);
    b.begin_pass().unwrap();
    b.embedding(&table, &bad, &out, 2).unwrap();
    let e = b.end_pass().unwrap_err().to_string();
    assert!(e.contains("100"), "{e}");
    b.free_weight(table);
}

#[test]
fn one_row_over_the_limit_is_an_error() {
    let Some(mut b) = backend(100) else {
        return;
    };
    let wb = weight_bytes(DType::F32, 4, 64, 1);
    let e = b.upload_weight(DType::F32, 4, 64, &wb).unwrap_err();
    assert!(e.to_string().contains("exceeds"), "{e}");
}
