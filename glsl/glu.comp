// out = act(gate) * up (or act(gate) without up), elementwise; gpt-oss's
// SwiGLU (act 2) act(gate) * (clamp(up, -7, 7) + 1), always with up. With
// `row` set, gate and up come from one buffer of rows [gate (row values), up
// (row values)] (a gate_up projection's output) and out has rows of `row`
// values.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer G { float gate[]; };
layout(binding = 1) readonly buffer U { float up[]; };
layout(binding = 2) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint n;
    uint act; // 0 SiLU, 1 tanh GELU, 2 gpt-oss SwiGLU, 3 squared ReLU (vk/ops/glu.rs)
    uint has_up;
    uint row;
} pc;

const uint GELU = 1u;
const uint SWIGLU_OAI = 2u;
const uint RELU2 = 3u;
// gpt-oss's SwiGLU: the sigmoid's slope and the clamp (Activation::OAI_*).
const float OAI_ALPHA = 1.702;
const float OAI_LIMIT = 7.0;

float act(float v) {
    if (pc.act == GELU) {
        // tanh's argument is clamped: tanh is ±1 there in f32 and some drivers
        // overflow to NaN for large arguments.
        float t = clamp(0.7978845608028654 * (v + 0.044715 * v * v * v), -15.0, 15.0);
        return 0.5 * v * (1.0 + tanh(t));
    }
    if (pc.act == SWIGLU_OAI) {
        float g = min(v, OAI_LIMIT);
        return g / (1.0 + exp(-OAI_ALPHA * g));
    }
    if (pc.act == RELU2) {
        float r = max(v, 0.0);
        return r * r;
    }
    return v / (1.0 + exp(-v));
}

// What multiplies act(gate).
float up_factor(float u) {
    return pc.act == SWIGLU_OAI ? clamp(u, -OAI_LIMIT, OAI_LIMIT) + 1.0 : u;
}

void main() {
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    for (uint i = wg_linear() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; i < pc.n; i += stride) {
        if (pc.row != 0u) {
            uint g = (i / pc.row) * 2u * pc.row + i % pc.row;
            o[i] = act(gate[g]) * up_factor(gate[g + pc.row]);
            continue;
        }
        float v = act(gate[i]);
        o[i] = pc.has_up != 0u ? v * up_factor(up[i]) : v;
    }
}
