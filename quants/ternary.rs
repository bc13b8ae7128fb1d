//! The ternary formats of BitNet b1.58-style models: TQ1_0 and TQ2_0
//! (ggml-quants.c), values `d·t` with `t` in {-1, 0, 1}.
//!
//! TQ2_0 `{u8 qs[64]; f16 d}`: bit pair `p` of byte `32c + l` is `t + 1` of
//! element `128c + 32p + l`.
//! TQ1_0 `{u8 qs[48]; u8 qh[4]; f16 d}`: five trits per byte (four in
//! `qh`), stored as the fixed-point fraction `⌈v·256 / 243⌉` of the base-3
//! number `v` they form, most significant trit first; trit `n` comes back
//! as `((byte·3ⁿ mod 256)·3) >> 8`. Bytes 0..32 hold elements
//! `32n + m`, bytes 32..48 elements `160 + 16n + m`, `qh[j]` elements
//! `240 + 4n + j`.

use super::{f16_at, put_f16};

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `n` of a TQ1_0 byte, as `t + 1`.
fn trit(q: u8, n: usize) -> i32 {
    ((q.wrapping_mul(POW3[n]) as u16 * 3) >> 8) as i32
}

/// Element `e` (0..256) of a TQ1_0 block as `t + 1`, for the CPU's
/// integer dots (`cpu::act::block_weights`).
pub(crate) fn tq1_0_digit(b: &[u8], e: usize) -> i32 {
    match e {
        0..160 => trit(b[e % 32], e / 32),
        160..240 => trit(b[32 + (e - 160) % 16], (e - 160) / 16),
        _ => trit(b[48 + (e - 240) % 4], (e - 240) / 4),
    }
}

pub(super) fn dequant_tq1_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 52);
    for n in 0..5 {
        for m in 0..32 {
            y[32 * n + m] = (trit(b[m], n) - 1) as f32 * d;
        }
        for m in 0..16 {
            y[160 + 16 * n + m] = (trit(b[32 + m], n) - 1) as f32 * d;
        }
    }
    for n in 0..4 {
        for j in 0..4 {
            y[240 + 4 * n + j] = (trit(b[48 + j], n) - 1) as f32 * d;
        }
    }
}

pub(super) fn dequant_tq2_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 64);
    for (e, v) in y.iter_mut().enumerate().take(256) {
        let q = (b[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
        *v = (q as i32 - 1) as f32 * d;
    }
}

/// `d = max|x|` and each element's `t + 1` (ggml rounds with `lroundf`).
fn trits(x: &[f32]) -> (f32, Vec<u8>) {
    let d = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (
        d,
        x.iter()
            .map(|v| ((v * id).round() as i32 + 1) as u8)
            .collect(),
    )
}

/// A byte of up to five trits, most significant first, padded to five.
fn pack_trits(t: impl Iterator<Item = u8>, count: usize) -> u8 {
    let mut q = t.fold(0u8, |q, v| q.wrapping_mul(3).wrapping_add(v));
    for _ in count..5 {
        q = q.wrapping_mul(3);
    }
    (q as u16 * 256).div_ceil(243) as u8
}

/// ggml's `quantize_row_tq1_0_ref`.
pub(super) fn quant_tq1_0(x: &[f32], b: &mut [u8]) {
    let (d, t) = trits(x);
    for m in 0..32 {
        b[m] = pack_trits((0..5).map(|n| t[32 * n + m]), 5);
    }
    for m in 0..16 {
        b[32 + m] = pack_trits((0..5).map(|n| t[160 + 16 * n + m]), 5);
    }
    for j in 0..4 {
        b[48 + j] = pack_trits((0..4).map(|n| t[240 + 4 * n + j]), 4);
    }
    put_f16(b, 52, d);
}

/// ggml's `quantize_row_tq2_0_ref`.
pub(super) fn quant_tq2_0(x: &[f32], b: &mut [u8]) {
    let (d, t) = trits(x);
    b[..64].fill(0);
    for (e, v) in t.iter().enumerate() {
        b[32 * (e / 128) + e % 32] |= (v & 3) << (2 * ((e / 32) % 4));
    }
    put_f16(b, 64, d);
}
