//! Thread scaling of the CPU backend, kernel by kernel: each kernel's time
//! at 1, 2, 4, 8 and 16 threads (those this machine has; `VKLLM_BENCH_THREADS`
//! lists others, e.g. `1,3,6,12`), and its speed-up over one thread.
//! Decode GEMVs rotate their weights past the last-level cache, as a
//! model's layers do; the rest run on data in cache.
//!
//! `cargo bench --bench cpu_threads [-- KERNEL...]` (names as printed,
//! e.g. `gemv-q4_k gemm-tq2_0 glu`).

mod common;

use std::time::Instant;
use vkllm::backend::{Activation, Buffer, ComputeBackend, Weight};
use vkllm::cpu::CpuBackend;
use vkllm::quants::quantize_row;
use vkllm::DType;

/// Bytes of weights a GEMV rotates over.
const ROTATE_BYTES: usize = 128 << 20;
/// Timed passes per kernel and thread count (the best is kept).
const PASSES: usize = 5;
/// Each pass runs at least this long.
const PASS_SECS: f64 = 0.05;

/// A kernel to time: what one call does, and its work (for the rate column).
struct Kernel {
    name: String,
    /// Bytes (GEMV) or multiply-adds (GEMM) or values (the rest) per call.
    work: f64,
    unit: &'static str,
    make: Box<dyn Fn(&mut CpuBackend) -> Setup>,
}

/// Call `i` of a kernel, given its weights and buffers.
type Call = Box<dyn Fn(&mut CpuBackend, &[Weight], &[Buffer], usize)>;

/// Buffers and weights of one kernel on one backend, and the call.
struct Setup {
    weights: Vec<Weight>,
    bufs: Vec<Buffer>,
    call: Call,
}

fn upload(b: &mut CpuBackend, v: &[f32]) -> Buffer {
    let buf = b.alloc(v.len() * 4).unwrap();
    b.upload(&buf, 0, bytemuck::cast_slice(v)).unwrap();
    buf
}

fn weight(b: &mut CpuBackend, dtype: DType, rows: usize, cols: usize, seed: u64) -> Weight {
    let mut row = vec![0u8; dtype.row_bytes(cols).unwrap()];
    let mut data = Vec::with_capacity(row.len() * rows);
    for r in 0..rows {
        quantize_row(dtype, &common::rand(cols, seed + r as u64), &mut row).unwrap();
        data.extend_from_slice(&row);
    }
    b.upload_weight(dtype, rows, cols, &data).unwrap()
}

fn gemv(dtype: DType, rows: usize, cols: usize) -> Kernel {
    let bytes = dtype.row_bytes(cols).unwrap() * rows;
    Kernel {
        name: format!("gemv-{dtype} {rows}x{cols}").to_ascii_lowercase(),
        work: bytes as f64,
        unit: "GB/s",
        make: Box::new(move |b| {
            let copies = common::rotate_bytes(ROTATE_BYTES).div_ceil(bytes).max(1);
            let one = weight(b, dtype, rows, cols, 1);
            let mut weights = vec![one];
            for c in 1..copies {
                weights.push(weight(b, dtype, rows, cols, 1 + c as u64 * 7919));
            }
            // BitNet's matmuls meet activations on int8 levels (`round_i8`),
            // which take the 8-bit kernels.
            let mut x = common::rand(cols, 99);
            if matches!(dtype, DType::TQ1_0 | DType::TQ2_0) {
                x[0] = 1.0;
                x.iter_mut().for_each(|v| *v = (*v * 127.0).round() / 127.0);
            }
            let bufs = vec![upload(b, &x), b.alloc(rows * 4).unwrap()];
            Setup {
                weights,
                bufs,
                call: Box::new(|b, w, x, i| {
                    b.matmul(&w[i % w.len()], None, &x[0], &x[1], 1).unwrap()
                }),
            }
        }),
    }
}

fn gemm(dtype: DType, m: usize, rows: usize, cols: usize) -> Kernel {
    Kernel {
        name: format!("gemm-{dtype} {m}x{rows}x{cols}").to_ascii_lowercase(),
        work: (2 * m * rows * cols) as f64,
        unit: "GFLOP/s",
        make: Box::new(move |b| {
            let weights = vec![weight(b, dtype, rows, cols, 3)];
            let bufs = vec![
                upload(b, &common::rand(m * cols, 5)),
                b.alloc(m * rows * 4).unwrap(),
            ];
            Setup {
                weights,
                bufs,
                call: Box::new(move |b, w, x, _| b.matmul(&w[0], None, &x[0], &x[1], m).unwrap()),
            }
        }),
    }
}

