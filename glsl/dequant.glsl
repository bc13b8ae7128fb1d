// Weight dequantization, one TYPE_* defined per compiled variant.
//
// The including shader declares `wdata`, the weight as 32-bit words in the
// layout `vk/layout.rs` repacks GGUF blocks into (each type's `gpu` row in
// quants/mod.rs): every block padded to whole words, with the 2-byte scale
// of q8_0/q4_0/q5_0/iq4_nl and the i-quants followed by 2 pad bytes so the
// quants start word-aligned, e.g. q6_k padded from 210 to 212 bytes, and
// the i-quants' grid tables before the first block.
//
// build.rs compiles the including shaders once for every TYPE_<dtype> this
// file's #if / #elif lines name.
//
// dq1(i): element i of the flattened [rows, cols] weight.
// dq4(i): elements i..i+3; i % 4 == 0 and all four in one row.
// dq16(i, v): elements i..i+15 into v; i % 16 == 0, all in one row. Types
// whose 16 values share one scale define it (and HAS_DQ16) to decode the
// scale once; the others get four dq4 calls at the end of this file.
// dq16_half(i, h): dq16's values as f16 pairs. A shader that also declares
// the weight as `wdata4` (uvec4s) defines WDATA4, and types whose runs
// are 16-byte aligned then read them 16 bytes a load (F16, Q4_K, Q5_K);
// the others pack dq16's floats.

uint byte_at(uint word_base, uint b) {
    return (wdata[word_base + (b >> 2)] >> ((b & 3u) * 8u)) & 0xFFu;
}

vec4 bytes4(uint w) {
    return vec4(w & 0xFFu, (w >> 8) & 0xFFu, (w >> 16) & 0xFFu, w >> 24);
}

// Entries of a 16-entry table of signed bytes t (4 a word, entry 0 in the
// low byte of t.x) at the low nibble of each byte of w, by selects on
// registers: NVIDIA keeps a const array indexed at run time in
// per-invocation local memory, which held the prefill GEMM of IQ4 and
// MXFP4 to half the other types' speed (benches/README.md).
vec4 lut16_bytes(uvec4 t, uint w) {
    uvec4 q = uvec4(w, w >> 8, w >> 16, w >> 24) & 0xFu;
    bvec4 hi2 = notEqual(q & 4u, uvec4(0u));
    uvec4 word = mix(mix(uvec4(t.x), uvec4(t.y), hi2), mix(uvec4(t.z), uvec4(t.w), hi2),
                     notEqual(q & 8u, uvec4(0u)));
    return vec4(ivec4(word << ((3u - (q & 3u)) * 8u)) >> 24);
}

#if defined(TYPE_F32)
float dq1(uint i) { return uintBitsToFloat(wdata[i]); }
vec4 dq4(uint i) {
    return vec4(uintBitsToFloat(wdata[i]), uintBitsToFloat(wdata[i + 1]),
                uintBitsToFloat(wdata[i + 2]), uintBitsToFloat(wdata[i + 3]));
}

#elif defined(TYPE_F16)
#if defined(WDATA4)
#define HAS_DQ16_HALF
void dq16_half(uint i, out uvec2 h[4]) {
    uvec4 a = wdata4[i >> 3];
    uvec4 b = wdata4[(i >> 3) + 1u];
    h[0] = a.xy;
    h[1] = a.zw;
    h[2] = b.xy;
    h[3] = b.zw;
}
#endif
float dq1(uint i) { return unpackHalf2x16(wdata[i >> 1])[i & 1u]; }
vec4 dq4(uint i) {
    return vec4(unpackHalf2x16(wdata[i >> 1]), unpackHalf2x16(wdata[(i >> 1) + 1]));
}

#elif defined(TYPE_BF16)
float dq1(uint i) { return uintBitsToFloat(((wdata[i >> 1] >> ((i & 1u) * 16u)) & 0xFFFFu) << 16); }
vec4 dq4(uint i) {
    uint a = wdata[i >> 1];
    uint b = wdata[(i >> 1) + 1];
    return vec4(uintBitsToFloat(a << 16), uintBitsToFloat(a & 0xFFFF0000u),
                uintBitsToFloat(b << 16), uintBitsToFloat(b & 0xFFFF0000u));
}

