//! Models on several threads: the types say what may cross threads, and
//! models used from separate threads at the same time give what each gives
//! alone.

mod common;

use std::sync::Barrier;
use vkllm::cpu::CpuBackend;
use vkllm::model::gguf::GgufFile;
use vkllm::model::tokenizer::Tokenizer;
use vkllm::model::{LoadOptions, Model};
use vkllm::vk::VulkanBackend;
use vkllm::ComputeBackend;

fn is_send<T: Send>() {}
fn is_sync<T: Sync>() {}

#[test]
fn thread_safety_is_in_the_types() {
    // A model and its backend move between threads; it is used through
    // `&mut`, so it need not be `Sync`.
    is_send::<Model>();
    is_send::<Box<dyn ComputeBackend>>();
    is_send::<CpuBackend>();
    is_send::<VulkanBackend>();
    // Read-only after loading: shared between threads (the server's
    // request handlers share one tokenizer).
    is_send::<Tokenizer>();
    is_sync::<Tokenizer>();
    is_send::<GgufFile>();
    is_sync::<GgufFile>();
}

/// Greedy tokens of `model` after a fixed prompt, from an empty cache.
fn run(model: &mut Model) -> Vec<u32> {
    model.reset();
    let first = model.next_token(&[1, 409, 31, 253, 209, 30]).unwrap();
    let mut out = vec![first];
    out.extend(model.decode_greedy(first, 4).unwrap());
    out
}

#[test]
fn models_on_separate_threads_at_once_match_each_alone() {
    // The tiny Llama of the reference set (2 layers, 512 tokens): quick
    // enough for four models under the validation layer on lavapipe.
    let path = common::reference_dir().join("tiny").join("llama");
    let load = |be: Box<dyn ComputeBackend>| common::load_model(be, &path, &LoadOptions::default());
    // Two models on the CPU and, where there is a device, two on Vulkan: one
    // thread each. Backends are created (and later dropped) on this thread:
    // the validation layer's instance bookkeeping is not thread-safe (see
    // common::hold_vulkan_lock).
    let mut models = vec![load(common::cpu()), load(common::cpu())];
    for _ in 0..2 {
        if let Some(vk) = common::vulkan() {
            models.push(load(vk));
        }
    }
    let alone: Vec<Vec<u32>> = models.iter_mut().map(run).collect();
    let start = Barrier::new(models.len());
    let together: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = models
            .iter_mut()
            .map(|m| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    run(m)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((m, a), t) in models.iter().zip(&alone).zip(&together) {
        assert_eq!(a, t, "{}: alone vs. beside other threads", m.backend_name());
    }
    // Same-backend models agree with each other too.
    assert_eq!(alone[0], alone[1]);
}
