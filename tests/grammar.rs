//! Structured output (`vkllm::model::grammar`): a tiny random model (the
//! tiny Llama reference converted to GGUF, which gives it a byte-level
//! vocabulary) sampled at temperature 1 under 20 JSON schemas, a
//! `json_object` constraint and Lark grammars; every output must validate
//! against its schema. A random model has no idea of JSON, so whatever
//! structure comes out is the mask's doing. The same on the continuous
//! batching engine, on lavapipe for a few, and bad schemas are refused.

mod common;

use std::ops::ControlFlow;
use std::path::PathBuf;
use vkllm::backend::ComputeBackend;
use vkllm::model::engine::{Engine, EngineOptions, Event, Request};
use vkllm::model::generate::{generate, GenerateOptions, StopReason};
use vkllm::model::grammar::{Constraint, GrammarSpec};
use vkllm::model::sampling::SamplerConfig;
use vkllm::model::tokenizer::Tokenizer;
use vkllm::model::{LoadOptions, Model};

/// The tiny Llama as GGUF (converted once per test; the file is small).
fn tiny_gguf(tmp: &tempfile::TempDir) -> PathBuf {
    let path = tmp.path().join("tiny-llama.gguf");
    let dir = common::reference_dir().join("tiny").join("llama");
    vkllm::model::convert::hf_to_gguf(&dir, &path, None).unwrap();
    path
}

fn load(be: Box<dyn ComputeBackend>, path: &std::path::Path) -> (Model, Tokenizer) {
    let loaded =
        vkllm::open::load(vec![be], path, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    (loaded.model, loaded.tokenizer.unwrap())
}

/// Temperature 1 with a fixed seed; no top-k/top-p/min-p cut, so the
/// random model's whole distribution over the allowed tokens is sampled.
fn sampled(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplerConfig::default()
    }
}

