//! Picking the next token from logits: repetition penalty, top-k, top-p,
//! min-p and temperature, applied in llama.cpp's order, then a draw from a
//! seeded ChaCha8 generator so a seed always gives the same text.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Divides the logits; `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 turns it off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches
    /// `top_p`; `>= 1` turns it off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `<= 0`
    /// turns it off.
    pub min_p: f32,
    /// Penalty for tokens among the last `repeat_last_n` of the history:
    /// positive logits are divided by it, negative ones multiplied; 1 is off.
    pub repeat_penalty: f32,
    /// How much history the penalty looks at; 0 turns it off.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0x5EED,
        }
    }
}

impl SamplerConfig {
    /// Refuses values with no meaning: NaN or infinite numbers, and a repeat
    /// penalty at or below 0 (it divides logits). The documented "off"
    /// values (temperature <= 0, top-p >= 1, min-p <= 0) are accepted.
    pub fn validate(&self) -> crate::error::Result<()> {
        let finite = [
            ("temperature", self.temperature),
            ("top-p", self.top_p),
            ("min-p", self.min_p),
            ("repeat penalty", self.repeat_penalty),
        ];
        if let Some((name, x)) = finite.iter().find(|(_, x)| !x.is_finite()) {
            return Err(crate::error::Error::Invalid(format!(
                "sampler {name} {x} is not a finite number"
            )));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(crate::error::Error::Invalid(format!(
                "sampler repeat penalty {} must be above 0 (1 is off)",
                self.repeat_penalty
            )));
        }
        Ok(())
    }

    /// Always the most likely token.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        }
    }
}

pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
}

/// A token id with its (adjusted) logit.
#[derive(Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f32,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        Sampler { cfg, rng }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Whether every draw is the argmax (no randomness involved).
    pub fn is_greedy(&self) -> bool {
        self.cfg.temperature <= 0.0 || self.cfg.top_k == 1
    }

    /// Whether every draw is the argmax of the logits as they come (greedy,
    /// no repetition penalty rewriting them): a device's argmax can stand in.
    pub fn is_plain_argmax(&self) -> bool {
        self.is_greedy() && !self.penalizes()
    }

    /// The next token given `logits` (one per vocabulary entry) and the ids
    /// generated so far (for the repetition penalty). NaN logits are never
    /// picked; if no logit is usable, returns 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        // The penalty rewrites a few logits: on a copy, so callers' stay.
        let penalized;
        let logits = if self.penalizes() {
            let mut l = logits.to_vec();
            self.apply_repeat_penalty(&mut l, history);
            penalized = l;
            &penalized[..]
        } else {
            logits
        };
        if self.is_greedy() {
            return argmax(logits);
        }
        let mut cands = top_candidates(logits, self.cfg.top_k);
        match cands.first() {
            Some(c) if c.logit > f32::NEG_INFINITY => {}
            _ => return 0,
        }
        let probs = softmax(&cands, 1.0);
        let mut keep = cands.len();
        if self.cfg.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, p) in probs.iter().enumerate() {
                cum += p;
                if cum >= self.cfg.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if self.cfg.min_p > 0.0 {
            let floor = probs[0] * self.cfg.min_p as f64;
            let above = probs[..keep].iter().take_while(|&&p| p >= floor).count();
            keep = above.max(1);
        }
        cands.truncate(keep);
        let probs = softmax(&cands, self.cfg.temperature);
        let u: f64 = self.rng.gen();
        let mut cum = 0.0;
        for (c, p) in cands.iter().zip(&probs) {
            cum += p;
            if u < cum {
                return c.id;
            }
        }
        // Rounding left `cum` a hair under 1 and `u` above it.
        cands.last().map_or(0, |c| c.id)
    }

    fn penalizes(&self) -> bool {
        let penalty = self.cfg.repeat_penalty;
        penalty != 1.0 && self.cfg.repeat_last_n > 0 && !penalty.is_nan()
    }

    fn apply_repeat_penalty(&self, logits: &mut [f32], history: &[u32]) {
        let penalty = self.cfg.repeat_penalty;
        let recent = &history[history.len().saturating_sub(self.cfg.repeat_last_n)..];
        let mut seen = std::collections::HashSet::new();
        for &id in recent {
            if !seen.insert(id) {
                continue;
            }
            if let Some(l) = logits.get_mut(id as usize) {
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
        }
    }
}

