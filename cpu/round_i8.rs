//! `round_i8`: each row rounded to the int8 levels of its largest magnitude
//! (BitNet's per-token activation quantization), in place.

use super::par;

/// Every row of `dim` values of `x`: `clamp(round(v · s), -128, 127) / s`,
/// `s = 127 / max(max|v|, 1e-5)`, ties to even, in f32 as transformers does.
pub(crate) fn run(par: bool, x: &mut [f32], dim: usize) {
    par::chunks(par, x, dim, |_, row| {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-5);
        let s = 127.0 / amax;
        for v in row.iter_mut() {
            *v = (*v * s).round_ties_even().clamp(-128.0, 127.0) / s;
        }
    });
}
