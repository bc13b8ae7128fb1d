//! Each sampling stage on crafted distributions, seeding, and empirical
//! frequencies against the truncated softmax worked out independently here.

use vkllm::model::sampling::{Sampler, SamplerConfig};

/// Pure sampling: every truncation off, temperature 1.
fn plain() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        seed: 7,
    }
}

/// Logits whose softmax at temperature 1 is exactly `probs`.
fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

/// Share of each id over `n` draws.
fn frequencies(cfg: SamplerConfig, logits: &[f32], history: &[u32], n: usize) -> Vec<f64> {
    let mut s = Sampler::new(cfg);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[s.sample(logits, history) as usize] += 1;
    }
    counts.into_iter().map(|c| c as f64 / n as f64).collect()
}

/// Largest |observed - expected| allowed over 20000 draws: the standard
/// error of a share is at most sqrt(0.25 / 20000) = 0.0035, so 0.015 is over
/// four standard errors (a false failure is ~1e-5 likely per share), while
/// every mistake the tests look for moves a share by far more.
const TOL: f64 = 0.015;
const DRAWS: usize = 20_000;

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= TOL,
            "id {i}: observed {g:.4}, expected {w:.4} (all: {got:?} vs {want:?})"
        );
    }
}

#[test]
fn greedy_is_argmax_first_on_ties() {
    let mut s = Sampler::new(SamplerConfig::greedy());
    assert!(s.is_greedy());
    assert_eq!(s.sample(&[0.1, 3.0, -2.0, 3.0, 2.9], &[]), 1);
    assert_eq!(s.sample(&[-5.0, -1.0, -1.0], &[]), 1);
    assert_eq!(s.sample(&[4.0], &[]), 0);
    assert!(!Sampler::new(SamplerConfig::default()).is_greedy());
}

#[test]
fn top_k_one_always_picks_the_max() {
    let cfg = SamplerConfig {
        top_k: 1,
        ..plain()
    };
    assert!(Sampler::new(cfg.clone()).is_greedy());
    let logits = [0.5f32, 1.0, 0.99, -3.0, 0.98];
    let f = frequencies(cfg, &logits, &[], 2000);
    assert_eq!(f[1], 1.0);
}

#[test]
fn top_k_keeps_the_k_most_likely() {
    let probs = [0.1, 0.4, 0.2, 0.3];
    let cfg = SamplerConfig {
        top_k: 2,
        ..plain()
    };
    let f = frequencies(cfg, &logits_of(&probs), &[], DRAWS);
    assert_close(&f, &[0.0, 4.0 / 7.0, 0.0, 3.0 / 7.0]);
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let probs = [0.15, 0.5, 0.05, 0.3];
    let logits = logits_of(&probs);
    // 0.5 + 0.3 = 0.8 >= 0.75: two tokens.
    let f = frequencies(
        SamplerConfig {
            top_p: 0.75,
            ..plain()
        },
        &logits,
        &[],
        DRAWS,
    );
    assert_close(&f, &[0.0, 0.625, 0.0, 0.375]);
    // 0.8 < 0.85: the third most likely joins.
    let f = frequencies(
        SamplerConfig {
            top_p: 0.85,
            ..plain()
        },
        &logits,
        &[],
        DRAWS,
    );
    assert_close(&f, &[0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95]);
    // A tiny p still keeps the most likely token.
    let f = frequencies(
        SamplerConfig {
            top_p: 0.01,
            ..plain()
        },
        &logits,
        &[],
        500,
    );
    assert_eq!(f[1], 1.0);
}

