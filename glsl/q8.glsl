// x as two int8 digits per value, as mul_mat_vec.comp's Q8X variant reads it
// (quantize_q8.comp says why and lays out the row). quantize_q8.comp,
// attention_decode.comp, attention_combine.comp and mul_mat_vec.comp's
// Q8OUT all write them through q8_unit, and `precise` keeps a compiler from
// reassociating the arithmetic differently in each (lavapipe did: Σ moved
// by an ulp), so they agree bit for bit. An includer enables
// GL_KHR_shader_subgroup_shuffle and, to store digits with q8_store,
// defines Q8_OUT_BINDING (the destination's binding).

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

// This invocation's place among a workgroup's q8 units: numbered by
// subgroup lane, so the 8 units of a block are 8 lanes of one subgroup
// (subgroups of at least 8, vk/caps.rs) whatever the driver's lane order.
uint q8_unit_index() {
    return gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
}

// Unit v's digits and its block's (d, Σ) (the same in all 8 lanes).
struct Q8Unit {
    uint hi;
    uint lo;
    vec2 block;
};

// Called by the 8 lanes of a block (q8_unit_index() / 8 alike), all active:
// the block's |x| max and digit sum go round them by xor shuffles, exact
// whatever the order (a max and an integer sum), so no shared memory or
// barrier is needed.
Q8Unit q8_unit(vec4 v) {
    vec4 a = abs(v);
    float amax = max(max(a.x, a.y), max(a.z, a.w));
    [[unroll]] for (uint m = 1u; m < 8u; m <<= 1u) {
        amax = max(amax, subgroupShuffleXor(amax, m));
    }
    float d = q8_scale(amax);
    Q8Unit q;
    int digits;
    q8_encode(v, d, q.hi, q.lo, digits);
    [[unroll]] for (uint m = 1u; m < 8u; m <<= 1u) {
        digits += subgroupShuffleXor(digits, m);
    }
    q.block = q8_block(d, digits);
    return q;
}

// Where a row of k values keeps uvec4 j (16 values) of its hi (or lo)
// digits, counted in uvec4s from the start of those digits: the four
// uvec4s of each 64 values are spread over four runs, uvec4 p of every 64
// values in run p, so GEMV lanes that each take 64 (or 32) consecutive
// values read consecutive 16 bytes (in row order they were 64 (32) bytes
// apart, four (two) times the cache lines or shared-memory banks per load).
// A tail of k % 64 = 32 values stays in row order.
uint q8_run(uint grp, uint piece, uint k) {
    uint g = k / 64u;
    return grp < g ? piece * g + grp : 4u * grp + piece;
}

uint q8_at(uint j, uint k) {
    return q8_run(j >> 2, j & 3u, k);
}

#if defined(Q8_OUT_BINDING)
layout(binding = Q8_OUT_BINDING) writeonly buffer Q8Words { uint q8_words[]; };
layout(binding = Q8_OUT_BINDING) writeonly buffer Q8Floats { float q8_floats[]; };

// Unit u of the row of k values that starts at word `row`: hi digits in
// the first k/4 words, lo digits in the next k/4 (each as q8_at places
// uvec4 u/4) and, from the block's first unit, its (d, Σ) at k/2 + 2·(u/8).
void q8_store(uint row, uint k, uint u, Q8Unit dg) {
    uint w = 4u * q8_at(u / 4u, k) + u % 4u;
    q8_words[row + w] = dg.hi;
    q8_words[row + k / 4u + w] = dg.lo;
    if (u % 8u == 0u) {
        uint at = row + k / 2u + 2u * (u / 8u);
        q8_floats[at] = dg.block.x;
        q8_floats[at + 1u] = dg.block.y;
    }
}
#endif
