//! Profiling: one timestamped device event per GPU dispatch and copy, or
//! per CPU op, a valid Chrome trace, the per-op summary, and `--profile` on
//! the CLI.

mod common;

use serde_json::Value;
use std::collections::HashMap;
use vkllm::backend::{Buffer, ComputeBackend, Weight};
use vkllm::dtype::DType;
use vkllm::model::{LoadOptions, Want};
use vkllm::profile::{summary, write_chrome_trace, ProfileEvent, Track};

/// Write `events` as a trace, read it back and return its complete events.
fn round_trip(events: &[ProfileEvent]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    write_chrome_trace(&path, events).unwrap();
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let all = trace["traceEvents"].as_array().expect("traceEvents array");
    let complete: Vec<Value> = all.iter().filter(|e| e["ph"] == "X").cloned().collect();
    for e in &complete {
        assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
        assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}");
        assert!(
            e["name"].is_string() && e["pid"].is_u64() && e["tid"].is_u64(),
            "{e}"
        );
    }
    complete
}

/// Values of the profiled passes' vectors.
const N: usize = 256;

/// Two inputs `x`, `w` and two outputs `y`, `z` of [`N`] values, and an
/// f32 `[N, N]` weight.
fn buffers(b: &mut dyn ComputeBackend) -> ([Buffer; 4], Weight) {
    let x = common::upload_f32(b, &common::rand_f32(N, 1));
    let w = common::upload_f32(b, &common::rand_f32(N, 2));
    let (y, z) = (b.alloc(4 * N).unwrap(), b.alloc(4 * N).unwrap());
    let weight = b
        .upload_weight(
            DType::F32,
            N,
            N,
            bytemuck::cast_slice(&common::rand_f32(N * N, 3)),
        )
        .unwrap();
    ([x, w, y, z], weight)
}

