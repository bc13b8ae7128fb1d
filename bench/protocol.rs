//! llama-bench's protocol on a [`Model`].
//!
//! - pp`N`: one forward pass over `N` random token ids (fixed seed) from a
//!   cache that already holds `depth` positions, synchronized by reading back
//!   the argmax of the last row.
//! - tg`N`: `N` single-token steps from `depth`, each synchronized and greedily
//!   sampled, the produced token fed back (what generation does).
//!
//! Each test runs once untimed at its measured shape (warm-up), then
//! `repetitions` times; tok/s is reported as mean ± sample standard deviation
//! over the repetitions, every repetition kept. The cache contents at depth are
//! whatever is there: only the attention length matters for timing.

use crate::backend::PassStats;
use crate::error::{Error, Result};
use crate::model::gguf::GgufFile;
use crate::model::hf::HfCheckpoint;
use crate::model::source::TensorSource;
use crate::model::{LoadOptions, Model, Want};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TestKind {
    /// Prompt processing: one batch.
    Pp,
    /// Text generation: single-token steps.
    Tg,
}

/// One test of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestSpec {
    pub kind: TestKind,
    /// Prompt length (pp) or generated tokens (tg).
    pub tokens: usize,
    /// Positions already in the cache.
    pub depth: usize,
}

impl TestSpec {
    /// llama-bench's label: `pp512`, `tg128`, `pp512 @ d4096`.
    pub fn name(&self) -> String {
        let kind = match self.kind {
            TestKind::Pp => "pp",
            TestKind::Tg => "tg",
        };
        match self.depth {
            0 => format!("{kind}{}", self.tokens),
            d => format!("{kind}{} @ d{d}", self.tokens),
        }
    }

    /// Cache positions the test fills.
    pub fn context(&self) -> usize {
        self.depth + self.tokens
    }
}

/// The tests to run and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Protocol {
    pub tests: Vec<TestSpec>,
    pub repetitions: usize,
    /// Seed of the random token ids.
    pub seed: u64,
}

impl Protocol {
    /// llama-bench's matrix: every prompt length at every depth, then every
    /// generation length at every depth; zero lengths are skipped (`-p 0`
    /// runs only tg tests).
    pub fn new(
        prompt: &[usize],
        gen: &[usize],
        depth: &[usize],
        repetitions: usize,
    ) -> Result<Protocol> {
        if repetitions == 0 {
            return Err(Error::Invalid("at least one repetition is needed".into()));
        }
        let depths: &[usize] = if depth.is_empty() { &[0] } else { depth };
        let mut tests = Vec::new();
        for (kind, lens) in [(TestKind::Pp, prompt), (TestKind::Tg, gen)] {
            for &tokens in lens.iter().filter(|&&n| n > 0) {
                for &depth in depths {
                    tests.push(TestSpec {
                        kind,
                        tokens,
                        depth,
                    });
                }
            }
        }
        if tests.is_empty() {
            return Err(Error::Invalid(
                "no test to run: every prompt and generation length is 0".into(),
            ));
        }
        Ok(Protocol {
            tests,
            repetitions,
            seed: 0,
        })
    }

    /// A cache that holds the longest test and a batch as large as the
    /// longest prompt, so every pp test is one pass.
    pub fn load_options(&self) -> LoadOptions {
        let context = self.tests.iter().map(TestSpec::context).max().unwrap_or(1);
        let max_batch = self
            .tests
            .iter()
            .filter(|t| t.kind == TestKind::Pp)
            .map(|t| t.tokens)
            .max()
            .unwrap_or(1);
        LoadOptions {
            context: Some(context),
            max_batch: Some(max_batch),
            ..LoadOptions::default()
        }
    }
}

/// The timings of one test.
#[derive(Clone, Debug, PartialEq)]
pub struct TestResult {
    pub spec: TestSpec,
    /// Wall-clock nanoseconds of each repetition.
    pub samples_ns: Vec<u64>,
    /// Of each repetition, the nanoseconds the host did not spend waiting
    /// for the device (recording, submitting, reading back); `None` where
    /// the backend runs ops on the calling thread.
    pub host_ns: Option<Vec<u64>>,
    /// The last pass the test recorded (for tg, the decode step).
    pub pass: Option<PassStats>,
}

