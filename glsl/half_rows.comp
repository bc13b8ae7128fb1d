// y = x as f16, four values per invocation step: the cooperative-matrix
// GEMM's activations, converted once instead of by every workgroup that
// reads them (mul_mat_coopmat.comp with X_HALF).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer X { vec4 x4[]; };
layout(binding = 1) writeonly buffer Y { uvec2 y[]; };

layout(push_constant) uniform Push {
    uint n4; // values / 4
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    for (uint i = wg_linear() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; i < pc.n4; i += stride) {
        vec4 v = x4[i];
        y[i] = uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));
    }
}
