//! `vkllm logits`: the logits of every prompt position (parity checks
//! against other implementations; needs no tokenizer).

use super::{BackendArgs, ModelArg, TokenIds};
use clap::Args;
use serde::Serialize;
use vkllm::model::generate::check_prompt;
use vkllm::model::source::ModelSource;
use vkllm::model::{Output, Want};
use vkllm::{Error, Result};

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// Prompt as token ids
    #[arg(long, value_name = "IDS", value_parser = super::parse_ids)]
    prompt_ids: TokenIds,
    /// Print {"logits": [[...], ...]}, one row per position, instead of each
    /// position's top 5
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    logits: Vec<&'a [f32]>,
}

pub fn run(a: LogitsArgs) -> Result<()> {
    let path = super::model_path(&a.model)?;
    let bes = super::open_backends(&a.backend)?;
    let (mut model, _) = super::load_model(bes, &ModelSource::open(&path)?, &a.backend)?;
    let ids = &a.prompt_ids.0;
    check_prompt(&model, ids)?;
    let vocab = model.config().vocab;
    let logits = match model.forward(ids, Want::AllLogits)? {
        Output::Logits(l) => l,
        Output::Token(_) => {
            return Err(Error::Invalid(
                "the model returned a token, not logits".into(),
            ))
        }
    };
    let rows: Vec<&[f32]> = logits.chunks(vocab).collect();
    if a.json {
        return super::print_json(&JsonOutput { logits: rows });
    }
    let mut out = String::new();
    for (pos, row) in rows.iter().enumerate() {
        let mut idx: Vec<usize> = (0..row.len()).collect();
        idx.sort_by(|&x, &y| row[y].total_cmp(&row[x]));
        let top: Vec<String> = idx
            .iter()
            .take(5)
            .map(|&i| format!("{i} ({:.3})", row[i]))
            .collect();
        out.push_str(&format!("{pos}: {}\n", top.join(", ")));
    }
    super::print_flush(&out)
}
