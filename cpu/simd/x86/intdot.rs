//! Integer-dot decode kernels: Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K /
//! Q6_K / TQ1_0 / TQ2_0 weight rows against activations quantized per 32-value block to 16 or
//! 8 bits ([`ActRows`]).
//! Per block the products are summed exactly in i32, then scaled in f32 as
//! `cpu::act::dot_row` does. Two instances: AVX2 (`vpmaddwd`,
//! `vpmaddubsw`) and AVX-512 VNNI (`vpdpwssd`, `vpdpbusd`). Also the
//! prefill GEMM's panel packers and tiles, 16-bit and 8-bit.

use crate::cpu::act::ActRows;
use crate::dtype::DType;

/// Weight types as const parameters, so each kernel is branch-free.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;
const Q4_K: u8 = 3;
const Q5_0: u8 = 4;
const Q5_1: u8 = 5;
const Q5_K: u8 = 6;
const Q6_K: u8 = 7;
const TQ1_0: u8 = 8;
const TQ2_0: u8 = 9;

macro_rules! intdot_kernels {
    ($feat:literal) => {
        use super::*;
        use core::arch::x86_64::*;

        /// A block's exact integer sum for one activation width (the
        /// instance's `sum_i16` / `sum_i8`), chosen statically so it inlines.
        /// `q6_sum`: Q6_K's signed values (`q − 32`), the first 16 scaled
        /// by `sa`, the last 16 by `sb`.
        pub(crate) trait BlockSum: Copy {
            unsafe fn block_sum<const D: u8>(w: __m256i, x: *const Self) -> __m256i;
            /// `acc` plus [`BlockSum::block_sum`] (one `vpdpbusd` with VNNI).
            unsafe fn block_acc<const D: u8>(acc: __m256i, w: __m256i, x: *const Self) -> __m256i;
            unsafe fn q6_sum(q: __m256i, sa: i16, sb: i16, x: *const Self) -> __m256i;
            /// Q6_K's rows (see [`dot_rows`]): the instance's whole-row kernel
            /// where it has one.
            unsafe fn q6_rows(w: &[u8], row_bytes: usize, x: &ActRows<Self>, out: &mut [f32]);
        }
        impl BlockSum for i16 {
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn block_sum<const D: u8>(w: __m256i, x: *const i16) -> __m256i {
                sum_i16::<D>(w, x)
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn block_acc<const D: u8>(acc: __m256i, w: __m256i, x: *const i16) -> __m256i {
                _mm256_add_epi32(acc, sum_i16::<D>(w, x))
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn q6_sum(q: __m256i, sa: i16, sb: i16, x: *const i16) -> __m256i {
                q6_sum_i16(q, sa, sb, x)
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn q6_rows(w: &[u8], row_bytes: usize, x: &ActRows<i16>, out: &mut [f32]) {
                q6_rows_i16(w, row_bytes, x, out)
            }
        }
        impl BlockSum for i8 {
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn block_sum<const D: u8>(w: __m256i, x: *const i8) -> __m256i {
                sum_i8::<D>(_mm256_setzero_si256(), w, x)
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn block_acc<const D: u8>(acc: __m256i, w: __m256i, x: *const i8) -> __m256i {
                sum_i8::<D>(acc, w, x)
            }
            /// |q| × (x with q's sign) in `vpmaddubsw` (pairs at most
            /// 2 · 32 · 127), then the scales in `vpmaddwd`'s i16 operand.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn q6_sum(q: __m256i, sa: i16, sb: i16, x: *const i8) -> __m256i {
                let x = _mm256_loadu_si256(x as *const __m256i);
                let p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
                _mm256_madd_epi16(p, _mm256_set_m128i(_mm_set1_epi16(sb), _mm_set1_epi16(sa)))
            }
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn q6_rows(w: &[u8], row_bytes: usize, x: &ActRows<i8>, out: &mut [f32]) {
                dot_rows::<i8, Q6_K>(w, row_bytes, x, out)
            }
        }

        /// Byte `j` is 0x10 when bit `j` of `bits` is set (ggml's
        /// `bytes_from_bits_32`): the 5th bits of Q5_0 / Q5_1.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn bit4s(bits: u32) -> __m256i {
            let spread = _mm256_shuffle_epi8(
                _mm256_set1_epi32(bits as i32),
                _mm256_set_epi64x(
                    0x0303030303030303,
                    0x0202020202020202,
                    0x0101010101010101,
                    0,
                ),
            );
            let set = _mm256_cmpeq_epi8(
                _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                _mm256_set1_epi64x(-1),
            );
            _mm256_and_si256(set, _mm256_set1_epi8(0x10))
        }

        /// 32 bytes at `p` shifted right by `n` bits per 16-bit lane (the
        /// caller masks what crossed from the neighbouring byte).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn load_shr(p: *const u8, n: usize) -> __m256i {
            _mm256_srl_epi16(
                _mm256_loadu_si256(p as *const __m256i),
                _mm_cvtsi32_si128(n as i32),
            )
        }

        /// 16 bytes of packed 4-bit values as 32 bytes: low nibbles first
        /// (values 0..16), then high nibbles (16..32), ggml's order.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn nibbles(p: *const u8) -> __m256i {
            let raw = _mm_loadu_si128(p as *const __m128i);
            let m4 = _mm_set1_epi8(0x0F);
            _mm256_set_m128i(
                _mm_and_si128(_mm_srli_epi16(raw, 4), m4),
                _mm_and_si128(raw, m4),
            )
        }

        /// Each byte times 3 (8-bit wrapping).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn times3(v: __m256i) -> __m256i {
            _mm256_add_epi8(v, _mm256_add_epi8(v, v))
        }

        /// Each byte times 9 (8-bit wrapping): `8v` per byte is a 16-bit
        /// shift with the bits crossing from the byte below masked off.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn times9(v: __m256i) -> __m256i {
            let v8 = _mm256_and_si256(_mm256_slli_epi16(v, 3), _mm256_set1_epi8(-8));
            _mm256_add_epi8(v8, v)
        }

        /// Each byte times 3ⁿ (8-bit wrapping), `n` in 0..5.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn times_pow3(v: __m256i, n: usize) -> __m256i {
            match n {
                0 => v,
                1 => times3(v),
                2 => times9(v),
                3 => times9(times3(v)),
                _ => times9(times9(v)),
            }
        }

        /// TQ1_0's trit of each byte `v` already multiplied by 3ⁿ: `(3v) >> 8`,
        /// as `t + 1`, without a byte multiply (ggml's trick): with `u = v − 1`
        /// saturated, `avg(u, avg(u, 0))` has the top two bits of `3v / 4`
        /// for each of the 256 byte values.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn top_trit(v: __m256i) -> __m256i {
            let v = _mm256_subs_epu8(v, _mm256_set1_epi8(1));
            let v = _mm256_avg_epu8(v, _mm256_avg_epu8(v, _mm256_setzero_si256()));
            _mm256_and_si256(_mm256_srli_epi16(v, 6), _mm256_set1_epi8(3))
        }

        /// TQ1_0's 32 digits (`t + 1`) of block `s` (0..8) of the 256-value
        /// block at `p` (see `quants::ternary`): blocks 0..5 are trit `s` of
        /// bytes 0..32; 5 and 6 trits `2(s − 5)` and `2(s − 5) + 1` of bytes
        /// 32..48 in the low and high 16 values; 7 trit 4 of bytes 32..48,
        /// then trit `n` of the four `qh` bytes for values `16 + 4n..+4`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn tq1_0_digits(p: *const u8, s: usize) -> __m256i {
            let v = match s {
                0..5 => times_pow3(_mm256_loadu_si256(p as *const __m256i), s),
                5 | 6 => {
                    let h =
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(32) as *const __m128i));
                    let n = 2 * (s - 5);
                    _mm256_blend_epi32::<0xF0>(times_pow3(h, n), times_pow3(h, n + 1))
                }
                _ => {
                    let h = _mm256_castsi128_si256(_mm_loadu_si128(p.add(32) as *const __m128i));
                    let qh = _mm256_set1_epi32(core::ptr::read_unaligned(p.add(48) as *const i32));
                    // Dword 4 + n of `q` holds the qh bytes times 3ⁿ.
                    let q = _mm256_blend_epi32::<0x22>(qh, times3(qh));
                    let q = _mm256_blend_epi32::<0x44>(q, times9(qh));
                    let q = _mm256_blend_epi32::<0x88>(q, times9(times3(qh)));
                    _mm256_blend_epi32::<0x0F>(q, times_pow3(h, 4))
                }
            };
            top_trit(v)
        }

        /// All 8 digit blocks of [`tq1_0_digits`] at once, each power of 3
        /// one multiply by 3 from the one before.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn tq1_0_all_digits(p: *const u8) -> [__m256i; 8] {
            let mut v = _mm256_loadu_si256(p as *const __m256i);
            let h = _mm_loadu_si128(p.add(32) as *const __m128i);
            let mut hp = [_mm256_castsi128_si256(h); 5];
            for n in 1..5 {
                hp[n] = times3(hp[n - 1]);
            }
            let mut out = [_mm256_setzero_si256(); 8];
            for d in out.iter_mut().take(5) {
                *d = top_trit(v);
                v = times3(v);
            }
            let both =
                |a: __m256i, b: __m256i| _mm256_inserti128_si256::<1>(a, _mm256_castsi256_si128(b));
            out[5] = top_trit(both(hp[0], hp[1]));
            out[6] = top_trit(both(hp[2], hp[3]));
            let qh = _mm256_set1_epi32(core::ptr::read_unaligned(p.add(48) as *const i32));
            let q = _mm256_blend_epi32::<0x22>(qh, times3(qh));
            let q = _mm256_blend_epi32::<0x44>(q, times9(qh));
            let q = _mm256_blend_epi32::<0x88>(q, times9(times3(qh)));
            out[7] = top_trit(_mm256_blend_epi32::<0x0F>(q, hp[4]));
            out
        }

        /// The 32 weight values meeting activation block `b` of the row at
        /// `w`, as bytes (unsigned 0..16 for the 4-bit types, signed for
        /// Q8_0), and `[s, o]`: each value is `s·q + o` (see
        /// `act::block_weights`, which this matches).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn weights<const D: u8>(w: *const u8, b: usize) -> (__m256i, __m128) {
            let f16 = |bits: i32| _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
            let pair = |p: *const u8| f16(core::ptr::read_unaligned(p as *const i32));
            match D {
                // (q - 8) d: the -8 goes into the offset term.
                Q4_0 => {
                    let p = w.add(b * 18);
                    let d = f16(core::ptr::read_unaligned(p as *const u16) as i32);
                    (
                        nibbles(p.add(2)),
                        _mm_mul_ps(_mm_moveldup_ps(d), _mm_set_ps(0.0, 0.0, -8.0, 1.0)),
                    )
                }
                // q d + m: [d, m] converted together.
                Q4_1 => {
                    let p = w.add(b * 20);
                    (nibbles(p.add(4)), pair(p))
                }
                // (q - 16) d with the 5th bits of `qh`.
                Q5_0 => {
                    let p = w.add(b * 22);
                    let d = f16(core::ptr::read_unaligned(p as *const u16) as i32);
                    let qh = core::ptr::read_unaligned(p.add(2) as *const u32);
                    (
                        _mm256_or_si256(nibbles(p.add(6)), bit4s(qh)),
                        _mm_mul_ps(_mm_moveldup_ps(d), _mm_set_ps(0.0, 0.0, -16.0, 1.0)),
                    )
                }
                Q5_1 => {
                    let p = w.add(b * 24);
                    let qh = core::ptr::read_unaligned(p.add(4) as *const u32);
                    (_mm256_or_si256(nibbles(p.add(8)), bit4s(qh)), pair(p))
                }
                Q8_0 => {
                    let p = w.add(b * 34);
                    let d = f16(core::ptr::read_unaligned(p as *const u16) as i32);
                    (_mm256_loadu_si256(p.add(2) as *const __m256i), d)
                }
                // Ternary digits t + 1 (0..=2): d·(t + 1) − d, the −d into
                // the offset term, so the digits go through the unsigned
                // byte dots as the 4-bit types' do.
                TQ1_0 | TQ2_0 => {
                    let bytes = if D == TQ1_0 { 54 } else { 66 };
                    let p = w.add((b / 8) * bytes);
                    let s = b % 8;
                    let q = if D == TQ1_0 {
                        tq1_0_digits(p, s)
                    } else {
                        // Bit pair s % 4 of bytes 32·(s / 4)..+32.
                        let q = load_shr(p.add(32 * (s / 4)), 2 * (s % 4));
                        _mm256_and_si256(q, _mm256_set1_epi8(3))
                    };
                    (q, weights_scale::<D>(w, b))
                }
                // Sub-block s of a 256-value block: d·sc·q − dmin·m, the
                // low (even s) or high (odd s) nibbles of 32 bytes; Q5_K adds
                // bit s of each `qh` byte as the 5th bit.
                _ => {
                    let bytes = if D == Q5_K { 176 } else { 144 };
                    let p = w.add((b / 8) * bytes);
                    let s = b % 8;
                    let (sc, m) =
                        crate::quants::scale_min_k4(s, core::slice::from_raw_parts(p.add(4), 12));
                    let qs = if D == Q5_K { p.add(48) } else { p.add(16) };
                    let q = load_shr(qs.add(32 * (s / 2)), 4 * (s % 2));
                    let mut q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
                    if D == Q5_K {
                        let h = _mm256_slli_epi16(load_shr(p.add(16), s), 4);
                        q = _mm256_or_si256(q, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
                    }
                    (
                        q,
                        _mm_mul_ps(pair(p), _mm_set_ps(0.0, 0.0, -(m as f32), sc as f32)),
                    )
                }
            }
        }

        /// A ternary block's `[s, o]` for activation block `b` (see
        /// [`weights`]): `[d, −d]`, the digits being `t + 1`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn weights_scale<const D: u8>(w: *const u8, b: usize) -> __m128 {
            let bytes = if D == TQ1_0 { 54 } else { 66 };
            let p = w.add((b / 8) * bytes + bytes - 2);
            let d = _mm_cvtph_ps(_mm_cvtsi32_si128(
                core::ptr::read_unaligned(p as *const u16) as i32,
            ));
            _mm_mul_ps(_mm_moveldup_ps(d), _mm_set_ps(0.0, 0.0, -1.0, 1.0))
        }

        /// Q6_K's block `b` (see `act::block_weights`): the 32 values
        /// `q − 32` as signed bytes, the scales of their two 16-value
        /// sub-blocks, and `[d, 0]`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn weights_q6_k(w: *const u8, b: usize) -> (__m256i, i16, i16, __m128) {
            let p = w.add((b / 8) * 210);
            let (h, g) = ((b % 8) / 4, b % 4);
            let lo = load_shr(p.add(64 * h + 32 * (g % 2)), 4 * (g / 2));
            let lo = _mm256_and_si256(lo, _mm256_set1_epi8(0x0F));
            let hi = _mm256_slli_epi16(load_shr(p.add(128 + 32 * h), 2 * g), 4);
            let hi = _mm256_and_si256(hi, _mm256_set1_epi8(0x30));
            let q = _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
            let sc = p.add(192 + 8 * h + 2 * g) as *const i8;
            let d = _mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(
                p.add(208) as *const u16
            ) as i32));
            (
                q,
                *sc as i16,
                *sc.add(1) as i16,
                _mm_move_ss(_mm_setzero_ps(), d),
            )
        }

        /// Block `b` of the weight row `w` against row `i` of `x`: the scaled
        /// integer sum added to `acc`, the offset term to lane 1 of `off`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn step<T: BlockSum, const D: u8>(
            w: *const u8,
            x: &ActRows<T>,
            i: usize,
            b: usize,
            acc: &mut __m256,
            off: &mut __m128,
        ) {
            let xq = x.qs.as_ptr().add(i * x.k + 32 * b);
            let (s, dw) = if D == Q6_K {
                let (q, sa, sb, dw) = weights_q6_k(w, b);
                (T::q6_sum(q, sa, sb, xq), dw)
            } else {
                let (wq, dw) = weights::<D>(w, b);
                (T::block_sum::<D>(wq, xq), dw)
            };
            let dsx = _mm_castpd_ps(_mm_load_sd(
                x.ds.as_ptr().add(i * x.blocks() + b) as *const f64
            ));
            scale_into(s, dw, dsx, acc, off);
        }

        /// The integer sums `s` of a block scaled into `acc`, its offset
        /// term into lane 1 of `off`: [d_x, d_x Σq_x] (`dsx`) × [d_w, o]
        /// (`dw`) = [scale, offset term].
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn scale_into(
            s: __m256i,
            dw: __m128,
            dsx: __m128,
            acc: &mut __m256,
            off: &mut __m128,
        ) {
            let p = _mm_mul_ps(dw, dsx);
            *off = _mm_add_ps(*off, p);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcastss_ps(p), *acc);
        }

        /// [`step`] over the 8 sub-blocks of ternary block `b / 8` when `x`
        /// has one scale per row: their integer sums added before the one
        /// conversion and scaling (the ternary block has one `d` too).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn step256<T: BlockSum, const D: u8>(
            w: *const u8,
            x: &ActRows<T>,
            i: usize,
            b: usize,
            acc: &mut __m256,
            off: &mut __m128,
        ) {
            let xq = x.qs.as_ptr().add(i * x.k + 32 * b);
            let ds = x.ds.as_ptr().add(i * x.blocks() + b);
            let (mut s, mut dw) = (_mm256_setzero_si256(), _mm_setzero_ps());
            let sum_x = *x.sums256.as_ptr().add(i * (x.blocks() / 8) + b / 8);
            let tq1 = if D == TQ1_0 {
                tq1_0_all_digits(w.add((b / 8) * 54))
            } else {
                [_mm256_setzero_si256(); 8]
            };
            for j in 0..8 {
                let (wq, d) = if D == TQ1_0 {
                    (tq1[j], weights_scale::<D>(w, b))
                } else {
                    weights::<D>(w, b + j)
                };
                s = T::block_acc::<D>(s, wq, xq.add(32 * j));
                dw = d;
            }
            scale_into(s, dw, _mm_set_ps(0.0, 0.0, sum_x, (*ds)[0]), acc, off);
        }

        /// Dots of one weight row with the `M` rows of `x` into `out[..M]`.
        #[target_feature(enable = $feat)]
        unsafe fn dot_row<T: BlockSum, const D: u8, const M: usize>(
            w: *const u8,
            x: &ActRows<T>,
            out: *mut f32,
        ) {
            let nb = x.blocks();
            // Two accumulators per row (and two offset sums, lane 1 of
            // `off`) so consecutive blocks do not wait on each other's adds.
            let mut acc = [[_mm256_setzero_ps(); 2]; M];
            let mut off = [[_mm_setzero_ps(); 2]; M];
            let mut b = 0;
            if matches!(D, TQ1_0 | TQ2_0) && x.row_scale {
                while b + 16 <= nb {
                    for i in 0..M {
                        let ([a0, a1], [o0, o1]) = (&mut acc[i], &mut off[i]);
                        step256::<T, D>(w, x, i, b, a0, o0);
                        step256::<T, D>(w, x, i, b + 8, a1, o1);
                    }
                    b += 16;
                }
            }
            if matches!(D, Q4_K | Q5_K | Q6_K | TQ1_0 | TQ2_0) {
                // The 8 sub-blocks of each 256-value block spelled out: their
                // index is then a constant (shifts, scale unpacking and the
                // block's d fold or are shared across the 8).
                while b + 8 <= nb {
                    for i in 0..M {
                        let ([a0, a1], [o0, o1]) = (&mut acc[i], &mut off[i]);
                        step::<T, D>(w, x, i, b, a0, o0);
                        step::<T, D>(w, x, i, b + 1, a1, o1);
                        step::<T, D>(w, x, i, b + 2, a0, o0);
                        step::<T, D>(w, x, i, b + 3, a1, o1);
                        step::<T, D>(w, x, i, b + 4, a0, o0);
                        step::<T, D>(w, x, i, b + 5, a1, o1);
                        step::<T, D>(w, x, i, b + 6, a0, o0);
                        step::<T, D>(w, x, i, b + 7, a1, o1);
                    }
                    b += 8;
                }
            }
            while b + 2 <= nb {
                for i in 0..M {
                    let ([a0, a1], [o0, o1]) = (&mut acc[i], &mut off[i]);
                    step::<T, D>(w, x, i, b, a0, o0);
                    step::<T, D>(w, x, i, b + 1, a1, o1);
                }
                b += 2;
            }
            if b < nb {
                for i in 0..M {
                    step::<T, D>(w, x, i, b, &mut acc[i][0], &mut off[i][0]);
                }
            }
            for i in 0..M {
                let v = _mm256_add_ps(acc[i][0], acc[i][1]);
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_movehdup_ps(s));
                let o = _mm_add_ps(off[i][0], off[i][1]);
                *out.add(i) = _mm_cvtss_f32(s) + _mm_cvtss_f32(_mm_movehdup_ps(o));
            }
        }

        /// Every row of `w` with the kernel of weight type `D`.
        #[target_feature(enable = $feat)]
        unsafe fn dot_rows<T: BlockSum, const D: u8>(
            w: &[u8],
            row_bytes: usize,
            x: &ActRows<T>,
            out: &mut [f32],
        ) {
            for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                let (wr, o) = (row.as_ptr(), out.as_mut_ptr().add(r * x.m));
                match x.m {
                    1 => dot_row::<T, D, 1>(wr, x, o),
                    2 => dot_row::<T, D, 2>(wr, x, o),
                    3 => dot_row::<T, D, 3>(wr, x, o),
                    _ => dot_row::<T, D, 4>(wr, x, o),
                }
            }
        }

        /// The `rows` (at most `NR`) weight rows at `w` (`row_bytes` apart,
        /// `nb` 32-value blocks each) as the integer GEMM panel: `pw`
        /// `[nb · 16][NR]` pairs of 16-bit values (as `act::pack_rows` pairs
        /// activations), `ps` / `po` `[groups][NR]` each scale group's `s`
        /// and `o` (the values are `s·q + o`, see `act::block_weights`).
        /// Groups are whole blocks, except Q6_K's 16-value halves: its
        /// scales go into the integers (|sc·(q − 32)| <= 4096), and 16 such
        /// products with 16-bit activations are the most an i32 lane holds.
        #[target_feature(enable = $feat)]
        unsafe fn pack_panel<const D: u8, const NR: usize>(
            w: *const u8,
            row_bytes: usize,
            rows: usize,
            nb: usize,
            pw: *mut i32,
            ps: *mut f32,
            po: *mut f32,
        ) {
            let mut pairs = [0i32; 16];
            for j in 0..rows {
                let wr = w.add(j * row_bytes);
                for b in 0..nb {
                    let (lo, hi) = if D == Q6_K {
                        let (q, sa, sb, dw) = weights_q6_k(wr, b);
                        let d = _mm_cvtss_f32(dw);
                        for t in [2 * b, 2 * b + 1] {
                            *ps.add(t * NR + j) = d;
                            *po.add(t * NR + j) = 0.0;
                        }
                        (
                            _mm256_mullo_epi16(
                                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)),
                                _mm256_set1_epi16(sa),
                            ),
                            _mm256_mullo_epi16(
                                _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(q)),
                                _mm256_set1_epi16(sb),
                            ),
                        )
                    } else {
                        let (q, so) = weights::<D>(wr, b);
                        *ps.add(b * NR + j) = _mm_cvtss_f32(so);
                        *po.add(b * NR + j) = _mm_cvtss_f32(_mm_movehdup_ps(so));
                        let (l, h) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q));
                        if D == Q8_0 {
                            (_mm256_cvtepi8_epi16(l), _mm256_cvtepi8_epi16(h))
                        } else {
                            (_mm256_cvtepu8_epi16(l), _mm256_cvtepu8_epi16(h))
                        }
                    };
                    _mm256_storeu_si256(pairs.as_mut_ptr() as *mut __m256i, lo);
                    _mm256_storeu_si256(pairs.as_mut_ptr().add(8) as *mut __m256i, hi);
                    for (p, v) in pairs.iter().enumerate() {
                        *pw.add((16 * b + p) * NR + j) = *v;
                    }
                }
            }
        }

        /// [`pack_panel`] for `dtype` (one of `act::supports`); returns the
        /// pairs per scale group (16, or 8 for Q6_K).
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn pack_panel_typed<const NR: usize>(
            dtype: DType,
            w: *const u8,
            row_bytes: usize,
            rows: usize,
            nb: usize,
            pw: *mut i32,
            ps: *mut f32,
            po: *mut f32,
        ) -> usize {
            let a = (w, row_bytes, rows, nb, pw, ps, po);
            match dtype {
                DType::Q4_0 => pack_panel::<Q4_0, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6),
                DType::Q4_1 => pack_panel::<Q4_1, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6),
                DType::Q5_0 => pack_panel::<Q5_0, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6),
                DType::Q5_1 => pack_panel::<Q5_1, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6),
                DType::Q4K => pack_panel::<Q4_K, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6),
                DType::Q5K => pack_panel::<Q5_K, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6),
                DType::Q6K => {
                    pack_panel::<Q6_K, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6);
                    return 8;
                }
                DType::Q8_0 => pack_panel::<Q8_0, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6),
                DType::TQ1_0 => pack_panel::<TQ1_0, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6),
                DType::TQ2_0 => pack_panel::<TQ2_0, NR>(a.0, a.1, a.2, a.3, a.4, a.5, a.6),
                // Rows without `cpu.int_dot` never come here (`act::supports`).
                _ => unreachable!("no integer-dot kernel for this type"),
            }
            16
        }

        /// The `rows` (at most 16) weight rows at `w` as the 8-bit integer
        /// GEMM panel: `pw` `[nb · 8][16]` quads of unsigned digits (4
        /// consecutive values of one row in an i32, the rows interleaved:
        /// one `vpdpbusd` operand per quad), `ps` / `po` `[k / span][16]`
        /// each `span`-value group's `s` and `o`, the values being `s·u + o`
        /// for the digits `u`. Signed types go as unsigned digits with the
        /// shift in `o`: Q8_0 `q + 128`, Q6_K `q` (0..64) per 16-value
        /// group, `o = −32·s`. `span` is 16 for Q6_K, else 32, or 256 for
        /// the ternary types (one `d` per 256 values) against activations
        /// with one scale per row.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn pack_panel8<const D: u8>(
            w: *const u8,
            row_bytes: usize,
            rows: usize,
            nb: usize,
            span: usize,
            pw: *mut i32,
            ps: *mut f32,
            po: *mut f32,
        ) {
            // Up to 8 blocks of every row decoded, then each block's 16
            // rows transposed in registers (scattering the quads one by one
            // cost more than the tile's products). Rows past `rows` stay 0.
            let mut digits = [[_mm256_setzero_si256(); 16]; 8];
            let mut tq1 = [_mm256_setzero_si256(); 8];
            for b0 in (0..nb).step_by(8) {
                let bn = (nb - b0).min(8);
                for j in 0..rows {
                    let wr = w.add(j * row_bytes);
                    for (c, dj) in digits.iter_mut().take(bn).enumerate() {
                        let b = b0 + c;
                        dj[j] = if D == Q6_K {
                            let (q, sa, sb, dw) = weights_q6_k(wr, b);
                            let d = _mm_cvtss_f32(dw);
                            for (t, sc) in [(2 * b, sa), (2 * b + 1, sb)] {
                                let s = d * sc as f32;
                                *ps.add(t * 16 + j) = s;
                                *po.add(t * 16 + j) = -32.0 * s;
                            }
                            _mm256_add_epi8(q, _mm256_set1_epi8(32))
                        } else {
                            let (q, so) = if D == TQ1_0 {
                                // All 8 digit blocks of a 256-value block at once.
                                if c == 0 {
                                    tq1 = tq1_0_all_digits(wr.add((b / 8) * 54));
                                }
                                (tq1[c], weights_scale::<D>(wr, b))
                            } else {
                                weights::<D>(wr, b)
                            };
                            let (s, o) = (_mm_cvtss_f32(so), _mm_cvtss_f32(_mm_movehdup_ps(so)));
                            let t = b * 32 / span;
                            *ps.add(t * 16 + j) = s;
                            if D == Q8_0 {
                                *po.add(t * 16 + j) = -128.0 * s;
                                _mm256_xor_si256(q, _mm256_set1_epi8(-128))
                            } else {
                                *po.add(t * 16 + j) = o;
                                q
                            }
                        };
                    }
                }
                for (c, dj) in digits.iter().take(bn).enumerate() {
                    let out = pw.add(8 * (b0 + c) * 16);
                    transpose_quads(&dj[..8], out);
                    transpose_quads(&dj[8..], out.add(8));
                }
            }
        }

        /// 8 rows' quads (`r[j]` lane `p`: row `j`'s quad `p`) transposed:
        /// quad `p` of the 8 rows to `out + 16·p`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn transpose_quads(r: &[__m256i], out: *mut i32) {
            let lo32 = |a, b| _mm256_unpacklo_epi32(a, b);
            let hi32 = |a, b| _mm256_unpackhi_epi32(a, b);
            let t = [
                lo32(r[0], r[1]),
                hi32(r[0], r[1]),
                lo32(r[2], r[3]),
                hi32(r[2], r[3]),
                lo32(r[4], r[5]),
                hi32(r[4], r[5]),
                lo32(r[6], r[7]),
                hi32(r[6], r[7]),
            ];
            // u[p] (u[4 + p]): rows 0..4 (4..8), quad p in the low half,
            // quad 4 + p in the high.
            let mut u = [_mm256_setzero_si256(); 8];
            for h in [0, 4] {
                u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
                u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
                u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
                u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
            }
            for p in 0..4 {
                let (lo, hi) = (
                    _mm256_permute2x128_si256::<0x20>(u[p], u[p + 4]),
                    _mm256_permute2x128_si256::<0x31>(u[p], u[p + 4]),
                );
                _mm256_storeu_si256(out.add(16 * p) as *mut __m256i, lo);
                _mm256_storeu_si256(out.add(16 * (p + 4)) as *mut __m256i, hi);
            }
        }

        /// [`pack_panel8`] for `dtype` (one of `act::supports`).
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn pack_panel8_typed(
            dtype: DType,
            w: *const u8,
            row_bytes: usize,
            rows: usize,
            nb: usize,
            span: usize,
            pw: *mut i32,
            ps: *mut f32,
            po: *mut f32,
        ) {
            let a = (w, row_bytes, rows, nb, span, pw, ps, po);
            match dtype {
                DType::Q4_0 => pack_panel8::<Q4_0>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                DType::Q4_1 => pack_panel8::<Q4_1>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                DType::Q5_0 => pack_panel8::<Q5_0>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                DType::Q5_1 => pack_panel8::<Q5_1>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                DType::Q4K => pack_panel8::<Q4_K>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                DType::Q5K => pack_panel8::<Q5_K>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                DType::Q6K => pack_panel8::<Q6_K>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                DType::Q8_0 => pack_panel8::<Q8_0>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                DType::TQ1_0 => pack_panel8::<TQ1_0>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                DType::TQ2_0 => pack_panel8::<TQ2_0>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),
                // Rows without `cpu.int_dot` never come here (`act::supports`).
                _ => unreachable!("no integer-dot kernel for this type"),
            }
        }

        /// See `cpu::simd::dot_rows_int`: the kernel of `dtype` for
        /// activations of width `T` (i16 or i8).
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot_rows_typed<T: BlockSum>(
            dtype: DType,
            w: &[u8],
            row_bytes: usize,
            x: &ActRows<T>,
            out: &mut [f32],
        ) {
            match dtype {
                DType::Q4_0 => dot_rows::<T, Q4_0>(w, row_bytes, x, out),
                DType::Q4_1 => dot_rows::<T, Q4_1>(w, row_bytes, x, out),
                DType::Q5_0 => dot_rows::<T, Q5_0>(w, row_bytes, x, out),
                DType::Q5_1 => dot_rows::<T, Q5_1>(w, row_bytes, x, out),
                DType::Q4K => dot_rows::<T, Q4_K>(w, row_bytes, x, out),
                DType::Q5K => dot_rows::<T, Q5_K>(w, row_bytes, x, out),
                DType::Q6K => T::q6_rows(w, row_bytes, x, out),
                DType::Q8_0 => dot_rows::<T, Q8_0>(w, row_bytes, x, out),
                DType::TQ1_0 => dot_rows::<T, TQ1_0>(w, row_bytes, x, out),
                DType::TQ2_0 => dot_rows::<T, TQ2_0>(w, row_bytes, x, out),
                // Rows without `cpu.int_dot` never come here (`act::supports`).
                _ => unreachable!("no integer-dot kernel for this type"),
            }
        }
    };
}

