//! GGUF element formats: one table ([`FORMATS`]) of per-type facts (ggml id
//! and name, block size and bytes, the block codec, the GPU block layout),
//! from which [`DType`]'s methods, the Vulkan repack and the loaders derive.
//!
//! Each codec is bit-exact with ggml's `dequantize_row_*` and, where vkllm
//! has one, a port of ggml's reference (`*_ref`) quantizer. Used by the
//! loaders, load-time quantization, the synthetic-model writer, the scalar
//! reference and as the portable fallback of the CPU kernels.
//!
//! Adding a type: a `DType` variant, its row here, its codec, its GLSL decode
//! in glsl/dequant.glsl (build.rs compiles the shaders for every type that
//! file decodes), its tests.

mod float;
mod iq23;
mod iq4;
mod iq_grids;
mod kquants;
mod kquants_low;
mod legacy;
mod mxfp4;
mod ternary;

pub(crate) use kquants::scale_min_k4;
// Block pieces the CPU's SIMD decoders share with the scalar codecs.
#[cfg(target_arch = "x86_64")]
pub(crate) use {
    iq23::{iq2_scale, iq3_pair, iq3_s_scale, ksigns as iq_ksigns, xxs_scale as iq_xxs_scale},
    iq4::{xs_scale as iq4_xs_scale, KVALUES as IQ4_VALUES},
    iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID},
    kquants_low::q3_k_scales,
    mxfp4::{e8m0_half, KVALUES as MXFP4_VALUES},
};

use crate::dtype::DType;
use crate::error::{Error, Result};
use half::f16;

/// One block (`block_bytes` bytes) into `block_elems` values.
pub type Decode = fn(&[u8], &mut [f32]);
/// `block_elems` values into one block (`block_bytes` bytes).
pub type Encode = fn(&[f32], &mut [u8]);

/// Everything vkllm knows about one element type.
pub struct Format {
    pub dtype: DType,
    /// Lower-case ggml name (`q4_k`, `bf16`, ...).
    pub name: &'static str,
    /// The ggml type id used in GGUF tensor infos.
    pub ggml_id: u32,
    /// Elements per block (1 for the float types).
    pub block_elems: usize,
    pub block_bytes: usize,
    pub decode: Decode,
    /// ggml's reference quantizer; `None` where vkllm has none.
    pub encode: Option<Encode>,
    /// How the Vulkan backend lays a block out (`None`: as GGUF stores it).
    pub gpu: Option<Repack>,
}

/// A block's GPU layout (vk/layout.rs, glsl/dequant.glsl): bytes `[0, split)`
/// stay, the bytes from `split` move `shift` bytes later, and the block grows
/// to `padded` bytes, so every block and its quants start on a 32-bit word.
/// `head` (a whole number of words) goes before the first block: the table
/// the shaders look values up in (the i-quant grids), else empty.
#[derive(Clone, Copy, Debug)]
pub struct Repack {
    pub split: usize,
    pub shift: usize,
    pub padded: usize,
    pub head: &'static [u8],
}

/// Elements in one k-quant super-block.
pub const QK_K: usize = 256;

/// Number of formats: [`FORMATS`] has one row per `DType` variant, in
/// declaration order (checked when [`DType::ALL`] is built).
pub const COUNT: usize = 23;

const fn repack(split: usize, shift: usize, padded: usize) -> Option<Repack> {
    Some(Repack {
        split,
        shift,
        padded,
        head: &[],
    })
}

/// The i-quants' layout: the scale padded to a word, the grid first.
const fn grid_repack(padded: usize, grid: &'static [u8]) -> Option<Repack> {
    Some(Repack {
        split: 2,
        shift: 2,
        padded,
        head: grid,
    })
}

