//! Block decoders of the low-bit formats (Q2_K, Q3_K, IQ4_NL, IQ4_XS,
//! TQ2_0, MXFP4, the 2- and 3-bit i-quants), expanded inside `shared_kernels!` beside the others and
//! bound by the same rule: ggml's arithmetic, operation for operation, so
//! the values are bit-identical to `quants::dequantize_row`.

/// The decoders, for the instruction set `$feat`.
macro_rules! lowbit_decoders {
    ($feat:literal) => {
        /// Bit pair `p` (0..4) of each of 16 bytes.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn pair(v: __m128i, p: usize) -> __m128i {
            let shifted = match p {
                0 => v,
                1 => _mm_srli_epi16(v, 2),
                2 => _mm_srli_epi16(v, 4),
                _ => _mm_srli_epi16(v, 6),
            };
            _mm_and_si128(shifted, _mm_set1_epi8(3))
        }

        /// Values of `table` (16 signed bytes) picked by 16 indices (0..16).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn lookup(table: &[i8; 16], idx: __m128i) -> V {
            let t = _mm_loadu_si128(table.as_ptr() as *const __m128i);
            i8_to_f32(_mm_shuffle_epi8(t, idx))
        }

        /// Per 16-value sub-block `j`: `d·(sc & 15)·q − dmin·(sc >> 4)`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q2_k(b: *const u8) -> [V; 16] {
            let (d, dmin) = (h2f(b.add(80)), h2f(b.add(82)));
            let mut out = [zero(); 16];
            for n in 0..2 {
                let q = [load128(b.add(16 + 32 * n)), load128(b.add(32 + 32 * n))];
                for p in 0..4 {
                    for (h, qh) in q.iter().enumerate() {
                        let j = 8 * n + 2 * p + h;
                        let sc = *b.add(j);
                        let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                        out[j] = sub(mul(splat(dl), u8_to_f32(pair(*qh, p))), splat(ml));
                    }
                }
            }
            out
        }

        /// Per 16-value sub-block `j`: `d·sc_j·(q − 4·(1 − h))`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q3_k(b: *const u8) -> [V; 16] {
            let d = h2f(b.add(108));
            let sc = crate::quants::q3_k_scales(core::slice::from_raw_parts(b.add(96), 12));
            let hm = [load128(b), load128(b.add(16))];
            let four = _mm_set1_epi8(4);
            let mut out = [zero(); 16];
            for n in 0..2 {
                let q = [load128(b.add(32 + 32 * n)), load128(b.add(48 + 32 * n))];
                for p in 0..4 {
                    let bit = _mm_set1_epi8((1u8 << (4 * n + p)) as i8);
                    for h in 0..2 {
                        let set = _mm_cmpeq_epi8(_mm_and_si128(hm[h], bit), bit);
                        let v = _mm_sub_epi8(pair(q[h], p), _mm_andnot_si128(set, four));
                        let j = 8 * n + 2 * p + h;
                        out[j] = mul(splat(d * sc[j] as f32), i8_to_f32(v));
                    }
                }
            }
            out
        }

        /// `d·v[q]` with IQ4_NL's 16 values `v`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_iq4_nl(b: *const u8) -> [V; 2] {
            let d = h2f_splat(b);
            let (lo, hi) = nibbles(load128(b.add(2)));
            let t = &crate::quants::IQ4_VALUES;
            [mul(d, lookup(t, lo)), mul(d, lookup(t, hi))]
        }

        /// Per 32-value sub-block `ib`: `(d·(ls − 32))·v[q]`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_iq4_xs(b: *const u8) -> [V; 16] {
            let d = h2f(b);
            let blk = core::slice::from_raw_parts(b, 8);
            let t = &crate::quants::IQ4_VALUES;
            let mut out = [zero(); 16];
            for ib in 0..8 {
                let dl = splat(d * crate::quants::iq4_xs_scale(blk, ib) as f32);
                let (lo, hi) = nibbles(load128(b.add(8 + 16 * ib)));
                out[2 * ib] = mul(dl, lookup(t, lo));
                out[2 * ib + 1] = mul(dl, lookup(t, hi));
            }
            out
        }

        /// `(t + 1 − 1)·d` from 2-bit fields.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_tq2_0(b: *const u8) -> [V; 16] {
            let d = splat(h2f(b.add(64)));
            let one = _mm_set1_epi8(1);
            let mut out = [zero(); 16];
            for c in 0..2 {
                let q = [load128(b.add(32 * c)), load128(b.add(32 * c + 16))];
                for p in 0..4 {
                    for h in 0..2 {
                        let t = i8_to_f32(_mm_sub_epi8(pair(q[h], p), one));
                        out[8 * c + 2 * p + h] = mul(t, d);
                    }
                }
            }
            out
        }

        /// `v[q]·d` with the doubled e2m1 values `v` and the halved scale `d`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_mxfp4(b: *const u8) -> [V; 2] {
            let d = splat(crate::quants::e8m0_half(*b));
            let (lo, hi) = nibbles(load128(b.add(1)));
            let t = &crate::quants::MXFP4_VALUES;
            [mul(lookup(t, lo), d), mul(lookup(t, hi), d)]
        }

        /// Two 8-value i-quant groups (grid entries `g0`, `g1`; sign bits
        /// `s0`, `s1`) times `db`. The grid bytes are negated before the
        /// product: `db·(−g)` is `(db·g)·(−1)` exactly (no grid value is 0).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn iq_groups(db: V, g0: u64, g1: u64, s0: u8, s1: u8) -> V {
            let g = _mm_set_epi64x(g1 as i64, g0 as i64);
            // Sign byte 0 to lanes 0..8, byte 1 to 8..16; lane j tests bit j % 8.
            let s = _mm_cvtsi32_si128(s0 as i32 | (s1 as i32) << 8);
            let s = _mm_shuffle_epi8(s, _mm_set_epi64x(0x0101_0101_0101_0101, 0));
            let bits = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let neg = _mm_cmpeq_epi8(_mm_and_si128(s, bits), bits);
            mul(db, i8_to_f32(_mm_sub_epi8(_mm_xor_si128(g, neg), neg)))
        }

        /// Per sub-block: grid indices (bytes) and a word of sign indices and scale.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_iq2_xxs(b: *const u8) -> [V; 16] {
            use crate::quants::{iq_ksigns as ks, IQ2XXS_GRID as G};
            let d = h2f(b);
            let mut out = [zero(); 16];
            for ib in 0..8 {
                let idx = core::ptr::read_unaligned(b.add(2 + 8 * ib) as *const u32);
                let aux = core::ptr::read_unaligned(b.add(6 + 8 * ib) as *const u32);
                let db = splat(crate::quants::iq_xxs_scale(d, aux, 0.25));
                let g = |l: usize| G[((idx >> (8 * l)) & 0xFF) as usize];
                let s = |l: usize| ks(aux >> (7 * l));
                out[2 * ib] = iq_groups(db, g(0), g(1), s(0), s(1));
                out[2 * ib + 1] = iq_groups(db, g(2), g(3), s(2), s(3));
            }
            out
        }

        /// Per group a u16: 9-bit grid index, 7-bit sign index.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_iq2_xs(b: *const u8) -> [V; 16] {
            use crate::quants::{iq2_scale, iq_ksigns as ks, IQ2XS_GRID as G};
            let d = h2f(b);
            let mut out = [zero(); 16];
            for ib in 0..8 {
                let sc = *b.add(66 + ib);
                let q = |l: usize| {
                    let q = core::ptr::read_unaligned(b.add(2 + 8 * ib + 2 * l) as *const u16);
                    (G[(q & 511) as usize], ks(q as u32 >> 9))
                };
                let (q0, q1, q2, q3) = (q(0), q(1), q(2), q(3));
                let (db0, db1) = (splat(iq2_scale(d, sc & 0xF)), splat(iq2_scale(d, sc >> 4)));
                out[2 * ib] = iq_groups(db0, q0.0, q1.0, q0.1, q1.1);
                out[2 * ib + 1] = iq_groups(db1, q2.0, q3.0, q2.1, q3.1);
            }
            out
        }

        /// 10-bit grid indices (qs, qh), sign bytes.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_iq2_s(b: *const u8) -> [V; 16] {
            use crate::quants::{iq2_scale, IQ2S_GRID as G};
            let d = h2f(b);
            let mut out = [zero(); 16];
            for ib in 0..8 {
                let (qh, sc) = (*b.add(66 + ib) as usize, *b.add(74 + ib));
                let g = |l: usize| G[*b.add(2 + 4 * ib + l) as usize | ((qh >> (2 * l)) & 3) << 8];
                let s = |l: usize| *b.add(34 + 4 * ib + l);
                let (db0, db1) = (splat(iq2_scale(d, sc & 0xF)), splat(iq2_scale(d, sc >> 4)));
                out[2 * ib] = iq_groups(db0, g(0), g(1), s(0), s(1));
                out[2 * ib + 1] = iq_groups(db1, g(2), g(3), s(2), s(3));
            }
            out
        }

        /// Two 8-bit indices into the 4-value grid per group; signs and
        /// scale as IQ2_XXS.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_iq3_xxs(b: *const u8) -> [V; 16] {
            use crate::quants::{iq3_pair, iq_ksigns as ks, IQ3XXS_GRID as G};
            let d = h2f(b);
            let mut out = [zero(); 16];
            for ib in 0..8 {
                let aux = core::ptr::read_unaligned(b.add(66 + 4 * ib) as *const u32);
                let db = splat(crate::quants::iq_xxs_scale(d, aux, 0.5));
                let q = |i: usize| G[*b.add(2 + 8 * ib + i) as usize];
                let g = |l: usize| iq3_pair(q(2 * l), q(2 * l + 1));
                let s = |l: usize| ks(aux >> (7 * l));
                out[2 * ib] = iq_groups(db, g(0), g(1), s(0), s(1));
                out[2 * ib + 1] = iq_groups(db, g(2), g(3), s(2), s(3));
            }
            out
        }

        /// 9-bit indices (qs, one qh bit each) into the 4-value grid, sign bytes.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_iq3_s(b: *const u8) -> [V; 16] {
            use crate::quants::{iq3_pair, IQ3S_GRID as G};
            let d = h2f(b);
            let scales = core::slice::from_raw_parts(b.add(106), 4);
            let mut out = [zero(); 16];
            for ib in 0..8 {
                let qh = *b.add(66 + ib) as usize;
                let db = splat(crate::quants::iq3_s_scale(d, scales, ib));
                let q = |i: usize| G[*b.add(2 + 8 * ib + i) as usize | ((qh >> i) & 1) << 8];
                let g = |l: usize| iq3_pair(q(2 * l), q(2 * l + 1));
                let s = |l: usize| *b.add(74 + 4 * ib + l);
                out[2 * ib] = iq_groups(db, g(0), g(1), s(0), s(1));
                out[2 * ib + 1] = iq_groups(db, g(2), g(3), s(2), s(3));
            }
            out
        }

        dot_fn!($feat, dot_q2_k, dot4_q2_k, deq_q2_k, decode_q2_k, 84, 16);
        dot_fn!($feat, dot_q3_k, dot4_q3_k, deq_q3_k, decode_q3_k, 110, 16);
        dot_fn!(
            $feat,
            dot_iq4_nl,
            dot4_iq4_nl,
            deq_iq4_nl,
            decode_iq4_nl,
            18,
            2
        );
        dot_fn!(
            $feat,
            dot_iq4_xs,
            dot4_iq4_xs,
            deq_iq4_xs,
            decode_iq4_xs,
            136,
            16
        );
        dot_fn!(
            $feat,
            dot_tq2_0,
            dot4_tq2_0,
            deq_tq2_0,
            decode_tq2_0,
            66,
            16
        );
        dot_fn!($feat, dot_mxfp4, dot4_mxfp4, deq_mxfp4, decode_mxfp4, 17, 2);
        dot_fn!(
            $feat,
            dot_iq2_xxs,
            dot4_iq2_xxs,
            deq_iq2_xxs,
            decode_iq2_xxs,
            66,
            16
        );
        dot_fn!(
            $feat,
            dot_iq2_xs,
            dot4_iq2_xs,
            deq_iq2_xs,
            decode_iq2_xs,
            74,
            16
        );
        dot_fn!(
            $feat,
            dot_iq2_s,
            dot4_iq2_s,
            deq_iq2_s,
            decode_iq2_s,
            82,
            16
        );
        dot_fn!(
            $feat,
            dot_iq3_xxs,
            dot4_iq3_xxs,
            deq_iq3_xxs,
            decode_iq3_xxs,
            98,
            16
        );
        dot_fn!(
            $feat,
            dot_iq3_s,
            dot4_iq3_s,
            deq_iq3_s,
            decode_iq3_s,
            110,
            16
        );
    };
}
