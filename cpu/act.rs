//! Activations quantized per 32-value block to 16-bit or 8-bit integers
//! (ggml's Q8_1 layout idea, with f32 scales), for the CPU's integer-dot
//! decode, and the scalar block dots of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 /
//! Q4_K / Q5_K / Q6_K / TQ1_0 / TQ2_0 weights with them. The SIMD kernels
//! (`cpu::simd`) compute the same exact integer sums and combine them with
//! the same formulas.

use crate::dtype::DType;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Values per activation block (the block size of the weights it meets).
pub const ACT_BLOCK: usize = 32;

/// An integer type activations are rounded to.
pub trait ActInt: Copy + Default + Into<i32> + Send + Sync {
    /// The largest magnitude used: a block's largest |x| maps to it.
    const MAX: f32;
    fn from_rounded(v: f32) -> Self;
}

impl ActInt for i8 {
    const MAX: f32 = 127.0;
    #[inline(always)]
    fn from_rounded(v: f32) -> i8 {
        saturate(v, -128.0, 127.0) as i8
    }
}

impl ActInt for i16 {
    const MAX: f32 = 32767.0;
    #[inline(always)]
    fn from_rounded(v: f32) -> i16 {
        saturate(v, -32768.0, 32767.0) as i16
    }
}

/// An integral `v` as `v as i32` would give it between `lo` and `hi` (NaN is
/// 0), in operations that vectorize, where `as` converts lane by lane.
#[inline(always)]
fn saturate(v: f32, lo: f32, hi: f32) -> i32 {
    let v = if v.is_nan() { 0.0 } else { v.clamp(lo, hi) };
    // SAFETY: `v` is finite and within i32 (between `lo` and `hi`).
    unsafe { v.to_int_unchecked::<i32>() }
}

/// `m` rows of `k` activations as integers with one scale per block.
#[derive(Clone, Debug, Default)]
pub struct ActRows<T> {
    pub k: usize,
    pub m: usize,
    /// `[m, k]` quantized values.
    pub qs: Vec<T>,
    /// Per row and block, `[d, d · Σq]`: the scale and the block's sum as
    /// the integers represent it (the weights' offset terms need it).
    pub ds: Vec<[f32; 2]>,
    /// Every block of a row has the row's `d` ([`ActRows::levels`]), so the
    /// kernels may sum several blocks' integers before scaling.
    pub row_scale: bool,
    /// With `row_scale`: per row and whole 256 values, the sum of their 8
    /// blocks' `d · Σq`, which every weight row's offset term needs (summed
    /// once here, not once per weight row).
    pub sums256: Vec<f32>,
}

impl<T: ActInt> ActRows<T> {
    /// Quantizes `m` rows of `x` (`[m, k]`, `k` a multiple of [`ACT_BLOCK`])
    /// as ggml's `quantize_row_q8_1_ref` does for 8 bits: `d = max|x| / MAX`,
    /// `q = round(x / d)`.
    pub fn quantize(x: &[f32], m: usize, k: usize) -> ActRows<T> {
        assert!(k.is_multiple_of(ACT_BLOCK) && x.len() >= m * k);
        let mut out = ActRows {
            k,
            m,
            qs: vec![T::default(); m * k],
            ds: vec![[0.0; 2]; m * k / ACT_BLOCK],
            row_scale: false,
            sums256: Vec::new(),
        };
        quantize_blocks(&x[..m * k], &mut out.qs, &mut out.ds);
        out
    }
}

impl ActRows<i8> {
    /// `m` rows of `x` that already sit on the int8 levels of their own
    /// largest magnitude (what `round_i8`, BitNet's activation quantization,
    /// leaves: `q / s` with `s = 127 / max|x|`), as those integers with the
    /// row's `1 / s` for every block: exact, where [`ActRows::quantize`]
    /// would round each block again. `None` at the first value off its
    /// row's levels (any other activation, within a few values).
    pub fn levels(x: &[f32], m: usize, k: usize) -> Option<ActRows<i8>> {
        Self::levels_on(false, x, m, k)
    }

