// y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]) for many rows m, for CPU devices
// (lavapipe; vk/caps.rs MatmulKernel::Lanes): a workgroup of 8 invocations
// takes 8R weight rows, R per invocation, against MB rows of x, with no
// shared memory and no barrier.
//
// Why this shape: lavapipe runs a workgroup's subgroups as coroutines,
// switched at every barrier, and inside a loop it loads every lane's value
// of a buffer or shared array one lane at a time (~25 cycles a lane on
// Mesa 22.3), even where all lanes read one address. So the cost is the
// number of (lane, word) loads: here each lane decodes its own weight rows
// (dq16, loaded once per MB rows of x), and x's 16 values of a row are
// loaded two per lane and handed round by subgroupBroadcast, each used for
// R rows. That ran about four times as fast as the 64x64 shared-memory
// tiles of mul_mat.comp (benches/README.md, small kernels). Built with
// EXPERTS, the grouped GEMM of routed rows (experts.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#extension GL_KHR_shader_subgroup_ballot : require

// One subgroup of lavapipe's 8 lanes (the host requires subgroups of at
// least 8, so the broadcasts stay inside one).
layout(local_size_x = 8) in;

layout(binding = 0) readonly buffer W { uint wdata[]; };
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(binding = 3) readonly buffer B { float bias[]; };

// mul_mat.comp's (vk/ops/matmul.rs Push).
layout(push_constant) uniform Push {
    uint n;
    uint k;
    uint m;
    uint has_bias;
    uint row0;
    uint ldy;
    uint k_chunk; // 0: this kernel does not split k
    uint x_div;
    uint experts;
} pc;

#include "dequant.glsl"

// Rows of x per workgroup and weight rows per invocation: the workgroup's
// output tile is 8R (n) x MB (m) (vk/caps.rs MatmulKernel::shader).
const uint MB = 16u;
const uint R = 2u;
#define EXPERT_TILE_M MB
#include "experts.glsl"

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint m0 = gl_WorkGroupID.y * MB;
    if (!expert_tile(m0, gl_WorkGroupID.x * 8u * R, 8u * R, lane, 8u)) {
        return;
    }
    uint rows = min(MB, m_rows() - m0);
    // Lanes past n decode the last row and store nothing, so every lane
    // takes part in the broadcasts.
    uint wrow[R];
    [[unroll]] for (uint r = 0u; r < R; r++) {
        wrow[r] = min(gl_WorkGroupID.x * 8u * R + 8u * r + lane, pc.n - 1u);
    }
    float acc[MB][R];
    [[unroll]] for (uint b = 0u; b < MB; b++) {
        [[unroll]] for (uint r = 0u; r < R; r++) {
            acc[b][r] = 0.0;
        }
    }
    // dq16 takes 16 values of one row from a multiple of 16: every block
    // format's rows are multiples of 32; other rows go one value at a time.
    uint k16 = (pc.k & 15u) == 0u ? pc.k : 0u;
    for (uint kk = 0u; kk < k16; kk += 16u) {
        vec4 w[R][4];
        [[unroll]] for (uint r = 0u; r < R; r++) {
            dq16(w_row(wrow[r]) * pc.k + kk, w[r]);
        }
        [[dont_unroll]] for (uint b = 0u; b < rows; b++) {
            {
                uint xb = x_row(m0 + b) * pc.k + kk;
                float xa = x[xb + lane];
                float xc = x[xb + 8u + lane];
                [[unroll]] for (uint e = 0u; e < 8u; e++) {
                    float x0 = subgroupBroadcast(xa, e);
                    float x1 = subgroupBroadcast(xc, e);
                    [[unroll]] for (uint r = 0u; r < R; r++) {
                        acc[b][r] += w[r][e >> 2][e & 3u] * x0 + w[r][2u + (e >> 2)][e & 3u] * x1;
                    }
                }
            }
        }
    }
    for (uint kk = k16; kk < pc.k; kk++) {
        [[unroll]] for (uint r = 0u; r < R; r++) {
            float wv = dq1(w_row(wrow[r]) * pc.k + kk);
            [[unroll]] for (uint b = 0u; b < MB; b++) {
                if (b < rows) {
                    acc[b][r] += wv * x[x_row(m0 + b) * pc.k + kk];
                }
            }
        }
    }
    [[unroll]] for (uint r = 0u; r < R; r++) {
        uint col = gl_WorkGroupID.x * 8u * R + 8u * r + lane;
        if (col < pc.n) {
            float bv = pc.has_bias != 0u ? bias[pc.row0 + w_row(col)] : 0.0;
            [[unroll]] for (uint b = 0u; b < MB; b++) {
                if (b < rows) {
                    y[y_row(m0 + b) * pc.ldy + pc.row0 + col] = acc[b][r] + bv;
                }
            }
        }
    }
}
