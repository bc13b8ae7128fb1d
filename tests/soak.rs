//! Long runs (ignored by default; each takes minutes to hours):
//!
//! - `soak_cpu` / `soak_vulkan`: `VKLLM_SOAK_TOKENS` (default 100,000)
//!   generated tokens through repeated prompts, resets, context refills and
//!   rollbacks in a 256-position context, with the process's resident memory
//!   and the backend's device memory sampled: flat after warm-up.
//! - `model_loaded_and_dropped_100_times_*`: a model created, run and
//!   dropped `VKLLM_SOAK_MODELS` (default 100) times: host memory,
//!   descriptors, mappings flat.
//!
//! `VKLLM_VALIDATE=1 cargo test --release --test soak -- --ignored --nocapture`
//! prints the samples.

mod common;

use common::process::{assert_flat, process, Process};
use vkllm::model::{LoadOptions, Model, Want};
use vkllm::ComputeBackend;

fn env_count(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const CONTEXT: usize = 256;

fn load(be: Box<dyn ComputeBackend>) -> Model {
    let opts = LoadOptions {
        context: Some(CONTEXT),
        ..LoadOptions::default()
    };
    Model::load(be, &common::smollm2(), &opts, &mut |_, _| {}).unwrap()
}

/// Prompt `i`: 5 to 40 ids spread over SmolLM2's vocabulary.
fn prompt(i: usize) -> Vec<u32> {
    (0..5 + (i * 7) % 36)
        .map(|j| ((i * 7919 + j * 104_729) % 49_000 + 100) as u32)
        .collect()
}

struct Sample {
    tokens: usize,
    process: Process,
    device_bytes: Option<u64>,
    device_buffers: Option<usize>,
}

fn sample(m: &mut Model, tokens: usize) -> Sample {
    let dm = m.backend().device_memory();
    Sample {
        tokens,
        process: process(),
        device_bytes: dm.map(|d| d.reserved_bytes),
        device_buffers: dm.map(|d| d.allocations),
    }
}

/// Generates `total` tokens in rounds: a fresh prompt after a reset, or the
/// next prompt appended to the cache; greedy steps on the device and single
/// steps through the host's argmax; a full context refilled from its last
/// 32 tokens, and now and then a rollback of the cache by half.
fn soak(name: &str, mut m: Model) {
    let total = env_count("VKLLM_SOAK_TOKENS", 100_000);
    // About 20 samples, at least 100 tokens apart.
    let every = (total / 20).max(100);
    let mut samples = vec![sample(&mut m, 0)];
    let mut generated = 0;
    let mut history: Vec<u32> = Vec::new();
    let started = std::time::Instant::now();
    let mut round = 0;
    while generated < total {
        let p = prompt(round);
        if round % 3 == 0 || m.n_past() + p.len() + 48 > CONTEXT {
            // Reset, or refill a full context from the recent tokens.
            m.reset();
            let keep = history.len().saturating_sub(32);
            let mut refill = history.split_off(keep);
            refill.extend(&p);
            history = refill;
        } else {
            history.extend(&p);
        }
        if round % 7 == 6 && m.n_past() > 8 {
            m.set_n_past(m.n_past() / 2).unwrap();
            history.truncate(m.n_past());
        }
        let fed = if m.n_past() == 0 { history.clone() } else { p };
        let first = m.next_token(&fed).unwrap();
        let steps = m.decode_greedy(first, 32).unwrap();
        history.push(first);
        history.extend(&steps[..steps.len() - 1]);
        let mut last = *steps.last().unwrap();
        for _ in 0..8 {
            let next = match m.forward(&[last], Want::Argmax).unwrap() {
                vkllm::model::Output::Token(t) => t,
                other => panic!("argmax gave {other:?}"),
            };
            history.push(last);
            last = next;
        }
        generated += 1 + steps.len() + 8;
        round += 1;
        if samples.last().unwrap().tokens + every <= generated || generated >= total {
            let s = sample(&mut m, generated);
            // Printed as it goes: a long run shows its progress.
            let device = s
                .device_bytes
                .zip(s.device_buffers)
                .map_or("-".into(), |(b, n)| {
                    format!("{:.1} MiB in {n} buffers", b as f64 / (1 << 20) as f64)
                });
            eprintln!(
                "{name}: {:>7} tokens {:>6.0} s  rss {:>6.1} MiB  {} fds  {} maps  device {device}",
                s.tokens,
                started.elapsed().as_secs_f64(),
                s.process.rss_kb as f64 / 1024.0,
                s.process.fds,
                s.process.maps,
            );
            samples.push(s);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "{name}: {generated} tokens in {round} rounds, {secs:.0} s ({:.1} tokens/s)",
        generated as f64 / secs
    );
    // Warm-up: the first tenth of the run (kernels, scratch, caches grow).
    let warm = samples
        .iter()
        .find(|s| s.tokens >= total / 10)
        .expect("samples after warm-up");
    let end = samples.last().unwrap();
    assert_flat(name, warm.process, end.process, 16);
    for s in samples.iter().filter(|s| s.tokens >= warm.tokens) {
        assert_eq!(
            s.device_bytes, warm.device_bytes,
            "{name}: device memory moved"
        );
        assert_eq!(
            s.device_buffers, warm.device_buffers,
            "{name}: device buffers"
        );
    }
}

#[test]
#[ignore = "long: run with --ignored (see the file's comment)"]
fn soak_cpu() {
    common::hold_vulkan_lock();
    soak("soak cpu", load(common::cpu()));
}

#[test]
#[ignore = "long: run with --ignored (see the file's comment)"]
fn soak_vulkan() {
    let Some(be) = common::vulkan() else {
        return;
    };
    soak("soak vulkan", load(be));
}

fn create_and_drop(name: &str, open: impl Fn() -> Box<dyn ComputeBackend>) {
    let n = env_count("VKLLM_SOAK_MODELS", 100);
    let started = std::time::Instant::now();
    let mut warm = None;
    for i in 0..n {
        let mut m = load(open());
        assert!(m.next_token(&prompt(i)).unwrap() < 49_152);
        drop(m);
        if i + 1 == n.div_ceil(10) {
            warm = Some(process());
        }
    }
    eprintln!(
        "{name}: {n} models in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    assert_flat(name, warm.expect("warm-up"), process(), 24);
}

#[test]
#[ignore = "long: run with --ignored (see the file's comment)"]
fn model_loaded_and_dropped_100_times_cpu() {
    common::hold_vulkan_lock();
    create_and_drop("models on cpu", common::cpu);
}

#[test]
#[ignore = "long: run with --ignored (see the file's comment)"]
fn model_loaded_and_dropped_100_times_vulkan() {
    if common::vulkan().is_none() {
        return;
    }
    create_and_drop("models on vulkan", || common::vulkan().unwrap());
}