#elif defined(TYPE_Q8_0)
// [d f16, pad][32 x i8]: 9 words.
float dq1(uint i) {
    uint base = (i >> 5) * 9u;
    uint e = i & 31u;
    int q = bitfieldExtract(int(wdata[base + 1u + (e >> 2)]), int((e & 3u) * 8u), 8);
    return unpackHalf2x16(wdata[base]).x * float(q);
}
vec4 dq4(uint i) {
    uint base = (i >> 5) * 9u;
    int w = int(wdata[base + 1u + ((i & 31u) >> 2)]);
    vec4 q = vec4(bitfieldExtract(w, 0, 8), bitfieldExtract(w, 8, 8),
                  bitfieldExtract(w, 16, 8), bitfieldExtract(w, 24, 8));
    return unpackHalf2x16(wdata[base]).x * q;
}
#define HAS_DQ16
void dq16(uint i, out vec4 v[4]) {
    uint base = (i >> 5) * 9u + 1u + ((i & 31u) >> 2);
    float d = unpackHalf2x16(wdata[(i >> 5) * 9u]).x;
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        int w = int(wdata[base + j]);
        v[j] = d * vec4(bitfieldExtract(w, 0, 8), bitfieldExtract(w, 8, 8),
                        bitfieldExtract(w, 16, 8), bitfieldExtract(w, 24, 8));
    }
}

#elif defined(TYPE_Q4_0) || defined(TYPE_Q4_1)
// q4_0: [d f16, pad][16 bytes of nibbles]; q4_1: [d f16, m f16][16 bytes]: 5 words.
// Element e < 16 is the low nibble of byte e, e >= 16 the high nibble of byte e - 16.
vec2 q4_dm(uint base) {
    vec2 dm = unpackHalf2x16(wdata[base]);
#if defined(TYPE_Q4_0)
    return vec2(dm.x, -8.0 * dm.x);
#else
    return dm;
#endif
}
float dq1(uint i) {
    uint base = (i >> 5) * 5u;
    uint e = i & 31u;
    uint q = (byte_at(base + 1u, e & 15u) >> ((e >> 4) * 4u)) & 0xFu;
    vec2 dm = q4_dm(base);
    return dm.x * float(q) + dm.y;
}
vec4 dq4(uint i) {
    uint base = (i >> 5) * 5u;
    uint e = i & 31u;
    uint w = (wdata[base + 1u + ((e & 15u) >> 2)] >> ((e >> 4) * 4u)) & 0x0F0F0F0Fu;
    vec2 dm = q4_dm(base);
    return dm.x * bytes4(w) + dm.y;
}
#define HAS_DQ16
void dq16(uint i, out vec4 v[4]) {
    uint base = (i >> 5) * 5u;
    uint shift = ((i & 31u) >> 4) * 4u;
    vec2 dm = q4_dm(base);
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        v[j] = dm.x * bytes4((wdata[base + 1u + j] >> shift) & 0x0F0F0F0Fu) + dm.y;
    }
}

#elif defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
// q5_0: [d f16, pad][qh u32][16 bytes]; q5_1: [d f16, m f16][qh u32][16 bytes]: 6 words.
// Bit e of qh is the fifth bit of element e.
vec2 q5_dm(uint base) {
    vec2 dm = unpackHalf2x16(wdata[base]);
#if defined(TYPE_Q5_0)
    return vec2(dm.x, -16.0 * dm.x);
#else
    return dm;
#endif
}
float dq1(uint i) {
    uint base = (i >> 5) * 6u;
    uint e = i & 31u;
    uint q = (byte_at(base + 2u, e & 15u) >> ((e >> 4) * 4u)) & 0xFu;
    q |= ((wdata[base + 1u] >> e) & 1u) << 4;
    vec2 dm = q5_dm(base);
    return dm.x * float(q) + dm.y;
}
vec4 dq4(uint i) {
    uint base = (i >> 5) * 6u;
    uint e = i & 31u;
    uint w = (wdata[base + 2u + ((e & 15u) >> 2)] >> ((e >> 4) * 4u)) & 0x0F0F0F0Fu;
    uint h = wdata[base + 1u] >> e;
    vec4 hi = vec4(h & 1u, (h >> 1) & 1u, (h >> 2) & 1u, (h >> 3) & 1u) * 16.0;
    vec2 dm = q5_dm(base);
    return dm.x * (bytes4(w) + hi) + dm.y;
}
#define HAS_DQ16
void dq16(uint i, out vec4 v[4]) {
    uint base = (i >> 5) * 6u;
    uint e = i & 31u;
    uint h = wdata[base + 1u] >> e;
    vec2 dm = q5_dm(base);
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint w = (wdata[base + 2u + j] >> ((e >> 4) * 4u)) & 0x0F0F0F0Fu;
        uint hj = h >> (4u * j);
        vec4 hi = vec4(hj & 1u, (hj >> 1) & 1u, (hj >> 2) & 1u, (hj >> 3) & 1u) * 16.0;
        v[j] = dm.x * (bytes4(w) + hi) + dm.y;
    }
}

