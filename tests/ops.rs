//! Every `ComputeBackend` op on every backend against `vkllm::reference`:
//! each test is one function of a backend, which `test_device!` runs as
//! `<test>_cpu` (every CPU instruction set available here) and
//! `<test>_vulkan` (skipped without a Vulkan device).
//!
//! Tolerances are stated per test. The reference sums in f64 over weights
//! dequantized exactly, so the f32 backends differ from it only by f32
//! rounding and summation order.

mod common;

use common::{
    assert_close, assert_ulps, download_f32, download_u32, max_abs_diff, rand_f32, upload_f32,
    upload_u32, weight_bytes,
};
use vkllm::backend::{
    Activation, AttentionParams, ComputeBackend, LinearOpts, RopeParams, RopeStyle,
};
use vkllm::cpu::act::{self, ActRows, ACT_BLOCK};
use vkllm::cpu::{Activations, CpuBackend, Isa};
use vkllm::vk::{GemvKernel, MatmulKernel};
use vkllm::{reference, DType};

/// A backend under test and the name failures print.
type Named = (String, Box<dyn ComputeBackend>);
/// A matmul backend under test: name, backend, and how its matmuls round
/// activations.
type Rounded = (String, Box<dyn ComputeBackend>, Rounding);

/// The CPU with the best instruction set here, then with each other one this
/// machine supports, so the AVX2 and scalar kernels are tested too.
fn cpu_backends() -> Vec<Named> {
    let mut v: Vec<Named> = vec![("cpu".to_string(), common::cpu())];
    let best = Isa::detect();
    for isa in Isa::ALL {
        if isa != best {
            if let Ok(b) = CpuBackend::with_isa(Some(2), isa) {
                v.push((format!("cpu-{}", isa.name()), Box::new(b)));
            }
        }
    }
    v
}

/// Vulkan with an exact f32 GEMM ([`common::vulkan_exact`]); none
/// without a device (a failure with VKLLM_REQUIRE_VULKAN=1).
fn vulkan_backends() -> Vec<Named> {
    common::vulkan_exact()
        .map(|b| ("vulkan".to_string(), b))
        .into_iter()
        .collect()
}

/// [`vulkan_backends`], and where the device runs a CPU device's attention
/// plans (decode spans taken whole, `Kernels::decode_splits`; prefill rows
/// on the decode kernel, `PrefillAttention::Decode`) again with a GPU's
/// ([`common::vulkan_gpu_plans_backend`]): key splits and their merges, the
/// flash prefill tiles. So both are tested on it.
fn decode_vulkan_backends() -> Vec<Named> {
    let mut v = vulkan_backends();
    if let Some(b) = common::vulkan_gpu_plans_backend() {
        v.push(("vulkan-gpu-plans".to_string(), Box::new(b)));
    }
    v
}

/// `cpu_backends()` in the default activation mode, then the CPU's other
/// activation modes on every instruction set.
fn matmul_cpu_backends() -> Vec<Rounded> {
    let mut v: Vec<_> = cpu_backends()
        .into_iter()
        .map(|(n, b)| (n, b, Rounding::of(Activations::default())))
        .collect();
    for isa in Isa::ALL {
        for acts in [Activations::F32, Activations::Q16, Activations::Q8] {
            if acts == Activations::default() {
                continue;
            }
            if let Ok(b) = CpuBackend::with_isa(Some(2), isa) {
                let name = format!("cpu-{}-{}", isa.name(), acts.name());
                v.push((name, Box::new(b.with_activations(acts)), Rounding::of(acts)));
            }
        }
    }
    v
}

/// Vulkan up to four times, so that every GEMM and GEMV kernel the device
/// can run is tested on it: the integer-dot GEMV with two-digit int8 decode
/// activations where the device has integer dot products (steps of
/// max|x|/(127·254); prefill on its exact f32 GEMM, see
/// [`common::vulkan_exact`]: the lanes on a CPU device), the f32 tiles with
/// the f32 GEMVs, the f32 lanes with the device's own decode matmuls (on a
/// CPU device the lanes too: `GemvKernel::Gemm`), and its f16
/// cooperative-matrix GEMM where the device has one.
fn matmul_vulkan_backends() -> Vec<Rounded> {
    let mut v: Vec<Rounded> = Vec::new();
    for kind in ["vulkan-q8", "vulkan", "vulkan-lanes", "vulkan-coopmat"] {
        let Some(mut b) = common::vulkan_backend() else {
            break;
        };
        let opened = b.kernels().matmul;
        let exact = if opened.is_coopmat() {
            MatmulKernel::Tiles
        } else {
            opened
        };
        let (rounding, matmul) = match kind {
            "vulkan-q8" if b.kernels().gemv_q8 => (Rounding::DecodeSteps(127.0 * 254.0), exact),
            "vulkan" => (Rounding::None, MatmulKernel::Tiles),
            "vulkan-lanes" if b.set_matmul(MatmulKernel::Lanes).is_ok() => {
                (Rounding::None, MatmulKernel::Lanes)
            }
            "vulkan-coopmat" if opened.is_coopmat() => (Rounding::F16Gemm, opened),
            _ => continue,
        };
        if kind != "vulkan-lanes" && b.kernels().gemv == GemvKernel::Gemm {
            b.set_gemv(GemvKernel::Auto);
        }
        b.set_gemv_q8((kind == "vulkan-q8").then_some(0)).unwrap();
        b.set_matmul(matmul).unwrap();
        v.push((kind.to_string(), Box::new(b), rounding));
    }
    v
}

/// How a backend rounds a matmul's inputs.
#[derive(Clone, Copy)]
enum Rounding {
    /// Not at all: f32 throughout.
    None,
    /// Activations of the integer-dot weight types, to steps of
    /// max|x_block| / .0 (the CPU: decode, and prefill where it has integer
    /// kernels; the bound holds for its f32 prefill elsewhere too).
    Steps(f32),
    /// As `Steps`, in decode (m <= 4) only.
    DecodeSteps(f32),
    /// Prefill (m > 4) weights and activations to f16 (the cooperative-
    /// matrix GEMM).
    F16Gemm,
}

impl Rounding {
    fn of(acts: Activations) -> Rounding {
        match acts {
            Activations::F32 => Rounding::None,
            Activations::Q16 => Rounding::Steps(32767.0),
            Activations::Q8 => Rounding::Steps(127.0),
        }
    }
}

/// The most that rounding the inputs as `r` can move output `r` of row `x`
/// (`k` values) of a matmul with `m` rows. Integer steps: each value moves
/// by at most half a step, `max|x_block| / (2·MAX)`, times `|w|` (zero for
/// other weight types, and for prefill with `DecodeSteps`). F16 GEMM: w and x each within 2⁻¹¹
/// relative (plus half f16's subnormal spacing, 2⁻²⁵), so each product
/// within 2⁻¹⁰·|w·x| + 2⁻²⁵·(|w| + |x|) (zero for decode).
fn activation_bound(r: Rounding, dtype: DType, w: &[f32], x: &[f32], m: usize) -> f32 {
    let max = match r {
        Rounding::None => return 0.0,
        Rounding::F16Gemm if m <= 4 => return 0.0,
        Rounding::F16Gemm => {
            let terms: f32 = w
                .iter()
                .zip(x)
                .map(|(a, b)| a.abs() * b.abs() / 1024.0 + (a.abs() + b.abs()) / 33_554_432.0)
                .sum();
            return terms * 1.01;
        }
        Rounding::DecodeSteps(_) if m > 4 => return 0.0,
        _ if !act::supports(dtype) || !x.len().is_multiple_of(ACT_BLOCK) => return 0.0,
        Rounding::Steps(max) | Rounding::DecodeSteps(max) => max,
    };
    w.chunks(ACT_BLOCK)
        .zip(x.chunks(ACT_BLOCK))
        .map(|(wb, xb)| {
            let step = xb.iter().fold(0f32, |a, v| a.max(v.abs())) / max;
            wb.iter().map(|w| w.abs()).sum::<f32>() * step / 2.0
        })
        .sum()
}

/// Run `f` inside one pass.
fn pass(b: &mut dyn ComputeBackend, f: impl FnOnce(&mut dyn ComputeBackend)) {
    b.begin_pass().unwrap();
    f(b);
    b.end_pass().unwrap();
}

/// Column counts to test for `dtype`: whole blocks, several of them, plus
/// odd lengths for the float types.
fn cols_for(dtype: DType) -> Vec<usize> {
    match dtype.block_elems() {
        1 => vec![7, 64, 100, 576],
        32 => vec![32, 96, 576],
        _ => vec![256, 768],
    }
}

fn matmul_every_dtype_matches_reference((name, mut b, acts): Rounded) {
    // Tolerance: each output may differ from the f64 reference by 1e-5 of
    // Σ|w·x| (the sum's condition bound). f32 blocked summation over k <= 768
    // terms is typically ~sqrt(k)·6e-8 ≈ 2e-6 of it; 1e-5 leaves margin for
    // other backends' orders while still catching any wrong weight or row.
    // CPU modes that round activations to integers add `activation_bound`.
    for dtype in DType::ALL {
        for cols in cols_for(dtype) {
            for (rows, m, with_bias) in [
                (1, 1, false),
                (33, 1, true),
                (70, 3, false),
                (7, 5, true),
                (45, 17, false),
                (40, 30, true),
                // Three of mul_mat_lanes.comp's 16-row tiles, the last
                // partial.
                (9, 36, true),
            ] {
                let wb = weight_bytes(dtype, rows, cols, (rows * 131 + cols) as u64);
                let x = rand_f32(m * cols, 11 + m as u64);
                let bias = rand_f32(rows, 5);
                let bias = with_bias.then_some(bias.as_slice());
                let want = reference::matmul(dtype, &wb, rows, cols, bias, &x, m).unwrap();
                let wf = reference::dequantize(dtype, &wb, rows, cols).unwrap();

                let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
                let xb = upload_f32(b.as_mut(), &x);
                let bb = bias.map(|v| upload_f32(b.as_mut(), v));
                let yb = b.alloc(m * rows * 4).unwrap();
                pass(b.as_mut(), |b| {
                    b.matmul(&w, bb.as_ref(), &xb, &yb, m).unwrap()
                });
                let got = download_f32(b.as_mut(), &yb, m * rows);
                for i in 0..m {
                    for r in 0..rows {
                        let mag: f32 = (0..cols)
                            .map(|c| (wf[r * cols + c] * x[i * cols + c]).abs())
                            .sum::<f32>()
                            + bias.map_or(0.0, |v| v[r].abs());
                        let (g, e) = (got[i * rows + r], want[i * rows + r]);
                        let xr = &x[i * cols..(i + 1) * cols];
                        let wr = &wf[r * cols..(r + 1) * cols];
                        let bound = activation_bound(acts, dtype, wr, xr, m);
                        assert!(
                            (g - e).abs() <= 1e-5 * mag + bound + 1e-7,
                            "{name} {dtype} [{rows}x{cols}] m={m} y[{i},{r}] = {g}, want {e} (Σ|wx| {mag})"
                        );
                    }
                }
                b.free_weight(w);
            }
        }
    }
}
test_device!(
    matmul_every_dtype_matches_reference,
    matmul_every_dtype_matches_reference_cpu: matmul_cpu_backends,
    matmul_every_dtype_matches_reference_vulkan: matmul_vulkan_backends
);

