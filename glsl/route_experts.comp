// Mixture-of-experts routing (vk/ops/route_experts.rs): one workgroup per
// row of `experts` router logits (up to MAX_EXPERTS) takes the k largest in
// order, the lower expert first on equal logits and a NaN only after every
// number (as cpu/route_experts.rs sorts them), one round per pick; then
// their weights: the softmax over the k chosen (`renorm`) or over every
// expert, at the chosen ones.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

const uint WG = 64u;
layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer L { float logits[]; };
layout(binding = 1) writeonly buffer Ids { uint ids[]; };
layout(binding = 2) writeonly buffer W { float weights[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint experts;
    uint k;
    uint renorm;
} pc;

// The host keeps experts and k within these.
const uint MAX_EXPERTS = 256u;
const uint MAX_K = 16u;
// Logits per invocation: experts t, t + WG, ...
const uint PER = MAX_EXPERTS / WG;

// Each subgroup's best (key, expert) of a round, two rounds' worth so one
// barrier a round separates writes from reads; each subgroup's Σexp.
shared uint sg_key[2][WG];
shared uint sg_idx[2][WG];
shared float sg_sum[WG];
shared uint chosen[MAX_K];

// A logit's rank, larger first: a number by the total order of its bits
// (f32::total_cmp's, -0 below +0), a NaN (1) below every number, and 0 for
// an expert taken or past the row.
uint order_key(float v) {
    if (isnan(v)) {
        return 1u;
    }
    uint b = floatBitsToUint(v);
    return (b & 0x80000000u) != 0u ? ~b : b | 0x80000000u;
}

// The better of two (key, expert) candidates: the larger key, on equal keys
// the lower expert.
bool better(uint key, uint idx, uint best_key, uint best_idx) {
    return key > best_key || (key == best_key && idx < best_idx);
}

void main() {
    uint row = wg_linear();
    if (row >= pc.rows) {
        return;
    }
    uint t = gl_LocalInvocationIndex;
    uint base = row * pc.experts;
    float v[PER];
    uint key[PER];
    [[unroll]] for (uint i = 0u; i < PER; i++) {
        uint e = t + i * WG;
        v[i] = e < pc.experts ? logits[base + e] : 0.0;
        key[i] = e < pc.experts ? order_key(v[i]) : 0u;
    }
    for (uint j = 0u; j < pc.k; j++) {
        // This invocation's best: its experts ascend with i, so the strict
        // comparison keeps the lower one on ties.
        uint bk = 0u;
        uint bi = 0xFFFFFFFFu;
        [[unroll]] for (uint i = 0u; i < PER; i++) {
            if (key[i] > bk) {
                bk = key[i];
                bi = t + i * WG;
            }
        }
        uint mk = subgroupMax(bk);
        uint mi = subgroupMin(bk == mk ? bi : 0xFFFFFFFFu);
        uint p = j & 1u;
        if (subgroupElect()) {
            sg_key[p][gl_SubgroupID] = mk;
            sg_idx[p][gl_SubgroupID] = mi;
        }
        barrier();
        uint wk = 0u;
        uint wi = 0xFFFFFFFFu;
        for (uint g = 0u; g < gl_NumSubgroups; g++) {
            if (better(sg_key[p][g], sg_idx[p][g], wk, wi)) {
                wk = sg_key[p][g];
                wi = sg_idx[p][g];
            }
        }
        [[unroll]] for (uint i = 0u; i < PER; i++) {
            if (t + i * WG == wi) {
                key[i] = 0u;
            }
        }
        if (t == 0u) {
            chosen[j] = wi;
        }
    }
    barrier();
    // As the CPU: exp(l - top), top the first pick (the largest number).
    float top = logits[base + chosen[0]];
    float denom = 0.0;
    if (pc.renorm != 0u) {
        for (uint j = 0u; j < pc.k; j++) {
            denom += exp(logits[base + chosen[j]] - top);
        }
    } else {
        float s = 0.0;
        [[unroll]] for (uint i = 0u; i < PER; i++) {
            if (t + i * WG < pc.experts) {
                s += exp(v[i] - top);
            }
        }
        s = subgroupAdd(s);
        if (subgroupElect()) {
            sg_sum[gl_SubgroupID] = s;
        }
        barrier();
        for (uint g = 0u; g < gl_NumSubgroups; g++) {
            denom += sg_sum[g];
        }
    }
    if (t < pc.k) {
        uint e = chosen[t];
        ids[row * pc.k + t] = e;
        weights[row * pc.k + t] = exp(logits[base + e] - top) / denom;
    }
}
