//! Using vkllm as a library: load a model, build a chat prompt, stream a
//! greedy reply.
//!
//! `cargo run --release --example generate -- [MODEL.gguf] [QUESTION]`

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use vkllm::model::generate::{generate, prompt_ids, GenerateOptions, Prompt};
use vkllm::model::LoadOptions;
use vkllm::open::{open_backend, BackendChoice, CpuOptions, Loaded};

fn main() -> vkllm::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        PathBuf::from,
    );
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".into());

    // Vulkan on a GPU, the CPU otherwise; then the model and its tokenizer
    // from one opening of the file.
    let (backend, picked) = open_backend(&BackendChoice::Auto, CpuOptions::default())?;
    eprintln!("backend: {picked}");
    let Loaded {
        mut model,
        tokenizer,
    } = vkllm::open::load(
        vec![backend],
        &path,
        &LoadOptions::default(),
        &mut |_, _| {},
    )?;
    let tokenizer = tokenizer?;

    let prompt = Prompt::Chat {
        system: None,
        user: &question,
    };
    let ids = prompt_ids(&tokenizer, &prompt)?;
    let opts = GenerateOptions {
        max_tokens: 64,
        ..GenerateOptions::default()
    };
    let result = generate(&mut model, &tokenizer, &ids, &opts, &mut |_id, text| {
        print!("{text}");
        let _ = std::io::stdout().flush();
        ControlFlow::Continue(())
    })?;
    println!();
    eprintln!(
        "{} tokens, {:.1} tok/s on {}",
        result.tokens.len(),
        result.timings.decode_tok_s(),
        model.backend_name()
    );
    Ok(())
}
