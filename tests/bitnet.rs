//! BitNet b1.58 (scripts/make_tiny_bitnet.py): the tiny random
//! `BitNetForCausalLM` in the packed 2-bit form of the released checkpoints
//! against transformers with its own quantization on (ternary weights,
//! activations rounded per token to int8), on every backend; the float
//! checkpoint presents the same ternary weights; synthetic TQ1_0 / TQ2_0
//! files agree and generate.

mod common;

use common::{argmax, tiny_reference, TinyRef};

use serde_json::Value;
use std::path::{Path, PathBuf};
use vkllm::model::{LoadOptions, Output, Want};
use vkllm::DType;

/// Every logit within this of transformers'. The model rounds activations
/// to int8, so an engine's float rounding (~1e-6) could move a value across
/// a rounding boundary and a logit by ~1e-3; the script picked weights with
/// every rounded value at least 4e-5 of a level from one (and every
/// ternarized weight 1e-6 of the scale from one), so none moves here.
const TOL: f32 = 1e-4;

fn tiny(name: &str) -> PathBuf {
    common::reference_dir().join("tiny").join(name)
}

/// Max |logit - reference| over the prompt, after checking the greedy tokens.
fn check(what: &str, path: &Path, r: &TinyRef, be: Box<dyn vkllm::ComputeBackend>) -> f32 {
    let opts = LoadOptions {
        kv_cache: Some(DType::F32),
        ..LoadOptions::default()
    };
    let mut model = vkllm::open::load(vec![be], path, &opts, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .model;
    let Output::Logits(logits) = model.forward(&r.prompt, Want::AllLogits).unwrap() else {
        panic!("no logits")
    };
    let err = common::max_abs_diff(&logits, &r.logits);
    assert!(err < TOL, "{what}: max logit error {err}");
    let vocab = model.config().vocab;
    let mut tokens = vec![argmax(&logits[logits.len() - vocab..])];
    while tokens.len() < r.greedy.len() {
        tokens.push(model.next_token(&tokens[tokens.len() - 1..]).unwrap());
    }
    assert_eq!(tokens, r.greedy, "{what}: greedy_16");
    err
}

/// The CPU, and Vulkan with an f32 cache where there is a device.
fn backends() -> Vec<(&'static str, Box<dyn vkllm::ComputeBackend>)> {
    let mut v = vec![("cpu", common::cpu())];
    if let Some(vk) = common::vulkan_exact() {
        v.push(("vulkan", vk));
    }
    v
}

/// The packed checkpoint (the float one, `bitnet`, is one of
/// `common::TINY_ARCHS`: tests/tiny.rs checks it from its directory and
/// through `vkllm convert`).
#[test]
fn tiny_bitnet_packed_matches_transformers() {
    let r = tiny_reference("bitnet_packed");
    for (backend, be) in backends() {
        let what = format!("bitnet_packed on {backend}");
        let err = check(&what, &tiny("bitnet_packed"), &r, be);
        println!("{what:28} max|Δlogit| = {err:.2e}");
    }
}

/// The packed checkpoint holds the float one's weights ternarized: both
/// present the same ternary values and scales.
#[test]
fn packed_and_float_checkpoints_present_the_same_ternary_weights() {
    use vkllm::model::source::TensorSource;
    let float = vkllm::model::hf::HfCheckpoint::open(&tiny("bitnet")).unwrap();
    let packed = vkllm::model::hf::HfCheckpoint::open(&tiny("bitnet_packed")).unwrap();
    assert_eq!(float.names(), packed.names());
    for name in float.names() {
        let a = float.tensor(&name).unwrap().unwrap();
        let b = packed.tensor(&name).unwrap().unwrap();
        assert_eq!((a.rows, a.cols), (b.rows, b.cols), "{name}");
        let (a, b) = (a.to_f32(&name).unwrap(), b.to_f32(&name).unwrap());
        if name.ends_with(".scale") {
            let rel = (a[0] - b[0]).abs() / a[0].abs();
            assert!(rel < 1e-6, "{name}: {} vs {}", a[0], b[0]);
        } else {
            assert_eq!(a, b, "{name}");
        }
    }
}

/// `vkllm synth --shape tiny-bitnet` (the 2B model's tensor set in small):
/// its TQ1_0 and TQ2_0 files hold the same ternary values (both formats
/// round each block to its largest magnitude), so on one backend they give
/// the same logits (1e-5) and greedy tokens; generation runs on every
/// backend, and the backends agree within 1e-2 (random weights, not chosen
/// clear of int8 rounding ties as the reference model's were: a value
/// rounded to the other level moves logits by ~1e-3; measured 2e-5 on
/// lavapipe).
#[test]
fn synth_bitnet_tq1_0_and_tq2_0_agree_and_generate() {
    use vkllm::bench::synth::{self, Quant};
    let dir = tempfile::tempdir().unwrap();
    let shape = synth::shape("tiny-bitnet").unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 1024).collect();
    let files: Vec<_> = [Quant::TQ1_0, Quant::TQ2_0]
        .into_iter()
        .map(|quant| {
            let path = dir
                .path()
                .join(format!("tiny-bitnet-{}.gguf", quant.name()));
            synth::write(shape, quant, &path, 3, None, &mut |_, _| {}).unwrap();
            (quant.name(), path)
        })
        .collect();
    let mut cpu: Option<Vec<f32>> = None;
    for backend in ["cpu", "vulkan"] {
        let mut runs = Vec::new();
        for (quant, path) in &files {
            let be = match backend {
                // f32 activations on both: the integer-dot kernels' own
                // rounding is tests/ops' business.
                "cpu" => Box::new(
                    vkllm::cpu::CpuBackend::new(None)
                        .with_activations(vkllm::cpu::ActivationPrecision::F32),
                ),
                _ => match common::vulkan_exact() {
                    Some(b) => b,
                    None => continue,
                },
            };
            let what = format!("tiny-bitnet {quant} on {backend}");
            let opts = LoadOptions {
                kv_cache: Some(DType::F32),
                ..LoadOptions::default()
            };
            let mut m = common::load_model(be, path, &opts);
            assert!(m.config().round_acts && m.config().sub_norms, "{what}");
            let logits = m.logits(&prompt).unwrap();
            assert!(logits.iter().all(|x| x.is_finite()), "{what}");
            let tokens = m.decode_greedy(argmax(&logits), 8).unwrap();
            runs.push((what, logits, tokens));
        }
        let [(w1, l1, t1), (w2, l2, t2)] = &runs[..] else {
            continue;
        };
        let err = common::max_abs_diff(l1, l2);
        assert!(err < 1e-5, "{w2} against {w1}: max logit difference {err}");
        assert_eq!(t1, t2, "{w2} against {w1}: greedy tokens");
        match &cpu {
            None => cpu = Some(l1.clone()),
            Some(c) => {
                let err = common::max_abs_diff(l1, c);
                println!("{w1} against the CPU: max|Δlogit| = {err:.2e}");
                assert!(
                    err < 1e-2,
                    "{w1} against the CPU: max logit difference {err}"
                );
            }
        }
    }
}

