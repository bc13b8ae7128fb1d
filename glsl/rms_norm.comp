// out = x / sqrt(mean(x²) + eps) * w, one workgroup per row.
//
// The host sizes the workgroup (vk/ops/rms_norm.rs): a decode step's one
// row of a few thousand values is bound by the latency of each invocation's
// loads in turn, so few rows get wide workgroups; rows of a multiple of 4
// values go 4 at a time.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(binding = 1) readonly buffer Wt { float w[]; };
layout(binding = 1) readonly buffer Wt4 { vec4 w4[]; };
layout(binding = 2) writeonly buffer Out { float o[]; };
layout(binding = 2) writeonly buffer Out4 { vec4 o4[]; };

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
    uint lane = gl_LocalInvocationID.x;
    uint width = gl_WorkGroupSize.x;
    float ss = 0.0;
    if ((pc.dim & 3u) == 0u) {
        uint base4 = base / 4u;
        uint dim4 = pc.dim / 4u;
        for (uint i = lane; i < dim4; i += width) {
            vec4 v = x4[base4 + i];
            ss += dot(v, v);
        }
        float inv = inversesqrt(wg_sum(ss) / float(pc.dim) + pc.eps);
        for (uint i = lane; i < dim4; i += width) {
            o4[base4 + i] = x4[base4 + i] * inv * w4[i];
        }
        return;
    }
    for (uint i = lane; i < pc.dim; i += width) {
        float v = x[base + i];
        ss += v * v;
    }
    float inv = inversesqrt(wg_sum(ss) / float(pc.dim) + pc.eps);
    for (uint i = lane; i < pc.dim; i += width) {
        o[base + i] = x[base + i] * inv * w[i];
    }
}
