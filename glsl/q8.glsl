// x as two int8 digits per value, as mul_mat_vec.comp's Q8X variant reads it
// (quantize_q8.comp says why and lays out the row); attention_combine.comp
// writes the same digits for its output. Both go through these functions,
// and `precise` keeps a compiler from reassociating them differently in the
// two shaders (lavapipe did: Σ moved by an ulp), so the two agree bit for
// bit.

// Halves away from zero, as Rust's f32::round and ggml's roundf.
vec4 round_away(vec4 v) {
    return sign(v) * floor(abs(v) + 0.5);
}

uint pack(ivec4 q) {
    uvec4 u = uvec4(q) & 0xFFu;
    return u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
}

// The block scale d for a block whose largest |x| is amax.
float q8_scale(float amax) {
    precise float d = amax / 127.0;
    return d;
}

// Four values of a block of scale d as packed hi and lo digits
// (x ≈ d · (hi + lo / 254)); `digits` adds up hi · 254 + lo of the four.
void q8_encode(vec4 v, float d, out uint hi_word, out uint lo_word, out int digits) {
    precise float id = d > 0.0 ? 1.0 / d : 0.0;
    precise vec4 s = v * id;
    ivec4 hi = ivec4(round_away(s));
    precise vec4 rest = (s - vec4(hi)) * 254.0;
    ivec4 lo = ivec4(round_away(rest));
    ivec4 dg = hi * 254 + lo;
    hi_word = pack(hi);
    lo_word = pack(lo);
    digits = dg.x + dg.y + dg.z + dg.w;
}

// The block's (d, Σ) pair: d and d times the sum of its values' digits / 254.
vec2 q8_block(float d, int digit_sum) {
    precise float sigma = d * float(digit_sum) / 254.0;
    return vec2(d, sigma);
}
