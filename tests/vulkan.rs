//! Vulkan backend tests on whatever device `VKLLM_DEVICE` / the default
//! selection gives (lavapipe here): the kernel variants of one op (GEMV,
//! tiled and cooperative-matrix GEMM, the attention kernels) against
//! `vkllm::reference`, barrier placement, transfers, lifecycle and error
//! paths; each op's parity tests on every device are in tests/ops.rs. Each
//! test skips only when the machine has no Vulkan device
//! (VKLLM_REQUIRE_VULKAN=1 makes that a failure).
//!
//! Tolerances: results are compared with the f64 reference. Reductions in
//! f32 over k terms carry an error of about k·2⁻²⁴ times the sum of the
//! absolute terms, so matmul and attention are checked against
//! `TOL · Σ|terms|`.

mod common;

use common::{
    assert_close, download_f32, download_u32, rand_f32, upload_f32, upload_u32, weight_bytes,
};
use std::time::Duration;
use vkllm::backend::{
    Activation, AttentionParams, Buffer, ComputeBackend, LinearOpts, NextWeight, RopeParams,
    RopeStyle, Weight,
};
use vkllm::vk::{GemvKernel, Options, PrefillAttention, VulkanBackend};
use vkllm::{reference, DType, Error};

/// Relative bound for f32 sums of up to a few thousand terms (k·2⁻²⁴ ≈ 3e-5
/// at k = 512, with margin for the different summation order).
const TOL: f32 = 1e-4;
/// The f16 cooperative-matrix GEMM's bound: inputs rounded to f16 (11-bit
/// significands) and products accumulated in f32 give each term a relative
/// error of about 2 · 2⁻¹¹ ≈ 1e-3 (see matmul_coopmat_every_dtype).
const COOPMAT_TOL: f32 = 2e-3;

/// A Vulkan backend whose integer-dot GEMV takes weights of every size, or
/// None where the device has no integer dot products (nothing is quantized).
fn q8_everywhere() -> Option<VulkanBackend> {
    let mut b = common::vulkan_backend()?;
    if !b.kernels().gemv_q8 {
        return None;
    }
    b.set_gemv_q8(Some(0)).unwrap();
    // The GEMVs (a CPU device's decode matmuls take the matmul kernel).
    b.set_gemv(GemvKernel::Auto);
    Some(b)
}

/// Run `f` inside one pass.
fn pass(b: &mut VulkanBackend, f: impl FnOnce(&mut VulkanBackend)) {
    b.begin_pass().unwrap();
    f(b);
    b.end_pass().unwrap();
}

/// Σ|w·x| per output, the scale of matmul's rounding error.
fn abs_dot(dtype: DType, w: &[u8], rows: usize, cols: usize, x: &[f32], m: usize) -> Vec<f32> {
    let wf = reference::dequantize(dtype, w, rows, cols).unwrap();
    let mut out = vec![0f32; m * rows];
    for i in 0..m {
        for r in 0..rows {
            out[i * rows + r] = (0..cols)
                .map(|c| (wf[r * cols + c] * x[i * cols + c]).abs())
                .sum::<f32>()
                + 1e-3;
        }
    }
    out
}

/// Per output, how far matmul may be from the f32 reference: `TOL` of
/// Σ|w·x| (`COOPMAT_TOL` where more than 4 rows take `b`'s f16
/// cooperative-matrix GEMM), plus, when `b` rounds x to int8 digits for `dtype`
/// (mul_mat_vec_q8: blocks of 32, each value within max|x|/(127·508) of
/// d·(hi + lo/254)), the largest error that rounding can cause: Σ|w| times
/// that over each block.
fn gemv_allowed(
    b: &VulkanBackend,
    (dtype, wb): (DType, &[u8]),
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
) -> Vec<f32> {
    let tol = if m > 4 && b.kernels().matmul.is_coopmat() {
        COOPMAT_TOL
    } else {
        TOL
    };
    let mut allowed: Vec<f32> = abs_dot(dtype, wb, rows, cols, x, m)
        .iter()
        .map(|s| tol * s)
        .collect();
    let q8 = vkllm::vk::gemv_int_dot(dtype);
    if !(b.kernels().gemv_q8 && q8 && m <= 4) {
        return allowed;
    }
    let wf = reference::dequantize(dtype, wb, rows, cols).unwrap();
    for i in 0..m {
        let xr = &x[i * cols..(i + 1) * cols];
        let half_steps: Vec<f32> = xr
            .chunks(32)
            .map(|blk| blk.iter().fold(0f32, |a, v| a.max(v.abs())) / (127.0 * 508.0))
            .collect();
        for r in 0..rows {
            let wr = &wf[r * cols..(r + 1) * cols];
            let bound: f32 = wr
                .iter()
                .enumerate()
                .map(|(c, w)| w.abs() * half_steps[c / 32])
                .sum();
            allowed[i * rows + r] += bound * 1.01;
        }
    }
    allowed
}

/// `got` within `allowed[i]` of `want`, element by element.
fn assert_within(what: &str, got: &[f32], want: &[f32], allowed: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((g, w), a)) in got.iter().zip(want).zip(allowed).enumerate() {
        assert!(
            (g - w).abs() <= a.max(1e-30),
            "{what}[{i}]: got {g}, want {w} (allowed {a})"
        );
    }
}

/// One matmul of the uploaded weight `w` (`wb` on the host, `[rows, cols]`
/// of `dtype`) by `x` (`m` rows), with `bias` when given, checked against the
/// reference within `TOL` of Σ|w·x|; and again with int8 activations where
/// the device has them, within their rounding bound (see [`gemv_allowed`]).
#[allow(clippy::too_many_arguments)]
fn check_matmul(
    b: &mut VulkanBackend,
    what: &str,
    (dtype, wb, w): (DType, &[u8], &Weight),
    rows: usize,
    cols: usize,
    bias: Option<(&Buffer, &[f32])>,
    x: &[f32],
    m: usize,
) {
    let want = reference::matmul(dtype, wb, rows, cols, bias.map(|(_, v)| v), x, m).unwrap();
    let q8 = b.kernels().gemv_q8;
    for on in [false, true] {
        if on && !q8 {
            continue;
        }
        b.set_gemv_q8(on.then_some(0)).unwrap();
        let xb = upload_f32(b, x);
        let yb = b.alloc(m * rows * 4).unwrap();
        pass(b, |b| {
            b.matmul(w, bias.map(|(bb, _)| bb), &xb, &yb, m).unwrap()
        });
        let got = download_f32(b, &yb, m * rows);
        let allowed = gemv_allowed(b, (dtype, wb), rows, cols, x, m);
        assert_within(&format!("{what} (int8 x: {on})"), &got, &want, &allowed);
        b.free(xb);
        b.free(yb);
    }
}

#[test]
fn backend_is_send() {
    fn is_send<T: Send>() {}
    is_send::<VulkanBackend>();
}

#[test]
fn create_and_destroy_repeatedly_with_validation() {
    if common::vulkan_backend().is_none() {
        return;
    }
    let opts = Options {
        validate: true,
        ..Options::from_env()
    };
    for i in 0..5 {
        let mut b = VulkanBackend::new(&opts).unwrap();
        let data = rand_f32(1000, i);
        let buf = upload_f32(&mut b, &data);
        assert_eq!(download_f32(&mut b, &buf, 1000), data);
        b.begin_pass().unwrap();
        b.scale(&buf, 2.0, &buf, 1000).unwrap();
        b.end_pass().unwrap();
        let want: Vec<f32> = data.iter().map(|v| v * 2.0).collect();
        assert_eq!(download_f32(&mut b, &buf, 1000), want);
        b.free(buf);
    }
}

