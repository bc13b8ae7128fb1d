//! AVX2+FMA kernels: 16-lane primitives (pairs of ymm) for the shared
//! decoders/dot kernels, and the 6x16 register-blocked GEMM microkernel.

shared_kernels!("avx2,fma,f16c");

#[derive(Clone, Copy)]
struct V(__m256, __m256);

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn zero() -> V {
    V(_mm256_setzero_ps(), _mm256_setzero_ps())
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn splat(v: f32) -> V {
    V(_mm256_set1_ps(v), _mm256_set1_ps(v))
}
/// Lane 0 of `v` in every lane.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bcast(v: __m128) -> V {
    let b = _mm256_broadcastss_ps(v);
    V(b, b)
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn loadu(p: *const f32) -> V {
    V(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn storeu(p: *mut f32, v: V) {
    _mm256_storeu_ps(p, v.0);
    _mm256_storeu_ps(p.add(8), v.1);
}
/// `a * b + c`, one rounding.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fmadd(a: V, b: V, c: V) -> V {
    V(
        _mm256_fmadd_ps(a.0, b.0, c.0),
        _mm256_fmadd_ps(a.1, b.1, c.1),
    )
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn mul(a: V, b: V) -> V {
    V(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1))
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn add(a: V, b: V) -> V {
    V(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1))
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sub(a: V, b: V) -> V {
    V(_mm256_sub_ps(a.0, b.0), _mm256_sub_ps(a.1, b.1))
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: V) -> f32 {
    let s = _mm256_add_ps(v.0, v.1);
    let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    let d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)))
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn u8_to_f32(v: __m128i) -> V {
    V(
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))),
    )
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn i8_to_f32(v: __m128i) -> V {
    V(
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))),
    )
}
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_to_f32(p: *const u8) -> V {
    V(
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i)),
    )
}
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_to_f32(p: *const u8) -> V {
    let w0 = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    let w1 = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(16) as *const __m128i));
    V(
        _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)),
        _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)),
    )
}

/// Panel width in weight rows (two ymm of f32).
pub(crate) const NR: usize = 16;
/// Activation rows per microkernel call: 6 x 2 accumulators + 2 panel
/// registers + 1 broadcast fit the 16 ymm registers.
pub(crate) const MR: usize = 6;

/// `y[i, 0..ncols] = Σ_k x[i, k] * panel[k, 0..ncols]` for `R` rows of the
/// packed activation block `x` (`[k, MR]`).
#[target_feature(enable = "avx2,fma")]
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
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for kk in 0..kc {
        let p0 = _mm256_loadu_ps(panel.add(kk * NR));
        let p1 = _mm256_loadu_ps(panel.add(kk * NR + 8));
        for (i, a) in acc.iter_mut().enumerate() {
            let xv = _mm256_set1_ps(*x.add(kk * MR + i));
            a[0] = _mm256_fmadd_ps(xv, p0, a[0]);
            a[1] = _mm256_fmadd_ps(xv, p1, a[1]);
        }
    }
    for (i, a) in acc.iter().enumerate() {
        let row = y.add(i * ldy);
        let mut tmp = [0f32; NR];
        if accumulate {
            core::ptr::copy_nonoverlapping(row, tmp.as_mut_ptr(), ncols);
        }
        let t = tmp.as_mut_ptr();
        _mm256_storeu_ps(t, _mm256_add_ps(a[0], _mm256_loadu_ps(t)));
        _mm256_storeu_ps(t.add(8), _mm256_add_ps(a[1], _mm256_loadu_ps(t.add(8))));
        core::ptr::copy_nonoverlapping(tmp.as_ptr(), row, ncols);
    }
}

/// `y[i, 0..ncols] (+)= x[i, k0..k0 + kc] · panel` for all `m` rows of `x`,
/// packed as `[ceil(m / MR), k, MR]` (see `cpu::simd::pack_activations`) and
/// already offset to `k0`; `panel` is `[kc, NR]`. Adds to `y` when `accumulate`.
#[target_feature(enable = "avx2,fma")]
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
        _ => micro::<5>(p, xr, kc, yr, ldy, ncols, accumulate),
    }
}