/// Integer-dot weight types.
const INT_DTYPES: [DType; 8] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

/// `matmul` of `wb` (`[rows, cols]` of `dtype`) with `x` (`[m, cols]`) on `b`,
/// against the scalar integer dot (`act::dot_row`) on the same quantized
/// activations: the integer sums are exact, so only the f32 scaling may
/// differ (1e-5 of Σ|w·x|).
#[allow(clippy::too_many_arguments)]
fn check_integer_matmul(
    b: &mut dyn ComputeBackend,
    label: &str,
    acts: Activations,
    dtype: DType,
    wb: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
) {
    let rb = dtype.row_bytes(cols).unwrap();
    let wf = reference::dequantize(dtype, wb, rows, cols).unwrap();
    let w = b.upload_weight(dtype, rows, cols, wb).unwrap();
    let (xb, yb) = (upload_f32(b, x), b.alloc(m * rows * 4).unwrap());
    pass(b, |b| b.matmul(&w, None, &xb, &yb, m).unwrap());
    let got = download_f32(b, &yb, m * rows);
    let (q16, q8) = (
        ActRows::<i16>::quantize(x, m, cols),
        ActRows::<i8>::quantize(x, m, cols),
    );
    for i in 0..m {
        for r in 0..rows {
            let wrow = &wb[r * rb..(r + 1) * rb];
            let want = match acts {
                Activations::Q16 => act::dot_row(dtype, wrow, &q16, i),
                _ => act::dot_row(dtype, wrow, &q8, i),
            };
            let mag: f32 = (0..cols)
                .map(|c| (wf[r * cols + c] * x[i * cols + c]).abs())
                .sum();
            let g = got[i * rows + r];
            assert!(
                (g - want).abs() <= 1e-5 * mag + 1e-7,
                "{label} {} {dtype} [{rows}x{cols}] m={m} y[{i},{r}] = {g}, want {want}",
                acts.name()
            );
        }
    }
    b.free_weight(w);
}

/// The SIMD integer-dot kernels (AVX2, AVX-512 VNNI), decode (m <= 4) and
/// prefill GEMM tiles (m > 4: row and weight counts that are not multiples
/// of the tiles, reductions that are odd numbers of blocks), against the
/// scalar integer dot on the same quantized activations.
#[test]
fn matmul_integer_activations_match_the_scalar_integer_dot() {
    for isa in Isa::ALL {
        for acts in [Activations::Q16, Activations::Q8] {
            let Ok(b) = CpuBackend::with_isa(Some(2), isa) else {
                continue;
            };
            let mut b: Box<dyn ComputeBackend> = Box::new(b.with_activations(acts));
            for dtype in INT_DTYPES {
                // (rows, cols, m); odd block counts (96 = 3 blocks) exercise
                // the kernels' tail.
                let shapes: &[(usize, usize, usize)] = if dtype.block_elems() == 256 {
                    &[
                        (1, 256, 1),
                        (33, 768, 2),
                        (70, 512, 1),
                        (9, 1536, 3),
                        (5, 2304, 4),
                        (37, 768, 5),
                        (21, 512, 17),
                        (17, 1536, 64),
                        (8, 256, 9),
                    ]
                } else {
                    &[
                        (1, 32, 1),
                        (33, 96, 2),
                        (70, 576, 1),
                        (9, 576, 3),
                        (5, 1536, 4),
                        (37, 96, 5),
                        (70, 576, 17),
                        (19, 1536, 64),
                        (16, 32, 9),
                    ]
                };
                for &(rows, cols, m) in shapes {
                    // Prefill has integer tiles on x86 only (f32 elsewhere).
                    if m > 4 && !matches!(isa, Isa::Avx512 | Isa::Avx2) {
                        continue;
                    }
                    let wb = weight_bytes(dtype, rows, cols, (rows * 7 + cols) as u64);
                    let x = rand_f32(m * cols, 3 + m as u64);
                    let label = isa.name();
                    check_integer_matmul(b.as_mut(), label, acts, dtype, &wb, rows, cols, &x, m);
                }
            }
        }
    }
}

/// Q6_K at its integer extremes: every scale −128 and every value q − 32 =
/// −32 (each scaled weight 4096) against activations all at their largest
/// quantized magnitude (32767), decode and prefill. A 16-value half-block
/// then sums to 16 · 4096 · 32767, just inside i32; a kernel summing more
/// products in one i32 lane would overflow.
#[test]
fn matmul_q6_k_integer_extremes_do_not_overflow() {
    let (rows, cols) = (19, 512);
    let mut block = [0u8; 210];
    block[192..208].fill(0x80);
    block[208..210].copy_from_slice(&half::f16::from_f32(1e-3).to_bits().to_le_bytes());
    let wb = block.repeat(rows * cols / 256);
    for isa in Isa::ALL {
        let Ok(b) = CpuBackend::with_isa(Some(2), isa) else {
            continue;
        };
        let mut b: Box<dyn ComputeBackend> = Box::new(b.with_activations(Activations::Q16));
        for m in [1, 4, 13] {
            if m > 4 && !matches!(isa, Isa::Avx512 | Isa::Avx2) {
                continue;
            }
            let x = vec![0.75f32; m * cols];
            let label = isa.name();
            check_integer_matmul(
                b.as_mut(),
                label,
                Activations::Q16,
                DType::Q6K,
                &wb,
                rows,
                cols,
                &x,
                m,
            );
        }
    }
}

/// Quantized activations: each value within half a step of its block's
/// scale, and the stored block sums are `d · Σq`.
#[test]
fn activation_quantization_rounds_to_the_nearest_step() {
    let x = rand_f32(3 * 64, 9);
    let mut x = x.iter().map(|v| v * 7.0).collect::<Vec<_>>();
    x[32..64].fill(0.0); // block 1: all zero
    let q16 = ActRows::<i16>::quantize(&x, 3, 64);
    let q8 = ActRows::<i8>::quantize(&x, 3, 64);
    for (b, xb) in x.chunks(ACT_BLOCK).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (j, v) in xb.iter().enumerate() {
            let [d16, _] = q16.ds[b];
            let [d8, _] = q8.ds[b];
            assert!((q16.qs[b * 32 + j] as f32 * d16 - v).abs() <= d16 / 2.0 * 1.0001 + 1e-9);
            assert!((q8.qs[b * 32 + j] as f32 * d8 - v).abs() <= d8 / 2.0 * 1.0001 + 1e-9);
        }
        assert_eq!(q16.ds[b][0], amax / 32767.0);
        let s16: i32 = q16.qs[b * 32..(b + 1) * 32].iter().map(|&q| q as i32).sum();
        assert_eq!(q16.ds[b][1], q16.ds[b][0] * s16 as f32);
        let s8: i32 = q8.qs[b * 32..(b + 1) * 32].iter().map(|&q| q as i32).sum();
        assert_eq!(q8.ds[b][1], q8.ds[b][0] * s8 as f32);
    }
    // An all-zero block has scale 0 and values 0 (no division by zero).
    assert_eq!((q16.ds[1], q8.ds[1]), ([0.0, 0.0], [0.0, 0.0]));
    assert!(q16.qs[32..64].iter().all(|&q| q == 0) && q8.qs[32..64].iter().all(|&q| q == 0));
}

fn matmul_long_reductions_match_reference((name, mut b, acts): Rounded) {
    // Reductions longer than 1536 are split into chunks on the CPU GEMM path
    // (partial sums added into y); odd float lengths leave a ragged last
    // chunk. Same tolerance as above: 1e-5 of Σ|w·x| (m = 13 is prefill:
    // integer dots for Q8_0 / Q4_K / Q6_K with rounded activations).
    for (dtype, cols) in [
        (DType::F32, 1601),
        (DType::F16, 2048),
        (DType::Q8_0, 2080),
        (DType::Q4K, 2304),
        (DType::Q6K, 2048),
    ] {
        let (rows, m) = (37, 13);
        let wb = weight_bytes(dtype, rows, cols, 77);
        let x = rand_f32(m * cols, 78);
        let bias = rand_f32(rows, 79);
        let want = reference::matmul(dtype, &wb, rows, cols, Some(&bias), &x, m).unwrap();
        let wf = reference::dequantize(dtype, &wb, rows, cols).unwrap();
        let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
        let (xb, bb) = (upload_f32(b.as_mut(), &x), upload_f32(b.as_mut(), &bias));
        let yb = b.alloc(m * rows * 4).unwrap();
        pass(b.as_mut(), |b| {
            b.matmul(&w, Some(&bb), &xb, &yb, m).unwrap()
        });
        let got = download_f32(b.as_mut(), &yb, m * rows);
        for i in 0..m {
            for r in 0..rows {
                let mag: f32 = (0..cols)
                    .map(|c| (wf[r * cols + c] * x[i * cols + c]).abs())
                    .sum::<f32>()
                    + bias[r].abs();
                let (g, e) = (got[i * rows + r], want[i * rows + r]);
                let xr = &x[i * cols..(i + 1) * cols];
                let wr = &wf[r * cols..(r + 1) * cols];
                let bound = activation_bound(acts, dtype, wr, xr, m);
                assert!(
                    (g - e).abs() <= 1e-5 * mag + bound,
                    "{name} {dtype} [{rows}x{cols}] m={m} y[{i},{r}] = {g}, want {e}"
                );
            }
        }
    }
}
test_device!(
    matmul_long_reductions_match_reference,
    matmul_long_reductions_match_reference_cpu: matmul_cpu_backends,
    matmul_long_reductions_match_reference_vulkan: matmul_vulkan_backends
);

fn embedding_every_dtype_matches_reference((name, mut b): Named) {
    // The CPU dequantizes with ggml's exact operations, so its rows must be
    // bit-identical to the reference. Other backends may fuse `q*d + m` into
    // one rounding: 1e-6 of the table's largest value allows that, nothing more.
    for dtype in DType::ALL {
        for cols in cols_for(dtype) {
            let rows = 19;
            let tb = weight_bytes(dtype, rows, cols, 3 + cols as u64);
            let ids = [0u32, 18, 5, 5, 11];
            let want = reference::embedding(dtype, &tb, rows, cols, &ids).unwrap();
            let w = b.upload_weight(dtype, rows, cols, &tb).unwrap();
            let idb = upload_u32(b.as_mut(), &ids);
            let out = b.alloc(ids.len() * cols * 4).unwrap();
            pass(b.as_mut(), |b| {
                b.embedding(&w, &idb, &out, ids.len()).unwrap()
            });
            let got = download_f32(b.as_mut(), &out, ids.len() * cols);
            let err = max_abs_diff(&got, &want);
            if name.starts_with("cpu") {
                assert_eq!(got, want, "{name} {dtype} cols={cols}");
            } else {
                let big = want.iter().fold(0f32, |a, v| a.max(v.abs()));
                assert!(err <= 1e-6 * big, "{name} {dtype} cols={cols}: error {err}");
            }
        }
    }
}
test_device!(
    embedding_every_dtype_matches_reference,
    embedding_every_dtype_matches_reference_cpu,
    embedding_every_dtype_matches_reference_vulkan
);

