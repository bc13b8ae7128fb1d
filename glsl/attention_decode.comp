// Decode attention (a few query rows against a long cache), with online
// softmax. One workgroup per (kv head, tile of up to 8 of its query heads,
// row, key split): the query heads of one GQA group share every K and V read.
// Keys go in tiles of TK = 32 (16 where shared memory is short): the tile's K rows are loaded into shared memory
// by consecutive invocations reading consecutive 16-byte words (coalesced;
// the old kernel had each invocation walk a whole key row, stride kv_stride
// apart), then invocation (head, key) scores one key from shared memory, then
// invocation (head, 4 output dims) folds the tile's softmax weights and V rows
// into its accumulator, V read as 16-byte words coalesced across dims. No
// cross-invocation reduction is needed, so any subgroup size works.
//
// The split (attention_split.glsl) follows the row's span read from
// positions: splits past it exit at once. With n_split > 1 each split writes
// [max, sum, unnormalized out[head_dim]] to `part` and attention_combine.comp
// merges them; with n_split == 1 the result goes straight to `o`.
//
// Specialization constant 0: head_dim | heads per tile << 16 | (16-key
// tiles) << 24 | (f16 KV cache) << 25. head_dim is a multiple of 4, at most 256 (vk/ops/attention.rs
// checks, and sizes the tiles to the device's shared memory).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint SPEC = 64u | (1u << 16);
const uint HD = SPEC & 0xFFFFu;
const uint GT = (SPEC >> 16) & 0xFFu; // at most 8
const uint HD4 = HD / 4u;
const uint KS = HD4 + 1u; // padded K row in shared memory: conflict-free column reads
const uint WG = 128u;
const uint TK = ((SPEC >> 24) & 1u) != 0u ? 16u : 32u; // divides SPLIT_MIN
const bool KV_F16 = ((SPEC >> 25) & 1u) != 0u;
const uint SC_PER = (GT * TK + WG - 1u) / WG; // scores per invocation per tile
const uint V_PER = (GT * HD4 + WG - 1u) / WG; // 4-dim output units per invocation

layout(binding = 0) readonly buffer Q { vec4 q4[]; };
layout(binding = 1) readonly buffer K { vec4 k4[]; };
layout(binding = 2) readonly buffer V { vec4 v4[]; };
layout(binding = 3) readonly buffer Pos { uint pos[]; };
layout(binding = 4) writeonly buffer Out { vec4 o4[]; };
// Status words (see embedding.comp); a position past the cache is recorded in
// the second as position + 1 and the row attends to the cache it has.
layout(binding = 5) buffer Status { uint bad_id_plus_one; uint bad_pos_plus_one; } st;
layout(binding = 6) writeonly buffer Part { float part[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint n_kv_heads;
    uint capacity;
    float scale;
    uint window;
    uint n_split;
    uint head_tiles;
} pc;

#include "attention_split.glsl"

shared vec4 qs[GT * HD4];
shared vec4 ks[TK * KS];
shared float ss[GT * TK];

// An f16 cache binds the same buffers as 4 halves per 8-byte word.
layout(binding = 1) readonly buffer K16 { uvec2 k16[]; };
layout(binding = 2) readonly buffer V16 { uvec2 v16[]; };
vec4 halves4(uvec2 w) { return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y)); }
vec4 load_k(uint i) { return KV_F16 ? halves4(k16[i]) : k4[i]; }
vec4 load_v(uint i) { return KV_F16 ? halves4(v16[i]) : v4[i]; }

