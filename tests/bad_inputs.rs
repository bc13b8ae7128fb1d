//! Every bad input is one clear error: a table of malformed model files
//! (GGUF and Hugging Face directories) and bad flags across the subcommands,
//! each run through the `vkllm` binary, which must print exactly one
//! `error:` line and exit with 1 (runtime) or 2 (usage), never panic or abort.
//!
//! The table is the documentation: input → exit code → the words the message
//! must contain. Broken files are made in a tempdir from a tiny valid model
//! (`vkllm synth --shape tiny`, and the tiny Llama checkpoint in
//! tests/data/reference/tiny/llama).
//!
//! Covered elsewhere, not repeated here: the GGUF reader's corpus of ~35
//! corrupt headers, every truncation and byte flips (tests/gguf.rs);
//! a missing model, a non-model file, ids outside SmolLM2's vocabulary and a
//! prompt longer than `--ctx` as text, flag conflicts (tests/cli.rs).
//!
//! Accepted on purpose (documented, tested as accepted): NaN or infinite
//! values inside weight matrices and quantized block scales. Finding them
//! would cost a pass over every weight at load; they give wrong text, never a
//! crash. Non-finite norm weights are refused (they are few values); a
//! quantized norm weight is dequantized at load like any other.

mod common;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use vkllm::model::gguf::{GgufFile, GgufValue};
use vkllm::model::gguf_write::GgufWriter;
use vkllm::DType;

/// What a case expects of the run.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Exit 1, one `error: ...` line containing every needle.
    Fails(&'static [&'static str]),
    /// Exit 2 (clap), one `error:` line containing every needle.
    Usage(&'static [&'static str]),
    /// Runs to the end (exit 0): a documented acceptance.
    Accepted,
}
use Expect::*;

/// The model a case runs on, made fresh in the case's tempdir.
#[derive(Clone, Copy)]
enum Input {
    /// No model file (flags only); `{model}` is the valid tiny GGUF.
    Plain,
    /// The tiny GGUF rebuilt after an edit of its metadata and tensors.
    Gguf(fn(&mut Gguf)),
    /// The tiny GGUF's bytes patched.
    GgufBytes(fn(&mut Vec<u8>)),
    /// The tiny Llama HF directory after an edit of its files.
    Hf(fn(&Path)),
}
use Input::*;

struct Case {
    name: &'static str,
    input: Input,
    /// Arguments; `{model}` is the case's model path, `{dir}` its tempdir.
    args: &'static str,
    expect: Expect,
}

const fn case(name: &'static str, input: Input, args: &'static str, expect: Expect) -> Case {
    Case {
        name,
        input,
        args,
        expect,
    }
}

