// Index of the largest value of each row (the first on ties; NaNs never win),
// stage one. A vocabulary-sized row is split over `groups` workgroups so the
// whole GPU streams it (one workgroup per row left most of the GPU idle:
// benches/README.md, small kernels); each workgroup reduces its slice of
// `slice` values and writes a (value, index) partial that
// argmax_combine.comp reduces. With groups == 1 (many rows, or short ones)
// the result goes straight to `o`. With `masked`, only the values whose bit
// is set in the row's `allow` words compete (a grammar's mask).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Out { uint o[]; };
// Per (row, group): [value bits, index].
layout(binding = 2) writeonly buffer Part { uvec2 part[]; };
// n.div_ceil(32) words a row; bound to `x` when not masked (never read).
layout(binding = 3) readonly buffer Allow { uint allow[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n;
    uint groups;
    uint slice;
    uint masked;
} pc;

#include "argmax.glsl"

void main() {
    uint wg = wg_linear();
    uint row = wg / pc.groups;
    if (row >= pc.rows) {
        return;
    }
    uint g = wg - row * pc.groups;
    uint begin = g * pc.slice;
    uint end = min(begin + pc.slice, pc.n);
    float bv = -1.0 / 0.0;
    uint bi = NONE;
    // Consecutive invocations read consecutive values (coalesced); each
    // invocation's own candidates come in increasing index order, so a strict
    // `>` keeps the first of equal values.
    uint words = (pc.n + 31u) / 32u;
    for (uint i = begin + gl_LocalInvocationID.x; i < end; i += gl_WorkGroupSize.x) {
        if (pc.masked != 0u && (allow[row * words + (i >> 5)] >> (i & 31u) & 1u) == 0u) {
            continue;
        }
        float v = x[row * pc.n + i];
        if (v > bv || (bi == NONE && v == bv)) {
            bv = v;
            bi = i;
        }
    }
    am_reduce(bv, bi);
    if (gl_LocalInvocationID.x == 0u) {
        if (pc.groups == 1u) {
            o[row] = bi == NONE ? 0u : bi;
        } else {
            part[wg] = uvec2(floatBitsToUint(bv), bi);
        }
    }
}