/// Twenty schemas: objects, nesting, arrays, enums, const, numeric ranges,
/// required and optional properties, string lengths and patterns, anyOf,
/// $ref, booleans and null. Strings are bounded: a random model would
/// otherwise write one for hundreds of tokens.
fn schemas() -> Vec<serde_json::Value> {
    use serde_json::json;
    let s = |n: u64| json!({"type": "string", "maxLength": n});
    vec![
        json!({"type": "object", "properties": {"name": s(8)}, "required": ["name"],
               "additionalProperties": false}),
        json!({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["age"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "none": {"type": "null"}},
               "required": ["ok", "none"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
               "required": ["color"], "additionalProperties": false}),
        json!({"type": "object", "properties": {"version": {"const": "1.0"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
               "required": ["version", "n"], "additionalProperties": false}),
        json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
               "minItems": 1, "maxItems": 4}),
        json!({"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 3}),
        json!({"type": "object", "properties": {
                  "point": {"type": "object", "properties": {
                      "x": {"type": "integer", "minimum": 0, "maximum": 99},
                      "y": {"type": "integer", "minimum": 0, "maximum": 99}},
                   "required": ["x", "y"], "additionalProperties": false}},
               "required": ["point"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                  "tags": {"type": "array", "items": s(4), "maxItems": 3}},
               "required": ["tags"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                  "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
               "required": ["code"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                  "word": {"type": "string", "minLength": 2, "maxLength": 5}},
               "required": ["word"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                  "a": {"type": "integer", "minimum": 0, "maximum": 9},
                  "b": {"type": "integer", "minimum": 0, "maximum": 9}},
               "required": ["a"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                  "value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 50}, {"type": "boolean"}]}},
               "required": ["value"], "additionalProperties": false}),
        json!({"$defs": {"pair": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2}},
               "type": "object", "properties": {"p": {"$ref": "#/$defs/pair"}, "q": {"$ref": "#/$defs/pair"}},
               "required": ["p", "q"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                  "level": {"type": "integer", "enum": [1, 2, 3]},
                  "label": {"enum": ["low", "mid", "high", null]}},
               "required": ["level", "label"], "additionalProperties": false}),
        json!({"type": "object", "properties": {
                  "items": {"type": "array", "maxItems": 2, "items": {
                      "type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}, "name": s(3)},
                      "required": ["id", "name"], "additionalProperties": false}}},
               "required": ["items"], "additionalProperties": false}),
        json!({"type": "boolean"}),
        json!({"type": "integer", "minimum": 10, "maximum": 20}),
        json!({"type": "string", "pattern": "^(yes|no|maybe)$"}),
        json!({"type": "object", "properties": {
                  "user": {"type": "object", "properties": {
                      "name": s(5),
                      "role": {"enum": ["admin", "guest"]},
                      "active": {"type": "boolean"}},
                   "required": ["name", "role", "active"], "additionalProperties": false},
                  "count": {"type": "integer", "minimum": 0, "maximum": 3}},
               "required": ["user", "count"], "additionalProperties": false}),
    ]
}

/// Generates under `spec` from a short prompt and returns the result.
fn run(
    model: &mut Model,
    tok: &Tokenizer,
    spec: GrammarSpec,
    seed: u64,
    max_tokens: usize,
) -> vkllm::model::generate::GenerateResult {
    let constraint = Constraint::new(tok, spec).unwrap();
    let opts = GenerateOptions {
        max_tokens,
        sampler: sampled(seed),
        constraint: Some(constraint),
        ..GenerateOptions::default()
    };
    let prompt = tok.encode("Answer in JSON:", false).unwrap();
    generate(model, tok, &prompt, &opts, &mut |_, _| {
        ControlFlow::Continue(())
    })
    .unwrap()
}

fn check_schema(
    what: &str,
    schema: &serde_json::Value,
    res: &vkllm::model::generate::GenerateResult,
) {
    assert_eq!(
        res.stop,
        StopReason::StopToken,
        "{what}: {:?} ended {:?}",
        res.text,
        res.stop
    );
    let value: serde_json::Value = serde_json::from_str(&res.text)
        .unwrap_or_else(|e| panic!("{what}: {:?} is not JSON: {e}", res.text));
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{what}: {value} fails its schema {schema}: {errors:?}"
    );
}

#[test]
fn twenty_schemas_sampled_at_temperature_one_validate() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut model, tok) = load(common::cpu(), &tiny_gguf(&tmp));
    for (i, schema) in schemas().iter().enumerate() {
        for seed in [1, 2] {
            let res = run(
                &mut model,
                &tok,
                GrammarSpec::JsonSchema(schema.clone()),
                seed,
                200,
            );
            check_schema(&format!("schema {i} seed {seed}"), schema, &res);
        }
    }
}

#[test]
fn json_object_is_an_object_and_a_seed_repeats() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut model, tok) = load(common::cpu(), &tiny_gguf(&tmp));
    // "Any object" leaves strings and nesting unbounded; a schema bounds
    // them here only to keep the random model's output short, the
    // json_object grammar itself is checked on SmolLM2 below.
    let a = run(&mut model, &tok, GrammarSpec::JsonObject, 5, 64);
    let b = run(&mut model, &tok, GrammarSpec::JsonObject, 5, 64);
    assert_eq!(a.tokens, b.tokens, "same seed, same output");
    assert!(a.text.trim_start().starts_with('{'), "{:?}", a.text);
    if a.stop == StopReason::StopToken {
        let v: serde_json::Value = serde_json::from_str(&a.text).unwrap();
        assert!(v.is_object(), "{v}");
    }
}

