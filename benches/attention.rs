//! Attention on the Vulkan device at model shapes, the way a forward pass
//! meets it: decode (one query row against a long f16 cache) and prefill
//! (512 query rows after `depth` cached positions), each layer reading a
//! cache of its own so nothing is served from L2. Prints µs per call and,
//! for decode, the KV bytes read per second (the ceiling is the device's
//! copy bandwidth: `cargo bench --bench gemv` prints it).
//!
//! Decode runs at the span a decode pass is planned for (unsplit at 512
//! positions) and, where that differs, over the whole cache's span (split).
//!
//! Calls are recorded once and replayed (as decode runs), timed by the wall
//! clock; consecutive calls write one output, so they run one after another
//! as the layers of a pass do. `cargo bench --bench attention [-- SHAPE...]`.

mod common;

use std::time::Instant;
use vkllm::backend::{AttentionParams, Buffer, ComputeBackend};
use vkllm::model::runner::decode_span;
use vkllm::DType;

/// Caches the calls rotate over (one per layer).
const LAYERS: usize = 8;
/// Calls per timed pass, and timed passes (after one untimed).
const PER_PASS: usize = 64;
const PASSES: usize = 5;
const CAPACITY: usize = 8192;
const PREFILL_ROWS: usize = 512;

/// (name, n_heads, n_kv_heads, head_dim) of the models `scripts/vs-llama-cpp.sh` runs.
const SHAPES: [(&str, usize, usize, usize); 4] = [
    ("smollm2-135m", 9, 3, 64),
    ("tinyllama-1.1b", 32, 4, 64),
    ("llama3.2-1b", 32, 8, 64),
    ("llama3.1-8b", 32, 8, 128),
];

/// Best seconds per call of `rows` query rows at `positions`.
fn seconds_per_call(
    b: &mut dyn ComputeBackend,
    caches: &[(Buffer, Buffer)],
    p: &AttentionParams,
    positions: &[u32],
) -> f64 {
    let q = b.alloc(p.rows * p.n_heads * p.head_dim * 4).unwrap();
    let qv = common::rand(p.rows * p.n_heads * p.head_dim, 5);
    b.upload(&q, 0, bytemuck::cast_slice(&qv)).unwrap();
    let pos = b.alloc(positions.len() * 4).unwrap();
    b.upload(&pos, 0, bytemuck::cast_slice(positions)).unwrap();
    let out = b.alloc(p.rows * p.n_heads * p.head_dim * 4).unwrap();
    let record = |b: &mut dyn ComputeBackend| {
        b.begin_replayable_pass(11).unwrap();
        for i in 0..PER_PASS {
            let (k, v) = &caches[i % caches.len()];
            b.attention(&q, k, v, &pos, &out, p).unwrap();
        }
        b.end_pass().unwrap();
    };
    record(b);
    // A pass that allocated scratch buffers is not kept (the runner records
    // it again, as here).
    if !b.replay(11, 1).unwrap() {
        record(b);
    }
    let mut best = f64::INFINITY;
    for pass in 0..=PASSES {
        let t = Instant::now();
        assert!(b.replay(11, 1).unwrap(), "the pass was not kept");
        if pass > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    for buf in [q, pos, out] {
        b.free(buf);
    }
    best / PER_PASS as f64
}

fn main() {
    let Some(mut b) = common::vulkan("attention") else {
        return;
    };
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    println!(
        "{:<15} {:>16} {:>10} {:>9}   ({}, f16 KV cache of {CAPACITY})",
        "shape",
        "test",
        "us/call",
        "KV GB/s",
        b.name()
    );
    for (name, n_heads, n_kv_heads, head_dim) in SHAPES {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        // Random f16 bits of values in [-1, 1]: the kernels' speed does
        // not depend on them.
        let halves: Vec<u16> = common::rand(CAPACITY * n_kv_heads * head_dim, 3)
            .iter()
            .map(|v| half::f16::from_f32(*v).to_bits())
            .collect();
        let caches: Vec<(Buffer, Buffer)> = (0..LAYERS)
            .map(|_| {
                let k = b.alloc(halves.len() * 2).unwrap();
                let v = b.alloc(halves.len() * 2).unwrap();
                b.upload(&k, 0, bytemuck::cast_slice(&halves)).unwrap();
                b.upload(&v, 0, bytemuck::cast_slice(&halves)).unwrap();
                (k, v)
            })
            .collect();
        let params = |rows, span| AttentionParams {
            rows,
            n_heads,
            n_kv_heads,
            head_dim,
            capacity: CAPACITY,
            span,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: 0,
            kv_dtype: DType::F16,
            pages: None,
            next: None,
            sinks: None,
        };
        for depth in [512usize, 4608] {
            // The span a decode pass is planned for (short ones go
            // unsplit), then, where it is shorter, the whole cache's.
            let planned = decode_span(depth + 1, CAPACITY);
            let mut spans = vec![(planned, "")];
            if planned < CAPACITY {
                spans.push((CAPACITY, " split"));
            }
            let kv_bytes = (depth + 1) * n_kv_heads * head_dim * 2 * 2;
            for (span, how) in spans {
                let s = seconds_per_call(b.as_mut(), &caches, &params(1, span), &[depth as u32]);
                println!(
                    "{name:<15} {:>16} {:>10.1} {:>9.0}",
                    format!("decode @{depth}{how}"),
                    s * 1e6,
                    kv_bytes as f64 / s / 1e9
                );
            }
        }
        for depth in [0usize, 4096] {
            let positions: Vec<u32> = (depth..depth + PREFILL_ROWS).map(|p| p as u32).collect();
            let s = seconds_per_call(
                b.as_mut(),
                &caches,
                &params(PREFILL_ROWS, CAPACITY),
                &positions,
            );
            println!(
                "{name:<15} {:>16} {:>10.1}",
                format!("pp{PREFILL_ROWS} @{depth}"),
                s * 1e6
            );
        }
        for (k, v) in caches {
            b.free(k);
            b.free(v);
        }
    }
}