/// Asking for pipeline statistics (printed where the driver has
/// VK_KHR_pipeline_executable_properties; lavapipe has not) changes nothing
/// a pass computes, under the validation layer.
#[test]
fn pipeline_statistics_leave_results_alone() {
    if common::vulkan_backend().is_none() {
        return;
    }
    let opts = Options {
        validate: true,
        pipeline_stats: true,
        ..Options::from_env()
    };
    let mut b = VulkanBackend::new(&opts).unwrap();
    let data = rand_f32(1000, 3);
    let buf = upload_f32(&mut b, &data);
    pass(&mut b, |b| b.scale(&buf, 0.5, &buf, 1000).unwrap());
    let want: Vec<f32> = data.iter().map(|v| v * 0.5).collect();
    assert_eq!(download_f32(&mut b, &buf, 1000), want);
}

/// A wait that polls the fence (`Options::spin_wait`) returns only once the
/// pass has finished, as the sleeping wait does: after every replay the
/// mapped buffer the pass writes last holds that pass's values. Each pass
/// flips their sign through 63 dependent dispatches, so a wait returning
/// early would read the previous pass's.
#[test]
fn polling_and_sleeping_waits_see_every_pass_finished() {
    if common::vulkan_backend().is_none() {
        return;
    }
    let n = 1 << 16;
    for spin in [Duration::ZERO, Duration::from_secs(5)] {
        let opts = Options {
            validate: true,
            spin_wait: Some(spin),
            ..Options::from_env()
        };
        let mut b = VulkanBackend::new(&opts).unwrap();
        let mut want = rand_f32(n, 4);
        let a = upload_f32(&mut b, &want);
        let out = b.alloc_mapped(n * 4).unwrap();
        b.begin_replayable_pass(1).unwrap();
        for _ in 0..63 {
            b.scale(&a, -1.0, &a, n).unwrap();
        }
        b.copy(&a, 0, &out, 0, n * 4).unwrap();
        // end_pass runs the pass once; then each replay.
        b.end_pass().unwrap();
        for run in 0..8 {
            if run > 0 {
                assert!(b.replay(1, 1).unwrap(), "the pass was not kept");
            }
            want.iter_mut().for_each(|v| *v = -*v);
            assert_eq!(download_f32(&mut b, &out, n), want, "{spin:?}, run {run}");
        }
    }
}

#[test]
fn matmul_every_dtype_gemv_and_tiled() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let (rows, cols) = (70, 512);
    for (di, dtype) in DType::ALL.into_iter().enumerate() {
        let wb = weight_bytes(dtype, rows, cols, 100 + di as u64);
        let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
        let bias = rand_f32(rows, 7);
        let bias_buf = upload_f32(&mut b, &bias);
        // m = 1 and 3 take the GEMV kernel, 9 and 67 the tiled one (67 crosses a tile edge).
        for m in [1, 3, 9, 67] {
            let x = rand_f32(m * cols, 200 + m as u64);
            let with_bias = (m % 2 == 1).then_some((&bias_buf, &bias[..]));
            let what = format!("matmul {dtype} m={m}");
            check_matmul(
                &mut b,
                &what,
                (dtype, &wb, &w),
                rows,
                cols,
                with_bias,
                &x,
                m,
            );
        }
        b.free_weight(w);
        b.free(bias_buf);
    }
}

#[test]
fn matmul_gemv_model_sized_rows_every_m() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    // Row counts that are not a multiple of the rows per workgroup, model-sized
    // k (4096, and 14336 for the anchor types' FFN down projection), m = 1..4
    // sharing one pass over the weights. 2048 x 4096 (4.7-6.9 MB, twice as
    // many columns as rows): the integer-dot kernel shares its rows over the
    // workgroup there (vk/ops/matmul.rs shares_rows), two per subgroup below.
    let mut shapes: Vec<(DType, usize, usize)> =
        DType::ALL.into_iter().map(|d| (d, 37, 4096)).collect();
    for d in [
        DType::Q4K,
        DType::Q6K,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
    ] {
        shapes.push((d, 5, 14336));
    }
    for d in [DType::Q4K, DType::Q6K, DType::Q4_0] {
        shapes.push((d, 2048, 4096));
    }
    for (si, (dtype, rows, cols)) in shapes.into_iter().enumerate() {
        let wb = weight_bytes(dtype, rows, cols, 300 + si as u64);
        let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
        for m in 1..=4 {
            let x = rand_f32(m * cols, 400 + m as u64);
            let what = format!("matmul {dtype} {rows}x{cols} m={m}");
            check_matmul(&mut b, &what, (dtype, &wb, &w), rows, cols, None, &x, m);
        }
        b.free_weight(w);
    }
}

/// GPU-only: the cooperative-matrix GEMM (mul_mat_coopmat.comp) for every
/// weight dtype, where the device gets it (skipped, with a note, elsewhere:
/// lavapipe has no cooperative matrices). Inputs are rounded to f16 (11-bit
/// significands) and products accumulate in f32, so each term carries a
/// relative error of about 2 * 2⁻¹¹ ≈ 1e-3: the bound is 2e-3 · Σ|w·x|.
/// Shapes cross the 64 (n) x 128 (m) output tile on both edges, the K step
/// of 32 (F16 with k = 80 ends on half a step), and for F32 a reduction
/// length that is not a multiple of 4; even m without a bias stores whole
/// fragments straight to y where its row length is a multiple of 4 (300,
/// 200), through shared memory where not (130); a 2048 x 2048 weight
/// takes x converted to f16 by a dispatch of its own.
#[test]
fn matmul_coopmat_every_dtype() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    if !b.kernels().matmul.is_coopmat() {
        eprintln!(
            "skipped: {} gets an f32 GEMM ({}), not cooperative matrices",
            b.device_info().name,
            b.kernels()
        );
        return;
    }
    eprintln!("kernels: {}", b.kernels());
    let mut shapes: Vec<(DType, usize, usize)> =
        DType::ALL.into_iter().map(|d| (d, 300, 1024)).collect();
    shapes.push((DType::F32, 130, 102));
    shapes.push((DType::F16, 200, 80));
    shapes.push((DType::Q4K, 4096, 256));
    // 2048 x 2048 and up: x goes to the GEMM as f16 (half_rows.comp).
    shapes.push((DType::Q4_0, 2048, 2048));
    for (si, (dtype, rows, cols)) in shapes.into_iter().enumerate() {
        let wb = weight_bytes(dtype, rows, cols, 600 + si as u64);
        let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
        let bias = rand_f32(rows, 8);
        let bias_buf = upload_f32(&mut b, &bias);
        for m in [5, 64, 67, 130, 512] {
            let x = rand_f32(m * cols, 700 + m as u64);
            let with_bias = (m % 2 == 1).then_some((&bias_buf, &bias[..]));
            let xb = upload_f32(&mut b, &x);
            let yb = b.alloc(m * rows * 4).unwrap();
            pass(&mut b, |b| {
                b.matmul(&w, with_bias.map(|(bb, _)| bb), &xb, &yb, m)
                    .unwrap()
            });
            let got = download_f32(&mut b, &yb, m * rows);
            let want = reference::matmul(dtype, &wb, rows, cols, with_bias.map(|(_, v)| v), &x, m)
                .unwrap();
            let scale = abs_dot(dtype, &wb, rows, cols, &x, m);
            let what = format!("coopmat matmul {dtype} {rows}x{cols} m={m}");
            assert_close(&what, &got, &want, &scale, COOPMAT_TOL);
            b.free(xb);
            b.free(yb);
        }
        b.free_weight(w);
        b.free(bias_buf);
    }
}

