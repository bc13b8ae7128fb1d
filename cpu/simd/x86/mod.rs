//! x86-64 kernels. The block decoders and dot kernels are written once, as
//! macros over a small set of 16-lane f32 primitives (`zero`, `splat`,
//! `loadu`, `fmadd`, `u8_to_f32`, ...), and instantiated per instruction set
//! in [`avx512`] and [`avx2`] so each copy is compiled with its own
//! `#[target_feature]`. Each decoder turns one GGUF block into f32 vectors in
//! registers with exactly ggml's arithmetic (same operations, same order), so
//! the dequantized weights are bit-identical to `quants::dequantize_row`.

#[macro_use]
mod lowbit;

/// Block decoders (one GGUF block → `[V; elems / 16]`) plus the dispatchers
/// `dot_rows`, `dequant_row` and `dot_f32`, for the instruction set `$feat`.
macro_rules! shared_kernels {
    ($feat:literal) => {
        use crate::dtype::DType;
        use core::arch::x86_64::*;

        /// Little-endian f16 at `p` (F16C).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn h2f(p: *const u8) -> f32 {
            let bits = core::ptr::read_unaligned(p as *const u16);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
        }

        /// Little-endian f16 at `p`, broadcast (stays in vector registers).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn h2f_splat(p: *const u8) -> V {
            let bits = core::ptr::read_unaligned(p as *const u16);
            bcast(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
        }

        /// Two consecutive little-endian f16 at `p` (a block's `d` and `m`),
        /// each broadcast: one conversion instead of two.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn h2f_pair(p: *const u8) -> (V, V) {
            let bits = core::ptr::read_unaligned(p as *const i32);
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
            (bcast(dm), bcast(_mm_movehdup_ps(dm)))
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn load128(p: *const u8) -> __m128i {
            _mm_loadu_si128(p as *const __m128i)
        }

        /// Low and high nibbles of 16 bytes.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn nibbles(v: __m128i) -> (__m128i, __m128i) {
            let m = _mm_set1_epi8(0x0F);
            (_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m))
        }

        /// Bit `i` of `bits` (i < 16) as byte `i` = 0x10 or 0: the 5th bit of Q5 values.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn bits_to_0x10(bits: u32) -> __m128i {
            use crate::cpu::simd::x86::BIT_TO_0X10 as T;
            _mm_set_epi64x(
                T[((bits >> 8) & 0xFF) as usize] as i64,
                T[(bits & 0xFF) as usize] as i64,
            )
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_f32(p: *const u8) -> [V; 1] {
            [loadu(p as *const f32)]
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_f16(p: *const u8) -> [V; 1] {
            [f16_to_f32(p)]
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_bf16(p: *const u8) -> [V; 1] {
            [bf16_to_f32(p)]
        }

        /// `q * d`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q8_0(b: *const u8) -> [V; 2] {
            let d = h2f_splat(b);
            [
                mul(i8_to_f32(load128(b.add(2))), d),
                mul(i8_to_f32(load128(b.add(18))), d),
            ]
        }

        /// `(q - 8) * d`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q4_0(b: *const u8) -> [V; 2] {
            let d = h2f_splat(b);
            let (lo, hi) = nibbles(load128(b.add(2)));
            let eight = _mm_set1_epi8(8);
            [
                mul(i8_to_f32(_mm_sub_epi8(lo, eight)), d),
                mul(i8_to_f32(_mm_sub_epi8(hi, eight)), d),
            ]
        }

        /// `q * d + m`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q4_1(b: *const u8) -> [V; 2] {
            let (d, m) = h2f_pair(b);
            let (lo, hi) = nibbles(load128(b.add(4)));
            [add(mul(u8_to_f32(lo), d), m), add(mul(u8_to_f32(hi), d), m)]
        }

        /// `((q | h << 4) - 16) * d`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q5_0(b: *const u8) -> [V; 2] {
            let d = h2f_splat(b);
            let qh = core::ptr::read_unaligned(b.add(2) as *const u32);
            let (lo, hi) = nibbles(load128(b.add(6)));
            let lo = _mm_or_si128(lo, bits_to_0x10(qh));
            let hi = _mm_or_si128(hi, bits_to_0x10(qh >> 16));
            let sixteen = _mm_set1_epi8(16);
            [
                mul(i8_to_f32(_mm_sub_epi8(lo, sixteen)), d),
                mul(i8_to_f32(_mm_sub_epi8(hi, sixteen)), d),
            ]
        }

        /// `(q | h << 4) * d + m`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q5_1(b: *const u8) -> [V; 2] {
            let (d, m) = h2f_pair(b);
            let qh = core::ptr::read_unaligned(b.add(4) as *const u32);
            let (lo, hi) = nibbles(load128(b.add(8)));
            let lo = _mm_or_si128(lo, bits_to_0x10(qh));
            let hi = _mm_or_si128(hi, bits_to_0x10(qh >> 16));
            [add(mul(u8_to_f32(lo), d), m), add(mul(u8_to_f32(hi), d), m)]
        }

        /// Per 32-value sub-block: `d * sc * q - dmin * m` (`q` 4 or 5 bits).
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_k4_like(b: *const u8, qh: Option<*const u8>, qs: *const u8) -> [V; 16] {
            let (d, dmin) = (h2f(b), h2f(b.add(2)));
            let scales = core::slice::from_raw_parts(b.add(4), 12);
            let mut out = [zero(); 16];
            for c in 0..4 {
                let (sc1, m1) = crate::quants::scale_min_k4(2 * c, scales);
                let (sc2, m2) = crate::quants::scale_min_k4(2 * c + 1, scales);
                let (d1, m1) = (splat(d * sc1 as f32), splat(dmin * m1 as f32));
                let (d2, m2) = (splat(d * sc2 as f32), splat(dmin * m2 as f32));
                let (alo, ahi) = nibbles(load128(qs.add(32 * c)));
                let (blo, bhi) = nibbles(load128(qs.add(32 * c + 16)));
                let (alo, blo, ahi, bhi) = match qh {
                    None => (alo, blo, ahi, bhi),
                    Some(h) => {
                        let (ha, hb) = (load128(h), load128(h.add(16)));
                        let sixteen = _mm_set1_epi8(16);
                        let bit = |v: __m128i, u: u8| {
                            let u = _mm_set1_epi8(u as i8);
                            _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, u), u), sixteen)
                        };
                        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
                        (
                            _mm_or_si128(alo, bit(ha, u1)),
                            _mm_or_si128(blo, bit(hb, u1)),
                            _mm_or_si128(ahi, bit(ha, u2)),
                            _mm_or_si128(bhi, bit(hb, u2)),
                        )
                    }
                };
                out[4 * c] = sub(mul(d1, u8_to_f32(alo)), m1);
                out[4 * c + 1] = sub(mul(d1, u8_to_f32(blo)), m1);
                out[4 * c + 2] = sub(mul(d2, u8_to_f32(ahi)), m2);
                out[4 * c + 3] = sub(mul(d2, u8_to_f32(bhi)), m2);
            }
            out
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q4_k(b: *const u8) -> [V; 16] {
            decode_k4_like(b, None, b.add(16))
        }

        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q5_k(b: *const u8) -> [V; 16] {
            decode_k4_like(b, Some(b.add(16)), b.add(48))
        }

        /// Per 16-value sub-block: `(d * sc) * (q - 32)` with 6-bit `q`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn decode_q6_k(b: *const u8) -> [V; 16] {
            let d = h2f(b.add(208));
            let mut out = [zero(); 16];
            let (m4, m30, b32) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(0x30), _mm_set1_epi8(32));
            for half in 0..2 {
                let ql = b.add(64 * half);
                let qh = b.add(128 + 32 * half);
                let sc = b.add(192 + 8 * half) as *const i8;
                for s in 0..2 {
                    let la = load128(ql.add(16 * s));
                    let lb = load128(ql.add(32 + 16 * s));
                    let h = load128(qh.add(16 * s));
                    let q = [
                        _mm_or_si128(
                            _mm_and_si128(la, m4),
                            _mm_and_si128(_mm_slli_epi16(h, 4), m30),
                        ),
                        _mm_or_si128(
                            _mm_and_si128(lb, m4),
                            _mm_and_si128(_mm_slli_epi16(h, 2), m30),
                        ),
                        _mm_or_si128(
                            _mm_and_si128(_mm_srli_epi16(la, 4), m4),
                            _mm_and_si128(h, m30),
                        ),
                        _mm_or_si128(
                            _mm_and_si128(_mm_srli_epi16(lb, 4), m4),
                            _mm_and_si128(_mm_srli_epi16(h, 2), m30),
                        ),
                    ];
                    for (g, qg) in q.into_iter().enumerate() {
                        let ds = splat(d * *sc.add(2 * g + s) as f32);
                        out[8 * half + 2 * g + s] = mul(ds, i8_to_f32(_mm_sub_epi8(qg, b32)));
                    }
                }
            }
            out
        }

        dot_fn!($feat, dot_f32w, dot4_f32w, deq_f32, decode_f32, 64, 1);
        dot_fn!($feat, dot_f16, dot4_f16, deq_f16, decode_f16, 32, 1);
        dot_fn!($feat, dot_bf16, dot4_bf16, deq_bf16, decode_bf16, 32, 1);
        dot_fn!($feat, dot_q8_0, dot4_q8_0, deq_q8_0, decode_q8_0, 34, 2);
        dot_fn!($feat, dot_q4_0, dot4_q4_0, deq_q4_0, decode_q4_0, 18, 2);
        dot_fn!($feat, dot_q4_1, dot4_q4_1, deq_q4_1, decode_q4_1, 20, 2);
        dot_fn!($feat, dot_q5_0, dot4_q5_0, deq_q5_0, decode_q5_0, 22, 2);
        dot_fn!($feat, dot_q5_1, dot4_q5_1, deq_q5_1, decode_q5_1, 24, 2);
        dot_fn!($feat, dot_q4_k, dot4_q4_k, deq_q4_k, decode_q4_k, 144, 16);
        dot_fn!($feat, dot_q5_k, dot4_q5_k, deq_q5_k, decode_q5_k, 176, 16);
        dot_fn!($feat, dot_q6_k, dot4_q6_k, deq_q6_k, decode_q6_k, 210, 16);
        lowbit_decoders!($feat);

        /// Values per SIMD block of `dtype` (floats are taken 16 at a time).
        fn simd_block(dtype: DType) -> usize {
            if dtype.is_quantized() {
                dtype.block_elems()
            } else {
                16
            }
        }

        /// Dots of one weight row (`k` values from `w`) with `M` rows of `x`
        /// (row stride `k`) into `out[..M]`. Only whole SIMD blocks: `k` must
        /// be a multiple of [`simd_block`].
        #[target_feature(enable = $feat)]
        unsafe fn dot_row<const M: usize>(
            dtype: DType,
            w: *const u8,
            k: usize,
            x: *const f32,
            out: *mut f32,
        ) {
            let nb = k / simd_block(dtype);
            match dtype {
                DType::F32 => dot_f32w::<M>(w, nb, x, k, out),
                DType::F16 => dot_f16::<M>(w, nb, x, k, out),
                DType::BF16 => dot_bf16::<M>(w, nb, x, k, out),
                DType::Q8_0 => dot_q8_0::<M>(w, nb, x, k, out),
                DType::Q4_0 => dot_q4_0::<M>(w, nb, x, k, out),
                DType::Q4_1 => dot_q4_1::<M>(w, nb, x, k, out),
                DType::Q5_0 => dot_q5_0::<M>(w, nb, x, k, out),
                DType::Q5_1 => dot_q5_1::<M>(w, nb, x, k, out),
                DType::Q4K => dot_q4_k::<M>(w, nb, x, k, out),
                DType::Q5K => dot_q5_k::<M>(w, nb, x, k, out),
                DType::Q6K => dot_q6_k::<M>(w, nb, x, k, out),
                DType::Q2K => dot_q2_k::<M>(w, nb, x, k, out),
                DType::Q3K => dot_q3_k::<M>(w, nb, x, k, out),
                DType::IQ4NL => dot_iq4_nl::<M>(w, nb, x, k, out),
                DType::IQ4XS => dot_iq4_xs::<M>(w, nb, x, k, out),
                DType::TQ2_0 => dot_tq2_0::<M>(w, nb, x, k, out),
                DType::MXFP4 => dot_mxfp4::<M>(w, nb, x, k, out),
                DType::IQ2XXS => dot_iq2_xxs::<M>(w, nb, x, k, out),
                DType::IQ2XS => dot_iq2_xs::<M>(w, nb, x, k, out),
                DType::IQ2S => dot_iq2_s::<M>(w, nb, x, k, out),
                DType::IQ3XXS => dot_iq3_xxs::<M>(w, nb, x, k, out),
                DType::IQ3S => dot_iq3_s::<M>(w, nb, x, k, out),
                // Rows without `cpu.simd` never come here (`decodes`).
                _ => unreachable!("no register decoder for this type"),
            }
        }

        /// [`dot_row`] for four rows and one activation row, `out[..4]`.
        #[target_feature(enable = $feat)]
        unsafe fn dot_row4(
            dtype: DType,
            w: *const u8,
            row_bytes: usize,
            k: usize,
            x: *const f32,
            out: *mut f32,
        ) {
            let nb = k / simd_block(dtype);
            match dtype {
                DType::F32 => dot4_f32w(w, row_bytes, nb, x, out),
                DType::F16 => dot4_f16(w, row_bytes, nb, x, out),
                DType::BF16 => dot4_bf16(w, row_bytes, nb, x, out),
                DType::Q8_0 => dot4_q8_0(w, row_bytes, nb, x, out),
                DType::Q4_0 => dot4_q4_0(w, row_bytes, nb, x, out),
                DType::Q4_1 => dot4_q4_1(w, row_bytes, nb, x, out),
                DType::Q5_0 => dot4_q5_0(w, row_bytes, nb, x, out),
                DType::Q5_1 => dot4_q5_1(w, row_bytes, nb, x, out),
                DType::Q4K => dot4_q4_k(w, row_bytes, nb, x, out),
                DType::Q5K => dot4_q5_k(w, row_bytes, nb, x, out),
                DType::Q6K => dot4_q6_k(w, row_bytes, nb, x, out),
                DType::Q2K => dot4_q2_k(w, row_bytes, nb, x, out),
                DType::Q3K => dot4_q3_k(w, row_bytes, nb, x, out),
                DType::IQ4NL => dot4_iq4_nl(w, row_bytes, nb, x, out),
                DType::IQ4XS => dot4_iq4_xs(w, row_bytes, nb, x, out),
                DType::TQ2_0 => dot4_tq2_0(w, row_bytes, nb, x, out),
                DType::MXFP4 => dot4_mxfp4(w, row_bytes, nb, x, out),
                DType::IQ2XXS => dot4_iq2_xxs(w, row_bytes, nb, x, out),
                DType::IQ2XS => dot4_iq2_xs(w, row_bytes, nb, x, out),
                DType::IQ2S => dot4_iq2_s(w, row_bytes, nb, x, out),
                DType::IQ3XXS => dot4_iq3_xxs(w, row_bytes, nb, x, out),
                DType::IQ3S => dot4_iq3_s(w, row_bytes, nb, x, out),
                // Rows without `cpu.simd` never come here (`decodes`).
                _ => unreachable!("no register decoder for this type"),
            }
        }

        /// See `cpu::simd::dot_rows`; `k` a multiple of [`simd_block`].
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot_rows(
            dtype: DType,
            w: &[u8],
            row_bytes: usize,
            k: usize,
            x: &[f32],
            m: usize,
            out: &mut [f32],
        ) {
            let rows = w.len() / row_bytes;
            let mut r = 0;
            // Q8_0 gains nothing in cache from four rows at a time and loses
            // 2-3x on the tied output matrix (30 MB, streamed from DRAM: four
            // interleaved streams of 34-byte blocks starve the prefetcher).
            if m == 1 && dtype != DType::Q8_0 {
                while r + 4 <= rows {
                    dot_row4(
                        dtype,
                        w.as_ptr().add(r * row_bytes),
                        row_bytes,
                        k,
                        x.as_ptr(),
                        out.as_mut_ptr().add(r),
                    );
                    r += 4;
                }
            }
            for r in r..rows {
                let wr = w.as_ptr().add(r * row_bytes);
                let o = out.as_mut_ptr().add(r * m);
                match m {
                    1 => dot_row::<1>(dtype, wr, k, x.as_ptr(), o),
                    2 => dot_row::<2>(dtype, wr, k, x.as_ptr(), o),
                    3 => dot_row::<3>(dtype, wr, k, x.as_ptr(), o),
                    _ => dot_row::<4>(dtype, wr, k, x.as_ptr(), o),
                }
            }
        }

        /// One row of `out.len()` values (a multiple of [`simd_block`]) dequantized.
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dequant_row(dtype: DType, w: &[u8], out: &mut [f32]) {
            let nb = out.len() / simd_block(dtype);
            let (w, o) = (w.as_ptr(), out.as_mut_ptr());
            match dtype {
                DType::F32 => deq_f32(w, nb, o),
                DType::F16 => deq_f16(w, nb, o),
                DType::BF16 => deq_bf16(w, nb, o),
                DType::Q8_0 => deq_q8_0(w, nb, o),
                DType::Q4_0 => deq_q4_0(w, nb, o),
                DType::Q4_1 => deq_q4_1(w, nb, o),
                DType::Q5_0 => deq_q5_0(w, nb, o),
                DType::Q5_1 => deq_q5_1(w, nb, o),
                DType::Q4K => deq_q4_k(w, nb, o),
                DType::Q5K => deq_q5_k(w, nb, o),
                DType::Q6K => deq_q6_k(w, nb, o),
                DType::Q2K => deq_q2_k(w, nb, o),
                DType::Q3K => deq_q3_k(w, nb, o),
                DType::IQ4NL => deq_iq4_nl(w, nb, o),
                DType::IQ4XS => deq_iq4_xs(w, nb, o),
                DType::TQ2_0 => deq_tq2_0(w, nb, o),
                DType::MXFP4 => deq_mxfp4(w, nb, o),
                DType::IQ2XXS => deq_iq2_xxs(w, nb, o),
                DType::IQ2XS => deq_iq2_xs(w, nb, o),
                DType::IQ2S => deq_iq2_s(w, nb, o),
                DType::IQ3XXS => deq_iq3_xxs(w, nb, o),
                DType::IQ3S => deq_iq3_s(w, nb, o),
                // Rows without `cpu.simd` never come here (`decodes`).
                _ => unreachable!("no register decoder for this type"),
            }
        }

        /// One (query row, head) of attention with `C * 16` dims kept in
        /// registers: scores against keys `first..=last` (row `j` of `k`/`v`
        /// at `j * stride + kvo`), max-subtracted softmax (a `sink` logit
        /// joins its max and denominator), weighted value sum into `o`.
        /// `scores` is scratch.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn attn_head<const C: usize>(
            q: &[f32],
            k: &[f32],
            v: &[f32],
            stride: usize,
            kvo: usize,
            first: usize,
            last: usize,
            scale: f32,
            sink: Option<f32>,
            scores: &mut Vec<f32>,
            o: &mut [f32],
        ) {
            let mut qv = [zero(); C];
            for (c, r) in qv.iter_mut().enumerate() {
                *r = loadu(q.as_ptr().add(16 * c));
            }
            scores.clear();
            let mut max = sink.unwrap_or(f32::NEG_INFINITY);
            for j in first..=last {
                let kp = k.as_ptr().add(j * stride + kvo);
                let mut acc = mul(qv[0], loadu(kp));
                for (c, r) in qv.iter().enumerate().skip(1) {
                    acc = fmadd(*r, loadu(kp.add(16 * c)), acc);
                }
                let s = hsum(acc) * scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut total = sink.map_or(0.0, |s| (s - max).exp());
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                total += *s;
            }
            let mut ov = [zero(); C];
            for (j, e) in (first..=last).zip(scores.iter()) {
                let vp = v.as_ptr().add(j * stride + kvo);
                let ev = splat(*e);
                for (c, r) in ov.iter_mut().enumerate() {
                    *r = fmadd(ev, loadu(vp.add(16 * c)), *r);
                }
            }
            let inv = splat(1.0 / total);
            for (c, r) in ov.iter().enumerate() {
                storeu(o.as_mut_ptr().add(16 * c), mul(*r, inv));
            }
        }

        /// [`attn_head`] for head sizes 64 and 128; `false` for other sizes.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn attention_head(
            q: &[f32],
            k: &[f32],
            v: &[f32],
            stride: usize,
            kvo: usize,
            first: usize,
            last: usize,
            scale: f32,
            sink: Option<f32>,
            scores: &mut Vec<f32>,
            o: &mut [f32],
        ) -> bool {
            match o.len() {
                64 => attn_head::<4>(q, k, v, stride, kvo, first, last, scale, sink, scores, o),
                128 => attn_head::<8>(q, k, v, stride, kvo, first, last, scale, sink, scores, o),
                _ => return false,
            }
            true
        }

        /// `y[i] += a * x[i]` over `y.len()` values (`x` at least as long).
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
            let n = y.len();
            let (px, py) = (x.as_ptr(), y.as_mut_ptr());
            let av = splat(a);
            let mut i = 0;
            while i + 16 <= n {
                storeu(py.add(i), fmadd(av, loadu(px.add(i)), loadu(py.add(i))));
                i += 16;
            }
            while i < n {
                *py.add(i) += a * *px.add(i);
                i += 1;
            }
        }

        /// `Σ a[i] * b[i]` over `a.len()` values (`b` at least as long).
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
            let n = a.len();
            let (pa, pb) = (a.as_ptr(), b.as_ptr());
            let mut acc = [zero(); 4];
            let mut i = 0;
            while i + 64 <= n {
                for (s, a) in acc.iter_mut().enumerate() {
                    *a = fmadd(loadu(pa.add(i + 16 * s)), loadu(pb.add(i + 16 * s)), *a);
                }
                i += 64;
            }
            while i + 16 <= n {
                acc[0] = fmadd(loadu(pa.add(i)), loadu(pb.add(i)), acc[0]);
                i += 16;
            }
            let mut sum = hsum(add(add(acc[0], acc[1]), add(acc[2], acc[3])));
            while i < n {
                sum += a[i] * b[i];
                i += 1;
            }
            sum
        }
    };
}

