//! Op benchmarks on every backend available (the CPU, with each x86
//! instruction set it has; Vulkan when
//! `vkllm::open::open_backend` opens Vulkan): matmul as GEMV (m = 1, weight GB/s) and GEMM
//! (m = 512, GFLOP/s, shown by criterion as elements/s) at SmolLM2-135M shapes
//! and at 2048², 4096² and 14336×4096 (Llama-3.1-8B's FFN), plus rms_norm,
//! rope and attention against 512- and 4096-position caches.
//!
//! Work is timed by the backend's profiler: Vulkan on the GPU (timestamp
//! queries around each dispatch), the CPU by the wall clock of each op.
//!
//! `VKLLM_BENCH_ALL=1` runs every weight dtype at every shape; the default
//! keeps the run short (SmolLM2's dtypes at its shapes, every dtype at 2048²).

mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::{Duration, Instant};
use vkllm::backend::{AttentionParams, Buffer, ComputeBackend, RopeParams, RopeStyle};
use vkllm::cpu::{CpuBackend, Isa};
use vkllm::profile::Track;
use vkllm::quants::quantize_row;
use vkllm::DType;

/// The CPU once per x86 instruction set it has (so an AVX-512 machine
/// also reports its AVX2 kernels), then Vulkan.
fn backends() -> Vec<(String, Box<dyn ComputeBackend>)> {
    let best = CpuBackend::new(None);
    let mut v: Vec<(String, Box<dyn ComputeBackend>)> = Vec::new();
    for isa in [Isa::Avx512, Isa::Avx2] {
        if isa != best.isa() {
            if let Ok(cpu) = CpuBackend::with_isa(None, isa) {
                v.push((format!("cpu-{}", isa.name()), Box::new(cpu)));
            }
        }
    }
    v.insert(0, (format!("cpu-{}", best.isa().name()), Box::new(best)));
    match vkllm::open::open_backend(&vkllm::open::BackendChoice::Vulkan, Default::default()) {
        Ok((b, _)) => v.push(("vulkan".into(), b)),
        Err(e) => eprintln!("bench: no Vulkan backend ({e})"),
    }
    v
}

fn upload(b: &mut dyn ComputeBackend, data: &[f32]) -> Buffer {
    let buf = b.alloc(data.len() * 4).unwrap();
    b.upload(&buf, 0, bytemuck::cast_slice(data)).unwrap();
    buf
}

/// A `[rows, cols]` weight: one random row quantized, repeated (quantizing
/// 4096² values with the reference k-quantizers would dominate the run).
fn weight_bytes(dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let mut row = vec![0u8; dtype.row_bytes(cols).unwrap()];
    quantize_row(dtype, &common::rand(cols, 1), &mut row).unwrap();
    row.repeat(rows)
}

/// `iters` passes of `f`, timed as the sum of the op durations the backend
/// profiles (GPU timestamp queries; the CPU's per-op wall time), else by
/// the wall clock.
fn timed(b: &mut dyn ComputeBackend, iters: u64, f: impl Fn(&mut dyn ComputeBackend)) -> Duration {
    let profiled = b.set_profiling(true).is_ok();
    let start = Instant::now();
    for _ in 0..iters {
        b.begin_pass().unwrap();
        f(b);
        b.end_pass().unwrap();
    }
    let wall = start.elapsed();
    if !profiled {
        return wall;
    }
    let us: f64 = b
        .take_profile()
        .iter()
        .filter(|e| e.track == Track::Gpu)
        .map(|e| e.dur_us)
        .sum();
    b.set_profiling(false).unwrap();
    Duration::from_secs_f64(us * 1e-6)
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

/// (label, rows, cols, dtypes): rows = output features, cols = reduction.
fn matmul_shapes() -> Vec<(&'static str, usize, usize, Vec<DType>)> {
    let all = std::env::var("VKLLM_BENCH_ALL").as_deref() == Ok("1");
    // Every type vkllm can quantize (the 2- and 3-bit i-quants it only reads).
    let every: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|d| d.format().encode.is_some())
        .collect();
    let pick = |d: &[DType]| if all { every.clone() } else { d.to_vec() };
    vec![
        ("qo_576x576", 576, 576, pick(&[DType::Q4_1])),
        ("kv_192x576", 192, 576, pick(&[DType::Q4_1])),
        ("gate_up_1536x576", 1536, 576, pick(&[DType::Q4_1])),
        ("down_576x1536", 576, 1536, pick(&[DType::Q4_1])),
        ("output_49152x576", 49152, 576, pick(&[DType::Q8_0])),
        ("sq_2048", 2048, 2048, every.clone()),
        (
            "sq_4096",
            4096,
            4096,
            pick(&[DType::Q4_1, DType::Q8_0, DType::F16]),
        ),
        (
            "ffn_14336x4096",
            14336,
            4096,
            pick(&[DType::Q4K, DType::Q4_0]),
        ),
    ]
}