impl TestResult {
    /// Tokens per second of each repetition.
    pub fn samples_ts(&self) -> Vec<f64> {
        let n = self.spec.tokens as f64;
        self.samples_ns
            .iter()
            .map(|&ns| n * 1e9 / ns.max(1) as f64)
            .collect()
    }
    pub fn avg_ts(&self) -> f64 {
        mean(&self.samples_ts())
    }
    pub fn stddev_ts(&self) -> f64 {
        stddev(&self.samples_ts())
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Sample standard deviation (n - 1), 0 for fewer than two values, as llama-bench.
fn stddev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// Warm up, then time `repetitions` runs of `spec` on `model`.
pub fn run_test(
    model: &mut Model,
    spec: &TestSpec,
    repetitions: usize,
    seed: u64,
) -> Result<TestResult> {
    if spec.context() > model.capacity() {
        return Err(Error::Invalid(format!(
            "test {} needs {} cache positions but the model was loaded with {}",
            spec.name(),
            spec.context(),
            model.capacity()
        )));
    }
    let vocab = model.config().vocab as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut samples_ns = Vec::with_capacity(repetitions);
    let mut host_ns = model
        .device_wait_ns()
        .map(|_| Vec::with_capacity(repetitions));
    for rep in 0..=repetitions {
        model.set_n_past(spec.depth)?;
        let waited = model.device_wait_ns().unwrap_or(0);
        let ns = match spec.kind {
            TestKind::Pp => {
                let ids: Vec<u32> = (0..spec.tokens).map(|_| rng.gen_range(0..vocab)).collect();
                let start = Instant::now();
                model.forward(&ids, Want::Argmax)?;
                start.elapsed().as_nanos()
            }
            TestKind::Tg => {
                let mut token = rng.gen_range(0..vocab);
                let start = Instant::now();
                for _ in 0..spec.tokens {
                    token = model.next_token(&[token])?;
                }
                start.elapsed().as_nanos()
            }
        };
        // Repetition 0 is the warm-up.
        if rep > 0 {
            let ns = u64::try_from(ns).unwrap_or(u64::MAX);
            samples_ns.push(ns);
            if let Some(h) = &mut host_ns {
                let wait = model.device_wait_ns().unwrap_or(0) - waited;
                h.push(ns.saturating_sub(wait));
            }
        }
    }
    model.reset();
    Ok(TestResult {
        spec: *spec,
        samples_ns,
        host_ns,
        pass: model.last_pass_stats(),
    })
}

/// What the table says about a model file.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    /// File or directory name.
    pub filename: String,
    /// Elements of every tensor in the file.
    pub n_params: u64,
}

impl ModelInfo {
    /// Name and parameter count of a GGUF file or a Hugging Face directory.
    pub fn read(path: &Path) -> Result<ModelInfo> {
        let filename = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let n_params = if path.is_dir() {
            let hf = HfCheckpoint::open(path)?;
            let mut n = 0u64;
            for name in hf.names() {
                if let Some(t) = hf.tensor(&name)? {
                    n += (t.rows * t.cols) as u64;
                }
            }
            n
        } else {
            let g = GgufFile::open(path)?;
            g.tensors().iter().map(|t| t.n_elements() as u64).sum()
        };
        Ok(ModelInfo { filename, n_params })
    }
}

/// One row of the report: a test of a model on a backend. Field names follow
/// llama-bench's JSON where it has one.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Record {
    pub model_filename: String,
    /// Bytes of weights on the device (what one decode step reads).
    pub model_size: u64,
    pub model_n_params: u64,
    pub backend: String,
    pub device: String,
    pub n_threads: Option<usize>,
    pub test: String,
    pub kind: TestKind,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
    pub avg_ns: u64,
    pub stddev_ns: u64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
    /// The device's measured copy bandwidth, bytes read + written, GB/s.
    pub copy_gbs: f64,
    /// tg only: weight bytes read per token (the active ones) × tok/s, GB/s.
    pub weight_gbs: Option<f64>,
    /// tg only: `weight_gbs` as a percentage of `copy_gbs`.
    pub roofline_pct: Option<f64>,
    /// Host time per token outside waits for the device, microseconds
    /// (backends that record passes).
    pub host_us_per_token: Option<f64>,
    /// Commands of the last pass recorded (for tg, one decode step).
    pub dispatches: Option<u32>,
    pub barriers: Option<u32>,
    pub copies: Option<u32>,
}

/// Where a test ran, shared by its records.
#[derive(Clone, Debug, PartialEq)]
pub struct RunContext {
    pub model: ModelInfo,
    pub weight_bytes: u64,
    /// Of those, what one decoded token reads (a mixture of experts reads
    /// only its chosen experts').
    pub active_bytes: u64,
    pub backend: String,
    pub device: String,
    pub n_threads: Option<usize>,
    pub copy_gbs: f64,
}