#elif defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// q4_k: [d, dmin f16][12 scale bytes][128 quant bytes]: 36 words.
// q5_k: [d, dmin f16][12 scale bytes][32 qh bytes][128 quant bytes]: 44 words.
// Chunk c (64 elements) uses sub-scales 2c (low nibbles) and 2c+1 (high).
#if defined(TYPE_Q4_K)
const uint BW = 36u;
const uint QS = 4u;
#else
const uint BW = 44u;
const uint QS = 12u;
#endif
// Scale and min of sub-block j (ggml get_scale_min_k4), already multiplied
// by d / dmin, from the block's first four words (d and dmin, then the 12
// scale bytes). Selects, not branches: j differs between the invocations.
vec2 k_scale_min_of(uvec4 hd, uint j) {
    vec2 dm = unpackHalf2x16(hd.x);
    uint sh = (j & 3u) * 8u;
    uint a = (hd.y >> sh) & 0xFFu;
    uint b = (hd.z >> sh) & 0xFFu;
    uint c = (hd.w >> sh) & 0xFFu;
    uint sc = j < 4u ? (a & 63u) : ((c & 0xFu) | ((a >> 6) << 4));
    uint mn = j < 4u ? (b & 63u) : ((c >> 4) | ((b >> 6) << 4));
    return vec2(dm.x * float(sc), dm.y * float(mn));
}
vec2 k_scale_min(uint base, uint j) {
    return k_scale_min_of(uvec4(wdata[base], wdata[base + 1u], wdata[base + 2u], wdata[base + 3u]), j);
}
float dq1(uint i) {
    uint base = (i >> 8) * BW;
    uint e = i & 255u;
    uint c = e >> 6;
    uint hi = (e >> 5) & 1u;
    uint l = e & 31u;
    uint q = (byte_at(base + QS, 32u * c + l) >> (4u * hi)) & 0xFu;
#if defined(TYPE_Q5_K)
    q |= ((byte_at(base + 4u, l) >> (2u * c + hi)) & 1u) << 4;
#endif
    vec2 sm = k_scale_min(base, 2u * c + hi);
    return sm.x * float(q) - sm.y;
}
vec4 dq4(uint i) {
    uint base = (i >> 8) * BW;
    uint e = i & 255u;
    uint c = e >> 6;
    uint hi = (e >> 5) & 1u;
    uint l = e & 31u;
    vec4 q = bytes4((wdata[base + QS + 8u * c + (l >> 2)] >> (4u * hi)) & 0x0F0F0F0Fu);
#if defined(TYPE_Q5_K)
    uint h = (wdata[base + 4u + (l >> 2)] >> (2u * c + hi)) & 0x01010101u;
    q += bytes4(h) * 16.0;
#endif
    vec2 sm = k_scale_min(base, 2u * c + hi);
    return sm.x * q - sm.y;
}
#define HAS_DQ16
void dq16(uint i, out vec4 v[4]) {
    uint base = (i >> 8) * BW;
    uint e = i & 255u;
    uint c = e >> 6;
    uint hi = (e >> 5) & 1u;
    uint l = e & 31u;
    vec2 sm = k_scale_min(base, 2u * c + hi);
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint w = (wdata[base + QS + 8u * c + (l >> 2) + j] >> (4u * hi)) & 0x0F0F0F0Fu;
#if defined(TYPE_Q5_K)
        w |= ((wdata[base + 4u + (l >> 2) + j] >> (2u * c + hi)) & 0x01010101u) << 4;
#endif
        v[j] = sm.x * bytes4(w) - sm.y;
    }
}
#if defined(WDATA4)
// dq16 as f16 pairs from 16-byte loads (144- and 176-byte blocks keep
// every run's words 16-byte aligned).
#define HAS_DQ16_HALF
void dq16_half(uint i, out uvec2 h[4]) {
    uint base = (i >> 8) * BW;
    uint e = i & 255u;
    uint c = e >> 6;
    uint hi = (e >> 5) & 1u;
    uint l = e & 31u;
    vec2 sm = k_scale_min_of(wdata4[base >> 2], 2u * c + hi);
    uvec4 q = (wdata4[(base + QS + 8u * c + (l >> 2)) >> 2] >> (4u * hi)) & 0x0F0F0F0Fu;
#if defined(TYPE_Q5_K)
    q |= ((wdata4[(base + 4u + (l >> 2)) >> 2] >> (2u * c + hi)) & 0x01010101u) << 4;
#endif
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        vec4 v = sm.x * bytes4(q[j]) - sm.y;
        h[j] = uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));
    }
}
#endif

