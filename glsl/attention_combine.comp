// Merge the key splits of attention_decode.comp: one workgroup per (head,
// slice of DS output dims, row). Each split s carries its running max m_s,
// sum l_s and unnormalized output a_s; the result is
// sum_s w_s a_s / sum_s w_s l_s with w_s = e^(m_s - M), M = max m_s. Only
// the splits that hold keys are read (the same split as the main kernel,
// from positions). The weights are computed once per workgroup, a split per
// invocation, with workgroup reductions; then the DS dims' sums are dealt
// out to WG / DS invocation groups of splits, each invocation keeping 8
// reads in flight, and the groups meet in shared memory: a long context
// splits SmolLM2's keys ~128 ways, and one workgroup per head walking them
// took as long as the attention it merged. Loads whose addresses are known
// go out before the reductions, one memory round trip instead of three
// (benches/README.md, decode attention).
// With min_chunk > 0 the splits are the prefill kernel's chunks
// (attention_split.glsl), those the row's range meets; a row within one
// chunk was written by the prefill kernel itself.
//
// SINKS (specialization constant 1): sinks[h] joins head h's denominator
// here, once, not in any split: l = sum_s w_s l_s + e^(sink - M).
//
// With q8_stride > 0 (decode, head_dim a multiple of 32, DS = 32: a
// workgroup's dims are one block) the output also goes into binding 3 as
// quantize_q8.comp would write it, rows q8_stride words apart (no Σx² words:
// the o projection reading it folds no norm), so that projection's quantize
// dispatch, and its barrier, disappear.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"

layout(local_size_x = 128) in;
const uint WG = 128u;
// Output dims per workgroup: 16 (vk/ops/attention.rs COMBINE_DIMS), 32 (one
// q8 block) with q8_stride > 0. 32 for every merge was slower: half the
// workgroups, half the reads in flight (benches/README.md, decode attention).
layout(constant_id = 0) const uint DS = 16u;
layout(constant_id = 1) const uint SINKS_SPEC = 0u;
const bool SINKS = SINKS_SPEC != 0u;
const uint SG = WG / DS; // split groups
const uint IN_FLIGHT = 8u;
const uint MAX_SPLITS = 256u; // vk/ops/attention.rs MAX_SPLITS

layout(binding = 0) readonly buffer Part { float part[]; };
layout(binding = 1) writeonly buffer Out { float o[]; };
layout(binding = 2) readonly buffer Pos { uint pos[]; };
// SINKS: a logit per query head.
layout(binding = 4) readonly buffer Sinks { float sinks[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint head_dim;
    uint n_split;
    uint capacity;
    uint window;
    uint min_chunk;
    uint q8_stride;
} pc;

#include "reduce.glsl"
#include "attention_split.glsl"
#define Q8_OUT_BINDING 3
#include "q8.glsl"

shared float ws[MAX_SPLITS];
shared float sums[WG];
// q8: the block's values.
shared vec4 outs[DS / 4u];

void main() {
    uint hd = pc.head_dim;
    uint slices = (hd + DS - 1u) / DS;
    uint h = gl_WorkGroupID.x / slices;
    uint d0 = (gl_WorkGroupID.x - h * slices) * DS;
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    uint stride = hd + 2u;
    uint base = (r * pc.n_heads + h) * pc.n_split * stride;
    uint na;
    if (pc.min_chunk > 0u) {
        Span sp = decode_span(pos[r], pc.capacity, pc.window, 1u);
        uint len = prefill_chunk_len(pos[pc.rows - 1u], pc.capacity, pc.n_split, pc.min_chunk);
        uint first = prefill_chunk_of(sp.start, len, pc.n_split);
        uint last = sp.end > sp.start ? prefill_chunk_of(sp.end - 1u, len, pc.n_split) : first;
        if (first == last) {
            return; // uniform per workgroup: the prefill kernel wrote this row
        }
        base += first * stride;
        na = last + 1u - first;
    } else {
        na = decode_span(pos[r], pc.capacity, pc.window, pc.n_split).n_active;
    }
    // Every load whose address is known goes out first: this invocation's
    // first IN_FLIGHT partial outputs and its split's (max, sum), so their
    // round trips overlap one another and the reductions, instead of
    // following them one after another.
    uint g = t / DS;
    uint d = d0 + t - g * DS;
    float first[IN_FLIGHT];
    [[unroll]] for (uint j = 0u; j < IN_FLIGHT; j++) {
        uint sj = g + j * SG;
        first[j] = d < hd && sj < na ? part[base + sj * stride + 2u + d] : 0.0;
    }
    float m0 = t < na ? part[base + t * stride] : -1.0 / 0.0;
    float l0 = t < na ? part[base + t * stride + 1u] : 0.0;
    float mx = m0;
    for (uint s = t + WG; s < na; s += WG) {
        mx = max(mx, part[base + s * stride]);
    }
    float big = wg_max(mx);
    float ls = 0.0;
    if (t < na) {
        float w = exp(m0 - big);
        ws[t] = w;
        ls += w * l0;
    }
    for (uint s = t + WG; s < na; s += WG) {
        float w = exp(part[base + s * stride] - big);
        ws[s] = w;
        ls += w * part[base + s * stride + 1u];
    }
    float l = wg_sum(ls);
    if (SINKS && big != -1.0 / 0.0) {
        l += exp(sinks[h] - big);
    }
    barrier(); // ws visible (wg_sum's barriers precede its read only)
    float a = 0.0;
    if (d < hd) {
        {
            float v[IN_FLIGHT];
            [[unroll]] for (uint j = 0u; j < IN_FLIGHT; j++) {
                uint sj = g + j * SG;
                v[j] = sj < na ? ws[sj] * first[j] : 0.0;
            }
            [[unroll]] for (uint j = 1u; j < IN_FLIGHT; j++) {
                v[0] += v[j];
            }
            a += v[0];
        }
        for (uint s = g + IN_FLIGHT * SG; s < na; s += IN_FLIGHT * SG) {
            float v[IN_FLIGHT];
            [[unroll]] for (uint j = 0u; j < IN_FLIGHT; j++) {
                uint sj = s + j * SG;
                v[j] = sj < na ? ws[sj] * part[base + sj * stride + 2u + d] : 0.0;
            }
            [[unroll]] for (uint j = 1u; j < IN_FLIGHT; j++) {
                v[0] += v[j];
            }
            a += v[0];
        }
    }
    sums[t] = a;
    barrier();
    float val = 0.0;
    if (t < DS && d < hd) {
        float total = 0.0;
        [[unroll]] for (uint k = 0u; k < SG; k++) {
            total += sums[k * DS + t];
        }
        val = total * (l > 0.0 ? 1.0 / l : 0.0);
        o[(r * pc.n_heads + h) * hd + d] = val;
    }
    if (pc.q8_stride == 0u) {
        return; // uniform
    }
    if (t < DS) {
        outs[t / 4u][t % 4u] = val;
    }
    barrier();
    uint qu = q8_unit_index();
    if (qu < DS / 4u) {
        uint u = (h * hd + d0) / 4u + qu; // this invocation's 4 values in the row
        q8_store(r * pc.q8_stride, pc.n_heads * hd, u, q8_unit(outs[qu]));
    }
}
