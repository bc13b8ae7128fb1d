//! Vulkan backend tests on whatever device `VKLLM_DEVICE` / the default
//! selection gives (lavapipe here), one module per kind: the kernel
//! variants of one op (GEMV, tiled and cooperative-matrix GEMM, the
//! attention kernels) against `vkllm::reference`; the mixture-of-experts
//! ops in replayed passes; lifecycle, barrier placement and transfers;
//! error paths; the measurement probes. Each op's parity tests on every
//! device are in tests/ops/. Each test skips only when the machine has no
//! Vulkan device (VKLLM_REQUIRE_VULKAN=1 makes that a failure).
//!
//! Tolerances: results are compared with the f64 reference. Reductions in
//! f32 over k terms carry an error of about k·2⁻²⁴ times the sum of the
//! absolute terms, so matmul and attention are checked against
//! `TOL · Σ|terms|`.

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod errors;
mod experts;
mod lifecycle;
mod matmul;
mod probes;

use vkllm::reference;
use vkllm::vk::{GemvKernel, VulkanBackend};
use vkllm::DType;

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