    /// [`ActRows::levels`] with the rows spread over the team when `par`
    /// (a prefill's hundreds of rows, ahead of every BitNet matmul).
    pub fn levels_on(par: bool, x: &[f32], m: usize, k: usize) -> Option<ActRows<i8>> {
        assert!(k.is_multiple_of(ACT_BLOCK) && x.len() >= m * k);
        let blocks = k / ACT_BLOCK;
        let mut qs = vec![0; m * k];
        let mut ds = vec![[0.0; 2]; m * blocks];
        let off = AtomicBool::new(false);
        let row_ds: Vec<Mutex<&mut [[f32; 2]]>> =
            ds.chunks_mut(blocks.max(1)).map(Mutex::new).collect();
        super::par::chunks(par, &mut qs, k, |r, q| {
            if off.load(Ordering::Relaxed) {
                return;
            }
            let mut d = row_ds[r].lock().unwrap_or_else(|e| e.into_inner());
            if !level_row(&x[r * k..(r + 1) * k], q, &mut d) {
                off.store(true, Ordering::Relaxed);
            }
        });
        drop(row_ds);
        if off.into_inner() {
            return None;
        }
        let sums256 = ds
            .chunks_exact(blocks.max(1))
            .flat_map(|row| row.chunks_exact(256 / ACT_BLOCK))
            .map(|eight| eight.iter().map(|d| d[1]).sum())
            .collect();
        Some(ActRows {
            k,
            m,
            qs,
            ds,
            row_scale: true,
            sums256,
        })
    }
}

/// One row of [`ActRows::levels`]: its integers and blocks' `[1 / s, Σq / s]`,
/// false when a value is off the row's levels. Vectorized for AVX2 where the
/// CPU has it (the same IEEE operations): it runs on the calling thread
/// before each BitNet matmul, while the team waits.
fn level_row(row: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(row: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]) -> bool {
            level_row_in(row, qs, ds)
        }
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { avx2(row, qs, ds) };
    }
    level_row_in(row, qs, ds)
}

#[inline(always)]
fn level_row_in(row: &[f32], qs: &mut [i8], ds: &mut [[f32; 2]]) -> bool {
    let amax = super::round_i8::abs_max(row).max(1e-5);
    if !amax.is_finite() {
        return false;
    }
    let s = 127.0 / amax;
    for ((xb, qb), d) in row
        .chunks_exact(ACT_BLOCK)
        .zip(qs.chunks_exact_mut(ACT_BLOCK))
        .zip(ds.iter_mut())
    {
        // Branch-free over the block (so it vectorizes), checked after it.
        let (mut off, mut sum) = (false, 0i32);
        for (v, q) in xb.iter().zip(qb.iter_mut()) {
            let t = v * s;
            let r = super::round_i8::ties_even(t);
            // r / s * s is within a few ulps of r; NaN fails the range.
            off |= (t - r).abs() > 1e-3 || !(-128.0..=127.0).contains(&r);
            let i = saturate(r, -128.0, 127.0);
            *q = i as i8;
            sum += i;
        }
        if off {
            return false;
        }
        *d = [1.0 / s, sum as f32 / s];
    }
    true
}

/// [`quantize_block`] over whole blocks, vectorized for AVX2 where the CPU
/// has it (the same IEEE operations: the results are bit-identical).
fn quantize_blocks<T: ActInt>(x: &[f32], qs: &mut [T], ds: &mut [[f32; 2]]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<T: ActInt>(x: &[f32], qs: &mut [T], ds: &mut [[f32; 2]]) {
            quantize_blocks_in(x, qs, ds)
        }
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { avx2(x, qs, ds) };
    }
    quantize_blocks_in(x, qs, ds)
}

#[inline(always)]
fn quantize_blocks_in<T: ActInt>(x: &[f32], qs: &mut [T], ds: &mut [[f32; 2]]) {
    for ((xb, qb), d) in x
        .chunks_exact(ACT_BLOCK)
        .zip(qs.chunks_exact_mut(ACT_BLOCK))
        .zip(ds.iter_mut())
    {
        *d = quantize_block(xb.try_into().unwrap_or(&[0.0; ACT_BLOCK]), qb);
    }
}