/// Large tiled outputs (hundreds of mul_mat.comp workgroups) with partial
/// tiles on both edges and, for F32, a reduction length that is not a
/// multiple of 4.
#[test]
fn matmul_large_outputs_match_reference() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    for (dtype, rows, cols, m) in [
        (DType::F32, 1000, 70, 2050),
        (DType::Q8_0, 1000, 96, 2050),
        (DType::Q4K, 2100, 256, 1030),
    ] {
        let wb = weight_bytes(dtype, rows, cols, 500);
        let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
        let x = rand_f32(m * cols, 501);
        let what = format!("matmul {dtype} {rows}x{cols} m={m}");
        check_matmul(&mut b, &what, (dtype, &wb, &w), rows, cols, None, &x, m);
        b.free_weight(w);
    }
}

#[test]
fn matmul_float_weights_with_odd_columns() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let (rows, cols) = (33, 37);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let wb = weight_bytes(dtype, rows, cols, 5);
        let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
        for m in [1, 10] {
            let x = rand_f32(m * cols, 9);
            let what = format!("matmul {dtype} k=37 m={m}");
            check_matmul(&mut b, &what, (dtype, &wb, &w), rows, cols, None, &x, m);
        }
    }
}

#[test]
fn matmul_more_rows_than_one_dispatch_dimension() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    // 70000 output rows: more GEMV workgroups than maxComputeWorkGroupCount[0]
    // allows on lavapipe and NVIDIA (65535), so the dispatch is split over y.
    let (rows, cols) = (70_000, 32);
    let wb = weight_bytes(DType::Q8_0, rows, cols, 61);
    let w = b.upload_weight(DType::Q8_0, rows, cols, &wb).unwrap();
    let x = rand_f32(cols, 62);
    let xb = upload_f32(&mut b, &x);
    let yb = b.alloc(rows * 4).unwrap();
    let am = b.alloc(4).unwrap();
    pass(&mut b, |b| {
        b.matmul(&w, None, &xb, &yb, 1).unwrap();
        b.argmax(&yb, &am, 1, rows).unwrap();
    });
    let got = download_f32(&mut b, &yb, rows);
    let want = reference::matmul(DType::Q8_0, &wb, rows, cols, None, &x, 1).unwrap();
    let allowed = gemv_allowed(&b, (DType::Q8_0, &wb), rows, cols, &x, 1);
    assert_within("matmul 70000 rows", &got, &want, &allowed);
    assert_eq!(
        download_u32(&mut b, &am, 1),
        reference::argmax(&got, rows).unwrap()
    );
}

/// The decode attention writes its output as the integer-dot GEMV's int8
/// digits too, from its split merge (attention_combine.comp) or, unsplit,
/// from attention_decode.comp itself, so the o projection after it skips its
/// quantize dispatch: the projection of that output must equal, bit for bit,
/// the projection of a copy of it, which quantize_q8.comp quantizes; and the
/// pass must hold one quantize dispatch, the copy's. Rows 1 and 3, head_dim
/// 64 and 128, unsplit short spans, spans of 32 and 16 splits whose last
/// one merges (attention_decode_merge) and long ones merged by a dispatch,
/// and each whole in tiles of several heads (a CPU device's plan);
/// Q4_0, Q4_K
/// (their block sums enter the dot) and Q8_0 weights (the integer-dot kernel
/// on for every size). Told no next weight, the attention writes only f32
/// and the projection quantizes for itself.
#[test]
fn attention_merge_quantizes_like_quantize_q8() {
    let Some(mut b) = q8_everywhere() else {
        return;
    };
    // The last column: merge dispatches (a split span: 4 heads over 5K keys)
    // in a GPU's plans; each case runs those and whole spans (a CPU
    // device's plan: one workgroup per kv head and tile of heads, no merge).
    let cases = [
        (1, 300, 9, 3, 64, DType::Q4_0, 0),
        (1, 5000, 4, 4, 128, DType::Q4K, 1),
        // Splits of one head each whose last one merges (and quantizes):
        // 32 of a group of 1, and 16 of an 8B's groups of 4 over a short
        // span (one head per workgroup there, not 4).
        (1, 1000, 4, 4, 128, DType::Q4K, 0),
        (1, 1000, 32, 8, 128, DType::Q4K, 0),
        // Over 5K keys: one head per workgroup for groups of 4 and 8 at
        // head_dim 64 (Llama-3.2-1B's, TinyLlama's), a merge dispatch for
        // groups of 16.
        (1, 5000, 32, 8, 64, DType::Q4_0, 0),
        (1, 5000, 32, 4, 64, DType::Q4_0, 0),
        (1, 5000, 32, 2, 64, DType::Q4_0, 1),
        (3, 100, 8, 2, 128, DType::Q8_0, 0),
        (3, 100, 8, 2, 128, DType::Q4K, 0),
    ];
    for ((rows, depth, n_heads, n_kv_heads, head_dim, dtype, merges), splits) in
        cases.into_iter().flat_map(|c| [(c, true), (c, false)])
    {
        b.set_decode_splits(splits);
        let merges = if splits { merges } else { 0 };
        let what = format!(
            "rows {rows} depth {depth} {n_heads}/{n_kv_heads} hd {head_dim} splits {splits}"
        );
        let (mut p, positions, q, k, v) = attention_case(
            (rows, depth, n_heads, n_kv_heads, head_dim, 0),
            DType::F32,
            71,
        );
        let dim = n_heads * head_dim;
        let n_out = 96;
        let wb = weight_bytes(dtype, n_out, dim, 72);
        let w = b.upload_weight(dtype, n_out, dim, &wb).unwrap();
        p.next = Some(NextWeight::of(&w));
        let (qb, kb, vb) = (
            upload_f32(&mut b, &q),
            upload_f32(&mut b, &k),
            upload_f32(&mut b, &v),
        );
        let pb = upload_u32(&mut b, &positions);
        let att = b.alloc(rows * dim * 4).unwrap();
        let copy = b.alloc(rows * dim * 4).unwrap();
        let (y_fused, y_copy) = (
            b.alloc(rows * n_out * 4).unwrap(),
            b.alloc(rows * n_out * 4).unwrap(),
        );
        pass(&mut b, |b| {
            b.attention(&qb, &kb, &vb, &pb, &att, &p).unwrap();
            b.matmul(&w, None, &att, &y_fused, rows).unwrap();
            b.copy(&att, 0, &copy, 0, rows * dim * 4).unwrap();
            b.matmul(&w, None, &copy, &y_copy, rows).unwrap();
        });
        // attention (and its merge), matmul, quantize (of the copy), matmul.
        assert_eq!(
            b.last_pass_stats().unwrap().dispatches,
            4 + merges,
            "{what}"
        );
        let fused = download_f32(&mut b, &y_fused, rows * n_out);
        let copied = download_f32(&mut b, &y_copy, rows * n_out);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&copied), "{what}");
        // And both are the projection of the attention (int8-digit steps).
        let a = download_f32(&mut b, &att, rows * dim);
        let want = reference::matmul(dtype, &wb, n_out, dim, None, &a, rows).unwrap();
        let allowed = gemv_allowed(&b, (dtype, &wb), n_out, dim, &a, rows);
        assert_within(&what, &fused, &want, &allowed);
        let unknown = AttentionParams { next: None, ..p };
        pass(&mut b, |b| {
            b.attention(&qb, &kb, &vb, &pb, &att, &unknown).unwrap();
            b.matmul(&w, None, &att, &y_copy, rows).unwrap();
        });
        // attention (and its merge), quantize, matmul.
        assert_eq!(
            b.last_pass_stats().unwrap().dispatches,
            3 + merges,
            "{what}: no next weight"
        );
        let a = download_f32(&mut b, &att, rows * dim);
        let want = reference::matmul(dtype, &wb, n_out, dim, None, &a, rows).unwrap();
        let allowed = gemv_allowed(&b, (dtype, &wb), n_out, dim, &a, rows);
        let got = download_f32(&mut b, &y_copy, rows * n_out);
        assert_within(&format!("{what}, no next weight"), &got, &want, &allowed);
        for buf in [qb, kb, vb, pb, att, copy, y_fused, y_copy] {
            b.free(buf);
        }
    }
}