#[test]
fn json_object_on_smollm2_parses_as_an_object() {
    let opts = LoadOptions {
        context: Some(512),
        ..Default::default()
    };
    let loaded = vkllm::open::load(
        vec![common::cpu()],
        &common::smollm2(),
        &opts,
        &mut |_, _| {},
    )
    .unwrap();
    let (mut model, tok) = (loaded.model, loaded.tokenizer.unwrap());
    let prompt = vkllm::model::generate::render_chat_prompt(
        &tok,
        None,
        "Describe a cat as a JSON object with a name and an age.",
    )
    .unwrap();
    let prompt = tok.encode(&prompt, false).unwrap();
    for seed in [1, 2, 3] {
        let opts = GenerateOptions {
            max_tokens: 200,
            sampler: SamplerConfig {
                temperature: 1.0,
                seed,
                ..SamplerConfig::default()
            },
            constraint: Some(Constraint::new(&tok, GrammarSpec::JsonObject).unwrap()),
            ..GenerateOptions::default()
        };
        let res = generate(&mut model, &tok, &prompt, &opts, &mut |_, _| {
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(res.stop, StopReason::StopToken, "{:?}", res.text);
        let v: serde_json::Value = serde_json::from_str(&res.text)
            .unwrap_or_else(|e| panic!("{:?} is not JSON: {e}", res.text));
        assert!(v.is_object(), "{v}");
    }
}

#[test]
fn lark_grammar_and_regex_are_matched() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut model, tok) = load(common::cpu(), &tiny_gguf(&tmp));
    let lark = r#"
start: greeting " " name "!"
greeting: "hello" | "goodbye"
name: /[a-z]{1,6}/
"#;
    for seed in 0..6 {
        let res = run(&mut model, &tok, GrammarSpec::Lark(lark.into()), seed, 40);
        assert_eq!(res.stop, StopReason::StopToken, "{:?}", res.text);
        assert!(greeting(&res.text), "seed {seed}: {:?}", res.text);
        let res = run(
            &mut model,
            &tok,
            GrammarSpec::Regex("[0-9]{3}-[ab]".into()),
            seed,
            40,
        );
        assert_eq!(res.stop, StopReason::StopToken, "{:?}", res.text);
        let b = res.text.as_bytes();
        assert!(
            b.len() == 5
                && b[..3].iter().all(u8::is_ascii_digit)
                && b[3] == b'-'
                && (b[4] == b'a' || b[4] == b'b'),
            "seed {seed}: {:?}",
            res.text
        );
    }
}

/// Whether `s` matches `^(hello|goodbye) [a-z]{1,6}!$`.
fn greeting(s: &str) -> bool {
    let Some(rest) = s
        .strip_prefix("hello ")
        .or_else(|| s.strip_prefix("goodbye "))
    else {
        return false;
    };
    let Some(name) = rest.strip_suffix('!') else {
        return false;
    };
    (1..=6).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase())
}

#[test]
fn max_tokens_before_the_grammar_completes_ends_with_max_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut model, tok) = load(common::cpu(), &tiny_gguf(&tmp));
    let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}},
                                    "required": ["name"]});
    let res = run(&mut model, &tok, GrammarSpec::JsonSchema(schema), 1, 3);
    assert_eq!(res.stop, StopReason::MaxTokens);
    assert_eq!(res.tokens.len(), 3);
    assert!(res.text.starts_with('{'), "{:?}", res.text);
}

