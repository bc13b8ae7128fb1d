//! Decode GEMV kernels for weights repacked in 16-row groups
//! (`cpu::repack`): Q4_0, Q4_1, Q4_K, Q6_K, TQ1_0, TQ2_0 against
//! activations split into bytes (`act::ActDigits`). Each register lane is
//! one weight row; a broadcast activation word meets the same 4 weights of
//! every row, so the integer sums need no horizontal reduction and each
//! block's scales are converted once per 16 rows. Per 32-value block
//! (Q6_K: per 16) the integer sum is exact, then scaled in f32 with the
//! same products as `act::dot_row`: `(d_w · d_x) · Σ`, and the offset
//! terms `o_w · d_x Σq_x`.
//!
//! Two instances: AVX-512 VNNI (16 lanes, `vpdpbusd`) and AVX2 (8 lanes,
//! `vpmaddubsw` + `vpmaddwd`, each group in two halves).

/// How far ahead (bytes) the Q6_K kernel prefetches weights, line by line:
/// measured single-threaded from DRAM, it streams ~15% faster with it. The
/// other kernels prefetch a whole block ahead at each block's start
/// (`prefetch_span`; Q4_0 / Q4_1 four of their short blocks): on a 16-core
/// Xeon a task's stream of a few tens of KB ends before the hardware
/// prefetcher has ramped up, and BitNet's TQ2_0 decode at 16 threads went
/// from 62 to 74 tok/s with it (benches/README.md).
const PREFETCH: usize = 1024;

/// One activation row, as the kernels read it: `hi` / `lo` bytes
/// (`lo` unused for 8-bit activations), per 32-value block `[d, d·Σq]`,
/// per 16 values `32·Σq`, and per 256 the sum of `d·Σq` (`ActDigits`).
#[derive(Clone, Copy)]
pub(crate) struct Xrow {
    pub hi: *const i8,
    pub lo: *const u8,
    pub ds: *const [f32; 2],
    pub x32: *const i32,
    pub s256: *const f32,
}

