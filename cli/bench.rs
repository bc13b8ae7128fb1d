//! `vkllm bench`: llama-bench's protocol and table for several models and
//! backends side by side; the protocol itself lives in `vkllm::bench`.

use super::{ActivationsArg, BackendArgs, KvCacheKind, ModelArg, SplitArgs};
use clap::Args;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use vkllm::bench::bandwidth::{backend_copy_gbs, host_copy_gbs, DEVICE_COPIES};
use vkllm::bench::batched::{batched_table, run_batched, BatchedRecord, BatchedSpec};
use vkllm::bench::protocol::{markdown_table, ModelInfo, RunContext};
use vkllm::bench::{run_test, Protocol, Record};
use vkllm::model::Model;
use vkllm::open::BackendChoice;
use vkllm::profile::ProfileEvent;
use vkllm::{Error, Result};

#[derive(Args)]
pub struct BenchArgs {
    /// GGUF files or Hugging Face directories to compare
    /// [default: models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(short = 'm', long, value_name = "PATH", num_args = 1..)]
    model: Vec<PathBuf>,
    /// KV-cache element type for every backend [default: each backend's own:
    /// f16 on Vulkan, f32 on the CPU (which supports only f32)]
    #[arg(long = "kv-cache", value_enum, value_name = "TYPE")]
    kv_cache: Option<KvCacheKind>,
    /// Backends to compare, comma-separated
    #[arg(
        short = 'b',
        long,
        value_name = "BACKEND",
        value_parser = super::parse_backend,
        value_delimiter = ',',
        default_value = "auto"
    )]
    backend: Vec<BackendChoice>,
    /// Prompt lengths (pp tests), comma-separated; 0 skips pp
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_name = "N",
        value_delimiter = ',',
        default_value = "512"
    )]
    prompt: Vec<usize>,
    /// Generation lengths (tg tests), comma-separated; 0 skips tg
    #[arg(
        short = 'n',
        long = "n-gen",
        value_name = "N",
        value_delimiter = ',',
        default_value = "128"
    )]
    gen: Vec<usize>,
    /// Cache depths each test starts from, comma-separated
    #[arg(
        short = 'd',
        long = "n-depth",
        value_name = "N",
        value_delimiter = ',',
        default_value = "0"
    )]
    depth: Vec<usize>,
    /// Timed repetitions of each test (after one warm-up)
    #[arg(
        short = 'r',
        long = "repetitions",
        value_name = "N",
        default_value = "5"
    )]
    repetitions: NonZeroUsize,
    /// CPU threads [default: all cores]
    #[arg(short = 't', long, value_name = "N")]
    threads: Option<NonZeroUsize>,
    /// Rows per prefill pass; a longer prompt takes several passes
    /// [default: the longest prompt, one pass]
    #[arg(long, value_name = "N")]
    ubatch: Option<NonZeroUsize>,
    /// CPU: activations of matmuls with Q4_0..Q8_0, Q4_K, Q5_K, Q6_K weights (decode; prefill too on AVX2 / AVX-512)
    #[arg(long, value_enum, value_name = "KIND", default_value_t = ActivationsArg::Q16)]
    activations: ActivationsArg,
    /// Size of the copy-bandwidth probe in MiB, at most what one device op may take and
    /// halved while device memory is short (0 skips it and the roofline column); an H200
    /// copied 3.6 TB/s in 256 MiB buffers, 3.9-4.0 in 1024
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    copy_mib: usize,
    /// Sequences decoding together, comma-separated: runs llama-batched-bench's test
    /// instead (each sequence's -p prompt, then -n steps of every sequence at once) and
    /// prints aggregate and per-sequence rates
    #[arg(long, value_name = "B", value_delimiter = ',')]
    parallel: Vec<NonZeroUsize>,
    /// Busy threads spinning beside the tests, a competing CPU load (a
    /// compiler, a browser): run once with and once without to see how the
    /// CPU backend's speed degrades on a busy machine
    #[arg(long, value_name = "N", default_value_t = 0)]
    contend: usize,
    /// Seed of the random prompt tokens
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print every record (with each repetition) as a JSON array instead of the table
    #[arg(long)]
    json: bool,
    /// Time every GPU dispatch and copy of the tests (the timings then include
    /// the profiling cost): write a Chrome trace to FILE, a per-op summary to stderr
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// With --devices: the model split over them is run too, after the
    /// --backend runs (beside them in the table)
    #[command(flatten)]
    pub(crate) split: SplitArgs,
}

