//! Decode GEMV against the memory ceiling, on the Vulkan device: for each
//! weight type and decode shape, the weight bytes streamed per second by
//! `matmul` with one input row, beside the device's copy bandwidth measured
//! in the same process and a streaming kernel's at the weight's size
//! (`stream`). Weights rotate over several copies larger than any L2 cache,
//! as a model's layers do, and many matmuls share one pass, so the figure
//! is what a decode step can reach.
//!
//! `cargo bench --bench gemv [-- DTYPE... ROWSxCOLS...]` prints one table
//! (of the named weight types only, if any, at the named shapes, if any,
//! else at the anchor models' decode shapes); `benches/memory.rs`
//! shows why the copy ceiling is timed over long passes (short ones read
//! low right after a process writes gigabytes of fresh host memory).

mod common;

use std::time::Instant;
use vkllm::backend::{Buffer, ComputeBackend, Weight};
use vkllm::bench::bandwidth::{backend_copy_gbs, DEVICE_COPIES};
use vkllm::quants::quantize_row;
use vkllm::DType;

/// Bytes of weights one shape rotates over: well past an H200's 50 MB L2.
const ROTATE_BYTES: usize = 256 << 20;
/// Matmuls per timed pass.
const PER_PASS: usize = 64;
const PASSES: usize = 5;

/// How a timed pass reaches the GPU.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Recorded afresh every pass, timed by the wall clock.
    Fresh,
    /// Recorded once and replayed (as decode runs), wall clock.
    Replay,
    /// Recorded afresh, timed by the GPU's timestamps around each dispatch.
    Gpu,
}

/// Best GB/s over `PASSES` passes of `PER_PASS` ops, each recorded by
/// `op(b, i)` and moving `bytes`.
fn pass_gbs(
    b: &mut dyn ComputeBackend,
    bytes: usize,
    mode: Mode,
    op: impl Fn(&mut dyn ComputeBackend, usize),
) -> f64 {
    let record = |b: &mut dyn ComputeBackend| {
        for i in 0..PER_PASS {
            op(b, i);
        }
    };
    if matches!(mode, Mode::Fresh) {
        common::settle(b, record);
    }
    let mut best = f64::INFINITY;
    match mode {
        Mode::Fresh | Mode::Gpu => {
            for pass in 0..=PASSES {
                let secs = if matches!(mode, Mode::Gpu) {
                    common::gpu_pass_seconds(b, record)
                } else {
                    let t = Instant::now();
                    b.begin_pass().unwrap();
                    record(b);
                    b.end_pass().unwrap();
                    t.elapsed().as_secs_f64()
                };
                if pass > 0 {
                    best = best.min(secs);
                }
            }
        }
        Mode::Replay => {
            b.begin_replayable_pass(7).unwrap();
            record(b);
            b.end_pass().unwrap();
            for _ in 0..PASSES {
                let t = Instant::now();
                assert!(b.replay(7, 1).unwrap(), "the pass was not kept");
                best = best.min(t.elapsed().as_secs_f64());
            }
        }
    }
    (bytes * PER_PASS) as f64 / best / 1e9
}

/// GB/s of weight bytes of matmuls with one input row cycling through `ws`.
fn gemv_gbs(b: &mut dyn ComputeBackend, ws: &[Weight], x: &Buffer, y: &Buffer, mode: Mode) -> f64 {
    let bytes: usize = ws[0].dtype.row_bytes(ws[0].cols).unwrap() * ws[0].rows;
    pass_gbs(b, bytes, mode, |b, i| {
        b.matmul(&ws[i % ws.len()], None, x, y, 1).unwrap()
    })
}

/// The streaming ceiling at a GEMV's size: GB/s of `scale` dispatches each
/// moving `bytes` (half read from sources rotating past the L2 cache, half
/// written into one destination, so each waits for the one before, as the
/// GEMVs writing one y do), timed by the GPU's timestamps. Short kernels
/// pay their start and drain: this, not the copy probe's long passes, is
/// what a GEMV of that size can reach.
fn stream_gbs(b: &mut dyn ComputeBackend, bytes: usize) -> f64 {
    let half = bytes / 2 / 16 * 16;
    let sources: Vec<Buffer> = (0..ROTATE_BYTES.div_ceil(half).clamp(1, 64))
        .map(|_| b.alloc(half).unwrap())
        .collect();
    let dst = b.alloc(half).unwrap();
    let gbs = pass_gbs(b, 2 * half, Mode::Gpu, |b, i| {
        b.scale(&sources[i % sources.len()], 1.0, &dst, half / 4)
            .unwrap()
    });
    for s in sources {
        b.free(s);
    }
    b.free(dst);
    gbs
}

