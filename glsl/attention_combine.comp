// Merge the key splits of attention.comp: one workgroup per (head, row).
// Each split carries its running max m, sum l and unnormalized output a; the
// result is sum_s e^(m_s - M) a_s / sum_s e^(m_s - M) l_s with M = max m_s
// (an empty split has m = -inf and weighs nothing).
#version 450

layout(local_size_x = 64) in;

layout(binding = 0) readonly buffer Part { float part[]; };
layout(binding = 1) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint head_dim;
    uint n_split;
} pc;

void main() {
    uint h = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint hd = pc.head_dim;
    uint stride = hd + 2u;
    uint base = (r * pc.n_heads + h) * pc.n_split * stride;
    float m = -1.0 / 0.0;
    for (uint s = 0u; s < pc.n_split; s++) {
        m = max(m, part[base + s * stride]);
    }
    float l = 0.0;
    for (uint s = 0u; s < pc.n_split; s++) {
        l += exp(part[base + s * stride] - m) * part[base + s * stride + 1u];
    }
    float inv = l > 0.0 ? 1.0 / l : 0.0;
    for (uint d = gl_LocalInvocationID.x; d < hd; d += gl_WorkGroupSize.x) {
        float a = 0.0;
        for (uint s = 0u; s < pc.n_split; s++) {
            uint b = base + s * stride;
            a += exp(part[b] - m) * part[b + 2u + d];
        }
        o[(r * pc.n_heads + h) * hd + d] = a * inv;
    }
}
