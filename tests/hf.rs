//! Hugging Face directories that are broken or unsupported fail with one
//! sentence naming what is wrong, never a panic.

mod common;

use std::path::Path;
use vkllm::model::LoadOptions;

fn tiny(arch: &str) -> std::path::PathBuf {
    common::reference_dir().join("tiny").join(arch)
}

/// A copy of the tiny llama with `edit` applied to (config text, safetensors bytes).
fn broken(edit: impl FnOnce(&mut String, &mut Vec<u8>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut config = std::fs::read_to_string(tiny("llama").join("config.json")).unwrap();
    let mut weights = std::fs::read(tiny("llama").join("model.safetensors")).unwrap();
    edit(&mut config, &mut weights);
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), weights).unwrap();
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

#[test]
fn unsupported_architecture_is_named() {
    let d = broken(|c, _| *c = c.replace("\"model_type\": \"llama\"", "\"model_type\": \"mamba\""));
    let e = load_err(d.path());
    assert!(e.contains("mamba") && e.contains("unsupported"), "{e}");
}

#[test]
fn unsupported_rope_scaling_is_named() {
    let d = broken(|c, _| *c = c.replace("\"rope_type\": \"default\"", "\"rope_type\": \"yarn\""));
    let e = load_err(d.path());
    assert!(e.contains("yarn"), "{e}");
}

#[test]
fn missing_tensor_is_named() {
    // Rename one tensor in the header (same length, so offsets stay valid).
    let d = broken(|_, w| {
        let from = b"model.layers.1.self_attn.o_proj.weight";
        let to = b"model.layers.1.self_attn.x_proj.weight";
        let at = w.windows(from.len()).position(|x| x == from).unwrap();
        w[at..at + to.len()].copy_from_slice(to);
    });
    let e = load_err(d.path());
    assert!(
        e.contains("blk.1.attn_output.weight") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn truncated_or_garbled_safetensors_fail_cleanly() {
    for cut in [0usize, 7, 8, 100, 5000] {
        let d = broken(|_, w| w.truncate(cut));
        let e = load_err(d.path());
        assert!(
            e.contains("model.safetensors") || e.contains("safetensors"),
            "cut {cut}: {e}"
        );
    }
    let d = broken(|_, w| w[8..16].copy_from_slice(b"{{{{{{{{"));
    assert!(load_err(d.path()).contains("safetensors"));
}

#[test]
fn bad_config_fails_cleanly() {
    let d = broken(|c, _| *c = "{ not json".into());
    assert!(load_err(d.path()).contains("config.json"));
    let d =
        broken(|c, _| *c = c.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": \"two\""));
    assert!(load_err(d.path()).contains("num_hidden_layers"));
    let d =
        broken(|c, _| *c = c.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"));
    assert!(load_err(d.path()).contains("kv heads"));
    let empty = tempfile::tempdir().unwrap();
    assert!(load_err(empty.path()).contains("config.json"));
}

#[test]
fn unknown_rope_scaling_is_refused() {
    // YaRN runs (gpt-oss); a scaling the rope kernels lack must not run as
    // plain rope.
    let d = broken(|c, _| {
        *c = c.replace(
            "\"rope_type\": \"default\"",
            "\"rope_type\": \"longrope\", \"factor\": 4.0",
        )
    });
    let e = load_err(d.path());
    assert!(e.contains("longrope") && e.contains("unsupported"), "{e}");
}