fn gpu_counts(trace: &[Value]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for e in trace.iter().filter(|e| e["tid"] == Track::Gpu.tid()) {
        *counts
            .entry(e["name"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    counts
}

/// A pass of known ops gives exactly one GPU event per dispatch and copy,
/// named by op, plus the host spans of the pass.
#[test]
fn profile_times_each_dispatch_and_copy_of_a_pass() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let n = N;
    let ([x, w, y, z], weight) = buffers(&mut b);

    // Off: nothing is recorded.
    b.begin_pass().unwrap();
    b.add(&x, &w, &y, n).unwrap();
    b.end_pass().unwrap();
    assert!(b.take_profile().is_empty());

    b.set_profiling(true).unwrap();
    for _ in 0..2 {
        b.begin_pass().unwrap();
        b.add(&x, &w, &y, n).unwrap();
        b.scale(&y, 0.5, &y, n).unwrap();
        b.rms_norm(&y, &w, &z, 1, n, 1e-5).unwrap();
        b.copy(&z, 0, &y, 0, 4 * n).unwrap();
        b.matmul(&weight, None, &y, &z, 1).unwrap();
        b.end_pass().unwrap();
    }
    let stats = b.stats();
    let events = b.take_profile();
    assert!(b.take_profile().is_empty(), "take_profile drains");
    let trace = round_trip(&events);
    let counts = gpu_counts(&trace);
    let gpu_total: usize = counts.values().sum();
    assert_eq!(
        gpu_total as u32,
        2 * (stats.dispatches + stats.copies),
        "{counts:?} vs {stats:?}"
    );
    for op in ["add", "scale", "rms_norm", "copy"] {
        assert_eq!(counts.get(op), Some(&2), "{op}: {counts:?}");
    }
    assert!(counts.get("matmul").is_some_and(|&c| c >= 2), "{counts:?}");
    let host: Vec<&str> = trace
        .iter()
        .filter(|e| e["tid"] == Track::Host.tid())
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(host, ["record", "submit+wait", "record", "submit+wait"]);
    // The second pass starts after the first on the one timeline.
    let gpu: Vec<&ProfileEvent> = events.iter().filter(|e| e.track == Track::Gpu).collect();
    let half = gpu.len() / 2;
    assert!(gpu[half].start_us >= gpu[0].start_us + gpu[0].dur_us);
    // Bytes: the copy reads and writes 4n bytes; matmul binds at least the weight.
    let copy = gpu.iter().find(|e| e.name == "copy").unwrap();
    assert_eq!(copy.bytes, 8 * n as u64);
    let mm = gpu.iter().find(|e| e.name == "matmul").unwrap();
    assert!(mm.bytes >= (4 * n * n) as u64);

    let table = summary(&events);
    for op in ["add", "scale", "rms_norm", "copy", "matmul"] {
        assert!(table.lines().any(|l| l.starts_with(op)), "{op}:\n{table}");
    }

    // Off again: later passes record nothing.
    b.set_profiling(false).unwrap();
    b.begin_pass().unwrap();
    b.add(&x, &w, &y, n).unwrap();
    b.end_pass().unwrap();
    assert!(b.take_profile().is_empty());
}

/// One forward of the tiny llama: its pass's GPU events match the
/// dispatches and copies the backend reports for it.
#[test]
fn profile_of_a_model_forward_matches_the_pass_stats() {
    let Some(be) = common::vulkan() else { return };
    let dir = common::reference_dir().join("tiny").join("llama");
    let mut model = common::load_model(be, &dir, &LoadOptions::default());
    model.set_profiling(true).unwrap();
    model.forward(&[1, 2, 3], Want::LastLogits).unwrap();
    let stats = model.last_pass_stats().unwrap();
    let expected = (stats.dispatches + stats.copies) as usize;
    let events = model.take_profile();
    let trace = round_trip(&events);
    let counts = gpu_counts(&trace);
    assert_eq!(counts.values().sum::<usize>(), expected, "{counts:?}");
    // The norms fold into the projections; rope and the KV append are one op.
    for op in ["embedding", "matmul", "attention", "rope_store"] {
        assert!(counts.contains_key(op), "{op}: {counts:?}");
    }
    let table = summary(&events);
    for op in counts.keys() {
        assert!(
            table.lines().any(|l| l.starts_with(op.as_str())),
            "{op}:\n{table}"
        );
    }
}

/// The CPU backend times each op of a pass: one device event per op, named
/// by it, in order, with the bytes of the buffers it binds; nothing while
/// off, and no switching inside a pass.
#[test]
fn cpu_profile_times_each_op() {
    let mut b = common::cpu();
    let n = N;
    let ([x, w, y, z], weight) = buffers(b.as_mut());
    let pass = |b: &mut dyn ComputeBackend| {
        b.begin_pass().unwrap();
        b.add(&x, &w, &y, n).unwrap();
        b.rms_norm(&y, &w, &z, 1, n, 1e-5).unwrap();
        b.copy(&z, 0, &y, 0, 4 * n).unwrap();
        b.matmul(&weight, None, &y, &z, 1).unwrap();
        b.end_pass().unwrap();
    };
    pass(b.as_mut());
    assert!(b.take_profile().is_empty());

    b.set_profiling(true).unwrap();
    pass(b.as_mut());
    b.begin_pass().unwrap();
    assert!(b.set_profiling(false).is_err(), "switched inside a pass");
    b.end_pass().unwrap();
    let events = b.take_profile();
    assert!(b.take_profile().is_empty(), "take_profile drains");
    let names: Vec<&str> = events.iter().map(|e| e.name).collect();
    assert_eq!(names, ["add", "rms_norm", "copy", "matmul"]);
    for (e, next) in events.iter().zip(&events[1..]) {
        assert_eq!(e.track, Track::Gpu);
        assert!(next.start_us >= e.start_us + e.dur_us, "{events:?}");
    }
    assert_eq!(events[2].bytes, 8 * n as u64, "copy: read and written");
    assert_eq!(
        events[3].bytes,
        (4 * n * n + 8 * n) as u64,
        "matmul: weight, x and y"
    );
    let table = summary(&events);
    for op in names {
        assert!(table.lines().any(|l| l.starts_with(op)), "{op}:\n{table}");
    }

    b.set_profiling(false).unwrap();
    pass(b.as_mut());
    assert!(b.take_profile().is_empty());
}

/// `vkllm generate --profile FILE` writes a trace with GPU and host events
/// and prints the summary.
#[test]
fn generate_profile_writes_a_chrome_trace() {
    if common::vulkan().is_none() {
        return;
    }
    let model = common::smollm2();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args(["generate", "--backend", "vulkan", "--temperature", "0"])
        .args(["-n", "2", "-p", "The capital of France is", "-m"])
        .arg(&model)
        .arg("--profile")
        .arg(&trace)
        .current_dir(common::root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("Device profile") && err.contains("% dev"),
        "{err}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == Track::Gpu.tid())
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"matmul") && names.contains(&"attention"),
        "{names:?}"
    );
    assert!(events
        .iter()
        .any(|e| e["ph"] == "X" && e["tid"] == Track::Host.tid()));
}
