// Rotary embedding in place: one invocation per rotated pair of one head of
// one row; the angle uses that row's position from the positions buffer.
// The inverse frequencies (YaRN-mixed where scaled) come from the host.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 256) in;
// Specialization constant 0: SCALED (YaRN), cos and sin times mscale.
layout(constant_id = 0) const uint SPEC = 0u;
const bool SCALED = (SPEC & 1u) != 0u;

layout(binding = 0) buffer X { float x[]; };
layout(binding = 1) readonly buffer Pos { uint pos[]; };
layout(binding = 2) readonly buffer Freq { float inv_freq[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint head_dim;
    uint rot_dim;
    uint neox;
    float mscale;
} pc;

#include "rope.glsl"

void main() {
    uint half_rot = pc.rot_dim / 2u;
    uint total = pc.rows * pc.n_heads * half_rot;
    uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    for (uint g = wg_linear() * gl_WorkGroupSize.x + gl_LocalInvocationID.x; g < total; g += stride) {
        uint i = g % half_rot;
        uint head = g / half_rot;
        uint row = head / pc.n_heads;
        uint base = head * pc.head_dim;
        vec2 cs = rope_rotation(pos[row], inv_freq[i]);
        if (SCALED) {
            cs *= pc.mscale;
        }
        float c = cs.x;
        float s = cs.y;
        uint a = pc.neox != 0u ? base + i : base + 2u * i;
        uint b = pc.neox != 0u ? base + i + half_rot : base + 2u * i + 1u;
        float x0 = x[a];
        float x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}
