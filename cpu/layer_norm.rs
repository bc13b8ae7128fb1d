//! `out = (x - mean) / sqrt(var + eps) * w + b` per row (population variance,
//! statistics summed in f64).

use super::par;
use super::rms_norm::sum_f64;

pub(crate) fn run(
    par: bool,
    x: &[f32],
    w: &[f32],
    b: &[f32],
    out: &mut [f32],
    dim: usize,
    eps: f32,
) {
    par::chunks(par, out, dim, |r, o| {
        let xr = &x[r * dim..(r + 1) * dim];
        let mean = sum_f64(xr, |v| v) / dim as f64;
        let var = sum_f64(xr, |v| (v - mean) * (v - mean)) / dim as f64;
        let (mean, inv) = (mean as f32, 1.0 / (var as f32 + eps).sqrt());
        for (i, (o, v)) in o.iter_mut().zip(xr).enumerate() {
            *o = ((v - mean) * inv) * w[i] + b[i];
        }
    });
}