#[test]
fn decode_attention_last_split_merges_in_replayed_passes() {
    // SmolLM2's heads (9 / 3, head_dim 64) over a span planned for 1024
    // keys: split, and small enough for the last split to merge the others
    // (attention_decode_merge, no combine dispatch). Its arrival counts
    // must start at zero and be left at zero by every pass, so a replayed
    // pass at other positions (other numbers of active splits) still
    // merges once, with every split in.
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    b.set_decode_splits(true);
    let (mut p, _, q, k, v) = attention_case((1, 1100, 9, 3, 64, 0), DType::F32, 91);
    p.span = 1024;
    let (qb, kb, vb) = (
        upload_f32(&mut b, &q),
        upload_f32(&mut b, &k),
        upload_f32(&mut b, &v),
    );
    let pb = upload_u32(&mut b, &[0]);
    let ob = b.alloc(q.len() * 4).unwrap();
    let key = 3;
    let mut kept = Vec::new();
    for pos in [700u32, 1000, 40, 1023, 333] {
        b.upload(&pb, 0, bytemuck::bytes_of(&pos)).unwrap();
        let replayed = b.replay(key, 1).unwrap();
        if !replayed {
            b.begin_replayable_pass(key).unwrap();
            b.attention(&qb, &kb, &vb, &pb, &ob, &p).unwrap();
            b.end_pass().unwrap();
            assert_eq!(b.stats().dispatches, 1, "no merge dispatch");
        }
        kept.push(replayed);
        let got = download_f32(&mut b, &ob, q.len());
        let want = reference::attention(&q, &k, &v, &[pos], &p).unwrap();
        let ones = vec![1.0f32; q.len()];
        assert_close(&format!("position {pos}"), &got, &want, &ones, TOL);
    }
    assert!(kept.ends_with(&[true, true, true]), "replays: {kept:?}");
    for buf in [qb, kb, vb, pb, ob] {
        b.free(buf);
    }
}

/// (rows, depth, n_heads, n_kv_heads, head_dim, window) of a prefill
/// attention case.
type AttentionShape = (usize, usize, usize, usize, usize, usize);

/// A prefill attention case: `rows` query rows at positions `depth`.. of a
/// cache of depth + rows + 5, with random q and k in [-2, 2] (large scores
/// make the softmax peaky, so a wrong running max or a masked key leaking in
/// shows) and v in [-1, 1]. Returns (params, positions, q, k, v).
fn attention_case(
    (rows, depth, n_heads, n_kv_heads, head_dim, window): AttentionShape,
    kv_dtype: DType,
    seed: u64,
) -> (AttentionParams, Vec<u32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let p = AttentionParams {
        rows,
        n_heads,
        n_kv_heads,
        head_dim,
        capacity: depth + rows + 5,
        span: depth + rows + 5,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window,
        kv_dtype,
        next: None,
    };
    let positions: Vec<u32> = (depth as u32..(depth + rows) as u32).collect();
    let doubled = |v: Vec<f32>| -> Vec<f32> { v.iter().map(|x| x * 2.0).collect() };
    let kv = p.capacity * n_kv_heads * head_dim;
    let q = doubled(rand_f32(rows * n_heads * head_dim, seed));
    let k = doubled(rand_f32(kv, seed + 1));
    let v = rand_f32(kv, seed + 2);
    (p, positions, q, k, v)
}

/// Prefill attention (the device's prefill kernel, the flash tiles and the
/// decode kernel for every row, `VKLLM_ATTENTION=decode`, with the device's
/// own decode plans, for more than 4 rows; the decode kernel for 1): many rows of consecutive
/// positions at depth 0 and after a long prior cache, GQA ratios 1/3/4,
/// head_dim 64 and 128, with and without a sliding window. Outputs are
/// convex combinations of values in [-1, 1], so the bound is absolute: TOL
/// (1e-4; f32 online softmax against the f64 reference differs by ~1e-6
/// here).
#[test]
fn attention_prefill_many_rows_long_cache() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let mut kernels = vec![b.kernels().attention];
    for k in [PrefillAttention::Flash, PrefillAttention::Decode] {
        if !kernels.contains(&k) {
            kernels.push(k);
        }
    }
    for kernel in kernels {
        b.set_attention(kernel).unwrap();
        prefill_many_rows_long_cache(&mut b);
    }
}

fn prefill_many_rows_long_cache(b: &mut VulkanBackend) {
    eprintln!(
        "kernels: {}; shared memory {} B",
        b.kernels(),
        b.device_info().caps.max_shared_memory
    );
    // (rows, depth, n_heads, n_kv_heads, head_dim, window)
    let cases = [
        (1, 0, 4, 4, 64, 0),
        (7, 0, 9, 3, 64, 0),
        (64, 0, 8, 2, 128, 0),
        (130, 0, 6, 2, 64, 0),
        (130, 0, 4, 1, 128, 40),
        (1, 650, 8, 2, 128, 0),
        (7, 650, 4, 4, 128, 0),
        (64, 620, 9, 3, 64, 0),
        (130, 600, 8, 2, 64, 0),
        (64, 610, 4, 1, 128, 100),
        (130, 640, 6, 2, 64, 37),
        (33, 700, 3, 3, 80, 0),
    ];
    for (ci, case) in cases.into_iter().enumerate() {
        let (p, positions, q, k, v) = attention_case(case, DType::F32, 1000 + 10 * ci as u64);
        let (rows, depth, n_heads, n_kv_heads, head_dim, window) = case;
        let (qb, kb, vb) = (upload_f32(b, &q), upload_f32(b, &k), upload_f32(b, &v));
        let pb = upload_u32(b, &positions);
        let ob = b.alloc(q.len() * 4).unwrap();
        pass(b, |b| b.attention(&qb, &kb, &vb, &pb, &ob, &p).unwrap());
        let got = download_f32(b, &ob, q.len());
        let want = reference::attention(&q, &k, &v, &positions, &p).unwrap();
        let scale = vec![1.0f32; q.len()];
        assert_close(
            &format!(
                "attention rows {rows} depth {depth} heads {n_heads}/{n_kv_heads} \
                 hd {head_dim} window {window}"
            ),
            &got,
            &want,
            &scale,
            TOL,
        );
        for buf in [qb, kb, vb, pb, ob] {
            b.free(buf);
        }
    }
}