fn embedding_every_dtype((name, mut b): Named) {
    let (rows, cols) = (20, 256);
    let ids = [3u32, 0, 19, 3, 7];
    for (di, dtype) in DType::ALL.into_iter().enumerate() {
        let wb = weight_bytes(dtype, rows, cols, 300 + di as u64);
        let table = b.upload_weight(dtype, rows, cols, &wb).unwrap();
        let idb = upload_u32(b.as_mut(), &ids);
        let out = b.alloc(ids.len() * cols * 4).unwrap();
        pass(b.as_mut(), |b| {
            b.embedding(&table, &idb, &out, ids.len()).unwrap()
        });
        let got = download_f32(b.as_mut(), &out, ids.len() * cols);
        let want = reference::embedding(dtype, &wb, rows, cols, &ids).unwrap();
        // Same formulas as ggml; at most an FMA's rounding apart.
        assert_ulps(&format!("{name} embedding {dtype}"), &got, &want, 1e-6);
    }
}
test_device!(
    embedding_every_dtype,
    embedding_every_dtype_cpu,
    embedding_every_dtype_vulkan
);

/// Largest |value|, for tolerances relative to a tensor's scale.
fn amax(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |a, x| a.max(x.abs()))
}

fn rms_norm_matches_reference((name, mut b): Named) {
    // Tolerance: 1e-5 of the output's largest value (f32 products after an
    // f64-or-f32 mean; relative rounding ~1e-7 per step).
    for (rows, dim) in [(1, 576), (3, 64), (17, 100), (2, 1536)] {
        let x: Vec<f32> = rand_f32(rows * dim, 1).iter().map(|v| v * 3.0).collect();
        let w = rand_f32(dim, 2);
        let want = reference::rms_norm(&x, &w, dim, 1e-5).unwrap();
        let (xb, wb) = (upload_f32(b.as_mut(), &x), upload_f32(b.as_mut(), &w));
        let out = b.alloc(rows * dim * 4).unwrap();
        pass(b.as_mut(), |b| {
            b.rms_norm(&xb, &wb, &out, rows, dim, 1e-5).unwrap()
        });
        let got = download_f32(b.as_mut(), &out, rows * dim);
        let err = max_abs_diff(&got, &want);
        assert!(
            err <= 1e-5 * amax(&want),
            "{name} rms_norm {rows}x{dim}: error {err}"
        );
    }
}
test_device!(
    rms_norm_matches_reference,
    rms_norm_matches_reference_cpu,
    rms_norm_matches_reference_vulkan
);

fn layer_norm_matches_reference((name, mut b): Named) {
    // Tolerance: 1e-5 of the output's largest value, as for rms_norm.
    for (rows, dim) in [(1, 576), (3, 64), (17, 100)] {
        let x: Vec<f32> = rand_f32(rows * dim, 4)
            .iter()
            .map(|v| v * 2.0 + 0.5)
            .collect();
        let (w, bias) = (rand_f32(dim, 5), rand_f32(dim, 6));
        let want = reference::layer_norm(&x, &w, &bias, dim, 1e-5).unwrap();
        let (xb, wb, bb) = (
            upload_f32(b.as_mut(), &x),
            upload_f32(b.as_mut(), &w),
            upload_f32(b.as_mut(), &bias),
        );
        let out = b.alloc(rows * dim * 4).unwrap();
        pass(b.as_mut(), |b| {
            b.layer_norm(&xb, &wb, &bb, &out, rows, dim, 1e-5).unwrap()
        });
        let got = download_f32(b.as_mut(), &out, rows * dim);
        let err = max_abs_diff(&got, &want);
        assert!(
            err <= 1e-5 * amax(&want),
            "{name} layer_norm {rows}x{dim}: error {err}"
        );
    }
}
test_device!(
    layer_norm_matches_reference,
    layer_norm_matches_reference_cpu,
    layer_norm_matches_reference_vulkan
);

fn rms_norm_and_layer_norm((name, mut b): Named) {
    for (rows, dim) in [(1, 576), (5, 1000), (3, 7)] {
        let x: Vec<f32> = rand_f32(rows * dim, 1)
            .iter()
            .map(|v| v * 3.0 + 0.5)
            .collect();
        let w = rand_f32(dim, 2);
        let bias = rand_f32(dim, 3);
        let (xb, wb, bb) = (
            upload_f32(b.as_mut(), &x),
            upload_f32(b.as_mut(), &w),
            upload_f32(b.as_mut(), &bias),
        );
        let (o1, o2) = (
            b.alloc(rows * dim * 4).unwrap(),
            b.alloc(rows * dim * 4).unwrap(),
        );
        b.begin_pass().unwrap();
        b.rms_norm(&xb, &wb, &o1, rows, dim, 1e-5).unwrap();
        b.layer_norm(&xb, &wb, &bb, &o2, rows, dim, 1e-5).unwrap();
        b.end_pass().unwrap();
        let want = reference::rms_norm(&x, &w, dim, 1e-5).unwrap();
        assert_ulps(
            &format!("{name} rms_norm"),
            &download_f32(b.as_mut(), &o1, rows * dim),
            &want,
            1e-5,
        );
        let want = reference::layer_norm(&x, &w, &bias, dim, 1e-5).unwrap();
        // The centred values cancel down to |x - mean|, so compare against the row's scale.
        let got = download_f32(b.as_mut(), &o2, rows * dim);
        let scale = vec![1.0f32; rows * dim];
        assert_close(&format!("{name} layer_norm"), &got, &want, &scale, 1e-5);
    }
}
test_device!(
    rms_norm_and_layer_norm,
    rms_norm_and_layer_norm_cpu,
    rms_norm_and_layer_norm_vulkan
);

fn rope_both_styles_partial_and_positions((name, mut b): Named) {
    // Tolerance: 1e-5 of the largest input (|x| <= 1). Both sides use the same
    // f32 angle (see reference::rope_angle); the rest is one f32 rotation.
    for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
        for (head_dim, rot_dim) in [(64, 64), (64, 32), (32, 32), (80, 24)] {
            let p = RopeParams {
                rows: 4,
                n_heads: 3,
                head_dim,
                rot_dim,
                base: 10000.0,
                style,
            };
            let positions = [0u32, 5, 1000, 33];
            let x = rand_f32(p.rows * p.n_heads * head_dim, 9);
            let mut want = x.clone();
            reference::rope(&mut want, &positions, &p).unwrap();
            let xb = upload_f32(b.as_mut(), &x);
            let pb = upload_u32(b.as_mut(), &positions);
            pass(b.as_mut(), |b| b.rope(&xb, &pb, &p).unwrap());
            let got = download_f32(b.as_mut(), &xb, x.len());
            let err = max_abs_diff(&got, &want);
            assert!(
                err <= 1e-5,
                "{name} rope {style:?} hd={head_dim} rot={rot_dim}: error {err}"
            );
            // Partial rotary leaves the tail of every head untouched, bit for bit.
            for (h, head) in got.chunks_exact(head_dim).enumerate() {
                assert_eq!(
                    &head[rot_dim..],
                    &x[h * head_dim + rot_dim..(h + 1) * head_dim],
                    "{name} tail"
                );
            }
            // Position 0 is the identity.
            assert_eq!(
                &got[..p.n_heads * head_dim],
                &x[..p.n_heads * head_dim],
                "{name} pos 0"
            );
        }
    }
}
test_device!(
    rope_both_styles_partial_and_positions,
    rope_both_styles_partial_and_positions_cpu,
    rope_both_styles_partial_and_positions_vulkan
);

fn rope_both_styles_partial_rotary((name, mut b): Named) {
    let positions = [0u32, 1, 17, 500];
    for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
        for (head_dim, rot_dim) in [(64, 64), (64, 32)] {
            let p = RopeParams {
                rows: positions.len(),
                n_heads: 3,
                head_dim,
                rot_dim,
                base: 10000.0,
                style,
            };
            let n = p.rows * p.n_heads * head_dim;
            let x = rand_f32(n, 11);
            let xb = upload_f32(b.as_mut(), &x);
            let pb = upload_u32(b.as_mut(), &positions);
            pass(b.as_mut(), |b| b.rope(&xb, &pb, &p).unwrap());
            let got = download_f32(b.as_mut(), &xb, n);
            let mut want = x.clone();
            reference::rope(&mut want, &positions, &p).unwrap();
            // Same f32 angles as the reference (host-computed frequencies);
            // the GPU's sin/cos of angles up to 500 rad stay within ~1e-5.
            let scale = vec![1.0f32; n];
            assert_close(
                &format!("{name} rope {style:?} rot {rot_dim}"),
                &got,
                &want,
                &scale,
                2e-5,
            );
        }
    }
}
test_device!(
    rope_both_styles_partial_rotary,
    rope_both_styles_partial_rotary_cpu,
    rope_both_styles_partial_rotary_vulkan
);

fn attention_gqa_positions_and_window((name, mut b): Named) {
    // Tolerance: 1e-5 of the largest value in the cache (outputs are convex
    // combinations of values; f32 softmax differs from f64 by ~1e-7 relative).
    for (n_heads, n_kv_heads) in [(4, 4), (9, 3), (8, 2)] {
        for (head_dim, window) in [(64, 0), (32, 0), (64, 8), (128, 0)] {
            for positions in [vec![0u32], vec![5, 17, 39], (10..17).collect::<Vec<u32>>()] {
                let capacity = 40;
                let p = AttentionParams {
                    rows: positions.len(),
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    capacity,
                    span: capacity,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    window,
                    kv_dtype: DType::F32,
                    next: None,
                };
                let q: Vec<f32> = rand_f32(p.rows * n_heads * head_dim, 21)
                    .iter()
                    .map(|v| v * 4.0)
                    .collect();
                let k: Vec<f32> = rand_f32(capacity * n_kv_heads * head_dim, 22)
                    .iter()
                    .map(|v| v * 4.0)
                    .collect();
                let v = rand_f32(capacity * n_kv_heads * head_dim, 23);
                let want = reference::attention(&q, &k, &v, &positions, &p).unwrap();
                let qb = upload_f32(b.as_mut(), &q);
                let kb = upload_f32(b.as_mut(), &k);
                let vb = upload_f32(b.as_mut(), &v);
                let pb = upload_u32(b.as_mut(), &positions);
                let out = b.alloc(q.len() * 4).unwrap();
                pass(b.as_mut(), |b| {
                    b.attention(&qb, &kb, &vb, &pb, &out, &p).unwrap()
                });
                let got = download_f32(b.as_mut(), &out, q.len());
                let err = max_abs_diff(&got, &want);
                assert!(
                    err <= 1e-5,
                    "{name} attention {n_heads}/{n_kv_heads} hd={head_dim} window={window} pos={positions:?}: error {err}"
                );
            }
        }
    }
}
test_device!(
    attention_gqa_positions_and_window,
    attention_gqa_positions_and_window_cpu: cpu_backends,
    attention_gqa_positions_and_window_vulkan: decode_vulkan_backends
);

