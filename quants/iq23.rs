//! The 2- and 3-bit i-quants (ggml-quants.c `dequantize_row_iq2_xxs` ...):
//! each 256-value super-block has one f16 `d` and eight 32-value sub-blocks
//! with their own scale; values come in groups of 8 whose magnitudes are one
//! entry of a fixed grid (quants/iq_grids.rs) and whose signs are 8 bits.
//!
//! - IQ2_XXS `{f16 d; u16 qs[32]}`: per sub-block two u32: four 8-bit grid
//!   indices, then four 7-bit sign indices and a 4-bit scale (bits 28..32).
//! - IQ2_XS `{f16 d; u16 qs[32]; u8 scales[8]}`: per group a 9-bit grid
//!   index and a 7-bit sign index; a 4-bit scale per 16 values.
//! - IQ2_S `{f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]}`:
//!   10-bit grid indices (low 8 in `qs`, high 2 in `qh`), 8 sign bits per group.
//! - IQ3_XXS `{f16 d; u8 qs[64]; u32 scales_signs[8]}`: two 8-bit indices
//!   into a grid of 4 per group; signs and scale as IQ2_XXS.
//! - IQ3_S `{f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]}`:
//!   9-bit indices into a grid of 4, 8 sign bits per group, 4-bit odd scales.
//!
//! A 7-bit sign index stands for 8 signs with even parity: ggml's
//! `ksigns_iq2xs[s]` is `s` with bit 7 set when `s` has an odd bit count.

use super::f16_at;
use super::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// ggml's `ksigns_iq2xs`: the 8 sign bits a 7-bit index (the low bits of
/// `s`) stands for.
pub(crate) fn ksigns(s: u32) -> u8 {
    let s = s & 0x7F;
    (s | ((s.count_ones() & 1) << 7)) as u8
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// 8 values: `db · grid[j]`, negated where bit `j` of `signs` is set (as
/// ggml: `db * grid[j] * (signs & kmask[j] ? -1.f : 1.f)`).
fn put8(db: f32, grid: u64, signs: u8, y: &mut [f32]) {
    for (j, v) in y[..8].iter_mut().enumerate() {
        let g = ((grid >> (8 * j)) & 0xFF) as f32;
        *v = db * g * if (signs >> j) & 1 != 0 { -1.0 } else { 1.0 };
    }
}

/// Two 4-value IQ3 grid entries as one 8-value group.
pub(crate) fn iq3_pair(a: u32, b: u32) -> u64 {
    a as u64 | (b as u64) << 32
}

/// ggml's 4-bit IQ2 sub-scale: `d · (0.5 + s) · 0.25`.
pub(crate) fn iq2_scale(d: f32, s: u8) -> f32 {
    d * (0.5 + s as f32) * 0.25
}

/// The scale of an IQ2_XXS (`f` 0.25) or IQ3_XXS (`f` 0.5) sub-block from
/// the top 4 bits of its sign word: `d · (0.5 + s) · f`, as ggml orders it.
pub(crate) fn xxs_scale(d: f32, aux: u32, f: f32) -> f32 {
    d * (0.5 + (aux >> 28) as f32) * f
}

/// The odd IQ3_S scale of sub-block `ib`: `d · (1 + 2s)`.
pub(crate) fn iq3_s_scale(d: f32, scales: &[u8], ib: usize) -> f32 {
    d * (1 + 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 0xF) as i32) as f32
}

pub(super) fn dequant_iq2_xxs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let (idx, aux) = (u32_at(b, 2 + 8 * ib), u32_at(b, 6 + 8 * ib));
        let db = xxs_scale(d, aux, 0.25);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let grid = IQ2XXS_GRID[((idx >> (8 * l)) & 0xFF) as usize];
            put8(db, grid, ksigns(aux >> (7 * l)), y);
        }
    }
}

pub(super) fn dequant_iq2_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let sc = b[66 + ib];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let q = u16::from_le_bytes([b[2 + 8 * ib + 2 * l], b[3 + 8 * ib + 2 * l]]);
            let db = iq2_scale(d, (sc >> (4 * (l / 2))) & 0xF);
            put8(db, IQ2XS_GRID[(q & 511) as usize], ksigns(q as u32 >> 9), y);
        }
    }
}

pub(super) fn dequant_iq2_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let q = qs[4 * ib + l] as usize | (((qh[ib] >> (2 * l)) & 3) as usize) << 8;
            let db = iq2_scale(d, (scales[ib] >> (4 * (l / 2))) & 0xF);
            put8(db, IQ2S_GRID[q], signs[4 * ib + l], y);
        }
    }
}

pub(super) fn dequant_iq3_xxs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = xxs_scale(d, aux, 0.5);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let g = |h: usize| IQ3XXS_GRID[qs[8 * ib + 2 * l + h] as usize];
            put8(db, iq3_pair(g(0), g(1)), ksigns(aux >> (7 * l)), y);
        }
    }
}

pub(super) fn dequant_iq3_s(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let db = iq3_s_scale(d, scales, ib);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            // Bit 2l + h of qh is the ninth bit of index h of the group.
            let g = |h: usize| {
                let hi = ((qh[ib] >> (2 * l + h)) & 1) as usize;
                IQ3S_GRID[qs[8 * ib + 2 * l + h] as usize | hi << 8]
            };
            put8(db, iq3_pair(g(0), g(1)), signs[4 * ib + l], y);
        }
    }
}