/// GPU-only: prefill attention on cooperative matrices
/// (attention_prefill_coopmat.comp) over an f16 cache, where the device
/// gets it (skipped, with a note, elsewhere). The kernel rounds q·scale and
/// the probabilities to f16; the reference takes the same rounded q (with
/// scale 1) and the f16 cache, so what is left is the probabilities'
/// rounding (2⁻¹¹ of each weight; outputs within 1 in magnitude): 2e-3
/// absolute. Cases cross the 64-vector query tile and the 32-key tile, with
/// GQA groups of 1-4, head_dim 64 and 128, windows, rows deep into the
/// cache, and more query vectors than rows (keys past each row masked per
/// row).
#[test]
fn attention_prefill_coopmat_f16_cache() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    if b.kernels().attention != PrefillAttention::Coopmat {
        eprintln!(
            "skipped: {} gets {}, not cooperative-matrix attention",
            b.device_info().name,
            b.kernels()
        );
        return;
    }
    // (rows, depth, n_heads, n_kv_heads, head_dim, window)
    let cases = [
        (7, 0, 9, 3, 64, 0),
        (64, 0, 8, 2, 128, 0),
        (130, 0, 6, 2, 64, 0),
        (130, 0, 4, 1, 128, 40),
        (7, 650, 4, 4, 128, 0),
        (64, 620, 9, 3, 64, 0),
        (130, 600, 8, 2, 64, 0),
        (64, 610, 4, 1, 128, 100),
        (300, 4000, 32, 8, 128, 0),
        // Key splits (from capacities of 1024 up), with a window.
        (130, 1500, 8, 2, 64, 300),
        (200, 2100, 9, 3, 64, 0),
    ];
    let f16 = |v: &[f32]| -> Vec<half::f16> { v.iter().map(|&x| half::f16::from_f32(x)).collect() };
    for (ci, case) in cases.into_iter().enumerate() {
        let (p, positions, q, k, v) = attention_case(case, DType::F16, 2000 + 10 * ci as u64);
        let (rows, depth, n_heads, n_kv_heads, head_dim, window) = case;
        let (k, v) = (f16(&k), f16(&v));
        let (kb, vb) = (b.alloc(k.len() * 2).unwrap(), b.alloc(v.len() * 2).unwrap());
        b.upload(&kb, 0, bytemuck::cast_slice(&k)).unwrap();
        b.upload(&vb, 0, bytemuck::cast_slice(&v)).unwrap();
        let qb = upload_f32(&mut b, &q);
        let pb = upload_u32(&mut b, &positions);
        let ob = b.alloc(q.len() * 4).unwrap();
        pass(&mut b, |b| {
            b.attention(&qb, &kb, &vb, &pb, &ob, &p).unwrap()
        });
        let got = download_f32(&mut b, &ob, q.len());
        let q16: Vec<f32> = f16(&q.iter().map(|x| x * p.scale).collect::<Vec<_>>())
            .iter()
            .map(|h| h.to_f32())
            .collect();
        let widen = |h: &[half::f16]| -> Vec<f32> { h.iter().map(|x| x.to_f32()).collect() };
        let p32 = AttentionParams {
            scale: 1.0,
            kv_dtype: DType::F32,
            ..p
        };
        let want = reference::attention(&q16, &widen(&k), &widen(&v), &positions, &p32).unwrap();
        let scale = vec![1.0f32; q.len()];
        assert_close(
            &format!(
                "coopmat attention rows {rows} depth {depth} heads {n_heads}/{n_kv_heads} \
                 hd {head_dim} window {window}"
            ),
            &got,
            &want,
            &scale,
            2e-3,
        );
        for buf in [qb, kb, vb, pb, ob] {
            b.free(buf);
        }
    }
}

#[test]
fn barriers_only_between_dependent_ops() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let (dim, n) = (64, 64);
    let x = rand_f32(dim, 51);
    let wq = weight_bytes(DType::F32, n, dim, 52);
    let wk = weight_bytes(DType::F32, n, dim, 53);
    let wv = weight_bytes(DType::F32, n, dim, 54);
    let xb = upload_f32(&mut b, &x);
    let mut ws = Vec::new();
    for wb in [&wq, &wk, &wv] {
        ws.push(b.upload_weight(DType::F32, n, dim, wb).unwrap());
    }
    let outs: Vec<Buffer> = (0..3).map(|_| b.alloc(n * 4).unwrap()).collect();
    let sum = b.alloc(n * 4).unwrap();

    // Three projections of the same input: independent, no barrier.
    b.begin_pass().unwrap();
    for (w, o) in ws.iter().zip(&outs) {
        b.matmul(w, None, &xb, o, 1).unwrap();
    }
    b.end_pass().unwrap();
    let s = b.stats();
    eprintln!("independent projections: {s:?}");
    assert_eq!(
        (s.dispatches, s.barriers, s.submits, s.descriptor_sets),
        (3, 0, 1, 3)
    );

    // A dependent chain: q + k -> sum, sum * 2 -> sum, sum + v -> sum.
    b.begin_pass().unwrap();
    for (w, o) in ws.iter().zip(&outs) {
        b.matmul(w, None, &xb, o, 1).unwrap();
    }
    b.add(&outs[0], &outs[1], &sum, n).unwrap();
    b.scale(&sum, 2.0, &sum, n).unwrap();
    b.add(&sum, &outs[2], &sum, n).unwrap();
    b.end_pass().unwrap();
    let s = b.stats();
    eprintln!("projections + dependent chain: {s:?}");
    assert_eq!((s.dispatches, s.barriers, s.submits), (6, 3, 1));

    // KV-cache append then attention over the cache: the copy's write is
    // read by attention (one barrier); the second copy, into the other
    // cache, is independent of the first.
    let cache = b.alloc(2 * n * 4).unwrap();
    let vcache = b.alloc(2 * n * 4).unwrap();
    let pos = upload_u32(&mut b, &[1]);
    let att_out = b.alloc(n * 4).unwrap();
    let att = AttentionParams {
        rows: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: n,
        capacity: 2,
        span: 2,
        scale: 0.125,
        window: 0,
        kv_dtype: DType::F32,
        next: None,
    };
    b.begin_pass().unwrap();
    b.copy(&outs[1], 0, &cache, n * 4, n * 4).unwrap();
    b.copy(&outs[2], 0, &vcache, n * 4, n * 4).unwrap();
    b.attention(&outs[0], &cache, &vcache, &pos, &att_out, &att)
        .unwrap();
    b.end_pass().unwrap();
    let s = b.stats();
    eprintln!("kv append + attention: {s:?}");
    assert_eq!((s.copies, s.dispatches, s.barriers), (2, 1, 1));

    // Embedding and attention flag bad inputs in a shared status word with
    // atomics; that alone must not order them.
    let table = b.upload_weight(DType::F32, n, dim, &wq).unwrap();
    let ids = upload_u32(&mut b, &[3]);
    b.begin_pass().unwrap();
    b.embedding(&table, &ids, &outs[1], 1).unwrap();
    b.attention(&outs[0], &cache, &vcache, &pos, &att_out, &att)
        .unwrap();
    b.embedding(&table, &ids, &outs[2], 1).unwrap();
    b.end_pass().unwrap();
    let s = b.stats();
    eprintln!("two embeddings + attention: {s:?}");
    assert_eq!((s.dispatches, s.barriers), (3, 0));

    let q = reference::matmul(DType::F32, &wq, n, dim, None, &x, 1).unwrap();
    let k = reference::matmul(DType::F32, &wk, n, dim, None, &x, 1).unwrap();
    let v = reference::matmul(DType::F32, &wv, n, dim, None, &x, 1).unwrap();
    let want: Vec<f32> = (0..n).map(|i| (q[i] + k[i]) * 2.0 + v[i]).collect();
    let scale = vec![dim as f32; n];
    assert_close("chain", &download_f32(&mut b, &sum, n), &want, &scale, TOL);
}

