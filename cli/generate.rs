//! `vkllm generate`: stream generated text, or print one JSON object.

use super::{BackendArgs, ModelArg, SamplerArgs, TokenIds};
use clap::{ArgGroup, Args};
use serde::Serialize;
use std::ops::ControlFlow;
use std::path::PathBuf;
use vkllm::model::generate::{generate, prompt_ids, GenerateOptions, Prompt, DEFAULT_DECODE_CHUNK};
use vkllm::model::grammar::{Constraint, GrammarSpec};
use vkllm::model::runner::MAX_DECODE_STEPS;
use vkllm::model::source::ModelSource;
use vkllm::model::tokenizer::Tokenizer;
use vkllm::{Error, Result};

#[derive(Args)]
#[command(group(ArgGroup::new("input").required(true).args(["prompt", "prompt_ids"])))]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// Prompt text
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// Prompt as token ids, used verbatim
    #[arg(long, value_name = "IDS", value_parser = super::parse_ids)]
    prompt_ids: Option<TokenIds>,
    /// Most tokens to generate
    #[arg(short = 'n', long, default_value_t = 128)]
    max_tokens: usize,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// Keep generating through end-of-sequence (the stop tokens' logits are
    /// barred, as llama.cpp's --ignore-eos does)
    #[arg(long)]
    ignore_eos: bool,
    /// Stop when the text reaches TEXT (left out of the output); repeatable
    #[arg(long, value_name = "TEXT")]
    stop: Vec<String>,
    /// Wrap the prompt in the model's chat template
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// System message for --chat
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Print one JSON object instead of streaming text
    #[arg(long)]
    json: bool,
    /// Greedy decoding: most steps run on the device before their tokens
    /// are read back (chunks grow 1, 2, 4, ... up to this; 1 = every token)
    #[arg(long, default_value_t = DEFAULT_DECODE_CHUNK, value_parser = parse_chunk)]
    decode_chunk: usize,
    /// Structured output: the text is JSON valid against the JSON schema
    /// in FILE (masked while sampling)
    #[arg(long, value_name = "FILE", conflicts_with_all = ["grammar", "json_object"])]
    json_schema: Option<PathBuf>,
    /// Structured output: the text is one JSON object
    #[arg(long, conflicts_with = "grammar")]
    json_object: bool,
    /// Structured output: the text matches the grammar in FILE, in
    /// llguidance's Lark syntax (`start: ...`; not GBNF)
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
    /// Time every GPU dispatch and copy: write a Chrome trace (Perfetto,
    /// chrome://tracing) to FILE and print a per-op summary to stderr
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
}

/// The grammar the structured-output flags ask for, checked before the
/// model loads.
fn constraint(a: &GenerateArgs, tok: &Tokenizer) -> Result<Option<Constraint>> {
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path)
            .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", path.display())))
    };
    let spec = if let Some(path) = &a.json_schema {
        let text = read(path)?;
        let schema = serde_json::from_str(&text)
            .map_err(|e| Error::Invalid(format!("{} is not valid JSON: {e}", path.display())))?;
        GrammarSpec::JsonSchema(schema)
    } else if let Some(path) = &a.grammar {
        GrammarSpec::Lark(read(path)?)
    } else if a.json_object {
        GrammarSpec::JsonObject
    } else {
        return Ok(None);
    };
    Constraint::new(tok, spec).map(Some)
}

fn parse_chunk(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_DECODE_STEPS).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected a whole number from 1 to {MAX_DECODE_STEPS}"
        )),
    }
}

#[derive(Serialize)]
struct JsonTimings {
    prefill_tokens: usize,
    prefill_tok_s: f64,
    decode_tokens: usize,
    decode_tok_s: f64,
    load_s: f64,
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    prompt_ids: &'a [u32],
    tokens: &'a [u32],
    text: &'a str,
    stop: &'static str,
    timings: JsonTimings,
    backend: String,
}

pub fn run(a: GenerateArgs) -> Result<()> {
    if let Some(trace) = &a.profile {
        super::check_output(trace)?;
    }
    let path = super::model_path(&a.model)?;
    let src = ModelSource::open(&path)?;
    let tok = src.tokenizer()?;
    let prompt = match (&a.prompt, &a.prompt_ids) {
        (_, Some(ids)) => Prompt::Ids(&ids.0),
        (Some(text), None) if a.chat => Prompt::Chat {
            system: a.system.as_deref(),
            user: text,
        },
        (Some(text), None) => Prompt::Text(text),
        (None, None) => return Err(Error::Invalid("give --prompt or --prompt-ids".into())),
    };
    let ids = prompt_ids(&tok, &prompt)?;
    let constraint = constraint(&a, &tok)?;
    let bes = super::open_backends(&a.backend)?;
    let (mut model, load_s) = super::load_model(bes, &src, &a.backend)?;
    if a.profile.is_some() {
        model.set_profiling(true)?;
    }
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        decode_chunk: a.decode_chunk,
        ignore_eos: a.ignore_eos,
        stop: a.stop.clone(),
        sampler: a.sampler.config(),
        constraint,
    };
    // A failed write (stdout closed) stops generation; the error is reported after.
    let mut write_err = None;
    let mut on_token = |_: u32, text: &str| {
        if a.json || text.is_empty() {
            return ControlFlow::Continue(());
        }
        match super::print_flush(text) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                write_err = Some(e);
                ControlFlow::Break(())
            }
        }
    };
    let res = generate(&mut model, &tok, &ids, &opts, &mut on_token)?;
    if let Some(e) = write_err {
        return Err(e);
    }
    if let Some(trace) = &a.profile {
        let events = model.take_profile();
        vkllm::profile::write_chrome_trace(trace, &events)?;
        eprint!("{}", vkllm::profile::summary(&events));
        eprintln!("trace written to {}", trace.display());
    }
    let t = res.timings;
    if a.json {
        return super::print_json(&JsonOutput {
            prompt_ids: &ids,
            tokens: &res.tokens,
            text: &res.text,
            stop: res.stop.name(),
            timings: JsonTimings {
                prefill_tokens: t.prefill_tokens,
                prefill_tok_s: t.prefill_tok_s(),
                decode_tokens: t.decode_tokens,
                decode_tok_s: t.decode_tok_s(),
                load_s,
            },
            backend: model.backend_name(),
        });
    }
    if !res.text.is_empty() && !res.text.ends_with('\n') {
        super::print_flush("\n")?;
    }
    eprintln!(
        "prefill {} tok at {:.1} tok/s, decode {} tok at {:.1} tok/s, load {:.2} s, backend {}",
        t.prefill_tokens,
        t.prefill_tok_s(),
        t.decode_tokens,
        t.decode_tok_s(),
        load_s,
        model.backend_name()
    );
    if let Some(stats) = model.last_pass_stats() {
        eprintln!("last pass: {stats}");
    }
    Ok(())
}
