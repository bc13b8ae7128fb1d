//! Our GGUF files speak llama.cpp's dialect: every tensor name and metadata
//! key we write is in llama.cpp's tables (tests/data/llamacpp_names.json,
//! generated from the `gguf` 0.19.0 package by scripts/llamacpp-names.py), and
//! our loader takes every tensor of such a file by those names. A name that
//! drifts on either side fails here rather than when a user loads a file
//! llama.cpp's converter made (as `attn_post_norm` once did for Gemma 3).

mod common;

use serde_json::Value;
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use vkllm::model::gguf::GgufFile;
use vkllm::model::source::{RawTensor, TensorSource};
use vkllm::model::weights::{ModelWeights, WeightOptions};
use vkllm::model::ModelConfig;

struct Table {
    /// Per architecture: tensor base names (`blk.{bid}.attn_q`, no `.weight`).
    tensors: HashMap<String, HashSet<String>>,
    /// Key templates (`{arch}.attention.head_count`, `general.name`).
    keys: HashSet<String>,
}

fn table() -> Table {
    let path = common::root().join("tests/data/llamacpp_names.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let strings = |v: &Value| -> HashSet<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    Table {
        tensors: v["tensors"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(arch, names)| (arch.clone(), strings(names)))
            .collect(),
        keys: strings(&v["keys"]),
    }
}

/// Keys llama.cpp reads that gguf 0.19.0's table predates:
/// `{arch}.hidden_activation` (LLM_KV_HIDDEN_ACT; BitNet's activation).
const NEWER_KEYS: [&str; 1] = ["{arch}.hidden_activation"];

/// `blk.3.attn_q.weight` → `blk.{bid}.attn_q` (the table's form).
fn template(name: &str) -> String {
    // `.scale`: llama.cpp's per-tensor scales (BitNet's `wq_s`...) take
    // their tensor's base name.
    let base = name
        .strip_suffix(".weight")
        .or_else(|| name.strip_suffix(".bias"))
        .or_else(|| name.strip_suffix(".scale"))
        .unwrap_or(name);
    match base.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
        Some((n, rest)) if n.parse::<usize>().is_ok() => format!("blk.{{bid}}.{rest}"),
        _ => base.to_string(),
    }
}

/// Names and keys of `g` that llama.cpp's tables do not know, for `arch`.
fn strangers(t: &Table, arch: &str, g: &GgufFile) -> Vec<String> {
    let names = &t.tensors[arch];
    let mut bad: Vec<String> = g
        .tensors()
        .iter()
        .filter(|x| !names.contains(&template(&x.name)))
        .map(|x| format!("tensor {}", x.name))
        .collect();
    let prefix = format!("{arch}.");
    bad.extend(
        g.metadata()
            .iter()
            .map(|(k, _)| k)
            .filter(|k| {
                let tmpl = match k.strip_prefix(&prefix) {
                    Some(rest) => format!("{{arch}}.{rest}"),
                    None => k.to_string(),
                };
                !t.keys.contains(&tmpl) && !NEWER_KEYS.contains(&tmpl.as_str())
            })
            .map(|k| format!("key {k}")),
    );
    bad
}

/// A tensor source that remembers which tensors the loader took.
struct Recording<'a> {
    inner: &'a GgufFile,
    taken: RefCell<BTreeSet<String>>,
}

impl TensorSource for Recording<'_> {
    fn tensor(&self, name: &str) -> vkllm::Result<Option<RawTensor<'_>>> {
        let t = TensorSource::tensor(self.inner, name)?;
        if t.is_some() {
            self.taken.borrow_mut().insert(name.to_string());
        }
        Ok(t)
    }
    fn names(&self) -> Vec<String> {
        self.inner.names()
    }
    fn origin(&self) -> String {
        self.inner.origin()
    }
}

/// Load `g` on the CPU through a recording source; the tensors left untouched.
fn unused_tensors(g: &GgufFile) -> Vec<String> {
    let cfg = ModelConfig::from_gguf(g, None).unwrap();
    let src = Recording {
        inner: g,
        taken: RefCell::new(BTreeSet::new()),
    };
    let mut be = common::cpu();
    ModelWeights::load(
        &cfg,
        &src,
        be.as_mut(),
        WeightOptions::default(),
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("{}: {e}", g.path().display()));
    let taken = src.taken.into_inner();
    g.names()
        .into_iter()
        .filter(|n| !taken.contains(n))
        .collect()
}

#[test]
fn table_holds_what_we_rely_on() {
    // Guards the fixture itself: a regenerated table missing these would
    // make the other tests vacuous.
    let t = table();
    assert!(t.tensors["gemma3"].contains("blk.{bid}.post_attention_norm"));
    assert!(t.tensors["gemma3"].contains("blk.{bid}.post_ffw_norm"));
    assert!(t.keys.contains("{arch}.attention.layer_norm_rms_epsilon"));
    assert!(t.keys.contains("general.architecture"));
    assert_eq!(template("blk.12.attn_q.bias"), "blk.{bid}.attn_q");
    assert_eq!(template("token_embd.weight"), "token_embd");
}