#[test]
fn replayed_pass_reads_new_token_and_position() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let (vocab, dim, cap) = (16, 64, 8);
    let table_bytes = weight_bytes(DType::Q8_0, vocab, dim, 71);
    let table = b
        .upload_weight(DType::Q8_0, vocab, dim, &table_bytes)
        .unwrap();
    let wb = weight_bytes(DType::Q4_0, vocab, dim, 72);
    let w = b.upload_weight(DType::Q4_0, vocab, dim, &wb).unwrap();
    let kv = rand_f32(cap * dim, 73);
    let kc = upload_f32(&mut b, &kv);
    let ids = upload_u32(&mut b, &[3]);
    let pos = upload_u32(&mut b, &[0]);
    let h = b.alloc(dim * 4).unwrap();
    let a = b.alloc(dim * 4).unwrap();
    let logits = b.alloc(vocab * 4).unwrap();
    let best = b.alloc(4).unwrap();
    let att = AttentionParams {
        rows: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: dim,
        capacity: cap,
        span: cap,
        scale: 0.125,
        window: 0,
        kv_dtype: DType::F32,
        next: None,
    };
    // One decode step: embed, attend over positions 0..=pos, project, argmax.
    let record = |b: &mut VulkanBackend| {
        pass(b, |b| {
            b.embedding(&table, &ids, &h, 1).unwrap();
            b.attention(&h, &kc, &kc, &pos, &a, &att).unwrap();
            b.matmul(&w, None, &a, &logits, 1).unwrap();
            b.argmax(&logits, &best, 1, vocab).unwrap();
        })
    };
    let expect = |token: u32, p: u32| {
        let e = reference::embedding(DType::Q8_0, &table_bytes, vocab, dim, &[token]).unwrap();
        let at = reference::attention(&e, &kv, &kv, &[p], &att).unwrap();
        let y = reference::matmul(DType::Q4_0, &wb, vocab, dim, None, &at, 1).unwrap();
        (at, y)
    };
    record(&mut b);
    for (token, p) in [(5u32, 2u32), (11, 6)] {
        b.upload(&ids, 0, bytemuck::bytes_of(&token)).unwrap();
        b.upload(&pos, 0, bytemuck::bytes_of(&p)).unwrap();
        b.replay_pass().unwrap();
        let got = download_f32(&mut b, &logits, vocab);
        let (at, want) = expect(token, p);
        let allowed = gemv_allowed(&b, (DType::Q4_0, &wb), vocab, dim, &at, 1);
        assert_within(
            &format!("replay token {token} pos {p}"),
            &got,
            &want,
            &allowed,
        );
        assert_eq!(
            download_u32(&mut b, &best, 1),
            reference::argmax(&got, vocab).unwrap()
        );
    }
    // A freed buffer ends replays.
    let tmp = b.alloc(4).unwrap();
    b.free(tmp);
    assert!(b.replay_pass().is_err(), "replay after free");
}

#[test]
fn passes_longer_than_one_descriptor_pool() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    // 1500 dispatches need more descriptor sets than one pool holds (1024);
    // the second pass reuses the pools after their reset.
    let x = upload_f32(&mut b, &[0.0; 8]);
    let ones = upload_f32(&mut b, &[1.0; 8]);
    for round in 1..=2 {
        pass(&mut b, |b| {
            for _ in 0..1500 {
                b.add(&x, &ones, &x, 8).unwrap();
            }
        });
        let s = b.stats();
        assert_eq!(
            (s.dispatches, s.descriptor_sets, s.barriers),
            (1500, 1500, 1499)
        );
        assert_eq!(download_f32(&mut b, &x, 8), vec![1500.0 * round as f32; 8]);
    }
}

#[test]
fn large_upload_download_round_trip() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    // Larger than the 64 MiB staging buffer, so transfers go in chunks.
    let bytes = 100 << 20;
    let data: Vec<u8> = (0..bytes).map(|i| (i * 7 + i / 4096) as u8).collect();
    let buf = b.alloc(bytes + 12).unwrap();
    b.upload(&buf, 12, &data).unwrap();
    let mut out = vec![0u8; bytes];
    b.download(&buf, 12, &mut out).unwrap();
    assert!(out == data, "round trip differs");
    let mut head = [1u8; 12];
    b.download(&buf, 0, &mut head).unwrap();
    assert_eq!(head, [0u8; 12]);
}

#[test]
fn grid_sync_probe_rounds_see_the_round_before() {
    // benches/dispatch.rs's probe: each round adds 1 to what another
    // workgroup wrote in the round before, so after n rounds from zeros
    // every value is n, whether the rounds are dispatches (with the
    // recorder's barriers) or meet at the grid barrier. A CPU device runs
    // workgroups one after another, so the grid barrier is checked there
    // only with one workgroup.
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let grid_groups = if b.device_info().kind == "CPU" { 1 } else { 64 };
    for (groups, sync) in [(4, false), (grid_groups, true)] {
        let bytes = vkllm::vk::grid_sync_bytes(groups);
        let data = b.alloc(bytes).unwrap();
        b.upload(&data, 0, &vec![0u8; bytes]).unwrap();
        let rounds = 5;
        pass(&mut b, |b| {
            if sync {
                b.grid_sync(&data, groups, rounds, 0, true).unwrap();
            } else {
                for i in 0..rounds {
                    b.grid_sync(&data, groups, 1, i, false).unwrap();
                }
            }
        });
        let words = download_u32(&mut b, &data, 4 + 2 * groups * 128);
        assert_eq!(words[2], 0, "no workgroup gave up waiting");
        // Round 4 (the last) read the first half and wrote the second.
        let last = &words[4 + groups * 128..];
        assert!(
            last.iter().all(|&w| f32::from_bits(w) == rounds as f32),
            "{groups} workgroups, sync {sync}: {:?}",
            &last[..8]
        );
        b.free(data);
    }
}

/// Steps of the flow_gemv probe's chain over `words` (three n x n weights)
/// from `first`, ordered by `order`: v's rows and the flow words.
fn flow_chain(
    b: &mut VulkanBackend,
    words: &[u32],
    first: &[f32],
    steps: usize,
    order: vkllm::vk::FlowOrder,
) -> (Vec<f32>, Vec<u32>) {
    use vkllm::vk::{flow_gemv_flow_bytes, flow_gemv_weight_bytes};
    let n = first.len();
    let copies = words.len() * 4 / flow_gemv_weight_bytes(n);
    let w = b.alloc(words.len() * 4).unwrap();
    b.upload(&w, 0, bytemuck::cast_slice(words)).unwrap();
    let v = b.alloc((steps + 1) * n * 4).unwrap();
    b.upload(&v, 0, &vec![0u8; (steps + 1) * n * 4]).unwrap();
    b.upload(&v, 0, bytemuck::cast_slice(first)).unwrap();
    let fb = flow_gemv_flow_bytes(steps);
    let flow = b.alloc(fb).unwrap();
    b.upload(&flow, 0, &vec![0u8; fb]).unwrap();
    pass(b, |b| {
        for i in 0..steps {
            b.flow_gemv(&flow, &v, &w, i % copies, n, i, order).unwrap();
        }
    });
    let flags = download_u32(b, &flow, 4 + steps);
    let vals = download_u32(b, &v, (steps + 1) * n)
        .into_iter()
        .map(f32::from_bits)
        .collect();
    for buf in [w, v, flow] {
        b.free(buf);
    }
    (vals, flags)
}

