//! llama-batched-bench's protocol on a [`Model`]: `B` sequences, each with
//! its own `pp`-token prompt (random ids, fixed seed) evaluated one
//! sequence at a time, then `tg` decode steps that each append one token to
//! every sequence in one pass (the greedy token of each row, chosen on the
//! device and fed back). Aggregate rates: `B * pp` over the prompt time,
//! `B * tg` over the decode time. One untimed warm-up, then `repetitions`
//! timed runs; the sequences are freed after each.

use crate::error::{Error, Result};
use crate::model::{Model, Output, SeqId, Want};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::fmt::Write;
use std::time::Instant;

/// One batched test: `sequences` sequences of `prompt` prompt tokens, then
/// `gen` decode steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BatchedSpec {
    pub sequences: usize,
    pub prompt: usize,
    pub gen: usize,
}

/// The timings of one batched test, every repetition kept.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BatchedRecord {
    pub model_filename: String,
    pub backend: String,
    #[serde(flatten)]
    pub spec: BatchedSpec,
    /// Nanoseconds of each repetition's prompts, and of its decode steps.
    pub pp_ns: Vec<u64>,
    pub tg_ns: Vec<u64>,
    /// Aggregate prompt tokens per second (mean over repetitions).
    pub pp_ts: f64,
    /// Aggregate generated tokens per second (mean over repetitions).
    pub tg_ts: f64,
    /// Generated tokens per second of one sequence (`tg_ts / B`).
    pub tg_ts_per_sequence: f64,
    /// Milliseconds of one decode step (every sequence's next token).
    pub step_ms: f64,
}

fn mean(v: &[u64]) -> f64 {
    v.iter().map(|&x| x as f64).sum::<f64>() / v.len().max(1) as f64
}

/// Warm up, then time `repetitions` runs of `spec` on `model` (loaded with
/// room for `spec.sequences` sequences of `prompt + gen` positions).
pub fn run_batched(
    model: &mut Model,
    spec: BatchedSpec,
    repetitions: usize,
    seed: u64,
) -> Result<(Vec<u64>, Vec<u64>)> {
    if spec.sequences == 0 || spec.prompt == 0 {
        return Err(Error::Invalid(
            "a batched test needs at least one sequence and one prompt token".into(),
        ));
    }
    if spec.prompt + spec.gen > model.capacity() || spec.sequences > model.max_sequences() {
        return Err(Error::Invalid(format!(
            "{} sequences of {} positions do not fit a model loaded for {} of {}",
            spec.sequences,
            spec.prompt + spec.gen,
            model.max_sequences(),
            model.capacity()
        )));
    }
    let vocab = model.config().vocab as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut pp_ns, mut tg_ns) = (Vec::new(), Vec::new());
    for rep in 0..=repetitions {
        let prompts: Vec<Vec<u32>> = (0..spec.sequences)
            .map(|_| (0..spec.prompt).map(|_| rng.gen_range(0..vocab)).collect())
            .collect();
        let mut rows: Vec<(SeqId, u32)> = Vec::with_capacity(spec.sequences);
        let run = (|| {
            let start = Instant::now();
            for p in &prompts {
                // Random prompts share no prefix: every token is evaluated.
                let (seq, _) = model.add_sequence(&[])?;
                rows.push((seq, 0));
                let Output::Token(t) = model.prefill(seq, p, Want::Argmax)? else {
                    return Err(Error::Invalid("expected a token".into()));
                };
                if let Some(r) = rows.last_mut() {
                    r.1 = t;
                }
            }
            let pp = start.elapsed().as_nanos();
            let start = Instant::now();
            for _ in 0..spec.gen {
                let outs = model.decode_rows(&rows, Want::Argmax)?;
                for (row, out) in rows.iter_mut().zip(outs) {
                    if let Output::Token(t) = out {
                        row.1 = t;
                    }
                }
            }
            Ok((pp, start.elapsed().as_nanos()))
        })();
        for &(seq, _) in &rows {
            model.free_sequence(seq)?;
        }
        let (pp, tg) = run?;
        if rep > 0 {
            pp_ns.push(u64::try_from(pp).unwrap_or(u64::MAX));
            tg_ns.push(u64::try_from(tg).unwrap_or(u64::MAX));
        }
    }
    Ok((pp_ns, tg_ns))
}

impl BatchedRecord {
    pub fn new(
        model_filename: &str,
        backend: &str,
        spec: BatchedSpec,
        pp_ns: Vec<u64>,
        tg_ns: Vec<u64>,
    ) -> Self {
        let rate = |tokens: usize, ns: &[u64]| {
            let per: Vec<f64> = ns
                .iter()
                .map(|&n| tokens as f64 * 1e9 / n.max(1) as f64)
                .collect();
            per.iter().sum::<f64>() / per.len().max(1) as f64
        };
        let pp_ts = rate(spec.sequences * spec.prompt, &pp_ns);
        let tg_ts = rate(spec.sequences * spec.gen, &tg_ns);
        BatchedRecord {
            model_filename: model_filename.to_owned(),
            backend: backend.to_owned(),
            spec,
            pp_ts,
            tg_ts,
            tg_ts_per_sequence: tg_ts / spec.sequences as f64,
            step_ms: mean(&tg_ns) / spec.gen.max(1) as f64 / 1e6,
            pp_ns,
            tg_ns,
        }
    }
}

/// llama-batched-bench's table.
pub fn batched_table(records: &[BatchedRecord]) -> String {
    let mut out = String::from(
        "| model | backend | PP | TG | B | S_PP t/s | S_TG t/s | t/s per sequence | ms per step |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in records {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} |",
            r.model_filename,
            r.backend,
            r.spec.prompt,
            r.spec.gen,
            r.spec.sequences,
            r.pp_ts,
            r.tg_ts,
            r.tg_ts_per_sequence,
            r.step_ms
        );
    }
    out
}
