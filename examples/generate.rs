//! Using vkllm as a library: load a model, build a chat prompt, stream a
//! greedy reply.
//!
//! `cargo run --release --example generate -- [MODEL.gguf] [QUESTION]`

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use vkllm::model::generate::{generate, prompt_ids, GenerateOptions, Prompt};
use vkllm::model::gguf::GgufFile;
use vkllm::model::tokenizer::Tokenizer;
use vkllm::model::{LoadOptions, Model};

fn main() -> vkllm::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        PathBuf::from,
    );
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".into());

    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(&path)?)?;
    // The Vulkan backend when a device exists, the CPU otherwise.
    let backend = vkllm::vk::open(&vkllm::vk::Options::from_env())
        .unwrap_or_else(|_| Box::new(vkllm::cpu::CpuBackend::new(None)));
    let mut model = Model::load(backend, &path, &LoadOptions::default(), &mut |_, _| {})?;

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