#elif defined(TYPE_Q6_K)
// [128 ql bytes][64 qh bytes][16 i8 scales][d f16, pad]: 53 words.
// Half h (128 elements), quarter t (32): low 4 bits from ql[64h + 32(t&1) + l]
// (nibble t>>1), high 2 bits from qh[32h + l] bits 2t, scale sc[8h + l/16 + 2t].
float q6_scale(uint base, uint h, uint t, uint l) {
    int sc = bitfieldExtract(int(byte_at(base + 48u, 8u * h + (l >> 4) + 2u * t)), 0, 8);
    return unpackHalf2x16(wdata[base + 52u]).x * float(sc);
}
float dq1(uint i) {
    uint base = (i >> 8) * 53u;
    uint e = i & 255u;
    uint h = e >> 7;
    uint t = (e >> 5) & 3u;
    uint l = e & 31u;
    uint lo = (byte_at(base, 64u * h + 32u * (t & 1u) + l) >> (4u * (t >> 1))) & 0xFu;
    uint hi = (byte_at(base + 32u, 32u * h + l) >> (2u * t)) & 3u;
    return q6_scale(base, h, t, l) * (float(lo | (hi << 4)) - 32.0);
}
vec4 dq4(uint i) {
    uint base = (i >> 8) * 53u;
    uint e = i & 255u;
    uint h = e >> 7;
    uint t = (e >> 5) & 3u;
    uint l = e & 31u;
    uint lo = (wdata[base + 16u * h + 8u * (t & 1u) + (l >> 2)] >> (4u * (t >> 1))) & 0x0F0F0F0Fu;
    uint hi = (wdata[base + 32u + 8u * h + (l >> 2)] >> (2u * t)) & 0x03030303u;
    return q6_scale(base, h, t, l) * (bytes4(lo | (hi << 4)) - 32.0);
}
#define HAS_DQ16
void dq16(uint i, out vec4 v[4]) {
    uint base = (i >> 8) * 53u;
    uint e = i & 255u;
    uint h = e >> 7;
    uint t = (e >> 5) & 3u;
    uint l = e & 31u;
    float s = q6_scale(base, h, t, l);
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint lo = (wdata[base + 16u * h + 8u * (t & 1u) + (l >> 2) + j] >> (4u * (t >> 1))) & 0x0F0F0F0Fu;
        uint hi = (wdata[base + 32u + 8u * h + (l >> 2) + j] >> (2u * t)) & 0x03030303u;
        v[j] = s * (bytes4(lo | (hi << 4)) - 32.0);
    }
}

#elif defined(TYPE_Q2_K)
// [16 scale bytes][64 quant bytes][d, dmin f16]: 21 words. Element
// e = 128n + 32p + l is bit pair p of quant byte 32n + l; scale byte e/16
// holds its 4-bit scale (low) and min (high).
float dq1(uint i) {
    uint base = (i >> 8) * 21u;
    uint e = i & 255u;
    uint sc = byte_at(base, e >> 4);
    uint q = (byte_at(base + 4u, 32u * (e >> 7) + (e & 31u)) >> (2u * ((e >> 5) & 3u))) & 3u;
    vec2 dm = unpackHalf2x16(wdata[base + 20u]);
    return dm.x * float(sc & 0xFu) * float(q) - dm.y * float(sc >> 4);
}
vec4 dq4(uint i) {
    uint base = (i >> 8) * 21u;
    uint e = i & 255u;
    uint sc = byte_at(base, e >> 4);
    uint w = wdata[base + 4u + 8u * (e >> 7) + ((e & 31u) >> 2)];
    vec4 q = bytes4((w >> (2u * ((e >> 5) & 3u))) & 0x03030303u);
    vec2 dm = unpackHalf2x16(wdata[base + 20u]);
    return dm.x * float(sc & 0xFu) * q - dm.y * float(sc >> 4);
}

