//! The real Gemma 3 270M Q4_K_M GGUF (made by llama.cpp's converter, fetched
//! by scripts/fetch-gemma3.sh) against two stored references: llama.cpp's CPU
//! backend (tests/data/gemma3_llamacpp.json, scripts/gemma3-llamacpp-fixture.py)
//! and the exact math, a numpy float64 transcription of Gemma 3 on the same
//! dequantized weights (tests/data/gemma3_f64.json,
//! scripts/gemma3-f64-reference.py). Tokenization, teacher-forced next-token
//! agreement on a 407-token text (CPU and Vulkan: on lavapipe the 189 MB
//! embedding / tied output head exceeds the 128 MiB binding range and is
//! split), greedy generation and the chat template. Skipped, with a note,
//! when the file has not been fetched.
//!
//! llama.cpp's CPU matmuls quantize activations to 8 bits (and its KV cache
//! is f16): measured against the float64 math, at its top-5 ids, its logits
//! move by 0.20 on average and up to 4.21 (a confident digit: 32.4 where the
//! math gives 29.4), and its argmax differs at 27 of 407 positions. Ours
//! (16-bit CPU activations, f32 on Vulkan) stay within 0.002 of the math, so
//! the bounds against llama.cpp are llama.cpp's own error, with margin. A GPU
//! with cooperative matrices also runs its default f16 prefill kernels
//! (within 0.044 of the math on an H100).

mod common;

use serde_json::Value;
use std::ops::ControlFlow;
use vkllm::cpu::{ActivationPrecision, CpuBackend};
use vkllm::model::generate::{generate, prompt_ids, GenerateOptions, Prompt};
use vkllm::model::gguf::GgufFile;
use vkllm::model::tokenizer::Tokenizer;
use vkllm::model::{LoadOptions, Output, Want};
use vkllm::DType;

/// Against the float64 math, at llama.cpp's top-5 ids of every position:
/// largest |Δlogit| (logits reach 32; measured 0.0006 on the CPU, 0.0013 on
/// lavapipe) ...
const EXACT_TOL: f32 = 0.01;
/// ... and for a device whose default prefill kernels round matmul inputs,
/// Q and the probabilities to f16 on cooperative matrices (measured 0.0437
/// on an H100, top-1 407/407).
const F16_TOL: f32 = 0.1;
/// ... and for CPU prefill on its default 16-bit activations (each block of
/// 32 inputs rounded to 2⁻¹⁶ of its largest value, as CPU decode does;
/// measured 0.0308 at position 119, top-1 407/407); exact f32 activations
/// keep EXACT_TOL.
const Q16_TOL: f32 = 0.1;
/// ... and the share of positions with the same argmax (a near-tie may swap).
const EXACT_MIN_TOP1: f64 = 0.99;
/// Against llama.cpp: largest |Δlogit| (its own error is up to 4.21), mean
/// |Δlogit| (its own: 0.20) and top-1 agreement (its own: 93.4%).
const LLAMACPP_TOL: f32 = 5.0;
const LLAMACPP_MEAN_TOL: f64 = 0.3;
const LLAMACPP_MIN_TOP1: f64 = 0.92;
/// Positions per forward pass: Vulkan's logits buffer (rows × 262,144 f32)
/// must stay within lavapipe's 128 MiB binding range.
const CHUNK: usize = 64;

