//! End-to-end criterion benches on the real SmolLM2-135M Q4_1 file: one
//! decode step (at a fixed cache depth) and one 512-token prefill, on every
//! backend this machine has. `vkllm bench` is the llama-bench-style report;
//! these track regressions with criterion's statistics.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::path::PathBuf;
use vkllm::model::{LoadOptions, Want};
use vkllm::open::{BackendChoice, CpuOptions};
use vkllm::ComputeBackend;

const PREFILL: usize = 512;
/// Cache depth of the measured decode step.
const DECODE_DEPTH: usize = 128;

fn backends() -> Vec<(&'static str, Box<dyn ComputeBackend>)> {
    let (cpu, _) = vkllm::open::open_backend(&BackendChoice::Cpu, CpuOptions::default())
        .expect("the CPU backend always opens");
    let mut v: Vec<(&'static str, Box<dyn ComputeBackend>)> = vec![("cpu", cpu)];
    match vkllm::open::open_backend(&BackendChoice::Vulkan, CpuOptions::default()) {
        Ok((be, _)) => v.push(("vulkan", be)),
        Err(e) => eprintln!("skipping Vulkan: {e}"),
    }
    v
}

fn e2e(c: &mut Criterion) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        eprintln!(
            "skipping e2e benches: {} is missing (scripts/fetch-model.sh fetches it)",
            path.display()
        );
        return;
    }
    let opts = LoadOptions {
        context: Some(PREFILL + 1),
        max_batch: Some(PREFILL),
        ..LoadOptions::default()
    };
    for (name, be) in backends() {
        let mut model = vkllm::open::load(vec![be], &path, &opts, &mut |_, _| {})
            .expect("load SmolLM2")
            .model;
        let vocab = model.config().vocab as u32;
        // Fixed pseudo-random prompt: the timing must not depend on the ids.
        let ids: Vec<u32> = (0..PREFILL as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % vocab)
            .collect();
        let mut g = c.benchmark_group(format!("smollm2-q4_1/{name}"));
        g.sample_size(10);
        g.throughput(Throughput::Elements(1));
        let mut token = 1;
        g.bench_function("decode", |b| {
            b.iter(|| {
                model
                    .set_n_past(DECODE_DEPTH)
                    .expect("depth within context");
                token = model.next_token(&[token]).expect("decode step");
            })
        });
        g.throughput(Throughput::Elements(PREFILL as u64));
        g.bench_function("prefill512", |b| {
            b.iter(|| {
                model.reset();
                model.forward(&ids, Want::Argmax).expect("prefill");
            })
        });
        g.finish();
    }
}

criterion_group!(benches, e2e);
criterion_main!(benches);
