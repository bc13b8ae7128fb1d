// out = (x - mean) / sqrt(var + eps) * w + b, one workgroup per row; the
// variance is taken around the mean in a second sweep for accuracy.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer Wt { float w[]; };
layout(binding = 2) readonly buffer Bs { float b[]; };
layout(binding = 3) writeonly buffer Out { float o[]; };

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
    float s = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.dim; i += gl_WorkGroupSize.x) {
        s += x[base + i];
    }
    float mean = wg_sum(s) / float(pc.dim);
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.dim; i += gl_WorkGroupSize.x) {
        float d = x[base + i] - mean;
        ss += d * d;
    }
    float inv = inversesqrt(wg_sum(ss) / float(pc.dim) + pc.eps);
    for (uint i = gl_LocalInvocationID.x; i < pc.dim; i += gl_WorkGroupSize.x) {
        o[base + i] = (x[base + i] - mean) * inv * w[i] + b[i];
    }
}
