// Merge the key splits of attention_decode.comp: one workgroup per (head,
// row). Each split s carries its running max m_s, sum l_s and unnormalized
// output a_s; the result is sum_s w_s a_s / sum_s w_s l_s with
// w_s = e^(m_s - M), M = max m_s. Only the splits that hold keys are read
// (the same split as the main kernel, from positions). The weights are
// computed once, one split per invocation, with workgroup reductions (the
// old combine looped over all 64 splits three times per invocation, with an
// exp() per split and dim); then each invocation sums its output dims, reads
// coalesced across dims.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in; // at least the most splits (vk/ops/attention.rs)

layout(binding = 0) readonly buffer Part { float part[]; };
layout(binding = 1) writeonly buffer Out { float o[]; };
layout(binding = 2) readonly buffer Pos { uint pos[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint head_dim;
    uint n_split;
    uint capacity;
    uint window;
} pc;

#include "reduce.glsl"
#include "attention_split.glsl"

shared float ws[64];

void main() {
    uint h = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    uint hd = pc.head_dim;
    uint stride = hd + 2u;
    uint base = (r * pc.n_heads + h) * pc.n_split * stride;
    uint na = decode_span(pos[r], pc.capacity, pc.window, pc.n_split).n_active;
    bool mine = t < na;
    float ms = mine ? part[base + t * stride] : -1.0 / 0.0;
    float big = wg_max(ms);
    float w = mine ? exp(ms - big) : 0.0;
    ws[t] = w;
    float l = wg_sum(mine ? w * part[base + t * stride + 1u] : 0.0);
    barrier(); // ws visible (wg_sum's barriers precede its read only)
    float inv = l > 0.0 ? 1.0 / l : 0.0;
    for (uint d = t; d < hd; d += gl_WorkGroupSize.x) {
        float a = 0.0;
        for (uint s = 0u; s < na; s++) {
            a += ws[s] * part[base + s * stride + 2u + d];
        }
        o[(r * pc.n_heads + h) * hd + d] = a * inv;
    }
}
