//! The library generation loop (`vkllm::model::generate`) on the default
//! model: streamed chunks add up to the text, the callback can cancel, and
//! prompts are built as documented.

mod common;

use std::ops::ControlFlow;
use vkllm::model::generate::{generate, prompt_ids, GenerateOptions, Prompt, StopReason};
use vkllm::model::gguf::GgufFile;
use vkllm::model::tokenizer::Tokenizer;
use vkllm::model::{LoadOptions, Model};

fn setup() -> (Model, Tokenizer) {
    let path = common::smollm2();
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let opts = LoadOptions {
        context: Some(128),
        ..Default::default()
    };
    let model = Model::load(common::cpu(), &path, &opts, &mut |_, _| {}).unwrap();
    (model, tok)
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
