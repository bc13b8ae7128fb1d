//! The `vkllm` command line: argument parsing, model/backend set-up shared by
//! the subcommands, and turning errors into one `error: ...` line.

mod bench;
mod chat;
mod convert;
mod generate;
mod info;
mod logits;
mod sampler_args;
mod selftest;
mod serve;
mod synth;
mod tokenize;

use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sampler_args::SamplerArgs;
use std::io::{IsTerminal, Write};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use vkllm::model::source::ModelSource;
use vkllm::model::{LoadOptions, Model};
use vkllm::open::{BackendChoice, CpuOptions};
use vkllm::{ComputeBackend, Error, Result};

/// The model used when `--model` is not given, relative to the current
/// directory or to the source checkout the binary was built from.
const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Parser)]
#[command(
    name = "vkllm",
    version,
    about = "LLM inference on a Vulkan compute backend or the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout
    Generate(generate::GenerateArgs),
    /// Chat interactively, keeping the conversation in the KV cache
    Chat(chat::ChatArgs),
    /// Serve the model over an OpenAI-compatible HTTP API
    Serve(serve::ServeArgs),
    /// Show the token ids of a text
    Tokenize(tokenize::TokenizeArgs),
    /// Print the logits of every position of a prompt
    Logits(logits::LogitsArgs),
    /// Show Vulkan devices, CPU features and, given a model, its metadata
    Info(info::InfoArgs),
    /// Time prompt processing and generation (llama-bench's protocol)
    Bench(bench::BenchArgs),
    /// Write a GGUF of a real model's shape with random weights
    Synth(synth::SynthArgs),
    /// Check every kernel this machine would run against the scalar reference
    Selftest(selftest::SelftestArgs),
    /// Convert a Hugging Face model directory to GGUF (llama.cpp's conventions)
    Convert(convert::ConvertArgs),
}

impl Command {
    /// Checks across flags, which clap checks one at a time.
    fn check(&self) -> std::result::Result<(), String> {
        match self {
            Command::Generate(a) => a.backend.check(),
            Command::Chat(a) => a.backend.check(),
            Command::Serve(a) => a.check(),
            Command::Logits(a) => a.backend.check(),
            Command::Info(a) => a.check(),
            Command::Bench(a) => a.split.check(),
            Command::Tokenize(_)
            | Command::Synth(_)
            | Command::Selftest(_)
            | Command::Convert(_) => Ok(()),
        }
    }
}

#[derive(Args)]
pub struct ModelArg {
    /// GGUF file or Hugging Face model directory
    /// [default: models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(short = 'm', long, value_name = "PATH")]
    pub model: Option<PathBuf>,
}

/// `--activations`: see `vkllm::cpu::ActivationPrecision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ActivationsArg {
    /// f32 against weights dequantized in registers (f32-exact)
    F32,
    /// 16-bit integers per 32-value block, integer dots (error ≤ 2⁻¹⁶ of the block's max)
    Q16,
    /// 8-bit integers per block, integer dots, as llama.cpp (fastest; error ≤ 2⁻⁸)
    Q8,
}

impl From<ActivationsArg> for vkllm::cpu::ActivationPrecision {
    fn from(a: ActivationsArg) -> Self {
        match a {
            ActivationsArg::F32 => vkllm::cpu::ActivationPrecision::F32,
            ActivationsArg::Q16 => vkllm::cpu::ActivationPrecision::Q16,
            ActivationsArg::Q8 => vkllm::cpu::ActivationPrecision::Q8,
        }
    }
}

