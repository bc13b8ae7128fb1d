// out[r] (+)= Σ_j w[r * k + j] · y[r * k + j] over rows of n values
// (vk/ops/sum_experts.rs): the chosen experts' outputs mixed, summed in
// order of j as cpu/sum_experts.rs does; a grid-stride loop over out.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer Y { float y[]; };
layout(binding = 1) readonly buffer W { float w[]; };
layout(binding = 2) buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint total; // rows * n
    uint n;
    uint k;
    uint add;
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    for (uint i = wg_linear() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; i < pc.total; i += stride) {
        uint r = i / pc.n;
        uint c = i - r * pc.n;
        float s = pc.add != 0u ? o[i] : 0.0;
        for (uint j = 0u; j < pc.k; j++) {
            uint slot = r * pc.k + j;
            s += w[slot] * y[slot * pc.n + c];
        }
        o[i] = s;
    }
}
