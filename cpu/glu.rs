//! `out = act(gate) * up` (or `act(gate)`), f32; gpt-oss's SwiGLU
//! `act(gate) * (clamp(up, -7, 7) + 1)`.

use super::par;
use crate::backend::Activation;

pub(crate) fn run(par: bool, act: Activation, gate: &[f32], up: Option<&[f32]>, out: &mut [f32]) {
    // One loop per activation, so each compiles on its own: the match
    // inside the loop kept even ReLU² from vectorizing.
    let keep = |u: f32| u;
    match act {
        Activation::Silu => apply(par, gate, up, out, |x| x / (1.0 + exp(-x)), keep),
        Activation::GeluTanh => apply(par, gate, up, out, gelu_tanh, keep),
        Activation::SwigluOai => {
            let limit = Activation::OAI_LIMIT;
            let oai = |x: f32| {
                let g = x.min(limit);
                g / (1.0 + exp(-Activation::OAI_ALPHA * g))
            };
            apply(par, gate, up, out, oai, |u| u.clamp(-limit, limit) + 1.0)
        }
        Activation::Relu2 => apply(par, gate, up, out, |x| x.max(0.0) * x.max(0.0), keep),
    }
}

/// `e^x` within ~2 ulp in operations that vectorize (libm's `expf` is a
/// call per value: SiLU was 2.5 ns a value): `2^n · e^r` with
/// `r = x − n·ln 2` in ±ln 2 / 2 and a degree-7 Taylor polynomial. `x` is
/// clamped to where `2^n` is a normal float: beyond, e^x is below 1.2e-38
/// or above 2e38, which no activation tells apart from 0 or ∞ (x / e^-x).
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.3, 88.3);
    let n = super::round_i8::ties_even(x * std::f32::consts::LOG2_E);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.0 / 5040.0;
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * r + c;
    }
    p * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

fn gelu_tanh(x: f32) -> f32 {
    // sqrt(2 / pi)
    const C: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// `out = act(gate) * up_term(up)` (or `act(gate)`), in chunks on the team.
fn apply(
    par: bool,
    gate: &[f32],
    up: Option<&[f32]>,
    out: &mut [f32],
    act: impl Fn(f32) -> f32 + Sync + Send,
    up_term: impl Fn(f32) -> f32 + Sync + Send,
) {
    const CHUNK: usize = 4096;
    par::chunks(par, out, CHUNK, |c, o| {
        let g = &gate[c * CHUNK..c * CHUNK + o.len()];
        let u = up.map(|u| &u[c * CHUNK..c * CHUNK + o.len()]);
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(
                o: &mut [f32],
                g: &[f32],
                u: Option<&[f32]>,
                act: &impl Fn(f32) -> f32,
                up_term: &impl Fn(f32) -> f32,
            ) {
                apply_chunk(o, g, u, act, up_term)
            }
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            return unsafe { avx2(o, g, u, &act, &up_term) };
        }
        apply_chunk(o, g, u, &act, &up_term)
    });
}

/// One chunk of [`apply`] (inlined where it is compiled for AVX2, 8 values
/// a step).
#[inline(always)]
fn apply_chunk(
    o: &mut [f32],
    g: &[f32],
    u: Option<&[f32]>,
    act: &impl Fn(f32) -> f32,
    up_term: &impl Fn(f32) -> f32,
) {
    match u {
        Some(u) => {
            for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                *o = act(*g) * up_term(*u);
            }
        }
        None => {
            for (o, g) in o.iter_mut().zip(g) {
                *o = act(*g);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_is_within_a_few_ulp_of_f64() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = super::exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "relative error {worst:e}");
        assert_eq!(super::exp(-1e4), super::exp(-87.3));
        assert!(super::exp(f32::NAN).is_nan());
        let big = super::exp(1e4);
        assert!(big.is_finite() && big > 2e38);
    }
}