#[test]
fn bad_schemas_and_grammars_are_refused_with_a_message() {
    let tmp = tempfile::tempdir().unwrap();
    let (_model, tok) = load(common::cpu(), &tiny_gguf(&tmp));
    let cases = [
        (
            GrammarSpec::JsonSchema(serde_json::json!({"type": "no-such-type"})),
            "JSON schema",
        ),
        (
            GrammarSpec::JsonSchema(serde_json::json!({"$ref": "#/$defs/missing"})),
            "JSON schema",
        ),
        (
            GrammarSpec::Lark("start: undefined_rule".into()),
            "Lark grammar",
        ),
        (GrammarSpec::Lark("this is not lark".into()), "Lark grammar"),
    ];
    for (spec, words) in cases {
        let err = Constraint::new(&tok, spec.clone()).unwrap_err().to_string();
        assert!(err.contains(words), "{spec:?}: {err}");
    }
    // With ignore_eos the grammar could never end.
    let (mut model, _) = load(common::cpu(), &tiny_gguf(&tmp));
    let opts = GenerateOptions {
        ignore_eos: true,
        constraint: Some(Constraint::new(&tok, GrammarSpec::JsonObject).unwrap()),
        ..GenerateOptions::default()
    };
    let err = generate(&mut model, &tok, &[1, 2], &opts, &mut |_, _| {
        ControlFlow::Continue(())
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("ignore_eos"), "{err}");
}

/// The batching engine masks each row by its own request's grammar:
/// constrained and free requests side by side.
#[test]
fn the_engine_constrains_each_request_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let (model, tok) = load(common::cpu(), &tiny_gguf(&tmp));
    let all = schemas();
    let prompt = tok.encode("Answer in JSON:", false).unwrap();
    let mut engine = Engine::new(model, EngineOptions::default()).unwrap();
    let mut ids = Vec::new();
    for (i, schema) in all.iter().enumerate().take(6) {
        let req = Request {
            prompt: prompt.clone(),
            max_tokens: 200,
            sampler: sampled(i as u64),
            stop_ids: tok.stop_ids().to_vec(),
            ignore_eos: false,
            logprobs: None,
            echo_logprobs: false,
            constraint: Some(
                Constraint::new(&tok, GrammarSpec::JsonSchema(schema.clone())).unwrap(),
            ),
        };
        ids.push((engine.add(req).unwrap(), Some(schema.clone())));
    }
    let free = Request {
        prompt: prompt.clone(),
        max_tokens: 20,
        sampler: sampled(9),
        stop_ids: tok.stop_ids().to_vec(),
        ignore_eos: false,
        logprobs: None,
        echo_logprobs: false,
        constraint: None,
    };
    ids.push((engine.add(free).unwrap(), None));
    let mut tokens: std::collections::HashMap<_, Vec<u32>> = Default::default();
    let mut ends = std::collections::HashMap::new();
    while !engine.is_idle() {
        for e in engine.step().unwrap() {
            match e {
                Event::Token(id, t, _) => tokens.entry(id).or_default().push(t),
                Event::Finished(id, stop) => {
                    ends.insert(id, stop);
                }
                Event::Failed(id, err) => panic!("{id}: {err}"),
                Event::PromptLogprobs(..) => {}
            }
        }
    }
    for (id, schema) in ids {
        let Some(schema) = schema else { continue };
        let mut toks = tokens.remove(&id).unwrap();
        let stop = ends[&id];
        if stop == StopReason::StopToken {
            toks.pop();
        }
        let res = vkllm::model::generate::GenerateResult {
            text: tok.decode(&toks).unwrap(),
            tokens: toks,
            stop,
            timings: Default::default(),
        };
        check_schema(&format!("engine request {id}"), &schema, &res);
    }
}

#[test]
fn vulkan_schemas_validate() {
    let Some(vk) = common::vulkan() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (mut model, tok) = load(vk, &tiny_gguf(&tmp));
    for (i, schema) in schemas().iter().enumerate().step_by(4) {
        let res = run(
            &mut model,
            &tok,
            GrammarSpec::JsonSchema(schema.clone()),
            1,
            200,
        );
        check_schema(&format!("vulkan schema {i}"), schema, &res);
    }
    // Greedy too: the constrained path must not take the device argmax.
    let opts = GenerateOptions {
        max_tokens: 200,
        sampler: SamplerConfig::greedy(),
        constraint: Some(
            Constraint::new(&tok, GrammarSpec::JsonSchema(schemas()[7].clone())).unwrap(),
        ),
        ..GenerateOptions::default()
    };
    let prompt = tok.encode("Answer in JSON:", false).unwrap();
    let res = generate(&mut model, &tok, &prompt, &opts, &mut |_, _| {
        ControlFlow::Continue(())
    })
    .unwrap();
    check_schema("vulkan greedy", &schemas()[7], &res);
}

/// Greedy ids under `constraint` with the mask applied to the logits on
/// the host, step by step: what a device pick must reproduce.
fn host_masked_greedy(
    model: &mut Model,
    tok: &Tokenizer,
    prompt: &[u32],
    constraint: &Constraint,
    max_tokens: usize,
) -> Vec<u32> {
    use vkllm::model::runner::{Output, Want};
    model.reset();
    let mut g = constraint.matcher().unwrap();
    let mut ids = Vec::new();
    let mut input = prompt.to_vec();
    while ids.len() < max_tokens {
        let Output::Logits(mut l) = model.forward(&input, Want::LastLogits).unwrap() else {
            panic!("no logits");
        };
        g.mask(&mut l).unwrap();
        let id = common::argmax(&l);
        ids.push(id);
        if tok.stop_ids().contains(&id) {
            break;
        }
        g.accept(id).unwrap();
        input = vec![id];
    }
    ids
}