fn attention_gqa_causal_and_window((name, mut b): Named) {
    // head_dim 80 > 64 exercises two output slices per invocation; 150
    // positions span three key chunks.
    for (window, head_dim) in [(0, 64), (50, 80)] {
        let p = AttentionParams {
            rows: 3,
            n_heads: 6,
            n_kv_heads: 2,
            head_dim,
            capacity: 160,
            span: 160,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
            kv_dtype: DType::F32,
            next: None,
        };
        let positions = [0u32, 70, 149];
        let q = rand_f32(p.rows * p.n_heads * head_dim, 21);
        let k = rand_f32(p.capacity * p.n_kv_heads * head_dim, 22);
        let v = rand_f32(p.capacity * p.n_kv_heads * head_dim, 23);
        let (qb, kb, vb) = (
            upload_f32(b.as_mut(), &q),
            upload_f32(b.as_mut(), &k),
            upload_f32(b.as_mut(), &v),
        );
        let pb = upload_u32(b.as_mut(), &positions);
        let ob = b.alloc(q.len() * 4).unwrap();
        pass(b.as_mut(), |b| {
            b.attention(&qb, &kb, &vb, &pb, &ob, &p).unwrap()
        });
        let got = download_f32(b.as_mut(), &ob, q.len());
        let want = reference::attention(&q, &k, &v, &positions, &p).unwrap();
        // Outputs are convex combinations of values in [-1, 1]; 1e-4 bounds
        // f32 sums of up to a few thousand terms (k·2⁻²⁴ ≈ 3e-5 at k = 512).
        let scale = vec![1.0f32; q.len()];
        assert_close(
            &format!("{name} attention window {window}"),
            &got,
            &want,
            &scale,
            1e-4,
        );
    }
}
test_device!(
    attention_gqa_causal_and_window,
    attention_gqa_causal_and_window_cpu: cpu_backends,
    attention_gqa_causal_and_window_vulkan: decode_vulkan_backends
);

fn attention_decode_long_caches_gqa_and_windows((name, mut b): Named) {
    // Decode-sized cases (Vulkan: attention_decode.comp + the split combine):
    // caches of capacity 8192 read at short and long lengths, spans that
    // straddle a round of the clusters' keys and splits, GQA groups of 1, 2,
    // 3, 4 and 16 (several head tiles), head_dim 64, 80 (2 lanes a key, 5
    // units of 8 each), 128, 256, and 6 and 320 (not a multiple of 8, past
    // 256: the fallback kernel, whose loops lavapipe once cut short at ~6K
    // keys of head_dim 320), sliding windows shorter and longer
    // than the span, and up to 4 rows at different positions. Each case is
    // planned for the whole cache and for its own span (Vulkan: unsplit
    // where that is short), and a span planned too short must still attend
    // every key.
    // Tolerance: 4e-5 absolute (values in [-1, 1]; the CPU's f32 sums over
    // up to 8192 keys reach ~1.3e-5 against the f64 reference).
    let capacity = 8192;
    for (n_heads, n_kv_heads, head_dim) in [
        (9, 3, 64),
        (32, 8, 128),
        (16, 1, 64),
        (4, 4, 80),
        (8, 2, 256),
        (2, 1, 6),
        (4, 2, 320),
    ] {
        let kv = capacity * n_kv_heads * head_dim;
        let k: Vec<f32> = rand_f32(kv, 31).iter().map(|v| v * 4.0).collect();
        let v = rand_f32(kv, 32);
        let kb = upload_f32(b.as_mut(), &k);
        let vb = upload_f32(b.as_mut(), &v);
        let cases: [(&[u32], usize); 9] = [
            (&[0], 0),
            (&[31], 0),
            (&[32], 0),
            (&[100], 0),
            (&[4095], 0),
            (&[8191], 0),
            (&[8191], 512),
            (&[7, 2000, 8191], 1000),
            (&[0, 1, 33, 64], 16),
        ];
        let planned = |positions: &[u32]| {
            let end = *positions.iter().max().unwrap() as usize + 1;
            [capacity, end, end.div_ceil(4)]
        };
        let spans = cases
            .iter()
            .flat_map(|&(positions, window)| planned(positions).map(|s| (positions, window, s)));
        for (positions, window, span) in spans {
            let p = AttentionParams {
                rows: positions.len(),
                n_heads,
                n_kv_heads,
                head_dim,
                capacity,
                span,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window,
                kv_dtype: DType::F32,
                next: None,
            };
            let q: Vec<f32> = rand_f32(p.rows * n_heads * head_dim, 33)
                .iter()
                .map(|v| v * 4.0)
                .collect();
            let want = reference::attention(&q, &k, &v, positions, &p).unwrap();
            let qb = upload_f32(b.as_mut(), &q);
            let pb = upload_u32(b.as_mut(), positions);
            let out = b.alloc(q.len() * 4).unwrap();
            pass(b.as_mut(), |b| {
                b.attention(&qb, &kb, &vb, &pb, &out, &p).unwrap()
            });
            let got = download_f32(b.as_mut(), &out, q.len());
            let err = max_abs_diff(&got, &want);
            assert!(
                err <= 4e-5,
                "{name} attention {n_heads}/{n_kv_heads} hd={head_dim} window={window} pos={positions:?} span {span}: error {err}"
            );
            for buf in [qb, pb, out] {
                b.free(buf);
            }
        }
        b.free(kb);
        b.free(vb);
    }
}
test_device!(
    attention_decode_long_caches_gqa_and_windows,
    attention_decode_long_caches_gqa_and_windows_cpu: cpu_backends,
    attention_decode_long_caches_gqa_and_windows_vulkan: decode_vulkan_backends
);

#[test]
fn attention_window_and_causality_change_the_result() {
    // Guards the reference itself: positions beyond `p` and outside the window
    // must not contribute, so poisoning them changes nothing.
    let p = AttentionParams {
        rows: 1,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        capacity: 10,
        span: 10,
        scale: 0.3,
        window: 3,
        kv_dtype: DType::F32,
        next: None,
    };
    let q = rand_f32(16, 1);
    let k = rand_f32(80, 2);
    let v = rand_f32(80, 3);
    let base = reference::attention(&q, &k, &v, &[5], &p).unwrap();
    let mut v2 = v.clone();
    for j in (0..3).chain(6..10) {
        v2[j * 8..(j + 1) * 8].fill(100.0);
    }
    assert_eq!(reference::attention(&q, &k, &v2, &[5], &p).unwrap(), base);
    v2[3 * 8] = 100.0;
    assert_ne!(reference::attention(&q, &k, &v2, &[5], &p).unwrap(), base);
}

fn glu_silu_and_gelu((name, mut b): Named) {
    // Tolerance: 1e-5 relative plus 1e-6 absolute (f32 exp/tanh vs f64).
    for act in [Activation::Silu, Activation::GeluTanh] {
        for with_up in [true, false] {
            let n = 1001;
            let gate: Vec<f32> = rand_f32(n, 31).iter().map(|v| v * 8.0).collect();
            let up = rand_f32(n, 32);
            let up_ref = with_up.then_some(up.as_slice());
            let want = reference::glu(act, &gate, up_ref).unwrap();
            let gb = upload_f32(b.as_mut(), &gate);
            let ub = upload_f32(b.as_mut(), &up);
            let out = b.alloc(n * 4).unwrap();
            pass(b.as_mut(), |b| {
                b.glu(act, &gb, with_up.then_some(&ub), &out, n).unwrap()
            });
            let got = download_f32(b.as_mut(), &out, n);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs() + 1e-6,
                    "{name} {act:?} up={with_up} [{i}] {g} vs {w}"
                );
            }
        }
    }
}
test_device!(
    glu_silu_and_gelu,
    glu_silu_and_gelu_cpu,
    glu_silu_and_gelu_vulkan
);

fn add_scale_copy_and_aliasing((name, mut b): Named) {
    // Exact: one f32 operation per value.
    let n = 777;
    let (x, y) = (rand_f32(n, 41), rand_f32(n, 42));
    let (xb, yb, out) = (
        upload_f32(b.as_mut(), &x),
        upload_f32(b.as_mut(), &y),
        b.alloc(n * 4).unwrap(),
    );
    pass(b.as_mut(), |b| {
        b.add(&xb, &yb, &out, n).unwrap();
        b.scale(&yb, 0.5, &yb, n).unwrap(); // in place
        b.add(&xb, &yb, &xb, n).unwrap(); // residual form: out aliases a
    });
    assert_eq!(
        download_f32(b.as_mut(), &out, n),
        reference::add(&x, &y).unwrap(),
        "{name} add"
    );
    let y_half = reference::scale(&y, 0.5);
    assert_eq!(
        download_f32(b.as_mut(), &yb, n),
        y_half,
        "{name} scale in place"
    );
    assert_eq!(
        download_f32(b.as_mut(), &xb, n),
        reference::add(&x, &y_half).unwrap(),
        "{name} add aliased"
    );

    // copy: a KV-cache append at a row offset.
    let cache = b.alloc(10 * 8 * 4).unwrap();
    let row = upload_f32(b.as_mut(), &y[..16]);
    pass(b.as_mut(), |b| {
        b.copy(&row, 0, &cache, 3 * 8 * 4, 16 * 4).unwrap()
    });
    let got = download_f32(b.as_mut(), &cache, 80);
    assert_eq!(&got[24..40], &y[..16], "{name} copy");
    assert!(
        got[..24].iter().chain(&got[40..]).all(|v| *v == 0.0),
        "{name} copy spill"
    );
}
test_device!(
    add_scale_copy_and_aliasing,
    add_scale_copy_and_aliasing_cpu,
    add_scale_copy_and_aliasing_vulkan
);

/// Vulkan's scale (also the copy probe's streaming kernel) loops its grid
/// of at most 1024 workgroups, 4 vec4s per invocation and pass: 9M values
/// take three passes, the last partial, and a 3-value tail.
fn scale_streams_past_its_grid((name, mut b): Named) {
    let n = 9_000_003;
    let x = rand_f32(n, 43);
    let xb = upload_f32(b.as_mut(), &x);
    let out = b.alloc(n * 4).unwrap();
    pass(b.as_mut(), |b| b.scale(&xb, -1.5, &out, n).unwrap());
    let got = download_f32(b.as_mut(), &out, n);
    let want = reference::scale(&x, -1.5);
    let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    assert_eq!(wrong, 0, "{name}: {wrong} of {n} values differ");
}
test_device!(
    scale_streams_past_its_grid,
    scale_streams_past_its_grid_cpu,
    scale_streams_past_its_grid_vulkan
);

