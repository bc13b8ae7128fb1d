// out = x * s, elementwise (out may alias x).
//
// Also the copy-bandwidth probe's streaming kernel (bench/bandwidth.rs), so
// it streams as fast as the memory allows: 16-byte accesses, and each
// invocation issues its UNROLL loads before any store, over a grid of a few
// workgroups per multiprocessor rather than one per 256 values (a scalar
// float per invocation read half the bandwidth: benches/README.md, small
// kernels).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(binding = 1) writeonly buffer Out { float o[]; };
layout(binding = 1) writeonly buffer Out4 { vec4 o4[]; };

layout(push_constant) uniform Push {
    uint n;
    float s;
} pc;

const uint UNROLL = 4u;

void main() {
    uint wg = gl_WorkGroupSize.x;
    uint threads = gl_NumWorkGroups.x * gl_NumWorkGroups.y * wg;
    uint n4 = pc.n / 4u;
    // Each pass over the grid covers UNROLL consecutive spans of `threads` vec4s.
    for (uint i0 = wg_linear() * wg + gl_LocalInvocationID.x; i0 < n4; i0 += UNROLL * threads) {
        vec4 v[UNROLL];
        [[unroll]] for (uint u = 0u; u < UNROLL; u++) {
            uint i = i0 + u * threads;
            v[u] = i < n4 ? x4[i] : vec4(0.0);
        }
        [[unroll]] for (uint u = 0u; u < UNROLL; u++) {
            uint i = i0 + u * threads;
            if (i < n4) {
                o4[i] = v[u] * pc.s;
            }
        }
    }
    // The last n % 4 values, one invocation each.
    uint t = 4u * n4 + wg_linear() * wg + gl_LocalInvocationID.x;
    if (t < pc.n) {
        o[t] = x[t] * pc.s;
    }
}
