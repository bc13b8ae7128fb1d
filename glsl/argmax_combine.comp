// argmax stage two: one workgroup per row reduces the row's `groups`
// (value, index) partials from argmax.comp to the row's index.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer Part { uvec2 part[]; };
layout(binding = 1) writeonly buffer Out { uint o[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint groups;
} pc;

#include "argmax.glsl"

void main() {
    uint row = wg_linear();
    if (row >= pc.rows) {
        return;
    }
    float bv = -1.0 / 0.0;
    uint bi = NONE;
    for (uint g = gl_LocalInvocationID.x; g < pc.groups; g += gl_WorkGroupSize.x) {
        uvec2 c = part[row * pc.groups + g];
        if (am_better(uintBitsToFloat(c.x), c.y, bv, bi)) {
            bv = uintBitsToFloat(c.x);
            bi = c.y;
        }
    }
    am_reduce(bv, bi);
    if (gl_LocalInvocationID.x == 0u) {
        o[row] = bi == NONE ? 0u : bi;
    }
}