/// A logit as the sampler ranks it: NaN can never win, and +inf is
/// clamped so softmax stays finite.
fn rank(l: f32) -> f32 {
    if l.is_nan() {
        f32::NEG_INFINITY
    } else {
        l.min(f32::MAX)
    }
}

/// Index of the largest logit; the first one on ties, 0 if all are -inf.
/// The maximum first (vectorized), then the run of 64 that holds it.
fn argmax(logits: &[f32]) -> u32 {
    let best = max_rank(logits);
    for (r, run) in logits.chunks(64).enumerate() {
        if max_rank(run) == best {
            let j = run.iter().position(|&l| rank(l) == best).unwrap_or(0);
            return (r * 64 + j) as u32;
        }
    }
    0
}

/// The largest [`rank`] in `logits` (-inf when empty), in eight lanes so
/// it vectorizes (an in-order float reduction does not).
fn max_rank(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut eights = logits.chunks_exact(8);
    for e in &mut eights {
        for (m, &l) in lanes.iter_mut().zip(e) {
            // NaN compares false: never taken.
            *m = if l > *m { l } else { *m };
        }
    }
    let tail = eights.remainder().iter().copied();
    tail.chain(lanes)
        .fold(f32::NEG_INFINITY, |m, l| if l > m { l } else { m })
        .min(f32::MAX)
}

/// Highest logit first, ties by id.
fn order(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// The `k` best candidates (all when `k` is 0), sorted by [`order`]. One
/// pass over the vocabulary: a buffer of a few `k` is cut back to the best
/// `k` whenever it fills, and afterwards only ids that beat the `k`-th
/// enter. Ids arrive in increasing order, so a later id ties with none of
/// the kept ones: beating means a higher logit. Same result as sorting the
/// whole vocabulary, in a few hundred microseconds less on 128K entries.
fn top_candidates(logits: &[f32], k: usize) -> Vec<Candidate> {
    let mut cands: Vec<Candidate>;
    if k == 0 || k >= logits.len() {
        cands = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: i as u32,
                logit: rank(l),
            })
            .collect();
    } else {
        let cap = (4 * k).max(256);
        cands = Vec::with_capacity(cap);
        let mut floor: Option<f32> = None;
        // Whole runs below the floor are skipped by their maximum.
        for (r, run) in logits.chunks(64).enumerate() {
            if floor.is_some_and(|f| max_rank(run) <= f) {
                continue;
            }
            for (j, &l) in run.iter().enumerate() {
                let logit = rank(l);
                if floor.is_some_and(|f| logit <= f) {
                    continue;
                }
                cands.push(Candidate {
                    id: (r * 64 + j) as u32,
                    logit,
                });
                if cands.len() == cap {
                    cands.select_nth_unstable_by(k - 1, order);
                    cands.truncate(k);
                    floor = cands.iter().map(|c| c.logit).reduce(f32::min);
                }
            }
        }
        if cands.len() > k {
            cands.select_nth_unstable_by(k - 1, order);
            cands.truncate(k);
        }
    }
    cands.sort_unstable_by(order);
    cands
}

/// Probabilities of `cands` (sorted, highest logit first) at `temperature`,
/// in f64 so long tails still sum to 1.
fn softmax(cands: &[Candidate], temperature: f32) -> Vec<f64> {
    let t = temperature as f64;
    let max = cands.first().map_or(0.0, |c| c.logit as f64);
    let exps: Vec<f64> = cands
        .iter()
        .map(|c| ((c.logit as f64 - max) / t).exp())
        .collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}