#[test]
fn flow_gemv_probe_waiting_chain_equals_the_barrier_chain() {
    // benches/dispatch.rs's probe: a chain of GEMVs whose dispatches wait
    // on counts instead of barriers must read every step's input after it
    // is written, so it gives the barrier chain's values exactly. The
    // waiting chains run without the validation layer: they leave Vulkan's
    // ordering on purpose (what the probe measures), and its
    // synchronization validation reports every step.
    use vkllm::vk::{flow_gemv_weight_bytes, FlowOrder, Options};
    let (n, steps, copies) = (1024, 6, 3);
    let words: Vec<u32> = (0..copies * flow_gemv_weight_bytes(n) / 4)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7))
        .collect();
    let first: Vec<f32> = (0..n).map(|i| ((i * 37) % 19) as f32 / 9.0 - 1.0).collect();
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let (barrier, _) = flow_chain(&mut b, &words, &first, steps, FlowOrder::Barrier);
    drop(b);
    // The scalar GEMV of step 0, so the chain computes what it says.
    let nib = |row: usize, i: usize| {
        let word = words[row * n / 8 + i / 8];
        ((word >> (4 * (i % 8))) & 15) as f32 - 8.0
    };
    for row in [0, 1, 517, n - 1] {
        let want: f32 = (0..n).map(|i| nib(row, i) * first[i]).sum::<f32>() / n as f32;
        let got = barrier[n + row];
        assert!((got - want).abs() < 1e-4, "row {row}: {got} vs {want}");
    }
    assert!(barrier[steps * n..].iter().any(|&x| x != 0.0));
    let unvalidated = Options {
        validate: false,
        ..Options::from_env()
    };
    let Some(mut b) = common::vulkan_with(&unvalidated) else {
        return;
    };
    for order in [FlowOrder::Wait { backoff: 8 }, FlowOrder::WaitPairs] {
        let (vals, flags) = flow_chain(&mut b, &words, &first, steps, order);
        assert_eq!(flags[0], 0, "{order:?}: no workgroup gave up waiting");
        assert!(
            flags[4..].iter().all(|&c| c as usize == n / 8),
            "{order:?}: every workgroup of every step counted itself: {:?}",
            &flags[4..]
        );
        assert!(vals == barrier, "{order:?}: the waiting chain differs");
    }
}

#[test]
fn copy_probe_fits_the_devices_binding_range() {
    // `vkllm bench` asks for 256 MiB; lavapipe binds at most 128 MiB, and
    // the probe's streaming kernel failed there. A request past the range
    // is probed at the range. (Devices that bind more than 1 GiB skip: the
    // request would allocate twice that.)
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let range = b
        .max_op_buffer_bytes()
        .expect("a Vulkan device has a binding range");
    if range > 1 << 30 {
        return;
    }
    let gbs = vkllm::bench::bandwidth::backend_copy_gbs(&mut b, range as usize + 4096, 1).unwrap();
    assert!(gbs.is_finite() && gbs > 0.0, "{gbs} GB/s");
}

#[test]
fn bad_device_selection_is_a_typed_error() {
    if common::vulkan_backend().is_none() {
        return;
    }
    for sel in ["no-such-device-anywhere", "99"] {
        let opts = Options {
            device: Some(sel.into()),
            ..Options::default()
        };
        match VulkanBackend::new(&opts) {
            Err(Error::Vulkan(msg)) => assert!(msg.contains(sel), "{msg}"),
            Err(e) => panic!("wrong error kind: {e}"),
            Ok(_) => panic!("VKLLM_DEVICE={sel} should not open"),
        }
    }
}

#[test]
fn out_of_range_shapes_are_errors() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let small = b.alloc(16).unwrap();
    let big = b.alloc(64).unwrap();
    let wb = weight_bytes(DType::Q4_0, 4, 32, 1);
    assert!(
        b.upload_weight(DType::Q4_0, 4, 33, &wb).is_err(),
        "cols not whole blocks"
    );
    assert!(
        b.upload_weight(DType::Q4_0, 5, 32, &wb).is_err(),
        "too few bytes"
    );
    assert!(
        b.upload(&small, 10, &[0u8; 8]).is_err(),
        "upload past the end"
    );
    // Out of memory is a variant a host app can match (and back off from).
    match b.alloc(1 << 50) {
        Err(e @ Error::OutOfDeviceMemory { .. }) => {
            assert!(e.to_string().contains("memory"), "{e}");
            assert_eq!(e.kind(), vkllm::ErrorKind::OutOfDeviceMemory);
        }
        other => panic!("a 1 PiB buffer should be out of device memory, got {other:?}"),
    }
    let w = b.upload_weight(DType::Q4_0, 4, 32, &wb).unwrap();
    assert!(
        b.scale(&small, 1.0, &small, 4).is_err(),
        "op outside a pass"
    );

    b.begin_pass().unwrap();
    assert!(b.matmul(&w, None, &small, &big, 1).is_err(), "x too small");
    assert!(b.matmul(&w, None, &big, &big, 1).is_err(), "y aliases x");
    let rope = RopeParams {
        rows: 1,
        n_heads: 1,
        head_dim: 4,
        rot_dim: 3,
        base: 1e4,
        style: RopeStyle::Neox,
    };
    assert!(b.rope(&small, &big, &rope).is_err(), "odd rot_dim");
    let att = AttentionParams {
        rows: 1,
        n_heads: 3,
        n_kv_heads: 2,
        head_dim: 1,
        capacity: 1,
        span: 1,
        scale: 1.0,
        window: 0,
        kv_dtype: DType::F32,
        next: None,
    };
    assert!(
        b.attention(&small, &small, &small, &small, &big, &att)
            .is_err(),
        "3 heads over 2"
    );
    assert!(
        b.copy(&small, 0, &big, 56, 12).is_err(),
        "copy past the end"
    );
    assert!(b.copy(&small, 2, &big, 8, 4).is_err(), "unaligned copy");
    assert!(b.argmax(&small, &big, 1, 0).is_err(), "empty rows");
    assert!(
        b.rms_norm(&small, &small, &small, 1, 4, 1e-5).is_err(),
        "out aliases x"
    );
    assert!(
        b.download(&small, 0, &mut [0u8; 4]).is_err(),
        "download inside a pass"
    );
    assert!(b.begin_pass().is_err(), "nested pass");
    b.end_pass().unwrap();
    assert!(b.end_pass().is_err(), "end without begin");

    let forged = Buffer::new(small.id(), 1 << 20);
    assert!(
        b.upload(&forged, 0, &[0u8; 1024]).is_err(),
        "handle larger than its buffer"
    );
    let gone = b.alloc(4).unwrap();
    b.free(gone);
    b.begin_pass().unwrap();
    assert!(b.scale(&gone, 1.0, &big, 1).is_err(), "freed buffer");
    b.end_pass().unwrap();

    // A token id past the table is reported when the pass ends.
    let table = b.upload_weight(DType::F32, 2, 4, &[0u8; 32]).unwrap();
    let ids = upload_u32(&mut b, &[1, 5]);
    b.begin_pass().unwrap();
    b.embedding(&table, &ids, &big, 2).unwrap();
    match b.end_pass() {
        Err(Error::Op {
            op: "embedding",
            msg,
        }) => assert!(msg.contains('5'), "{msg}"),
        other => panic!("expected a bad token id error, got {other:?}"),
    }

    // So is a position past the KV cache.
    let cache = b.alloc(2 * 4 * 4).unwrap();
    let pos = upload_u32(&mut b, &[2]);
    let one_head = AttentionParams {
        rows: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 4,
        capacity: 2,
        span: 2,
        scale: 1.0,
        window: 0,
        kv_dtype: DType::F32,
        next: None,
    };
    b.begin_pass().unwrap();
    b.attention(&small, &cache, &cache, &pos, &big, &one_head)
        .unwrap();
    match b.end_pass() {
        Err(Error::Op {
            op: "attention",
            msg,
        }) => assert!(msg.contains('2'), "{msg}"),
        other => panic!("expected a bad position error, got {other:?}"),
    }

    // The backend still works after all of that.
    let x = upload_f32(&mut b, &[1.0, 2.0, 3.0, 4.0]);
    pass(&mut b, |b| b.scale(&x, 3.0, &x, 4).unwrap());
    assert_eq!(download_f32(&mut b, &x, 4), vec![3.0, 6.0, 9.0, 12.0]);
}

