// x as two int8 digits per value for the integer-dot GEMV (mul_mat_vec.comp
// built with Q8X): per block of 32, d = max|x| / 127, hi = round(x / d) and
// lo = round((x / d - hi) · 254), so x ≈ d · (hi + lo / 254) within
// max|x| / 64516: as close as the CPU's 16-bit activations (one int8 digit
// alone, as llama.cpp's q8_1, moves SmolLM2's logits by 3e-2). Per block
// also (d, Σ of the rounded values) for the weights' offset terms. With
// `norm` the RMS-norm weights multiply x first, and each workgroup stores
// the Σx² of its share of the row (x as given) for the GEMV to finish the
// norm (without it those words are left unwritten, and the GEMV skips them).
//
// One invocation per 4 values, 8 to a block, workgroups of 1024 values
// across the row (y: the row): a dispatch on the decode path's critical
// path, so its chain per invocation is one load, a few subgroup shuffles
// and one store; one workgroup walking the row serially took a fifth of an
// 8B decode step (benches/README.md, decode GEMV).
//
// Row r of the output, `stride` words from the previous one: k/4 words of
// packed hi digits, k/4 of lo digits (each in 16-byte pieces ordered as
// q8.glsl's q8_at says), k/32 (d, Σ) pairs, then Σx² of each
// workgroup's 1024 values (q8_parts in vk/ops/matmul.rs).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer X { vec4 x4[]; };
layout(binding = 1) readonly buffer NW { vec4 nw4[]; };

layout(push_constant) uniform Push {
    uint k;
    uint m;
    uint norm;
    uint stride;
} pc;

#include "reduce.glsl"
#define Q8_OUT_BINDING 2
#include "q8.glsl"

void main() {
    uint r = gl_WorkGroupID.y;
    uint u = gl_WorkGroupID.x * 256u + q8_unit_index(); // this invocation's 4 values
    bool live = u < pc.k / 4u;
    uint base = r * pc.stride;
    vec4 v = live ? x4[r * (pc.k / 4u) + u] : vec4(0.0);
    vec4 g = live && pc.norm != 0u ? nw4[u] : vec4(1.0);
    float ss = dot(v, v);
    Q8Unit dg = q8_unit(v * g); // every lane: a block is live or not as a whole
    if (live) {
        q8_store(base, pc.k, u, dg);
    }
    // Only a folded norm reads Σx² (pc.norm is uniform, so the
    // workgroup-wide sum stays in uniform control flow).
    if (pc.norm != 0u) {
        float total = wg_sum(ss);
        if (gl_LocalInvocationIndex == 0u) {
            q8_floats[base + pc.k / 2u + pc.k / 16u + gl_WorkGroupID.x] = total;
        }
    }
}