/// The table. Cases run on the CPU backend unless they say otherwise.
// One case per row, so the table reads as documentation.
#[rustfmt::skip]
fn table() -> Vec<Case> {
    vec![
        // ---- GGUF: container damage, seen through each subcommand
        case("gguf empty file", GgufBytes(|b| b.clear()), "generate -b cpu -m {model} -p hi",
            Fails(&["not a valid GGUF file", "unexpected end of file"])),
        case("gguf bad magic", GgufBytes(|b| b[..4].copy_from_slice(b"GGML")), "info -m {model}",
            Fails(&["bad magic"])),
        case("gguf truncated in the header", GgufBytes(|b| b.truncate(40)), "tokenize -m {model} --text hi",
            Fails(&["not a valid GGUF file"])),
        case("gguf truncated in the tensor data", GgufBytes(|b| b.truncate(b.len() - 1000)), "logits -b cpu -m {model} --prompt-ids 1,2",
            Fails(&["runs past the end of the file"])),
        case("gguf impossible tensor count", GgufBytes(|b| put_u64(b, 8, 1 << 60)), "bench -b cpu -m {model} -p 4 -n 2 -r 1 --copy-mib 0",
            Fails(&["tensor count", "impossible"])),
        case("gguf tensor offset past the end", GgufBytes(|b| { let at = tensor_offset_at(b, "output_norm.weight"); put_u64(b, at, 1 << 40) }), "generate -b cpu -m {model} -p hi",
            Fails(&["output_norm.weight", "past the end"])),
        case("gguf overlapping tensors", GgufBytes(|b| { let at = tensor_offset_at(b, "blk.0.attn_k.weight"); put_u64(b, at, 0) }), "generate -b cpu -m {model} -p hi",
            Fails(&["overlap"])),
        // ---- GGUF: model metadata
        case("gguf unknown architecture", Gguf(|g| g.set("general.architecture", s("mamba9"))), "generate -b cpu -m {model} -p hi",
            Fails(&["mamba9"])),
        case("gguf no architecture", Gguf(|g| g.remove("general.architecture")), "generate -b cpu -m {model} -p hi",
            Fails(&["general.architecture"])),
        case("gguf no block count", Gguf(|g| g.remove("llama.block_count")), "generate -b cpu -m {model} -p hi",
            Fails(&["llama.block_count"])),
        case("gguf zero heads", Gguf(|g| g.set("llama.attention.head_count", GgufValue::U32(0))), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["head"])),
        case("gguf kv heads not dividing heads", Gguf(|g| g.set("llama.attention.head_count_kv", GgufValue::U32(3))), "generate -b cpu -m {model} -p hi",
            Fails(&["head"])),
        case("gguf embedding length contradicts the tensors", Gguf(|g| g.set("llama.embedding_length", GgufValue::U32(128))), "generate -b cpu -m {model} -p hi",
            Fails(&["token_embd.weight"])),
        case("gguf metadata of the wrong type", Gguf(|g| g.set("llama.block_count", s("two"))), "generate -b cpu -m {model} -p hi",
            Fails(&["llama.block_count", "string"])),
        case("gguf missing tensor", Gguf(|g| g.drop_tensor("blk.1.ffn_down.weight")), "generate -b cpu -m {model} -p hi",
            Fails(&["blk.1.ffn_down.weight"])),
        case("gguf tensor of the wrong shape", Gguf(|g| g.reshape("blk.0.attn_q.weight", &[256, 128])), "generate -b cpu -m {model} -p hi",
            Fails(&["blk.0.attn_q.weight"])),
        case("gguf norm of the wrong length", Gguf(|g| g.reshape("blk.0.attn_norm.weight", &[128])), "generate -b cpu -m {model} -p hi",
            Fails(&["blk.0.attn_norm.weight"])),
        case("gguf norm stored as a 2-D matrix of its values (accepted)", Gguf(|g| g.reshape("output_norm.weight", &[128, 2])), "logits -b cpu -m {model} --prompt-ids 1",
            Accepted),
        case("gguf integer type for a weight", GgufBytes(|b| { let at = tensor_offset_at(b, "blk.0.attn_q.weight"); b[at - 4..at].copy_from_slice(&26u32.to_le_bytes()) }), "generate -b cpu -m {model} -p hi",
            Fails(&["blk.0.attn_q.weight"])),
        case("gguf quantized norm weight (accepted: dequantized at load)", Gguf(|g| g.retype("output_norm.weight", DType::Q8_0)), "logits -b cpu -m {model} --prompt-ids 1",
            Accepted),
        case("gguf NaN in a norm weight", Gguf(|g| g.poison_f32("output_norm.weight", f32::NAN)), "generate -b cpu -m {model} -p hi",
            Fails(&["output_norm.weight", "non-finite"])),
        case("gguf infinity in a norm weight", Gguf(|g| g.poison_f32("blk.1.ffn_norm.weight", f32::INFINITY)), "generate -b cpu -m {model} -p hi",
            Fails(&["blk.1.ffn_norm.weight", "non-finite"])),
        case("gguf NaN inside a weight matrix (accepted)", Gguf(|g| g.poison_f16("blk.0.ffn_up.weight")), "generate -b cpu -m {model} -p hi -n 2",
            Accepted),
        // ---- GGUF: tokenizer and chat template
        case("gguf no token list", Gguf(|g| g.remove("tokenizer.ggml.tokens")), "tokenize -m {model} --text hi",
            Fails(&["tokenizer.ggml.tokens"])),
        case("gguf unknown tokenizer model", Gguf(|g| g.set("tokenizer.ggml.model", s("nonsense"))), "tokenize -m {model} --text hi",
            Fails(&["nonsense"])),
        case("gguf token types shorter than tokens", Gguf(|g| g.set("tokenizer.ggml.token_type", GgufValue::Array(vec![GgufValue::I32(1); 3]))), "tokenize -m {model} --text hi",
            Fails(&["token_type"])),
        case("gguf BOS id outside the vocabulary", Gguf(|g| g.set("tokenizer.ggml.bos_token_id", GgufValue::U32(999_999))), "tokenize -m {model} --text hi",
            Fails(&["tokenizer.ggml.bos_token_id 999999", "outside the vocabulary"])),
        case("gguf chat template that raises", Gguf(|g| g.set("tokenizer.chat_template", s("{{ raise_exception('roles must alternate') }}"))), "generate -b cpu -m {model} --chat -p hi",
            Fails(&["chat template", "roles must alternate"])),
        case("gguf chat template with a syntax error", Gguf(|g| g.set("tokenizer.chat_template", s("{% for m in messages %}{{ m.content }"))), "generate -b cpu -m {model} --chat -p hi",
            Fails(&["chat template"])),
        case("gguf no chat template", Plain, "generate -b cpu -m {model} --chat -p hi",
            Fails(&["no chat template"])),
        // ---- Hugging Face directories
        case("hf no config.json", Hf(|d| rm(d, "config.json")), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["config.json"])),
        case("hf config.json not JSON", Hf(|d| write(d, "config.json", "{\"model_type\": ")), "info -m {model}",
            Fails(&["config.json"])),
        case("hf config without hidden_size", Hf(|d| edit_config(d, |c| { c.as_object_mut().unwrap().remove("hidden_size"); })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["hidden_size"])),
        case("hf unknown model_type", Hf(|d| edit_config(d, |c| { c["model_type"] = json!("mamba9"); c["architectures"] = json!(["Mamba9ForCausalLM"]); })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["mamba9"])),
        case("hf kv heads not dividing heads", Hf(|d| edit_config(d, |c| { c["num_key_value_heads"] = json!(3); })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["head"])),
        case("hf vocab_size contradicts the embedding", Hf(|d| edit_config(d, |c| { c["vocab_size"] = json!(1000); })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["token_embd.weight", "expected [1000, 64]"])),
        case("hf hidden_size of the wrong type", Hf(|d| edit_config(d, |c| { c["hidden_size"] = json!("64"); })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["hidden_size"])),
        case("hf no safetensors", Hf(|d| rm(d, "model.safetensors")), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["safetensors"])),
        case("hf safetensors truncated", Hf(|d| edit_bytes(d, "model.safetensors", |b| b.truncate(b.len() / 2))), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["model.safetensors", "truncated"])),
        case("hf safetensors header length huge", Hf(|d| edit_bytes(d, "model.safetensors", |b| put_u64(b, 0, u64::MAX))), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["model.safetensors", "header length"])),
        case("hf safetensors header not JSON", Hf(|d| edit_bytes(d, "model.safetensors", |b| b[8] = b'#')), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["model.safetensors"])),
        case("hf tensor offsets past the data", Hf(|d| edit_header(d, |h| { h["model.norm.weight"]["data_offsets"] = json!([0, 1 << 30]); })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["model.safetensors", "offsets"])),
        case("hf overlapping tensors", Hf(|d| edit_header(d, |h| { let o = h["model.norm.weight"]["data_offsets"].clone(); h["model.layers.0.input_layernorm.weight"]["data_offsets"] = o; })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["model.safetensors"])),
        case("hf integer dtype for a weight", Hf(|d| edit_header(d, |h| { h["model.norm.weight"]["dtype"] = json!("I32"); })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["model.norm.weight"])),
        case("hf shape contradicts the data", Hf(|d| edit_header(d, |h| { h["model.norm.weight"]["shape"] = json!([32]); })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["model.safetensors"])),
        case("hf missing tensor", Hf(|d| edit_header(d, |h| { let o = h.as_object_mut().unwrap(); let t = o.remove("model.layers.1.mlp.down_proj.weight").unwrap(); o.insert("model.layers.1.mlp.down_proj.renamed".into(), t); })), "logits -b cpu -m {model} --prompt-ids 1",
            Fails(&["down"])),
        case("hf no tokenizer.json", Hf(keep), "tokenize -m {model} --text hi",
            Fails(&["tokenizer.json"])),
        case("hf tokenizer.json not JSON", Hf(|d| write(d, "tokenizer.json", "{\"model\":")), "tokenize -m {model} --text hi",
            Fails(&["tokenizer.json"])),
        case("hf tokenizer.json of the wrong shape", Hf(|d| write(d, "tokenizer.json", "{\"model\": 5}")), "generate -b cpu -m {model} -p hi",
            Fails(&["tokenizer"])),
        case("hf tokenizer_config.json not JSON", Hf(|d| { write(d, "tokenizer.json", WORD_TOKENIZER); write(d, "tokenizer_config.json", "[") }), "tokenize -m {model} --text hi",
            Fails(&["tokenizer_config.json"])),
        case("hf chat template that raises", Hf(|d| { write(d, "tokenizer.json", WORD_TOKENIZER); write(d, "tokenizer_config.json", r#"{"chat_template": "{{ raise_exception('no system role') }}"}"#) }), "generate -b cpu -m {model} --chat -p hi -n 1",
            Fails(&["chat template", "no system role"])),
        case("hf ids outside the vocabulary", Hf(keep), "logits -b cpu -m {model} --prompt-ids 1,512",
            Fails(&["512"])),
        case("hf prompt longer than the context", Hf(keep), "logits -b cpu -m {model} --ctx 4 --prompt-ids 1,2,3,4,5",
            Fails(&["context"])),
        // ---- sampler and other flags
        case("negative temperature", Plain, "generate -b cpu -m {model} -p hi --temperature=-1",
            Usage(&["--temperature", "out of range"])),
        case("infinite temperature", Plain, "generate -b cpu -m {model} -p hi --temperature inf",
            Usage(&["--temperature", "not a finite number"])),
        case("top-p above 1", Plain, "generate -b cpu -m {model} -p hi --top-p 7",
            Usage(&["--top-p", "out of range"])),
        case("top-p NaN", Plain, "generate -b cpu -m {model} -p hi --top-p NaN",
            Usage(&["--top-p", "not a finite number"])),
        case("negative min-p", Plain, "generate -b cpu -m {model} -p hi --min-p=-0.5",
            Usage(&["--min-p", "out of range"])),
        case("zero repeat penalty", Plain, "generate -b cpu -m {model} -p hi --repeat-penalty 0",
            Usage(&["--repeat-penalty", "out of range"])),
        case("negative top-k", Plain, "generate -b cpu -m {model} -p hi --top-k=-1",
            Usage(&["--top-k"])),
        case("zero decode chunk", Plain, "generate -b cpu -m {model} -p hi --decode-chunk 0",
            Usage(&["--decode-chunk"])),
        case("zero context", Plain, "generate -b cpu -m {model} -p hi --ctx 0",
            Usage(&["--ctx"])),
        case("zero threads", Plain, "logits -b cpu -m {model} --prompt-ids 1 -t 0",
            Usage(&["--threads"])),
        case("unknown backend", Plain, "generate -b tpu -m {model} -p hi",
            Usage(&["tpu"])),
        case("empty prompt ids", Plain, "logits -b cpu -m {model} --prompt-ids ,",
            Usage(&["no token ids"])),
        case("negative prompt id", Plain, "logits -b cpu -m {model} --prompt-ids=-1",
            Usage(&["'-1' is not a token id"])),
        case("gguf ids outside the vocabulary", Plain, "generate -b cpu -m {model} --prompt-ids 5,1024",
            Fails(&["1024"])),
        case("gguf prompt longer than the context", Plain, "generate -b cpu -m {model} --ctx 3 --prompt-ids 1,2,3,4",
            Fails(&["context"])),
        case("context too large for host memory", Plain, "generate -b cpu -m {model} -p hi --ctx 100000000000",
            Fails(&["out of host memory", "KV cache of 100000000000 positions", "needs", "available"])),
        case("f16 KV cache on the CPU", Plain, "generate -b cpu -m {model} -p hi --kv-cache f16",
            Fails(&["f16"])),
        case("profile into a missing directory", Plain, "generate -b cpu -m {model} -p hi -n 1 --profile {dir}/no/such/dir/trace.json",
            Fails(&["no/such/dir"])),
        case("json schema file missing", Plain, "generate -b cpu -m {model} -p hi --json-schema {dir}/no-such.json",
            Fails(&["cannot read", "no-such.json"])),
        case("grammar file not text", Plain, "generate -b cpu -m {model} -p hi --grammar {model}",
            Fails(&["cannot read", "UTF-8"])),
        case("json schema and grammar together", Plain, "generate -b cpu -m {model} -p hi --json-schema a.json --grammar b.lark",
            Usage(&["cannot be used with"])),
        case("tokenize without text", Plain, "tokenize -m {model}",
            Usage(&["required arguments"])),
        case("bench zero repetitions", Plain, "bench -b cpu -m {model} -r 0",
            Usage(&["--repetitions"])),
        case("bench copy probe past usize", Plain, "bench -b cpu -m {model} -p 0 -n 1 -r 1 --copy-mib 18446744073709551615",
            Fails(&["--copy-mib", "too large"])),
        case("bench of a missing model", Plain, "bench -b cpu -m {dir}/missing.gguf -p 4 -n 2 -r 1 --copy-mib 0",
            Fails(&["missing.gguf"])),
        case("chat without a chat template", Plain, "chat -b cpu -m {model}",
            Fails(&["no chat template"])),
        case("chat negative temperature", Plain, "chat -b cpu -m {model} --temperature=-1",
            Usage(&["--temperature", "out of range"])),
        case("chat of a truncated GGUF", GgufBytes(|b| b.truncate(100)), "chat -b cpu -m {model}",
            Fails(&["not a valid GGUF file"])),
        case("serve port out of range", Plain, "serve -b cpu -m {model} --port 70000",
            Usage(&["--port", "70000"])),
        case("serve of a truncated GGUF", GgufBytes(|b| b.truncate(100)), "serve -b cpu -m {model} --port 0",
            Fails(&["not a valid GGUF file"])),
        case("serve context too large for host memory", Plain, "serve -b cpu -m {model} --port 0 --ctx 100000000000",
            Fails(&["out of host memory", "needs", "available"])),
        case("serve on an address not of this host", Plain, "serve -b cpu -m {model} --host 192.0.2.1 --port 0",
            Fails(&["cannot listen on 192.0.2.1"])),
        case("serve zero connections", Plain, "serve -b cpu -m {model} --port 0 --max-connections 0",
            Usage(&["--max-connections must be at least 1"])),
        case("serve blank API key", Plain, "serve -b cpu -m {model} --port 0 --api-key=",
            Usage(&["--api-key must not be blank"])),
        case("serve missing API key file", Plain, "serve -b cpu -m {model} --port 0 --api-key-file {dir}/keys.txt",
            Fails(&["cannot read", "keys.txt"])),
        case("serve API key file that is a directory", Plain, "serve -b cpu -m {model} --port 0 --api-key-file {dir}",
            Fails(&["cannot read"])),
        case("synth unknown shape", Plain, "synth --shape llama-99b -o {dir}/x.gguf",
            Usage(&["llama-99b"])),
        case("synth into a missing directory", Plain, "synth --shape tiny -o {dir}/no/such/x.gguf",
            Fails(&["cannot write", "no/such", "does not exist"])),
        case("synth onto a directory", Plain, "synth --shape tiny -o {dir}",
            Fails(&["cannot write", "is a directory"])),
        case("convert a GGUF file", Plain, "convert {model} -o {dir}/out.gguf",
            Fails(&["tiny.gguf is not a directory"])),
        case("convert a broken HF directory", Hf(|d| rm(d, "config.json")), "convert {model} -o {dir}/out.gguf",
            Fails(&["config.json"])),
        case("convert into a missing directory", Hf(keep), "convert {model} -o {dir}/no/such/out.gguf",
            Fails(&["cannot write", "does not exist"])),
    ]
}

/// A vocabulary of two words and `<unk>`: the smallest tokenizer.json the
/// `tokenizers` crate loads, for cases that need a working HF tokenizer.
const WORD_TOKENIZER: &str = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"<unk>":0,"hi":1,"there":2},"unk_token":"<unk>"}}"#;

