//! Decode GEMV on the CPU backend: for each instruction set, weight type
//! and decode shape, the weight bytes streamed per second by `matmul` with
//! one input row (what a decode step reads). Weights rotate over copies
//! larger than the last-level cache, as a model's layers do.
//!
//! `cargo bench --bench cpu_gemv [-- DTYPE...]`; `VKLLM_BENCH_THREADS`
//! sets the threads (default: all).

mod common;

use std::time::Instant;
use vkllm::backend::ComputeBackend;
use vkllm::cpu::{ActivationPrecision, CpuBackend, Isa};
use vkllm::quants::quantize_row;
use vkllm::DType;

/// Bytes of weights one shape rotates over: past any L3 here.
const ROTATE_BYTES: usize = 192 << 20;
const PASSES: usize = 5;

/// (rows, cols): TinyLlama / Llama-3.2-1B's decode matmuls (K or V, Q or O,
/// TinyLlama's gate or up, Llama's down).
const SHAPES: [(usize, usize); 4] = [(256, 2048), (2048, 2048), (5632, 2048), (2048, 8192)];

/// BitNet b1.58 2B's (ffn 6912, hidden 2560) for the ternary types: gate or
/// up, down, Q or O.
const TERNARY_SHAPES: [(usize, usize); 3] = [(6912, 2560), (2560, 6912), (2560, 2560)];

fn gbs(b: &mut CpuBackend, dtype: DType, rows: usize, cols: usize) -> f64 {
    let bytes = dtype.row_bytes(cols).unwrap() * rows;
    // `VKLLM_BENCH_ROTATE_MB` (e.g. 1: in cache) times the kernels' compute.
    let rotate = common::rotate_bytes(ROTATE_BYTES);
    let copies = rotate.div_ceil(bytes).max(1);
    let mut row = vec![0u8; dtype.row_bytes(cols).unwrap()];
    let mut data = Vec::with_capacity(bytes);
    for r in 0..rows {
        quantize_row(dtype, &common::rand(cols, 1 + r as u64), &mut row).unwrap();
        data.extend_from_slice(&row);
    }
    let ws: Vec<_> = (0..copies)
        .map(|_| b.upload_weight(dtype, rows, cols, &data).unwrap())
        .collect();
    let x = b.alloc(cols * 4).unwrap();
    b.upload(&x, 0, bytemuck::cast_slice(&common::rand(cols, 99)))
        .unwrap();
    let y = b.alloc(rows * 4).unwrap();
    let mut best = f64::INFINITY;
    // Small weights run several rounds a pass, so a pass is long enough to time.
    let rounds = (64 << 20) / (bytes * copies) + 1;
    for _ in 0..=PASSES {
        let t = Instant::now();
        b.begin_pass().unwrap();
        for _ in 0..rounds {
            for w in &ws {
                b.matmul(w, None, &x, &y, 1).unwrap();
            }
        }
        b.end_pass().unwrap();
        best = best.min(t.elapsed().as_secs_f64() / rounds as f64);
    }
    for w in ws {
        b.free_weight(w);
    }
    (bytes * copies) as f64 / best / 1e9
}

fn main() {
    let want = common::wanted();
    let threads = std::env::var("VKLLM_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok());
    let dtypes = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
        DType::TQ1_0,
        DType::TQ2_0,
    ];
    // The last column: f32 activations (the float kernels, which were the
    // ternary types' only path before their integer dots).
    println!("| isa | type | rows x cols | GB/s GGUF rows | GB/s repacked | GB/s f32 x |");
    println!("|---|---|---|---:|---:|---:|");
    for isa in [Isa::Avx512, Isa::Avx2] {
        let (Ok(rows_b), Ok(packed_b), Ok(f32_b)) = (
            CpuBackend::with_isa(threads, isa),
            CpuBackend::with_isa(threads, isa),
            CpuBackend::with_isa(threads, isa),
        ) else {
            continue;
        };
        let mut b = [
            rows_b.with_repack(false),
            packed_b.with_repack(true),
            f32_b.with_activations(ActivationPrecision::F32),
        ];
        for dtype in dtypes {
            if !want.is_empty() && !want.contains(&dtype.to_string().to_ascii_lowercase()) {
                continue;
            }
            let shapes: &[(usize, usize)] = if matches!(dtype, DType::TQ1_0 | DType::TQ2_0) {
                &TERNARY_SHAPES
            } else {
                &SHAPES
            };
            for &(rows, cols) in shapes {
                let g = b.each_mut().map(|b| gbs(b, dtype, rows, cols));
                let name = isa.name();
                println!(
                    "| {name} | {dtype} | {rows} x {cols} | {:.1} | {:.1} | {:.1} |",
                    g[0], g[1], g[2]
                );
            }
        }
    }
}
