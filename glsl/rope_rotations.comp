// The rotations of a decode step's position, once per pass: cs[i] = (cos,
// sin) of pos[0] * inv_freq[i] for the rot_dim / 2 frequencies, times mscale
// (YaRN; 1 unscaled, which is exact), which every layer's
// attention_decode.comp (ROPE mode) then reads instead of computing sine and
// cosine in each of its workgroups.
#version 450
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer Pos { uint pos[]; };
layout(binding = 1) readonly buffer Freq { float inv_freq[]; };
layout(binding = 2) writeonly buffer Cs { vec2 cs[]; };

layout(push_constant) uniform Push {
    uint half_rot;
    float mscale;
} pc;

#include "rope.glsl"

void main() {
    for (uint i = gl_GlobalInvocationID.x; i < pc.half_rot; i += gl_NumWorkGroups.x * 64u) {
        cs[i] = rope_rotation(pos[0], inv_freq[i]) * pc.mscale;
    }
}
