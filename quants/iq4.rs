//! The non-linear 4-bit formats: IQ4_NL and IQ4_XS (ggml-quants.c). Each
//! 4-bit index picks one of 16 values ([`KVALUES`]) that a block scale
//! multiplies.
//!
//! IQ4_NL `{f16 d; u8 qs[16]}` holds 32 elements: nibble `j` low is element
//! `j`, high is `j + 16`. IQ4_XS `{f16 d; u16 scales_h; u8 scales_l[4];
//! u8 qs[128]}` holds eight such 32-element sub-blocks (without their own
//! f16) with 6-bit scales offset by 32: low 4 bits in `scales_l` nibbles,
//! high 2 bits in `scales_h`.

use super::kquants::GROUP_MAX_EPS;
use super::{f16_at, nearest_int, put_f16, QK_K};

/// ggml's `kvalues_iq4nl`.
pub(crate) const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// 32 elements from 16 bytes of indices scaled by `d`.
fn decode_32(d: f32, qs: &[u8], y: &mut [f32]) {
    for j in 0..16 {
        y[j] = d * KVALUES[(qs[j] & 0xF) as usize] as f32;
        y[j + 16] = d * KVALUES[(qs[j] >> 4) as usize] as f32;
    }
}

pub(super) fn dequant_iq4_nl(b: &[u8], y: &mut [f32]) {
    decode_32(f16_at(b, 0), &b[2..18], y);
}

/// The 6-bit scale (offset removed) of IQ4_XS sub-block `ib`.
pub(crate) fn xs_scale(b: &[u8], ib: usize) -> i32 {
    let h = u16::from_le_bytes([b[2], b[3]]);
    let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF;
    let hi = ((h >> (2 * ib)) & 3) as u8;
    (lo | (hi << 4)) as i32 - 32
}

pub(super) fn dequant_iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for ib in 0..QK_K / 32 {
        let dl = d * xs_scale(b, ib) as f32;
        decode_32(
            dl,
            &b[8 + 16 * ib..24 + 16 * ib],
            &mut y[32 * ib..32 * ib + 32],
        );
    }
}

/// ggml's `best_index_int8`: the index of the value nearest `x`.
fn best_index(x: f32) -> u8 {
    let v = |i: usize| KVALUES[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0, 15);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// Σ w·q·x and Σ w·q² of `xb` quantized at inverse scale `id` (weights `x²`).
fn sums(xb: &[f32], id: f32, levels: Option<&mut [u8]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    let mut out = levels;
    for (j, &x) in xb.iter().enumerate() {
        let l = best_index(id * x);
        if let Some(o) = out.as_deref_mut() {
            o[j] = l;
        }
        let (q, w) = (KVALUES[l as usize] as f32, x * x);
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The scale of one 32-element block, as ggml's `quantize_row_iq4_nl_impl`
/// (no importance weights, `ntry` = 7) searches it; 0 for an all-zero block.
fn block_scale(xb: &[f32], levels: &mut [u8]) -> f32 {
    const NTRY: i32 = 7;
    let (mut amax, mut max) = (0f32, 0f32);
    for &x in xb {
        if x.abs() > amax {
            amax = x.abs();
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = KVALUES[0] as f32;
    let (sumqx, sumq2) = sums(xb, 1.0 / (-max / v0), Some(levels));
    let mut d = sumqx / sumq2;
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let (sumqx, sumq2) = sums(xb, (itry as f32 + v0) / max, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Nibble-packs 32 indices: `j` low, `j + 16` high.
fn pack_32(levels: &[u8], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = levels[j] | (levels[j + 16] << 4);
    }
}

/// ggml's `quantize_row_iq4_nl_ref`.
pub(super) fn quant_iq4_nl(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; 32];
    let d = block_scale(x, &mut levels);
    put_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = best_index(id * v);
    }
    pack_32(&levels, &mut b[2..18]);
}

/// ggml's `quantize_iq4_xs` without importance weights.
pub(super) fn quant_iq4_xs(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; QK_K / 32];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..QK_K / 32 {
        let s = block_scale(
            &x[32 * ib..32 * ib + 32],
            &mut levels[32 * ib..32 * ib + 32],
        );
        scales[ib] = s;
        if s.abs() > amax_scale {
            amax_scale = s.abs();
            max_scale = s;
        }
    }
    b.fill(0);
    let d = -max_scale / 32.0;
    put_f16(b, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    for ib in 0..QK_K / 32 {
        let l = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for j in 32 * ib..32 * ib + 32 {
            levels[j] = best_index(idl * x[j]);
        }
        let l = (l + 32) as u8;
        b[4 + ib / 2] |= (l & 0xF) << (4 * (ib % 2));
        scales_h |= ((l >> 4) as u16) << (2 * ib);
    }
    b[2..4].copy_from_slice(&scales_h.to_le_bytes());
    for ib in 0..QK_K / 32 {
        pack_32(&levels[32 * ib..], &mut b[8 + 16 * ib..24 + 16 * ib]);
    }
}
