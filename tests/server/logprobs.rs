//! Log-probabilities (`logprobs`, `top_logprobs`, `echo`): equal to the
//! log-softmax of the model's logits computed here directly, the same
//! streamed or not, alone or batched with other requests; bad values 400.

use crate::common;
use crate::http::post;
use crate::{start_with, Server};
use serde_json::{json, Value};
use vkllm::model::source::ModelSource;
use vkllm::model::tokenizer::Tokenizer;
use vkllm::model::{LoadOptions, Model, Output, Want};

const TOL: f64 = 1e-4;

fn addr(s: &Server) -> String {
    s.base
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string()
}

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
    l.iter().map(|&x| x as f64 - lse).collect()
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as u32
}

/// The model and tokenizer the server serves, loaded here.
fn local() -> (Model, Tokenizer) {
    let path = common::smollm2();
    let tok = ModelSource::open(&path).unwrap().tokenizer().unwrap();
    let opts = LoadOptions {
        context: Some(1024),
        ..LoadOptions::default()
    };
    (common::load_model(common::cpu(), &path, &opts), tok)
}

/// The whole body of a streamed request: each `data:` chunk's JSON.
fn chunks(a: &str, path: &str, body: &Value) -> Vec<Value> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let mut r = post(a, path, &body.to_string());
    assert_eq!(r.status, 200);
    let mut out = Vec::new();
    while let Some(d) = r.next_data() {
        if d == "[DONE]" {
            break;
        }
        out.push(serde_json::from_str(&d).unwrap());
    }
    out
}

/// The legacy `logprobs` of streamed chunks, joined.
fn joined_legacy(chunks: &[Value]) -> Value {
    let mut all =
        json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for c in chunks {
        let lp = &c["choices"][0]["logprobs"];
        for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            if let Some(v) = lp[k].as_array() {
                all[k].as_array_mut().unwrap().extend(v.iter().cloned());
            }
        }
    }
    all
}

/// Checks a legacy `logprobs` object of greedy tokens after `prompt`
/// against logits computed here.
fn check_greedy(model: &mut Model, tok: &Tokenizer, prompt: &[u32], lp: &Value, k: usize) {
    let tokens = lp["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty(), "{lp}");
    // The prompt, then one token at a time, as the server evaluates them.
    model.reset();
    let mut l = model.logits(prompt).unwrap();
    for (i, t) in tokens.iter().enumerate() {
        if i > 0 {
            l = model.logits(&[argmax(&l)]).unwrap();
        }
        let want = log_softmax(&l);
        let id = argmax(&l);
        assert_eq!(t.as_str(), tok.token_text(id).as_deref(), "token {i}: {lp}");
        let got = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(
            (got - want[id as usize]).abs() < TOL,
            "token {i}: {got} vs {}",
            want[id as usize]
        );
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert!(top.len() <= k && !top.is_empty(), "{top:?}");
        let mut vals: Vec<f64> = top.values().map(|v| v.as_f64().unwrap()).collect();
        vals.sort_by(|a, b| b.total_cmp(a));
        // The greedy token is the most likely one.
        assert!((vals[0] - got).abs() < 1e-9, "{top:?} vs {got}");
        let mut sorted = want.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        for (v, w) in vals.iter().zip(&sorted) {
            assert!((v - w).abs() < TOL, "{i}: {vals:?} vs {:?}", &sorted[..k]);
        }
    }
}

#[test]
fn logprobs_equal_log_softmax_of_the_logits_streamed_batched_and_echoed() {
    let s = start_with(&["--parallel", "4", "-t", "1"], &[]);
    let a = addr(&s);
    let (mut model, tok) = local();

    // Completions: greedy tokens' scores against the logits here.
    let text = "The capital of France is";
    let prompt = tok.encode(text, tok.add_bos_by_default()).unwrap();
    let req = json!({"prompt": text, "max_tokens": 6, "temperature": 0, "logprobs": 5});
    let alone = post(&a, "/v1/completions", &req.to_string()).json();
    let lp = &alone["choices"][0]["logprobs"];
    check_greedy(&mut model, &tok, &prompt, lp, 5);
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], text.chars().count() as u64, "{lp}");
    assert_eq!(joined_legacy(&chunks(&a, "/v1/completions", &req)), *lp);

    // Batched with others (sampled, plain greedy): the same answer.
    let other =
        json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.9, "seed": 3});
    let greedy = json!({"prompt": "Hello", "max_tokens": 12, "temperature": 0});
    let answers: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = [&req, &other, &greedy, &req]
            .map(|r| {
                let a = a.clone();
                sc.spawn(move || post(&a, "/v1/completions", &r.to_string()).json())
            })
            .into_iter()
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for v in [&answers[0], &answers[3]] {
        assert_eq!(v["choices"][0]["logprobs"], *lp);
        assert_eq!(v["choices"][0]["text"], alone["choices"][0]["text"]);
    }
    assert!(answers[1]["choices"][0]["logprobs"].is_null());

    // Chat: OpenAI's shape, the greedy token first among the alternatives,
    // the same streamed.
    let chat = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0, "max_tokens": 8, "logprobs": true, "top_logprobs": 3});
    let v = post(&a, "/v1/chat/completions", &chat.to_string()).json();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    let joined: String = content
        .iter()
        .map(|c| c["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        joined,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
    for c in &content {
        let top = c["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{c}");
        assert_eq!(top[0]["token"], c["token"]);
        assert_eq!(top[0]["logprob"], c["logprob"]);
        assert_eq!(top[0]["bytes"], c["bytes"]);
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(
            lps.windows(2).all(|w| w[0] >= w[1]) && lps[0] <= 0.0,
            "{lps:?}"
        );
    }
    let streamed: Vec<Value> = chunks(&a, "/v1/chat/completions", &chat)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed, content);

    // Echo: a prompt longer than one prefill chunk (512), once cached by
    // another request, scored from its second token on.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(60);
    let ids = tok.encode(&long, tok.add_bos_by_default()).unwrap();
    assert!(ids.len() > 512 && ids.len() < 1000, "{}", ids.len());
    let warm = json!({"prompt": long, "max_tokens": 1});
    assert_eq!(post(&a, "/v1/completions", &warm.to_string()).status, 200);
    let echo = json!({"prompt": long, "max_tokens": 0, "echo": true, "logprobs": 1});
    let v = post(&a, "/v1/completions", &echo.to_string()).json();
    assert_eq!(v["choices"][0]["text"], long.as_str());
    let lp = &v["choices"][0]["logprobs"];
    model.reset();
    let Output::Logits(rows) = model.forward(&ids, Want::AllLogits).unwrap() else {
        panic!("no logits")
    };
    let vocab = rows.len() / ids.len();
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len());
    for (j, row) in rows.chunks_exact(vocab).take(ids.len() - 1).enumerate() {
        let want = log_softmax(row)[ids[j + 1] as usize];
        let got = lp["token_logprobs"][j + 1].as_f64().unwrap();
        assert!(
            (got - want).abs() < TOL,
            "prompt token {}: {got} vs {want}",
            j + 1
        );
        assert_eq!(
            lp["tokens"][j + 1].as_str(),
            tok.token_text(ids[j + 1]).as_deref()
        );
    }
    let streamed = joined_legacy(&chunks(&a, "/v1/completions", &echo));
    assert_eq!(streamed, *lp);

    // Bad values.
    for (path, body, field) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 0, "logprobs": 1}),
            "max_tokens",
        ),
    ] {
        let r = post(&a, path, &body.to_string());
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"], field, "{body}");
    }
}
