// y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]) for few rows m: each subgroup
// computes whole output rows, its lanes striding over k, reduced with
// subgroupAdd: no shared memory and no barriers. A workgroup owns
// `rows_per_wg` consecutive rows and its subgroups take them in turn, so the
// result is right whatever subgroup size the driver picks.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer W { uint wdata[]; };
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(binding = 3) readonly buffer B { float bias[]; };

layout(push_constant) uniform Push {
    uint n;
    uint k;
    uint m;
    uint has_bias;
    uint rows_per_wg;
} pc;

#include "dequant.glsl"

// Rows of x handled by one dispatch (vk/ops/matmul.rs GEMV_MAX_ROWS): each
// weight value is dequantized once and used for all of them.
const uint MAX_M = 4u;

void main() {
    uint first = wg_linear() * pc.rows_per_wg;
    uint last = min(first + pc.rows_per_wg, pc.n);
    uint lane = gl_SubgroupInvocationID;
    uint width = gl_SubgroupSize;
    uint m = min(pc.m, MAX_M);
    for (uint row = first + gl_SubgroupID; row < last; row += gl_NumSubgroups) {
        uint wbase = row * pc.k;
        float acc[MAX_M];
        for (uint r = 0u; r < MAX_M; r++) {
            acc[r] = 0.0;
        }
        if ((pc.k & 3u) == 0u) {
            for (uint i = lane * 4u; i < pc.k; i += width * 4u) {
                vec4 wv = dq4(wbase + i);
                for (uint r = 0u; r < m; r++) {
                    uint xb = r * pc.k + i;
                    acc[r] += dot(wv, vec4(x[xb], x[xb + 1u], x[xb + 2u], x[xb + 3u]));
                }
            }
        } else {
            for (uint i = lane; i < pc.k; i += width) {
                float wv = dq1(wbase + i);
                for (uint r = 0u; r < m; r++) {
                    acc[r] += wv * x[r * pc.k + i];
                }
            }
        }
        float b = pc.has_bias != 0u ? bias[row] : 0.0;
        for (uint r = 0u; r < m; r++) {
            float total = subgroupAdd(acc[r]);
            if (subgroupElect()) {
                y[r * pc.n + row] = total + b;
            }
        }
    }
}
