// Causal attention with online softmax: one workgroup per (query head, row,
// key split). With n_split > 1 (decode: few rows, long caches) each workgroup
// takes keys [s * split_len, (s + 1) * split_len) and writes its running max,
// sum and unnormalized output to `part`; attention_combine.comp merges them.
// Keys are taken 64 at a time: invocation t scores key j0 + t, the chunk's
// softmax weights go through shared memory, and each invocation accumulates
// its own slice of the output dimensions (up to 8 per invocation, so
// head_dim <= 512). The attention length comes from positions[row] + 1, read
// here, so a recorded pass stays valid for any position.
//
// Its inner loops are unrolled (8 dims of a score, the chunk's 64 keys per
// output dim): lavapipe ends a shader's loops after 65,535 iterations in all
// (llvmpipe's LP_MAX_TGSI_LOOP_ITERATIONS) and returns what it has, which a
// loop per dim and per key reached at ~7,600 keys of head_dim 256. Now a
// chunk costs head_dim / 8 + ~17 iterations: ~50K keys at head_dim 512.
//
// Paged caches (glsl/kv_pages.glsl), per-row tables too (rows are
// independent): each invocation finds its key's cache row once per chunk,
// and the value loop reads the chunk's rows from shared memory.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;
// Specialization constant 0: bit 0 when the KV cache holds f16; bit 1 PAGED;
// bit 2 SINKS: sinks[h] joins head h's softmax denominator (with one split;
// split partials leave it to attention_combine.comp).
layout(constant_id = 0) const uint SPEC = 0u;
const bool KV_F16 = (SPEC & 1u) != 0u;
const bool PAGED = (SPEC & 2u) != 0u;
const bool SINKS = (SPEC & 4u) != 0u;

layout(binding = 0) readonly buffer Q { float q[]; };
layout(binding = 1) readonly buffer K { float kc[]; };
layout(binding = 2) readonly buffer V { float vc[]; };
// An f16 cache binds the same buffers as 2 halves per word.
layout(binding = 1) readonly buffer K16 { uint kh[]; };
layout(binding = 2) readonly buffer V16 { uint vh[]; };
float k_at(uint i) { return KV_F16 ? unpackHalf2x16(kh[i >> 1])[i & 1u] : kc[i]; }
float v_at(uint i) { return KV_F16 ? unpackHalf2x16(vh[i >> 1])[i & 1u] : vc[i]; }
layout(binding = 3) readonly buffer Pos { uint pos[]; };
layout(binding = 4) writeonly buffer Out { float o[]; };
// Status words (see embedding.comp); a position past the cache is recorded in
// the second as position + 1 and the row attends to the cache it has; a
// page past the pool in the third (glsl/kv_pages.glsl).
layout(binding = 5) buffer Status { uint bad_id_plus_one; uint bad_pos_plus_one; uint bad_page_plus_one; } st;
// Per split: [max, sum, out[head_dim]] (only with n_split > 1).
layout(binding = 6) writeonly buffer Part { float part[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    uint capacity;
    float scale;
    uint window;
    uint n_split;
    uint split_len;
    uint page_log2;
    uint page_stride;
    uint n_pages;
    uint table_len;
} pc;

// SINKS: a logit per query head.
layout(binding = 8) readonly buffer Sinks { float sinks[]; };

#include "reduce.glsl"
#define KV_PAGES_BINDING 7
#define KV_PAGES_STATUS
#include "kv_pages.glsl"

const uint CHUNK = 64u;
const uint MAX_DIMS = 8u;

shared float qs[CHUNK * MAX_DIMS];
shared float ps[CHUNK];
// PAGED: the chunk's cache rows (keys past the end: the last key's).
shared uint krow[PAGED ? CHUNK : 1u];

void main() {
    uint h = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint t = gl_LocalInvocationID.x;
    uint hd = pc.head_dim;
    uint qbase = (r * pc.n_heads + h) * hd;
    for (uint d = t; d < hd; d += CHUNK) {
        qs[d] = q[qbase + d];
    }
    uint p = pos[r];
    if (p >= pc.capacity && t == 0u) {
        atomicMax(st.bad_pos_plus_one, p + 1u);
    }
    uint end = min(p + 1u, pc.capacity);
    uint start = (pc.window > 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    uint split = gl_WorkGroupID.z;
    start = max(start, split * pc.split_len);
    end = min(end, (split + 1u) * pc.split_len);
    uint kv_stride = pc.n_kv_heads * hd;
    uint koff = (h / (pc.n_heads / pc.n_kv_heads)) * hd;
    barrier();

    float acc[MAX_DIMS];
    [[unroll]] for (uint i = 0u; i < MAX_DIMS; i++) {
        acc[i] = 0.0;
    }
    float run_max = -1.0 / 0.0;
    float run_sum = 0.0;
    for (uint j0 = start; j0 < end; j0 += CHUNK) {
        uint j = j0 + t;
        if (PAGED) {
            krow[t] = kv_row(r, min(j, end - 1u)); // read by all after wg_max
        }
        float s = -1.0 / 0.0;
        if (j < end) {
            uint kb = (PAGED ? krow[t] : j) * kv_stride + koff;
            float d0 = 0.0;
            for (uint d = 0u; d < hd; d += 8u) {
                [[unroll]] for (uint e = 0u; e < 8u; e++) {
                    if (d + e < hd) {
                        d0 += qs[d + e] * k_at(kb + d + e);
                    }
                }
            }
            s = d0 * pc.scale;
        }
        float new_max = max(run_max, wg_max(s));
        float pt = j < end ? exp(s - new_max) : 0.0;
        ps[t] = pt;
        float chunk_sum = wg_sum(pt);
        float corr = exp(run_max - new_max);
        run_sum = run_sum * corr + chunk_sum;
        run_max = new_max;
        // Every key of the chunk, unrolled: those past the end weigh 0 and
        // read the last key's row instead.
        [[unroll]] for (uint i = 0u; i < MAX_DIMS; i++) {
            uint d = t + CHUNK * i;
            if (d < hd) {
                float a = acc[i] * corr;
                [[unroll]] for (uint c = 0u; c < CHUNK; c++) {
                    uint key = PAGED ? krow[c] : min(j0 + c, end - 1u);
                    a += ps[c] * v_at(key * kv_stride + koff + d);
                }
                acc[i] = a;
            }
        }
        barrier();
    }
    if (pc.n_split > 1u) {
        uint pbase = ((r * pc.n_heads + h) * pc.n_split + split) * (hd + 2u);
        if (t == 0u) {
            part[pbase] = run_max;
            part[pbase + 1u] = run_sum;
        }
        [[unroll]] for (uint i = 0u; i < MAX_DIMS; i++) {
            uint d = t + CHUNK * i;
            if (d < hd) {
                part[pbase + 2u + d] = acc[i];
            }
        }
        return;
    }
    if (SINKS && run_max != -1.0 / 0.0) {
        run_sum += exp(sinks[h] - run_max);
    }
    float inv = run_sum > 0.0 ? 1.0 / run_sum : 0.0;
    [[unroll]] for (uint i = 0u; i < MAX_DIMS; i++) {
        uint d = t + CHUNK * i;
        if (d < hd) {
            o[qbase + d] = acc[i] * inv;
        }
    }
}
