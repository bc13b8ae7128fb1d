//! The C API: vkllm.h is what cbindgen makes of capi/ today, and the C
//! program examples/c/demo.c, compiled with `cc` against libvkllm.so, gives
//! transformers' greedy tokens on the tiny models (ids only: they carry no
//! tokenizer) and streams a chat reply from the default model.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn header() -> String {
    let root = common::root();
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(config)
        .generate()
        .expect("cbindgen")
        .write(&mut out);
    String::from_utf8(out).expect("UTF-8 header")
}

#[test]
fn the_header_is_fresh() {
    let path = common::root().join("vkllm.h");
    let want = header();
    if std::env::var("VKLLM_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "vkllm.h is stale: rerun with VKLLM_BLESS=1 cargo test --release --test capi"
    );
}

/// libvkllm.so beside the test binary's directory (target/<profile>/).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    assert!(
        dir.join("libvkllm.so").exists(),
        "{} has no libvkllm.so: `cargo build --release --lib` makes it (scripts/test.sh does)",
        dir.display()
    );
    dir
}

/// examples/c/demo.c compiled into a temporary directory.
fn compile(tmp: &Path) -> PathBuf {
    let root = common::root();
    let exe = tmp.join("demo");
    let lib = lib_dir();
    let o = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(root.join("examples/c/demo.c"))
        .arg(format!("-I{}", root.display()))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lvkllm")
        .output()
        .expect("run cc");
    assert!(
        o.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}

fn run(exe: &Path, args: &[&str]) -> (String, String) {
    let o = Command::new(exe).args(args).output().expect("run the demo");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(o.status.success(), "demo {args:?} failed: {err}\n{out}");
    (out, err)
}

#[test]
fn the_c_example_runs_against_the_tiny_models_and_smollm2() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = compile(tmp.path());
    for arch in common::TINY_ARCHS {
        let dir = common::reference_dir().join("tiny").join(arch);
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let list = |v: &Value| -> String {
            let ids: Vec<String> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.to_string())
                .collect();
            ids.join(",")
        };
        let (out, _) = run(
            &exe,
            &["ids", dir.to_str().unwrap(), &list(&r["prompt_ids"]), "16"],
        );
        assert_eq!(out.trim(), list(&r["greedy_16"]), "{arch}");
        let (out, err) = run(
            &exe,
            &[
                "batch",
                dir.to_str().unwrap(),
                &list(&r["prompt_ids"]),
                "16",
            ],
        );
        let mut lines = out.lines();
        assert_eq!(
            lines.next(),
            Some(list(&r["greedy_16"]).as_str()),
            "{arch}: {err}"
        );
        assert_eq!(lines.next(), Some("batch == alone"), "{arch}: {err}");
    }
    let model = common::smollm2();
    let (out, err) = run(
        &exe,
        &[
            "chat",
            model.to_str().unwrap(),
            "What is the capital of France?",
        ],
    );
    println!("{out}{err}");
    assert!(
        out.contains("<|im_start|>user\nWhat is the capital of France?<|im_end|>"),
        "{out}"
    );
    assert!(
        out.contains("reply: The capital of France is Paris."),
        "{out}"
    );
    assert!(out.contains("streamed == detokenized"), "{out}");
    assert!(out.contains("small buffer: status 6, needs"), "{out}");
    assert!(out.contains("<|im_start|>user\nAnd of Germany?"), "{out}");
    // Structured output: the reply parses and holds what the schema asks.
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    });
    let (out, err) = run(
        &exe,
        &[
            "json",
            model.to_str().unwrap(),
            &schema.to_string(),
            "Give a name and an age as JSON.",
        ],
    );
    let reply = out
        .lines()
        .find_map(|l| l.strip_prefix("json: "))
        .unwrap_or_else(|| panic!("no reply: {out}{err}"));
    let value: Value = serde_json::from_str(reply).unwrap_or_else(|e| panic!("{reply}: {e}"));
    assert!(
        value["name"]
            .as_str()
            .is_some_and(|n| n.chars().count() <= 12),
        "{value}"
    );
    assert!(value["age"].as_u64().is_some_and(|a| a <= 120), "{value}");
    assert_eq!(value.as_object().map(|o| o.len()), Some(2), "{value}");
    assert!(out.contains(", stop 0"), "{out}");
    assert!(out.contains("give at most one of json_schema"), "{out}");
    let (out, _) = run(&exe, &["error", "/no/such/model.gguf"]);
    assert!(out.contains("status 4"), "{out}");
    assert!(out.contains("/no/such/model.gguf"), "{out}");
}