void main() {
    uint t = gl_LocalInvocationID.x;
    uint kvh = gl_WorkGroupID.x / pc.head_tiles;
    uint h0 = (gl_WorkGroupID.x - kvh * pc.head_tiles) * GT; // first head in the group
    uint r = gl_WorkGroupID.y;
    uint split = gl_WorkGroupID.z;
    uint group = pc.n_heads / pc.n_kv_heads;
    uint p = pos[r];
    if (p >= pc.capacity && t == 0u && gl_WorkGroupID.x == 0u && split == 0u) {
        atomicMax(st.bad_pos_plus_one, p + 1u);
    }
    Span sp = decode_span(p, pc.capacity, pc.window, pc.n_split);
    if (pc.n_split > 1u && split >= sp.n_active) {
        return; // past the span: the combine reads only active splits
    }
    uint j_begin = sp.start + split * sp.len;
    uint j_end = min(j_begin + sp.len, sp.end);

    // The tile's query vectors, pre-scaled (heads past the group read zeros).
    for (uint u = t; u < GT * HD4; u += WG) {
        uint hh = u / HD4;
        uint hl = h0 + hh;
        qs[u] = hl < group
            ? q4[(r * pc.n_heads + kvh * group + hl) * HD4 + (u - hh * HD4)] * pc.scale
            : vec4(0.0);
    }
    uint stride4 = pc.n_kv_heads * HD4;
    uint koff4 = kvh * HD4;

    float m[V_PER];
    float l[V_PER];
    vec4 acc[V_PER];
    for (uint i = 0u; i < V_PER; i++) {
        m[i] = -1.0 / 0.0;
        l[i] = 0.0;
        acc[i] = vec4(0.0);
    }
    for (uint j0 = j_begin; j0 < j_end; j0 += TK) {
        uint nk = min(TK, j_end - j0);
        barrier(); // the previous tile's readers are done (and qs is visible)
        for (uint u = t; u < TK * HD4; u += WG) {
            uint kk = u / HD4;
            if (kk < nk) {
                ks[kk * KS + (u - kk * HD4)] = load_k((j0 + kk) * stride4 + koff4 + (u - kk * HD4));
            }
        }
        barrier();
        for (uint i = 0u; i < SC_PER; i++) {
            uint u = t + i * WG;
            if (u < GT * TK) {
                uint hh = u / TK;
                uint kk = u - hh * TK;
                float s = -1.0 / 0.0;
                if (kk < nk) {
                    vec4 a = vec4(0.0);
                    for (uint d = 0u; d < HD4; d++) {
                        a += qs[hh * HD4 + d] * ks[kk * KS + d];
                    }
                    s = (a.x + a.y) + (a.z + a.w);
                }
                ss[u] = s;
            }
        }
        barrier();
        for (uint i = 0u; i < V_PER; i++) {
            uint u = t + i * WG;
            if (u < GT * HD4) {
                uint hh = u / HD4;
                uint d4 = u - hh * HD4;
                float tmax = -1.0 / 0.0;
                for (uint kk = 0u; kk < nk; kk++) {
                    tmax = max(tmax, ss[hh * TK + kk]);
                }
                float nm = max(m[i], tmax);
                float corr = exp(m[i] - nm);
                vec4 a = acc[i] * corr;
                float ls = l[i] * corr;
                for (uint kk = 0u; kk < nk; kk++) {
                    float pk = exp(ss[hh * TK + kk] - nm);
                    ls += pk;
                    a += pk * load_v((j0 + kk) * stride4 + koff4 + d4);
                }
                acc[i] = a;
                l[i] = ls;
                m[i] = nm;
            }
        }
    }

    for (uint i = 0u; i < V_PER; i++) {
        uint u = t + i * WG;
        uint hh = u / HD4;
        if (u >= GT * HD4 || h0 + hh >= group) {
            continue;
        }
        uint d4 = u - hh * HD4;
        uint hg = kvh * group + h0 + hh;
        if (pc.n_split == 1u) {
            float inv = l[i] > 0.0 ? 1.0 / l[i] : 0.0;
            o4[(r * pc.n_heads + hg) * HD4 + d4] = acc[i] * inv;
        } else {
            uint pb = ((r * pc.n_heads + hg) * pc.n_split + split) * (HD + 2u);
            if (d4 == 0u) {
                part[pb] = m[i];
                part[pb + 1u] = l[i];
            }
            for (uint c = 0u; c < 4u; c++) {
                part[pb + 2u + 4u * d4 + c] = acc[i][c];
            }
        }
    }
}