/// No edit: the valid tiny HF directory (flag cases on the HF format).
fn keep(_: &Path) {}

// ---- the runner

#[test]
fn every_bad_input_is_one_clear_error() {
    let cases = table();
    assert!(cases.len() >= 40, "the table has {} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        if let Err(why) = run_case(c) {
            failures.push(format!("{}: {why}", c.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn run_case(c: &Case) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let model = make_input(c.input, dir.path());
    let (model, d) = (
        model.display().to_string(),
        dir.path().display().to_string(),
    );
    let args: Vec<String> = c
        .args
        .split_whitespace()
        .map(|a| a.replace("{model}", &model).replace("{dir}", &d))
        .collect();
    let o = Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args(&args)
        .current_dir(dir.path())
        .output()
        .map_err(|e| e.to_string())?;
    // Shown with --nocapture: the messages themselves, for review.
    let err = String::from_utf8_lossy(&o.stderr);
    let first = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
    println!("{:<50} {first}", c.name);
    check(&o, c.expect).map_err(|why| format!("vkllm {}\n    {why}", args.join(" ")))
}

fn check(o: &Output, expect: Expect) -> Result<(), String> {
    let err = String::from_utf8_lossy(&o.stderr);
    let code = o.status.code();
    if err.contains("panicked") || err.contains("internal error") || err.contains("backtrace") {
        return Err(format!("panicked: {err}"));
    }
    let (want_code, needles) = match expect {
        Accepted => {
            return match code {
                Some(0) => Ok(()),
                _ => Err(format!("expected success, got {code:?}: {err}")),
            }
        }
        Fails(n) => (1, n),
        Usage(n) => (2, n),
    };
    if code != Some(want_code) {
        return Err(format!("exit {code:?}, expected {want_code}: {err}"));
    }
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    if errors.len() != 1 {
        return Err(format!("expected one error line: {err}"));
    }
    if want_code == 1 {
        // A runtime failure prints nothing else (the backend line aside).
        let other = err
            .lines()
            .filter(|l| !l.starts_with("error:") && !l.starts_with("backend:"))
            .count();
        if other > 0 {
            return Err(format!("more than the error line: {err}"));
        }
    }
    match needles.iter().find(|n| !errors[0].contains(*n)) {
        Some(n) => Err(format!("'{n}' not in: {}", errors[0])),
        None => Ok(()),
    }
}

fn make_input(input: Input, dir: &Path) -> PathBuf {
    match input {
        Plain => tiny_gguf().to_path_buf(),
        GgufBytes(edit) => {
            let mut bytes = std::fs::read(tiny_gguf()).unwrap();
            edit(&mut bytes);
            let path = dir.join("model.gguf");
            std::fs::write(&path, bytes).unwrap();
            path
        }
        Gguf(edit) => {
            let mut g = Gguf::read(tiny_gguf());
            edit(&mut g);
            let path = dir.join("model.gguf");
            g.write(&path);
            path
        }
        Hf(edit) => {
            let src = common::reference_dir().join("tiny").join("llama");
            let dst = dir.join("hf");
            std::fs::create_dir(&dst).unwrap();
            for f in ["config.json", "model.safetensors"] {
                std::fs::copy(src.join(f), dst.join(f))
                    .unwrap_or_else(|e| panic!("{}: {e}", src.join(f).display()));
            }
            edit(&dst);
            dst
        }
    }
}

/// The valid tiny GGUF every GGUF case starts from (made once per run).
fn tiny_gguf() -> &'static Path {
    static PATH: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &PATH
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tiny.gguf");
            let o = Command::new(env!("CARGO_BIN_EXE_vkllm"))
                .args(["synth", "--shape", "tiny", "--quant", "f16", "-o"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            (dir, path)
        })
        .1
}

// ---- GGUF edits

/// A GGUF as editable metadata and tensors.
struct Gguf {
    meta: Vec<(String, GgufValue)>,
    tensors: Vec<(String, Vec<u64>, DType, Vec<u8>)>,
}

fn s(text: &str) -> GgufValue {
    GgufValue::String(text.into())
}

impl Gguf {
    fn read(path: &Path) -> Gguf {
        let f = GgufFile::open(path).unwrap();
        Gguf {
            meta: f.metadata().to_vec(),
            tensors: f
                .tensors()
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        t.dims.clone(),
                        t.dtype,
                        f.tensor_data(t).to_vec(),
                    )
                })
                .collect(),
        }
    }
    fn write(&self, path: &Path) {
        let mut w = GgufWriter::new();
        for (k, v) in &self.meta {
            w.add(k, v.clone());
        }
        for (name, dims, dtype, data) in &self.tensors {
            w.add_tensor(name, dims, *dtype, data.clone()).unwrap();
        }
        w.write(path).unwrap();
    }
    fn set(&mut self, key: &str, v: GgufValue) {
        match self.meta.iter_mut().find(|(k, _)| k == key) {
            Some(e) => e.1 = v,
            None => self.meta.push((key.into(), v)),
        }
    }
    fn remove(&mut self, key: &str) {
        self.meta.retain(|(k, _)| k != key);
    }
    fn drop_tensor(&mut self, name: &str) {
        self.tensors.retain(|t| t.0 != name);
    }
    fn tensor(&mut self, name: &str) -> &mut (String, Vec<u64>, DType, Vec<u8>) {
        self.tensors
            .iter_mut()
            .find(|t| t.0 == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }
    /// New dims with data of the matching size (zeros).
    fn reshape(&mut self, name: &str, dims: &[u64]) {
        let t = self.tensor(name);
        let n: u64 = dims.iter().product();
        let bytes = t.2.row_bytes(n as usize).unwrap();
        t.1 = dims.to_vec();
        t.3 = vec![0; bytes];
    }
    /// Another element type, with data of the matching size (zeros).
    fn retype(&mut self, name: &str, dtype: DType) {
        let t = self.tensor(name);
        let n: u64 = t.1.iter().product();
        t.2 = dtype;
        t.3 = vec![0; dtype.row_bytes(n as usize).unwrap()];
    }
    fn poison_f32(&mut self, name: &str, x: f32) {
        let t = self.tensor(name);
        assert_eq!(t.2, DType::F32, "{name}");
        t.3[4..8].copy_from_slice(&x.to_le_bytes());
    }
    fn poison_f16(&mut self, name: &str) {
        let t = self.tensor(name);
        assert_eq!(t.2, DType::F16, "{name}");
        // f16 NaN and +inf among the first values.
        t.3[..4].copy_from_slice(&[0x00, 0x7E, 0x00, 0x7C]);
    }
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Byte position of the data-offset field of tensor `name`'s info record
/// (name, n_dims, dims, type, offset).
fn tensor_offset_at(b: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let start = b
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap_or_else(|| panic!("no tensor info for {name}"));
    let at = start + needle.len();
    let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
    at + 4 + 8 * n_dims + 4
}

// ---- HF edits

fn rm(d: &Path, f: &str) {
    std::fs::remove_file(d.join(f)).unwrap();
}

fn write(d: &Path, f: &str, text: &str) {
    std::fs::write(d.join(f), text).unwrap();
}

fn edit_config(d: &Path, edit: fn(&mut Value)) {
    let path = d.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

fn edit_bytes(d: &Path, f: &str, edit: fn(&mut Vec<u8>)) {
    let path = d.join(f);
    let mut b = std::fs::read(&path).unwrap();
    edit(&mut b);
    std::fs::write(path, b).unwrap();
}

/// Rewrites model.safetensors' JSON header; tensor offsets are relative to
/// the data, so the data stays valid whatever the header's new length.
fn edit_header(d: &Path, edit: fn(&mut Value)) {
    let path = d.join("model.safetensors");
    let b = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let mut h: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    edit(&mut h);
    let text = h.to_string();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&b[8 + n..]);
    std::fs::write(path, out).unwrap();
}

/// The Vulkan twin of "context too large for host memory": the KV cache is
/// checked against the device heap before anything is allocated.
#[test]
fn context_too_large_for_device_memory_is_one_line() {
    if common::vulkan().is_none() {
        return;
    }
    let m = tiny_gguf().display().to_string();
    let args = [
        "generate",
        "-b",
        "vulkan",
        "-m",
        &m,
        "-p",
        "hi",
        "--ctx",
        "100000000000",
    ];
    let o = Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args(args)
        .output()
        .unwrap();
    let needles = &["out of device memory", "KV cache", "needs", "available"];
    if let Err(why) = check(&o, Fails(needles)) {
        panic!("vkllm {}: {why}", args.join(" "));
    }
}