#elif defined(TYPE_Q3_K)
// [32 hmask bytes][64 quant bytes][12 scale bytes][d f16, pad]: 28 words.
// Element e = 128n + 32p + l: low bits are bit pair p of quant byte 32n + l,
// the high bit is bit 4n + p of hmask byte l (clear: subtract 4); its 6-bit
// scale j = e/16 has the low nibble of byte j (j < 8) or high of byte j - 8,
// and bits 2(j/4).. of byte 8 + j%4.
// The 6-bit scale j minus 32, without d.
float q3_scale_int(uint base, uint j) {
    uint lo = (byte_at(base + 24u, j & 7u) >> (4u * (j >> 3))) & 0xFu;
    uint hi = (byte_at(base + 26u, j & 3u) >> (2u * (j >> 2))) & 3u;
    return float(int(lo | (hi << 4)) - 32);
}
float q3_scale(uint base, uint j) {
    return unpackHalf2x16(wdata[base + 27u]).x * q3_scale_int(base, j);
}
float dq1(uint i) {
    uint base = (i >> 8) * 28u;
    uint e = i & 255u;
    uint p = (e >> 5) & 3u;
    uint l = e & 31u;
    uint q = (byte_at(base + 8u, 32u * (e >> 7) + l) >> (2u * p)) & 3u;
    uint h = (byte_at(base, l) >> (4u * (e >> 7) + p)) & 1u;
    return q3_scale(base, e >> 4) * (float(q) - 4.0 + 4.0 * float(h));
}
vec4 dq4(uint i) {
    uint base = (i >> 8) * 28u;
    uint e = i & 255u;
    uint p = (e >> 5) & 3u;
    uint l = e & 31u;
    uint q = (wdata[base + 8u + 8u * (e >> 7) + (l >> 2)] >> (2u * p)) & 0x03030303u;
    uint h = (wdata[base + (l >> 2)] >> (4u * (e >> 7) + p)) & 0x01010101u;
    return q3_scale(base, e >> 4) * (bytes4(q) - 4.0 + 4.0 * bytes4(h));
}

#elif defined(TYPE_IQ4_NL) || defined(TYPE_IQ4_XS)
// The 16 values a 4-bit index picks (ggml kvalues_iq4nl: -127, -104, -83,
// -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113) as lut16_bytes'
// table.
const uvec4 LUT16_TABLE = uvec4(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);
#if defined(TYPE_IQ4_NL)
// [d f16, pad][16 bytes of nibbles]: 5 words, nibbles as q4_0.
const uint BW = 5u;
const uint QK = 32u;
// The scale of 32-value sub-block b (the block's one).
float iq4_sub_scale(uint base, uint b) {
    return unpackHalf2x16(wdata[base]).x;
}
#else
// [d f16, scales_h u16][4 scales_l bytes][128 bytes of nibbles]: 34 words.
// Sub-block b = e/32 holds its nibbles as q4_0 in quant bytes 16b..16b+15,
// its scale is (nibble b of scales_l, bits 4b.. of word 1 | bits 2b..2b+1
// of scales_h << 4) - 32.
const uint BW = 34u;
const uint QK = 256u;
float iq4_sub_scale(uint base, uint b) {
    uint h = wdata[base];
    uint sc = ((wdata[base + 1u] >> (4u * b)) & 0xFu) | (((h >> (16u + 2u * b)) & 3u) << 4);
    return unpackHalf2x16(h).x * float(int(sc) - 32);
}
#endif
float iq4_scale(uint base, uint e) {
    return iq4_sub_scale(base, e >> 5);
}
// The quant word holding element e (and its 3 neighbours); their nibble
// sits at bit 4 * ((e / 16) % 2) of each byte.
uint iq4_word(uint base, uint e) {
    return wdata[base + BW - QK / 8u + 4u * (e >> 5) + ((e & 15u) >> 2)];
}
float dq1(uint i) {
    uint base = (i / QK) * BW;
    uint e = i % QK;
    uint w = iq4_word(base, e) >> (8u * (e & 3u) + 4u * ((e >> 4) & 1u));
    return iq4_scale(base, e) * lut16_bytes(LUT16_TABLE, w).x;
}
vec4 dq4(uint i) {
    uint base = (i / QK) * BW;
    uint e = i % QK;
    uint w = (iq4_word(base, e) >> (4u * ((e >> 4) & 1u))) & 0x0F0F0F0Fu;
    return iq4_scale(base, e) * lut16_bytes(LUT16_TABLE, w);
}