/// The pipeline cache goes to disk when the backend drops and comes back
/// when the next one opens; a file from elsewhere (here: garbage under the
/// same name) is ignored, not an error. (lavapipe keeps its pipelines in
/// Mesa's own cache and writes only the 32-byte header; NVIDIA's driver
/// writes the pipelines too.)
#[test]
fn pipeline_cache_round_trips_through_disk() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        pipeline_cache: Some(dir.path().to_path_buf()),
        ..Options::from_env()
    };
    let run = |b: &mut VulkanBackend| {
        let x = upload_f32(b, &[1.0, 2.0, 3.0, 4.0]);
        let y = b.alloc(16).unwrap();
        pass(b, |b| b.scale(&x, 2.0, &y, 4).unwrap());
        assert_eq!(download_f32(b, &y, 4), [2.0, 4.0, 6.0, 8.0]);
    };
    let Some(mut b) = common::vulkan_with(&opts) else {
        return;
    };
    assert_eq!(b.pipeline_cache_loaded_bytes(), 0, "an empty directory");
    run(&mut b);
    drop(b);
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one cache file: {files:?}");
    let written = std::fs::metadata(&files[0]).unwrap().len() as usize;
    assert!(written >= 32, "the header at least");
    let mut b = common::vulkan_with(&opts).unwrap();
    assert_eq!(
        b.pipeline_cache_loaded_bytes(),
        written,
        "the cache was read back"
    );
    eprintln!(
        "{}: {written} bytes of pipeline cache",
        b.device_info().name
    );
    run(&mut b);
    drop(b);
    std::fs::write(&files[0], vec![7u8; 4096]).unwrap();
    let mut b = common::vulkan_with(&opts).unwrap();
    assert_eq!(
        b.pipeline_cache_loaded_bytes(),
        0,
        "a foreign file is ignored"
    );
    run(&mut b);
}

/// That GLU GEMV also quantizes its own input (mul_mat_vec_q8in), bit for
/// bit as quantize_q8.comp does: its output equals that of the same GLU
/// reading x's digits from a quantize dispatch (made for a matmul of the same
/// normed x just before), over one round of the workgroup and over several,
/// with and without the norm.
#[test]
fn glu_quantizes_its_input_like_quantize_q8() {
    let Some(mut b) = q8_everywhere() else {
        return;
    };
    for (dtype, n, cols) in [
        (DType::Q4K, 64, 256),
        (DType::Q6K, 32, 2304),
        (DType::Q4_0, 96, 4096),
    ] {
        let gub = weight_bytes(dtype, 2 * n, cols, 17);
        let gate_up = b.upload_weight(dtype, 2 * n, cols, &gub).unwrap();
        let ob = weight_bytes(DType::Q8_0, 32, cols, 19);
        let other = b.upload_weight(DType::Q8_0, 32, cols, &ob).unwrap();
        let x = upload_f32(&mut b, &rand_f32(cols, 5));
        let nw = upload_f32(&mut b, &rand_f32(cols, 6));
        let [own, given, y] = [n, n, 32].map(|len| b.alloc(len * 4).unwrap());
        for norm in [Some((&nw, 1e-5)), None] {
            let o = LinearOpts {
                norm,
                ..LinearOpts::default()
            };
            pass(&mut b, |b| {
                b.linear_glu(Activation::Silu, &gate_up, &x, &own, 1, norm)
                    .unwrap();
            });
            // The glu alone.
            assert_eq!(b.last_pass_stats().unwrap().dispatches, 1, "{dtype}");
            pass(&mut b, |b| {
                b.linear(&other, &x, &y, 1, &o).unwrap();
                b.linear_glu(Activation::Silu, &gate_up, &x, &given, 1, norm)
                    .unwrap();
            });
            // quantize, matmul, glu (reading the quantize's digits).
            assert_eq!(b.last_pass_stats().unwrap().dispatches, 3, "{dtype}");
            let bits = |y: &Buffer, b: &mut VulkanBackend| {
                let v = download_f32(b, y, n);
                assert!(v.iter().any(|x| *x != 0.0), "{dtype}");
                v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            let what = format!("{dtype} norm={}", norm.is_some());
            assert_eq!(bits(&own, &mut b), bits(&given, &mut b), "{what}");
        }
        for buf in [x, nw, own, given, y] {
            b.free(buf);
        }
        b.free_weight(gate_up);
        b.free_weight(other);
    }
}

/// A GLU GEMV small enough to write its output's int8 digits itself
/// (mul_mat_vec.comp's Q8OUT) writes them bit for bit as quantize_q8.comp
/// would: the down projection reading them gives the same bits as one
/// reading a copy, which is quantized by a dispatch of its own.
#[test]
fn glu_writes_digits_like_quantize_q8() {
    let Some(mut b) = q8_everywhere() else {
        return;
    };
    for (dtype, n, cols, n_down) in [(DType::Q4K, 64, 256, 32), (DType::Q4_0, 96, 64, 40)] {
        let gub = weight_bytes(dtype, 2 * n, cols, 7);
        let gate_up = b.upload_weight(dtype, 2 * n, cols, &gub).unwrap();
        let db = weight_bytes(DType::Q8_0, n_down, n, 9);
        let down = b.upload_weight(DType::Q8_0, n_down, n, &db).unwrap();
        let x = upload_f32(&mut b, &rand_f32(cols, 3));
        let nw = upload_f32(&mut b, &rand_f32(cols, 4));
        let [h, copy, y_digits, y_copy] =
            [n, n, n_down, n_down].map(|len| b.alloc(len * 4).unwrap());
        pass(&mut b, |b| {
            b.linear_glu(Activation::Silu, &gate_up, &x, &h, 1, Some((&nw, 1e-5)))
                .unwrap();
            b.matmul(&down, None, &h, &y_digits, 1).unwrap();
            b.copy(&h, 0, &copy, 0, n * 4).unwrap();
            b.matmul(&down, None, &copy, &y_copy, 1).unwrap();
        });
        // glu (quantizing x itself), matmul; quantize (the copy), matmul.
        assert_eq!(b.last_pass_stats().unwrap().dispatches, 4, "{dtype}");
        let bits = |y: &Buffer, b: &mut VulkanBackend| {
            let v = download_f32(b, y, n_down);
            assert!(v.iter().any(|x| *x != 0.0), "{dtype}");
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(bits(&y_digits, &mut b), bits(&y_copy, &mut b), "{dtype}");
        for buf in [x, nw, h, copy, y_digits, y_copy] {
            b.free(buf);
        }
    }
}