pub(crate) mod avx2 {
    intdot_kernels!("avx2,fma,f16c");

    /// Σ w·x over a block with 16-bit activations, as 8 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn sum_i16<const D: u8>(w: __m256i, x: *const i16) -> __m256i {
        let (lo, hi) = (_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
        let (lo, hi) = if D == Q8_0 {
            (_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi))
        } else {
            (_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi))
        };
        let x0 = _mm256_loadu_si256(x as *const __m256i);
        let x1 = _mm256_loadu_si256(x.add(16) as *const __m256i);
        _mm256_add_epi32(_mm256_madd_epi16(lo, x0), _mm256_madd_epi16(hi, x1))
    }

    /// Q6_K's block with 16-bit activations: the scales multiplied into the
    /// widened values (|sc·(q − 32)| <= 4096, so each i32 lane's four
    /// products stay below 2^31).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q6_sum_i16(q: __m256i, sa: i16, sb: i16, x: *const i16) -> __m256i {
        let lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
        let hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(q));
        let lo = _mm256_mullo_epi16(lo, _mm256_set1_epi16(sa));
        let hi = _mm256_mullo_epi16(hi, _mm256_set1_epi16(sb));
        let x0 = _mm256_loadu_si256(x as *const __m256i);
        let x1 = _mm256_loadu_si256(x.add(16) as *const __m256i);
        _mm256_add_epi32(_mm256_madd_epi16(lo, x0), _mm256_madd_epi16(hi, x1))
    }

    /// Q6_K rows with 16-bit activations: the per-block kernel.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q6_rows_i16(w: &[u8], row_bytes: usize, x: &ActRows<i16>, out: &mut [f32]) {
        dot_rows::<i16, Q6_K>(w, row_bytes, x, out)
    }

    /// Integer GEMM tile: activation rows, weight rows (one i32 lane each).
    pub(crate) const GEMM_TILE: (usize, usize) = (3, 16);

    /// `MR` packed activation rows (`act::pack_rows`: pairs `xq`, scales
    /// `xd`) against a 16-row panel (`pack_panel`, `G` pairs per scale
    /// group, `groups` groups) into `out` (`[MR][16]`), in two 8-row
    /// halves. Per group the products of each (activation row, weight row)
    /// are summed exactly in one i32 lane (`vpmaddwd` pairs), then scaled
    /// into f32 as `step` does.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const MR: usize, const G: usize>(
        pw: *const i32,
        ps: *const f32,
        po: *const f32,
        groups: usize,
        xq: *const i32,
        xd: *const f32,
        out: *mut f32,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for t in 0..groups {
            let mut sums = [[_mm256_setzero_si256(); 2]; MR];
            for p in t * G..(t + 1) * G {
                let w0 = _mm256_loadu_si256(pw.add(p * 16) as *const __m256i);
                let w1 = _mm256_loadu_si256(pw.add(p * 16 + 8) as *const __m256i);
                for (i, s) in sums.iter_mut().enumerate() {
                    let x = _mm256_set1_epi32(*xq.add(p * MR + i));
                    s[0] = _mm256_add_epi32(s[0], _mm256_madd_epi16(w0, x));
                    s[1] = _mm256_add_epi32(s[1], _mm256_madd_epi16(w1, x));
                }
            }
            scale_group(&mut acc, &sums, ps, po, t, xd.add(t * G / 16 * 2 * MR));
        }
        store_tile(&acc, out);
    }

    /// Group `t`'s exact sums of a tile scaled into `acc`: the weight rows'
    /// scales and offsets (`ps`, `po`) times the activation rows' `[d, d·Σq]`
    /// at `d` (all rows' `d`, then all rows' `d·Σq`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn scale_group<const MR: usize>(
        acc: &mut [[__m256; 2]; MR],
        sums: &[[__m256i; 2]; MR],
        ps: *const f32,
        po: *const f32,
        t: usize,
        d: *const f32,
    ) {
        for h in 0..2 {
            let (s, o) = (
                _mm256_loadu_ps(ps.add(t * 16 + 8 * h)),
                _mm256_loadu_ps(po.add(t * 16 + 8 * h)),
            );
            for (i, a) in acc.iter_mut().enumerate() {
                let scale = _mm256_mul_ps(s, _mm256_set1_ps(*d.add(i)));
                a[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[i][h]), scale, a[h]);
                a[h] = _mm256_fmadd_ps(o, _mm256_set1_ps(*d.add(MR + i)), a[h]);
            }
        }
    }

    /// A tile's `[MR][16]` results into `out`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn store_tile<const MR: usize>(acc: &[[__m256; 2]; MR], out: *mut f32) {
        for (i, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(i * 16), a[0]);
            _mm256_storeu_ps(out.add(i * 16 + 8), a[1]);
        }
    }

    /// [`tile`] with [`GEMM_TILE`]'s rows, `g` pairs per scale group (16 or 8).
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm_tile(
        g: usize,
        pw: *const i32,
        ps: *const f32,
        po: *const f32,
        groups: usize,
        xq: *const i32,
        xd: *const f32,
        out: *mut f32,
    ) {
        if g == 8 {
            tile::<3, 8>(pw, ps, po, groups, xq, xd, out)
        } else {
            tile::<3, 16>(pw, ps, po, groups, xq, xd, out)
        }
    }

    /// 8-bit integer GEMM tile: activation rows, weight rows.
    pub(crate) const GEMM8_TILE: (usize, usize) = (3, 16);

    /// `MR` activation rows packed by `act::pack_quads` (quads `xq`, scales
    /// `xd`) against a 16-row `pack_panel8` panel (`G` quads per scale
    /// group, `groups` groups) into `out` (`[MR][16]`), in two 8-row
    /// halves. Two quads' `vpmaddubsw` pairs are added in i16 before
    /// `vpmaddwd` widens them: with digits at most 63 (the callers keep
    /// Q8_0 off this kernel) each pair is within ±2·63·128, two within
    /// i16. Then scaled as the 16-bit `tile` does.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile8<const MR: usize, const G: usize>(
        pw: *const i32,
        ps: *const f32,
        po: *const f32,
        groups: usize,
        xq: *const i32,
        xd: *const f32,
        out: *mut f32,
    ) {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for t in 0..groups {
            let mut sums = [[_mm256_setzero_si256(); 2]; MR];
            for p in (t * G..(t + 1) * G).step_by(2) {
                let w = |p: usize, h: usize| {
                    _mm256_loadu_si256(pw.add(p * 16 + 8 * h) as *const __m256i)
                };
                let (w00, w01, w10, w11) = (w(p, 0), w(p, 1), w(p + 1, 0), w(p + 1, 1));
                for (i, s) in sums.iter_mut().enumerate() {
                    let x0 = _mm256_set1_epi32(*xq.add(p * MR + i));
                    let x1 = _mm256_set1_epi32(*xq.add((p + 1) * MR + i));
                    let a = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w00, x0),
                        _mm256_maddubs_epi16(w10, x1),
                    );
                    let b = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w01, x0),
                        _mm256_maddubs_epi16(w11, x1),
                    );
                    s[0] = _mm256_add_epi32(s[0], _mm256_madd_epi16(a, ones));
                    s[1] = _mm256_add_epi32(s[1], _mm256_madd_epi16(b, ones));
                }
            }
            scale_group(&mut acc, &sums, ps, po, t, xd.add(t * 2 * MR));
        }
        store_tile(&acc, out);
    }

    /// [`tile8`] with [`GEMM8_TILE`]'s rows, `span` values per scale group.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm8_tile(
        span: usize,
        pw: *const i32,
        ps: *const f32,
        po: *const f32,
        groups: usize,
        xq: *const i32,
        xd: *const f32,
        out: *mut f32,
    ) {
        match span {
            16 => tile8::<3, 4>(pw, ps, po, groups, xq, xd, out),
            32 => tile8::<3, 8>(pw, ps, po, groups, xq, xd, out),
            _ => tile8::<3, 64>(pw, ps, po, groups, xq, xd, out),
        }
    }

    /// `acc` plus Σ w·x over a block with 8-bit activations, as 8 i32 lanes. Q8_0 goes
    /// as |w| × (x with w's sign), so `vpmaddubsw`'s i16 pair sums cannot
    /// saturate: at most 2 · 128 · 127 = 32,512.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn sum_i8<const D: u8>(acc: __m256i, w: __m256i, x: *const i8) -> __m256i {
        let x = _mm256_loadu_si256(x as *const __m256i);
        let (u, s) = if D == Q8_0 {
            (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
        } else {
            (w, x)
        };
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
        _mm256_add_epi32(acc, p)
    }
}