fn glu(n: usize) -> Kernel {
    Kernel {
        name: format!("glu-silu {n}"),
        work: n as f64,
        unit: "Gvalues/s",
        make: Box::new(move |b| {
            let bufs = vec![
                upload(b, &common::rand(n, 7)),
                upload(b, &common::rand(n, 8)),
                b.alloc(n * 4).unwrap(),
            ];
            Setup {
                weights: Vec::new(),
                bufs,
                call: Box::new(move |b, _, x, _| {
                    b.glu(Activation::Silu, &x[0], Some(&x[1]), &x[2], n)
                        .unwrap()
                }),
            }
        }),
    }
}

fn rms_norm(rows: usize, dim: usize) -> Kernel {
    Kernel {
        name: format!("rms_norm {rows}x{dim}"),
        work: (rows * dim) as f64,
        unit: "Gvalues/s",
        make: Box::new(move |b| {
            let bufs = vec![
                upload(b, &common::rand(rows * dim, 9)),
                upload(b, &common::rand(dim, 10)),
                b.alloc(rows * dim * 4).unwrap(),
            ];
            Setup {
                weights: Vec::new(),
                bufs,
                call: Box::new(move |b, _, x, _| {
                    b.rms_norm(&x[0], &x[1], &x[2], rows, dim, 1e-5).unwrap()
                }),
            }
        }),
    }
}

/// Seconds per call: the best of [`PASSES`] passes of back-to-back calls.
fn time(b: &mut CpuBackend, k: &Kernel) -> f64 {
    let s = (k.make)(b);
    let mut calls = 1usize;
    let mut best = f64::INFINITY;
    // The first pass finds a call count that fills `PASS_SECS` (and warms up).
    for pass in 0..=PASSES {
        let t = Instant::now();
        b.begin_pass().unwrap();
        for i in 0..calls {
            (s.call)(b, &s.weights, &s.bufs, i);
        }
        b.end_pass().unwrap();
        let secs = t.elapsed().as_secs_f64();
        if pass == 0 {
            calls = ((PASS_SECS / (secs / calls as f64)).ceil() as usize).max(1);
        } else {
            best = best.min(secs / calls as f64);
        }
    }
    for w in s.weights {
        b.free_weight(w);
    }
    for buf in s.bufs {
        b.free(buf);
    }
    best
}

fn main() {
    let want = common::wanted();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads: Vec<usize> = match std::env::var("VKLLM_BENCH_THREADS") {
        Ok(list) => list
            .split(',')
            .filter_map(|t| t.trim().parse().ok())
            .collect(),
        Err(_) => [1, 2, 4, 8, 16]
            .into_iter()
            .filter(|t| *t <= cores)
            .collect(),
    };
    let mut kernels = Vec::new();
    for dtype in [DType::Q4_0, DType::Q4K, DType::Q6K, DType::Q8_0] {
        kernels.push(gemv(dtype, 2048, 2048));
    }
    for dtype in [DType::TQ1_0, DType::TQ2_0] {
        kernels.push(gemv(dtype, 2560, 2560));
    }
    kernels.push(gemv(DType::Q4_1, 576, 576));
    for dtype in [DType::Q4_0, DType::Q4K, DType::TQ2_0] {
        kernels.push(gemm(dtype, 256, 2048, 2048));
    }
    kernels.push(glu(256 * 8192));
    kernels.push(rms_norm(256, 2048));
    kernels.retain(|k| want.is_empty() || want.iter().any(|w| k.name.starts_with(w.as_str())));

    println!("CPU thread scaling ({cores} cores here): rate, and speed-up over 1 thread");
    print!("| kernel | unit |");
    for t in &threads {
        print!(" {t} |");
    }
    println!();
    println!("|---|---|{}", "---:|".repeat(threads.len()));
    let mut backends: Vec<CpuBackend> = threads.iter().map(|t| CpuBackend::new(Some(*t))).collect();
    for k in &kernels {
        let secs: Vec<f64> = backends.iter_mut().map(|b| time(b, k)).collect();
        print!("| {} | {} |", k.name, k.unit);
        for s in &secs {
            print!(" {:.1} ({:.2}x) |", k.work / s / 1e9, secs[0] / s);
        }
        println!();
    }
}