fn glu_add_scale_with_aliasing((name, mut b): Named) {
    let n = 5000;
    let gate: Vec<f32> = rand_f32(n, 31).iter().map(|v| v * 8.0).collect();
    let up = rand_f32(n, 32);
    let (gb, ub) = (upload_f32(b.as_mut(), &gate), upload_f32(b.as_mut(), &up));
    for act in [Activation::Silu, Activation::GeluTanh] {
        for with_up in [true, false] {
            let ob = b.alloc(n * 4).unwrap();
            pass(b.as_mut(), |b| {
                b.glu(act, &gb, with_up.then_some(&ub), &ob, n).unwrap()
            });
            let want = reference::glu(act, &gate, with_up.then_some(&up[..])).unwrap();
            let scale = vec![1.0f32; n];
            // exp/tanh are a few ulps off on GPUs; values are at most 8.
            assert_close(
                &format!("{name} glu {act:?} up={with_up}"),
                &download_f32(b.as_mut(), &ob, n),
                &want,
                &scale,
                1e-5,
            );
        }
    }
    // out aliases a, then x.
    b.begin_pass().unwrap();
    b.add(&gb, &ub, &gb, n).unwrap();
    b.scale(&gb, 0.5, &gb, n).unwrap();
    b.end_pass().unwrap();
    let sum = reference::add(&gate, &up).unwrap();
    let want = reference::scale(&sum, 0.5);
    assert_eq!(
        download_f32(b.as_mut(), &gb, n),
        want,
        "{name}: add then scale are exact in f32"
    );
}
test_device!(
    glu_add_scale_with_aliasing,
    glu_add_scale_with_aliasing_cpu,
    glu_add_scale_with_aliasing_vulkan
);

fn argmax_first_on_ties((name, mut b): Named) {
    let n = 50;
    let mut x = rand_f32(3 * n, 51);
    x[3] = 5.0;
    x[7] = 5.0; // tie in row 0: index 3 wins
    x[n + n - 1] = 2.0; // row 1: the last index
    x[2 * n..3 * n].fill(-1.0); // row 2: all equal → 0
    let want = reference::argmax(&x, n).unwrap();
    assert_eq!(want, vec![3, n as u32 - 1, 0]);
    let xb = upload_f32(b.as_mut(), &x);
    let out = b.alloc(3 * 4).unwrap();
    pass(b.as_mut(), |b| b.argmax(&xb, &out, 3, n).unwrap());
    assert_eq!(download_u32(b.as_mut(), &out, 3), want, "{name}");
    // A vocab-sized row.
    let big = rand_f32(49152, 52);
    let bb = upload_f32(b.as_mut(), &big);
    pass(b.as_mut(), |b| b.argmax(&bb, &out, 1, 49152).unwrap());
    assert_eq!(
        download_u32(b.as_mut(), &out, 1),
        reference::argmax(&big, 49152).unwrap(),
        "{name} vocab"
    );
}
test_device!(
    argmax_first_on_ties,
    argmax_first_on_ties_cpu,
    argmax_first_on_ties_vulkan
);

fn argmax_first_on_ties_and_copy_offsets((name, mut b): Named) {
    let n = 1000;
    let mut x = rand_f32(3 * n, 41);
    x[5] = 3.0;
    x[700] = 3.0;
    x[n + 999] = 2.0;
    x[2 * n] = 2.5;
    let xb = upload_f32(b.as_mut(), &x);
    let ob = b.alloc(12).unwrap();
    pass(b.as_mut(), |b| b.argmax(&xb, &ob, 3, n).unwrap());
    assert_eq!(
        download_u32(b.as_mut(), &ob, 3),
        reference::argmax(&x, n).unwrap(),
        "{name}"
    );
    assert_eq!(download_u32(b.as_mut(), &ob, 3), vec![5, 999, 0], "{name}");

    let dst = b.alloc(64).unwrap();
    pass(b.as_mut(), |b| b.copy(&xb, 8, &dst, 16, 20).unwrap());
    let got = download_f32(b.as_mut(), &dst, 16);
    assert_eq!(&got[4..9], &x[2..7], "{name} copy");
    assert!(
        got[..4].iter().chain(&got[9..]).all(|v| *v == 0.0),
        "{name}: alloc zeroes"
    );
}
test_device!(
    argmax_first_on_ties_and_copy_offsets,
    argmax_first_on_ties_and_copy_offsets_cpu,
    argmax_first_on_ties_and_copy_offsets_vulkan
);

fn argmax_vocab_rows_split_over_workgroups((name, mut b): Named) {
    // Decode-sized rows (SmolLM2's and Llama-3's vocabularies, one and a few
    // rows), so the Vulkan backend splits each row over many workgroups:
    // ties across workgroup slices keep the first index, NaNs never win (a
    // row that starts with NaN still finds its maximum), -inf rows give 0.
    for n in [49152usize, 128256] {
        let rows = 4;
        let mut x = rand_f32(rows * n, 53);
        let mut want = vec![0u32; rows];
        // Row 0: equal maxima in distant slices (and at both ends).
        for i in [n - 1, 40_000, 1_000, 777] {
            x[i] = 9.0;
        }
        want[0] = 777;
        // Row 1: NaNs everywhere else, including first and beyond the max.
        let r1 = &mut x[n..2 * n];
        for (i, v) in r1.iter_mut().enumerate() {
            if i % 3 == 0 {
                *v = f32::NAN;
            }
        }
        r1[n - 2] = 7.5;
        want[1] = n as u32 - 2;
        // Row 2: all -inf; row 3: all NaN (nothing wins: 0).
        x[2 * n..3 * n].fill(f32::NEG_INFINITY);
        x[3 * n..4 * n].fill(f32::NAN);
        let xb = upload_f32(b.as_mut(), &x);
        let out = b.alloc(rows * 4).unwrap();
        pass(b.as_mut(), |b| b.argmax(&xb, &out, rows, n).unwrap());
        assert_eq!(download_u32(b.as_mut(), &out, rows), want, "{name} n={n}");
        // One row (decode), against the reference.
        let one = rand_f32(n, 54);
        let ob = upload_f32(b.as_mut(), &one);
        pass(b.as_mut(), |b| b.argmax(&ob, &out, 1, n).unwrap());
        assert_eq!(
            download_u32(b.as_mut(), &out, 1),
            reference::argmax(&one, n).unwrap(),
            "{name} n={n} one row"
        );
    }
}
test_device!(
    argmax_vocab_rows_split_over_workgroups,
    argmax_vocab_rows_split_over_workgroups_cpu,
    argmax_vocab_rows_split_over_workgroups_vulkan
);

fn bad_shapes_and_handles_are_errors((name, mut b): Named) {
    let b = b.as_mut();
    let wb = weight_bytes(DType::Q4_0, 4, 64, 1);
    assert!(
        b.upload_weight(DType::Q4_0, 4, 64, &wb[1..]).is_err(),
        "{name}: short weight"
    );
    assert!(
        b.upload_weight(DType::Q4_0, 4, 60, &wb).is_err(),
        "{name}: cols not whole blocks"
    );
    let w = b.upload_weight(DType::Q4_0, 4, 64, &wb).unwrap();
    let small = b.alloc(63 * 4).unwrap();
    let y = b.alloc(4 * 4).unwrap();
    assert!(
        b.upload(&small, 250, &[0; 8]).is_err(),
        "{name}: upload overrun"
    );
    b.begin_pass().unwrap();
    assert!(
        b.matmul(&w, None, &small, &y, 1).is_err(),
        "{name}: x too small"
    );
    assert!(
        b.matmul(&w, None, &y, &y, 1).is_err(),
        "{name}: x too small / aliased"
    );
    let ids = b.alloc(4).unwrap();
    let bad_rope = RopeParams {
        rows: 1,
        n_heads: 1,
        head_dim: 8,
        rot_dim: 10,
        base: 1e4,
        style: RopeStyle::Neox,
    };
    assert!(
        b.rope(&small, &ids, &bad_rope).is_err(),
        "{name}: rot_dim > head_dim"
    );
    let bad_attn = AttentionParams {
        rows: 1,
        n_heads: 3,
        n_kv_heads: 2,
        head_dim: 8,
        capacity: 4,
        span: 4,
        scale: 1.0,
        window: 0,
        kv_dtype: DType::F32,
        next: None,
    };
    assert!(
        b.attention(&small, &small, &small, &ids, &y, &bad_attn)
            .is_err(),
        "{name}: heads % kv heads"
    );
    assert!(
        b.rms_norm(&small, &small, &y, 2, 64, 1e-5).is_err(),
        "{name}: rms_norm out too small"
    );
    assert!(
        b.copy(&small, 2, &y, 0, 4).is_err(),
        "{name}: unaligned copy"
    );
    b.end_pass().unwrap();
    // Out-of-range token id: the CPU sees ids and refuses; a device that
    // cannot see them must still never read outside the table (zeros).
    let ones: Vec<f32> = vec![1.0; 8];
    let table = b
        .upload_weight(DType::F32, 2, 4, bytemuck::cast_slice(&ones))
        .unwrap();
    let id = upload_u32(b, &[2]);
    let out = b.alloc(16).unwrap();
    b.begin_pass().unwrap();
    let r = b.embedding(&table, &id, &out, 1);
    let end = b.end_pass();
    if r.is_ok() && end.is_ok() {
        assert_eq!(
            download_f32(b, &out, 4),
            vec![0.0; 4],
            "{name}: token id out of range must give zeros, not another row"
        );
    }
    // A freed handle.
    b.free(small);
    let mut buf = [0u8; 4];
    assert!(
        b.download(&small, 0, &mut buf).is_err(),
        "{name}: freed buffer"
    );
    b.begin_pass().unwrap();
    assert!(b.scale(&small, 1.0, &y, 1).is_err(), "{name}: freed input");
    b.end_pass().unwrap();
}
test_device!(
    bad_shapes_and_handles_are_errors,
    bad_shapes_and_handles_are_errors_cpu,
    bad_shapes_and_handles_are_errors_vulkan
);

#[test]
fn cpu_ops_outside_a_pass_are_errors() {
    let mut b = CpuBackend::new(Some(1));
    let x = upload_f32(&mut b, &[1.0, 2.0]);
    assert!(b.scale(&x, 2.0, &x, 2).is_err());
    assert!(b.end_pass().is_err());
    b.begin_pass().unwrap();
    assert!(b.begin_pass().is_err());
}

fn uploads_inside_a_pass_land_in_order((name, mut b): Named) {
    // Per-token inputs (ids, positions) are written inside the pass that uses
    // them, so a decode step is one submit; each write must be ordered
    // between the ops around it.
    let b = b.as_mut();
    let x = upload_f32(b, &[0.0, 0.0]);
    let y = b.alloc(8).unwrap();
    let z = b.alloc(8).unwrap();
    b.begin_pass().unwrap();
    b.upload(&x, 0, bytemuck::cast_slice(&[1.0f32, 2.0]))
        .unwrap();
    b.scale(&x, 2.0, &y, 2).unwrap();
    b.upload(&x, 0, bytemuck::cast_slice(&[5.0f32, 5.0]))
        .unwrap();
    b.scale(&x, 2.0, &z, 2).unwrap();
    b.end_pass().unwrap();
    assert_eq!(
        download_f32(b, &y, 2),
        vec![2.0, 4.0],
        "{name}: first upload"
    );
    assert_eq!(
        download_f32(b, &z, 2),
        vec![10.0, 10.0],
        "{name}: second upload"
    );
    // Inside a pass only small, 4-byte-aligned writes are recordable.
    b.begin_pass().unwrap();
    assert!(
        b.upload(&x, 2, &[0; 4]).is_err(),
        "{name}: unaligned upload"
    );
    b.end_pass().unwrap();
}
test_device!(
    uploads_inside_a_pass_land_in_order,
    uploads_inside_a_pass_land_in_order_cpu,
    uploads_inside_a_pass_land_in_order_vulkan
);

