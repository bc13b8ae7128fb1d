// KV-cache append: dst row positions[r] = src row r. The position is read
// here, so a recorded decode pass writes the right cache row on replay. A
// position past the cache is skipped (attention.comp flags it); so is one
// whose page (paged caches: glsl/kv_pages.glsl) is past the table or pool.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;
// Specialization constant 0: bit 0 when dst holds f16 (row_len even; each
// invocation then stores a pair of values as one word); bit 1 PAGED.
layout(constant_id = 0) const uint SPEC = 0u;
const bool DST_F16 = (SPEC & 1u) != 0u;
const bool PAGED = (SPEC & 2u) != 0u;

layout(binding = 0) readonly buffer Src { float src[]; };
layout(binding = 1) writeonly buffer Dst { float dst[]; };
layout(binding = 1) writeonly buffer Dst16 { uint dst16[]; };
layout(binding = 2) readonly buffer Pos { uint pos[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint row_len;
    uint capacity; // rows dst holds
    uint page_log2;
    uint page_stride;
    uint n_pages;
    uint table_len;
} pc;

#define KV_PAGES_BINDING 3
#define KV_PAGES_STORE
#include "kv_pages.glsl"

void main() {
    uint total = pc.rows * pc.row_len;
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    if (DST_F16) {
        for (uint i = 2u * gl_GlobalInvocationID.x; i < total; i += 2u * stride) {
            uint r = i / pc.row_len;
            uint at = kv_store_row(r, pos[r]);
            if (at < pc.capacity) {
                dst16[(at * pc.row_len + (i - r * pc.row_len)) >> 1] = packHalf2x16(vec2(src[i], src[i + 1u]));
            }
        }
        return;
    }
    for (uint i = gl_GlobalInvocationID.x; i < total; i += stride) {
        uint r = i / pc.row_len;
        uint at = kv_store_row(r, pos[r]);
        if (at < pc.capacity) {
            dst[at * pc.row_len + (i - r * pc.row_len)] = src[i];
        }
    }
}