#elif defined(TYPE_TQ1_0)
// [48 qs bytes][4 qh bytes][d f16, pad]: 14 words. Trit n of a byte q is
// ((q * 3^n mod 256) * 3) >> 8. Elements 0..160 are trit e/32 of byte e%32,
// 160..240 trit (e-160)/16 of byte 32 + e%16, 240.. trit (e-240)/4 of byte
// 48 + e%4: four consecutive elements share a word and a trit.
uvec2 tq1_word_trit(uint base, uint e) {
    if (e < 160u) {
        return uvec2(wdata[base + ((e & 31u) >> 2)], e >> 5);
    } else if (e < 240u) {
        return uvec2(wdata[base + 8u + ((e & 15u) >> 2)], (e - 160u) >> 4);
    }
    return uvec2(wdata[base + 12u], (e - 240u) >> 2);
}
float tq1_d(uint base) {
    return unpackHalf2x16(wdata[base + 13u]).x;
}
uint tq1_pow3(uint n) {
    return n == 0u ? 1u : n == 1u ? 3u : n == 2u ? 9u : n == 3u ? 27u : 81u;
}
// Trit n of each of the four bytes of w, as t + 1 in the same byte. The
// bytes go two at a time, 16 bits apart, so every product (at most
// 255 · 81, then 255 · 3) stays inside its half-word.
uint tq1_trits4(uint w, uint n) {
    uint p = tq1_pow3(n);
    uint e = ((w & 0x00FF00FFu) * p) & 0x00FF00FFu;
    uint o = (((w >> 8) & 0x00FF00FFu) * p) & 0x00FF00FFu;
    return (((e * 3u) >> 8) & 0x00030003u) | ((((o * 3u) >> 8) & 0x00030003u) << 8);
}
float dq1(uint i) {
    uint base = (i >> 8) * 14u;
    uint e = i & 255u;
    uvec2 wt = tq1_word_trit(base, e);
    uint q = (wt.x >> (8u * (e & 3u))) & 0xFFu;
    uint t = (((q * tq1_pow3(wt.y)) & 0xFFu) * 3u) >> 8;
    return (float(t) - 1.0) * tq1_d(base);
}
vec4 dq4(uint i) {
    uint base = (i >> 8) * 14u;
    uint e = i & 255u;
    uvec2 wt = tq1_word_trit(base, e);
    uvec4 q = uvec4(wt.x, wt.x >> 8, wt.x >> 16, wt.x >> 24) & 0xFFu;
    uvec4 t = (((q * tq1_pow3(wt.y)) & 0xFFu) * 3u) >> 8;
    return (vec4(t) - 1.0) * tq1_d(base);
}

#elif defined(TYPE_TQ2_0)
// [64 qs bytes][d f16, pad]: 17 words. Element e = 128c + 32p + l is bit
// pair p of byte 32c + l, holding t + 1.
float dq1(uint i) {
    uint base = (i >> 8) * 17u;
    uint e = i & 255u;
    uint q = (byte_at(base, 32u * (e >> 7) + (e & 31u)) >> (2u * ((e >> 5) & 3u))) & 3u;
    return (float(q) - 1.0) * unpackHalf2x16(wdata[base + 16u]).x;
}
vec4 dq4(uint i) {
    uint base = (i >> 8) * 17u;
    uint e = i & 255u;
    uint w = wdata[base + 8u * (e >> 7) + ((e & 31u) >> 2)];
    vec4 q = bytes4((w >> (2u * ((e >> 5) & 3u))) & 0x03030303u);
    return (q - 1.0) * unpackHalf2x16(wdata[base + 16u]).x;
}

