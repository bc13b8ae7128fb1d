//! `vkllm synth` files and `vkllm bench`: synthetic models of every mix
//! (quantized and `--fast`) reload through our GGUF reader with the planned
//! shapes and types, which are llama.cpp's, and run on the CPU; the bench
//! command's arguments and JSON records.

mod common;

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use vkllm::bench::synth::{self, Quant};
use vkllm::model::gguf::GgufFile;
use vkllm::model::{LoadOptions, ModelConfig, Output as ModelOutput, Want};
use vkllm::DType;

fn donor() -> PathBuf {
    common::root().join("tests/data/donor_tokenizer.gguf")
}

/// Every tensor of `g` as name -> (ggml dims, dtype).
fn tensor_map(g: &GgufFile) -> HashMap<String, (Vec<u64>, DType)> {
    g.tensors()
        .iter()
        .map(|t| (t.name.clone(), (t.dims.clone(), t.dtype)))
        .collect()
}

/// Load `path` on the CPU and check one forward pass gives finite logits and an in-vocabulary token.
fn forward_on_cpu(path: &Path) -> ModelConfig {
    let opts = LoadOptions {
        context: Some(32),
        max_batch: Some(8),
        ..LoadOptions::default()
    };
    let mut m = common::load_model(common::cpu(), path, &opts);
    let cfg = m.config().clone();
    let ModelOutput::Logits(logits) = m.forward(&[1, 2, 3, 4], Want::LastLogits).unwrap() else {
        panic!("asked for logits");
    };
    assert_eq!(logits.len(), cfg.vocab);
    assert!(
        logits.iter().all(|x| x.is_finite()),
        "{}: non-finite logits",
        path.display()
    );
    assert!(
        logits.iter().any(|&x| x != logits[0]),
        "{}: constant logits",
        path.display()
    );
    let t = m.next_token(&[5]).unwrap();
    assert!((t as usize) < cfg.vocab);
    cfg
}

#[test]
fn synth_tiny_shapes_reload_with_planned_types_and_run() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny", "tiny-qwen3", "tiny-bitnet"] {
        let shape = synth::shape(name).unwrap();
        for quant in Quant::ALL {
            let path = dir.path().join(format!("{name}-{}.gguf", quant.name()));
            let summary = synth::write(shape, quant, &path, 7, None, &mut |_, _| {}).unwrap();
            assert_eq!(summary.file_bytes, std::fs::metadata(&path).unwrap().len());
            let g = GgufFile::open(&path).unwrap();
            let plan = synth::plan(shape, quant);
            assert_eq!(g.tensors().len(), plan.len());
            let got = tensor_map(&g);
            for t in &plan {
                assert_eq!(
                    got.get(&t.name),
                    Some(&(t.dims(), t.dtype)),
                    "{name} {}: {}",
                    quant.name(),
                    t.name
                );
            }
            assert_eq!(g.architecture().unwrap(), shape.arch.gguf_name());
            assert_eq!(
                g.get_u64("general.file_type").unwrap(),
                Some(quant.file_type() as u64)
            );
            assert_eq!(
                g.get_array("tokenizer.ggml.tokens")
                    .unwrap()
                    .map(|a| a.len()),
                Some(shape.vocab)
            );
            let cfg = forward_on_cpu(&path);
            assert_eq!(
                (
                    cfg.n_layer,
                    cfg.n_embd,
                    cfg.n_head,
                    cfg.n_head_kv,
                    cfg.head_dim,
                    cfg.n_ff,
                    cfg.vocab
                ),
                (
                    shape.layers,
                    shape.hidden,
                    shape.heads,
                    shape.kv_heads,
                    shape.head_dim,
                    shape.ffn,
                    shape.vocab
                )
            );
            assert_eq!(cfg.qk_norm, name == "tiny-qwen3");
            assert_eq!(cfg.sub_norms, name == "tiny-bitnet");
        }
    }
}