pub(crate) mod vnni {
    intdot_kernels!("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c");

    /// Σ w·x over a block with 16-bit activations: one `vpdpwssd` over all
    /// 32 values, folded to 8 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn sum_i16<const D: u8>(w: __m256i, x: *const i16) -> __m256i {
        let w = if D == Q8_0 {
            _mm512_cvtepi8_epi16(w)
        } else {
            _mm512_cvtepu8_epi16(w)
        };
        let s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(x as *const _));
        _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
    }

    /// Never called: [`q6_rows_i16`] takes every Q6_K row with 16-bit
    /// activations here.
    unsafe fn q6_sum_i16(_: __m256i, _: i16, _: i16, _: *const i16) -> __m256i {
        unreachable!("Q6_K with 16-bit activations goes through q6_rows_i16")
    }

    /// Q6_K rows with 16-bit activations, 64 values (two blocks) per
    /// 512-bit step; replaces the per-block kernel, whose scale `vpmullw`,
    /// 256-bit decode and per-block fold made it compute-bound.
    ///
    /// The values stay unsigned (0..64) and widen by `vpunpck{l,h}bw`
    /// (in-lane, no cross-lane widening): [`q6_prep_i16`] lays out the
    /// activations in that interleaved order once per call, with each i32
    /// lane's `−32 · Σx` as its accumulator's start, so `vpdpwssd` sums
    /// `(q − 32) · x` exactly (4 products a lane). The 16 sub-block scales
    /// go in f32 with `d`: every lane of a 64-value step is one 16-value
    /// sub-block of one activation block (lanes 0..8 the first, 8..16 the
    /// second).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
    pub(super) unsafe fn q6_rows_i16(
        w: &[u8],
        row_bytes: usize,
        x: &ActRows<i16>,
        out: &mut [f32],
    ) {
        let xp = q6_prep_i16(x);
        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
            let (wr, o) = (row.as_ptr(), out.as_mut_ptr().add(r * x.m));
            match x.m {
                1 => q6_row_i16::<1>(wr, x, &xp, o),
                2 => q6_row_i16::<2>(wr, x, &xp, o),
                3 => q6_row_i16::<3>(wr, x, &xp, o),
                _ => q6_row_i16::<4>(wr, x, &xp, o),
            }
        }
    }

    /// Per row of `x` and 64 values, 3 vectors: the activations meeting
    /// `vpunpcklbw` / `vpunpckhbw` of the 64 weight bytes (128-bit lane `l`
    /// holds values `16l..16l + 8` / `16l + 8..16l + 16`), and each i32
    /// lane's `−32 · Σx`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn q6_prep_i16(x: &ActRows<i16>) -> Vec<__m512i> {
        let groups = x.k / 64;
        let mut v = vec![_mm512_setzero_si512(); 3 * groups * x.m];
        let lo = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0);
        let hi = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);
        let m32 = _mm512_set1_epi16(-32);
        for i in 0..x.m {
            for g in 0..groups {
                let q = x.qs.as_ptr().add(i * x.k + 64 * g);
                let (a, b) = (
                    _mm512_loadu_si512(q as *const _),
                    _mm512_loadu_si512(q.add(32) as *const _),
                );
                let (xl, xh) = (
                    _mm512_permutex2var_epi64(a, lo, b),
                    _mm512_permutex2var_epi64(a, hi, b),
                );
                let off = _mm512_dpwssd_epi32(_mm512_setzero_si512(), m32, xl);
                let p = &mut v[3 * (i * groups + g)..];
                p[0] = xl;
                p[1] = xh;
                p[2] = _mm512_dpwssd_epi32(off, m32, xh);
            }
        }
        v
    }

    /// One Q6_K row against the `M` rows of `x` ([`q6_prep_i16`]'s `xp`)
    /// into `out[..M]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma,f16c")]
    unsafe fn q6_row_i16<const M: usize>(
        w: *const u8,
        x: &ActRows<i16>,
        xp: &[__m512i],
        out: *mut f32,
    ) {
        let (k, nb) = (x.k, x.blocks());
        // `[d, d·Σq]` of two blocks to the first `d` in lanes 0..8, the
        // second in 8..16.
        let dsel = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi32(2));
        let (m4, m30) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
        // Bits 2g..2g + 2 of `qh` to bits 4..6 for the groups g = 0, 1 (and
        // 2, 3), one per 256-bit half.
        let shl = _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2));
        let shr = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(2));
        // Lane 4l + u of 64-value step j is sub-block 4j + l.
        let idx: [__m512i; 4] = core::array::from_fn(|j| {
            let j = 4 * j as i32;
            _mm512_set_epi32(
                j + 3,
                j + 3,
                j + 3,
                j + 3,
                j + 2,
                j + 2,
                j + 2,
                j + 2,
                j + 1,
                j + 1,
                j + 1,
                j + 1,
                j,
                j,
                j,
                j,
            )
        });
        // Two accumulators per row, so consecutive steps' adds overlap.
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        for sb in 0..k / 256 {
            let p = w.add(sb * 210);
            let d = _mm_cvtph_ps(_mm_cvtsi32_si128(core::ptr::read_unaligned(
                p.add(208) as *const u16
            ) as i32));
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.add(192) as *const __m128i
            )));
            let sc = _mm512_mul_ps(sc, _mm512_broadcastss_ps(d));
            for h in 0..2 {
                let ql = _mm512_loadu_si512(p.add(64 * h) as *const _);
                let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    p.add(128 + 32 * h) as *const __m256i
                ));
                // (a & b) | c: the low nibbles with the two high bits.
                let q01 = _mm512_ternarylogic_epi32::<0xEA>(
                    ql,
                    m4,
                    _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30),
                );
                let q23 = _mm512_ternarylogic_epi32::<0xEA>(
                    _mm512_srli_epi16::<4>(ql),
                    m4,
                    _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30),
                );
                for (t, q) in [q01, q23].into_iter().enumerate() {
                    let j = 2 * h + t;
                    let lo = _mm512_unpacklo_epi8(q, _mm512_setzero_si512());
                    let hi = _mm512_unpackhi_epi8(q, _mm512_setzero_si512());
                    let s = _mm512_permutexvar_ps(idx[j], sc);
                    let g = 4 * sb + j;
                    for (i, a) in acc.iter_mut().enumerate() {
                        let xg = xp.as_ptr().add(3 * (i * (k / 64) + g));
                        let v = _mm512_dpwssd_epi32(*xg.add(2), lo, *xg);
                        let v = _mm512_dpwssd_epi32(v, hi, *xg.add(1));
                        let ds = x.ds.as_ptr().add(i * nb + 2 * g) as *const f32;
                        let dx =
                            _mm512_permutexvar_ps(dsel, _mm512_castps128_ps512(_mm_loadu_ps(ds)));
                        a[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(s, dx), a[t]);
                    }
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            *out.add(i) = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
        }
    }

    /// Integer GEMM tile: activation rows, weight rows (one i32 lane each).
    pub(crate) const GEMM_TILE: (usize, usize) = (8, 16);

    /// The AVX2 `tile` with 16 weight rows per `vpdpwssd` (16-bit pairs)
    /// or, `EIGHT`, per `vpdpbusd` (8-bit quads: 64 products, exact in
    /// i32, no saturation, so Q8_0's digits up to 255 too; `G` quads per
    /// scale group).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const MR: usize, const G: usize, const EIGHT: bool>(
        pw: *const i32,
        ps: *const f32,
        po: *const f32,
        groups: usize,
        xq: *const i32,
        xd: *const f32,
        out: *mut f32,
    ) {
        let mut acc = [_mm512_setzero_ps(); MR];
        for t in 0..groups {
            let mut sums = [_mm512_setzero_si512(); MR];
            for p in t * G..(t + 1) * G {
                let w = _mm512_loadu_si512(pw.add(p * 16) as *const _);
                for (i, s) in sums.iter_mut().enumerate() {
                    let x = _mm512_set1_epi32(*xq.add(p * MR + i));
                    *s = if EIGHT {
                        _mm512_dpbusd_epi32(*s, w, x)
                    } else {
                        _mm512_dpwssd_epi32(*s, w, x)
                    };
                }
            }
            let (s, o) = (
                _mm512_loadu_ps(ps.add(t * 16)),
                _mm512_loadu_ps(po.add(t * 16)),
            );
            // The activation block of group `t`: 16-bit tiles have `G / 16`
            // blocks a group (Q6_K half a block), 8-bit tiles one.
            let blk = if EIGHT { t } else { t * G / 16 };
            let d = xd.add(blk * 2 * MR);
            for (i, a) in acc.iter_mut().enumerate() {
                let scale = _mm512_mul_ps(s, _mm512_set1_ps(*d.add(i)));
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[i]), scale, *a);
                *a = _mm512_fmadd_ps(o, _mm512_set1_ps(*d.add(MR + i)), *a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(i * 16), *a);
        }
    }

    /// [`tile`] with [`GEMM_TILE`]'s rows, `g` pairs per scale group (16 or 8).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm_tile(
        g: usize,
        pw: *const i32,
        ps: *const f32,
        po: *const f32,
        groups: usize,
        xq: *const i32,
        xd: *const f32,
        out: *mut f32,
    ) {
        if g == 8 {
            tile::<8, 8, false>(pw, ps, po, groups, xq, xd, out)
        } else {
            tile::<8, 16, false>(pw, ps, po, groups, xq, xd, out)
        }
    }

    /// 8-bit integer GEMM tile: activation rows, weight rows.
    pub(crate) const GEMM8_TILE: (usize, usize) = (MR8, 16);

    /// Activation rows of the 8-bit tile.
    const MR8: usize = 8;

    /// The 8-bit [`tile`] with [`GEMM8_TILE`]'s rows, `span` values per
    /// scale group.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm8_tile(
        span: usize,
        pw: *const i32,
        ps: *const f32,
        po: *const f32,
        groups: usize,
        xq: *const i32,
        xd: *const f32,
        out: *mut f32,
    ) {
        match span {
            16 => tile::<MR8, 4, true>(pw, ps, po, groups, xq, xd, out),
            32 => tile::<MR8, 8, true>(pw, ps, po, groups, xq, xd, out),
            _ => tile::<MR8, 64, true>(pw, ps, po, groups, xq, xd, out),
        }
    }

    /// `acc` plus Σ w·x over a block with 8-bit activations: one `vpdpbusd`
    /// (unsigned × signed, so Q8_0 goes as |w| × (x with w's sign)).
    #[inline]
    #[target_feature(enable = "avx512vl,avx512vnni,avx2")]
    unsafe fn sum_i8<const D: u8>(acc: __m256i, w: __m256i, x: *const i8) -> __m256i {
        let x = _mm256_loadu_si256(x as *const __m256i);
        let (u, s) = if D == Q8_0 {
            (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
        } else {
            (w, x)
        };
        _mm256_dpbusd_epi32(acc, u, s)
    }
}
