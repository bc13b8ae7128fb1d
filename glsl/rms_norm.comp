// out = x / sqrt(mean(x²) + eps) * w, one workgroup per row.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Wt { float w[]; };
layout(binding = 2) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint dim;
    float eps;
} pc;

#include "reduce.glsl"

void main() {
    uint row = wg_linear();
    if (row >= pc.rows) {
        return;
    }
    uint base = row * pc.dim;
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.dim; i += gl_WorkGroupSize.x) {
        float v = x[base + i];
        ss += v * v;
    }
    float inv = inversesqrt(wg_sum(ss) / float(pc.dim) + pc.eps);
    for (uint i = gl_LocalInvocationID.x; i < pc.dim; i += gl_WorkGroupSize.x) {
        o[base + i] = x[base + i] * inv * w[i];
    }
}
