// The attention front of a step in one dispatch: rotary embedding of q in
// place, k rotated into the cache row of its position, v copied into its
// cache row. Invocations take, in one index space, q's rotated pairs (in
// place, so a pair per invocation), then k's and v's elements (each k element
// reads its pair partner from the unrotated input). rot_dim = 0: no rotation.
// A paged cache (glsl/kv_pages.glsl) takes the rows its tables name; a
// position past the cache, table or pool stores nothing.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;
// Specialization constant 0: bit 0 when the caches hold f16, then each k/v
// unit of the index space is a pair of adjacent values stored as one word
// (head_dim is even, so a pair never straddles a head or row); bit 1 PAGED;
// bit 2 SCALED (YaRN: cos and sin times mscale; the host's inverse
// frequencies are mixed already).
layout(constant_id = 0) const uint SPEC = 0u;
const bool KV_F16 = (SPEC & 1u) != 0u;
const bool PAGED = (SPEC & 2u) != 0u;
const bool SCALED = (SPEC & 4u) != 0u;

layout(binding = 0) buffer Q { float q[]; };
layout(binding = 1) readonly buffer K { float k[]; };
layout(binding = 2) readonly buffer V { float v[]; };
layout(binding = 3) readonly buffer Pos { uint pos[]; };
layout(binding = 4) readonly buffer Freq { float inv_freq[]; };
layout(binding = 5) writeonly buffer KC { float kc[]; };
layout(binding = 6) writeonly buffer VC { float vc[]; };
layout(binding = 5) writeonly buffer KC16 { uint kc16[]; };
layout(binding = 6) writeonly buffer VC16 { uint vc16[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    uint rot_dim;
    uint neox;
    uint capacity; // rows the caches hold
    float mscale;
    uint page_log2;
    uint page_stride;
    uint n_pages;
    uint table_len;
} pc;

#include "rope.glsl"
#define KV_PAGES_BINDING 7
#define KV_PAGES_STORE
#include "kv_pages.glsl"

// The rotation of frequency i at position p.
vec2 rotation(uint p, uint i) {
    vec2 cs = rope_rotation(p, inv_freq[i]);
    return SCALED ? cs * pc.mscale : cs;
}

// k element e (of row position p) rotated.
float k_rot(uint e, uint p) {
    uint d = e % pc.head_dim;
    if (d >= pc.rot_dim) {
        return k[e];
    }
    bool neox = pc.neox != 0u;
    vec2 cs = rotation(p, rope_freq(d, pc.rot_dim, neox));
    return rope_apply(d, k[e], k[e - d + rope_mate(d, pc.rot_dim, neox)], cs, pc.rot_dim, neox);
}

void main() {
    uint half_rot = pc.rot_dim / 2u;
    uint q_pairs = pc.rows * pc.n_heads * half_rot;
    uint kvd = pc.n_kv_heads * pc.head_dim;
    uint kv_elems = pc.rows * kvd;
    // Values per k/v unit: 2 with an f16 cache (one packed word).
    uint per = KV_F16 ? 2u : 1u;
    uint kv_units = kv_elems / per;
    uint total = q_pairs + 2u * kv_units;
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    for (uint g = wg_linear() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; g < total; g += stride) {
        if (g < q_pairs) {
            uint i = g % half_rot;
            uint head = g / half_rot;
            uint base = head * pc.head_dim;
            vec2 cs = rotation(pos[head / pc.n_heads], i);
            uint a = pc.neox != 0u ? base + i : base + 2u * i;
            uint b = pc.neox != 0u ? base + i + half_rot : base + 2u * i + 1u;
            float x0 = q[a];
            float x1 = q[b];
            q[a] = x0 * cs.x - x1 * cs.y;
            q[b] = x0 * cs.y + x1 * cs.x;
            continue;
        }
        uint u = g - q_pairs;
        bool is_v = u >= kv_units;
        if (is_v) {
            u -= kv_units;
        }
        uint e = u * per;
        uint r = e / kvd;
        uint p = pos[r];
        uint row = kv_store_row(r, p);
        if (row >= pc.capacity) {
            continue; // attention.comp reports it
        }
        uint at = row * kvd + (e - r * kvd);
        if (KV_F16) {
            vec2 pair = is_v ? vec2(v[e], v[e + 1u]) : vec2(k_rot(e, p), k_rot(e + 1u, p));
            if (is_v) {
                vc16[at >> 1] = packHalf2x16(pair);
            } else {
                kc16[at >> 1] = packHalf2x16(pair);
            }
        } else if (is_v) {
            vc[at] = v[e];
        } else {
            kc[at] = k_rot(e, p);
        }
    }
}
