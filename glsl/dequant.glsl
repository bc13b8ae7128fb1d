// Weight dequantization, one TYPE_* defined per compiled variant.
//
// The including shader declares `wdata`, the weight as 32-bit words in the
// layout `vk/layout.rs` repacks GGUF blocks into: every block padded to whole
// words, with the 2-byte scale of q8_0/q4_0/q5_0 followed by 2 pad bytes so
// the quants start word-aligned, and q6_k padded from 210 to 212 bytes.
//
// dq1(i): element i of the flattened [rows, cols] weight.
// dq4(i): elements i..i+3; i % 4 == 0 and all four in one row.

uint byte_at(uint word_base, uint b) {
    return (wdata[word_base + (b >> 2)] >> ((b & 3u) * 8u)) & 0xFFu;
}

vec4 bytes4(uint w) {
    return vec4(w & 0xFFu, (w >> 8) & 0xFFu, (w >> 16) & 0xFFu, w >> 24);
}

#if defined(TYPE_F32)
float dq1(uint i) { return uintBitsToFloat(wdata[i]); }
vec4 dq4(uint i) {
    return vec4(uintBitsToFloat(wdata[i]), uintBitsToFloat(wdata[i + 1]),
                uintBitsToFloat(wdata[i + 2]), uintBitsToFloat(wdata[i + 3]));
}

#elif defined(TYPE_F16)
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
// Scale and min of sub-block j (ggml get_scale_min_k4), already multiplied by d / dmin.
vec2 k_scale_min(uint base, uint j) {
    vec2 dm = unpackHalf2x16(wdata[base]);
    uint sc;
    uint mn;
    if (j < 4u) {
        sc = byte_at(base + 1u, j) & 63u;
        mn = byte_at(base + 1u, j + 4u) & 63u;
    } else {
        sc = (byte_at(base + 1u, j + 4u) & 0xFu) | ((byte_at(base + 1u, j - 4u) >> 6) << 4);
        mn = (byte_at(base + 1u, j + 4u) >> 4) | ((byte_at(base + 1u, j) >> 6) << 4);
    }
    return vec2(dm.x * float(sc), dm.y * float(mn));
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

#else
#error "compile with one -DTYPE_<dtype>"
#endif
