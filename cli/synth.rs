//! `vkllm synth`: write a GGUF of a real model's shape with random weights,
//! for benchmarking without downloads (see `vkllm::bench::synth`).

use clap::builder::PossibleValuesParser;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use vkllm::bench::synth::{self, Quant, SHAPES};
use vkllm::Result;

#[derive(Args)]
pub struct SynthArgs {
    /// Model shape to imitate
    #[arg(long, value_parser = PossibleValuesParser::new(SHAPES.iter().map(|s| s.name)))]
    shape: String,
    /// Quantization mix (llama.cpp's recipe)
    #[arg(long, default_value = "q4_k_m",
          value_parser = PossibleValuesParser::new(Quant::ALL.map(Quant::name)))]
    quant: String,
    /// GGUF file to write
    #[arg(short = 'o', long, value_name = "FILE")]
    output: PathBuf,
    /// Seed of the random weights
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// GGUF to copy the tokenizer from [default: a minimal byte-level vocabulary]
    #[arg(long, value_name = "FILE")]
    donor: Option<PathBuf>,
    /// Random valid blocks of each quantized type instead of quantized
    /// weights: the same layout and speed, written in seconds rather than
    /// minutes (values are not a model's; for benchmarks only)
    #[arg(long)]
    fast: bool,
}

pub fn run(a: SynthArgs) -> Result<()> {
    let shape = synth::shape(&a.shape)?;
    let quant = Quant::from_name(&a.quant)?;
    super::check_output(&a.output)?;
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(None, target);
    if let Ok(style) =
        ProgressStyle::with_template("writing {bar:40} {bytes}/{total_bytes} {elapsed}")
    {
        bar.set_style(style);
    }
    let values = if a.fast {
        synth::Values::Random
    } else {
        synth::Values::Quantized
    };
    let summary = synth::write_values(
        shape,
        quant,
        values,
        &a.output,
        a.seed,
        a.donor.as_deref(),
        &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
    );
    bar.finish_and_clear();
    let s = summary?;
    eprintln!(
        "{}: {} {}, {} tensors, {:.1} M parameters, {:.2} GB of weights",
        a.output.display(),
        shape.name,
        quant.name(),
        s.tensors,
        s.params as f64 / 1e6,
        s.weight_bytes as f64 / 1e9
    );
    Ok(())
}