#[test]
fn converted_tiny_models_use_llama_cpp_names_and_keys() {
    let t = table();
    let dense = common::TINY_ARCHS
        .into_iter()
        .filter(|a| !common::TINY_MOE_ARCHS.iter().any(|(d, _)| d == a))
        .chain(["bitnet_packed"]);
    for arch in dense {
        let dir = common::reference_dir().join("tiny").join(arch);
        let bytes = vkllm::model::convert::gguf_from_hf(&dir, None)
            .unwrap()
            .to_bytes()
            .unwrap();
        let g = GgufFile::from_bytes(bytes, &format!("{arch}.gguf")).unwrap();
        let arch = arch.strip_suffix("_packed").unwrap_or(arch);
        assert_eq!(g.architecture().unwrap(), arch);
        let bad = strangers(&t, arch, &g);
        assert!(bad.is_empty(), "{arch}: not llama.cpp's: {bad:?}");
        let unused = unused_tensors(&g);
        assert!(unused.is_empty(), "{arch}: the loader ignored {unused:?}");
    }
}

#[test]
fn converted_moe_models_use_llama_cpp_names_and_keys() {
    let t = table();
    assert!(t.tensors["gpt-oss"].contains("blk.{bid}.attn_sinks"));
    for (dir, arch) in common::TINY_MOE_ARCHS {
        let path = common::reference_dir().join("tiny").join(dir);
        let bytes = vkllm::model::convert::gguf_from_hf(&path, None)
            .unwrap()
            .to_bytes()
            .unwrap();
        let g = GgufFile::from_bytes(bytes, &format!("{dir}.gguf")).unwrap();
        assert_eq!(g.architecture().unwrap(), arch);
        let bad = strangers(&t, arch, &g);
        assert!(bad.is_empty(), "{dir}: not llama.cpp's: {bad:?}");
        let unused = unused_tensors(&g);
        assert!(unused.is_empty(), "{dir}: the loader ignored {unused:?}");
    }
}

#[test]
fn synthetic_files_use_llama_cpp_names_and_keys() {
    use vkllm::bench::synth::{plan, shape, write, Quant, SHAPES};
    let t = table();
    let q = Quant::from_name("q4_k_m").unwrap();
    for s in SHAPES {
        let arch = s.arch.gguf_name();
        for p in plan(s, q) {
            assert!(
                t.tensors[arch].contains(&template(&p.name)),
                "synth {}: tensor {} is not llama.cpp's",
                s.name,
                p.name
            );
        }
    }
    // Keys (the tokenizer's included) and loader use, on the small shapes.
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny", "tiny-qwen3", "tiny-bitnet"] {
        let s = shape(name).unwrap();
        let path = dir.path().join(format!("{name}.gguf"));
        write(s, q, &path, 1, None, &mut |_, _| {}).unwrap();
        let g = GgufFile::open(&path).unwrap();
        let bad = strangers(&t, s.arch.gguf_name(), &g);
        assert!(bad.is_empty(), "synth {name}: not llama.cpp's: {bad:?}");
        let unused = unused_tensors(&g);
        assert!(
            unused.is_empty(),
            "synth {name}: the loader ignored {unused:?}"
        );
    }
}

#[test]
fn real_gemma3_file_is_fully_used() {
    // llama.cpp's converter wrote it, so its names are llama.cpp's by
    // definition; what matters is that the loader finds and uses all of them.
    let Some(path) = common::gemma3() else {
        return;
    };
    let g = GgufFile::open(&path).unwrap();
    let bad = strangers(&table(), "gemma3", &g);
    assert!(bad.is_empty(), "not in gguf's table: {bad:?}");
    let unused = unused_tensors(&g);
    assert!(unused.is_empty(), "the loader ignored {unused:?}");
}

#[test]
fn vkllm_convert_writes_loadable_quantized_files() {
    let dir = tempfile::tempdir().unwrap();
    let t = table();
    for arch in ["qwen3", "gemma3"] {
        let out = dir.path().join(format!("{arch}.gguf"));
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_vkllm"))
            .arg("convert")
            .arg(common::reference_dir().join("tiny").join(arch))
            .arg("-o")
            .arg(&out)
            .args(["--quantize", "q8_0"])
            .status()
            .unwrap();
        assert!(status.success(), "vkllm convert {arch}");
        let g = GgufFile::open(&out).unwrap();
        let bad = strangers(&t, arch, &g);
        assert!(bad.is_empty(), "{arch}: not llama.cpp's: {bad:?}");
        // Matrices quantized, norms kept in f32; llama.cpp needs a vocabulary.
        let q = g.tensor("blk.0.attn_q.weight").unwrap();
        assert_eq!(q.dtype, vkllm::DType::Q8_0);
        let n = g.tensor("blk.0.attn_norm.weight").unwrap();
        assert_eq!(n.dtype, vkllm::DType::F32);
        assert!(g.get("tokenizer.ggml.tokens").is_some());
        assert_eq!(g.get_str("general.name").unwrap(), Some(arch));
        assert!(unused_tensors(&g).is_empty());
    }
}
