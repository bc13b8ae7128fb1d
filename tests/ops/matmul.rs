//! matmul on every weight type, backend and activation rounding, and the
//! CPU's integer-dot kernels against the scalar integer dot.

use crate::common::{self, download_f32, pass, rand_f32, upload_f32, weight_bytes};
use crate::{cols_for, cpu_backends, test_device};
use vkllm::backend::ComputeBackend;
use vkllm::cpu::act::{self, ActRows, ACT_BLOCK};
use vkllm::cpu::{ActivationPrecision, CpuBackend, Isa};
pub(crate) use vkllm::selftest::Rounding;
use vkllm::vk::{GemvKernel, MatmulKernel};
use vkllm::{reference, DType};

/// A matmul backend under test: name, backend, and how its matmuls round
/// activations.
pub(crate) type Rounded = (String, Box<dyn ComputeBackend>, Rounding);

/// `cpu_backends()` in the default activation mode, then the CPU's other
/// activation modes on every instruction set.
pub(crate) fn matmul_cpu_backends() -> Vec<Rounded> {
    let mut v: Vec<_> = cpu_backends()
        .into_iter()
        .map(|(n, b)| (n, b, Rounding::of(ActivationPrecision::default())))
        .collect();
    for isa in Isa::ALL {
        for acts in [
            ActivationPrecision::F32,
            ActivationPrecision::Q16,
            ActivationPrecision::Q8,
        ] {
            if acts == ActivationPrecision::default() {
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
pub(crate) fn matmul_vulkan_backends() -> Vec<Rounded> {
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

/// The most that rounding the inputs as `r` can move one output
/// ([`Rounding::bound`], which says why).
pub(crate) fn activation_bound(r: Rounding, dtype: DType, w: &[f32], x: &[f32], m: usize) -> f32 {
    r.bound(dtype, w, x, m) as f32
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

/// `x` (`[m, cols]`) times the `[rows, cols]` weight `wb` of `dtype` on `b`.
fn matmul_on(
    b: &mut dyn ComputeBackend,
    dtype: DType,
    wb: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
) -> Vec<f32> {
    let w = b.upload_weight(dtype, rows, cols, wb).unwrap();
    let (xb, yb) = (upload_f32(b, x), b.alloc(m * rows * 4).unwrap());
    pass(b, |b| b.matmul(&w, None, &xb, &yb, m).unwrap());
    let got = download_f32(b, &yb, m * rows);
    b.free_weight(w);
    got
}

/// A CPU backend of each instruction set this machine has, in each integer
/// activation precision.
fn integer_backends() -> Vec<(Isa, ActivationPrecision, Box<dyn ComputeBackend>)> {
    let mut v = Vec::new();
    for isa in Isa::ALL {
        for acts in [ActivationPrecision::Q16, ActivationPrecision::Q8] {
            if let Ok(b) = CpuBackend::with_isa(Some(2), isa) {
                v.push((
                    isa,
                    acts,
                    Box::new(b.with_activations(acts)) as Box<dyn ComputeBackend>,
                ));
            }
        }
    }
    v
}

/// Integer-dot weight types.
const INT_DTYPES: [DType; 10] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::TQ1_0,
    DType::TQ2_0,
];

/// `matmul` of `wb` (`[rows, cols]` of `dtype`) with `x` (`[m, cols]`) on `b`,
/// against the scalar integer dot (`act::dot_row`) on the same quantized
/// activations: the integer sums are exact, so only the f32 scaling may
/// differ (1e-5 of Σ|w·x|).
#[allow(clippy::too_many_arguments)]
fn check_integer_matmul(
    b: &mut dyn ComputeBackend,
    label: &str,
    acts: ActivationPrecision,
    dtype: DType,
    wb: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
) {
    let rb = dtype.row_bytes(cols).unwrap();
    let wf = reference::dequantize(dtype, wb, rows, cols).unwrap();
    let got = matmul_on(b, dtype, wb, rows, cols, x, m);
    let (q16, q8) = (
        ActRows::<i16>::quantize(x, m, cols),
        ActRows::<i8>::quantize(x, m, cols),
    );
    for i in 0..m {
        for r in 0..rows {
            let wrow = &wb[r * rb..(r + 1) * rb];
            let want = match acts {
                ActivationPrecision::Q16 => act::dot_row(dtype, wrow, &q16, i),
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
}

/// The SIMD integer-dot kernels (AVX2, AVX-512 VNNI), decode (m <= 4) and
/// prefill GEMM tiles (m > 4: row and weight counts that are not multiples
/// of the tiles, reductions that are odd numbers of blocks), against the
/// scalar integer dot on the same quantized activations.
#[test]
fn matmul_integer_activations_match_the_scalar_integer_dot() {
    for (isa, acts, mut b) in integer_backends() {
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
                    (23, 512, 33),
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
                    (23, 96, 33),
                ]
            };
            for &(rows, cols, m) in shapes {
                // Prefill has integer tiles on x86 only (f32 elsewhere).
                if m > 4 && !matches!(isa, Isa::Amx | Isa::Avx512 | Isa::Avx2) {
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

/// Whether `isa`'s Q8_0 prefill rounds activations on int8 levels again
/// (per block, to 16 bits): the 8-bit GEMM's AVX2 tile does not take Q8_0
/// (its unsigned digits would saturate `vpmaddubsw`), nor does AVX-512
/// without VNNI, which runs that tile.
fn rerounds_q8_0_prefill(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa == Isa::Avx2
            || (isa == Isa::Avx512 && !std::arch::is_x86_feature_detected!("avx512vnni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// Activation rows already on the int8 levels of their largest magnitude
/// (what BitNet's `round_i8` leaves) take the 8-bit kernels at either
/// integer precision, with the row's scale: the result is the exact dot of
/// the dequantized weights with those activations (f32 rounding only), on
/// every instruction set, every integer weight type, reductions with and
/// without a tail of whole 256-value blocks, decode and prefill (m > 4:
/// the 8-bit GEMM tiles, partial tiles of activation and weight rows; the
/// repacked row dots of 16 rows and more, short prefill too for the ternary
/// types).
#[test]
fn matmul_rows_on_int8_levels_are_exact() {
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for (isa, acts, mut b) in integer_backends() {
        for dtype in INT_DTYPES {
            for (rows, cols, m) in [
                (9, 4352, 1),
                (5, 2048, 2),
                (3, 768, 4),
                (4, 256, 3),
                (37, 1024, 1),
                (19, 768, 5),
                (21, 2048, 17),
                (33, 512, 33),
                (18, 256, 70),
            ] {
                if m > 4 && dtype == DType::Q8_0 && rerounds_q8_0_prefill(isa) {
                    continue;
                }
                let mut x = Vec::with_capacity(m * cols);
                for _ in 0..m {
                    let amax = 0.5 + (next() % 1000) as f32 / 100.0;
                    let s = 127.0 / amax;
                    x.push(-127.0 / s);
                    x.extend((1..cols).map(|_| ((next() % 255) as i32 - 127) as f32 / s));
                }
                assert!(ActRows::<i8>::levels(&x, m, cols).is_some());
                let wb = weight_bytes(dtype, rows, cols, (rows * 7 + cols) as u64);
                let wf = reference::dequantize(dtype, &wb, rows, cols).unwrap();
                let got = matmul_on(b.as_mut(), dtype, &wb, rows, cols, &x, m);
                for i in 0..m {
                    for r in 0..rows {
                        let (wr, xr) =
                            (&wf[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
                        let want: f64 = wr.iter().zip(xr).map(|(&w, &x)| w as f64 * x as f64).sum();
                        let mag: f64 = wr
                            .iter()
                            .zip(xr)
                            .map(|(&w, &x)| (w as f64 * x as f64).abs())
                            .sum();
                        let g = got[i * rows + r] as f64;
                        assert!(
                            (g - want).abs() <= 1e-5 * mag + 1e-7,
                            "{} {} {dtype} [{rows}x{cols}] m={m} y[{i},{r}] = {g}, want {want}",
                            isa.name(),
                            acts.name()
                        );
                    }
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
        let mut b: Box<dyn ComputeBackend> = Box::new(b.with_activations(ActivationPrecision::Q16));
        for m in [1, 4, 13] {
            if m > 4 && !matches!(isa, Isa::Amx | Isa::Avx512 | Isa::Avx2) {
                continue;
            }
            let x = vec![0.75f32; m * cols];
            let label = isa.name();
            check_integer_matmul(
                b.as_mut(),
                label,
                ActivationPrecision::Q16,
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

/// A matmul after its input buffer was rewritten (by an upload, an op's
/// output, a copy) reads the new values: the CPU keeps the quantized input
/// of the last matmuls (`ActsMemo`) and must not serve it stale.
fn matmul_reads_its_input_as_rewritten((name, mut b, _): Rounded) {
    let (rows, cols) = (32, 256);
    let b = b.as_mut();
    for dtype in [DType::Q8_0, DType::Q4K, DType::TQ2_0] {
        let xs: Vec<Vec<f32>> = (0..4).map(|s| rand_f32(cols, 90 + s)).collect();
        let fresh: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| {
                matmul_on(
                    b,
                    dtype,
                    &weight_bytes(dtype, rows, cols, 7),
                    rows,
                    cols,
                    x,
                    1,
                )
            })
            .collect();
        let w = b
            .upload_weight(dtype, rows, cols, &weight_bytes(dtype, rows, cols, 7))
            .unwrap();
        let x = upload_f32(b, &xs[0]);
        let (other, third) = (upload_f32(b, &xs[2]), upload_f32(b, &xs[3]));
        let y = b.alloc(rows * 4).unwrap();
        let mut got = Vec::new();
        for step in 0..4 {
            pass(b, |b| {
                match step {
                    0 => {}
                    1 => b.upload(&x, 0, bytemuck::cast_slice(&xs[1])).unwrap(),
                    2 => b.scale(&other, 1.0, &x, cols).unwrap(),
                    _ => b.copy(&third, 0, &x, 0, cols * 4).unwrap(),
                }
                // Twice: the second reads what the first quantized.
                b.matmul(&w, None, &x, &y, 1).unwrap();
                b.matmul(&w, None, &x, &y, 1).unwrap();
            });
            got.push(download_f32(b, &y, rows));
        }
        for (step, (g, want)) in got.iter().zip(&fresh).enumerate() {
            assert_eq!(g, want, "{name} {dtype} step {step}");
        }
        b.free_weight(w);
    }
}
test_device!(
    matmul_reads_its_input_as_rewritten,
    matmul_reads_its_input_as_rewritten_cpu: matmul_cpu_backends,
    matmul_reads_its_input_as_rewritten_vulkan: matmul_vulkan_backends
);