macro_rules! packed_kernels {
    ($feat:literal) => {
        use super::{Xrow, PREFETCH};
        use crate::dtype::DType;
        use core::arch::x86_64::*;

        /// Halves of a 16-row group this instance covers one at a time.
        const H: usize = 16 / L;
        /// Bytes of a 64-byte dword group (and of a 16-byte plane, f16 run)
        /// one half reads.
        const HB: usize = 4 * L;

        /// Prefetch the line `PREFETCH` bytes past `p` (on the first half only:
        /// the halves share lines).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn pf(p: *const u8, h: usize) {
            if h == 0 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH) as *const i8);
            }
        }

        /// Prefetch the `len` bytes at `p` into L1 (no fault past the end).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn prefetch_span(p: *const u8, len: usize) {
            for l in 0..len.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * l) as *const i8);
            }
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn mask(v: i8) -> V {
            splat8(v)
        }

        /// Low and high nibbles of `v`'s bytes.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn nib(v: V) -> (V, V) {
            let m4 = mask(0x0F);
            (and(v, m4), and(srli16::<4>(v), m4))
        }

        /// The activation words at value `o` of `x`, broadcast: `hi` bytes
        /// and (16-bit activations) `lo` bytes.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn xw<const LO: bool>(x: Xrow, o: usize) -> (V, V) {
            let hi = xword(x.hi.add(o).cast());
            (hi, if LO { xword(x.lo.add(o)) } else { hi })
        }

        /// Q4_0 (`MIN` false): `nb` blocks of 288 bytes (`d[16]`, 4 chunks of
        /// 64 qs bytes); Q4_1 (`MIN`): 320 bytes, `m[16]` between the two.
        #[target_feature(enable = $feat)]
        unsafe fn q4<const LO: bool, const MIN: bool>(
            w: *const u8,
            nb: usize,
            x: Xrow,
            out: *mut f32,
        ) {
            let (bb, qs) = if MIN { (320, 64) } else { (288, 32) };
            let mut acc = [fzero(); H];
            let mut off = [fzero(); H];
            for b in 0..nb {
                let p = w.add(b * bb);
                prefetch_span(p.wrapping_add(4 * bb), bb);
                let [dx, sx] = *x.ds.add(b);
                // Both halves in one pass: each activation word is
                // broadcast once for the whole group.
                let mut a = [Acc::new(); H];
                for c in 0..4 {
                    let o = 32 * b + 4 * c;
                    let ((h0, l0), (h1, l1)) = (xw::<LO>(x, o), xw::<LO>(x, o + 16));
                    for (h, a) in a.iter_mut().enumerate() {
                        let (wl, wh) = nib(ld(p.add(qs + 64 * c + HB * h)));
                        dot4::<LO>(a, wl, h0, l0);
                        dot4::<LO>(a, wh, h1, l1);
                        if c % 2 == 1 {
                            settle::<LO>(a);
                        }
                    }
                }
                for (h, a) in a.into_iter().enumerate() {
                    let d = f16(p.add(HB / 2 * h));
                    acc[h] = fmadd(cvt(total::<LO>(a)), mul(d, fsplat(dx)), acc[h]);
                    // The offset term's weight: Q4_1's `m`, Q4_0's `d`
                    // (times −8 at the end).
                    let o = if MIN { f16(p.add(32 + HB / 2 * h)) } else { d };
                    off[h] = fmadd(o, fsplat(sx), off[h]);
                }
            }
            // Q4_0's values are d·(q − 8): the offset term is −8·d·d_x Σq_x;
            // Q4_1's are d·q + m: it is m·d_x Σq_x.
            let k = if MIN { -1.0 } else { 8.0 };
            for h in 0..H {
                store(out.add(L * h), fnmadd(off[h], fsplat(k), acc[h]));
            }
        }

        /// Q4_K sub-block `s`'s 6-bit scale and min for this half's rows
        /// (`scale_min_k4` on 12 byte planes at `p`).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn scale_min(p: *const u8, s: usize) -> (__m128i, __m128i) {
            let pl = |i: usize| bytes(p.add(16 * i));
            let m6 = _mm_set1_epi8(63);
            if s < 4 {
                (_mm_and_si128(pl(s), m6), _mm_and_si128(pl(s + 4), m6))
            } else {
                let (m4, m30) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(0x30));
                let top = |v: __m128i| _mm_and_si128(_mm_srli_epi16::<2>(v), m30);
                let q = pl(s + 4);
                (
                    _mm_or_si128(_mm_and_si128(q, m4), top(pl(s - 4))),
                    _mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(q), m4), top(pl(s))),
                )
            }
        }

        /// Q4_K: `nsb` super-blocks of 2304 bytes (`d[16]`, `dmin[16]`, 12
        /// scale planes, 32 dword groups of `qs`). Per super-block the
        /// sub-blocks' `sc · d_x · Σ` and `m · d_x Σq_x` are summed first,
        /// then scaled by the rows' `d` and `dmin` once.
        #[target_feature(enable = $feat)]
        unsafe fn q4_k<const LO: bool>(w: *const u8, nsb: usize, x: Xrow, out: *mut f32) {
            let mut acc = [fzero(); H];
            let mut off = [fzero(); H];
            for sb in 0..nsb {
                let p = w.add(sb * 2304);
                prefetch_span(p.wrapping_add(2304), 2304);
                for h in 0..H {
                    let (mut sacc, mut soff) = (fzero(), fzero());
                    for q in 0..4 {
                        let (mut a0, mut a1) = (Acc::new(), Acc::new());
                        for g in 0..8 {
                            let (wl, wh) = nib(ld(p.add(256 + 64 * (8 * q + g) + HB * h)));
                            let o = 256 * sb + 64 * q + 4 * g;
                            let ((h0, l0), (h1, l1)) = (xw::<LO>(x, o), xw::<LO>(x, o + 32));
                            dot4::<LO>(&mut a0, wl, h0, l0);
                            dot4::<LO>(&mut a1, wh, h1, l1);
                            if g % 4 == 3 {
                                settle::<LO>(&mut a0);
                                settle::<LO>(&mut a1);
                            }
                        }
                        for (s, a) in [(2 * q, a0), (2 * q + 1, a1)] {
                            let (sc, m) = scale_min(p.add(64 + L * h), s);
                            let [dx, sx] = *x.ds.add(8 * sb + s);
                            sacc = fmadd(cvt(total::<LO>(a)), mul(u8f(sc), fsplat(dx)), sacc);
                            soff = fmadd(u8f(m), fsplat(sx), soff);
                        }
                    }
                    let (d, dmin) = (f16(p.add(HB / 2 * h)), f16(p.add(32 + HB / 2 * h)));
                    acc[h] = fmadd(d, sacc, acc[h]);
                    off[h] = fmadd(dmin, soff, off[h]);
                }
            }
            for h in 0..H {
                store(out.add(L * h), fsub(acc[h], off[h]));
            }
        }

        /// Q6_K: `nsb` super-blocks of 3360 bytes (`d[16]`, 16 scale planes,
        /// 16 steps of two `ql` dword groups and one `qh`). Per 16-value
        /// sub-block the exact `Σ (q − 32)·x` (below 2²⁴, so its f32 is
        /// exact) times the sub-block's scale and `d_x`, summed over the
        /// super-block, then times the rows' `d`.
        #[target_feature(enable = $feat)]
        unsafe fn q6_k<const LO: bool>(w: *const u8, nsb: usize, x: Xrow, out: *mut f32) {
            let mut acc = [fzero(); H];
            let (m4, m30) = (mask(0x0F), mask(0x30));
            for sb in 0..nsb {
                let p = w.add(sb * 3360);
                for h in 0..H {
                    let mut sacc = fzero();
                    for n in 0..2 {
                        for is in 0..2 {
                            let mut a = [Acc::new(); 4];
                            for l4 in 4 * is..4 * is + 4 {
                                let step = p.add(288 + 192 * (8 * n + l4));
                                for line in 0..3 {
                                    pf(step.add(64 * line), h);
                                }
                                let step = step.add(HB * h);
                                let (qa, qb, qh) = (ld(step), ld(step.add(64)), ld(step.add(128)));
                                // Low nibbles from `ql`, bits 4-5 from `qh`.
                                let q = [
                                    merge(qa, and(slli16::<4>(qh), m30), m4),
                                    merge(qb, and(slli16::<2>(qh), m30), m4),
                                    merge(srli16::<4>(qa), and(qh, m30), m4),
                                    merge(srli16::<4>(qb), and(srli16::<2>(qh), m30), m4),
                                ];
                                for t in 0..4 {
                                    let o = 256 * sb + 128 * n + 32 * t + 4 * l4;
                                    dot::<LO>(&mut a[t], q[t], x.hi.add(o), x.lo.add(o));
                                }
                            }
                            for (t, a) in a.into_iter().enumerate() {
                                let b = 8 * sb + 4 * n + t;
                                let s = sub32(total::<LO>(a), isplat(*x.x32.add(2 * b + is)));
                                let sc = i8f(bytes(p.add(32 + 16 * (8 * n + is + 2 * t) + L * h)));
                                let [dx, _] = *x.ds.add(b);
                                sacc = fmadd(cvt(s), mul(sc, fsplat(dx)), sacc);
                            }
                        }
                    }
                    acc[h] = fmadd(f16(p.add(HB / 2 * h)), sacc, acc[h]);
                }
            }
            for h in 0..H {
                store(out.add(L * h), acc[h]);
            }
        }

        /// Each byte times 3 (8-bit wrapping).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn times3(v: V) -> V {
            add8(v, add8(v, v))
        }

        /// The top trit of each byte `v` (`3v >> 8`, 0..=2) without a byte
        /// multiply (ggml's trick, as `intdot`'s `top_trit`).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn top_trit(v: V) -> V {
            let u = subs8u(v, mask(1));
            let u = avg8(u, avg8(u, mask(0)));
            and(srli16::<6>(u), mask(3))
        }

        /// One 32-value activation block's sums `a` of `M` rows, each times
        /// 4^-`shift` (exact: the digits were masked in place) and its
        /// row's `d_x`, into `dsum`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn finish<const LO: bool, const M: usize>(
            a: &mut [Acc; M],
            x: &[Xrow; M],
            blk: usize,
            shift: bool,
            dsum: &mut [F; M],
        ) {
            for i in 0..M {
                settle::<LO>(&mut a[i]);
                let t = total::<LO>(a[i]);
                let t = if shift { srai32::<2>(t) } else { t };
                let dx = (*x[i].ds.add(blk))[0];
                dsum[i] = fmadd(cvt(t), fsplat(dx), dsum[i]);
            }
        }

        /// The end of ternary block `b` for this half's rows: their `d` times
        /// the rows' scaled sums `dsum` into `acc`, and times each row's
        /// `d_x Σq_x` over the block's 256 values into `off`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn end_block<const M: usize>(
            acc: &mut [[F; H]; M],
            off: &mut [[F; H]; M],
            h: usize,
            d: F,
            dsum: &[F; M],
            x: &[Xrow; M],
            b: usize,
        ) {
            for i in 0..M {
                acc[i][h] = fmadd(d, dsum[i], acc[i][h]);
                off[i][h] = fmadd(d, fsplat(*x[i].s256.add(b)), off[i][h]);
            }
        }

        /// The ternary kernels' rows into `out`: the values are
        /// `d·(t + 1) − d`, so the offset term is `d·d_x Σq_x`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn store_ternary<const M: usize>(
            acc: &[[F; H]; M],
            off: &[[F; H]; M],
            out: *mut f32,
        ) {
            for i in 0..M {
                for h in 0..H {
                    store(out.add(16 * i + L * h), fsub(acc[i][h], off[i][h]));
                }
            }
        }

        /// TQ1_0 against `M` activation rows (the digits decoded once for
        /// all of them): `nb` blocks of 864 bytes (`d[16]`, 13 dword groups:
        /// 12 of `qs`, then `qh`). Trit `n` (the top trit of `3ⁿ·q`, see
        /// `quants::ternary`) of `qs` byte `i < 32` is the digit `t + 1` of
        /// value `32n + i`; of `qs` byte `32 + i`, of value `160 + 16n + i`;
        /// of `qh` byte `i` (`n < 4`), of value `240 + 4n + i`. Each 32-value
        /// activation block gets eight dots (the AVX2 i16 sums stay below
        /// 8·2·2·255).
        #[target_feature(enable = $feat)]
        unsafe fn tq1_0<const LO: bool, const M: usize>(
            w: *const u8,
            nb: usize,
            x: [Xrow; M],
            out: *mut f32,
        ) {
            let mut acc = [[fzero(); H]; M];
            let mut off = [[fzero(); H]; M];
            for b in 0..nb {
                let p = w.add(b * 864);
                prefetch_span(p.wrapping_add(864), 864);
                let o = 256 * b;
                for h in 0..H {
                    let ld_g = |g: usize| p.add(32 + 64 * g + HB * h);
                    let mut dsum = [fzero(); M];
                    // Bytes 0..32: trit n is block n.
                    let mut v = [ld(ld_g(0)); 8];
                    for (g, v) in v.iter_mut().enumerate() {
                        *v = ld(ld_g(g));
                    }
                    for n in 0..5 {
                        let mut a = [Acc::new(); M];
                        for (g, v) in v.iter_mut().enumerate() {
                            let q = top_trit(*v);
                            for i in 0..M {
                                let (xh, xl) = xw::<LO>(x[i], o + 32 * n + 4 * g);
                                dot4::<LO>(&mut a[i], q, xh, xl);
                            }
                            *v = times3(*v);
                        }
                        finish::<LO, M>(&mut a, &x, 8 * b + n, false, &mut dsum);
                    }
                    // Bytes 32..48: trits 2j and 2j + 1 are block 5 + j; the
                    // qh trits end block 7.
                    let mut u = [ld(ld_g(8)); 4];
                    for (g, u) in u.iter_mut().enumerate() {
                        *u = ld(ld_g(8 + g));
                    }
                    for j in 0..3 {
                        let mut a = [Acc::new(); M];
                        for n in 2 * j..(2 * j + 2).min(5) {
                            for (g, u) in u.iter_mut().enumerate() {
                                let q = top_trit(*u);
                                for i in 0..M {
                                    let (xh, xl) = xw::<LO>(x[i], o + 160 + 16 * n + 4 * g);
                                    dot4::<LO>(&mut a[i], q, xh, xl);
                                }
                                *u = times3(*u);
                            }
                        }
                        if j == 2 {
                            let mut vh = ld(ld_g(12));
                            for n in 0..4 {
                                let q = top_trit(vh);
                                for i in 0..M {
                                    let (xh, xl) = xw::<LO>(x[i], o + 240 + 4 * n);
                                    dot4::<LO>(&mut a[i], q, xh, xl);
                                }
                                vh = times3(vh);
                            }
                        }
                        finish::<LO, M>(&mut a, &x, 8 * b + 5 + j, false, &mut dsum);
                    }
                    let d = f16(p.add(HB / 2 * h));
                    end_block(&mut acc, &mut off, h, d, &dsum, &x, b);
                }
            }
            store_ternary(&acc, &off, out);
        }

        /// TQ2_0 against `M` activation rows: `nb` blocks of 1056 bytes
        /// (`d[16]`, 16 dword groups of `qs`). Bit pair `s` of byte `i` is
        /// the digit `t + 1` of value `128·(i / 32) + 32·s + i % 32`, so
        /// pair `s` of the dword groups `8·half..+8` is one 32-value
        /// activation block. Pairs 0 and 2 go as `v & 3`, 1 and 3 as
        /// `v & 12` (four times the digit, shifted back out of the exact
        /// sum).
        #[target_feature(enable = $feat)]
        unsafe fn tq2_0<const LO: bool, const M: usize>(
            w: *const u8,
            nb: usize,
            x: [Xrow; M],
            out: *mut f32,
        ) {
            let mut acc = [[fzero(); H]; M];
            let mut off = [[fzero(); H]; M];
            let (m3, m12) = (mask(3), mask(12));
            for b in 0..nb {
                let p = w.add(b * 1056);
                prefetch_span(p.wrapping_add(1056), 1056);
                for h in 0..H {
                    let mut dsum = [fzero(); M];
                    for half in 0..2 {
                        for s in 0..4 {
                            let mut a = [Acc::new(); M];
                            for g in 8 * half..8 * half + 8 {
                                let v = ld(p.add(32 + 64 * g + HB * h));
                                let v = if s < 2 { v } else { srli16::<4>(v) };
                                let q = and(v, if s % 2 == 0 { m3 } else { m12 });
                                let o = 256 * b + 128 * half + 32 * s + 4 * (g % 8);
                                for i in 0..M {
                                    let (xh, xl) = xw::<LO>(x[i], o);
                                    dot4::<LO>(&mut a[i], q, xh, xl);
                                    if g % 4 == 3 {
                                        settle::<LO>(&mut a[i]);
                                    }
                                }
                            }
                            let blk = 8 * b + 4 * half + s;
                            finish::<LO, M>(&mut a, &x, blk, s % 2 == 1, &mut dsum);
                        }
                    }
                    let d = f16(p.add(HB / 2 * h));
                    end_block(&mut acc, &mut off, h, d, &dsum, &x, b);
                }
            }
            store_ternary(&acc, &off, out);
        }

        /// A ternary group's 16 rows against the `M` activation rows `x`
        /// into `out[16·i..16·i + 16]`.
        #[target_feature(enable = $feat)]
        unsafe fn ternary<const M: usize>(
            dtype: DType,
            w: *const u8,
            blocks: usize,
            x: &[Xrow],
            lo: bool,
            out: *mut f32,
        ) {
            let x: [Xrow; M] = core::array::from_fn(|i| x[i]);
            match (dtype, lo) {
                (DType::TQ1_0, true) => tq1_0::<true, M>(w, blocks, x, out),
                (DType::TQ1_0, false) => tq1_0::<false, M>(w, blocks, x, out),
                (DType::TQ2_0, true) => tq2_0::<true, M>(w, blocks, x, out),
                _ => tq2_0::<false, M>(w, blocks, x, out),
            }
        }

        /// The 16 rows of one repacked group at `w` (`blocks` blocks of
        /// `dtype` per row) dotted with the 1 to 4 activation rows `x` into
        /// `out[16·i..16·i + 16]` for row `i`; `lo`: 16-bit activations (hi
        /// and lo bytes). The ternary kernels decode once for all rows.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn group_rows(
            dtype: DType,
            w: *const u8,
            blocks: usize,
            x: &[Xrow],
            lo: bool,
            out: *mut f32,
        ) {
            match (dtype, x.len()) {
                (DType::TQ1_0 | DType::TQ2_0, 1) => ternary::<1>(dtype, w, blocks, x, lo, out),
                (DType::TQ1_0 | DType::TQ2_0, 2) => ternary::<2>(dtype, w, blocks, x, lo, out),
                (DType::TQ1_0 | DType::TQ2_0, 3) => ternary::<3>(dtype, w, blocks, x, lo, out),
                (DType::TQ1_0 | DType::TQ2_0, _) => ternary::<4>(dtype, w, blocks, x, lo, out),
                _ => {
                    for (i, &xr) in x.iter().enumerate() {
                        group(dtype, w, blocks, xr, lo, out.add(16 * i));
                    }
                }
            }
        }

        /// [`group_rows`] for one activation row and the types that take
        /// one at a time.
        #[target_feature(enable = $feat)]
        unsafe fn group(
            dtype: DType,
            w: *const u8,
            blocks: usize,
            x: Xrow,
            lo: bool,
            out: *mut f32,
        ) {
            match (dtype, lo) {
                (DType::Q4_0, true) => q4::<true, false>(w, blocks, x, out),
                (DType::Q4_0, false) => q4::<false, false>(w, blocks, x, out),
                (DType::Q4_1, true) => q4::<true, true>(w, blocks, x, out),
                (DType::Q4_1, false) => q4::<false, true>(w, blocks, x, out),
                (DType::Q4K, true) => q4_k::<true>(w, blocks, x, out),
                (DType::Q4K, false) => q4_k::<false>(w, blocks, x, out),
                (DType::Q6K, true) => q6_k::<true>(w, blocks, x, out),
                (DType::Q6K, false) => q6_k::<false>(w, blocks, x, out),
                // Rows without `cpu.repack` never come here (`repack::packs`).
                _ => unreachable!("no repacked kernel for this type"),
            }
        }
    };
}

