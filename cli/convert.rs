//! `vkllm convert`: a Hugging Face model directory to a GGUF file in
//! llama.cpp's conventions (see `vkllm::model::convert`).

use clap::Args;
use std::path::PathBuf;
use vkllm::model::gguf::GgufFile;
use vkllm::{Error, Result};

use super::QuantizeKind;

#[derive(Args)]
pub struct ConvertArgs {
    /// Hugging Face model directory (config.json + *.safetensors)
    #[arg(value_name = "DIR")]
    input: PathBuf,
    /// GGUF file to write
    #[arg(short = 'o', long, value_name = "FILE")]
    output: PathBuf,
    /// Quantize f32/f16/bf16 weight matrices (norms, biases and learned
    /// positions stay as they are)
    #[arg(long, value_enum, value_name = "TYPE")]
    quantize: Option<QuantizeKind>,
}

pub fn run(a: ConvertArgs) -> Result<()> {
    if !a.input.is_dir() {
        return Err(Error::Invalid(format!(
            "{} is not a directory: convert takes a Hugging Face model directory",
            a.input.display()
        )));
    }
    super::check_output(&a.output)?;
    vkllm::model::convert::hf_to_gguf(&a.input, &a.output, a.quantize.map(|q| q.dtype()))?;
    let g = GgufFile::open(&a.output)?;
    let bytes = std::fs::metadata(&a.output).map_or(0, |m| m.len());
    let tokenizer = if g.get("tokenizer.ggml.model").is_none() {
        "no tokenizer (tokenizer.json is not converted)"
    } else if a.input.join("tokenizer.json").exists() {
        "tokenizer"
    } else {
        "placeholder byte-level vocabulary (the directory has no tokenizer)"
    };
    eprintln!(
        "{}: {}, {} tensors, {:.1} MB, {tokenizer}",
        a.output.display(),
        g.architecture()?,
        g.tensors().len(),
        bytes as f64 / 1e6
    );
    Ok(())
}