fn main() {
    let Some(mut b) = common::vulkan("gemv") else {
        return;
    };
    // As `vkllm bench`: 1 GiB buffers, or what one binding may cover.
    let copy = backend_copy_gbs(b.as_mut(), 1 << 30, DEVICE_COPIES).unwrap();
    println!("{}: copy {copy:.0} GB/s", b.name());
    let default_shapes = [
        (4096usize, 4096usize),
        (14336, 4096),
        (4096, 14336),
        (8192, 2048),
        (2048, 2048),
        (11264, 2048),
        (2048, 5632),
        (2048, 8192),
        (1024, 4096),
        (512, 2048),
    ];
    let dtypes = [
        DType::Q4K,
        DType::Q6K,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::F16,
        DType::TQ1_0,
        DType::TQ2_0,
    ];
    println!(
        "{:<8} {:>12} {:>9} {:>9} {:>9} {:>9}  (GB/s of weights; copy {copy:.0}; stream: scale moving as many bytes per dispatch)",
        "dtype", "rows x cols", "fresh", "replay", "gpu", "stream"
    );
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    // Arguments name weight types (q4_k) and shapes (4096x14336, any size).
    let shape_arg = |o: &str| {
        let (r, c) = o.split_once('x')?;
        Some((r.parse::<usize>().ok()?, c.parse::<usize>().ok()?))
    };
    let named_shapes: Vec<(usize, usize)> = only.iter().filter_map(|o| shape_arg(o)).collect();
    let shapes = if named_shapes.is_empty() {
        default_shapes.to_vec()
    } else {
        named_shapes
    };
    let named_types: Vec<&String> = only.iter().filter(|o| shape_arg(o).is_none()).collect();
    let named = |name: &str| named_types.is_empty() || named_types.iter().any(|o| *o == name);
    for dtype in dtypes.into_iter().filter(|d| named(d.name())) {
        for &(rows, cols) in &shapes {
            let row_bytes = match dtype.row_bytes(cols) {
                Ok(n) => n,
                Err(e) => {
                    println!("{:<8} {rows}x{cols}: {e}", dtype.name());
                    continue;
                }
            };
            let Some(bytes) = rows.checked_mul(row_bytes).filter(|&b| b > 0) else {
                println!(
                    "{:<8} {rows}x{cols}: no bytes to stream, or too many",
                    dtype.name()
                );
                continue;
            };
            let mut row = vec![0u8; row_bytes];
            let copies = ROTATE_BYTES.div_ceil(bytes).clamp(1, 64);
            let mut ws = Vec::new();
            for c in 0..copies {
                quantize_row(dtype, &common::rand(cols, 1 + c as u64), &mut row).unwrap();
                ws.push(
                    b.upload_weight(dtype, rows, cols, &row.repeat(rows))
                        .unwrap(),
                );
            }
            let x = b.alloc(cols * 4).unwrap();
            b.upload(&x, 0, bytemuck::cast_slice(&common::rand(cols, 99)))
                .unwrap();
            let y = b.alloc(rows * 4).unwrap();
            let [fresh, replay, gpu] = [Mode::Fresh, Mode::Replay, Mode::Gpu]
                .map(|m| gemv_gbs(b.as_mut(), &ws, &x, &y, m));
            for w in ws {
                b.free_weight(w);
            }
            let stream = stream_gbs(b.as_mut(), bytes);
            println!(
                "{:<8} {:>12} {fresh:>9.0} {replay:>9.0} {gpu:>9.0} {stream:>9.0}",
                dtype.name(),
                format!("{rows}x{cols}")
            );
            b.free(x);
            b.free(y);
        }
    }
}
