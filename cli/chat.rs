//! `vkllm chat`: an interactive conversation. Each line on stdin is a user
//! turn; the reply streams to stdout. The conversation stays in the KV
//! cache: a turn evaluates only its own new tokens, not the history.

use super::{BackendArgs, ModelArg, SamplerArgs};
use clap::Args;
use std::io::{BufRead, IsTerminal, Write};
use std::ops::ControlFlow;
use vkllm::model::chat::{render_chat, ChatMessage};
use vkllm::model::generate::GenerateOptions;
use vkllm::model::session::Session;
use vkllm::model::source::ModelSource;
use vkllm::model::tokenizer::Tokenizer;
use vkllm::{Error, Result};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// System message
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply
    #[arg(short = 'n', long, default_value_t = 512)]
    max_tokens: usize,
    #[command(flatten)]
    sampler: SamplerArgs,
}

pub fn run(a: ChatArgs) -> Result<()> {
    let path = super::model_path(&a.model)?;
    let src = ModelSource::open(&path)?;
    let tok = src.tokenizer()?;
    if tok.chat_template().is_none() {
        return Err(Error::Template("the model has no chat template".into()));
    }
    let bes = super::open_backends(&a.backend)?;
    let (mut model, _) = super::load_model(bes, &src, &a.backend)?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampler: a.sampler.config(),
        ..GenerateOptions::default()
    };
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("Type a message and press Enter; /reset starts over; Ctrl-D quits.");
    }
    let mut messages: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.as_str()))
        .collect();
    let first_turn = messages.len();
    let mut session = Session::new();
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| Error::io("<stdin>", e))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line == "/reset" {
            messages.truncate(first_turn);
            session.reset();
            eprintln!("(conversation cleared)");
            continue;
        }
        messages.push(ChatMessage::new("user", line));
        let ids = tok.encode(&render(&tok, &messages)?, false)?;
        let mut write_err = None;
        let mut on_token = |_: u32, text: &str| match super::print_flush(text) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                write_err = Some(e);
                ControlFlow::Break(())
            }
        };
        let res = session.generate(&mut model, &tok, &ids, &opts, &mut on_token)?;
        if let Some(e) = write_err {
            return Err(e);
        }
        super::print_flush("\n")?;
        let t = res.timings;
        eprintln!(
            "(prefill {} of {} tok, decode {} tok at {:.1} tok/s)",
            t.prefill_tokens,
            ids.len(),
            t.decode_tokens,
            t.decode_tok_s()
        );
        messages.push(ChatMessage::new("assistant", res.text));
    }
    Ok(())
}

/// The conversation through the model's template, ready for the reply.
fn render(tok: &Tokenizer, messages: &[ChatMessage]) -> Result<String> {
    let template = tok
        .chat_template()
        .ok_or_else(|| Error::Template("the model has no chat template".into()))?;
    let piece = |id: Option<u32>| id.and_then(|i| tok.id_to_piece(i)).unwrap_or_default();
    render_chat(
        template,
        messages,
        true,
        &piece(tok.bos_id()),
        &piece(tok.eos_id()),
    )
}
