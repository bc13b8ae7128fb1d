// x as two int8 digits per value for the integer-dot GEMV (mul_mat_vec.comp
// built with Q8X): per block of 32, d = max|x| / 127, hi = round(x / d) and
// lo = round((x / d - hi) · 254), so x ≈ d · (hi + lo / 254) within
// max|x| / 64516: as close as the CPU's 16-bit activations (one int8 digit
// alone, as llama.cpp's q8_1, moves SmolLM2's logits by 3e-2). Per block
// also (d, Σ of the rounded values) for the weights' offset terms. With
// `norm` the RMS-norm weights multiply x first, and the row's Σx² (of x as
// given) is stored for the GEMV to finish the norm with.
//
// Row r of the output, `stride` words from the previous one: k/4 words of
// packed hi digits, k/4 of lo digits, k/32 (d, Σ) pairs, Σx².
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer X { vec4 x4[]; };
layout(binding = 1) readonly buffer NW { vec4 nw4[]; };
layout(binding = 2) writeonly buffer Q { uint q[]; };
layout(binding = 2) writeonly buffer QF { float qf[]; };

layout(push_constant) uniform Push {
    uint k;
    uint m;
    uint norm;
    uint stride;
} pc;

#include "reduce.glsl"

// Halves away from zero, as Rust's f32::round and ggml's roundf.
vec4 round_away(vec4 v) {
    return sign(v) * floor(abs(v) + 0.5);
}

uint pack(ivec4 q) {
    uvec4 u = uvec4(q) & 0xFFu;
    return u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
}

void main() {
    uint r = wg_linear();
    if (r >= pc.m) {
        return;
    }
    uint base = r * pc.stride;
    uint nb = pc.k / 32u;
    float ss = 0.0;
    for (uint b = gl_LocalInvocationID.x; b < nb; b += gl_WorkGroupSize.x) {
        vec4 v[8];
        float amax = 0.0;
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            v[i] = x4[(r * pc.k + 32u * b) / 4u + i];
            ss += dot(v[i], v[i]);
            if (pc.norm != 0u) {
                v[i] *= nw4[8u * b + i];
            }
            vec4 a = abs(v[i]);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        float d = amax / 127.0;
        float id = d > 0.0 ? 1.0 / d : 0.0;
        ivec4 sum_hi = ivec4(0);
        ivec4 sum_lo = ivec4(0);
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            vec4 s = v[i] * id;
            ivec4 hi = ivec4(round_away(s));
            ivec4 lo = ivec4(round_away((s - vec4(hi)) * 254.0));
            sum_hi += hi;
            sum_lo += lo;
            q[base + 8u * b + i] = pack(hi);
            q[base + pc.k / 4u + 8u * b + i] = pack(lo);
        }
        uint ds = base + pc.k / 2u + 2u * b;
        qf[ds] = d;
        ivec4 t = sum_hi * 254 + sum_lo;
        qf[ds + 1u] = d * float(t.x + t.y + t.z + t.w) / 254.0;
    }
    float total = wg_sum(ss);
    if (gl_LocalInvocationIndex == 0u) {
        qf[base + pc.k / 2u + pc.k / 16u] = total;
    }
}
