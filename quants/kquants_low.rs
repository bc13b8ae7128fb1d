//! The 2- and 3-bit k-quants: Q2_K and Q3_K (ggml-quants.c), sixteen
//! 16-element sub-blocks per 256-element super-block.
//!
//! Q2_K `{u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}`: sub-block `j` has a
//! 4-bit scale (low nibble of `scales[j]`) and 4-bit min (high nibble);
//! value `d·sc·q − dmin·m` with 2-bit `q`.
//! Q3_K `{u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}`: 6-bit signed
//! scales (offset 32) packed in 12 bytes ([`q3_k_scales`]); value
//! `d·sc·(q − 4·(1 − h))` with 2-bit `q` and its high bit `h` in `hmask`.
//!
//! In both, quant byte `l` of half `n` (32 bytes) holds, in bit pair `p`,
//! element `128n + 32p + l`; Q3_K's `hmask[l]` bit `4n + p` is its high bit.

use super::kquants::{make_qkx2_quants, GROUP_MAX_EPS};
use super::{f16_at, nearest_int, put_f16, QK_K};

pub(super) fn dequant_q2_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b, 80), f16_at(b, 82));
    for (e, v) in y.iter_mut().enumerate().take(QK_K) {
        let (n, p, l) = (e / 128, (e / 32) % 4, e % 32);
        let sc = b[e / 16];
        let (dl, ml) = (d * (sc & 0xF) as f32, min * (sc >> 4) as f32);
        let q = (b[16 + 32 * n + l] >> (2 * p)) & 3;
        *v = dl * q as f32 - ml;
    }
}

/// The sixteen signed 6-bit scales of a Q3_K block's 12 scale bytes.
pub(crate) fn q3_k_scales(s: &[u8]) -> [i32; 16] {
    std::array::from_fn(|j| {
        let lo = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        (lo | (hi << 4)) as i32 - 32
    })
}

pub(super) fn dequant_q3_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 108);
    let scales = q3_k_scales(&b[96..108]);
    for (e, v) in y.iter_mut().enumerate().take(QK_K) {
        let (n, p, l) = (e / 128, (e / 32) % 4, e % 32);
        let dl = d * scales[e / 16] as f32;
        let q = ((b[32 + 32 * n + l] >> (2 * p)) & 3) as i32;
        let high = b[l] & (1 << (4 * n + p)) != 0;
        *v = dl * (q - if high { 0 } else { 4 }) as f32;
    }
}

/// Packs 2-bit levels into the 64 `qs` bytes (see the module docs).
fn pack_2bit(levels: &[u8; QK_K], qs: &mut [u8]) {
    for n in 0..2 {
        for l in 0..32 {
            let at = |p: usize| levels[128 * n + 32 * p + l] << (2 * p);
            qs[32 * n + l] = at(0) | at(1) | at(2) | at(3);
        }
    }
}

/// ggml's `quantize_row_q2_K_ref`.
pub(super) fn quant_q2_k(x: &[f32], b: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * j + 16];
        let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
        let l = &mut levels[16 * j..16 * j + 16];
        let (s, m) = make_qkx2_quants(3, xs, &weights, l, -0.5, 0.1, 15, true);
        (scales[j], mins[j]) = (s, m);
        max_scale = if s > max_scale { s } else { max_scale };
        max_min = if m > max_min { m } else { max_min };
    }
    b[..16].fill(0);
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            b[j] = nearest_int(iscale * scales[j]) as u8;
        }
    }
    put_f16(
        b,
        80,
        if max_scale > 0.0 {
            max_scale / Q4SCALE
        } else {
            0.0
        },
    );
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            b[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
    }
    put_f16(
        b,
        82,
        if max_min > 0.0 {
            max_min / Q4SCALE
        } else {
            0.0
        },
    );
    let (d_all, dmin_all) = (f16_at(b, 80), f16_at(b, 82));
    for j in 0..16 {
        let d = d_all * (b[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (b[j] >> 4) as f32;
        for ii in 0..16 {
            levels[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&levels, &mut b[16..80]);
}

/// ggml's `make_q3_quants` with `do_rmse`: symmetric levels in
/// `[-nmax, nmax)` refined by coordinate descent on the weighted (`x²`)
/// error. Fills `l` with levels offset by `nmax` and returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut li = [0i32; 16];
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (i, &v) in x.iter().enumerate() {
        li[i] = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * li[i] as f32;
        suml2 += w * (li[i] * li[i]) as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let mut slx = sumlx - w * v * li[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * (li[i] * li[i]) as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != li[i] {
                    slx += w * v * new_l as f32;
                    sl2 += w * (new_l * new_l) as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        (li[i], sumlx, suml2) = (new_l, slx, sl2);
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (o, v) in l.iter_mut().zip(li) {
        *o = (v + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// ggml's `quantize_row_q3_K_ref`.
pub(super) fn quant_q3_k(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let packed = &mut b[96..108];
    packed.fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            let l = (nearest_int(iscale * s).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                packed[j] = l & 0xF;
            } else {
                packed[j - 8] |= (l & 0xF) << 4;
            }
            packed[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
        }
        put_f16(b, 108, 1.0 / iscale);
    } else {
        put_f16(b, 108, 0.0);
    }
    let d_all = f16_at(b, 108);
    let sc = q3_k_scales(&b[96..108]);
    for j in 0..16 {
        let d = d_all * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            levels[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as u8;
        }
    }
    let (hmask, rest) = b.split_at_mut(32);
    hmask.fill(0);
    // The high bit of element e goes to hmask[e % 32], bit e / 32.
    for (e, l) in levels.iter_mut().enumerate() {
        if *l > 3 {
            hmask[e % 32] |= 1 << (e / 32);
            *l -= 4;
        }
    }
    pack_2bit(&levels, &mut rest[..64]);
}