/// Every mix's type for every tensor llama.cpp quantizes is the one
/// llama.cpp's quantizer picks (tests/data/llamacpp_mix_types.json, from
/// `scripts/llamacpp-mixes.py --json`: its dry run on synth F16 files).
#[test]
fn synth_types_are_llama_cpps_for_every_mix() {
    let path = common::root().join("tests/data/llamacpp_mix_types.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    for (shape_name, entry) in v["shapes"].as_object().unwrap() {
        let shape = synth::shape(shape_name).unwrap();
        let names: Vec<&str> = entry["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        for (mix, types) in entry["mixes"].as_object().unwrap() {
            let quant = Quant::from_name(mix).unwrap();
            let plan = synth::plan(shape, quant);
            let mut ours: Vec<&str> = plan
                .iter()
                .filter(|t| t.dtype != DType::F32)
                .map(|t| t.name.as_str())
                .collect();
            ours.sort_unstable();
            assert_eq!(ours, names, "{shape_name} {mix}: quantized tensors");
            for (name, want) in names.iter().zip(types.as_str().unwrap().split(' ')) {
                // The dry run has no importance matrix, which iq3_xxs is
                // written with: its attn_v and ffn_down are the matrix's call.
                if quant == Quant::IQ3XXS
                    && (name.contains("attn_v.weight") || name.contains("ffn_down"))
                {
                    continue;
                }
                let got = plan.iter().find(|t| t.name == *name).unwrap().dtype;
                assert_eq!(got.name(), want, "{shape_name} {mix}: {name}");
                checked += 1;
            }
        }
    }
    assert!(checked > 10_000, "only {checked} tensors checked");
}

#[test]
fn synth_is_deterministic_in_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    let shape = synth::shape("tiny").unwrap();
    let write = |file: &str, seed| {
        let p = dir.path().join(file);
        synth::write(shape, Quant::Q4_0, &p, seed, None, &mut |_, _| {}).unwrap();
        std::fs::read(p).unwrap()
    };
    let (a, b, c) = (write("a.gguf", 1), write("b.gguf", 1), write("c.gguf", 2));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn synth_weights_are_well_scaled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f16.gguf");
    synth::write(
        synth::shape("tiny").unwrap(),
        Quant::F16,
        &path,
        3,
        None,
        &mut |_, _| {},
    )
    .unwrap();
    let g = GgufFile::open(&path).unwrap();
    let values = |name: &str| {
        let t = g.tensor(name).unwrap();
        let mut out = vec![0f32; t.n_elements()];
        vkllm::quants::dequantize_row(t.dtype, g.tensor_data(t), &mut out).unwrap();
        out
    };
    let q = values("blk.0.attn_q.weight");
    let mean = q.iter().sum::<f32>() / q.len() as f32;
    let std = (q.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / q.len() as f32).sqrt();
    assert!(
        mean.abs() < 1e-3 && (std - 0.02).abs() < 1e-3,
        "attn_q mean {mean} std {std}"
    );
    let norm = values("blk.0.attn_norm.weight");
    assert!(
        norm.iter().all(|x| (x - 1.0).abs() < 0.1),
        "norm weights should be near 1"
    );
}