#elif defined(TYPE_MXFP4)
// [e u8, 3 pad bytes][16 bytes of nibbles]: 5 words, nibbles as q4_0. The
// e2m1 values are stored doubled (ggml kvalues_mxfp4), the scale halved:
// 2^(e - 128), built from its bits (subnormal for e < 2). The values (0, 1,
// 2, 3, 4, 6, 8, 12 and their negatives) as lut16_bytes' table.
const uvec4 LUT16_TABLE = uvec4(0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu);
float mxfp4_d(uint base) {
    uint e = wdata[base] & 0xFFu;
    return uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}
float dq1(uint i) {
    uint base = (i >> 5) * 5u;
    uint e = i & 31u;
    uint q = (byte_at(base + 1u, e & 15u) >> ((e >> 4) * 4u)) & 0xFu;
    return lut16_bytes(LUT16_TABLE, q).x * mxfp4_d(base);
}
vec4 dq4(uint i) {
    uint base = (i >> 5) * 5u;
    uint e = i & 31u;
    uint w = (wdata[base + 1u + ((e & 15u) >> 2)] >> ((e >> 4) * 4u)) & 0x0F0F0F0Fu;
    return lut16_bytes(LUT16_TABLE, w) * mxfp4_d(base);
}

#elif defined(TYPE_IQ2_XXS) || defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S) || defined(TYPE_IQ3_XXS) || defined(TYPE_IQ3_S)
// The 2- and 3-bit i-quants (quants/iq23.rs): the type's grid (GW words,
// quants/iq_grids.rs; read from here, not const arrays, which lavapipe's
// LLVM took minutes to compile), then blocks of [d f16, pad][the rest of
// the GGUF block]. Each 32-value sub-block has a scale db; each group of 8
// values takes its magnitudes from a grid entry (bytes; an IQ2 entry is 8,
// two words, an IQ3 entry 4, one word) and its signs from 8 bits.
#if defined(TYPE_IQ2_XXS)
const uint GW = 512u;
const uint BW = 17u;
#elif defined(TYPE_IQ2_XS)
const uint GW = 1024u;
const uint BW = 19u;
#elif defined(TYPE_IQ2_S)
const uint GW = 2048u;
const uint BW = 21u;
#elif defined(TYPE_IQ3_XXS)
const uint GW = 256u;
const uint BW = 25u;
#else
const uint GW = 512u;
const uint BW = 28u;
#endif
// ggml's ksigns_iq2xs: a 7-bit sign index with bit 7 for even parity.
uint iq_ksigns(uint s) {
    s &= 0x7Fu;
    return s | ((bitCount(s) & 1u) << 7);
}
// The grid, from the weight buffer or (IQ_GRID_SHARED: the including
// shader copies wdata[0..GW) into it first) from shared memory.
#if defined(IQ_GRID_SHARED)
shared uint iq_grid_sh[GW];
#define IQ_GRID(i) iq_grid_sh[i]
#else
#define IQ_GRID(i) wdata[i]
#endif
// Group l (8 values) of sub-block ib of the block at word base: its scale
// db (d included), word h of its grid entry (values 4h..4h+3, one per
// byte) and its 8 sign bits (set: negative).
float iq_db(uint base, uint ib, uint l) {
    float d = unpackHalf2x16(wdata[base]).x;
#if defined(TYPE_IQ2_XXS)
    return d * (0.5 + float(wdata[base + 2u + 2u * ib] >> 28)) * 0.25;
#elif defined(TYPE_IQ2_XS)
    // 4-bit scales from byte 68, one per 16 values.
    return d * (0.5 + float((byte_at(base + 17u, ib) >> (4u * (l >> 1))) & 0xFu)) * 0.25;
#elif defined(TYPE_IQ2_S)
    // Scales at byte 76, as IQ2_XS's.
    return d * (0.5 + float((byte_at(base + 19u, ib) >> (4u * (l >> 1))) & 0xFu)) * 0.25;
#elif defined(TYPE_IQ3_XXS)
    return d * (0.5 + float(wdata[base + 17u + ib] >> 28)) * 0.5;
#else
    // 4-bit scales at byte 108: db = d * (1 + 2 s).
    return d * float(1u + 2u * ((byte_at(base + 27u, ib >> 1) >> (4u * (ib & 1u))) & 0xFu));
#endif
}
uint iq_grid_word(uint base, uint ib, uint l, uint h) {
#if defined(TYPE_IQ2_XXS)
    // Per sub-block: four 8-bit grid indices, then four 7-bit sign indices and the scale.
    return IQ_GRID(2u * ((wdata[base + 1u + 2u * ib] >> (8u * l)) & 0xFFu) + h);
#elif defined(TYPE_IQ2_XS)
    // u16 per group: 9-bit grid index, 7-bit sign index.
    uint q = wdata[base + 1u + 2u * ib + (l >> 1)] >> (16u * (l & 1u));
    return IQ_GRID(2u * (q & 511u) + h);
#elif defined(TYPE_IQ2_S)
    // qs at byte 4, qh (the index's bits 8..9) at 68.
    uint q = byte_at(base + 1u, 4u * ib + l) | (((byte_at(base + 17u, ib) >> (2u * l)) & 3u) << 8);
    return IQ_GRID(2u * q + h);
#elif defined(TYPE_IQ3_XXS)
    // qs (one index per half group) at byte 4.
    return IQ_GRID(byte_at(base + 1u, 8u * ib + 2u * l + h));
#else
    // qs at byte 4, qh at 68 (bit 2l + h: the index's ninth bit).
    uint hi = (byte_at(base + 17u, ib) >> (2u * l + h)) & 1u;
    return IQ_GRID(byte_at(base + 1u, 8u * ib + 2u * l + h) | (hi << 8));
#endif
}
uint iq_signs(uint base, uint ib, uint l) {
#if defined(TYPE_IQ2_XXS)
    return iq_ksigns(wdata[base + 2u + 2u * ib] >> (7u * l));
#elif defined(TYPE_IQ2_XS)
    return iq_ksigns(wdata[base + 1u + 2u * ib + (l >> 1)] >> (16u * (l & 1u) + 9u));
#elif defined(TYPE_IQ2_S)
    // Sign bytes at 36.
    return byte_at(base + 9u, 4u * ib + l);
#elif defined(TYPE_IQ3_XXS)
    // Signs as IQ2_XXS's, beside the scale at byte 68.
    return iq_ksigns(wdata[base + 17u + ib] >> (7u * l));
#else
    // Sign bytes at 76.
    return byte_at(base + 19u, 4u * ib + l);
#endif
}
// The four grid bytes of w times db, negated where sign bits s (the low 4)
// are set: the bits go straight into the floats' sign bits.
vec4 iq_values4(uint w, uint s, float db) {
    uvec4 neg = uvec4(s << 31, s << 30, s << 29, s << 28) & 0x80000000u;
    return uintBitsToFloat(floatBitsToUint(db * bytes4(w)) ^ neg);
}
// dq4 reads half a group: word h = (e / 4) % 2 of the entry, sign bits 4h..4h+3.
vec4 dq4(uint i) {
    uint base = GW + (i >> 8) * BW;
    uint e = i & 255u;
    uint ib = e >> 5;
    uint l = (e >> 3) & 3u;
    uint h = (e >> 2) & 1u;
    return iq_values4(iq_grid_word(base, ib, l, h), iq_signs(base, ib, l) >> (4u * h),
                      iq_db(base, ib, l));
}
// dq16: groups l and l + 1 (l even) of one sub-block, which share a scale
// (IQ2_XS and IQ2_S scale 16 values), decoded once for the four words.
#define HAS_DQ16
void dq16(uint i, out vec4 v[4]) {
    uint base = GW + (i >> 8) * BW;
    uint e = i & 255u;
    uint ib = e >> 5;
    uint l0 = (e >> 3) & 2u;
    float db = iq_db(base, ib, l0);
    [[unroll]] for (uint g = 0u; g < 2u; g++) {
        uint s = iq_signs(base, ib, l0 + g);
        [[unroll]] for (uint h = 0u; h < 2u; h++) {
            v[2u * g + h] = iq_values4(iq_grid_word(base, ib, l0 + g, h), s >> (4u * h), db);
        }
    }
}
float dq1(uint i) {
    return dq4(i & ~3u)[i & 3u];
}

#else
#error "compile with one -DTYPE_<dtype>"
#endif

#if !defined(HAS_DQ16)
void dq16(uint i, out vec4 v[4]) {
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        v[j] = dq4(i + 4u * j);
    }
}
#endif

#if !defined(HAS_DQ16_HALF)
void dq16_half(uint i, out uvec2 h[4]) {
    vec4 v[4];
    dq16(i, v);
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        h[j] = uvec2(packHalf2x16(v[j].xy), packHalf2x16(v[j].zw));
    }
}
#endif
