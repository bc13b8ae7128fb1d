//! `out = x / sqrt(mean(x²) + eps) * w` per row, in the order Hugging Face
//! computes it (`(x * rsqrt(var + eps)) * w`); the mean is summed in f64.

use super::par;

/// `Σ f(x[i])` in f64 over eight independent partial sums, so the sum
/// vectorizes instead of waiting on one accumulator.
pub(super) fn sum_f64(x: &[f32], f: impl Fn(f64) -> f64) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += f(*v as f64);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|v| f(*v as f64)).sum();
    acc.iter().sum::<f64>() + tail
}

pub(crate) fn run(par: bool, x: &[f32], w: &[f32], out: &mut [f32], dim: usize, eps: f32) {
    par::chunks(par, out, dim, |r, o| {
        let xr = &x[r * dim..(r + 1) * dim];
        let ms = (sum_f64(xr, |v| v * v) / dim as f64) as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), g) in o.iter_mut().zip(xr).zip(w) {
            *o = (v * inv) * g;
        }
    });
}
