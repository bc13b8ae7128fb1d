// y = the sum of a split-K GEMM's partial outputs (mul_mat.comp and
// mul_mat_coopmat.comp with k_chunk), plus the bias: `splits` copies of
// the m x n output, `total` = m * n floats apart.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer Part { float part[]; };
layout(binding = 1) writeonly buffer Y { float y[]; };
layout(binding = 2) readonly buffer B { float bias[]; };

layout(push_constant) uniform Push {
    uint n;
    uint total;
    uint splits;
    uint has_bias;
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    for (uint i = wg_linear() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; i < pc.total; i += stride) {
        float s = pc.has_bias != 0u ? bias[i % pc.n] : 0.0;
        for (uint z = 0u; z < pc.splits; z++) {
            s += part[z * pc.total + i];
        }
        y[i] = s;
    }
}
