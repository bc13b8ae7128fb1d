//! The 32-element block formats: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (ggml-quants.c).
//!
//! Layouts (little-endian): Q8_0 `{f16 d; i8 qs[32]}`; Q4_0 `{f16 d; u8 qs[16]}`;
//! Q4_1 `{f16 d; f16 m; u8 qs[16]}`; Q5_0 `{f16 d; u8 qh[4]; u8 qs[16]}`;
//! Q5_1 `{f16 d; f16 m; u8 qh[4]; u8 qs[16]}`. Nibble `j` low holds element
//! `j`, high holds element `j + 16`; bit `j` of `qh` is the 5th bit of element `j`.

use super::{f16_at, put_f16};

const QK: usize = 32;

pub(super) fn dequant_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..QK {
        y[j] = (b[2 + j] as i8) as f32 * d;
    }
}

pub(super) fn dequant_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..QK / 2 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + QK / 2] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

pub(super) fn dequant_q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qs = &b[4..20];
    for j in 0..QK / 2 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + QK / 2] = (qs[j] >> 4) as f32 * d + m;
    }
}

pub(super) fn dequant_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..QK / 2 {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((qs[j] & 0x0F) as u32 | xh0) as i32 - 16) as f32 * d;
        y[j + QK / 2] = (((qs[j] >> 4) as u32 | xh1) as i32 - 16) as f32 * d;
    }
}

pub(super) fn dequant_q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..QK / 2 {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((qs[j] & 0x0F) as u32 | xh0) as f32 * d + m;
        y[j + QK / 2] = ((qs[j] >> 4) as u32 | xh1) as f32 * d + m;
    }
}

/// The value of largest magnitude, sign kept (first one on ties).
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

pub(super) fn quant_q8_0(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    for j in 0..QK {
        b[2 + j] = ((x[j] * id).round() as i8) as u8;
    }
}

pub(super) fn quant_q4_0(x: &[f32], b: &mut [u8]) {
    let (_, max) = signed_absmax(x);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    for j in 0..QK / 2 {
        let x0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let x1 = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
        b[2 + j] = x0 | (x1 << 4);
    }
}

pub(super) fn quant_q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    for j in 0..QK / 2 {
        let x0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
        let x1 = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
        b[4 + j] = x0 | (x1 << 4);
    }
}

pub(super) fn quant_q5_0(x: &[f32], b: &mut [u8]) {
    let (_, max) = signed_absmax(x);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let x0 = ((x[j] * id + 16.5) as i8).min(31) as u32;
        let x1 = ((x[j + QK / 2] * id + 16.5) as i8).min(31) as u32;
        b[6 + j] = ((x0 & 0x0F) | ((x1 & 0x0F) << 4)) as u8;
        qh |= ((x0 & 0x10) >> 4) << j;
        qh |= ((x1 & 0x10) >> 4) << (j + QK / 2);
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

pub(super) fn quant_q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        let x0 = ((x[j] - min) * id + 0.5) as u8 as u32;
        let x1 = ((x[j + QK / 2] - min) * id + 0.5) as u8 as u32;
        b[8 + j] = ((x0 & 0x0F) | ((x1 & 0x0F) << 4)) as u8;
        qh |= ((x0 & 0x10) >> 4) << j;
        qh |= ((x1 & 0x10) >> 4) << (j + QK / 2);
    }
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}