#[test]
fn min_p_drops_tokens_below_min_p_times_the_max() {
    let probs = [0.15, 0.5, 0.05, 0.3];
    let logits = logits_of(&probs);
    // Floor 0.2 * 0.5 = 0.1: only 0.05 goes.
    let f = frequencies(
        SamplerConfig {
            min_p: 0.2,
            ..plain()
        },
        &logits,
        &[],
        DRAWS,
    );
    assert_close(&f, &[0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95]);
    // Floor 0.5 * 0.5 = 0.25: 0.15 goes too.
    let f = frequencies(
        SamplerConfig {
            min_p: 0.5,
            ..plain()
        },
        &logits,
        &[],
        DRAWS,
    );
    assert_close(&f, &[0.0, 0.625, 0.0, 0.375]);
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative_logits() {
    let penalized = |history: &[u32], last_n: usize, logits: &[f32]| {
        let cfg = SamplerConfig {
            repeat_penalty: 1.5,
            repeat_last_n: last_n,
            ..SamplerConfig::greedy()
        };
        Sampler::new(cfg).sample(logits, history)
    };
    // 2.0 / 1.5 = 1.33 < 1.9: the argmax flips.
    assert_eq!(penalized(&[], 64, &[2.0, 1.9, -1.0]), 0);
    assert_eq!(penalized(&[0], 64, &[2.0, 1.9, -1.0]), 1);
    // Repeats count once: 2.0 / 1.5, not / 1.5^3.
    assert_eq!(penalized(&[0, 0, 0], 64, &[2.0, 1.2, -1.0]), 0);
    // -1.0 * 1.5 = -1.5 < -1.2.
    assert_eq!(penalized(&[0], 64, &[-1.0, -1.2]), 1);
    // Outside the last `repeat_last_n` ids nothing is penalized.
    assert_eq!(penalized(&[0, 2, 2], 2, &[2.0, 1.9, -1.0]), 0);
    assert_eq!(penalized(&[0, 2, 2], 3, &[2.0, 1.9, -1.0]), 1);
    // Ids beyond the vocabulary are ignored.
    assert_eq!(penalized(&[99, u32::MAX], 64, &[2.0, 1.9]), 0);
}

#[test]
fn repeat_penalty_lowers_a_repeated_tokens_share() {
    let logits = [1.0f32, 1.0];
    let cfg = SamplerConfig {
        repeat_penalty: 2.0,
        ..plain()
    };
    // Token 0's logit halves: p0 = e^0.5 / (e^0.5 + e^1).
    let p0 = 0.5f64.exp() / (0.5f64.exp() + 1f64.exp());
    let f = frequencies(cfg, &logits, &[0], DRAWS);
    assert_close(&f, &[p0, 1.0 - p0]);
}

#[test]
fn low_temperature_approaches_greedy_high_temperature_spreads() {
    let logits = [1.0f32, 0.9, 0.5];
    let at = |t: f32| {
        frequencies(
            SamplerConfig {
                temperature: t,
                ..plain()
            },
            &logits,
            &[],
            DRAWS,
        )
    };
    // t = 0.01: the runner-up has weight e^-10 relative to the max.
    assert!(at(0.01)[0] > 0.999);
    // t = 1: the plain softmax.
    let e: Vec<f64> = logits.iter().map(|&l| (l as f64).exp()).collect();
    let sum: f64 = e.iter().sum();
    assert_close(&at(1.0), &[e[0] / sum, e[1] / sum, e[2] / sum]);
    // t = 100: nearly uniform.
    assert_close(&at(100.0), &[1.0 / 3.0; 3]);
}

#[test]
fn all_stages_together_match_the_truncated_softmax() {
    // Probabilities at t=1, scattered over the ids so sorting matters.
    let probs = [0.03, 0.25, 0.005, 0.1, 0.4, 0.015, 0.05, 0.15];
    let cfg = SamplerConfig {
        temperature: 0.5,
        top_k: 5,
        top_p: 0.9,
        min_p: 0.3,
        repeat_penalty: 1.0,
        repeat_last_n: 64,
        seed: 42,
    };
    // top_k 5 keeps .4 .25 .15 .1 .05 (sum .95); renormalized, the running
    // sum reaches .9 at the fourth (.4+.25+.15+.1 = .9/.95 = .947), so top_p
    // drops .05; min_p's floor .3 * (.4/.95) = .126 drops .1/.95 = .105.
    // Temperature .5 on the rest: weights p^2.
    let kept = [(4usize, 0.4f64), (1, 0.25), (7, 0.15)];
    let total: f64 = kept.iter().map(|(_, p)| p * p).sum();
    let mut want = vec![0.0; probs.len()];
    for (id, p) in kept {
        want[id] = p * p / total;
    }
    let f = frequencies(cfg, &logits_of(&probs), &[], DRAWS);
    assert_close(&f, &want);
}

#[test]
fn same_seed_same_sequence_different_seed_different_sequence() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let run = |seed: u64| {
        let mut s = Sampler::new(SamplerConfig {
            seed,
            ..SamplerConfig::default()
        });
        (0..200)
            .map(|_| s.sample(&logits, &[]))
            .collect::<Vec<u32>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
    assert_ne!(run(SamplerConfig::default().seed), run(0));
    // And the draws are not all the same token.
    let seq = run(3);
    assert!(seq.iter().any(|&t| t != seq[0]));
}

#[test]
fn nan_and_infinite_logits_do_not_panic() {
    let nan = f32::NAN;
    for cfg in [SamplerConfig::default(), SamplerConfig::greedy(), plain()] {
        let mut s = Sampler::new(cfg);
        for _ in 0..200 {
            // NaN is never chosen.
            assert_ne!(s.sample(&[nan, 1.0, 0.5, nan], &[0, 1]), 0);
            assert_ne!(s.sample(&[nan, 1.0, 0.5, nan], &[0, 1]), 3);
        }
        // Nothing usable: id 0, no panic.
        assert_eq!(s.sample(&[nan, nan], &[]), 0);
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 3], &[]), 0);
        assert_eq!(s.sample(&[], &[]), 0);
        // +inf wins outright.
        assert_eq!(s.sample(&[0.0, f32::INFINITY, 1.0], &[]), 1);
    }
}

#[test]
fn defaults_are_llama_cpp_like() {
    let d = SamplerConfig::default();
    assert_eq!(
        (
            d.temperature,
            d.top_k,
            d.top_p,
            d.min_p,
            d.repeat_penalty,
            d.repeat_last_n,
            d.seed
        ),
        (0.8, 40, 0.95, 0.05, 1.0, 64, 0x5EED)
    );
    assert_eq!(SamplerConfig::greedy().temperature, 0.0);
}

/// Top-k over a large vocabulary full of ties (the sampler selects it in
/// one pass, cutting a buffer back as it fills): every draw is one of the
/// k ids a full sort by (logit, then id) keeps, and the kept ids are drawn
/// at their softmax shares.
#[test]
fn top_k_over_a_large_vocabulary_keeps_the_sorted_first_k() {
    let mut x = 99u64;
    let logits: Vec<f32> = (0..20_000)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((x >> 33) % 9) as f32 * 0.5 // nine levels: thousands of ties each
        })
        .collect();
    for k in [40, 300, 1000] {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let kept = &order[..k];
        let cfg = SamplerConfig {
            top_k: k,
            ..plain()
        };
        let got = frequencies(cfg, &logits, &[], DRAWS);
        let mut want = vec![0.0; logits.len()];
        let z: f64 = kept.iter().map(|&i| (logits[i] as f64).exp()).sum();
        for &i in kept {
            want[i] = (logits[i] as f64).exp() / z;
        }
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                w > 0.0 || g == 0.0,
                "k {k}: id {i} drawn but not among the top k"
            );
        }
        assert_close(&got, &want);
    }
}
