// Index of the largest value of each row (the first on ties; NaNs never win),
// one workgroup per row.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Out { uint o[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n;
} pc;

shared float best_v[128];
shared uint best_i[128];

void main() {
    uint row = wg_linear();
    if (row >= pc.rows) {
        return;
    }
    uint t = gl_LocalInvocationID.x;
    float bv = -1.0 / 0.0;
    uint bi = 0xFFFFFFFFu;
    for (uint i = t; i < pc.n; i += gl_WorkGroupSize.x) {
        float v = x[row * pc.n + i];
        if (v > bv || (bi == 0xFFFFFFFFu && v == bv)) {
            bv = v;
            bi = i;
        }
    }
    best_v[t] = bv;
    best_i[t] = bi;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2u; s > 0u; s >>= 1) {
        if (t < s) {
            float ov = best_v[t + s];
            uint oi = best_i[t + s];
            if (oi != 0xFFFFFFFFu && (best_i[t] == 0xFFFFFFFFu || ov > best_v[t] || (ov == best_v[t] && oi < best_i[t]))) {
                best_v[t] = ov;
                best_i[t] = oi;
            }
        }
        barrier();
    }
    if (t == 0u) {
        o[row] = best_i[0] == 0xFFFFFFFFu ? 0u : best_i[0];
    }
}