/// One block of [`ActRows::quantize`]: `qb` set, `[d, d · Σq]` returned.
#[inline(always)]
fn quantize_block<T: ActInt>(xb: &[f32; ACT_BLOCK], qb: &mut [T]) -> [f32; 2] {
    // |x| as bits, NaN as 0: their integer max is `f32::max`'s (which skips
    // NaN). Eight running maxima vectorize.
    let mut lanes = [0u32; 8];
    for c in xb.chunks_exact(8) {
        for (m, v) in lanes.iter_mut().zip(c) {
            let b = v.to_bits() & 0x7FFF_FFFF;
            *m = (*m).max(if b > 0x7F80_0000 { 0 } else { b });
        }
    }
    let amax = f32::from_bits(lanes.into_iter().max().unwrap_or(0));
    let d = amax / T::MAX;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in qb.iter_mut().zip(xb) {
        *q = T::from_rounded((v * id).round());
        sum += (*q).into();
    }
    [d, d * sum as f32]
}

/// Up to `mr` activation rows quantized as [`ActRows::quantize`] does, laid
/// out for the integer GEMM tiles, which broadcast one pair of values of each
/// row at a time: `qs` is `[k / 2][mr]` pairs (value `2p` in the low 16 bits,
/// `2p + 1` in the high; both 16-bit, whatever the width `T` rounded to), `ds`
/// is `[k / 32][2][mr]` (each block's `d`, then its `d · Σq`). Rows past
/// `x.len() / k` are zero.
pub fn pack_rows<T: ActInt>(x: &[f32], k: usize, mr: usize, qs: &mut [i32], ds: &mut [f32]) {
    let nb = k / ACT_BLOCK;
    assert!(k.is_multiple_of(ACT_BLOCK) && qs.len() == k / 2 * mr && ds.len() == nb * 2 * mr);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<T: ActInt>(x: &[f32], k: usize, mr: usize, qs: &mut [i32], ds: &mut [f32]) {
            pack_rows_in::<T>(x, k, mr, qs, ds)
        }
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { avx2::<T>(x, k, mr, qs, ds) };
    }
    pack_rows_in::<T>(x, k, mr, qs, ds)
}

/// The body of [`pack_rows`] (its quantizer vectorizes where inlined).
#[inline(always)]
fn pack_rows_in<T: ActInt>(x: &[f32], k: usize, mr: usize, qs: &mut [i32], ds: &mut [f32]) {
    qs.fill(0);
    ds.fill(0.0);
    let mut qb = [T::default(); ACT_BLOCK];
    for (i, row) in x.chunks_exact(k).take(mr).enumerate() {
        for (b, xb) in row.chunks_exact(ACT_BLOCK).enumerate() {
            let [d, s] = quantize_block(xb.try_into().unwrap_or(&[0.0; ACT_BLOCK]), &mut qb);
            ds[b * 2 * mr + i] = d;
            ds[b * 2 * mr + mr + i] = s;
            for (p, q) in qb.chunks_exact(2).enumerate() {
                let (lo, hi): (i32, i32) = (q[0].into(), q[1].into());
                qs[(b * ACT_BLOCK / 2 + p) * mr + i] = (lo & 0xFFFF) | (hi << 16);
            }
        }
    }
}

/// Rows `r0..r0 + mr` of `a` laid out for the 8-bit integer GEMM tiles,
/// which broadcast one quad (4 consecutive values) of each row at a time:
/// `qs` is `[k / 4][mr]` quads (value `4p + j` in byte `j`), `ds` is
/// `[k / span][2][mr]`: per `span`-value scale group (16, 32, or 256 where
/// every block of a row has the row's scale, `row_scale`) its `d`, then
/// `d · Σq`. Rows past `a.m` are zero.
pub fn pack_quads(
    a: &ActRows<i8>,
    r0: usize,
    mr: usize,
    span: usize,
    qs: &mut [i32],
    ds: &mut [f32],
) {
    let k = a.k;
    assert!(matches!(span, 16 | 32) || (span == 256 && a.row_scale));
    assert!(k.is_multiple_of(span) && qs.len() == k / 4 * mr && ds.len() == k / span * 2 * mr);
    qs.fill(0);
    ds.fill(0.0);
    for i in 0..mr.min(a.m.saturating_sub(r0)) {
        let row = &a.qs[(r0 + i) * k..(r0 + i + 1) * k];
        for (p, q) in row.chunks_exact(4).enumerate() {
            qs[p * mr + i] = i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
        }
        group_scales(a, r0 + i, i, mr, span, ds);
    }
}