#[test]
fn synth_fast_writes_well_scaled_random_blocks_that_run() {
    let dir = tempfile::tempdir().unwrap();
    let shape = synth::shape("tiny").unwrap();
    let write = |quant: Quant, values| {
        let path = dir.path().join(format!("{}-{values:?}.gguf", quant.name()));
        synth::write_values(shape, quant, values, &path, 4, None, &mut |_, _| {}).unwrap();
        path
    };
    for quant in [
        Quant::Q4KM,
        Quant::IQ2XXS,
        Quant::TQ1_0,
        Quant::Mxfp4,
        Quant::Q2KS,
    ] {
        let fast = write(quant, synth::Values::Random);
        let g = GgufFile::open(&fast).unwrap();
        let got = tensor_map(&g);
        for t in synth::plan(shape, quant) {
            assert_eq!(got.get(&t.name).map(|x| x.1), Some(t.dtype), "{}", t.name);
        }
        let t = g.tensor("blk.1.attn_q.weight").unwrap();
        let mut q = vec![0f32; t.n_elements()];
        vkllm::quants::dequantize_row(t.dtype, g.tensor_data(t), &mut q).unwrap();
        let n = q.len() as f32;
        let mean = q.iter().sum::<f32>() / n;
        let std = (q.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n).sqrt();
        assert!(
            (0.01..0.04).contains(&std) && mean.abs() < 0.01,
            "{} attn_q mean {mean} std {std}",
            quant.name()
        );
        forward_on_cpu(&fast);
    }
    // The grid types are random blocks either way, from the same streams;
    // the types vkllm quantizes are not.
    let (slow, fast) = (
        write(Quant::IQ2XXS, synth::Values::Quantized),
        write(Quant::IQ2XXS, synth::Values::Random),
    );
    let (slow, fast) = (
        GgufFile::open(&slow).unwrap(),
        GgufFile::open(&fast).unwrap(),
    );
    let data = |g: &GgufFile, name: &str| g.tensor_data(g.tensor(name).unwrap()).to_vec();
    let grid = "blk.0.attn_q.weight";
    assert_eq!(slow.tensor(grid).unwrap().dtype, DType::IQ2XXS);
    assert_eq!(data(&slow, grid), data(&fast, grid));
    let k = "blk.0.attn_v.weight";
    assert_eq!(slow.tensor(k).unwrap().dtype, DType::Q2K);
    assert_ne!(data(&slow, k), data(&fast, k));
}

#[test]
fn synth_rejects_a_bad_donor_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let donor = dir.path().join("donor.gguf");
    std::fs::write(&donor, b"not a gguf file").unwrap();
    let out = dir.path().join("out.gguf");
    let shape = synth::shape("tiny").unwrap();
    let err = synth::write(shape, Quant::Q8_0, &out, 0, Some(&donor), &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("donor.gguf"), "{err}");
    assert!(!out.exists());
}

#[test]
fn synth_smollm2_matches_the_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2-q4_1.gguf");
    let donor = donor();
    let shape = synth::shape("smollm2-135m").unwrap();
    synth::write(shape, Quant::Q4_1, &path, 0, Some(&donor), &mut |_, _| {}).unwrap();
    let ours = GgufFile::open(&path).unwrap();
    let real = GgufFile::open(&common::smollm2()).unwrap();
    // Same tensor names, shapes and types as the real Q4_1 file (Q8_0 embeddings included).
    assert_eq!(tensor_map(&ours), tensor_map(&real));
    for key in ["tokenizer.ggml.tokens", "tokenizer.ggml.merges"] {
        assert_eq!(ours.get(key), real.get(key), "{key}");
    }
    let cfg = forward_on_cpu(&path);
    assert_eq!(cfg, ModelConfig::from_gguf(&real, None).unwrap());
}

fn vkllm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args(args)
        .output()
        .unwrap()
}