/// `$dot::<M>`: dots of one row of `nb` blocks against `M` activation rows,
/// with four independent accumulators per row so FMA latency is hidden; and
/// `$deq`: the same blocks stored as f32.
macro_rules! dot_fn {
    ($feat:literal, $dot:ident, $dot4:ident, $deq:ident, $decode:ident, $bytes:expr, $chunks:expr) => {
        /// Four consecutive weight rows (`row_bytes` apart) against one
        /// activation row: each `x` chunk is loaded once for four rows, and
        /// the four sums are reduced together.
        #[target_feature(enable = $feat)]
        unsafe fn $dot4(w: *const u8, row_bytes: usize, nb: usize, x: *const f32, out: *mut f32) {
            const C: usize = $chunks;
            let mut acc = [[zero(); 2]; 4];
            for b in 0..nb {
                let xb = x.add(b * 16 * C);
                for (r, a) in acc.iter_mut().enumerate() {
                    let ws = $decode(w.add(r * row_bytes + b * $bytes));
                    for c in 0..C {
                        a[c % 2] = fmadd(ws[c], loadu(xb.add(16 * c)), a[c % 2]);
                    }
                }
            }
            let s = hsum4([
                add(acc[0][0], acc[0][1]),
                add(acc[1][0], acc[1][1]),
                add(acc[2][0], acc[2][1]),
                add(acc[3][0], acc[3][1]),
            ]);
            _mm_storeu_ps(out, s);
        }

        #[target_feature(enable = $feat)]
        unsafe fn $dot<const M: usize>(
            w: *const u8,
            nb: usize,
            x: *const f32,
            k: usize,
            out: *mut f32,
        ) {
            const C: usize = $chunks;
            // Blocks per group so a group feeds all four accumulators.
            const G: usize = if C >= 4 { 1 } else { 4 / C };
            let mut acc = [[zero(); 4]; M];
            let mut b = 0;
            while b + G <= nb {
                for g in 0..G {
                    let ws = $decode(w.add((b + g) * $bytes));
                    let xb = x.add((b + g) * 16 * C);
                    for c in 0..C {
                        let s = (g * C + c) % 4;
                        for (i, a) in acc.iter_mut().enumerate() {
                            a[s] = fmadd(ws[c], loadu(xb.add(i * k + 16 * c)), a[s]);
                        }
                    }
                }
                b += G;
            }
            while b < nb {
                let ws = $decode(w.add(b * $bytes));
                let xb = x.add(b * 16 * C);
                for c in 0..C {
                    for (i, a) in acc.iter_mut().enumerate() {
                        a[c % 4] = fmadd(ws[c], loadu(xb.add(i * k + 16 * c)), a[c % 4]);
                    }
                }
                b += 1;
            }
            for (i, a) in acc.iter().enumerate() {
                *out.add(i) = hsum(add(add(a[0], a[1]), add(a[2], a[3])));
            }
        }

        #[target_feature(enable = $feat)]
        unsafe fn $deq(w: *const u8, nb: usize, out: *mut f32) {
            for b in 0..nb {
                let ws = $decode(w.add(b * $bytes));
                for (c, v) in ws.into_iter().enumerate() {
                    storeu(out.add((b * $chunks + c) * 16), v);
                }
            }
        }
    };
}

/// Whether the shared kernels decode `dtype` in registers (its row's
/// `cpu.simd`, quants/types.rs); other types take `cpu::simd`'s portable
/// path (the scalar decoder, then SIMD dots).
pub(crate) fn decodes(dtype: crate::dtype::DType) -> bool {
    dtype.format().cpu.simd
}

/// Byte `i` of entry `b` is `0x10` when bit `i` of `b` is set: spreads the
/// 5th bits of Q5_0/Q5_1 values over bytes.
pub(crate) static BIT_TO_0X10: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            if b & (1 << i) != 0 {
                t[b] |= 0x10 << (8 * i);
            }
            i += 1;
        }
        b += 1;
    }
    t
};

pub(crate) mod amx;
pub(crate) mod avx2;
pub(crate) mod avx512;
pub(crate) mod intdot;
pub(crate) mod packed;
