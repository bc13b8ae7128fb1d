//! Log-probabilities of tokens: log-softmax of the model's raw logits (before
//! any repetition penalty, temperature or truncation, as OpenAI and
//! llama.cpp's server report them), with the most likely alternatives.

/// Most alternatives a request may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One position's log-probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The token at this position (chosen, or the prompt's).
    pub token: u32,
    /// Its log-probability (`-inf` when its logit was NaN or `-inf`).
    pub logprob: f32,
    /// The `k` most likely tokens and their log-probabilities, most likely
    /// first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// `token`'s log-probability and the top `k` under `logits` (one row,
    /// one value per vocabulary entry).
    pub fn of(logits: &[f32], token: u32, k: usize) -> Self {
        let lse = log_sum_exp(logits);
        let lp = |l: f32| {
            if l.is_nan() {
                f32::NEG_INFINITY
            } else {
                l - lse
            }
        };
        let logprob = logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| lp(l));
        TokenLogprobs {
            token,
            logprob,
            top: top_k(logits, k)
                .into_iter()
                .map(|(id, l)| (id, lp(l)))
                .collect(),
        }
    }
}

/// `log(sum(exp(l)))` over the finite logits, in f64 so a vocabulary of
/// 150k entries sums without losing the small ones.
fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return 0.0;
    }
    let sum: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| ((l - max) as f64).exp())
        .sum();
    (max as f64 + sum.ln()) as f32
}

/// The `k` largest logits with their ids, largest first (NaN never listed).
fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() || (best.len() == k && l <= best[k - 1].1) {
            continue;
        }
        // Kept sorted; k is at most 20, so an insertion is cheap.
        let at = best.partition_point(|&(_, b)| b >= l);
        best.insert(at, (i as u32, l));
        best.truncate(k);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_top_k() {
        let logits = [1.0f32, 3.0, f32::NAN, 2.0, 3.0];
        let t = TokenLogprobs::of(&logits, 3, 3);
        let lse = (1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp()).ln() as f32;
        assert!((t.logprob - (2.0 - lse)).abs() < 1e-6);
        let ids: Vec<u32> = t.top.iter().map(|p| p.0).collect();
        assert_eq!(ids, [1, 4, 3]);
        assert!((t.top[0].1 - (3.0 - lse)).abs() < 1e-6);
        assert_eq!(TokenLogprobs::of(&logits, 2, 0).logprob, f32::NEG_INFINITY);
        assert!(TokenLogprobs::of(&logits, 9, 0).top.is_empty());
    }
}
