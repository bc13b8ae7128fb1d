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
            *v = ties_even((*v * s).clamp(-128.0, 127.0)) / s;
        }
    });
}

/// `v.round_ties_even()` for |v| < 2²²: adding 1.5·2²³ leaves no fraction
/// bits, so the sum is rounded to an integer, ties to even (a negative
/// value that rounds to zero gives +0, not -0: the same number). Plain
/// arithmetic that vectorizes, where `round_ties_even` is a library call
/// on the baseline x86-64 target.
#[inline(always)]
pub(crate) fn ties_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::ties_even;

    #[test]
    fn ties_even_rounds_as_round_ties_even() {
        let mut v = -130.0f32;
        while v <= 130.0 {
            for x in [
                v,
                v + 0.5,
                v + 0.25,
                v + 0.499_999_97,
                -0.0,
                0.0,
                f32::MIN_POSITIVE,
            ] {
                assert_eq!(ties_even(x), x.round_ties_even(), "{x}");
            }
            v += 1.0;
        }
        assert!(ties_even(f32::NAN).is_nan());
    }
}
