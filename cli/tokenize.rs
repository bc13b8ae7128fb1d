//! `vkllm tokenize`: the token ids of a text.

use super::ModelArg;
use clap::Args;
use serde::Serialize;
use vkllm::model::source::ModelSource;
use vkllm::Result;

#[derive(Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Text to tokenize
    #[arg(short = 'p', long, visible_alias = "prompt")]
    text: String,
    /// Never add BOS (by default it is added when the model expects it)
    #[arg(long)]
    no_bos: bool,
    /// Print {"ids": [...]} instead of one `id<TAB>"text"` line per token
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    ids: &'a [u32],
}

pub fn run(a: TokenizeArgs) -> Result<()> {
    let path = super::model_path(&a.model)?;
    let tok = ModelSource::open(&path)?.tokenizer()?;
    let ids = tok.encode(&a.text, !a.no_bos && tok.add_bos_by_default())?;
    if a.json {
        return super::print_json(&JsonOutput { ids: &ids });
    }
    let mut out = String::new();
    for &id in &ids {
        let text = tok.token_text(id).unwrap_or_default();
        out.push_str(&format!("{id}\t{text:?}\n"));
    }
    super::print_flush(&out)
}