/// A BitNet directory (transformers' online layout: float weights) of one
/// layer, hidden 256 so rows are whole TQ blocks, in a temporary directory.
fn wide_bitnet_dir() -> tempfile::TempDir {
    let (e, ff, vocab) = (256usize, 512usize, 300usize);
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({
        "architectures": ["BitNetForCausalLM"],
        "model_type": "bitnet",
        "hidden_size": e,
        "intermediate_size": ff,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": vocab,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "hidden_act": "relu2",
        "tie_word_embeddings": true,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "quantization_config": {
            "quant_method": "bitnet",
            "linear_class": "autobitlinear",
            "quantization_mode": "online"
        }
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let l = "model.layers.0.";
    let tensors: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![vocab, e]),
        ("model.norm.weight".into(), vec![e]),
        (format!("{l}input_layernorm.weight"), vec![e]),
        (format!("{l}post_attention_layernorm.weight"), vec![e]),
        (format!("{l}self_attn.q_proj.weight"), vec![e, e]),
        (format!("{l}self_attn.k_proj.weight"), vec![128, e]),
        (format!("{l}self_attn.v_proj.weight"), vec![128, e]),
        (format!("{l}self_attn.o_proj.weight"), vec![e, e]),
        (format!("{l}self_attn.attn_sub_norm.weight"), vec![e]),
        (format!("{l}mlp.gate_proj.weight"), vec![ff, e]),
        (format!("{l}mlp.up_proj.weight"), vec![ff, e]),
        (format!("{l}mlp.down_proj.weight"), vec![e, ff]),
        (format!("{l}mlp.ffn_sub_norm.weight"), vec![ff]),
    ];
    // safetensors: an 8-byte header length, the JSON header, the data.
    let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
    for (i, (name, shape)) in tensors.iter().enumerate() {
        let n: usize = shape.iter().product();
        let u = vkllm::random::uniform_f32(n, 100 + i as u64);
        let norm = shape.len() == 1;
        let v: Vec<f32> = u
            .iter()
            .map(|x| if norm { 1.0 + 0.1 * x } else { 0.1 * x })
            .collect();
        let start = data.len();
        data.extend_from_slice(bytemuck::cast_slice(&v));
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(dir.path().join("model.safetensors"), file).unwrap();
    dir
}

/// `vkllm convert --quantize tq1_0 / tq2_0` stores BitNet's projections
/// as their exact ternary values (block scale 1) with their `.scale`, and
/// leaves the embeddings as they are: the files give the directory's
/// logits, and so does the directory quantized at load. (llama.cpp,
/// cyllama 0.7.0, loads such files: TQ1_0 and TQ2_0 give it the same
/// logits, 0.13 from its f32 file's through its 8-bit activations.)
#[test]
fn convert_to_ternary_types_is_exact() {
    use vkllm::model::gguf::GgufFile;
    let dir = wide_bitnet_dir();
    let prompt: Vec<u32> = (0..10).map(|i| (i * 29 + 3) % 300).collect();
    let logits_with = |path: &Path, quantize: Option<DType>| {
        let opts = LoadOptions {
            kv_cache: Some(DType::F32),
            weights: vkllm::model::weights::WeightOptions { quantize },
            ..LoadOptions::default()
        };
        // f32 activations: the integer-dot prefill's 8-bit activations
        // move these logits by ~0.03, which is the kernels' business
        // (tests/ops), not the conversion's.
        let exact = vkllm::cpu::CpuBackend::new(None)
            .with_activations(vkllm::cpu::ActivationPrecision::F32);
        common::load_model(Box::new(exact), path, &opts)
            .logits(&prompt)
            .unwrap()
    };
    let logits = |path: &Path| logits_with(path, None);
    let want = logits(dir.path());
    for q in [DType::TQ1_0, DType::TQ2_0] {
        let path = dir.path().join(format!("wide-{q}.gguf"));
        vkllm::model::convert::hf_to_gguf(dir.path(), &path, Some(q)).unwrap();
        let g = GgufFile::open(&path).unwrap();
        let dtype = |n: &str| g.tensor(n).unwrap_or_else(|| panic!("{q}: no {n}")).dtype;
        for p in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            assert_eq!(dtype(&format!("blk.0.{p}.weight")), q, "{p}");
            assert_eq!(dtype(&format!("blk.0.{p}.scale")), DType::F32, "{p}");
        }
        assert_eq!(dtype("token_embd.weight"), DType::F32);
        let err = common::max_abs_diff(&logits(&path), &want);
        assert!(
            err < 1e-5,
            "{q}: max logit difference {err} from the directory"
        );
        // Load-time quantization (`--quantize`) follows the same rule.
        let got = logits_with(dir.path(), Some(q));
        let err = common::max_abs_diff(&got, &want);
        assert!(
            err < 1e-5,
            "{q} at load: max logit difference {err} from the directory"
        );
    }
}