fn data(file: &str) -> Value {
    let path = common::root().join("tests/data").join(file);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn fixture() -> Value {
    data("gemma3_llamacpp.json")
}

fn exact() -> Value {
    data("gemma3_f64.json")
}

fn floats(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn tokenizer(path: &std::path::Path) -> Tokenizer {
    Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap()
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

#[test]
fn tokenization_matches_llama_cpp() {
    let Some(path) = common::gemma3() else {
        return;
    };
    let tok = tokenizer(&path);
    let f = fixture();
    let cases = f["tokenize"].as_array().unwrap();
    assert!(cases.len() >= 8);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let got = tok.encode(text, tok.add_bos_by_default()).unwrap();
        assert_eq!(got, ids(&c["ids"]), "tokenizing {text:?}");
    }
    // The long text of the teacher-forced test too (407 ids).
    let t = &f["teacher"];
    let got = tok
        .encode(t["text"].as_str().unwrap(), tok.add_bos_by_default())
        .unwrap();
    assert_eq!(got, ids(&t["ids"]), "tokenizing the long text");
}

/// How one engine's logits compare with a reference's at its top ids.
#[derive(Default)]
struct Agreement {
    same_top1: usize,
    max_diff: f32,
    worst: usize,
    sum_diff: f64,
    n_diff: usize,
}

impl Agreement {
    fn add(&mut self, p: usize, row: &[f32], top1: u32, ids: &[u32], logits: &[f32]) {
        if argmax(row) as u32 == top1 {
            self.same_top1 += 1;
        }
        for (id, want) in ids.iter().zip(logits) {
            let d = (row[*id as usize] - want).abs();
            self.sum_diff += f64::from(d);
            self.n_diff += 1;
            if d > self.max_diff {
                (self.max_diff, self.worst) = (d, p);
            }
        }
    }
    fn rate(&self, n: usize) -> f64 {
        self.same_top1 as f64 / n as f64
    }
    fn mean(&self) -> f64 {
        self.sum_diff / self.n_diff.max(1) as f64
    }
    fn report(&self, name: &str, against: &str, n: usize) -> String {
        format!(
            "gemma3 {name} vs {against}: top-1 {}/{n} = {:.4}, max |Δlogit| {:.4} (position {}), mean {:.4}",
            self.same_top1,
            self.rate(n),
            self.max_diff,
            self.worst,
            self.mean()
        )
    }
}

/// Teacher forcing on `be`: agreement with llama.cpp and with the exact math
/// (largest |Δlogit| `exact_tol`).
fn check_teacher(name: &str, be: Box<dyn vkllm::ComputeBackend>, exact_tol: f32) {
    let path = common::gemma3().unwrap();
    let (f, x) = (fixture(), exact());
    let t = &f["teacher"];
    let input = ids(&t["ids"]);
    let n = input.len();
    assert!(n >= 400);
    let top_ids: Vec<Vec<u32>> = t["top_ids"].as_array().unwrap().iter().map(ids).collect();
    let top_logits = floats(&t["top_logits"]);
    let exact_top1 = ids(&x["teacher"]["argmax"]);
    let exact_logits = floats(&x["teacher"]["logits_at_llamacpp_top"]);
    assert_eq!((top_ids.len(), exact_logits.len()), (n, n));
    // An f32 KV cache, so the bound holds the kernels to the exact math.
    // Vulkan's default f16 cache adds its own rounding (max |Δlogit| 0.0104
    // against the float64 reference, 0.0013 with f32);
    // `greedy_matches_the_math_and_llama_cpp` runs on the default and keeps
    // every token.
    let opts = LoadOptions {
        context: Some(n + 8),
        max_batch: Some(CHUNK),
        kv_cache: Some(DType::F32),
        ..Default::default()
    };
    let mut model = vkllm::open::load(vec![be], &path, &opts, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .model;
    let vocab = model.config().vocab;
    let (mut vs_llama, mut vs_exact) = (Agreement::default(), Agreement::default());
    for (c, chunk) in input.chunks(CHUNK).enumerate() {
        let Output::Logits(l) = model.forward(chunk, Want::AllLogits).unwrap() else {
            panic!("{name}: no logits");
        };
        for (r, row) in l.chunks(vocab).enumerate() {
            let p = c * CHUNK + r;
            vs_llama.add(p, row, top_ids[p][0], &top_ids[p], &top_logits[p]);
            vs_exact.add(p, row, exact_top1[p], &top_ids[p], &exact_logits[p]);
        }
    }
    let lines = [
        vs_llama.report(name, "llama.cpp", n),
        vs_exact.report(name, "float64", n),
    ];
    println!("{}", lines.join("\n"));
    assert!(vs_exact.max_diff <= exact_tol, "{}", lines[1]);
    assert!(vs_exact.rate(n) >= EXACT_MIN_TOP1, "{}", lines[1]);
    assert!(vs_llama.max_diff <= LLAMACPP_TOL, "{}", lines[0]);
    assert!(vs_llama.mean() <= LLAMACPP_MEAN_TOL, "{}", lines[0]);
    assert!(vs_llama.rate(n) >= LLAMACPP_MIN_TOP1, "{}", lines[0]);
}

#[test]
fn teacher_forced_agreement_cpu() {
    if common::gemma3().is_none() {
        return;
    }
    let exact = CpuBackend::new(None).with_activations(ActivationPrecision::F32);
    check_teacher("cpu f32", Box::new(exact), EXACT_TOL);
    check_teacher("cpu", common::cpu(), Q16_TOL);
}

#[test]
fn teacher_forced_agreement_vulkan() {
    if common::gemma3().is_none() {
        return;
    }
    let Some(be) = common::vulkan_exact() else {
        return;
    };
    check_teacher("vulkan", be, EXACT_TOL);
    // The default kernels, where they differ from the exact ones.
    if let Some(be) = common::vulkan_backend().filter(|b| b.kernels().matmul.is_coopmat()) {
        check_teacher("vulkan (f16 cooperative matrices)", Box::new(be), F16_TOL);
    }
}

/// Greedy ids after `prompt` on `be`.
fn greedy(
    be: Box<dyn vkllm::ComputeBackend>,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    let path = common::gemma3().unwrap();
    let opts = LoadOptions {
        context: Some(128),
        ..Default::default()
    };
    let mut model = common::load_model(be, &path, &opts);
    let opts = GenerateOptions {
        max_tokens: n,
        ..Default::default()
    };
    let r = generate(&mut model, tok, prompt, &opts, &mut |_, _| {
        ControlFlow::Continue(())
    })
    .unwrap();
    println!("gemma3 greedy: {:?} ({:?})", r.text, r.stop);
    r.tokens
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn greedy_matches_the_math_and_llama_cpp() {
    let Some(path) = common::gemma3() else {
        return;
    };
    let (f, x) = (fixture(), exact());
    let g = &f["greedy"];
    let tok = tokenizer(&path);
    let prompt = ids(&g["prompt_ids"]);
    assert_eq!(
        tok.encode(g["prompt"].as_str().unwrap(), true).unwrap(),
        prompt
    );
    let (llama, math) = (ids(&g["ids"]), ids(&x["greedy"]["ids"]));
    let mut backends = vec![("cpu", common::cpu())];
    backends.extend(common::vulkan().map(|b| ("vulkan", b)));
    for (name, be) in backends {
        let got = greedy(be, &tok, &prompt, llama.len());
        // " the capital of the country of France. It is the largest city in
        // France" and then llama.cpp's 8-bit activations pick ". It" where
        // the math picks " and".
        assert_eq!(got, math, "{name}: greedy ids against the float64 math");
        let same = common_prefix(&got, &llama);
        println!(
            "gemma3 {name} greedy: first {same} of {} ids equal llama.cpp's",
            llama.len()
        );
        assert!(same >= 15, "{name}: {got:?} vs llama.cpp {llama:?}");
    }
}

#[test]
fn chat_uses_gemmas_template() {
    let Some(path) = common::gemma3() else {
        return;
    };
    let (f, x) = (fixture(), exact());
    let c = &f["chat"];
    let tok = tokenizer(&path);
    // The file carries no tokenizer.chat_template: Gemma's own format applies,
    // giving the ids llama.cpp gives that format's text (one BOS, from the template).
    let prompt = prompt_ids(
        &tok,
        &Prompt::Chat {
            system: None,
            user: c["user"].as_str().unwrap(),
        },
    )
    .unwrap();
    assert_eq!(prompt, ids(&c["prompt_ids"]));
    let system = prompt_ids(
        &tok,
        &Prompt::Chat {
            system: Some("Be brief."),
            user: "Hi",
        },
    )
    .unwrap();
    let want = tok
        .encode(
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n",
            false,
        )
        .unwrap();
    assert_eq!(system, want, "a system message joins the first user turn");
    // This 270M file is the pretrained model, not the instruction-tuned one:
    // it repeats the question rather than answering, in llama.cpp too.
    let (llama, math) = (ids(&c["ids"]), ids(&x["chat"]["ids"]));
    let got = greedy(common::cpu(), &tok, &prompt, llama.len());
    assert_eq!(got, math, "greedy ids against the float64 math");
    let same = common_prefix(&got, &llama);
    println!(
        "gemma3 chat: first {same} of {} ids equal llama.cpp's",
        llama.len()
    );
    assert!(same >= 7, "{got:?} vs llama.cpp {llama:?}");
}