pub fn run(a: BenchArgs) -> Result<()> {
    if let Some(trace) = &a.profile {
        super::check_output(trace)?;
    }
    let _load = CompetingLoad::start(a.contend);
    let mut protocol = Protocol::new(&a.prompt, &a.gen, &a.depth, a.repetitions.get())?;
    protocol.seed = a.seed;
    let models = if a.model.is_empty() {
        vec![super::model_path(&ModelArg { model: None })?]
    } else {
        a.model
            .iter()
            .map(|m| {
                super::model_path(&ModelArg {
                    model: Some(m.clone()),
                })
            })
            .collect::<Result<Vec<_>>>()?
    };
    let threads = a.threads.map(NonZeroUsize::get);
    // One probe per backend and device for the whole run.
    let mut copy_gbs: HashMap<String, f64> = HashMap::new();
    let mut records = Vec::new();
    let mut profile = Vec::new();
    // Each --backend alone, then the split over --devices when given.
    let mut runs: Vec<BackendArgs> = a
        .backend
        .iter()
        .map(|kind| BackendArgs {
            backend: kind.clone(),
            threads: a.threads,
            activations: a.activations,
            ctx: None,
            quantize: None,
            kv_cache: a.kv_cache,
            split: SplitArgs::default(),
        })
        .collect();
    if !a.split.devices.is_empty() {
        runs.push(BackendArgs {
            backend: BackendChoice::Auto,
            threads: a.threads,
            activations: a.activations,
            ctx: None,
            quantize: None,
            kv_cache: a.kv_cache,
            split: a.split.clone(),
        });
    }
    if !a.parallel.is_empty() {
        return run_parallel(&a, &models, &runs);
    }
    for path in &models {
        let info = ModelInfo::read(path)?;
        for run in &runs {
            let bes = super::open_backends(run)?;
            let base = protocol.load_options();
            let opts = vkllm::model::LoadOptions {
                kv_cache: a.kv_cache.map(KvCacheKind::dtype),
                max_batch: base
                    .max_batch
                    .map(|b| a.ubatch.map_or(b, |u| u.get().min(b))),
                shares: run.split.shares().map(<[f64]>::to_vec),
                ..base
            };
            let mut model = vkllm::open::load(bes, path, &opts, &mut |_, _| {})?.model;
            let full = model.backend_name();
            let (backend, device) = backend_device(&model);
            if model.stages().len() > 1 {
                eprint!("{full}:\n{}", super::describe_stages(&model));
            }
            let gbs = match copy_gbs.get(&full) {
                Some(&g) => g,
                None => {
                    let g = probe(&mut model, &backend, a.copy_mib, threads)?;
                    copy_gbs.insert(full.clone(), g);
                    g
                }
            };
            let n_threads = (backend == "cpu").then(|| {
                threads.unwrap_or_else(|| {
                    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
                })
            });
            let ctx = RunContext {
                model: info.clone(),
                weight_bytes: model.weight_bytes() as u64,
                active_bytes: model.active_weight_bytes() as u64,
                backend,
                device,
                n_threads,
                copy_gbs: gbs,
            };
            if a.profile.is_some() {
                model.set_profiling(true)?;
            }
            for spec in &protocol.tests {
                let result = run_test(&mut model, spec, protocol.repetitions, protocol.seed)?;
                let record = Record::new(&ctx, &result);
                eprintln!(
                    "{} | {} | {}: {:.2} ± {:.2} t/s",
                    record.model_filename, full, record.test, record.avg_ts, record.stddev_ts
                );
                records.push(record);
            }
            append_profile(&mut profile, model.take_profile());
        }
    }
    if let Some(trace) = &a.profile {
        vkllm::profile::write_chrome_trace(trace, &profile)?;
        eprint!("{}", vkllm::profile::summary(&profile));
        eprintln!("trace written to {}", trace.display());
    }
    if a.json {
        let text = serde_json::to_string_pretty(&records)
            .map_err(|e| Error::Invalid(format!("cannot write JSON: {e}")))?;
        super::print_flush(&format!("{text}\n"))
    } else {
        super::print_flush(&markdown_table(&records))
    }
}

