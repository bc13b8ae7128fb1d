//! What a decode step pays per dispatch, on the Vulkan device. First the
//! question a persistent kernel hinges on: `STEPS` dependent rounds of a
//! tiny exchange between workgroups (glsl/grid_sync.comp), as a chain of
//! dispatches with a barrier between every two, or as one dispatch whose
//! rounds meet at a grid-wide barrier (an atomic arrival count and a spin;
//! skipped on CPU devices, which run workgroups one after another). Then a
//! replayed pass of `STEPS` tiny `add`s, each reading the last one's output (a
//! barrier between every two) or all independent (no barrier); then Q4_K
//! GEMVs with one input row and k = 4096 at growing row counts, each
//! dependent on the last, so a line through (weight bytes, µs) gives the
//! fixed cost of a dependent GEMV and the bandwidth it streams at.
//!
//! `cargo bench --bench dispatch` prints µs per step;
//! `VKLLM_BENCH_ROTATE_MB=0` runs the GEMVs on one copy of each weight, so
//! they read it from L2.
//!
//! A barrier inside the kernel costs about what a dependent dispatch does,
//! so a decode kernel that kept its workgroups resident and met at such
//! barriers would not run its steps faster; only work done while waiting
//! (loading the next step's weights) could pay. So the flow chain
//! (glsl/flow_gemv.comp) tries exactly that: dependent 4-bit GEMVs recorded
//! with no barrier, each workgroup loading its weights and then waiting on a
//! count of the step before. What it saved per step did not carry over to a
//! real decode pass. The figures: benches/README.md, dispatch, memory and
//! the probes.

mod common;

use std::time::Instant;
use vkllm::backend::{Buffer, ComputeBackend};
use vkllm::quants::quantize_row;
use vkllm::vk::{
    flow_gemv_flow_bytes, flow_gemv_weight_bytes, grid_sync_bytes, FlowOrder, Options,
    VulkanBackend,
};
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

/// A grid barrier inside one dispatch against a dispatch boundary and a
/// pipeline barrier, per dependent round, at grid sizes around our GEMVs'.
fn grid_sync(vb: &mut VulkanBackend) {
    // A CPU implementation runs a workgroup to its end before starting
    // others: every wait would run to the spin limit.
    if vb.device_info().kind == "CPU" {
        println!("grid sync: skipped on a CPU device");
        return;
    }
    println!("dependent rounds of {STEPS}: us per round");
    println!(
        "{:>8} {:>12} {:>12} {:>10}",
        "groups", "dispatches", "grid sync", "timeouts"
    );
    for groups in [66usize, 132, 264, 528, 1056] {
        let bytes = grid_sync_bytes(groups);
        let data = vb.alloc(bytes).unwrap();
        vb.upload(&data, 0, &vec![0u8; bytes]).unwrap();
        let chain = replayed_us(vb, STEPS, |b| {
            for i in 0..STEPS {
                b.grid_sync(&data, groups, 1, i, false).unwrap();
            }
        });
        let grid = replayed_us(vb, STEPS, |b| {
            b.grid_sync(&data, groups, STEPS, 0, true).unwrap();
        });
        let mut timeouts = [0u8; 4];
        vb.download(&data, 8, &mut timeouts).unwrap();
        println!(
            "{groups:>8} {chain:>12.2} {grid:>12.2} {:>10}",
            u32::from_le_bytes(timeouts)
        );
        vb.free(data);
    }
}

/// A chain of dependent GEMVs (glsl/flow_gemv.comp) whose dispatches meet at
/// pipeline barriers, against one whose dispatches start without a barrier,
/// load their weights and wait on a count of the step before, and one with
/// no ordering at all (the floor; wrong results).
fn flow_chain(vb: &mut VulkanBackend) {
    if vb.device_info().kind == "CPU" {
        println!("flow chain: skipped on a CPU device");
        return;
    }
    println!("dependent 4-bit GEMVs of {STEPS}, n x n: us per step");
    println!(
        "{:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "n", "MB", "barrier", "wait", "wait64", "wait2", "free", "timeouts"
    );
    for n in [1024usize, 2048, 4096] {
        let wb = flow_gemv_weight_bytes(n);
        let copies = common::rotate_bytes(ROTATE_BYTES)
            .div_ceil(wb)
            .clamp(1, STEPS);
        let w = vb.alloc(copies * wb).unwrap();
        let words: Vec<u32> = (0..copies * wb / 4)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7))
            .collect();
        vb.upload(&w, 0, bytemuck::cast_slice(&words)).unwrap();
        let v = f32s(vb, (STEPS + 1) * n);
        let fb = flow_gemv_flow_bytes(STEPS);
        let (flow, zeros) = (vb.alloc(fb).unwrap(), vb.alloc(fb).unwrap());
        vb.upload(&zeros, 0, &vec![0u8; fb]).unwrap();
        vb.upload(&flow, 0, &vec![0u8; fb]).unwrap();
        let (mut us, mut timed_out) = (Vec::new(), 0);
        for order in [
            FlowOrder::Barrier,
            FlowOrder::Wait { backoff: 0 },
            FlowOrder::Wait { backoff: 64 },
            FlowOrder::WaitPairs,
            FlowOrder::Free,
        ] {
            us.push(replayed_us(vb, STEPS, |b| {
                b.copy(&zeros, 0, &flow, 0, fb).unwrap();
                for i in 0..STEPS {
                    b.flow_gemv(&flow, &v, &w, i % copies, n, i, order).unwrap();
                }
            }));
            // The last replay's count of workgroups that gave up.
            let mut timeouts = [0u8; 4];
            vb.download(&flow, 0, &mut timeouts).unwrap();
            timed_out += u32::from_le_bytes(timeouts);
        }
        println!(
            "{n:>6} {:>6.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {timed_out:>8}",
            wb as f64 / 1e6,
            us[0],
            us[1],
            us[2],
            us[3],
            us[4],
        );
        for buf in [w, v, flow, zeros] {
            vb.free(buf);
        }
    }
}

fn f32s(b: &mut dyn ComputeBackend, n: usize) -> Buffer {
    let buf = b.alloc(n * 4).unwrap();
    b.upload(&buf, 0, bytemuck::cast_slice(&common::rand(n, 5)))
        .unwrap();
    buf
}

fn main() {
    let mut vb = match VulkanBackend::new(&Options::from_env()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("dispatch bench: no Vulkan device ({e})");
            return;
        }
    };
    grid_sync(&mut vb);
    flow_chain(&mut vb);
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