#[derive(Args)]
pub struct BackendArgs {
    /// Compute backend: auto (Vulkan on a GPU, else the CPU), cpu, vulkan,
    /// or vulkan:DEVICE (a Vulkan device index or name)
    #[arg(short = 'b', long, value_name = "BACKEND", default_value = "auto", value_parser = parse_backend)]
    pub backend: BackendChoice,
    /// CPU threads [default: all cores]
    #[arg(short = 't', long, value_name = "N")]
    pub threads: Option<NonZeroUsize>,
    /// CPU: activations of matmuls with Q4_0..Q8_0, Q4_K, Q5_K, Q6_K weights (decode; prefill too on AVX2 / AVX-512)
    #[arg(long, value_enum, value_name = "KIND", default_value_t = ActivationsArg::Q16)]
    pub activations: ActivationsArg,
    /// KV-cache size in positions [default: the model's context, at most 8192]
    #[arg(short = 'c', long = "ctx", value_name = "N")]
    pub ctx: Option<NonZeroUsize>,
    /// Quantize f32/f16/bf16 weight matrices at load
    #[arg(long, value_enum, value_name = "TYPE")]
    pub quantize: Option<QuantizeKind>,
    /// KV-cache element type [default: f16 on Vulkan, f32 on the CPU, which
    /// supports only f32]
    #[arg(long = "kv-cache", value_enum, value_name = "TYPE")]
    pub kv_cache: Option<KvCacheKind>,
    #[command(flatten)]
    pub split: SplitArgs,
}

impl BackendArgs {
    /// Checks across flags, which clap checks one at a time.
    fn check(&self) -> std::result::Result<(), String> {
        if !self.split.devices.is_empty() && self.backend != BackendChoice::Auto {
            return Err(
                "--devices and --backend cannot be combined: --devices names every backend".into(),
            );
        }
        self.split.check()
    }
}

/// `--devices` and `--tensor-split`: a model split by layer over several devices.
#[derive(Args, Clone, Default)]
pub struct SplitArgs {
    /// Split the model by layer over these devices, comma-separated: Vulkan
    /// device indexes or names (one twice: two logical devices on one GPU), or cpu
    #[arg(long, value_name = "DEV,DEV,...", value_delimiter = ',', value_parser = parse_device)]
    pub devices: Vec<BackendChoice>,
    /// Each device's share of the layers, comma-separated (3,1: three
    /// quarters on the first) [default: in proportion to free device memory]
    #[arg(long, value_name = "A,B,...", value_delimiter = ',', value_parser = parse_share, requires = "devices")]
    pub tensor_split: Vec<f64>,
}

impl SplitArgs {
    fn check(&self) -> std::result::Result<(), String> {
        if self.devices.len() == 1 {
            return Err("--devices needs at least two devices (--backend picks one)".into());
        }
        match self.shares() {
            Some(s) => vkllm::model::layer_split::check_shares(s, self.devices.len())
                .map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// `--tensor-split`, when given.
    pub fn shares(&self) -> Option<&[f64]> {
        (!self.tensor_split.is_empty()).then_some(self.tensor_split.as_slice())
    }
}

/// clap value parser for a `--devices` entry: `cpu`, or a Vulkan device
/// index or name (`vulkan:` before it is allowed).
pub fn parse_device(s: &str) -> std::result::Result<BackendChoice, String> {
    let s = s.trim();
    let device = s.strip_prefix("vulkan:").unwrap_or(s);
    match device {
        "" => Err("an empty device: expected cpu or a Vulkan device index or name".into()),
        "cpu" => Ok(BackendChoice::Cpu),
        d => Ok(BackendChoice::Device(d.to_string())),
    }
}

/// clap value parser for a `--tensor-split` part: a number above 0.
pub fn parse_share(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!(
            "'{s}' is not a number above 0 (leave a device out of --devices instead)"
        )),
    }
}

