//! `round_i8`: each row rounded to the int8 levels of its largest magnitude
//! (BitNet's per-token activation quantization), in place.

use super::par;

/// Every row of `dim` values of `x`: `clamp(round(v · s), -128, 127) / s`,
/// `s = 127 / max(max|v|, 1e-5)`, ties to even, in f32 as transformers does.
pub(crate) fn run(par: bool, x: &mut [f32], dim: usize) {
    par::chunks(par, x, dim, |_, row| round_row(row));
}

/// One row of [`run`], vectorized for AVX2 where the CPU has it (the same
/// IEEE operations): it runs on the calling thread before every BitNet
/// projection.
fn round_row(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(row: &mut [f32]) {
            round_row_in(row)
        }
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { avx2(row) };
    }
    round_row_in(row)
}

#[inline(always)]
fn round_row_in(row: &mut [f32]) {
    let amax = abs_max(row).max(1e-5);
    let s = 127.0 / amax;
    for v in row.iter_mut() {
        let t = (*v * s).clamp(-128.0, 127.0);
        *v = ties_even(t) / s;
    }
}

/// The largest |x| of `x`, NaN skipped as `f32::max` skips it: |x| as
/// bits, NaN as 0, in eight running integer maxima that vectorize.
#[inline(always)]
pub(crate) fn abs_max(x: &[f32]) -> f32 {
    let mut lanes = [0u32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (m, v) in lanes.iter_mut().zip(c) {
            let b = v.to_bits() & 0x7FFF_FFFF;
            *m = (*m).max(if b > 0x7F80_0000 { 0 } else { b });
        }
    }
    for (m, v) in lanes.iter_mut().zip(chunks.remainder()) {
        let b = v.to_bits() & 0x7FFF_FFFF;
        *m = (*m).max(if b > 0x7F80_0000 { 0 } else { b });
    }
    f32::from_bits(lanes.into_iter().max().unwrap_or(0))
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
