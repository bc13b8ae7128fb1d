//! Mixtures of experts through whole models: a synthetic Qwen3-MoE of the
//! real tensor types (Q4_K_M: Q4_K experts, Q6_K down projections in some
//! layers, an F32 router) prefilled and decoded on every backend, and the
//! backends against each other. Parity with transformers is in tests/tiny.rs
//! (the tiny qwen3moe, mixtral and gpt-oss models); llama.cpp on our
//! conversions of those, below.

mod common;

use vkllm::bench::synth::{self, Quant};
use vkllm::cpu::ActivationPrecision;
use vkllm::model::{LoadOptions, Output, Want};
use vkllm::DType;

fn synth_moe(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tiny-qwen3moe.gguf");
    let shape = synth::shape("tiny-qwen3moe").unwrap();
    synth::write(shape, Quant::Q4KM, &path, 3, None, &mut |_, _| {}).unwrap();
    path
}

/// Deterministic ids spread over the vocabulary.
fn ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect()
}

/// Backends whose matmuls keep activations in f32: rounding them (the
/// CPU's 16-bit integer activations, the integer-dot GEMV) can flip a
/// token's last expert where two router logits nearly tie (seen: one
/// position of 70 here, its logits 6% apart), which says nothing about the
/// kernels.
fn f32_backends() -> Vec<(String, Box<dyn vkllm::ComputeBackend>)> {
    let cpu = vkllm::cpu::CpuBackend::new(None).with_activations(ActivationPrecision::F32);
    let mut v: Vec<(String, Box<dyn vkllm::ComputeBackend>)> = vec![("cpu".into(), Box::new(cpu))];
    let vulkans = [
        common::vulkan_exact_backend(),
        common::vulkan_gpu_plans_backend(),
    ];
    for (i, b) in vulkans.into_iter().flatten().enumerate() {
        let mut b = b;
        b.set_gemv_q8(None).unwrap();
        v.push((format!("vulkan{i}"), Box::new(b)));
    }
    v
}

/// A prompt in one pass equals the same tokens one at a time (a GEMM of
/// grouped experts against a GEMV per chosen expert), on every backend with
/// an f32 cache; and every backend gives the CPU's logits.
#[test]
fn experts_prefill_equals_decode_and_backends_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let path = synth_moe(tmp.path());
    let opts = LoadOptions {
        kv_cache: Some(DType::F32),
        ..LoadOptions::default()
    };
    let mut cpu_logits: Option<Vec<f32>> = None;
    for (name, be) in f32_backends() {
        let mut model = common::load_model(be, &path, &opts);
        let vocab = model.config().vocab;
        let prompt = ids(70, vocab);
        let Output::Logits(all) = model.forward(&prompt, Want::AllLogits).unwrap() else {
            panic!("{name}: no logits");
        };
        model.reset();
        let mut one_by_one = Vec::new();
        for &t in &prompt {
            one_by_one.extend(model.logits(&[t]).unwrap());
        }
        let scale = all.iter().fold(0f32, |a, v| a.max(v.abs()));
        // Prefill and decode round activations differently (the CPU's
        // 16-bit integer activations, Vulkan's integer-dot GEMV): 1% of the
        // largest logit, far below what one wrong expert moves them.
        let err = common::max_abs_diff(&all, &one_by_one);
        assert!(
            err <= 1e-2 * scale,
            "{name}: prefill vs decode {err} (scale {scale})"
        );
        match &cpu_logits {
            None => cpu_logits = Some(all),
            Some(want) => {
                let err = common::max_abs_diff(&all, want);
                assert!(err <= 1e-4 * scale, "{name} vs cpu: {err} (scale {scale})");
            }
        }
    }
}

/// llama.cpp (cyllama 0.7.0, CPU) on the tiny MoE models as `vkllm
/// convert` writes them (tests/data/llamacpp_moe.json,
/// scripts/llamacpp-moe-fixture.py): its 8 largest logits at every prompt
/// position against ours on the same file, with f32 activations. Float
/// weights: within 1e-5 (llama.cpp keeps f32 activations for f32 weights;
/// both agree with transformers to ~5e-6). MXFP4 experts: llama.cpp rounds
/// the activations to 8 bits before them (its Q8_0 dot), so within 0.1, and
/// its argmax ours wherever its top two are 0.05 apart.
#[test]
fn tiny_moe_models_agree_with_llama_cpp() {
    let text =
        std::fs::read_to_string(common::root().join("tests/data/llamacpp_moe.json")).unwrap();
    let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (name, _) in common::TINY_MOE_ARCHS {
        let f = &fixture["models"][name];
        let ids: Vec<u32> = f["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(format!("{name}.gguf"));
        let dir = common::reference_dir().join("tiny").join(name);
        vkllm::model::convert::hf_to_gguf(&dir, &path, None).unwrap();
        let cpu = vkllm::cpu::CpuBackend::new(None).with_activations(ActivationPrecision::F32);
        let opts = LoadOptions {
            kv_cache: Some(DType::F32),
            ..LoadOptions::default()
        };
        let mut model = common::load_model(Box::new(cpu), &path, &opts);
        let vocab = model.config().vocab;
        let Output::Logits(ours) = model.forward(&ids, Want::AllLogits).unwrap() else {
            panic!("{name}: no logits");
        };
        let mxfp4 = name.ends_with("mxfp4");
        let tol = if mxfp4 { 0.1 } else { 1e-5 };
        let mut worst = 0f32;
        for (p, (top, vals)) in f["top_ids"]
            .as_array()
            .unwrap()
            .iter()
            .zip(f["top_logits"].as_array().unwrap())
            .enumerate()
        {
            let row = &ours[p * vocab..(p + 1) * vocab];
            let top: Vec<usize> = top
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let vals: Vec<f32> = vals
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            for (&i, &v) in top.iter().zip(&vals) {
                worst = worst.max((row[i] - v).abs());
            }
            let ours_best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            if !mxfp4 || vals[0] - vals[1] > 0.05 {
                assert_eq!(ours_best, top[0], "{name} position {p}: argmax");
            }
        }
        assert!(
            worst <= tol,
            "{name}: max |Δlogit| {worst} against llama.cpp (allowed {tol})"
        );
        eprintln!("{name}: max |Δlogit| against llama.cpp {worst:.2e}");
    }
}