/// One line per device of a model: what it runs and the memory it holds.
pub fn describe_stages(model: &Model) -> String {
    let mut out = String::new();
    for (i, st) in model.stages().iter().enumerate() {
        let memory = st.memory.map_or_else(
            || "host memory".to_string(),
            |m| format!("{} device memory", mib(m.reserved_bytes)),
        );
        out.push_str(&format!(
            "  device {i}: {}: layers {}-{}, {} of weights, {memory}\n",
            st.device,
            st.layers.start,
            st.layers.end - 1,
            mib(st.weight_bytes as u64)
        ));
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `--kv-cache` element types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvCacheKind {
    /// Half the memory and bandwidth of f32 (~3 significant digits)
    F16,
    F32,
}

impl KvCacheKind {
    pub fn dtype(self) -> vkllm::DType {
        match self {
            KvCacheKind::F16 => vkllm::DType::F16,
            KvCacheKind::F32 => vkllm::DType::F32,
        }
    }
}

/// Load-time quantization targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QuantizeKind {
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    /// Ternary: only BitNet's projections (the matrices with a scale).
    #[value(name = "tq1_0")]
    TQ1_0,
    #[value(name = "tq2_0")]
    TQ2_0,
}

impl QuantizeKind {
    pub fn dtype(self) -> vkllm::DType {
        match self {
            QuantizeKind::Q8_0 => vkllm::DType::Q8_0,
            QuantizeKind::Q4_0 => vkllm::DType::Q4_0,
            QuantizeKind::TQ1_0 => vkllm::DType::TQ1_0,
            QuantizeKind::TQ2_0 => vkllm::DType::TQ2_0,
        }
    }
}

/// Token ids given on the command line as `1,2,3`.
#[derive(Clone, Debug)]
pub struct TokenIds(pub Vec<u32>);

/// clap value parser for sampling numbers: NaN and infinities are refused.
pub fn parse_finite(s: &str) -> std::result::Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err(format!("'{s}' is not a finite number")),
    }
}

/// A finite number within `lo..=hi` (`lo_open`: strictly above `lo`), for
/// sampler flags whose meaning ends outside that range: a negative
/// temperature or a top-p of 7 is a typo, not a request.
fn parse_in_range(s: &str, lo: f32, lo_open: bool, hi: f32) -> std::result::Result<f32, String> {
    let x = parse_finite(s)?;
    let above = if lo_open { x > lo } else { x >= lo };
    if above && x <= hi {
        return Ok(x);
    }
    let from = if lo_open { "above" } else { "from" };
    Err(if hi == f32::MAX {
        format!("'{s}' is out of range: expected a number {from} {lo}")
    } else {
        format!("'{s}' is out of range: expected a number {from} {lo} to {hi}")
    })
}

/// `--temperature`: 0 (greedy) or more.
pub fn parse_temperature(s: &str) -> std::result::Result<f32, String> {
    parse_in_range(s, 0.0, false, f32::MAX)
}

/// `--top-p`, `--min-p`: probabilities, 0 to 1.
pub fn parse_probability(s: &str) -> std::result::Result<f32, String> {
    parse_in_range(s, 0.0, false, 1.0)
}

/// `--repeat-penalty`: a divisor, so above 0 (1 is off).
pub fn parse_penalty(s: &str) -> std::result::Result<f32, String> {
    parse_in_range(s, 0.0, true, f32::MAX)
}

/// clap value parser for `--backend`.
pub fn parse_backend(s: &str) -> std::result::Result<BackendChoice, String> {
    s.parse().map_err(|e: Error| e.to_string())
}

/// clap value parser for [`TokenIds`].
pub fn parse_ids(s: &str) -> std::result::Result<TokenIds, String> {
    vkllm::model::generate::parse_token_ids(s)
        .map(TokenIds)
        .map_err(|e| e.to_string())
}

/// Entry point of the binary: clap exits with 2 on bad flags; runtime errors
/// print one line and exit with 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(msg) = cli.command.check() {
        use clap::CommandFactory;
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, msg)
            .exit();
    }
    // A bug must still read as one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!(
            "error: internal error: {}",
            info.to_string().replace('\n', " ")
        );
    }));
    let result = std::panic::catch_unwind(|| match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Logits(a) => logits::run(a),
        Command::Info(a) => info::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Selftest(a) => selftest::run(a),
        Command::Convert(a) => convert::run(a),
    });
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        // A reader that stops early (`| head`) is not a failure.
        Ok(Err(Error::Io { path, source, .. })) if path.as_os_str() == STDOUT => {
            if source.kind() == std::io::ErrorKind::BrokenPipe {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: cannot write to stdout: {source}");
                ExitCode::from(1)
            }
        }
        Ok(Err(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
        Err(_) => ExitCode::from(1),
    }
}

