// Each row rounded to the int8 levels of its largest magnitude and back:
// out = clamp(roundEven(x * s), -128, 127) / s, s = 127 / max(max|x|, 1e-5)
// (BitNet's per-token activation quantization, transformers' ActQuant). One
// workgroup per row; out may alias x (each invocation reads its values
// before it writes them, after the row's maximum is known).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint dim;
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
    float m = 0.0;
    for (uint i = lane; i < pc.dim; i += width) {
        m = max(m, abs(x[base + i]));
    }
    float s = 127.0 / max(wg_max(m), 1e-5);
    for (uint i = lane; i < pc.dim; i += width) {
        o[base + i] = clamp(roundEven(x[base + i] * s), -128.0, 127.0) / s;
    }
}