/// A copy of a tiny BitNet directory with `edit` applied to its config text.
fn edited(name: &str, edit: impl FnOnce(&mut String)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut config = std::fs::read_to_string(tiny(name).join("config.json")).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    std::fs::copy(
        tiny(name).join("model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    dir
}

fn load_err(path: &Path) -> String {
    match vkllm::open::load(
        vec![common::cpu()],
        path,
        &LoadOptions::default(),
        &mut |_, _| {},
    ) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

/// Checkpoints whose quantization config and weights disagree, or that
/// name a layout transformers does not have, fail with a sentence naming
/// the problem, never a panic.
#[test]
fn mismatched_bitnet_layouts_are_refused() {
    // Packed weights under a config that says float weights (online).
    let d = edited("bitnet_packed", |c| {
        *c = c
            .replace("\"bitlinear\"", "\"autobitlinear\"")
            .replace("\"offline\"", "\"online\"")
    });
    let e = load_err(d.path());
    assert!(e.contains("blk.0.attn_k.weight") && e.contains("U8"), "{e}");
    // Float weights under a config that says packed ones.
    let d = edited("bitnet", |c| {
        *c = c
            .replace("\"autobitlinear\"", "\"bitlinear\"")
            .replace("\"online\"", "\"offline\"")
    });
    let e = load_err(d.path());
    assert!(e.contains("F32") && e.contains("weight_scale"), "{e}");
    // Another quantization method, an unknown class, BitLinear's own norm.
    let d = edited("bitnet", |c| {
        *c = c.replace("\"quant_method\": \"bitnet\"", "\"quant_method\": \"gptq\"")
    });
    assert!(load_err(d.path()).contains("gptq"));
    let d = edited("bitnet", |c| {
        *c = c.replace("\"autobitlinear\"", "\"fancylinear\"")
    });
    assert!(load_err(d.path()).contains("fancylinear"));
    let d = edited("bitnet", |c| {
        *c = c.replace(
            "\"quant_method\": \"bitnet\"",
            "\"quant_method\": \"bitnet\", \"use_rms_norm\": true",
        )
    });
    assert!(load_err(d.path()).contains("use_rms_norm"));
    // Without a quantization config the directory runs as float linears,
    // as transformers runs it: other logits, no error.
    let d = edited("bitnet", |c| {
        let mut v: Value = serde_json::from_str(c).unwrap();
        v.as_object_mut().unwrap().remove("quantization_config");
        *c = v.to_string();
    });
    let mut m = common::load_model(common::cpu(), d.path(), &LoadOptions::default());
    assert!(!m.config().round_acts);
    let r = tiny_reference("bitnet");
    let logits = m.logits(&r.prompt).unwrap();
    let last = &r.logits[r.logits.len() - logits.len()..];
    assert!(common::max_abs_diff(&logits, last) > 1e-2);
}
