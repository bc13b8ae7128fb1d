// out = a + b, elementwise (out may alias a or b).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) readonly buffer Bv { float b[]; };
layout(binding = 2) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint n;
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    for (uint i = wg_linear() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; i < pc.n; i += stride) {
        o[i] = a[i] + b[i];
    }
}
