//! Repacking GGUF weight blocks into the word-aligned layout the shaders read
//! (see glsl/dequant.glsl), as each type's [`crate::quants::Format::gpu`]
//! says: e.g. q8_0 / q4_0 / q5_0 have their 2-byte scale followed by 2 pad
//! bytes so their quants start on a word, and q6_k's 210 bytes grow to 212;
//! the i-quants' grids go before the first block.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Bytes of a repacked `[rows, cols]` weight.
pub fn packed_bytes(dtype: DType, rows: usize, cols: usize) -> Result<usize> {
    let raw = rows
        .checked_mul(dtype.row_bytes(cols)?)
        .ok_or_else(|| Error::Shape(format!("{rows} x {cols} {dtype} weight overflows usize")))?;
    let blocks = raw / dtype.block_bytes();
    let bytes = match dtype.format().gpu {
        Some(r) => r.head.len() + blocks * r.padded,
        None => raw,
    };
    Ok(bytes.div_ceil(4) * 4)
}

/// Repack GGUF block bytes of a `[rows, cols]` weight for the shaders.
pub fn repack(dtype: DType, rows: usize, cols: usize, data: &[u8]) -> Result<Vec<u8>> {
    let expect = rows
        .checked_mul(dtype.row_bytes(cols)?)
        .ok_or_else(|| Error::Shape(format!("{rows} x {cols} {dtype} weight overflows usize")))?;
    if data.len() != expect {
        return Err(Error::Shape(format!(
            "a {rows} x {cols} {dtype} weight needs {expect} bytes, got {}",
            data.len()
        )));
    }
    let mut out = vec![0u8; packed_bytes(dtype, rows, cols)?];
    match dtype.format().gpu {
        None => out[..data.len()].copy_from_slice(data),
        Some(r) => {
            let bb = dtype.block_bytes();
            let (head, blocks) = out.split_at_mut(r.head.len());
            head.copy_from_slice(r.head);
            for (src, dst) in data.chunks_exact(bb).zip(blocks.chunks_exact_mut(r.padded)) {
                dst[..r.split].copy_from_slice(&src[..r.split]);
                dst[r.split + r.shift..r.shift + bb].copy_from_slice(&src[r.split..]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_scale_is_padded_and_quants_word_aligned() {
        let block: Vec<u8> = (0..34).collect();
        let out = repack(DType::Q8_0, 1, 32, &block).unwrap();
        assert_eq!(out.len(), 36);
        assert_eq!(&out[..4], &[0, 1, 0, 0]);
        assert_eq!(&out[4..], &block[2..]);
    }

    #[test]
    fn q6_k_gets_two_pad_bytes() {
        let block: Vec<u8> = (0..210).map(|i| i as u8).collect();
        let out = repack(DType::Q6K, 1, 256, &block).unwrap();
        assert_eq!(out.len(), 212);
        assert_eq!(&out[..210], &block[..]);
    }

    #[test]
    fn mxfp4_scale_byte_is_padded_to_a_word() {
        let block: Vec<u8> = (1..18).collect();
        let out = repack(DType::MXFP4, 1, 32, &block).unwrap();
        assert_eq!(out.len(), 20);
        assert_eq!(&out[..4], &[1, 0, 0, 0]);
        assert_eq!(&out[4..], &block[1..]);
    }

    #[test]
    fn iq2_xxs_grid_goes_first_then_padded_blocks() {
        let block: Vec<u8> = (0..66).collect();
        let out = repack(DType::IQ2XXS, 1, 256, &block).unwrap();
        assert_eq!(out.len(), 2048 + 68);
        assert_eq!(out.len(), packed_bytes(DType::IQ2XXS, 1, 256).unwrap());
        // Entry 1 of ggml's iq2xxs_grid, 0x080808080808082b, low byte first.
        assert_eq!(&out[8..16], &[0x2b, 8, 8, 8, 8, 8, 8, 8]);
        assert_eq!(&out[2048..2052], &[0, 1, 0, 0]);
        assert_eq!(&out[2052..], &block[2..]);
    }

    #[test]
    fn wrong_length_is_an_error() {
        assert!(repack(DType::Q4_0, 2, 32, &[0u8; 18]).is_err());
    }
}
