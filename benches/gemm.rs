//! Prefill GEMM throughput on the Vulkan device: for each weight type and a
//! model's matmul shapes, the TFLOP/s `matmul` reaches with `m` input rows
//! (a prompt's tokens), timed by the GPU's timestamps around each dispatch.
//! The kernel is the one the backend chose (`VKLLM_MATMUL` forces one), so
//! running it once per kernel compares them on the same device.
//!
//! `cargo bench --bench gemm` prints one table; `VKLLM_GEMM_M=64,512` picks
//! the row counts, `VKLLM_GEMM_TYPES=q4_k,f16` the weight types and
//! `VKLLM_GEMM_SHAPES=4096x4096,14336x4096` the shapes (each a list; all
//! by default).

mod common;

use vkllm::backend::{Buffer, ComputeBackend, Weight};
use vkllm::quants::quantize_row;
use vkllm::DType;

/// Matmuls per timed pass, and passes (the first is a warm-up).
const PER_PASS: usize = 8;
const PASSES: usize = 4;

/// Best TFLOP/s over the passes: 2·m·n·k per matmul over the GPU time of
/// its dispatches (the GEMM's own, without norm or add).
fn gemm_tflops(b: &mut dyn ComputeBackend, w: &Weight, x: &Buffer, y: &Buffer, m: usize) -> f64 {
    common::settle(b, |b| {
        for _ in 0..PER_PASS {
            b.matmul(w, None, x, y, m).unwrap();
        }
    });
    let mut best = f64::INFINITY;
    for pass in 0..PASSES {
        let secs = common::gpu_pass_seconds(b, |b| {
            for _ in 0..PER_PASS {
                b.matmul(w, None, x, y, m).unwrap();
            }
        });
        if pass > 0 {
            best = best.min(secs);
        }
    }
    2.0 * (m * w.rows * w.cols * PER_PASS) as f64 / best / 1e12
}

fn main() {
    let Some(mut b) = common::vulkan("gemm") else {
        return;
    };
    let ms: Vec<usize> = std::env::var("VKLLM_GEMM_M")
        .unwrap_or_else(|_| "512".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    // Llama-3.2-1B's q/o, k/v, gate/up and down, then Llama-3.1-8B's.
    let shapes = [
        (2048usize, 2048usize),
        (512, 2048),
        (8192, 2048),
        (2048, 8192),
        (4096, 4096),
        (1024, 4096),
        (14336, 4096),
        (4096, 14336),
    ];
    let dtypes = [
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::F16,
    ];
    println!(
        "{}, VKLLM_MATMUL={}",
        b.name(),
        vkllm::vk::Options::from_env()
            .ok()
            .and_then(|o| o.kernels.matmul)
            .map_or("", vkllm::vk::MatmulOverride::name)
    );
    print!("{:<8} {:>12}", "dtype", "n x k");
    for m in &ms {
        print!(" {:>9}", format!("m={m}"));
    }
    println!("  (TFLOP/s)");
    let types = std::env::var("VKLLM_GEMM_TYPES").unwrap_or_default();
    let only = std::env::var("VKLLM_GEMM_SHAPES").unwrap_or_default();
    let picked = |list: &str, name: &str| list.is_empty() || list.split(',').any(|t| t == name);
    for dtype in dtypes.into_iter().filter(|d| picked(&types, d.name())) {
        for &(rows, cols) in &shapes {
            if !picked(&only, &format!("{rows}x{cols}")) {
                continue;
            }
            let mut row = vec![0u8; dtype.row_bytes(cols).unwrap()];
            quantize_row(dtype, &common::rand(cols, 1), &mut row).unwrap();
            let w = b
                .upload_weight(dtype, rows, cols, &row.repeat(rows))
                .unwrap();
            print!("{:<8} {:>12}", dtype.name(), format!("{rows}x{cols}"));
            for &m in &ms {
                let x = b.alloc(m * cols * 4).unwrap();
                b.upload(&x, 0, bytemuck::cast_slice(&common::rand(m * cols, 99)))
                    .unwrap();
                let y = b.alloc(m * rows * 4).unwrap();
                print!(" {:>9.1}", gemm_tflops(b.as_mut(), &w, &x, &y, m));
                b.free(x);
                b.free(y);
            }
            println!();
            b.free_weight(w);
        }
    }
}