fn store_rows_and_rope_store_write_the_cache_at_positions((name, mut b): Named) {
    // Tolerance as rope (1e-5); stores are exact.
    let (rows, n_heads, n_kv, head_dim, cap) = (3, 6, 2, 64, 12);
    let kvd = n_kv * head_dim;
    let positions = [7u32, 2, 40]; // the last is past the cache: stored nowhere
    for (style, rot_dim) in [
        (RopeStyle::Neox, 64),
        (RopeStyle::Interleaved, 32),
        (RopeStyle::Neox, 0),
    ] {
        let p = RopeParams {
            rows,
            n_heads,
            head_dim,
            rot_dim,
            base: 10000.0,
            style,
        };
        let q = rand_f32(rows * n_heads * head_dim, 61);
        let k = rand_f32(rows * kvd, 62);
        let v = rand_f32(rows * kvd, 63);
        let old = rand_f32(cap * kvd, 64);
        let (mut q_want, mut k_roped) = (q.clone(), k.clone());
        reference::rope(&mut q_want, &positions, &p).unwrap();
        let kp = RopeParams { n_heads: n_kv, ..p };
        reference::rope(&mut k_roped, &positions, &kp).unwrap();
        let (mut kc_want, mut vc_want) = (old.clone(), old.clone());
        reference::store_rows(&k_roped, &mut kc_want, &positions, kvd);
        reference::store_rows(&v, &mut vc_want, &positions, kvd);
        let bufs: Vec<_> = [&q, &k, &v, &old, &old]
            .iter()
            .map(|d| upload_f32(b.as_mut(), d))
            .collect();
        let pb = upload_u32(b.as_mut(), &positions);
        let (qb, kb, vb, kcb, vcb) = (&bufs[0], &bufs[1], &bufs[2], &bufs[3], &bufs[4]);
        pass(b.as_mut(), |b| {
            b.rope_store(qb, kb, vb, &pb, kcb, vcb, &p, n_kv, DType::F32)
                .unwrap()
        });
        let what = format!("{name} {style:?} rot={rot_dim}");
        let err = max_abs_diff(&download_f32(b.as_mut(), qb, q.len()), &q_want);
        assert!(err <= 1e-5, "{what}: q error {err}");
        let err = max_abs_diff(&download_f32(b.as_mut(), kcb, old.len()), &kc_want);
        assert!(err <= 1e-5, "{what}: k cache error {err}");
        assert_eq!(
            download_f32(b.as_mut(), vcb, old.len()),
            vc_want,
            "{what}: v cache"
        );
        // store_rows alone: exact, the same rows.
        let cache = upload_f32(b.as_mut(), &old);
        pass(b.as_mut(), |b| {
            b.store_rows(vb, &cache, &pb, rows, kvd, DType::F32)
                .unwrap()
        });
        assert_eq!(
            download_f32(b.as_mut(), &cache, old.len()),
            vc_want,
            "{what}: store_rows"
        );
    }
}
test_device!(
    store_rows_and_rope_store_write_the_cache_at_positions,
    store_rows_and_rope_store_write_the_cache_at_positions_cpu,
    store_rows_and_rope_store_write_the_cache_at_positions_vulkan
);

/// `data` rounded to f16 (round to nearest even), as bytes and as f32.
fn f16_of(data: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let h: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
    (
        bytemuck::cast_slice(&h).to_vec(),
        h.iter().map(|x| x.to_f32()).collect(),
    )
}

fn upload_f16(b: &mut dyn ComputeBackend, data: &[f32]) -> (vkllm::backend::Buffer, Vec<f32>) {
    let (bytes, rounded) = f16_of(data);
    let buf = b.alloc(bytes.len()).unwrap();
    b.upload(&buf, 0, &bytes).unwrap();
    (buf, rounded)
}

fn download_f16(b: &mut dyn ComputeBackend, buf: &vkllm::backend::Buffer, n: usize) -> Vec<f32> {
    let mut bytes = vec![0u8; n * 2];
    b.download(buf, 0, &mut bytes).unwrap();
    bytes
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

/// Within one f16 ulp of `want` (the device may round f32 -> f16 to nearest
/// or toward zero, and rope's f32 error can tip a rounding).
fn assert_f16_close(got: &[f32], want: &[f32], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ulp = w.abs().max(1.0 / 16384.0) / 1024.0;
        assert!((g - w).abs() <= ulp, "{what}[{i}]: {g} vs {w}");
    }
}

/// Whether `b` refused an f16 cache op as unsupported (the CPU backend keeps
/// f32 caches); panics on any other error.
fn f16_unsupported(r: vkllm::Result<()>, name: &str) -> bool {
    match r {
        Ok(()) => false,
        Err(vkllm::Error::Unsupported(_)) if name.starts_with("cpu") => true,
        Err(e) => panic!("{name}: {e}"),
    }
}

fn kv_cache_f16_rope_store_and_store_rows((name, mut b): Named) {
    // f16 caches (Vulkan's default): k roped in f32 then rounded, v rounded,
    // rows past the cache stored nowhere, other rows untouched. Tolerance:
    // one f16 ulp of the reference rounded to f16. The CPU backend refuses
    // f16 caches (Error::Unsupported).
    let (rows, n_heads, n_kv, head_dim, cap) = (3, 6, 2, 64, 12);
    let kvd = n_kv * head_dim;
    let positions = [7u32, 2, 40];
    for (style, rot_dim) in [(RopeStyle::Neox, 64), (RopeStyle::Interleaved, 32)] {
        let p = RopeParams {
            rows,
            n_heads,
            head_dim,
            rot_dim,
            base: 10000.0,
            style,
        };
        let q = rand_f32(rows * n_heads * head_dim, 71);
        let k = rand_f32(rows * kvd, 72);
        let v = rand_f32(rows * kvd, 73);
        let old = rand_f32(cap * kvd, 74);
        let mut k_roped = k.clone();
        let kp = RopeParams { n_heads: n_kv, ..p };
        reference::rope(&mut k_roped, &positions, &kp).unwrap();
        let (_, old16) = f16_of(&old);
        let (mut kc_want, mut vc_want) = (old16.clone(), old16.clone());
        reference::store_rows(&f16_of(&k_roped).1, &mut kc_want, &positions, kvd);
        reference::store_rows(&f16_of(&v).1, &mut vc_want, &positions, kvd);
        let (qb, kb, vb) = (
            upload_f32(b.as_mut(), &q),
            upload_f32(b.as_mut(), &k),
            upload_f32(b.as_mut(), &v),
        );
        let (kcb, _) = upload_f16(b.as_mut(), &old);
        let (vcb, _) = upload_f16(b.as_mut(), &old);
        let pb = upload_u32(b.as_mut(), &positions);
        b.begin_pass().unwrap();
        let r = b.rope_store(&qb, &kb, &vb, &pb, &kcb, &vcb, &p, n_kv, DType::F16);
        b.end_pass().unwrap();
        if f16_unsupported(r, &name) {
            continue;
        }
        let what = format!("{name} {style:?} rot={rot_dim}");
        let kc = download_f16(b.as_mut(), &kcb, old.len());
        assert_f16_close(&kc, &kc_want, &format!("{what}: k cache"));
        let vc = download_f16(b.as_mut(), &vcb, old.len());
        assert_f16_close(&vc, &vc_want, &format!("{what}: v cache"));
        // store_rows alone into an f16 cache.
        let (cache, _) = upload_f16(b.as_mut(), &old);
        pass(b.as_mut(), |b| {
            b.store_rows(&vb, &cache, &pb, rows, kvd, DType::F16)
                .unwrap()
        });
        let got = download_f16(b.as_mut(), &cache, old.len());
        assert_f16_close(&got, &vc_want, &format!("{what}: store_rows"));
    }
    // An odd row length cannot be stored as f16 words.
    let (src, dst, pb) = (
        b.alloc(12).unwrap(),
        b.alloc(12).unwrap(),
        b.alloc(4).unwrap(),
    );
    b.begin_pass().unwrap();
    let r = b.store_rows(&src, &dst, &pb, 1, 3, DType::F16);
    b.end_pass().unwrap();
    assert!(r.is_err(), "{name}: odd f16 row accepted");
}
test_device!(
    kv_cache_f16_rope_store_and_store_rows,
    kv_cache_f16_rope_store_and_store_rows_cpu,
    kv_cache_f16_rope_store_and_store_rows_vulkan
);

