// out = x * s, elementwise (out may alias x).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint n;
    float s;
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    for (uint i = wg_linear() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; i < pc.n; i += stride) {
        o[i] = x[i] * pc.s;
    }
}
