//! `out = x / sqrt(mean(x²) + eps) * w` per row, in the order Hugging Face
//! computes it (`(x * rsqrt(var + eps)) * w`); the mean is summed in f64.

use super::par;

pub(crate) fn run(par: bool, x: &[f32], w: &[f32], out: &mut [f32], dim: usize, eps: f32) {
    par::chunks(par, out, dim, |r, o| {
        let xr = &x[r * dim..(r + 1) * dim];
        let ms = (xr.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / dim as f64) as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, v), g) in o.iter_mut().zip(xr).zip(w) {
            *o = (v * inv) * g;
        }
    });
}
