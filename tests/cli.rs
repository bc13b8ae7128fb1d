//! The `vkllm` command-line contract: JSON shapes, exit codes, one-line
//! errors, and real greedy output of the default model on every backend.

mod common;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

/// `args` followed by the whitespace-separated words of `flags`.
fn with_flags<'a>(args: &[&'a str], flags: &'a str) -> Vec<&'a str> {
    args.iter()
        .copied()
        .chain(flags.split_whitespace())
        .collect()
}

fn vkllm(args: &[&str]) -> Output {
    vkllm_in(&common::root(), args)
}

fn vkllm_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run the vkllm binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `args` (which must succeed) and parses stdout as one JSON value.
fn json(args: &[&str]) -> Value {
    let o = vkllm(args);
    assert!(o.status.success(), "vkllm {args:?} failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("vkllm {args:?}: stdout is not JSON ({e}): {}", stdout(&o)))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected an array of ids, got {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("{x} is not an id")) as u32)
        .collect()
}

/// A runtime failure: exit code 1 and exactly one `error: ...` line on stderr
/// mentioning `needle` (no panic, no backtrace).
fn assert_one_line_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("backend:")).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(needle), "'{needle}' not in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

const FRANCE: &str = "The capital of France is";

/// The first `n` of transformers' greedy tokens after "The capital of France is".
fn reference_greedy(n: usize) -> (Vec<u32>, Vec<u32>) {
    let path = common::reference_dir().join("smollm2_reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    let r = v["refs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["prompt"] == FRANCE)
        .expect("reference for the France prompt");
    (ids(&r["prompt_ids"]), ids(&r["greedy_32"])[..n].to_vec())
}

fn model_arg() -> String {
    common::smollm2().display().to_string()
}

#[test]
fn generate_json_has_the_documented_shape_and_reference_tokens() {
    let m = model_arg();
    let v = json(&with_flags(
        &["generate", "-m", &m, "-p", FRANCE],
        "-n 8 --temperature 0 --backend cpu --json",
    ));
    let (want_prompt, want_tokens) = reference_greedy(8);
    assert_eq!(
        ids(&v["prompt_ids"]),
        want_prompt,
        "plain prompts get no BOS for SmolLM2"
    );
    assert_eq!(ids(&v["tokens"]), want_tokens);
    assert!(v["text"].as_str().unwrap().starts_with(" Paris."), "{v}");
    assert!(v["backend"].as_str().unwrap().starts_with("cpu"), "{v}");
    let t = &v["timings"];
    assert_eq!(t["prefill_tokens"].as_u64(), Some(5), "{t}");
    assert_eq!(t["decode_tokens"].as_u64(), Some(7), "{t}");
    for key in ["prefill_tok_s", "decode_tok_s", "load_s"] {
        assert!(t[key].as_f64().is_some_and(|x| x > 0.0), "{key} in {t}");
    }
}

