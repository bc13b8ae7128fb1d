//! GGUF block formats: scalar dequantizers bit-exact with ggml's
//! `dequantize_row_*`, and ggml's reference (`*_ref`) quantizers.
//!
//! Used by tests, by load-time quantization, by the synthetic-model writer and
//! as the portable fallback of the CPU kernels.

pub mod act;
mod kquants;
mod legacy;

#[cfg(target_arch = "x86_64")]
pub(crate) use kquants::scale_min_k4;

use crate::dtype::DType;
use crate::error::{Error, Result};
use half::{bf16, f16};

/// `dst.len()` values from the `dtype` row `src`; `src` must hold exactly
/// `dtype.row_bytes(dst.len())` bytes.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_row("dequantize_row", dtype, src.len(), dst.len())?;
    match dtype {
        DType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        DType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
            }
        }
        DType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
            }
        }
        _ => {
            let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
            for (block, out) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(be)) {
                dequantize_block(dtype, block, out);
            }
        }
    }
    Ok(())
}

/// One quantized block (`dtype.block_bytes()` bytes) into `dtype.block_elems()` values.
/// Callers guarantee the lengths.
pub(crate) fn dequantize_block(dtype: DType, block: &[u8], out: &mut [f32]) {
    match dtype {
        DType::Q8_0 => legacy::dequant_q8_0(block, out),
        DType::Q4_0 => legacy::dequant_q4_0(block, out),
        DType::Q4_1 => legacy::dequant_q4_1(block, out),
        DType::Q5_0 => legacy::dequant_q5_0(block, out),
        DType::Q5_1 => legacy::dequant_q5_1(block, out),
        DType::Q4K => kquants::dequant_q4_k(block, out),
        DType::Q5K => kquants::dequant_q5_k(block, out),
        DType::Q6K => kquants::dequant_q6_k(block, out),
        DType::F32 => out[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
        DType::F16 => out[0] = f16_at(block, 0),
        DType::BF16 => out[0] = bf16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32(),
    }
}

/// Quantize `src` into the `dtype` row `dst` (`dtype.row_bytes(src.len())` bytes)
/// with ggml's reference quantizers.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    check_row("quantize_row", dtype, dst.len(), src.len())?;
    match dtype {
        DType::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        DType::F16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16::from_f32(*s).to_bits().to_le_bytes());
            }
        }
        DType::BF16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(*s).to_bits().to_le_bytes());
            }
        }
        _ => {
            let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
            for (x, block) in src.chunks_exact(be).zip(dst.chunks_exact_mut(bb)) {
                match dtype {
                    DType::Q8_0 => legacy::quant_q8_0(x, block),
                    DType::Q4_0 => legacy::quant_q4_0(x, block),
                    DType::Q4_1 => legacy::quant_q4_1(x, block),
                    DType::Q5_0 => legacy::quant_q5_0(x, block),
                    DType::Q5_1 => legacy::quant_q5_1(x, block),
                    DType::Q4K => kquants::quant_q4_k(x, block),
                    DType::Q5K => kquants::quant_q5_k(x, block),
                    _ => kquants::quant_q6_k(x, block),
                }
            }
        }
    }
    Ok(())
}

fn check_row(op: &'static str, dtype: DType, bytes: usize, elems: usize) -> Result<()> {
    let need = dtype.row_bytes(elems)?;
    if bytes != need {
        return Err(Error::op(
            op,
            format!("{elems} {dtype} values need {need} bytes, got {bytes}"),
        ));
    }
    Ok(())
}

/// Little-endian f16 at `b[i..i + 2]` as f32.
#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

#[inline]
pub(crate) fn put_f16(b: &mut [u8], i: usize, v: f32) {
    b[i..i + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// f32 rounded through f16, as ggml stores block scales.
#[inline]
pub(crate) fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// ggml's `nearest_int`: round half to even via the 1.5·2²³ trick (|x| < 2²²).
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}
