//! Every `ComputeBackend` op on every backend against `vkllm::reference`,
//! one module per op family: each test is one function of a backend, which
//! `test_device!` runs as `<test>_cpu` (every CPU instruction set available
//! here) and `<test>_vulkan` (skipped without a Vulkan device).
//!
//! Tolerances are stated per test. The reference sums in f64 over weights
//! dequantized exactly, so the f32 backends differ from it only by f32
//! rounding and summation order.

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod elementwise;
mod experts;
mod linear;
mod matmul;
mod norm_rope;
mod paged;
mod passes;

use vkllm::backend::ComputeBackend;
use vkllm::cpu::{CpuBackend, Isa};
use vkllm::DType;

/// A backend under test and the name failures print.
type Named = (String, Box<dyn ComputeBackend>);

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

/// Column counts to test for `dtype`: whole blocks, several of them, plus
/// odd lengths for the float types.
fn cols_for(dtype: DType) -> Vec<usize> {
    match dtype.block_elems() {
        1 => vec![7, 64, 100, 576],
        32 => vec![32, 96, 576],
        _ => vec![256, 768],
    }
}

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