impl Record {
    pub fn new(ctx: &RunContext, r: &TestResult) -> Record {
        let ns: Vec<f64> = r.samples_ns.iter().map(|&x| x as f64).collect();
        let avg_ts = r.avg_ts();
        let (weight_gbs, roofline_pct) = match r.spec.kind {
            TestKind::Tg => {
                let gbs = ctx.active_bytes as f64 * avg_ts / 1e9;
                let pct = (ctx.copy_gbs > 0.0).then(|| 100.0 * gbs / ctx.copy_gbs);
                (Some(gbs), pct)
            }
            TestKind::Pp => (None, None),
        };
        let (n_prompt, n_gen) = match r.spec.kind {
            TestKind::Pp => (r.spec.tokens, 0),
            TestKind::Tg => (0, r.spec.tokens),
        };
        Record {
            model_filename: ctx.model.filename.clone(),
            model_size: ctx.weight_bytes,
            model_n_params: ctx.model.n_params,
            backend: ctx.backend.clone(),
            device: ctx.device.clone(),
            n_threads: ctx.n_threads,
            test: r.spec.name(),
            kind: r.spec.kind,
            n_prompt,
            n_gen,
            n_depth: r.spec.depth,
            avg_ns: mean(&ns) as u64,
            stddev_ns: stddev(&ns) as u64,
            avg_ts,
            stddev_ts: r.stddev_ts(),
            samples_ns: r.samples_ns.clone(),
            samples_ts: r.samples_ts(),
            copy_gbs: ctx.copy_gbs,
            weight_gbs,
            roofline_pct,
            host_us_per_token: r.host_ns.as_ref().map(|h| {
                let per: Vec<f64> = h.iter().map(|&x| x as f64).collect();
                mean(&per) / r.spec.tokens.max(1) as f64 / 1e3
            }),
            dispatches: r.pass.map(|p| p.dispatches),
            barriers: r.pass.map(|p| p.barriers),
            copies: r.pass.map(|p| p.copies),
        }
    }
}

/// Bytes as llama-bench prints model sizes.
fn size_label(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let b = bytes as f64;
    if b >= 1024.0 * MIB {
        format!("{:.2} GiB", b / (1024.0 * MIB))
    } else {
        format!("{:.2} MiB", b / MIB)
    }
}

fn params_label(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} B", n / 1e9)
    } else {
        format!("{:.2} M", n / 1e6)
    }
}

/// The markdown table llama-bench prints, plus the tg roofline column.
pub fn markdown_table(records: &[Record]) -> String {
    let header = [
        "model",
        "size",
        "params",
        "backend",
        "device",
        "test",
        "t/s",
        "weights GB/s (% of copy BW)",
    ];
    let rows: Vec<[String; 8]> = records
        .iter()
        .map(|r| {
            let roofline = match (r.weight_gbs, r.roofline_pct) {
                (Some(gbs), Some(pct)) => format!("{gbs:.1} ({pct:.0}% of {:.0})", r.copy_gbs),
                (Some(gbs), None) => format!("{gbs:.1}"),
                _ => String::new(),
            };
            [
                r.model_filename.clone(),
                size_label(r.model_size),
                params_label(r.model_n_params),
                r.backend.clone(),
                r.device.clone(),
                r.test.clone(),
                format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts),
                roofline,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    // Text columns align left, numbers right, as llama-bench.
    let right = [false, true, true, false, false, true, true, true];
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        out.push('|');
        for ((cell, w), r) in cells.iter().zip(widths).zip(right) {
            let pad = w - cell.chars().count();
            let _ = if r {
                write!(out, " {}{cell} |", " ".repeat(pad))
            } else {
                write!(out, " {cell}{} |", " ".repeat(pad))
            };
        }
        out.push('\n');
    };
    line(&mut out, &header.map(String::from));
    out.push('|');
    for (w, r) in widths.iter().zip(right) {
        let dashes = "-".repeat(w + 1);
        let _ = if r {
            write!(out, "{dashes}:|")
        } else {
            write!(out, "{dashes}-|")
        };
    }
    out.push('\n');
    for row in &rows {
        line(&mut out, row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_follows_llama_bench() {
        let p = Protocol::new(&[512], &[128], &[0, 4096], 3).unwrap();
        let names: Vec<String> = p.tests.iter().map(TestSpec::name).collect();
        assert_eq!(names, ["pp512", "pp512 @ d4096", "tg128", "tg128 @ d4096"]);
        let o = p.load_options();
        assert_eq!(o.context, Some(4096 + 512));
        assert_eq!(o.max_batch, Some(512));
        assert!(Protocol::new(&[0], &[0], &[0], 3).is_err());
        assert!(Protocol::new(&[8], &[8], &[0], 0).is_err());
    }

    #[test]
    fn statistics_are_per_repetition() {
        let r = TestResult {
            spec: TestSpec {
                kind: TestKind::Tg,
                tokens: 10,
                depth: 0,
            },
            samples_ns: vec![1_000_000_000, 500_000_000],
            host_ns: Some(vec![1_000_000, 3_000_000]),
            pass: None,
        };
        assert_eq!(r.samples_ts(), vec![10.0, 20.0]);
        assert_eq!(r.avg_ts(), 15.0);
        assert!((r.stddev_ts() - 50f64.sqrt()).abs() < 1e-9);
        let ctx = RunContext {
            model: ModelInfo {
                filename: "m.gguf".into(),
                n_params: 1,
            },
            weight_bytes: 1,
            active_bytes: 1,
            backend: "vulkan".into(),
            device: "d".into(),
            n_threads: None,
            copy_gbs: 0.0,
        };
        // Mean host time of the repetitions over their 10 tokens: 200 µs.
        let rec = Record::new(&ctx, &r);
        assert_eq!(rec.host_us_per_token, Some(200.0));
    }
}
