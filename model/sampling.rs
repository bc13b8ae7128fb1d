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

    /// The next token given `logits` (one per vocabulary entry) and the ids
    /// generated so far (for the repetition penalty). NaN logits are never
    /// picked; if no logit is usable, returns 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let mut cands: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: i as u32,
                // NaN can never win; +inf is clamped so softmax stays finite.
                logit: if l.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    l.min(f32::MAX)
                },
            })
            .collect();
        self.apply_repeat_penalty(&mut cands, history);
        if self.is_greedy() {
            return argmax(&cands);
        }
        sort_top(&mut cands, self.cfg.top_k);
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

    fn apply_repeat_penalty(&self, cands: &mut [Candidate], history: &[u32]) {
        let penalty = self.cfg.repeat_penalty;
        if penalty == 1.0 || self.cfg.repeat_last_n == 0 || penalty.is_nan() {
            return;
        }
        let recent = &history[history.len().saturating_sub(self.cfg.repeat_last_n)..];
        let mut seen = std::collections::HashSet::new();
        for &id in recent {
            if !seen.insert(id) {
                continue;
            }
            if let Some(c) = cands.get_mut(id as usize) {
                c.logit = if c.logit > 0.0 {
                    c.logit / penalty
                } else {
                    c.logit * penalty
                };
            }
        }
    }
}

/// Index of the largest logit; the first one on ties, 0 if all are -inf.
fn argmax(cands: &[Candidate]) -> u32 {
    let mut best: Option<Candidate> = None;
    for &c in cands {
        match best {
            Some(b) if c.logit <= b.logit => {}
            _ => best = Some(c),
        }
    }
    best.map_or(0, |b| b.id)
}

/// Sorts by logit, highest first (ties by id), keeping only the top `k`
/// (all when `k` is 0) and selecting before sorting so large vocabularies
/// are cheap.
fn sort_top(cands: &mut Vec<Candidate>, k: usize) {
    let order = |a: &Candidate, b: &Candidate| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
    if k > 0 && k < cands.len() {
        cands.select_nth_unstable_by(k - 1, order);
        cands.truncate(k);
    }
    cands.sort_unstable_by(order);
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
