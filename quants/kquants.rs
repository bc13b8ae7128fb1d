//! The 256-element k-quant super-blocks: Q4_K, Q5_K, Q6_K (ggml-quants.c).
//!
//! Q4_K `{f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}` and Q5_K (the same plus
//! `u8 qh[32]` before `qs`) hold eight 32-element sub-blocks with 6-bit scales
//! and mins packed into 12 bytes ([`scale_min_k4`]). Q6_K `{u8 ql[128]; u8
//! qh[64]; i8 scales[16]; f16 d}` holds sixteen 16-element sub-blocks.

use super::{f16_at, nearest_int, put_f16, round_f16};

use super::QK_K;
/// ggml's GROUP_MAX_EPS: groups below this magnitude quantize to zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `get_scale_min_k4`: 6-bit scale and min of sub-block `j` (0..8).
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub(super) fn dequant_q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for c in 0..QK_K / 64 {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let q = &qs[32 * c..32 * c + 32];
        let out = &mut y[64 * c..64 * c + 64];
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

pub(super) fn dequant_q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for c in 0..QK_K / 64 {
        let (sc1, m1) = scale_min_k4(2 * c, scales);
        let (sc2, m2) = scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        let q = &qs[32 * c..32 * c + 32];
        let out = &mut y[64 * c..64 * c + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[l] = d1 * ((q[l] & 0x0F) + h1) as f32 - m1;
            out[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

pub(super) fn dequant_q6_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let out = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            out[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            out[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            out[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            out[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// ggml's `make_qkx2_quants`: asymmetric `nmax`-level quantization of one
/// sub-block minimising the weighted squared (`use_mad`: absolute) error
/// over a small scale search. Returns `(scale, -min)` and fills `l`.
#[allow(clippy::too_many_arguments)]
pub(super) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let quant =
        |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut best_error = 0f32;
    for i in 0..n {
        l[i] = quant(iscale, x[i], min);
        best_error += weights[i] * err(scale * l[i] as f32 + min - x[i]);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let li = quant(iscale, x[i], min);
            laux[i] = li;
            let (w, lf) = (weights[i], li as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l.copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Shared body of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`: fills the
/// header (`d`, `dmin`, packed scales) of `b` and returns the levels `L`.
fn quant_k_scales(x: &[f32], b: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().map(|v| v * v).sum();
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0f32; 32];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut levels[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        max_scale = if s > max_scale { s } else { max_scale };
        max_min = if m > max_min { m } else { max_min };
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut b[4..16];
    packed.fill(0);
    for j in 0..QK_K / 32 {
        let ls = nearest_int(inv_scale * scales[j]).min(63) as u8;
        let lm = nearest_int(inv_min * mins[j]).min(63) as u8;
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(b, 0, max_scale / 63.0);
    put_f16(b, 2, max_min / 63.0);
    let (d_all, dmin_all) = (round_f16(max_scale / 63.0), round_f16(max_min / 63.0));
    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            levels[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    levels
}

pub(super) fn quant_q4_k(x: &[f32], b: &mut [u8]) {
    let levels = quant_k_scales(x, b, 15, -1.0, 20);
    let qs = &mut b[16..144];
    for c in 0..QK_K / 64 {
        for l in 0..32 {
            qs[32 * c + l] = levels[64 * c + l] | (levels[64 * c + l + 32] << 4);
        }
    }
}

pub(super) fn quant_q5_k(x: &[f32], b: &mut [u8]) {
    let levels = quant_k_scales(x, b, 31, -0.5, 15);
    let (qh, qs) = b[16..176].split_at_mut(32);
    qh.fill(0);
    for c in 0..QK_K / 64 {
        let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for j in 0..32 {
            let mut l1 = levels[64 * c + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = levels[64 * c + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            qs[32 * c + j] = l1 | (l2 << 4);
        }
    }
}

/// ggml's `make_qx_quants` with `rmse_type = 1` (weights `x²`): symmetric
/// quantization to `[-nmax, nmax)` with a search over 18 nearby scales.
/// Fills `l` with levels offset by `nmax` and returns the scale.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
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
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let li = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * li;
            suml2 += w * li * li;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (li, &v) in l.iter_mut().zip(x) {
        *li = (level(iscale, v) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (level(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

pub(super) fn quant_q6_k(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..QK_K / 16 {
        let s = make_qx_quants(
            32,
            &x[16 * ib..16 * ib + 16],
            &mut levels[16 * ib..16 * ib + 16],
        );
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    b.fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(b, 208, 1.0 / iscale);
    let d_all = round_f16(1.0 / iscale);
    for ib in 0..QK_K / 16 {
        let s = nearest_int(iscale * scales[ib]).min(127) as i8;
        b[192 + ib] = s as u8;
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * ib + ii] / d).clamp(-32, 31);
            levels[16 * ib + ii] = (l + 32) as u8;
        }
    }
    for half in 0..2 {
        let lv = &levels[128 * half..128 * half + 128];
        for l in 0..32 {
            let (q1, q2, q3, q4) = (lv[l], lv[l + 32], lv[l + 64], lv[l + 96]);
            b[64 * half + l] = (q1 & 0x0F) | ((q3 & 0x0F) << 4);
            b[64 * half + l + 32] = (q2 & 0x0F) | ((q4 & 0x0F) << 4);
            b[128 + 32 * half + l] =
                (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
}
