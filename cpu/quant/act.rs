//! Activations quantized per 32-value block to 16-bit or 8-bit integers
//! (ggml's Q8_1 layout idea, with f32 scales), for the CPU's integer-dot
//! decode, and the scalar block dots of Q4_0 / Q4_1 / Q8_0 weights with
//! them. The SIMD kernels (`cpu::simd`) compute the same exact integer sums
//! and combine them with the same formulas.

use crate::dtype::DType;

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
    fn from_rounded(v: f32) -> i8 {
        v as i8
    }
}

impl ActInt for i16 {
    const MAX: f32 = 32767.0;
    fn from_rounded(v: f32) -> i16 {
        v as i16
    }
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
            ds: Vec::with_capacity(m * k / ACT_BLOCK),
        };
        for (xb, qb) in x[..m * k]
            .chunks_exact(ACT_BLOCK)
            .zip(out.qs.chunks_exact_mut(ACT_BLOCK))
        {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / T::MAX;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, v) in qb.iter_mut().zip(xb) {
                *q = T::from_rounded((v * id).round());
                sum += (*q).into();
            }
            out.ds.push([d, d * sum as f32]);
        }
        out
    }
}

impl<T> ActRows<T> {
    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.k / ACT_BLOCK
    }
}

/// Whether weights of `dtype` have integer-dot kernels.
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// One weight row (`k / 32` blocks of `dtype`, one of [`supports`]; other
/// types give 0) dotted with row `i` of `x`: per block an exact integer sum
/// `Σ q_w q_x`, scaled.
pub fn dot_row<T: ActInt>(dtype: DType, w: &[u8], x: &ActRows<T>, i: usize) -> f32 {
    debug_assert!(supports(dtype));
    let nb = x.blocks();
    let bb = dtype.block_bytes();
    let qx = &x.qs[i * x.k..(i + 1) * x.k];
    let ds = &x.ds[i * nb..(i + 1) * nb];
    let mut acc = 0f32;
    let mut offset = 0f32;
    for (b, blk) in w.chunks_exact(bb).take(nb).enumerate() {
        let q = &qx[b * ACT_BLOCK..(b + 1) * ACT_BLOCK];
        let [dx, sx] = ds[b];
        let f16 =
            |o: usize| half::f16::from_bits(u16::from_le_bytes([blk[o], blk[o + 1]])).to_f32();
        let nib = |j: usize, qs: &[u8]| -> i32 {
            if j < 16 {
                (qs[j] & 0x0F) as i32
            } else {
                (qs[j - 16] >> 4) as i32
            }
        };
        let sum = |wq: &dyn Fn(usize) -> i32| -> f32 {
            (0..ACT_BLOCK).map(|j| wq(j) * q[j].into()).sum::<i32>() as f32
        };
        match dtype {
            // (q - 8) d: Σ q x - 8 Σ x.
            DType::Q4_0 => {
                let dw = f16(0);
                acc += dw * dx * sum(&|j| nib(j, &blk[2..18]));
                offset -= 8.0 * dw * sx;
            }
            // q d + m: d Σ q x + m Σ x.
            DType::Q4_1 => {
                acc += f16(0) * dx * sum(&|j| nib(j, &blk[4..20]));
                offset += f16(2) * sx;
            }
            DType::Q8_0 => acc += f16(0) * dx * sum(&|j| blk[2 + j] as i8 as i32),
            _ => {}
        }
    }
    acc + offset
}