fn bench_matmul(c: &mut Criterion) {
    for (bname, mut b) in backends() {
        for (label, rows, cols, dtypes) in matmul_shapes() {
            for dtype in dtypes {
                let wb = weight_bytes(dtype, rows, cols);
                let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
                for m in [1usize, 512] {
                    // 512 rows of the output projection is not a real workload.
                    if m > 1 && rows > 8192 && cols < 1024 {
                        continue;
                    }
                    let x = upload(b.as_mut(), &common::rand(m * cols, 2));
                    let y = b.alloc(m * rows * 4).unwrap();
                    let mut g = c.benchmark_group(format!("matmul_m{m}/{bname}"));
                    if m == 1 {
                        g.throughput(Throughput::Bytes(wb.len() as u64));
                    } else {
                        g.throughput(Throughput::Elements((2 * m * rows * cols) as u64));
                    }
                    g.bench_function(BenchmarkId::new(label, dtype.name()), |it| {
                        it.iter_custom(|n| {
                            timed(b.as_mut(), n, |b| b.matmul(&w, None, &x, &y, m).unwrap())
                        })
                    });
                    g.finish();
                    b.free(x);
                    b.free(y);
                }
                b.free_weight(w);
            }
        }
    }
}

fn bench_small_ops(c: &mut Criterion) {
    for (bname, mut b) in backends() {
        let mut g = c.benchmark_group(format!("ops/{bname}"));
        for rows in [1usize, 512] {
            let dim = 576;
            let x = upload(b.as_mut(), &common::rand(rows * dim, 3));
            let w = upload(b.as_mut(), &common::rand(dim, 4));
            let out = b.alloc(rows * dim * 4).unwrap();
            g.throughput(Throughput::Bytes((rows * dim * 8) as u64));
            g.bench_function(BenchmarkId::new("rms_norm_576", rows), |it| {
                it.iter_custom(|n| {
                    timed(b.as_mut(), n, |b| {
                        b.rms_norm(&x, &w, &out, rows, dim, 1e-5).unwrap()
                    })
                })
            });
            let p = RopeParams {
                rows,
                n_heads: 9,
                head_dim: 64,
                rot_dim: 64,
                base: 1e5,
                style: RopeStyle::Neox,
                scaling: None,
            };
            let pos: Vec<u32> = (0..rows as u32).collect();
            let pb = b.alloc(rows * 4).unwrap();
            b.upload(&pb, 0, bytemuck::cast_slice(&pos)).unwrap();
            g.throughput(Throughput::Bytes((rows * dim * 8) as u64));
            g.bench_function(BenchmarkId::new("rope_9x64", rows), |it| {
                it.iter_custom(|n| timed(b.as_mut(), n, |b| b.rope(&x, &pb, &p).unwrap()))
            });
            // Attention against a 512- or 4096-position cache: decode at the
            // last position, or a 512-row causal prefill ending there.
            for capacity in [512usize, 4096] {
                let kv = 3 * 64;
                let k = upload(b.as_mut(), &common::rand(capacity * kv, 5));
                let v = upload(b.as_mut(), &common::rand(capacity * kv, 6));
                let last = capacity as u32 - 1;
                let pos: Vec<u32> = (last + 1 - rows as u32..=last).collect();
                b.upload(&pb, 0, bytemuck::cast_slice(&pos)).unwrap();
                let ap = AttentionParams {
                    rows,
                    n_heads: 9,
                    n_kv_heads: 3,
                    head_dim: 64,
                    capacity,
                    span: capacity,
                    scale: 0.125,
                    window: 0,
                    kv_dtype: DType::F32,
                    pages: None,
                    next: None,
                    sinks: None,
                };
                let pairs: usize = pos.iter().map(|p| *p as usize + 1).sum();
                g.throughput(Throughput::Elements((pairs * 9 * 64 * 4) as u64));
                let id = BenchmarkId::new(format!("attention_kv{capacity}_flop"), rows);
                g.bench_function(id, |it| {
                    it.iter_custom(|n| {
                        timed(b.as_mut(), n, |b| {
                            b.attention(&x, &k, &v, &pb, &out, &ap).unwrap()
                        })
                    })
                });
                b.free(k);
                b.free(v);
            }
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_matmul, bench_small_ops
}
criterion_main!(benches);
