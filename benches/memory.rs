//! Dispatch latency and streaming bandwidth against what a process has just
//! done with memory: loading a model allocates gigabytes of device memory
//! and moves as many through host memory. For each device footprint
//! (ballast in buffers of `VKLLM_BALLAST_MIB`, 1024 by default) it prints:
//! - an empty pass's wall time (submit + wait), and the wall time per
//!   dispatch of a chain of dependent one-element dispatches (each waits on
//!   the one before: the floor under any short kernel in a decode step),
//! - copy GB/s by the wall clock for a short pass (16 x 128 MiB) and a long
//!   one (128 x 128 MiB, where per-pass costs fade),
//! - the short pass by the GPU's timestamps, as a transfer and as a compute
//!   kernel streaming the same bytes,
//!
//! and a last line after the ballast is freed. `cargo bench --bench memory`;
//! `VKLLM_BALLAST_STEPS` (GiB, comma-separated, default 0,4,8,16) sets the
//! footprints; `VKLLM_BALLAST_FILL` fills the ballast with random bytes
//! through the staging upload (`upload`, the default, as a model loads), or
//! leaves the zeros the backend fills new buffers with (`zeros`), or leaves
//! those and writes as many bytes of fresh host memory (`host`).
//!
//! Short passes run slow right after `upload` or `host`, not `zeros`: the
//! slowdown follows fresh host memory, not the device footprint, and passes
//! within a second, so a copy probe timed just after a model loads must be
//! long (bench/bandwidth.rs DEVICE_COPIES; figures in benches/README.md,
//! dispatch, memory and the probes).

mod common;

use std::time::Instant;
use vkllm::backend::{Buffer, ComputeBackend};
use vkllm::bench::bandwidth::backend_copy_gbs;

/// Buffers past any L2 cache, within every device's storage-buffer range
/// (lavapipe's is 128 MiB).
const BUF: usize = 128 << 20;

/// Best wall µs, over several passes, of a pass of `ops` dependent
/// one-element scales (1: an empty pass's submit and wait).
fn pass_us(b: &mut dyn ComputeBackend, tiny: &Buffer, ops: usize) -> f64 {
    let mut best = f64::INFINITY;
    for run in 0..8 {
        let t = Instant::now();
        b.begin_pass().unwrap();
        for _ in 0..ops {
            b.scale(tiny, 1.0, tiny, 1).unwrap();
        }
        b.end_pass().unwrap();
        if run > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    best * 1e6
}

/// GB/s (read + written) of `copies` [`BUF`] copies between `x` and `y`,
/// by the GPU's timestamps; `stream` uses the scale kernel instead.
fn gpu_gbs(b: &mut dyn ComputeBackend, x: &Buffer, y: &Buffer, copies: usize, stream: bool) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let secs = common::gpu_pass_seconds(b, |b| {
            for i in 0..copies {
                let (s, d) = if i % 2 == 0 { (x, y) } else { (y, x) };
                if stream {
                    b.scale(s, 1.0, d, BUF / 4).unwrap();
                } else {
                    b.copy(s, 0, d, 0, BUF).unwrap();
                }
            }
        });
        best = best.min(secs);
    }
    2.0 * (BUF * copies) as f64 / best / 1e9
}

/// One line of the table, at the footprint `label`.
fn row(b: &mut dyn ComputeBackend, label: &str, tiny: &Buffer, x: &Buffer, y: &Buffer) {
    let empty = pass_us(b, tiny, 1);
    let chain = pass_us(b, tiny, 256) / 256.0;
    let short = backend_copy_gbs(b, BUF, 16).unwrap();
    let long = backend_copy_gbs(b, BUF, 128).unwrap();
    let gpu = gpu_gbs(b, x, y, 16, false);
    let stream = gpu_gbs(b, x, y, 16, true);
    println!(
        "{label:>8} {empty:>10.0} {chain:>10.2} {short:>10.0} {long:>10.0} {gpu:>10.0} {stream:>12.0}"
    );
}

fn main() {
    let Some(mut b) = common::vulkan("memory") else {
        return;
    };
    let env = |k: &str| std::env::var(k).ok();
    let steps: Vec<usize> = env("VKLLM_BALLAST_STEPS")
        .unwrap_or_else(|| "0,4,8,16".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let chunk = env("VKLLM_BALLAST_MIB")
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(1024)
        .max(1)
        << 20;
    let fill = env("VKLLM_BALLAST_FILL").unwrap_or_else(|| "upload".into());
    let tiny = b.alloc(4).unwrap();
    let x = b.alloc(BUF).unwrap();
    let y = b.alloc(BUF).unwrap();
    b.upload(&x, 0, &vec![1u8; BUF]).unwrap();
    println!(
        "{}: ballast in {} MiB buffers, filled: {fill}",
        b.name(),
        chunk >> 20
    );
    println!(
        "{:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "GiB", "empty µs", "chain µs", "wall 16x", "wall 128x", "gpu 16x", "gpu stream"
    );
    let mut ballast = Vec::new();
    for gib in steps {
        while ballast.len() * chunk < gib << 30 {
            let buf = b.alloc(chunk).unwrap();
            match fill.as_str() {
                "zeros" => {}
                "host" => {
                    std::hint::black_box(vec![1u8; chunk]);
                }
                _ => {
                    let r = common::rand(chunk / 4, ballast.len() as u64 + 7);
                    b.upload(&buf, 0, bytemuck::cast_slice(&r)).unwrap();
                }
            }
            ballast.push(buf);
        }
        let label = format!("{}", (ballast.len() * chunk) >> 30);
        row(b.as_mut(), &label, &tiny, &x, &y);
    }
    for buf in ballast {
        b.free(buf);
    }
    row(b.as_mut(), "freed", &tiny, &x, &y);
    for buf in [tiny, x, y] {
        b.free(buf);
    }
}