/// Row `row` of `a` into slot `i` of `ds` (`[k / span][2][mr]`): per
/// `span`-value scale group its `d`, then `d · Σq` (past a block, the
/// row's scale: the callers check `row_scale`).
pub fn group_scales<T: ActInt>(
    a: &ActRows<T>,
    row: usize,
    i: usize,
    mr: usize,
    span: usize,
    ds: &mut [f32],
) {
    let qs = &a.qs[row * a.k..(row + 1) * a.k];
    let rds = &a.ds[row * a.blocks()..(row + 1) * a.blocks()];
    for (g, grp) in qs.chunks_exact(span).enumerate() {
        let d = rds[g * span / ACT_BLOCK][0];
        let sum: i32 = grp.iter().map(|&q| Into::<i32>::into(q)).sum();
        ds[g * 2 * mr + i] = d;
        ds[g * 2 * mr + mr + i] = d * sum as f32;
    }
}

/// Activation rows split for the repacked weight kernels (`cpu::repack`),
/// whose byte dot products (`vpdpbusd`, `vpmaddubsw`) take one unsigned and
/// one signed byte: a 16-bit value is `256·hi + lo` (`hi` signed, `lo`
/// unsigned), summed exactly as two byte dots; 8-bit values are `hi` alone
/// (`lo` empty). `x32` holds 32 × the sum of each 16 integers, Q6_K's
/// `q − 32` offset; `s256` per row and whole 256 values the sum of their 8
/// blocks' `d·Σq`, the ternary types' offset term (summed once here, not
/// once per 16 weight rows).
#[derive(Clone, Debug, Default)]
pub struct ActDigits {
    pub m: usize,
    pub k: usize,
    pub hi: Vec<i8>,
    pub lo: Vec<u8>,
    pub x32: Vec<i32>,
    pub s256: Vec<f32>,
}

impl ActDigits {
    pub fn new<T: ActInt>(x: &ActRows<T>) -> ActDigits {
        let wide = T::MAX > 127.0;
        let n = x.qs.len();
        let mut d = ActDigits {
            m: x.m,
            k: x.k,
            hi: vec![0; n],
            lo: vec![0; if wide { n } else { 0 }],
            x32: vec![0; n / 16],
            s256: Vec::with_capacity(x.m * (x.k / 256)),
        };
        digits(&x.qs, &mut d, wide);
        for row in x.ds.chunks_exact(x.blocks()) {
            for eight in row.chunks_exact(256 / ACT_BLOCK) {
                let mut sx = 0.0;
                for b in eight {
                    sx += b[1];
                }
                d.s256.push(sx);
            }
        }
        d
    }
}

/// The body of [`ActDigits::new`], vectorized for AVX2 where the CPU has it.
fn digits<T: ActInt>(qs: &[T], d: &mut ActDigits, wide: bool) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        #[target_feature(enable = "avx2")]
        unsafe fn avx2<T: ActInt>(qs: &[T], d: &mut ActDigits, wide: bool) {
            digits_in(qs, d, wide)
        }
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { avx2(qs, d, wide) };
    }
    digits_in(qs, d, wide)
}

#[inline(always)]
fn digits_in<T: ActInt>(qs: &[T], d: &mut ActDigits, wide: bool) {
    for (c, s) in qs.chunks_exact(16).zip(d.x32.iter_mut()) {
        *s = 32 * c.iter().map(|&q| Into::<i32>::into(q)).sum::<i32>();
    }
    split_bytes(qs, &mut d.hi, &mut d.lo, wide);
}