fn attention_f16_cache((name, mut b): Named) {
    // Attention over f16 caches on every path: decode (attention_decode.comp;
    // capacity 8192, short and long spans, window, GQA, head_dim 64 and 128),
    // prefill rows (attention_prefill.comp) and the fallback
    // (attention.comp, head_dim 6). Tolerances: against the reference on the
    // f16-rounded caches, as f32 (4e-5: the kernels convert exactly);
    // against the reference on the unrounded f32 caches, 4e-3 absolute
    // (values in [-1, 1], keys up to 4: rounding K and V to f16 costs
    // ~3 significant digits; measured up to 8.4e-4 here). The CPU backend
    // refuses f16 caches.
    // (n_heads, n_kv_heads, head_dim, capacity, positions, window)
    type Case = (usize, usize, usize, usize, &'static [u32], usize);
    let cases: [Case; 7] = [
        (9, 3, 64, 8192, &[100], 0),
        (9, 3, 64, 8192, &[8191], 0),
        (32, 8, 128, 8192, &[4000], 0),
        (32, 8, 128, 8192, &[8191, 5], 512),
        (6, 2, 64, 40, &[10, 11, 12, 13, 14, 15, 39], 0),
        (4, 1, 128, 40, &[30, 31, 32, 33, 34, 35, 36], 8),
        (2, 1, 6, 40, &[39], 0),
    ];
    for (n_heads, n_kv_heads, head_dim, capacity, positions, window) in cases {
        let p = AttentionParams {
            rows: positions.len(),
            n_heads,
            n_kv_heads,
            head_dim,
            capacity,
            span: capacity,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
            kv_dtype: DType::F16,
            next: None,
        };
        let kv = capacity * n_kv_heads * head_dim;
        let k: Vec<f32> = rand_f32(kv, 81).iter().map(|v| v * 4.0).collect();
        let v = rand_f32(kv, 82);
        let q: Vec<f32> = rand_f32(p.rows * n_heads * head_dim, 83)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let (kb, k16) = upload_f16(b.as_mut(), &k);
        let (vb, v16) = upload_f16(b.as_mut(), &v);
        let qb = upload_f32(b.as_mut(), &q);
        let pb = upload_u32(b.as_mut(), positions);
        let out = b.alloc(q.len() * 4).unwrap();
        b.begin_pass().unwrap();
        let r = b.attention(&qb, &kb, &vb, &pb, &out, &p);
        b.end_pass().unwrap();
        let what = format!("{name} {n_heads}/{n_kv_heads} hd={head_dim} pos={positions:?}");
        for buf in [kb, vb, qb, pb] {
            b.free(buf);
        }
        if f16_unsupported(r, &name) {
            b.free(out);
            continue;
        }
        let got = download_f32(b.as_mut(), &out, q.len());
        b.free(out);
        let p32 = AttentionParams {
            kv_dtype: DType::F32,
            ..p
        };
        let want = reference::attention(&q, &k16, &v16, positions, &p32).unwrap();
        let err = max_abs_diff(&got, &want);
        assert!(err <= 4e-5, "{what}: error {err} vs the rounded caches");
        let exact = reference::attention(&q, &k, &v, positions, &p32).unwrap();
        let err = max_abs_diff(&got, &exact);
        assert!(err <= 4e-3, "{what}: error {err} vs f32 caches");
    }
}
test_device!(
    attention_f16_cache,
    attention_f16_cache_cpu: cpu_backends,
    attention_f16_cache_vulkan: decode_vulkan_backends
);

fn rope_store_attention_appends_and_attends((name, mut b): Named) {
    // The decode step's attention front as one op (Vulkan: attention_decode.comp
    // ropes q as it loads it and appends the row's k and v in the workgroups
    // holding its position) against rope_store then attention on the same
    // backend and against the reference. The cache rows equal rope_store's
    // (v exactly; k within 1e-6, or one f16 ulp for f16 caches: the same
    // rotation code in another shader) and every other row is untouched; k
    // is within 1e-5 of the reference plus one f32 ulp of the angle p·θ
    // (|k| <= 4·√2 after rotation; a device may keep p·θ unrounded in a fused
    // multiply-add: up to 5.5e-3 at position 8191, measured 7.3e-4 on an
    // H100), plus one f16 ulp for f16 caches; q as rope_store rotates it is
    // within the same bound of the reference; and the attention equals the
    // reference's over the caches the op left and that q (4e-5 absolute, as
    // attention's tests).
    // Cases: GQA groups of 3, 4 and 16 (several head tiles), head_dim 64, 80,
    // 128, 256 and 6 (the fallback kernels), partial and no rotation, both
    // pair layouts, a window, positions at split boundaries and deep in an
    // 8192-key cache, f32 and f16 caches (which the CPU refuses).
    // (n_heads, n_kv_heads, head_dim, rot_dim, style, capacity, position, window, cache)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        RopeStyle,
        usize,
        u32,
        usize,
        DType,
    );
    let cases: [Case; 10] = [
        (9, 3, 64, 64, RopeStyle::Neox, 8192, 8191, 0, DType::F16),
        (9, 3, 64, 64, RopeStyle::Neox, 8192, 600, 0, DType::F16),
        (9, 3, 64, 64, RopeStyle::Neox, 8192, 0, 0, DType::F16),
        (
            9,
            3,
            64,
            64,
            RopeStyle::Interleaved,
            8192,
            32,
            0,
            DType::F32,
        ),
        (
            32,
            8,
            128,
            128,
            RopeStyle::Interleaved,
            8192,
            4000,
            0,
            DType::F32,
        ),
        (32, 8, 128, 128, RopeStyle::Neox, 8192, 2047, 0, DType::F16),
        (
            16,
            1,
            64,
            32,
            RopeStyle::Interleaved,
            8192,
            100,
            0,
            DType::F32,
        ),
        (4, 4, 80, 0, RopeStyle::Neox, 8192, 31, 0, DType::F32),
        (8, 2, 256, 256, RopeStyle::Neox, 8192, 5000, 512, DType::F16),
        (2, 1, 6, 6, RopeStyle::Neox, 40, 39, 0, DType::F32),
    ];
    for (n_heads, n_kv, head_dim, rot_dim, style, capacity, pos, window, dtype) in cases {
        let what = format!(
            "{name} {n_heads}/{n_kv} hd={head_dim} rot={rot_dim} {style:?} pos={pos} {dtype:?}"
        );
        let kvd = n_kv * head_dim;
        let rope = RopeParams {
            rows: 1,
            n_heads,
            head_dim,
            rot_dim,
            base: 10000.0,
            style,
        };
        let p = AttentionParams {
            rows: 1,
            n_heads,
            n_kv_heads: n_kv,
            head_dim,
            capacity,
            span: capacity,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
            kv_dtype: dtype,
            next: None,
        };
        let q: Vec<f32> = rand_f32(n_heads * head_dim, 91)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let k: Vec<f32> = rand_f32(kvd, 92).iter().map(|v| v * 4.0).collect();
        let v = rand_f32(kvd, 93);
        let k_old: Vec<f32> = rand_f32(capacity * kvd, 94)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let v_old = rand_f32(capacity * kvd, 95);
        let f16 = dtype == DType::F16;
        let upload_cache = |b: &mut dyn ComputeBackend, data: &[f32]| {
            if f16 {
                upload_f16(b, data)
            } else {
                (upload_f32(b, data), data.to_vec())
            }
        };
        let download_cache = |b: &mut dyn ComputeBackend, buf: &vkllm::backend::Buffer| {
            if f16 {
                download_f16(b, buf, capacity * kvd)
            } else {
                download_f32(b, buf, capacity * kvd)
            }
        };
        // The fused op, then rope_store alone on copies of the caches.
        let (kcb, k_old) = upload_cache(b.as_mut(), &k_old);
        let (vcb, v_old) = upload_cache(b.as_mut(), &v_old);
        let (kcb2, _) = upload_cache(b.as_mut(), &k_old);
        let (vcb2, _) = upload_cache(b.as_mut(), &v_old);
        let [qb, qb2, kb, vb] = [&q, &q, &k, &v].map(|d| upload_f32(b.as_mut(), d));
        let pb = upload_u32(b.as_mut(), &[pos]);
        let out = b.alloc(q.len() * 4).unwrap();
        b.begin_pass().unwrap();
        let r = b.rope_store_attention(&qb, &kb, &vb, &pb, &kcb, &vcb, &rope, &p, &out);
        b.end_pass().unwrap();
        let bufs = [kcb, vcb, kcb2, vcb2, qb, qb2, kb, vb, pb, out];
        if f16_unsupported(r, &name) {
            bufs.into_iter().for_each(|buf| b.free(buf));
            continue;
        }
        let got = download_f32(b.as_mut(), &out, q.len());
        pass(b.as_mut(), |b| {
            b.rope_store(&qb2, &kb, &vb, &pb, &kcb2, &vcb2, &rope, n_kv, dtype)
                .unwrap()
        });
        let [kc, vc, kc2, vc2] = [kcb, vcb, kcb2, vcb2].map(|buf| download_cache(b.as_mut(), &buf));
        // rope_store rotated q in place: the device's own rotation.
        let q_dev = download_f32(b.as_mut(), &qb2, q.len());
        bufs.into_iter().for_each(|buf| b.free(buf));
        let row = pos as usize * kvd..(pos as usize + 1) * kvd;
        if f16 {
            assert_f16_close(
                &kc[row.clone()],
                &kc2[row.clone()],
                &format!("{what}: k row vs rope_store"),
            );
        } else {
            let err = max_abs_diff(&kc[row.clone()], &kc2[row.clone()]);
            assert!(err <= 1e-6, "{what}: k row error {err} vs rope_store");
        }
        assert_eq!(vc, vc2, "{what}: v cache vs rope_store");
        let mut k_roped = k.clone();
        let kp = RopeParams {
            n_heads: n_kv,
            ..rope
        };
        reference::rope(&mut k_roped, &[pos], &kp).unwrap();
        let angle = 4.0 * std::f32::consts::SQRT_2 * pos as f32 * f32::EPSILON;
        let f16_ulp = |w: f32| {
            if f16 {
                w.abs().max(1.0 / 16384.0) / 1024.0
            } else {
                0.0
            }
        };
        for (i, (g, w)) in kc[row.clone()].iter().zip(&k_roped).enumerate() {
            let tol = 1e-5 + angle + f16_ulp(*w);
            assert!(
                (g - w).abs() <= tol,
                "{what}: k row[{i}] {g} vs {w} (tolerance {tol})"
            );
        }
        let v_row = if f16 { f16_of(&v).1 } else { v.clone() };
        assert_eq!(vc[row.clone()], v_row[..], "{what}: v row");
        for (cache, old, which) in [(&kc, &k_old, "k"), (&vc, &v_old, "v")] {
            let outside = |c: &[f32]| [c[..row.start].to_vec(), c[row.end..].to_vec()].concat();
            assert!(
                outside(cache) == outside(old),
                "{what}: {which} rows past the position changed"
            );
        }
        let mut q_roped = q.clone();
        reference::rope(&mut q_roped, &[pos], &rope).unwrap();
        for (i, (g, w)) in q_dev.iter().zip(&q_roped).enumerate() {
            let tol = 1e-5 + angle;
            assert!(
                (g - w).abs() <= tol,
                "{what}: q[{i}] {g} vs {w} (tolerance {tol})"
            );
        }
        let p32 = AttentionParams {
            kv_dtype: DType::F32,
            ..p
        };
        let want = reference::attention(&q_dev, &kc, &vc, &[pos], &p32).unwrap();
        let err = max_abs_diff(&got, &want);
        let tol = 4e-5;
        assert!(
            err <= tol,
            "{what}: attention error {err} (tolerance {tol})"
        );
    }
}
test_device!(
    rope_store_attention_appends_and_attends,
    rope_store_attention_appends_and_attends_cpu: cpu_backends,
    rope_store_attention_appends_and_attends_vulkan: decode_vulkan_backends
);

fn append_token_records_the_token_and_advances((name, mut b): Named) {
    let ids = upload_u32(b.as_mut(), &[42]);
    let pos = upload_u32(b.as_mut(), &[9]);
    let history = upload_u32(b.as_mut(), &[0, 0, 0, 0]);
    for t in [42u32, 7] {
        b.upload(&ids, 0, &t.to_le_bytes()).unwrap();
        pass(b.as_mut(), |b| {
            b.append_token(&ids, &pos, &history).unwrap()
        });
    }
    assert_eq!(
        download_u32(b.as_mut(), &history, 4),
        [2, 42, 7, 0],
        "{name}"
    );
    assert_eq!(download_u32(b.as_mut(), &pos, 1), [11], "{name}");
}
test_device!(
    append_token_records_the_token_and_advances,
    append_token_records_the_token_and_advances_cpu,
    append_token_records_the_token_and_advances_vulkan
);

fn mapped_buffers_round_trip_and_feed_ops((name, mut b): Named) {
    let m = b.alloc_mapped(16).unwrap();
    assert_eq!(download_u32(b.as_mut(), &m, 4), [0; 4], "{name}: zeroed");
    b.upload(&m, 4, &5u32.to_le_bytes()).unwrap();
    let x = upload_f32(b.as_mut(), &[1.0, 9.0, 3.0]);
    pass(b.as_mut(), |b| b.argmax(&x, &m, 1, 3).unwrap());
    assert_eq!(download_u32(b.as_mut(), &m, 4), [1, 5, 0, 0], "{name}");
}
test_device!(
    mapped_buffers_round_trip_and_feed_ops,
    mapped_buffers_round_trip_and_feed_ops_cpu,
    mapped_buffers_round_trip_and_feed_ops_vulkan
);