fn assert_streams_paris(backend: &str) {
    let m = model_arg();
    let o = vkllm(&with_flags(
        &["generate", "-m", &m, "-p", FRANCE, "--backend", backend],
        "-n 8 --temperature 0",
    ));
    assert!(o.status.success(), "{backend}: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with(" Paris."), "{backend}: stdout {out:?}");
    let err = stderr(&o);
    assert!(
        err.contains("prefill 5 tok at") && err.contains("decode 7 tok at"),
        "{backend}: {err}"
    );
    assert!(
        !err.contains("loading"),
        "no progress bar when stderr is not a terminal: {err}"
    );

    // The same run as JSON: exactly transformers' greedy tokens.
    let v = json(&with_flags(
        &["generate", "-m", &m, "-p", FRANCE, "--backend", backend],
        "-n 8 --temperature 0 --json",
    ));
    assert_eq!(ids(&v["tokens"]), reference_greedy(8).1, "{backend}");
}

#[test]
fn generate_streams_paris_on_cpu() {
    assert_streams_paris("cpu");
}

#[test]
fn generate_streams_paris_on_vulkan() {
    if common::vulkan().is_none() {
        return;
    }
    assert_streams_paris("vulkan");
}

#[test]
fn auto_backend_says_what_it_picked() {
    let m = model_arg();
    let o = vkllm(&with_flags(
        &["generate", "-m", &m, "-p", FRANCE],
        "-n 2 --temperature 0",
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.starts_with("backend: "))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.starts_with("backend: vulkan (") || line.starts_with("backend: cpu ("),
        "{line}"
    );
    assert!(stdout(&o).starts_with(" Paris"), "{}", stdout(&o));
}

#[test]
fn sampling_is_seeded_and_stops_at_max_tokens() {
    let m = model_arg();
    let run = |seed: &str| {
        json(&with_flags(
            &["generate", "-m", &m, "-p", FRANCE, "-s", seed],
            "-n 6 --temperature 1.0 --backend cpu --json",
        ))
    };
    let (a, b) = (run("7"), run("7"));
    assert_eq!(
        a["tokens"], b["tokens"],
        "the same seed must give the same tokens"
    );
    assert_eq!(ids(&a["tokens"]).len(), 6, "{a}");
}

#[test]
fn chat_renders_the_template_without_a_second_bos() {
    let m = model_arg();
    let tokenize = |text: &str| {
        ids(&json(&["tokenize", "-m", &m, "--text", text, "--no-bos", "--json"])["ids"])
    };
    assert_eq!(
        tokenize("<|im_start|>"),
        [1],
        "<|im_start|> is one special token"
    );
    let question = "What is the capital of France?";
    let v = json(&with_flags(
        &["generate", "-m", &m, "-p", question],
        "--chat -n 24 --temperature 0 --backend cpu --json",
    ));
    let prompt = ids(&v["prompt_ids"]);
    assert_eq!(prompt[0], 1, "{prompt:?}");
    assert_ne!(prompt[1], 1, "BOS duplicated: {prompt:?}");
    let user = tokenize(&format!(
        "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    ));
    assert!(
        prompt.ends_with(&user),
        "{prompt:?} does not end with {user:?}"
    );
    // The answer ends with <|im_end|> (id 2): kept in the ids, not in the text.
    assert_eq!(v["text"], "The capital of France is Paris.", "{v}");
    assert_eq!(v["stop"], "stop_token", "{v}");
    assert_eq!(ids(&v["tokens"]).last(), Some(&2), "{v}");

    let v = json(&with_flags(
        &[
            "generate",
            "-m",
            &m,
            "-p",
            question,
            "--system",
            "Answer briefly.",
        ],
        "--chat -n 1 --temperature 0 --backend cpu --json",
    ));
    let prompt = ids(&v["prompt_ids"]);
    let system = tokenize("<|im_start|>system\nAnswer briefly.<|im_end|>\n");
    assert!(
        prompt.starts_with(&system),
        "{prompt:?} does not start with {system:?}"
    );
    assert!(prompt.ends_with(&user), "{prompt:?}");
}

#[test]
fn generation_stops_when_the_context_is_full() {
    let m = model_arg();
    let v = json(&with_flags(
        &["generate", "-m", &m, "-p", FRANCE],
        "--ctx 8 -n 100 --temperature 0 --backend cpu --json",
    ));
    // 5 prompt positions + 3 fed-back tokens fill 8; the 4th token needs no slot.
    assert_eq!(ids(&v["tokens"]), reference_greedy(4).1, "{v}");
    assert_eq!(v["stop"], "context_full", "{v}");
}

/// `--ignore-eos`: the reference's 32 greedy tokens (made with EOS barred;
/// without the flag the model ends at EOS at token 30), streamed in full;
/// `--stop` cuts the text before the stop string.
#[test]
fn ignore_eos_and_stop_strings() {
    let m = model_arg();
    let flags = "-n 32 --temperature 0 --backend cpu --activations f32 --json";
    let v = json(&with_flags(&["generate", "-m", &m, "-p", FRANCE], flags));
    assert_eq!(v["stop"], "stop_token", "{v}");
    let v = json(&with_flags(
        &["generate", "-m", &m, "-p", FRANCE, "--ignore-eos"],
        flags,
    ));
    assert_eq!(ids(&v["tokens"]), reference_greedy(32).1, "{v}");
    assert_eq!(v["stop"], "max_tokens", "{v}");
    let o = vkllm(&with_flags(
        &[
            "generate", "-m", &m, "-p", FRANCE, "--stop", "2018", "--stop", "\n\n\n",
        ],
        "-n 32 --temperature 0 --backend cpu",
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), " Paris.\n\nThe answer is: \n");
}

/// `vkllm chat` over stdin: two turns and a reset; the second turn
/// evaluates only its new tokens (the first stays in the KV cache).
#[test]
fn chat_keeps_the_conversation_in_the_kv_cache() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args([
            "chat",
            "-m",
            &model_arg(),
            "-b",
            "cpu",
            "--temperature",
            "0",
            "-c",
            "512",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run vkllm chat");
    let input =
        "What is the capital of France?\nAnd of Germany?\n/reset\nWhat is the capital of France?\n";
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "The capital of France is Paris.\nThe capital of Germany is Berlin.\nThe capital of France is Paris.\n"
    );
    let err = stderr(&o);
    let turns: Vec<&str> = err.lines().filter(|l| l.starts_with("(prefill")).collect();
    let want = [
        "(prefill 37 of 37 tok",
        "(prefill 15 of 59 tok",
        "(prefill 37 of 37 tok",
    ];
    assert_eq!(turns.len(), want.len(), "{err}");
    for (got, want) in turns.iter().zip(want) {
        assert!(got.starts_with(want), "{got} is not {want}...: {err}");
    }
}

#[test]
fn tokenize_json_gives_ids() {
    let m = model_arg();
    let (want, _) = reference_greedy(0);
    let v = json(&["tokenize", "-m", &m, "--text", FRANCE, "--json"]);
    assert_eq!(ids(&v["ids"]), want);
    let v = json(&["tokenize", "-m", &m, "--text", FRANCE, "--no-bos", "--json"]);
    assert_eq!(ids(&v["ids"]), want);
}

#[test]
fn logits_json_of_a_gguf_has_one_row_per_position() {
    let m = model_arg();
    let (prompt, greedy) = reference_greedy(1);
    let list = prompt
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let v = json(&[
        "logits",
        "-m",
        &m,
        "--prompt-ids",
        &list,
        "--backend",
        "cpu",
        "--json",
    ]);
    let rows = v["logits"].as_array().expect("logits array");
    assert_eq!(rows.len(), prompt.len());
    for row in rows {
        assert_eq!(row.as_array().unwrap().len(), 49152);
    }
    let last: Vec<f64> = rows[rows.len() - 1]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let best = (0..last.len())
        .max_by(|&a, &b| last[a].total_cmp(&last[b]))
        .unwrap();
    assert_eq!(best as u32, greedy[0]);
}

#[test]
fn logits_json_of_an_hf_dir_matches_transformers() {
    let dir = common::reference_dir().join("tiny").join("llama");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let prompt = ids(&r["prompt_ids"]);
    let list = prompt
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let d = dir.display().to_string();
    let v = json(&[
        "logits",
        "--model",
        &d,
        "--prompt-ids",
        &list,
        "--backend",
        "cpu",
        "--json",
    ]);
    let got = v["logits"].as_array().unwrap();
    let want = r["logits"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    for (pos, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.as_array().unwrap(), w.as_array().unwrap());
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!((a - b).abs() < 1e-3, "position {pos}: {a} vs {b}");
        }
    }
}

#[test]
fn bad_flags_exit_with_2() {
    let o = vkllm(&["generate", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = vkllm(&["generate"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a prompt is required: {}",
        stderr(&o)
    );
    let o = vkllm(&["generate", "--prompt-ids", "1,two,3"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.starts_with("error: ") && err.contains("'two' is not a token id"),
        "{err}"
    );
    let o = vkllm(&["generate", "-p", "hi", "--prompt-ids", "1"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--prompt and --prompt-ids conflict"
    );
}

#[test]
fn missing_model_is_one_line() {
    let o = vkllm(&["generate", "-m", "/nonexistent/model.gguf", "-p", "hi"]);
    assert_one_line_error(&o, "/nonexistent/model.gguf does not exist");
    let o = vkllm(&["info", "-m", "/nonexistent/model.gguf"]);
    assert_one_line_error(&o, "does not exist");
}

#[test]
fn not_a_model_is_one_line() {
    let o = vkllm(&["generate", "-m", file!(), "-p", "hi"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).starts_with("error: "), "{}", stderr(&o));
}

#[test]
fn default_model_is_found_from_another_directory() {
    common::smollm2();
    let dir = tempfile::tempdir().unwrap();
    let o = vkllm_in(dir.path(), &["tokenize", "--text", FRANCE, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("504"), "{}", stdout(&o));
}

#[test]
fn prompt_ids_outside_the_vocabulary_are_one_line() {
    let m = model_arg();
    let o = vkllm(&[
        "generate",
        "-m",
        &m,
        "--prompt-ids",
        "1,49152",
        "--backend",
        "cpu",
    ]);
    assert_one_line_error(&o, "49152");
    let o = vkllm(&[
        "logits",
        "-m",
        &m,
        "--prompt-ids",
        "1,4000000000",
        "--backend",
        "cpu",
        "--json",
    ]);
    assert_one_line_error(&o, "4000000000");
}

#[test]
fn prompt_longer_than_the_context_is_one_line() {
    let m = model_arg();
    let long = "one two three four five six seven eight nine ten";
    let o = vkllm(&with_flags(
        &["generate", "-m", &m, "-p", long],
        "--ctx 8 --backend cpu",
    ));
    assert_one_line_error(&o, "context");
}

#[test]
fn info_lists_devices_cpu_and_model() {
    let m = model_arg();
    let o = vkllm(&["info", "-m", &m]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "Vulkan devices:",
        "CPU:",
        "arch: llama",
        "layers: 30",
        "vocab: 49152",
        "q4_1",
        "total:",
    ] {
        assert!(out.contains(needle), "'{needle}' missing from:\n{out}");
    }
}

#[test]
fn quantize_at_load_changes_logits_by_the_quantization_error() {
    let dir = common::reference_dir().join("tiny").join("llama");
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let list = ids(&r["prompt_ids"])
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let want: Vec<f64> = r["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .collect();
    let d = dir.display().to_string();
    let err = |q: &str| -> f64 {
        let v = json(&[
            "logits",
            "--model",
            &d,
            "--prompt-ids",
            &list,
            "--backend",
            "cpu",
            "--quantize",
            q,
            "--json",
        ]);
        let got = v["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()));
        got.zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max)
    };
    // Logits reach about 3.2 here. Quantized weights must move them (the
    // option took effect), q8_0 only slightly (measured 0.058), q4_0 more
    // (measured 1.01) but still within the scale of the logits.
    let (q8, q4) = (err("q8_0"), err("q4_0"));
    assert!(q8 > 1e-3 && q8 < 0.15, "q8_0 error {q8}");
    assert!(q4 > q8 && q4 < 2.0, "q4_0 error {q4} vs q8_0 {q8}");
}
