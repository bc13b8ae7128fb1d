//! Random valid blocks of a quantized type, for the types vkllm has no
//! quantizer for (the IQ2 / IQ3 grids) and for `synth --fast`: decode and
//! matmul speed do not depend on the values, and a full quantizer search
//! costs minutes on a large model.
//!
//! Every bit of a block is random except its scales: a grid index, sign
//! pattern or sub-block scale of any value decodes (the grids have an entry
//! for every index; TQ2_0 alone keeps its 2-bit digits to the three that
//! mean -1, 0 and 1). The scales are set once per call so that the values
//! have about the weights' spread and, for types with a minimum, about zero
//! mean: the block decodes linearly in its scale `d` (and minimum `m`), so
//! the type's values at `d = 1` and at `m = 1` measured on a few random
//! blocks give both.

use crate::dtype::DType;
use crate::error::{Error, Result};
use half::f16;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Where a type's block keeps the scales its values are linear in.
#[derive(Clone, Copy)]
enum Scales {
    /// An f16 scale at byte `d`, and an f16 minimum (or offset) at `min`.
    F16 { d: usize, min: Option<usize> },
    /// MXFP4's power-of-two scale: an E8M0 exponent byte at 0.
    E8m0,
}

/// The scale fields of `t`'s block (ggml's block structs); `None` for the
/// float types, which have no blocks to randomize.
fn scales(t: DType) -> Option<Scales> {
    use DType as T;
    let f16_at = |d, min| Some(Scales::F16 { d, min });
    match t {
        T::F32 | T::F16 | T::BF16 => None,
        T::MXFP4 => Some(Scales::E8m0),
        T::Q4_1 | T::Q5_1 | T::Q4K | T::Q5K => f16_at(0, Some(2)),
        T::Q2K => f16_at(80, Some(82)),
        T::Q3K => f16_at(108, None),
        T::Q6K => f16_at(208, None),
        T::TQ1_0 => f16_at(52, None),
        T::TQ2_0 => f16_at(64, None),
        // Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS and the IQ2 / IQ3 grids keep
        // their one f16 scale first.
        _ => f16_at(0, None),
    }
}

/// Random bits for a block of `t`, scale fields not set yet.
fn random_bits(t: DType, rng: &mut ChaCha8Rng, block: &mut [u8]) {
    rng.fill_bytes(block);
    if t == DType::TQ2_0 {
        // Four 2-bit digits per byte (the first 64 bytes), each 0..=2.
        for b in &mut block[..64] {
            *b = (0..4).fold(0u8, |acc, k| acc | (rng.gen_range(0..3u8) << (2 * k)));
        }
    }
}

/// A type's block scales, set the same way in every block.
#[derive(Clone, Copy, Debug)]
struct Setting {
    d: f32,
    min: f32,
}

impl Setting {
    fn apply(self, scales: Scales, block: &mut [u8]) {
        match scales {
            Scales::F16 { d, min } => {
                block[d..d + 2].copy_from_slice(&f16::from_f32(self.d).to_le_bytes());
                if let Some(m) = min {
                    block[m..m + 2].copy_from_slice(&f16::from_f32(self.min).to_le_bytes());
                }
            }
            // `d` is the exponent's value here; it stays in E8M0's range.
            Scales::E8m0 => block[0] = self.d.clamp(1.0, 254.0) as u8,
        }
    }
}

/// Blocks measured to set the scales: enough for a spread within a few
/// percent whatever the block size.
const CALIBRATION_BLOCKS: usize = 64;

/// Mean and standard deviation of `t`'s values in random blocks set to `s`.
fn moments(t: DType, scales: Scales, s: Setting, seed: u64) -> Result<(f64, f64)> {
    let f = t.format();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut block = vec![0u8; f.block_bytes];
    let mut values = vec![0f32; f.block_elems];
    let (mut sum, mut sq, mut count) = (0f64, 0f64, 0f64);
    for _ in 0..CALIBRATION_BLOCKS {
        random_bits(t, &mut rng, &mut block);
        s.apply(scales, &mut block);
        crate::quants::dequantize_row(t, &block, &mut values)?;
        for &v in &values {
            sum += v as f64;
            sq += v as f64 * v as f64;
            count += 1.0;
        }
    }
    let mean = sum / count;
    Ok((mean, (sq / count - mean * mean).max(0.0).sqrt()))
}

/// The scales that give `t`'s random blocks a spread of `std` and, where
/// the type has a minimum, a mean near 0.
fn calibrate(t: DType, scales: Scales, std: f32) -> Result<Setting> {
    let bad = || Error::Invalid(format!("random {t} blocks have no spread to scale"));
    match scales {
        Scales::E8m0 => {
            // E8M0 127 is a scale of 2^0 (times the format's own constant).
            let (_, spread) = moments(t, scales, Setting { d: 127.0, min: 0.0 }, 1)?;
            if !(spread.is_finite() && spread > 0.0) {
                return Err(bad());
            }
            let shift = (std as f64 / spread).log2().round();
            Ok(Setting {
                d: (127.0 + shift) as f32,
                min: 0.0,
            })
        }
        Scales::F16 { min, .. } => {
            let (mean_d, spread_d) = moments(t, scales, Setting { d: 1.0, min: 0.0 }, 1)?;
            if !(spread_d.is_finite() && spread_d > 0.0) {
                return Err(bad());
            }
            let d = std as f64 / spread_d;
            let min = match min {
                Some(_) => {
                    // The blocks' mean at m = 1 (the same bits: same seed).
                    let (mean_m, _) = moments(t, scales, Setting { d: 0.0, min: 1.0 }, 1)?;
                    if mean_m.abs() > f64::EPSILON {
                        -d * mean_d / mean_m
                    } else {
                        0.0
                    }
                }
                None => 0.0,
            };
            Ok(Setting {
                d: d as f32,
                min: min as f32,
            })
        }
    }
}

/// Fill `out` (whole blocks of `t`) with random valid blocks whose values
/// spread about `std` around 0.
pub fn fill_random(t: DType, rng: &mut ChaCha8Rng, std: f32, out: &mut [u8]) -> Result<()> {
    let scales =
        scales(t).ok_or_else(|| Error::Invalid(format!("{t} has no blocks to randomize")))?;
    let setting = calibrate(t, scales, std)?;
    for block in out.chunks_exact_mut(t.block_bytes()) {
        random_bits(t, rng, block);
        setting.apply(scales, block);
    }
    Ok(())
}

/// Whether `t` is written as random blocks: always where vkllm cannot
/// quantize to it, every quantized type when `fast`.
pub fn random_blocks(t: DType, fast: bool) -> bool {
    t.is_quantized() && (fast || t.format().encode.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_blocks_of_every_type_decode_to_the_weights_spread() {
        for t in DType::ALL.into_iter().filter(|t| t.is_quantized()) {
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            let mut bytes = vec![0u8; t.block_bytes() * 256];
            fill_random(t, &mut rng, 0.02, &mut bytes).unwrap();
            let mut v = vec![0f32; t.block_elems() * 256];
            crate::quants::dequantize_row(t, &bytes, &mut v).unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{t}: non-finite");
            let n = v.len() as f32;
            let mean = v.iter().sum::<f32>() / n;
            let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n).sqrt();
            // MXFP4's scale moves in powers of two.
            assert!((0.012..0.033).contains(&std), "{t}: std {std}");
            assert!(mean.abs() < 0.5 * std, "{t}: mean {mean} std {std}");
        }
    }
}
