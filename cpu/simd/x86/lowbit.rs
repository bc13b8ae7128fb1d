//! Block decoders of the low-bit formats (Q2_K, Q3_K, IQ4_NL, IQ4_XS,
//! TQ2_0, MXFP4), expanded inside `shared_kernels!` beside the others and
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
    };
}