/// Integers as the byte dot products take them: 16-bit ones (`wide`) as
/// `256·hi + lo` (`hi` signed, `lo` unsigned), 8-bit ones as `hi` alone
/// (`lo` untouched).
#[inline(always)]
pub fn split_bytes<T: ActInt>(qs: &[T], hi: &mut [i8], lo: &mut [u8], wide: bool) {
    if wide {
        for ((&q, h), l) in qs.iter().zip(hi.iter_mut()).zip(lo.iter_mut()) {
            let v: i32 = q.into();
            *h = (v >> 8) as i8;
            *l = v as u8;
        }
    } else {
        for (&q, h) in qs.iter().zip(hi.iter_mut()) {
            *h = Into::<i32>::into(q) as i8;
        }
    }
}

impl<T> ActRows<T> {
    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.k / ACT_BLOCK
    }
}

/// Whether weights of `dtype` have integer-dot kernels (its row's
/// `cpu.int_dot`, quants/types.rs).
pub fn supports(dtype: DType) -> bool {
    dtype.format().cpu.int_dot
}

/// The 32 integer weights meeting activation block `b` of a row `w` of
/// `dtype`, with `[s, o]`: the block's value is `s·q + o` (Q4_K / Q5_K: one
/// of the 8 sub-blocks of a 256-value block, `d·sc·q − dmin·m`; Q6_K: two
/// 16-value sub-blocks whose scales go into the integers, `d·(sc·(q − 32))`).
pub fn block_weights(dtype: DType, w: &[u8], b: usize) -> ([i32; ACT_BLOCK], [f32; 2]) {
    let f16 = |blk: &[u8], o: usize| {
        half::f16::from_bits(u16::from_le_bytes([blk[o], blk[o + 1]])).to_f32()
    };
    let nibbles = |qs: &[u8]| -> [i32; ACT_BLOCK] {
        std::array::from_fn(|j| {
            if j < 16 {
                (qs[j] & 0x0F) as i32
            } else {
                (qs[j - 16] >> 4) as i32
            }
        })
    };
    // Q5_0 / Q5_1: bit j of the 32-bit `qh` is value j's 5th bit.
    let with_bit4 = |q: [i32; ACT_BLOCK], qh: &[u8]| -> [i32; ACT_BLOCK] {
        let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        std::array::from_fn(|j| q[j] | (((h >> j) & 1) << 4) as i32)
    };
    let bb = dtype.block_bytes();
    match dtype {
        DType::Q4_0 => {
            let blk = &w[b * bb..(b + 1) * bb];
            let d = f16(blk, 0);
            (nibbles(&blk[2..18]), [d, -8.0 * d])
        }
        DType::Q4_1 => {
            let blk = &w[b * bb..(b + 1) * bb];
            (nibbles(&blk[4..20]), [f16(blk, 0), f16(blk, 2)])
        }
        DType::Q5_0 => {
            let blk = &w[b * bb..(b + 1) * bb];
            let d = f16(blk, 0);
            (with_bit4(nibbles(&blk[6..22]), &blk[2..6]), [d, -16.0 * d])
        }
        DType::Q5_1 => {
            let blk = &w[b * bb..(b + 1) * bb];
            (
                with_bit4(nibbles(&blk[8..24]), &blk[4..8]),
                [f16(blk, 0), f16(blk, 2)],
            )
        }
        DType::Q8_0 => {
            let blk = &w[b * bb..(b + 1) * bb];
            (
                std::array::from_fn(|j| blk[2 + j] as i8 as i32),
                [f16(blk, 0), 0.0],
            )
        }
        DType::Q4K => {
            let blk = &w[(b / 8) * bb..(b / 8 + 1) * bb];
            let s = b % 8;
            let (sc, m) = crate::quants::scale_min_k4(s, &blk[4..16]);
            let qs = &blk[16 + 32 * (s / 2)..16 + 32 * (s / 2) + 32];
            let shift = 4 * (s % 2);
            let q = std::array::from_fn(|j| ((qs[j] >> shift) & 0x0F) as i32);
            (q, [f16(blk, 0) * sc as f32, -f16(blk, 2) * m as f32])
        }
        DType::Q5K => {
            let blk = &w[(b / 8) * bb..(b / 8 + 1) * bb];
            let s = b % 8;
            let (sc, m) = crate::quants::scale_min_k4(s, &blk[4..16]);
            let (qh, qs) = (
                &blk[16..48],
                &blk[48 + 32 * (s / 2)..48 + 32 * (s / 2) + 32],
            );
            let shift = 4 * (s % 2);
            let q = std::array::from_fn(|j| {
                (((qs[j] >> shift) & 0x0F) | (((qh[j] >> s) & 1) << 4)) as i32
            });
            (q, [f16(blk, 0) * sc as f32, -f16(blk, 2) * m as f32])
        }
        DType::Q6K => {
            // Block b is group g of half h: low or high nibbles of one 32-byte
            // run of `ql`, bits 2g..2g+2 of `qh`, scales 2g and 2g + 1.
            let blk = &w[(b / 8) * bb..(b / 8 + 1) * bb];
            let (h, g) = ((b % 8) / 4, b % 4);
            let ql = &blk[64 * h + 32 * (g % 2)..64 * h + 32 * (g % 2) + 32];
            let qh = &blk[128 + 32 * h..128 + 32 * h + 32];
            let sc = &blk[192 + 8 * h + 2 * g..192 + 8 * h + 2 * g + 2];
            let q = std::array::from_fn(|j| {
                let lo = (ql[j] >> (4 * (g / 2))) & 0x0F;
                let hi = (qh[j] >> (2 * g)) & 3;
                (sc[j / 16] as i8 as i32) * ((lo | hi << 4) as i32 - 32)
            });
            (q, [f16(blk, 208), 0.0])
        }
        // Ternary digits as `t + 1` (0..=2), the −1 in the offset term.
        DType::TQ1_0 => {
            let blk = &w[(b / 8) * bb..(b / 8 + 1) * bb];
            let e0 = 32 * (b % 8);
            let d = f16(blk, 52);
            (
                std::array::from_fn(|j| crate::quants::tq1_0_digit(blk, e0 + j)),
                [d, -d],
            )
        }
        DType::TQ2_0 => {
            // Block b % 8 is bit pair (b % 4) of bytes 32·(b % 8 / 4)..+32.
            let blk = &w[(b / 8) * bb..(b / 8 + 1) * bb];
            let s = b % 8;
            let qs = &blk[32 * (s / 4)..32 * (s / 4) + 32];
            let d = f16(blk, 64);
            (
                std::array::from_fn(|j| ((qs[j] >> (2 * (s % 4))) & 3) as i32),
                [d, -d],
            )
        }
        // Rows without `cpu.int_dot` never come here (`supports`).
        _ => unreachable!("no integer weights for this type"),
    }
}