/// The path of the `Error::Io` that failed writes to stdout carry.
const STDOUT: &str = "<stdout>";

fn stdout_error(e: std::io::Error) -> Error {
    Error::io_write(STDOUT, e)
}

/// Write `text` to stdout and flush it.
pub fn print_flush(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).map_err(stdout_error)?;
    out.flush().map_err(stdout_error)
}

/// Serialize `value` as one JSON line on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> Result<()> {
    let text = serde_json::to_string(value)
        .map_err(|e| Error::Invalid(format!("cannot write JSON: {e}")))?;
    print_flush(&format!("{text}\n"))
}

/// `--model`, or the default model, which must exist.
pub fn model_path(arg: &ModelArg) -> Result<PathBuf> {
    if let Some(p) = &arg.model {
        if !p.exists() {
            return Err(Error::Invalid(format!(
                "model {} does not exist",
                p.display()
            )));
        }
        return Ok(p.clone());
    }
    let candidates = [
        PathBuf::from(DEFAULT_MODEL),
        Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_MODEL),
    ];
    candidates
        .into_iter()
        .find(|p| p.exists())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "no --model given and the default model {DEFAULT_MODEL} is missing; fetch it with scripts/fetch-model.sh"
            ))
        })
}

/// Checks an output file can be created before any work: the OS error alone
/// ("No such file or directory") does not say which part is missing, and
/// synth and convert would find out only after minutes of work.
pub fn check_output(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::Invalid(format!(
            "cannot write {}: it is a directory",
            path.display()
        )));
    }
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) if !dir.is_dir() => Err(Error::Invalid(format!(
            "cannot write {}: the directory {} does not exist",
            path.display(),
            dir.display()
        ))),
        _ => Ok(()),
    }
}

impl BackendArgs {
    pub fn cpu(&self) -> CpuOptions {
        CpuOptions {
            threads: self.threads.map(NonZeroUsize::get),
            activations: self.activations.into(),
        }
    }

    /// `--ctx`, `--quantize`, `--kv-cache` and `--tensor-split`.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            context: self.ctx.map(NonZeroUsize::get),
            weights: vkllm::model::weights::WeightOptions {
                quantize: self.quantize.map(QuantizeKind::dtype),
            },
            kv_cache: self.kv_cache.map(KvCacheKind::dtype),
            shares: self.split.shares().map(<[f64]>::to_vec),
            ..LoadOptions::default()
        }
    }
}

/// The backend `--backend` asks for (`auto` says on stderr what it
/// picked), or every device of `--devices`.
pub fn open_backends(args: &BackendArgs) -> Result<Vec<Box<dyn ComputeBackend>>> {
    let devices = &args.split.devices;
    let (bes, picked) = vkllm::open::open_backends(&args.backend, devices, args.cpu())?;
    if args.backend == BackendChoice::Auto && devices.is_empty() {
        eprintln!("backend: {picked}");
    }
    Ok(bes)
}

/// Load the model in `src` onto `bes` (split by layer when several) with a
/// progress bar on a terminal; returns the load time.
pub fn load_model(
    bes: Vec<Box<dyn ComputeBackend>>,
    src: &ModelSource,
    args: &BackendArgs,
) -> Result<(Model, f64)> {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(None, target);
    if let Ok(style) = ProgressStyle::with_template("loading {bar:40} {pos}/{len} {elapsed}") {
        bar.set_style(style);
    }
    let start = Instant::now();
    let model = vkllm::open::load_source(bes, src, &args.load_options(), &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    let model = model?;
    if model.stages().len() > 1 {
        eprint!(
            "split over {} devices:\n{}",
            model.stages().len(),
            describe_stages(&model)
        );
    }
    Ok((model, start.elapsed().as_secs_f64()))
}