fn tiny_model(dir: &Path) -> String {
    let path = dir.join("tiny.gguf").display().to_string();
    let out = vkllm(&[
        "synth", "--shape", "tiny", "--quant", "q4_0", "-o", &path, "--seed", "5",
    ]);
    assert!(
        out.status.success(),
        "synth failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

#[test]
fn bench_json_has_every_record_and_repetition() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let out = vkllm(&[
        "bench",
        "-m",
        &model,
        "-b",
        "cpu",
        "-p",
        "8",
        "-n",
        "4",
        "-d",
        "0,8",
        "-r",
        "2",
        "-t",
        "1",
        "--copy-mib",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records: Value = serde_json::from_slice(&out.stdout).unwrap();
    let records = records.as_array().unwrap();
    let tests: Vec<&str> = records
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["pp8", "pp8 @ d8", "tg4", "tg4 @ d8"]);
    for r in records {
        assert_eq!(r["model_filename"], "tiny.gguf");
        assert_eq!(r["backend"], "cpu");
        assert_eq!(r["n_threads"], 1);
        assert!(r["device"].is_string());
        for key in [
            "model_size",
            "model_n_params",
            "n_prompt",
            "n_gen",
            "n_depth",
            "avg_ns",
            "stddev_ns",
        ] {
            assert!(r[key].is_u64(), "{key} should be an integer: {}", r[key]);
        }
        for key in ["avg_ts", "stddev_ts", "copy_gbs"] {
            assert!(
                r[key].as_f64().is_some_and(|x| x >= 0.0),
                "{key}: {}",
                r[key]
            );
        }
        let ts = r["samples_ts"].as_array().unwrap();
        let ns = r["samples_ns"].as_array().unwrap();
        assert_eq!((ts.len(), ns.len()), (2, 2));
        assert!(ts.iter().all(|x| x.as_f64().is_some_and(|x| x > 0.0)));
        assert!(ns.iter().all(Value::is_u64));
        let tg = r["kind"] == "tg";
        assert_eq!(r["kind"], if tg { "tg" } else { "pp" });
        assert_eq!(r["weight_gbs"].is_f64(), tg, "weight_gbs only for tg");
        assert_eq!(r["roofline_pct"].is_f64(), tg, "roofline_pct only for tg");
    }
    assert_eq!(
        (
            records[1]["n_prompt"].as_u64(),
            records[1]["n_depth"].as_u64()
        ),
        (Some(8), Some(8))
    );
    assert_eq!(
        (
            records[2]["n_gen"].as_u64(),
            records[2]["n_prompt"].as_u64()
        ),
        (Some(4), Some(0))
    );
}

#[test]
fn bench_table_and_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let out = vkllm(&[
        "bench",
        "-m",
        &model,
        "-b",
        "cpu",
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "--copy-mib",
        "0",
    ]);
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "header, rule, pp4, tg2:\n{table}");
    assert!(lines[0].starts_with("| model") && lines[0].contains("t/s"));
    assert!(
        lines[2].contains(" pp4 |") && lines[3].contains(" tg2 |"),
        "{table}"
    );

    let fails = |args: &[&str], why: &str| {
        let out = vkllm(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{args:?}: expected '{why}' in: {err}");
    };
    fails(&["bench", "-m", &model, "-r", "0"], "repetitions");
    fails(
        &["bench", "-m", &model, "-b", "cpu", "-p", "0", "-n", "0"],
        "no test to run",
    );
    fails(
        &["bench", "-m", "/nonexistent.gguf", "-b", "cpu"],
        "does not exist",
    );
    fails(&["bench", "-m", &model, "-b", "cuda"], "cuda");
    fails(&["synth", "--shape", "gpt5", "-o", "x.gguf"], "gpt5");
}

/// A donor vocabulary cut to a small shape keeps only the merges it can
/// still spell: the file's BPE tokenizer loads and round-trips text (it
/// refused to load while merges named tokens past the cut).
#[test]
fn synth_cuts_the_donor_merges_with_its_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let shape = synth::shape("tiny").unwrap();
    let donor = common::smollm2();
    synth::write(shape, Quant::Q4_0, &path, 0, Some(&donor), &mut |_, _| {}).unwrap();
    let ours = GgufFile::open(&path).unwrap();
    let all = GgufFile::open(&donor).unwrap();
    let merges = |g: &GgufFile| match g.get("tokenizer.ggml.merges") {
        Some(vkllm::model::gguf::GgufValue::Array(m)) => m.len(),
        other => panic!("merges: {other:?}"),
    };
    assert!(merges(&ours) > 0 && merges(&ours) < merges(&all));
    let tok = vkllm::model::tokenizer::Tokenizer::from_gguf(&ours).unwrap();
    let text = "Hello world, the cat sat on the mat.";
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.iter().all(|&id| (id as usize) < shape.vocab));
    assert_eq!(tok.decode(&ids).unwrap(), text);
}