#[rustfmt::skip]
pub static FORMATS: [Format; COUNT] = [
    Format { dtype: DType::F32, name: "f32", ggml_id: 0, block_elems: 1, block_bytes: 4,
             decode: float::dec_f32, encode: Some(float::enc_f32), gpu: None },
    Format { dtype: DType::F16, name: "f16", ggml_id: 1, block_elems: 1, block_bytes: 2,
             decode: float::dec_f16, encode: Some(float::enc_f16), gpu: None },
    Format { dtype: DType::BF16, name: "bf16", ggml_id: 30, block_elems: 1, block_bytes: 2,
             decode: float::dec_bf16, encode: Some(float::enc_bf16), gpu: None },
    Format { dtype: DType::Q8_0, name: "q8_0", ggml_id: 8, block_elems: 32, block_bytes: 34,
             decode: legacy::dequant_q8_0, encode: Some(legacy::quant_q8_0), gpu: repack(2, 2, 36) },
    Format { dtype: DType::Q4_0, name: "q4_0", ggml_id: 2, block_elems: 32, block_bytes: 18,
             decode: legacy::dequant_q4_0, encode: Some(legacy::quant_q4_0), gpu: repack(2, 2, 20) },
    Format { dtype: DType::Q4_1, name: "q4_1", ggml_id: 3, block_elems: 32, block_bytes: 20,
             decode: legacy::dequant_q4_1, encode: Some(legacy::quant_q4_1), gpu: None },
    Format { dtype: DType::Q5_0, name: "q5_0", ggml_id: 6, block_elems: 32, block_bytes: 22,
             decode: legacy::dequant_q5_0, encode: Some(legacy::quant_q5_0), gpu: repack(2, 2, 24) },
    Format { dtype: DType::Q5_1, name: "q5_1", ggml_id: 7, block_elems: 32, block_bytes: 24,
             decode: legacy::dequant_q5_1, encode: Some(legacy::quant_q5_1), gpu: None },
    Format { dtype: DType::Q4K, name: "q4_k", ggml_id: 12, block_elems: QK_K, block_bytes: 144,
             decode: kquants::dequant_q4_k, encode: Some(kquants::quant_q4_k), gpu: None },
    Format { dtype: DType::Q5K, name: "q5_k", ggml_id: 13, block_elems: QK_K, block_bytes: 176,
             decode: kquants::dequant_q5_k, encode: Some(kquants::quant_q5_k), gpu: None },
    Format { dtype: DType::Q6K, name: "q6_k", ggml_id: 14, block_elems: QK_K, block_bytes: 210,
             decode: kquants::dequant_q6_k, encode: Some(kquants::quant_q6_k), gpu: repack(210, 0, 212) },
    Format { dtype: DType::Q2K, name: "q2_k", ggml_id: 10, block_elems: QK_K, block_bytes: 84,
             decode: kquants_low::dequant_q2_k, encode: Some(kquants_low::quant_q2_k), gpu: None },
    Format { dtype: DType::Q3K, name: "q3_k", ggml_id: 11, block_elems: QK_K, block_bytes: 110,
             decode: kquants_low::dequant_q3_k, encode: Some(kquants_low::quant_q3_k), gpu: repack(110, 0, 112) },
    Format { dtype: DType::IQ4NL, name: "iq4_nl", ggml_id: 20, block_elems: 32, block_bytes: 18,
             decode: iq4::dequant_iq4_nl, encode: Some(iq4::quant_iq4_nl), gpu: repack(2, 2, 20) },
    Format { dtype: DType::IQ4XS, name: "iq4_xs", ggml_id: 23, block_elems: QK_K, block_bytes: 136,
             decode: iq4::dequant_iq4_xs, encode: Some(iq4::quant_iq4_xs), gpu: None },
    Format { dtype: DType::TQ1_0, name: "tq1_0", ggml_id: 34, block_elems: QK_K, block_bytes: 54,
             decode: ternary::dequant_tq1_0, encode: Some(ternary::quant_tq1_0), gpu: repack(54, 0, 56) },
    Format { dtype: DType::TQ2_0, name: "tq2_0", ggml_id: 35, block_elems: QK_K, block_bytes: 66,
             decode: ternary::dequant_tq2_0, encode: Some(ternary::quant_tq2_0), gpu: repack(66, 0, 68) },
    Format { dtype: DType::MXFP4, name: "mxfp4", ggml_id: 39, block_elems: 32, block_bytes: 17,
             decode: mxfp4::dequant_mxfp4, encode: Some(mxfp4::quant_mxfp4), gpu: repack(1, 3, 20) },
    Format { dtype: DType::IQ2XXS, name: "iq2_xxs", ggml_id: 16, block_elems: QK_K, block_bytes: 66,
             decode: iq23::dequant_iq2_xxs, encode: None, gpu: grid_repack(68, &iq_grids::IQ2XXS_BYTES) },
    Format { dtype: DType::IQ2XS, name: "iq2_xs", ggml_id: 17, block_elems: QK_K, block_bytes: 74,
             decode: iq23::dequant_iq2_xs, encode: None, gpu: grid_repack(76, &iq_grids::IQ2XS_BYTES) },
    Format { dtype: DType::IQ2S, name: "iq2_s", ggml_id: 22, block_elems: QK_K, block_bytes: 82,
             decode: iq23::dequant_iq2_s, encode: None, gpu: grid_repack(84, &iq_grids::IQ2S_BYTES) },
    Format { dtype: DType::IQ3XXS, name: "iq3_xxs", ggml_id: 18, block_elems: QK_K, block_bytes: 98,
             decode: iq23::dequant_iq3_xxs, encode: None, gpu: grid_repack(100, &iq_grids::IQ3XXS_BYTES) },
    Format { dtype: DType::IQ3S, name: "iq3_s", ggml_id: 21, block_elems: QK_K, block_bytes: 110,
             decode: iq23::dequant_iq3_s, encode: None, gpu: grid_repack(112, &iq_grids::IQ3S_BYTES) },
];

/// `dst.len()` values from the `dtype` row `src`; `src` must hold exactly
/// `dtype.row_bytes(dst.len())` bytes.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_row("dequantize_row", dtype, src.len(), dst.len())?;
    let f = dtype.format();
    // The float types decode a whole row at once (no call per element).
    let (bb, be) = match f.block_elems {
        1 => (src.len(), dst.len()),
        be => (f.block_bytes, be),
    };
    for (block, out) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(be)) {
        (f.decode)(block, out);
    }
    Ok(())
}

/// Quantize `src` into the `dtype` row `dst` (`dtype.row_bytes(src.len())` bytes)
/// with ggml's reference quantizers.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    check_row("quantize_row", dtype, dst.len(), src.len())?;
    let f = dtype.format();
    let encode = f
        .encode
        .ok_or_else(|| Error::Unsupported(format!("quantizing to {dtype}")))?;
    let (bb, be) = match f.block_elems {
        1 => (dst.len(), src.len()),
        be => (f.block_bytes, be),
    };
    for (x, block) in src.chunks_exact(be).zip(dst.chunks_exact_mut(bb)) {
        encode(x, block);
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