/// A greedy request under a grammar picks on the device (the mask goes
/// up, one id comes back): the same ids as masking the logits on the host
/// and taking their argmax, step by step, on each device; and so does a
/// lone such request in the batching engine.
fn greedy_under_a_grammar_picks_what_the_host_would(
    name: &str,
    make: &dyn Fn() -> Box<dyn ComputeBackend>,
) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tiny_gguf(&tmp);
    let (mut model, tok) = load(make(), &path);
    let (served, _) = load(make(), &path);
    let mut engine = Engine::new(served, EngineOptions::default()).unwrap();
    let prompt = tok.encode("Answer in JSON:", false).unwrap();
    for i in [0, 7, 12] {
        let constraint =
            Constraint::new(&tok, GrammarSpec::JsonSchema(schemas()[i].clone())).unwrap();
        let opts = GenerateOptions {
            max_tokens: 300,
            sampler: SamplerConfig::greedy(),
            constraint: Some(constraint.clone()),
            ..GenerateOptions::default()
        };
        let got = generate(&mut model, &tok, &prompt, &opts, &mut |_, _| {
            ControlFlow::Continue(())
        })
        .unwrap();
        let want = host_masked_greedy(&mut model, &tok, &prompt, &constraint, opts.max_tokens);
        assert_eq!(got.tokens, want, "{name} schema {i}");
        check_schema(&format!("{name} greedy schema {i}"), &schemas()[i], &got);
        let id = engine
            .add(Request {
                prompt: prompt.clone(),
                max_tokens: opts.max_tokens,
                sampler: SamplerConfig::greedy(),
                stop_ids: tok.stop_ids().to_vec(),
                ignore_eos: false,
                logprobs: None,
                echo_logprobs: false,
                constraint: Some(constraint),
            })
            .unwrap();
        let mut served_ids = Vec::new();
        while !engine.is_idle() {
            for e in engine.step().unwrap() {
                match e {
                    Event::Token(r, t, _) if r == id => served_ids.push(t),
                    Event::Failed(r, err) => panic!("{name} request {r}: {err}"),
                    _ => {}
                }
            }
        }
        assert_eq!(served_ids, want, "{name} schema {i} in the engine");
    }
}

#[test]
fn greedy_under_a_grammar_picks_what_the_host_would_cpu() {
    greedy_under_a_grammar_picks_what_the_host_would("cpu", &common::cpu);
}

#[test]
fn greedy_under_a_grammar_picks_what_the_host_would_vulkan() {
    if common::vulkan().is_some() {
        let make = || common::vulkan().expect("a Vulkan device");
        greedy_under_a_grammar_picks_what_the_host_would("vulkan", &make);
    }
}

/// The mask word by word: on SmolLM2's byte-level vocabulary, a digits
/// regex leaves exactly the tokens that are digits only (checked id by id
/// from their text), and ids past the vocabulary (an output matrix's
/// padding rows) are forbidden.
#[test]
fn the_mask_allows_exactly_the_tokens_the_grammar_can_take() {
    let loaded = vkllm::open::load(
        vec![common::cpu()],
        &common::smollm2(),
        &LoadOptions {
            context: Some(64),
            ..Default::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    let tok = loaded.tokenizer.unwrap();
    let n = tok.vocab_size();
    let constraint = Constraint::new(&tok, GrammarSpec::Regex("[0-9]+".into())).unwrap();
    let mut matcher = constraint.matcher().unwrap();
    let mut logits = vec![0.0f32; n + 45];
    logits[7] = f32::NEG_INFINITY;
    matcher.mask(&mut logits).unwrap();
    let mut allowed = 0;
    for (id, &l) in logits.iter().enumerate() {
        let text = if id < n {
            tok.decode(&[id as u32]).unwrap()
        } else {
            String::new()
        };
        let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        let want = digits && id != 7;
        assert_eq!(l == 0.0, want, "id {id} {text:?}: logit {l}");
        allowed += want as usize;
    }
    assert!(allowed >= 10, "{allowed} digit tokens");
}