/// `--parallel`: the batched test for every prompt length, generation
/// length and sequence count, on every model and backend.
fn run_parallel(a: &BenchArgs, models: &[PathBuf], runs: &[BackendArgs]) -> Result<()> {
    let most = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
    let (pp, tg) = (most(&a.prompt).max(1), most(&a.gen));
    let sequences = a.parallel.iter().map(|b| b.get()).max().unwrap_or(1);
    let context = pp + tg;
    let mut records = Vec::new();
    for path in models {
        let info = ModelInfo::read(path)?;
        for run in runs {
            let opts = vkllm::model::LoadOptions {
                context: Some(context),
                sequences: Some(sequences),
                max_batch: Some(a.ubatch.map_or(pp, |u| u.get().min(pp))),
                kv_cache: a.kv_cache.map(KvCacheKind::dtype),
                shares: run.split.shares().map(<[f64]>::to_vec),
                ..vkllm::model::LoadOptions::default()
            };
            let bes = super::open_backends(run)?;
            let mut model = vkllm::open::load(bes, path, &opts, &mut |_, _| {})?.model;
            let backend = model.backend_name();
            for &prompt in a.prompt.iter().filter(|&&p| p > 0) {
                for &gen in &a.gen {
                    for b in &a.parallel {
                        let spec = BatchedSpec {
                            sequences: b.get(),
                            prompt,
                            gen,
                        };
                        let (pp_ns, tg_ns) =
                            run_batched(&mut model, spec, a.repetitions.get(), a.seed)?;
                        let r = BatchedRecord::new(&info.filename, &backend, spec, pp_ns, tg_ns);
                        eprintln!(
                            "{} | {backend} | pp{prompt} tg{gen} B={}: pp {:.1} t/s, tg {:.1} t/s",
                            r.model_filename, r.spec.sequences, r.pp_ts, r.tg_ts
                        );
                        records.push(r);
                    }
                }
            }
        }
    }
    if a.json {
        let text = serde_json::to_string_pretty(&records)
            .map_err(|e| Error::Invalid(format!("cannot write JSON: {e}")))?;
        super::print_flush(&format!("{text}\n"))
    } else {
        super::print_flush(&batched_table(&records))
    }
}

/// Append one model/backend run's events after those already collected, so
/// runs (each timed from its own origin) follow each other on the timeline.
fn append_profile(all: &mut Vec<ProfileEvent>, run: Vec<ProfileEvent>) {
    let end = all
        .iter()
        .map(|e| e.start_us + e.dur_us)
        .fold(0.0, f64::max);
    let start = run.iter().map(|e| e.start_us).fold(f64::INFINITY, f64::min);
    let shift = if start.is_finite() { end - start } else { 0.0 };
    all.extend(run.into_iter().map(|e| ProfileEvent {
        start_us: e.start_us + shift,
        ..e
    }));
}

/// The record's backend and device (see [`split_name`]); a split model's
/// backends joined by `+`, and its devices by ` + `, each with its layers.
fn backend_device(model: &Model) -> (String, String) {
    let stages = model.stages();
    if let [one] = stages.as_slice() {
        return split_name(&one.device);
    }
    let names: Vec<(String, String)> = stages.iter().map(|s| split_name(&s.device)).collect();
    let mut kinds: Vec<&str> = names.iter().map(|(k, _)| k.as_str()).collect();
    kinds.dedup();
    let devices: Vec<String> = stages
        .iter()
        .zip(&names)
        .map(|(s, (_, d))| format!("{d} [layers {}-{}]", s.layers.start, s.layers.end - 1))
        .collect();
    (kinds.join("+"), devices.join(" + "))
}

/// `cpu (avx2, 2 threads)` → (`cpu`, `avx2, 2 threads`).
fn split_name(name: &str) -> (String, String) {
    match name.split_once(" (") {
        Some((backend, rest)) => (
            backend.to_owned(),
            rest.strip_suffix(')').unwrap_or(rest).to_owned(),
        ),
        None => (name.to_owned(), String::new()),
    }
}

/// Copy bandwidth in GB/s: a threaded memcpy for the CPU, the backend's own
/// copy op on devices; 0 when skipped.
fn probe(model: &mut Model, backend: &str, mib: usize, threads: Option<usize>) -> Result<f64> {
    if mib == 0 {
        return Ok(0.0);
    }
    let bytes = mib
        .checked_mul(1 << 20)
        .ok_or_else(|| Error::Invalid(format!("--copy-mib {mib} is too large")))?;
    if backend == "cpu" {
        host_copy_gbs(bytes, threads)
    } else {
        backend_copy_gbs(model.backend(), bytes, DEVICE_COPIES)
    }
}

/// Threads that spin until dropped: a competing CPU load.
struct CompetingLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CompetingLoad {
    fn start(n: usize) -> CompetingLoad {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map_while(|_| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name("vkllm-contend".into())
                    .spawn(move || {
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            std::hint::spin_loop();
                        }
                    })
                    .ok()
            })
            .collect();
        CompetingLoad { stop, threads }
    }
}

impl Drop for CompetingLoad {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
