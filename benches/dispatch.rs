//! What a decode step pays per dispatch, on the Vulkan device: a replayed
//! pass of `STEPS` tiny `add`s, each reading the last one's output (a
//! barrier between every two) or all independent (no barrier); then Q4_K
//! GEMVs with one input row and k = 4096 at growing row counts, each
//! dependent on the last, so a line through (weight bytes, µs) gives the
//! fixed cost of a dependent GEMV and the bandwidth it streams at.
//!
//! `cargo bench --bench dispatch` prints µs per step;
//! `VKLLM_BENCH_ROTATE_MB=0` runs the GEMVs on one copy of each weight, so
//! they read it from L2. It also timed two probes, since removed: a
//! grid-wide barrier inside one dispatch and GEMVs ordered by counts
//! instead of barriers; neither beat the dispatch boundary. The figures:
//! benches/README.md, dispatch, memory and the probes.

mod common;

use std::time::Instant;
use vkllm::backend::{Buffer, ComputeBackend};
use vkllm::quants::quantize_row;
use vkllm::vk::{Options, VulkanBackend};
use vkllm::DType;

const STEPS: usize = 256;
const PASSES: usize = 20;
/// Bytes of weights one GEMV shape rotates over: past any L2 cache.
const ROTATE_BYTES: usize = 256 << 20;

/// Best µs per op over `PASSES` replays of a pass of `ops` ops.
fn replayed_us<B: ComputeBackend + ?Sized>(b: &mut B, ops: usize, record: impl Fn(&mut B)) -> f64 {
    b.begin_replayable_pass(11).unwrap();
    record(b);
    b.end_pass().unwrap();
    // Untimed replays first: right after an upload short passes run slow
    // (benches/memory.rs).
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < common::SETTLE_SECS {
        b.replay(11, 1).unwrap();
    }
    let mut best = f64::INFINITY;
    for _ in 0..PASSES {
        let t = Instant::now();
        assert!(b.replay(11, 1).unwrap(), "the pass was not kept");
        best = best.min(t.elapsed().as_secs_f64());
    }
    best * 1e6 / ops as f64
}

fn f32s(b: &mut dyn ComputeBackend, n: usize) -> Buffer {
    let buf = b.alloc(n * 4).unwrap();
    b.upload(&buf, 0, bytemuck::cast_slice(&common::rand(n, 5)))
        .unwrap();
    buf
}

fn main() {
    let mut vb = match Options::from_env().and_then(|o| VulkanBackend::new(&o)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("dispatch bench: no Vulkan device ({e})");
            return;
        }
    };
    let b: &mut dyn ComputeBackend = &mut vb;
    println!("{}", b.name());
    let a = f32s(b, 64);
    let outs: Vec<Buffer> = (0..STEPS).map(|_| f32s(b, 64)).collect();
    let chain = replayed_us(b, STEPS, |b| {
        for _ in 0..STEPS {
            b.add(&a, &a, &a, 64).unwrap();
        }
    });
    let free = replayed_us(b, STEPS, |b| {
        for o in &outs {
            b.add(&a, &a, o, 64).unwrap();
        }
    });
    println!("add, dependent:   {chain:.2} us per dispatch");
    println!("add, independent: {free:.2} us per dispatch");

    let cols = 4096;
    let dtype = DType::Q4K;
    // VKLLM_BENCH_ROTATE_MB=0: one copy of each weight, read from L2.
    let rotate = common::rotate_bytes(ROTATE_BYTES);
    println!("q4_k GEMV, k = {cols}, each reading the last one's output:");
    println!("{:>8} {:>10} {:>9} {:>9}", "rows", "MB", "us", "GB/s");
    for rows in [256usize, 1024, 2048, 4096, 8192, 16384, 32768] {
        let mut row = vec![0u8; dtype.row_bytes(cols).unwrap()];
        let bytes = row.len() * rows;
        let copies = match rotate {
            0 => 1,
            r => r.div_ceil(bytes).clamp(2, 64),
        };
        let ws: Vec<_> = (0..copies)
            .map(|c| {
                quantize_row(dtype, &common::rand(cols, 1 + c as u64), &mut row).unwrap();
                b.upload_weight(dtype, rows, cols, &row.repeat(rows))
                    .unwrap()
            })
            .collect();
        let io = [f32s(b, rows.max(cols)), f32s(b, rows.max(cols))];
        let us = replayed_us(b, 64, |b| {
            for i in 0..64 {
                let w = &ws[i % ws.len()];
                b.matmul(w, None, &io[i % 2], &io[1 - i % 2], 1).unwrap();
            }
        });
        println!(
            "{rows:>8} {:>10.1} {us:>9.2} {:>9.0}",
            bytes as f64 / 1e6,
            bytes as f64 / us / 1e3
        );
        for w in ws {
            b.free_weight(w);
        }
        for buf in io {
            b.free(buf);
        }
    }
}
