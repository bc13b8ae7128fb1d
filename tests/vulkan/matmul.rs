//! The matmul kernels: the GEMVs (f32 and integer-dot), the tiled and
//! cooperative-matrix GEMMs, and the GLU GEMV's int8 digits.

use crate::common::{
    self, assert_close, download_f32, download_u32, pass, rand_f32, upload_f32, weight_bytes,
};
use crate::{abs_dot, assert_within, gemv_allowed, q8_everywhere, COOPMAT_TOL};
use vkllm::backend::{Activation, Buffer, ComputeBackend, LinearOpts, Weight};
use vkllm::vk::VulkanBackend;
use vkllm::{reference, DType};

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
        DType::TQ1_0,
        DType::TQ2_0,
    ] {
        shapes.push((d, 5, 14336));
    }
    for d in [
        DType::Q4K,
        DType::Q6K,
        DType::Q4_0,
        DType::TQ1_0,
        DType::TQ2_0,
    ] {
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
        check_coopmat(
            &mut b,
            (dtype, rows, cols),
            &[5, 64, 67, 130, 512],
            600 + si as u64,
        );
    }
}

/// The cooperative-matrix GEMM of a random `rows x cols` weight against the
/// reference for each row count in `ms`, odd counts with a bias, within
/// [`COOPMAT_TOL`] of Σ|w·x|.
fn check_coopmat(
    b: &mut VulkanBackend,
    (dtype, rows, cols): (DType, usize, usize),
    ms: &[usize],
    seed: u64,
) {
    let wb = weight_bytes(dtype, rows, cols, seed);
    let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
    let bias = rand_f32(rows, seed + 1);
    let bias_buf = upload_f32(b, &bias);
    for &m in ms {
        let x = rand_f32(m * cols, seed + 100 + m as u64);
        let with_bias = (m % 2 == 1).then_some((&bias_buf, &bias[..]));
        let xb = upload_f32(b, &x);
        let yb = b.alloc(m * rows * 4).unwrap();
        pass(b, |b| {
            b.matmul(&w, with_bias.map(|(bb, _)| bb), &xb, &yb, m)
                .unwrap()
        });
        let got = download_f32(b, &yb, m * rows);
        let want =
            reference::matmul(dtype, &wb, rows, cols, with_bias.map(|(_, v)| v), &x, m).unwrap();
        let scale = abs_dot(dtype, &wb, rows, cols, &x, m);
        let what = format!("coopmat matmul {dtype} {rows}x{cols} m={m}");
        assert_close(&what, &got, &want, &scale, COOPMAT_TOL);
        b.free(xb);
        b.free(yb);
    }
    b.free_weight(w);
    b.free(bias_buf);
}

/// GPU-only: the cooperative-matrix GEMM's large tile (128 x 128 from 16
/// subgroups, taken from 96 tiles up), with partial tiles on both edges
/// (n = 4100 / 3100, m = 521 with a bias): F16 and Q5_K runs read 16 bytes
/// a load (dq16_half), Q6_K and Q4_0 pack dq16's floats, x comes as f16
/// where n · k reaches 4 Mi (8 values a load), F16 with k = 1040 ends on a
/// quarter slice, and F32 with k = 102 takes the element-by-element fetch.
#[test]
fn matmul_coopmat_large_tile() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    if !b.kernels().matmul.is_coopmat() {
        eprintln!(
            "skipped: {} has no cooperative-matrix GEMM",
            b.device_info().name
        );
        return;
    }
    let shapes: [(DType, usize, usize); 6] = [
        (DType::F16, 4100, 1040),
        (DType::Q5K, 4100, 1024),
        (DType::Q4K, 4100, 1024),
        (DType::Q4_0, 4100, 1024),
        (DType::Q6K, 3100, 256),
        (DType::F32, 3100, 102),
    ];
    let ms = [512usize, 521];
    for (si, (dtype, rows, cols)) in shapes.into_iter().enumerate() {
        for m in ms {
            assert!(
                rows.div_ceil(128) * m.div_ceil(128) >= 96,
                "not the large tile"
            );
        }
        check_coopmat(&mut b, (dtype, rows, cols), &ms, 900 + 10 * si as u64);
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
        b.argmax(&yb, None, &am, 1, rows).unwrap();
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
