//! The library generation loop (`vkllm::model::generate`) on the default
//! model: streamed chunks add up to the text, the callback can cancel, and
//! prompts are built as documented.

mod common;

use std::ops::ControlFlow;
use vkllm::model::generate::{generate, prompt_ids, GenerateOptions, Prompt, StopReason};
use vkllm::model::tokenizer::Tokenizer;
use vkllm::model::{LoadOptions, Model};

fn setup() -> (Model, Tokenizer) {
    let opts = LoadOptions {
        context: Some(128),
        ..Default::default()
    };
    let loaded = vkllm::open::load(
        vec![common::cpu()],
        &common::smollm2(),
        &opts,
        &mut |_, _| {},
    )
    .unwrap();
    (loaded.model, loaded.tokenizer.unwrap())
}

#[test]
fn streamed_chunks_are_the_text_and_match_decode() {
    let (mut model, tok) = setup();
    let ids = prompt_ids(&tok, &Prompt::Text("Once upon a time, in a small village,")).unwrap();
    let opts = GenerateOptions {
        max_tokens: 20,
        ..GenerateOptions::default()
    };
    let mut streamed = String::new();
    let mut calls = 0;
    let res = generate(&mut model, &tok, &ids, &opts, &mut |_, text| {
        streamed.push_str(text);
        calls += 1;
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(res.stop, StopReason::MaxTokens);
    assert_eq!(res.tokens.len(), 20);
    assert_eq!(calls, 20, "one callback per generated token");
    assert_eq!(streamed, res.text);
    assert_eq!(res.text, tok.decode(&res.tokens).unwrap());
    assert!(
        res.text.starts_with(" there was a wise old wizard"),
        "{}",
        res.text
    );
    assert_eq!(res.timings.prefill_tokens, ids.len());
    assert_eq!(res.timings.decode_tokens, 19);
}

#[test]
fn the_callback_can_cancel_and_generate_starts_afresh() {
    let (mut model, tok) = setup();
    let ids = prompt_ids(&tok, &Prompt::Ids(&[504, 3575, 282, 4649, 314])).unwrap();
    let opts = GenerateOptions::default();
    let mut seen = Vec::new();
    let res = generate(&mut model, &tok, &ids, &opts, &mut |id, _| {
        seen.push(id);
        if seen.len() == 3 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    })
    .unwrap();
    assert_eq!(res.stop, StopReason::Cancelled);
    assert_eq!(res.tokens, [7042, 30, 198]);
    assert_eq!(seen, res.tokens);
    // A second call resets the cache: the same prompt gives the same start.
    let again = generate(&mut model, &tok, &ids, &opts, &mut |_, _| {
        ControlFlow::Break(())
    })
    .unwrap();
    assert_eq!(again.tokens, [7042]);
}

#[test]
fn chat_prompts_carry_the_template_and_no_bos() {
    let (_, tok) = setup();
    let chat = Prompt::Chat {
        system: Some("Be brief."),
        user: "Hi",
    };
    let ids = prompt_ids(&tok, &chat).unwrap();
    let want = tok
        .encode(
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
            false,
        )
        .unwrap();
    assert_eq!(ids, want);
}

#[test]
fn bad_prompts_are_refused_before_any_work() {
    let (mut model, tok) = setup();
    let opts = GenerateOptions::default();
    let mut never = |_: u32, _: &str| -> ControlFlow<()> { panic!("no token expected") };
    let err = |r: vkllm::Result<_>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let e = err(generate(&mut model, &tok, &[], &opts, &mut never));
    assert!(e.contains("empty"), "{e}");
    let e = err(generate(&mut model, &tok, &[1, 49152], &opts, &mut never));
    assert!(e.contains("49152") && e.contains("vocabulary"), "{e}");
    let e = err(generate(&mut model, &tok, &[1; 129], &opts, &mut never));
    assert!(e.contains("129 tokens") && e.contains("128"), "{e}");
}

/// `ignore_eos` bars the stop tokens as transformers' `min_new_tokens` did
/// when the reference was made: all four prompts give the reference's 32
/// greedy tokens (prompt 0's argmax is EOS at step 30, so the device-argmax
/// chunk that picked it is redone from logits). f32 activations, as the
/// reference computed in f32.
#[test]
fn ignore_eos_reproduces_the_reference_greedy_tokens() {
    let be =
        vkllm::cpu::CpuBackend::new(None).with_activations(vkllm::cpu::ActivationPrecision::F32);
    let opts = LoadOptions {
        context: Some(128),
        ..Default::default()
    };
    let loaded = vkllm::open::load(
        vec![Box::new(be)],
        &common::smollm2(),
        &opts,
        &mut |_, _| {},
    )
    .unwrap();
    let (mut model, tok) = (loaded.model, loaded.tokenizer.unwrap());
    let text =
        std::fs::read_to_string(common::reference_dir().join("smollm2_reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        let a = x.as_array().unwrap();
        a.iter().map(|i| i.as_u64().unwrap() as u32).collect()
    };
    let opts = GenerateOptions {
        max_tokens: 32,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    for (i, r) in v["refs"].as_array().unwrap().iter().enumerate() {
        let res = generate(
            &mut model,
            &tok,
            &ids(&r["prompt_ids"]),
            &opts,
            &mut |_, _| ControlFlow::Continue(()),
        )
        .unwrap();
        assert_eq!(res.tokens, ids(&r["greedy_32"]), "prompt {i}");
        assert_eq!(res.stop, StopReason::MaxTokens, "prompt {i}");
    }
    // Without the flag prompt 0 ends at EOS (id 2) in place of token 30.
    let r = &v["refs"][0];
    let res = generate(
        &mut model,
        &tok,
        &ids(&r["prompt_ids"]),
        &GenerateOptions {
            max_tokens: 32,
            ..GenerateOptions::default()
        },
        &mut |_, _| ControlFlow::Continue(()),
    )
    .unwrap();
    assert_eq!(res.stop, StopReason::StopToken);
    assert_eq!(res.tokens[..29], ids(&r["greedy_32"])[..29]);
    assert_eq!(res.tokens[29], 2);
}

/// Stop strings end generation, are left out of the text and are never
/// streamed, not even in part; sampling with barred EOS works too.
#[test]
fn stop_strings_cut_the_text_and_the_stream() {
    let (mut model, tok) = setup();
    let ids = prompt_ids(&tok, &Prompt::Ids(&[504, 3575, 282, 4649, 314])).unwrap();
    let opts = GenerateOptions {
        max_tokens: 32,
        stop: vec!["\n\n".into(), "never".into()],
        ..GenerateOptions::default()
    };
    let mut streamed = String::new();
    let res = generate(&mut model, &tok, &ids, &opts, &mut |_, text| {
        streamed.push_str(text);
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(res.stop, StopReason::StopString);
    assert_eq!(res.text, " Paris.");
    assert_eq!(streamed, res.text);
    // " Paris", ".", "\n", "\n": the stop string ends on the fourth token.
    assert_eq!(res.tokens, [7042, 30, 198, 198]);
    let sampled = GenerateOptions {
        max_tokens: 40,
        ignore_eos: true,
        sampler: vkllm::model::sampling::SamplerConfig::default(),
        ..GenerateOptions::default()
    };
    let res = generate(&mut model, &tok, &ids, &sampled, &mut |_, _| {
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(res.tokens.len(), 40);
    assert!(res.tokens.iter().all(|t| !tok.stop_ids().contains(t)));
}
