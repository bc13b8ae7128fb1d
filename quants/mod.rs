//! GGUF element formats: one table ([`FORMATS`], one row per type in
//! quants/types.rs) of per-type facts (ggml id and name, block size and
//! bytes, the block codec, the GPU block layout, the GPU and CPU fast paths),
//! from which [`DType`] and its methods, the Vulkan repack, the kernel
//! choices and the loaders derive.
//!
//! Each codec is bit-exact with ggml's `dequantize_row_*` and, where vkllm
//! has one, a port of ggml's reference (`*_ref`) quantizer. Used by the
//! loaders, load-time quantization, the synthetic-model writer, the scalar
//! reference and as the portable fallback of the CPU kernels.
//!
//! Adding a type: its row in quants/types.rs, its codec here, its GLSL
//! decode in glsl/dequant.glsl (build.rs compiles the shaders for every
//! row), its fixture in tests/data/quants.

mod float;
mod iq23;
mod iq4;
mod iq_grids;
mod kquants;
mod kquants_low;
mod legacy;
mod mxfp4;
mod table;
mod ternary;

pub(crate) use kquants::scale_min_k4;
pub(crate) use ternary::tq1_0_digit;
// Block pieces the CPU's SIMD decoders share with the scalar codecs.
#[cfg(target_arch = "x86_64")]
pub(crate) use {
    iq23::{iq2_scale, iq3_pair, iq3_s_scale, ksigns as iq_ksigns, xxs_scale as iq_xxs_scale},
    iq4::{xs_scale as iq4_xs_scale, KVALUES as IQ4_VALUES},
    iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID},
    kquants_low::q3_k_scales,
    mxfp4::{e8m0_half, KVALUES as MXFP4_VALUES},
};

pub use table::{CpuKernels, DType, Decode, Encode, Format, GpuGemv, Repack, COUNT, FORMATS};

use crate::error::{Error, Result};
use half::f16;

/// Elements in one k-quant super-block.
pub const QK_K: usize = 256;

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
