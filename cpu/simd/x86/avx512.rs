//! AVX-512F kernels: 16-lane primitives for the shared decoders/dot kernels,
//! and the 12x32 register-blocked GEMM microkernel.

shared_kernels!("avx512f,avx2,fma,f16c");

type V = __m512;

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn zero() -> V {
    _mm512_setzero_ps()
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn splat(v: f32) -> V {
    _mm512_set1_ps(v)
}
/// Lane 0 of `v` in every lane.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn bcast(v: __m128) -> V {
    _mm512_broadcastss_ps(v)
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn loadu(p: *const f32) -> V {
    _mm512_loadu_ps(p)
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn storeu(p: *mut f32, v: V) {
    _mm512_storeu_ps(p, v)
}
/// `a * b + c`, one rounding.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fmadd(a: V, b: V, c: V) -> V {
    _mm512_fmadd_ps(a, b, c)
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn mul(a: V, b: V) -> V {
    _mm512_mul_ps(a, b)
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn add(a: V, b: V) -> V {
    _mm512_add_ps(a, b)
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn sub(a: V, b: V) -> V {
    _mm512_sub_ps(a, b)
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn hsum(v: V) -> f32 {
    _mm512_reduce_add_ps(v)
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn u8_to_f32(v: __m128i) -> V {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn i8_to_f32(v: __m128i) -> V {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn f16_to_f32(p: *const u8) -> V {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn bf16_to_f32(p: *const u8) -> V {
    let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i));
    _mm512_castsi512_ps(_mm512_slli_epi32(w, 16))
}

/// Panel width in weight rows (two zmm of f32).
pub(crate) const NR: usize = 32;
/// Activation rows per microkernel call: 12 x 2 accumulators + 2 panel
/// registers fit the 32 zmm registers.
pub(crate) const MR: usize = 12;

/// `y[i, 0..ncols] = Σ_k x[i, k] * panel[k, 0..ncols]` for `R` rows of the
/// packed activation block `x` (`[k, MR]`) and output rows of stride `ldy`. `panel` is `k x NR`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<const R: usize>(
    panel: *const f32,
    x: *const f32,
    kc: usize,
    y: *mut f32,
    ldy: usize,
    ncols: usize,
    accumulate: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for kk in 0..kc {
        let p0 = _mm512_loadu_ps(panel.add(kk * NR));
        let p1 = _mm512_loadu_ps(panel.add(kk * NR + 16));
        for (i, a) in acc.iter_mut().enumerate() {
            let xv = _mm512_set1_ps(*x.add(kk * MR + i));
            a[0] = _mm512_fmadd_ps(xv, p0, a[0]);
            a[1] = _mm512_fmadd_ps(xv, p1, a[1]);
        }
    }
    let lo = (1u32 << ncols.min(16)) - 1;
    let hi = if ncols > 16 {
        ((1u64 << (ncols - 16)) - 1) as u32
    } else {
        0
    };
    let (lo, hi) = (lo as u16, hi as u16);
    for (i, a) in acc.iter().enumerate() {
        let row = y.add(i * ldy);
        let (mut a0, mut a1) = (a[0], a[1]);
        if accumulate {
            a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(lo, row));
            a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(hi, row.add(16)));
        }
        _mm512_mask_storeu_ps(row, lo, a0);
        _mm512_mask_storeu_ps(row.add(16), hi, a1);
    }
}

/// `y[i, 0..ncols] (+)= x[i, k0..k0 + kc] · panel` for all `m` rows of `x`,
/// packed as `[ceil(m / MR), k, MR]` (see `cpu::simd::pack_activations`) and
/// already offset to `k0`; `panel` is `[kc, NR]`. Adds to `y` when `accumulate`.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_panel(
    panel: &[f32],
    x: &[f32],
    m: usize,
    k: usize,
    kc: usize,
    y: *mut f32,
    ldy: usize,
    ncols: usize,
    accumulate: bool,
) {
    let (p, xp) = (panel.as_ptr(), x.as_ptr());
    let mut i = 0;
    while i + MR <= m {
        micro::<MR>(p, xp.add(i * k), kc, y.add(i * ldy), ldy, ncols, accumulate);
        i += MR;
    }
    let (xr, yr) = (xp.add(i * k), y.add(i * ldy));
    match m - i {
        0 => {}
        1 => micro::<1>(p, xr, kc, yr, ldy, ncols, accumulate),
        2 => micro::<2>(p, xr, kc, yr, ldy, ncols, accumulate),
        3 => micro::<3>(p, xr, kc, yr, ldy, ncols, accumulate),
        4 => micro::<4>(p, xr, kc, yr, ldy, ncols, accumulate),
        5 => micro::<5>(p, xr, kc, yr, ldy, ncols, accumulate),
        6 => micro::<6>(p, xr, kc, yr, ldy, ncols, accumulate),
        7 => micro::<7>(p, xr, kc, yr, ldy, ncols, accumulate),
        8 => micro::<8>(p, xr, kc, yr, ldy, ncols, accumulate),
        9 => micro::<9>(p, xr, kc, yr, ldy, ncols, accumulate),
        10 => micro::<10>(p, xr, kc, yr, ldy, ncols, accumulate),
        _ => micro::<11>(p, xr, kc, yr, ldy, ncols, accumulate),
    }
}