fn linear_folds_norm_bias_and_residual_add((name, mut b, acts): Rounded) {
    // y_old + rms_norm(x)·Wᵀ + b. Tolerance: 1e-5 of Σ|w·x̂| + |b| (as
    // matmul; the norm's scale carries its own f32 rounding, well inside
    // that) plus one rounding of the add.
    let eps = 1e-5;
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
        DType::Q5K,
    ] {
        // At 2560 columns the int8 quantize spreads a row over three
        // workgroups (the last one ragged), each with its share of Σx².
        for (rows, cols, m) in [
            (37, 512, 1),
            (64, 512, 2),
            (9, 512, 4),
            (21, 512, 7),
            (5, 2560, 1),
            (3, 2560, 4),
            (6, 512, 36),
        ] {
            let wb = weight_bytes(dtype, rows, cols, (rows * 7 + cols) as u64);
            let wf = reference::dequantize(dtype, &wb, rows, cols).unwrap();
            let x: Vec<f32> = rand_f32(m * cols, 71).iter().map(|v| v * 3.0).collect();
            let nw: Vec<f32> = rand_f32(cols, 72).iter().map(|v| 1.0 + v).collect();
            let bias = rand_f32(rows, 73);
            let y_old = rand_f32(m * rows, 74);
            let xn = reference::rms_norm(&x, &nw, cols, eps).unwrap();
            let prod = reference::matmul(dtype, &wb, rows, cols, Some(&bias), &xn, m).unwrap();
            let want = reference::add(&y_old, &prod).unwrap();

            let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
            let (xb, nwb, bb, yb) = (
                upload_f32(b.as_mut(), &x),
                upload_f32(b.as_mut(), &nw),
                upload_f32(b.as_mut(), &bias),
                upload_f32(b.as_mut(), &y_old),
            );
            let opts = LinearOpts {
                bias: Some(&bb),
                norm: Some((&nwb, eps)),
                add: true,
            };
            pass(b.as_mut(), |b| b.linear(&w, &xb, &yb, m, &opts).unwrap());
            let got = download_f32(b.as_mut(), &yb, m * rows);
            for i in 0..m {
                let xr = &xn[i * cols..(i + 1) * cols];
                for r in 0..rows {
                    let wr = &wf[r * cols..(r + 1) * cols];
                    let mag: f32 =
                        wr.iter().zip(xr).map(|(a, c)| (a * c).abs()).sum::<f32>() + bias[r].abs();
                    let bound = activation_bound(acts, dtype, wr, xr, m);
                    let (g, e) = (got[i * rows + r], want[i * rows + r]);
                    assert!(
                        (g - e).abs() <= 1e-5 * mag + bound + 1e-6 * e.abs() + 1e-7,
                        "{name} {dtype} [{rows}x{cols}] m={m} y[{i},{r}] = {g}, want {e} (Σ|wx| {mag})"
                    );
                }
            }
            // Without norm, bias or add it is plain matmul.
            pass(b.as_mut(), |b| {
                b.linear(&w, &xb, &yb, m, &LinearOpts::default()).unwrap()
            });
            let plain = download_f32(b.as_mut(), &yb, m * rows);
            let yb2 = b.alloc(m * rows * 4).unwrap();
            pass(b.as_mut(), |b| b.matmul(&w, None, &xb, &yb2, m).unwrap());
            assert_eq!(
                plain,
                download_f32(b.as_mut(), &yb2, m * rows),
                "{name} {dtype} plain"
            );
            b.free_weight(w);
        }
    }
}
test_device!(
    linear_folds_norm_bias_and_residual_add,
    linear_folds_norm_bias_and_residual_add_cpu: matmul_cpu_backends,
    linear_folds_norm_bias_and_residual_add_vulkan: matmul_vulkan_backends
);

fn matmuls_of_one_input_share_it_until_it_changes((name, mut b, _): Rounded) {
    // A pass of matmuls that read one input (as Q, K and V do) may share
    // work derived from it (Vulkan quantizes it once for decode, norms it and
    // converts it to f16 once for the tiled GEMM), but must see every change:
    // other norm weights, other rows, or a write to the input. Each product
    // must equal, bit for bit, the same product in a pass of its own. Cases:
    // decode rows (1, 2), tiled rows (8, 16), and a 2048 x 2048 weight
    // (the cooperative-matrix GEMM takes x as f16 there).
    let eps = 1e-5;
    let cases = [
        (512, 40, [1, 2], &[DType::Q4K, DType::Q4_0, DType::F16][..]),
        (512, 40, [8, 16], &[DType::Q4K, DType::Q4_0, DType::F16][..]),
        (2048, 2048, [8, 16], &[DType::Q4_0][..]),
    ];
    for (cols, rows, [m1, m2], dtypes) in cases {
        for &dtype in dtypes {
            let w: Vec<_> = (0..2)
                .map(|i| {
                    let wb = weight_bytes(dtype, rows, cols, 90 + i);
                    b.upload_weight(dtype, rows, cols, &wb).unwrap()
                })
                .collect();
            let x0 = rand_f32(m2 * cols, 91);
            let (xb, x0b, zb) = (
                upload_f32(b.as_mut(), &x0),
                upload_f32(b.as_mut(), &x0),
                upload_f32(b.as_mut(), &rand_f32(m2 * cols, 92)),
            );
            let nw = [93, 94].map(|s| upload_f32(b.as_mut(), &rand_f32(cols, s)));
            let opts = |i: usize| LinearOpts {
                norm: Some((&nw[i], eps)),
                ..LinearOpts::default()
            };
            // (weight, norm weights, rows of x, after x += z)
            let steps = [
                (0, Some(0), m1, false),
                (1, Some(0), m1, false),
                (1, Some(1), m1, false),
                (0, None, m1, false),
                (1, None, m2, false),
                (0, Some(0), m1, false),
                (0, None, m2, true),
                (1, Some(0), m1, true),
                (0, Some(0), m1, true),
            ];
            let ys: Vec<_> = steps
                .iter()
                .map(|_| b.alloc(m2 * rows * 4).unwrap())
                .collect();
            let run = |b: &mut dyn ComputeBackend, i: usize, x: &vkllm::backend::Buffer| {
                let (wi, norm, m, _) = steps[i];
                let o = norm.map_or(LinearOpts::default(), opts);
                b.linear(&w[wi], x, &ys[i], m, &o).unwrap();
            };
            pass(b.as_mut(), |b| {
                for i in 0..steps.len() {
                    if i == 6 {
                        b.add(&xb, &zb, &xb, m2 * cols).unwrap();
                    }
                    run(b, i, &xb);
                }
            });
            let shared: Vec<_> = ys
                .iter()
                .map(|y| download_f32(b.as_mut(), y, m2 * rows))
                .collect();
            for (i, step) in steps.iter().enumerate() {
                let x = if step.3 { &xb } else { &x0b };
                pass(b.as_mut(), |b| run(b, i, x));
                let alone = download_f32(b.as_mut(), &ys[i], m2 * rows);
                assert_eq!(
                    shared[i], alone,
                    "{name} {dtype} {rows}x{cols} step {i} {step:?}"
                );
            }
        }
    }
}
test_device!(
    matmuls_of_one_input_share_it_until_it_changes,
    matmuls_of_one_input_share_it_until_it_changes_cpu: matmul_cpu_backends,
    matmuls_of_one_input_share_it_until_it_changes_vulkan: matmul_vulkan_backends
);

fn linear_glu_matches_separate_projections((name, mut b, acts): Rounded) {
    // out = act(x̂·Gᵀ) ⊙ (x̂·Uᵀ). Each product may be off by its matmul bound
    // e = 1e-5·Σ|w·x̂| (+ the activation rounding of CPU modes); the result
    // then by |act'|·e_g·|u| + |act(g)|·e_u with |act'| < 1.2 for SiLU and
    // tanh-GELU, plus one rounding.
    let eps = 1e-5;
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4K,
        DType::Q6K,
    ] {
        let cols = 256;
        // n = 32: whole blocks of outputs, so one-row integer-dot GLUs write
        // their output's digits and quantize their own input (mul_mat_vec.comp
        // Q8OUT, Q8IN).
        for (n, m, act, with_norm) in [
            (19, 1, Activation::Silu, true),
            (32, 1, Activation::Silu, true),
            (32, 1, Activation::GeluTanh, false),
            (19, 3, Activation::GeluTanh, false),
            (19, 6, Activation::Silu, true),
            (19, 36, Activation::Silu, true),
        ] {
            let wb = weight_bytes(dtype, 2 * n, cols, (n * 5 + cols) as u64);
            let wf = reference::dequantize(dtype, &wb, 2 * n, cols).unwrap();
            let x: Vec<f32> = rand_f32(m * cols, 81).iter().map(|v| v * 2.0).collect();
            let nw: Vec<f32> = rand_f32(cols, 82).iter().map(|v| 1.0 + v).collect();
            let xn = if with_norm {
                reference::rms_norm(&x, &nw, cols, eps).unwrap()
            } else {
                x.clone()
            };
            let gu = reference::matmul(dtype, &wb, 2 * n, cols, None, &xn, m).unwrap();
            let w = b.upload_weight(dtype, 2 * n, cols, &wb).unwrap();
            let (xb, nwb, out) = (
                upload_f32(b.as_mut(), &x),
                upload_f32(b.as_mut(), &nw),
                b.alloc(m * n * 4).unwrap(),
            );
            let norm = with_norm.then_some((&nwb, eps));
            pass(b.as_mut(), |b| {
                b.linear_glu(act, &w, &xb, &out, m, norm).unwrap()
            });
            let got = download_f32(b.as_mut(), &out, m * n);
            for r in 0..m {
                let xr = &xn[r * cols..(r + 1) * cols];
                let row = &gu[r * 2 * n..(r + 1) * 2 * n];
                let want = reference::glu(act, &row[..n], Some(&row[n..])).unwrap();
                for i in 0..n {
                    let err = |j: usize| {
                        let wr = &wf[j * cols..(j + 1) * cols];
                        let mag: f32 = wr.iter().zip(xr).map(|(a, c)| (a * c).abs()).sum();
                        1e-5 * mag + activation_bound(acts, dtype, wr, xr, m)
                    };
                    let (g, u) = (row[i], row[n + i]);
                    let act_g = reference::activate(act, g as f64) as f32;
                    let bound = 1.2 * err(i) * u.abs()
                        + act_g.abs() * err(n + i)
                        + 1e-6 * want[i].abs()
                        + 1e-7;
                    let v = got[r * n + i];
                    assert!(
                        (v - want[i]).abs() <= bound,
                        "{name} {dtype} m={m} {act:?} out[{r},{i}] = {v}, want {}",
                        want[i]
                    );
                }
            }
            b.free_weight(w);
        }
    }
}
test_device!(
    linear_glu_matches_separate_projections,
    linear_glu_matches_separate_projections_cpu: matmul_cpu_backends,
    linear_glu_matches_separate_projections_vulkan: matmul_vulkan_backends
);
