// y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]) for many rows m: each 16x16
// workgroup computes a 64(n) x 64(m) output tile, 4x4 per invocation, staging
// 16-wide k slices of W (dequantized once) and x in shared memory. Built
// with EXPERTS, the grouped GEMM of routed rows (experts.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 16, local_size_y = 16) in;

layout(binding = 0) readonly buffer W { uint wdata[]; };
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(binding = 3) readonly buffer B { float bias[]; };

layout(push_constant) uniform Push {
    uint n;
    uint k;
    uint m;
    uint has_bias;
    // A weight larger than one binding may cover comes in parts of whole
    // rows, one dispatch each (vk/split.rs): this part's rows are y's
    // columns [row0, row0 + n) of ldy.
    uint row0;
    uint ldy;
    // Split K (vk/ops/matmul.rs gemm_splits): workgroup z sums k values
    // [z * k_chunk, (z + 1) * k_chunk) into its own copy of y (m x ldy
    // floats apart), which split_sum.comp adds up; 0: one split.
    uint k_chunk;
    // EXPERTS (experts.glsl): slot s reads x row s / x_div; the experts
    // stacked in the weight.
    uint x_div;
    uint experts;
} pc;

#include "dequant.glsl"

const uint TILE = 64u;
const uint BK = 16u;
#define EXPERT_TILE_M TILE
#include "experts.glsl"

// +1 column of padding avoids shared-memory bank conflicts on the k loop.
shared float ws[TILE][BK + 1];
shared float xs[TILE][BK + 1];

void main() {
    uint n0 = gl_WorkGroupID.x * TILE;
    uint m0 = gl_WorkGroupID.y * TILE;
    uint tx = gl_LocalInvocationID.x;
    uint ty = gl_LocalInvocationID.y;
    uint tid = ty * 16u + tx;
    if (!expert_tile(m0, n0, TILE, tid, 256u)) {
        return;
    }
    bool vec_ok = (pc.k & 3u) == 0u;

    float acc[4][4];
    [[unroll]] for (uint a = 0u; a < 4u; a++) {
        [[unroll]] for (uint b = 0u; b < 4u; b++) {
            acc[a][b] = 0.0;
        }
    }

    // Each invocation loads 4 consecutive k values of one tile row.
    uint lr = tid / 4u;
    uint lk = (tid % 4u) * 4u;
    uint kbeg = gl_WorkGroupID.z * pc.k_chunk;
    uint kend = pc.k_chunk == 0u ? pc.k : min(pc.k, kbeg + pc.k_chunk);
    uint ybase = gl_WorkGroupID.z * pc.m * pc.ldy;
    for (uint k0 = kbeg; k0 < kend; k0 += BK) {
        uint kk = k0 + lk;
        uint wn = n0 + lr;
        vec4 wv = vec4(0.0);
        if (wn < pc.n) {
            if (vec_ok && kk + 3u < pc.k) {
                wv = dq4(w_row(wn) * pc.k + kk);
            } else {
                [[unroll]] for (uint j = 0u; j < 4u; j++) {
                    if (kk + j < pc.k) {
                        wv[j] = dq1(w_row(wn) * pc.k + kk + j);
                    }
                }
            }
        }
        uint xm = m0 + lr;
        vec4 xv = vec4(0.0);
        if (xm < m_rows()) {
            [[unroll]] for (uint j = 0u; j < 4u; j++) {
                if (kk + j < pc.k) {
                    xv[j] = x[x_row(xm) * pc.k + kk + j];
                }
            }
        }
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            ws[lr][lk + j] = wv[j];
            xs[lr][lk + j] = xv[j];
        }
        barrier();
        [[unroll]] for (uint j = 0u; j < BK; j++) {
            float wr[4];
            float xr[4];
            [[unroll]] for (uint a = 0u; a < 4u; a++) {
                wr[a] = ws[tx + 16u * a][j];
                xr[a] = xs[ty + 16u * a][j];
            }
            [[unroll]] for (uint a = 0u; a < 4u; a++) {
                [[unroll]] for (uint b = 0u; b < 4u; b++) {
                    acc[a][b] += wr[a] * xr[b];
                }
            }
        }
        barrier();
    }

    [[unroll]] for (uint a = 0u; a < 4u; a++) {
        uint col = n0 + tx + 16u * a;
        if (col >= pc.n) {
            continue;
        }
        float bv = pc.has_bias != 0u ? bias[pc.row0 + w_row(col)] : 0.0;
        [[unroll]] for (uint b = 0u; b < 4u; b++) {
            uint row = m0 + ty + 16u * b;
            if (row < m_rows()) {
                y[ybase + y_row(row) * pc.ldy + pc.row0 + col] = acc[a][b] + bv;
            }
        }
    }
}
