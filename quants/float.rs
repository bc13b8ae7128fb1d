//! The float types as one-element "blocks": their decoders and encoders take
//! any number of whole elements (a row at once).

use half::{bf16, f16};

pub(super) fn dec_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

pub(super) fn dec_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

pub(super) fn dec_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

pub(super) fn enc_f32(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

pub(super) fn enc_f16(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&f16::from_f32(*s).to_bits().to_le_bytes());
    }
}

pub(super) fn enc_bf16(src: &[f32], dst: &mut [u8]) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&bf16::from_f32(*s).to_bits().to_le_bytes());
    }
}