pub(crate) mod vnni {
    packed_kernels!("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c");

    const L: usize = 16;
    type V = __m512i;
    type F = __m512;

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ld(p: *const u8) -> V {
        _mm512_loadu_si512(p as *const _)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn splat8(v: i8) -> V {
        _mm512_set1_epi8(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn isplat(v: i32) -> V {
        _mm512_set1_epi32(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn and(a: V, b: V) -> V {
        _mm512_and_si512(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sub32(a: V, b: V) -> V {
        _mm512_sub_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn srai32<const N: u32>(v: V) -> V {
        _mm512_srai_epi32::<N>(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn add8(a: V, b: V) -> V {
        _mm512_add_epi8(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn subs8u(a: V, b: V) -> V {
        _mm512_subs_epu8(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn avg8(a: V, b: V) -> V {
        _mm512_avg_epu8(a, b)
    }
    /// `(a & m) | b` in one instruction.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn merge(a: V, b: V, m: V) -> V {
        _mm512_ternarylogic_epi32::<0xEC>(a, b, m)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn srli16<const N: u32>(v: V) -> V {
        _mm512_srli_epi16::<N>(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn slli16<const N: u32>(v: V) -> V {
        _mm512_slli_epi16::<N>(v)
    }

    /// Exact `Σ w·x` per lane as two byte dots: `hi` (signed) against the
    /// unsigned weights, and `lo` (unsigned) against the weights as signed
    /// bytes (all at most 63).
    #[derive(Clone, Copy)]
    struct Acc(V, V);
    impl Acc {
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn new() -> Acc {
            Acc(_mm512_setzero_si512(), _mm512_setzero_si512())
        }
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn dot<const LO: bool>(a: &mut Acc, w: V, xh: *const i8, xl: *const u8) {
        a.0 = _mm512_dpbusd_epi32(a.0, w, xword(xh as *const u8));
        if LO {
            a.1 = _mm512_dpbusd_epi32(a.1, xword(xl), w);
        }
    }
    /// [`dot`] for 4-bit weights, activation words broadcast ([`xword`]);
    /// VNNI sums into i32 directly.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn dot4<const LO: bool>(a: &mut Acc, w: V, xh: V, xl: V) {
        a.0 = _mm512_dpbusd_epi32(a.0, w, xh);
        if LO {
            a.1 = _mm512_dpbusd_epi32(a.1, xl, w);
        }
    }
    /// The activation word at `p` in every lane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn xword(p: *const u8) -> V {
        _mm512_set1_epi32(core::ptr::read_unaligned(p as *const i32))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn settle<const LO: bool>(_: &mut Acc) {}
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn total<const LO: bool>(a: Acc) -> V {
        if LO {
            _mm512_add_epi32(_mm512_slli_epi32::<8>(a.0), a.1)
        } else {
            a.0
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn fzero() -> F {
        _mm512_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn fsplat(v: f32) -> F {
        _mm512_set1_ps(v)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn cvt(v: V) -> F {
        _mm512_cvtepi32_ps(v)
    }
    /// 16 little-endian f16 at `p`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn f16(p: *const u8) -> F {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn mul(a: F, b: F) -> F {
        _mm512_mul_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn fmadd(a: F, b: F, c: F) -> F {
        _mm512_fmadd_ps(a, b, c)
    }
    /// `c − a·b`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn fnmadd(a: F, b: F, c: F) -> F {
        _mm512_fnmadd_ps(a, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn fsub(a: F, b: F) -> F {
        _mm512_sub_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store(p: *mut f32, v: F) {
        _mm512_storeu_ps(p, v)
    }
    /// This half's bytes of a 16-byte plane.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn bytes(p: *const u8) -> __m128i {
        _mm_loadu_si128(p as *const __m128i)
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn u8f(v: __m128i) -> F {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
    }
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn i8f(v: __m128i) -> F {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
    }
}

pub(crate) mod avx2 {
    packed_kernels!("avx2,fma,f16c");

    const L: usize = 8;
    type V = __m256i;
    type F = __m256;

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn ld(p: *const u8) -> V {
        _mm256_loadu_si256(p as *const V)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn splat8(v: i8) -> V {
        _mm256_set1_epi8(v)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn isplat(v: i32) -> V {
        _mm256_set1_epi32(v)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn and(a: V, b: V) -> V {
        _mm256_and_si256(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn sub32(a: V, b: V) -> V {
        _mm256_sub_epi32(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn srai32<const N: i32>(v: V) -> V {
        _mm256_srai_epi32::<N>(v)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn add8(a: V, b: V) -> V {
        _mm256_add_epi8(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn subs8u(a: V, b: V) -> V {
        _mm256_subs_epu8(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn avg8(a: V, b: V) -> V {
        _mm256_avg_epu8(a, b)
    }
    /// `(a & m) | b`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn merge(a: V, b: V, m: V) -> V {
        _mm256_or_si256(_mm256_and_si256(a, m), b)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn srli16<const N: i32>(v: V) -> V {
        _mm256_srli_epi16::<N>(v)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn slli16<const N: i32>(v: V) -> V {
        _mm256_slli_epi16::<N>(v)
    }

    /// Exact `Σ w·x` per lane: `vpmaddubsw` pairs (at most 2·63·128 for
    /// `hi`, 2·255·63 for `lo`: no saturation), widened by `vpmaddwd` with
    /// 256 (`hi`) and 1 (`lo`) into one i32 sum. 4-bit weights ([`dot4`])
    /// first add up to four pairs in i16 (at most 4·2·15·255 = 30,600),
    /// widened by [`settle`].
    #[derive(Clone, Copy)]
    struct Acc(V, V, V);
    impl Acc {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn new() -> Acc {
            let z = _mm256_setzero_si256();
            Acc(z, z, z)
        }
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot<const LO: bool>(a: &mut Acc, w: V, xh: *const i8, xl: *const u8) {
        let h = _mm256_maddubs_epi16(w, xword(xh as *const u8));
        if LO {
            let l = _mm256_maddubs_epi16(xword(xl), w);
            let s = _mm256_add_epi32(
                _mm256_madd_epi16(h, _mm256_set1_epi16(256)),
                _mm256_madd_epi16(l, _mm256_set1_epi16(1)),
            );
            a.0 = _mm256_add_epi32(a.0, s);
        } else {
            a.0 = _mm256_add_epi32(a.0, _mm256_madd_epi16(h, _mm256_set1_epi16(1)));
        }
    }
    /// [`dot`] for weights below 16 (activation words broadcast by
    /// [`xword`]), kept in i16 until [`settle`] (at most four calls apart).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot4<const LO: bool>(a: &mut Acc, w: V, xh: V, xl: V) {
        a.1 = _mm256_add_epi16(a.1, _mm256_maddubs_epi16(w, xh));
        if LO {
            a.2 = _mm256_add_epi16(a.2, _mm256_maddubs_epi16(xl, w));
        }
    }
    /// The activation word at `p` in every lane.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn xword(p: *const u8) -> V {
        _mm256_set1_epi32(core::ptr::read_unaligned(p as *const i32))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn settle<const LO: bool>(a: &mut Acc) {
        let hs = if LO { 256 } else { 1 };
        let mut s = _mm256_madd_epi16(a.1, _mm256_set1_epi16(hs));
        if LO {
            s = _mm256_add_epi32(s, _mm256_madd_epi16(a.2, _mm256_set1_epi16(1)));
        }
        a.0 = _mm256_add_epi32(a.0, s);
        a.1 = _mm256_setzero_si256();
        a.2 = _mm256_setzero_si256();
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn total<const LO: bool>(a: Acc) -> V {
        a.0
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn fzero() -> F {
        _mm256_setzero_ps()
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn fsplat(v: f32) -> F {
        _mm256_set1_ps(v)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn cvt(v: V) -> F {
        _mm256_cvtepi32_ps(v)
    }
    /// 8 little-endian f16 at `p`.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16(p: *const u8) -> F {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn mul(a: F, b: F) -> F {
        _mm256_mul_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fmadd(a: F, b: F, c: F) -> F {
        _mm256_fmadd_ps(a, b, c)
    }
    /// `c − a·b`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fnmadd(a: F, b: F, c: F) -> F {
        _mm256_fnmadd_ps(a, b, c)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn fsub(a: F, b: F) -> F {
        _mm256_sub_ps(a, b)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store(p: *mut f32, v: F) {
        _mm256_storeu_ps(p, v)
    }
    /// This half's 8 bytes of a 16-byte plane.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn bytes(p: *const u8) -> __m128i {
        _mm_loadl_epi64(p as *const __m128i)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn u8f(v: __m128i) -> F {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn i8f(v: __m128i) -> F {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
    }
}