/// One weight row (`k` values of `dtype`, one of [`supports`]) dotted
/// with row `i` of `x`: per block an exact integer sum `Σ q_w q_x`, scaled.
pub fn dot_row<T: ActInt>(dtype: DType, w: &[u8], x: &ActRows<T>, i: usize) -> f32 {
    debug_assert!(supports(dtype));
    let nb = x.blocks();
    let qx = &x.qs[i * x.k..(i + 1) * x.k];
    let ds = &x.ds[i * nb..(i + 1) * nb];
    let (mut acc, mut offset) = (0f32, 0f32);
    for (b, &[dx, sx]) in ds.iter().enumerate() {
        let (q, [scale, off]) = block_weights(dtype, w, b);
        let qb = &qx[b * ACT_BLOCK..(b + 1) * ACT_BLOCK];
        // i64: Q6_K's scaled weights (|w| <= 4096) against 16-bit x can
        // pass i32 over a whole block.
        let sum: i64 = q
            .iter()
            .zip(qb)
            .map(|(&a, &b)| a as i64 * Into::<i32>::into(b) as i64)
            .sum();
        acc += scale * dx * sum as f32;
        offset += off * sx;
    }
    acc + offset
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `quantize_block` as plainly as it can be written.
    fn reference<T: ActInt>(x: &[f32], to: impl Fn(f32) -> T) -> (Vec<T>, Vec<[f32; 2]>) {
        let (mut qs, mut ds) = (Vec::new(), Vec::new());
        for xb in x.chunks_exact(ACT_BLOCK) {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / T::MAX;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let q: Vec<T> = xb.iter().map(|v| to((v * id).round())).collect();
            let sum: i32 = q.iter().map(|&q| q.into()).sum();
            qs.extend(q);
            ds.push([d, d * sum as f32]);
        }
        (qs, ds)
    }

    /// Random blocks, exact halves (`x·id` = k + 0.5), zeros, signed zeros,
    /// subnormals, infinities and NaN.
    fn inputs() -> Vec<f32> {
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut x: Vec<f32> = (0..64 * ACT_BLOCK).map(|_| rnd() * 3.0).collect();
        for (i, v) in x[..ACT_BLOCK].iter_mut().enumerate() {
            // amax 127 (and 32767 · 2⁻⁸): 8-bit steps of 1, halves between.
            *v = if i == 0 { 127.0 } else { i as f32 - 15.5 };
        }
        x[ACT_BLOCK..2 * ACT_BLOCK].fill(0.0);
        x[2 * ACT_BLOCK] = -0.0;
        x[3 * ACT_BLOCK] = f32::from_bits(1);
        x[3 * ACT_BLOCK + 1] = -f32::from_bits(7);
        x[4 * ACT_BLOCK + 3] = f32::INFINITY;
        x[5 * ACT_BLOCK + 4] = f32::NEG_INFINITY;
        x[6 * ACT_BLOCK + 5] = f32::NAN;
        x[7 * ACT_BLOCK..8 * ACT_BLOCK].fill(f32::NAN);
        x
    }

    fn same<T: ActInt + PartialEq + std::fmt::Debug>(to: impl Fn(f32) -> T) {
        let x = inputs();
        let got = ActRows::<T>::quantize(&x, 2, x.len() / 2);
        let (qs, ds) = reference(&x, to);
        assert_eq!(got.qs, qs);
        let bits =
            |d: &[[f32; 2]]| -> Vec<[u32; 2]> { d.iter().map(|p| p.map(f32::to_bits)).collect() };
        assert_eq!(bits(&got.ds), bits(&ds));
    }

    /// Rows as `round_i8` leaves them come back as their integers, exactly;
    /// a row one value off its levels does not.
    #[test]
    fn rows_on_int8_levels_quantize_to_their_integers() {
        let k = 4 * ACT_BLOCK;
        let ints: Vec<i32> = (0..2 * k as i32).map(|i| (i * 37 % 255) - 127).collect();
        let amax = [127.0f32, 101.0];
        let mut x = Vec::new();
        for (r, a) in amax.iter().enumerate() {
            // Row r's largest magnitude is 127 levels of `a / 127`.
            let s = 127.0 / a;
            x.extend(ints[r * k..(r + 1) * k].iter().map(|&q| q as f32 / s));
        }
        let got = ActRows::<i8>::levels(&x, 2, k).expect("rows on their levels");
        let want: Vec<i8> = ints.iter().map(|&q| q as i8).collect();
        assert_eq!(got.qs, want);
        for (b, [d, ds]) in got.ds.iter().enumerate() {
            let r = b / (k / ACT_BLOCK);
            assert_eq!(*d, amax[r] / 127.0);
            let sum: i32 = ints[b * ACT_BLOCK..(b + 1) * ACT_BLOCK].iter().sum();
            assert!((ds - sum as f32 * d).abs() <= 1e-4 * ds.abs().max(1.0));
        }
        x[k + 5] *= 1.004;
        assert!(ActRows::<i8>::levels(&x, 2, k).is_none());
        assert!(ActRows::<i8>::levels(&inputs(), 2, inputs().len() / 2).is_none());
    }

    #[test]
    fn vectorized_quantizer_equals_the_plain_one_bit_for_bit() {
        same::<i16>(|v| v as i16);
        same::<i8>(|v| v as i8);
    }
}
