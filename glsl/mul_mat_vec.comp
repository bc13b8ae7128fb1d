// y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]) for few rows m: one workgroup per
// (output row n, input row m); the invocations stride over k and the partial
// dot products are reduced with subgroupAdd.
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
} pc;

#include "dequant.glsl"
#include "reduce.glsl"

void main() {
    uint row = wg_linear();
    uint r = gl_WorkGroupID.z;
    if (row >= pc.n) {
        return;
    }
    uint wbase = row * pc.k;
    uint xbase = r * pc.k;
    uint lane = gl_LocalInvocationID.x;
    uint stride = gl_WorkGroupSize.x;
    float acc = 0.0;
    if ((pc.k & 3u) == 0u) {
        for (uint i = lane * 4u; i < pc.k; i += stride * 4u) {
            vec4 xv = vec4(x[xbase + i], x[xbase + i + 1u], x[xbase + i + 2u], x[xbase + i + 3u]);
            acc += dot(dq4(wbase + i), xv);
        }
    } else {
        for (uint i = lane; i < pc.k; i += stride) {
            acc += dq1(wbase + i) * x[xbase + i];
        }
    }
    float total = wg_sum(acc);
    if (lane == 0u) {
        y[r * pc.n + row] = total + (pc.has_bias != 0u ? bias[row] : 0.0);
    }
}
