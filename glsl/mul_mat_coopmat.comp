// y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]) for many rows m on cooperative
// matrices (tensor cores): f16 inputs, f32 accumulation.
//
// Compiled per weight dtype, output tile and extension (coopmat.glsl) by
// build.rs; the backend picks the extension from the device's and its
// f16 x f16 -> f32 16x16x16 support.
//
// The output tile is a grid of WARPS_M x WARPS_N subgroups of 32 (the
// backend only picks this kernel where the subgroup size is 32), each
// computing 2 x 2 16 x 16 fragments: 128 x 128 from 16 subgroups by
// default, 64 x 64 from 4 with TILE_SMALL, which the backend takes where
// the large tile would leave the GPU short of workgroups (benches/README.md,
// prefill GEMM). The 16 subgroups of the large tile beat 8 of 4 x 2
// fragments each: the tile's fetch, not its multiplies, sets its pace, and
// twice the invocations share it (benches/README.md, prefill GEMM).
// K goes BK = 64 at a time through one shared buffer: while the subgroups
// multiply the slice in it, the next one is fetched from memory into
// registers (each invocation decodes runs of 16 weights of one row with
// dq16_half, one scale decode each), then stored, as f16, between two
// barriers. Two buffers of 32 (one barrier a step) is what 48 KiB of
// shared memory allows otherwise; the 64-wide slice gives each fetch twice
// the multiplies to hide behind, and ran faster (benches/README.md,
// prefill GEMM).
//
// Built with EXPERTS, the grouped GEMM of routed rows (experts.glsl).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#include "coopmat.glsl"
#include "common.glsl"

layout(binding = 0) readonly buffer W { uint wdata[]; };
layout(binding = 0) readonly buffer W4 { uvec4 wdata4[]; };
#define WDATA4
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer X4 { vec4 x4[]; };
// With X_HALF, x arrives as f16 (glsl/half_rows.comp), 8 values a uvec4.
layout(binding = 1) readonly buffer X16 { uvec4 x16[]; };
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

// Specialization constant 0: x is f16 (the backend takes it only where
// k % 16 == 0, the fast path). Converted once before the GEMM, since
// converting in every workgroup that reads x was slower (benches/README.md,
// prefill GEMM).
layout(constant_id = 0) const uint X_HALF = 0u;

#if defined(TILE_SMALL)
#define WARPS_M 2u
#define WARPS_N 2u
#else
#define WARPS_M 4u
#define WARPS_N 4u
#endif
#define FRAGS_M 2u
#define FRAGS_N 2u
const uint THREADS = WARPS_M * WARPS_N * 32u;
const uint BM = WARPS_M * FRAGS_M * 16u;
const uint BN = WARPS_N * FRAGS_N * 16u;
const uint BK = 64u;
const uint RUNS_PER_ROW = BK / 16u;
// Shared rows in units of 4 f16 (a uvec2: GL_NV_cooperative_matrix loads
// no f16 vectors): 2 more than BK / 4 so rows start 16 bytes apart modulo
// the bank width (fewer conflicts), and 16-byte aligned as fragment loads
// want.
const uint SK = BK / 4u + 2u;
// Runs of 16 weights (BN x BK values) and vec4s of x (BM x BK) per
// invocation per k slice.
const uint W_RUNS = (BN * BK / 16u + THREADS - 1u) / THREADS;
const uint X_LOADS = BM * BK / 4u / THREADS;
#define EXPERT_TILE_M BM
#include "experts.glsl"

layout(local_size_x = THREADS) in;

// The slice being multiplied; once the last is done, ws also stages
// fragments on their way out (bounds and bias): 256 floats a subgroup.
shared uvec2 ws[BN * SK];
shared uvec2 xs[BM * SK];

// The next slice in registers, already f16.
uvec2 wreg[W_RUNS * 4u];
uvec2 xreg[X_LOADS];

uvec2 half4(vec4 v) {
    return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));
}

// Fetch the k slice at k0 into registers where k % 16 == 0: 16-value runs
// never straddle a row. No branches, so the loads go out together
// (benches/README.md, prefill GEMM): a run past the weight's rows or k
// decodes block 0 and is zeroed by a select, and so is x past its rows; x
// comes 8 f16 a load where it is f16.
void fetch_fast(uint n0, uint m0, uint k0) {
    uint t = gl_LocalInvocationID.x;
    // Weights: run r is row r / RUNS_PER_ROW, values 16 (r % RUNS_PER_ROW) on.
    [[unroll]] for (uint i = 0u; i < W_RUNS; i++) {
        uint r = t + THREADS * i;
        uint wn = n0 + r / RUNS_PER_ROW;
        uint kk = k0 + (r % RUNS_PER_ROW) * 16u;
        bool ok = r < RUNS_PER_ROW * BN && wn < pc.n && kk < pc.k;
        uvec2 h[4];
        dq16_half(ok ? w_row(wn) * pc.k + kk : 0u, h);
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            wreg[4u * i + j] = ok ? h[j] : uvec2(0u);
        }
    }
    if (X_HALF != 0u) {
        // Invocation idx loads 8 values into xreg[2i], xreg[2i + 1].
        [[unroll]] for (uint i = 0u; i < X_LOADS / 2u; i++) {
            uint idx = t + THREADS * i;
            uint xm = m0 + idx / (BK / 8u);
            uint xk = k0 + (idx % (BK / 8u)) * 8u;
            bool ok = xm < m_rows() && xk < pc.k;
            uvec4 h = x16[ok ? (x_row(xm) * pc.k + xk) / 8u : 0u];
            h = ok ? h : uvec4(0u);
            xreg[2u * i] = h.xy;
            xreg[2u * i + 1u] = h.zw;
        }
        return;
    }
    // 16 consecutive invocations read one row's 64 values.
    [[unroll]] for (uint i = 0u; i < X_LOADS; i++) {
        uint idx = t + THREADS * i;
        uint xm = m0 + idx / (BK / 4u);
        uint xk = k0 + (idx % (BK / 4u)) * 4u;
        bool ok = xm < m_rows() && xk < pc.k;
        vec4 v = x4[ok ? (x_row(xm) * pc.k + xk) / 4u : 0u];
        xreg[i] = ok ? half4(v) : uvec2(0u);
    }
}

// fetch_fast for any k, element by element (x is never f16 here).
void fetch_any(uint n0, uint m0, uint k0) {
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (uint i = 0u; i < W_RUNS; i++) {
        uint r = t + THREADS * i;
        uint wn = n0 + r / RUNS_PER_ROW;
        uint kk = k0 + (r % RUNS_PER_ROW) * 16u;
        vec4 v[4];
        [[unroll]] for (uint j = 0u; j < 16u; j++) {
            float e = 0.0;
            if (r < RUNS_PER_ROW * BN && wn < pc.n && kk + j < pc.k) {
                e = dq1(w_row(wn) * pc.k + kk + j);
            }
            v[j / 4u][j % 4u] = e;
        }
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            wreg[4u * i + j] = half4(v[j]);
        }
    }
    [[unroll]] for (uint i = 0u; i < X_LOADS; i++) {
        uint idx = t + THREADS * i;
        uint xm = m0 + idx / (BK / 4u);
        uint xk = k0 + (idx % (BK / 4u)) * 4u;
        vec4 v = vec4(0.0);
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            if (xm < m_rows() && xk + j < pc.k) {
                v[j] = x[x_row(xm) * pc.k + xk + j];
            }
        }
        xreg[i] = half4(v);
    }
}

// Store the fetched slice into shared memory.
void store() {
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (uint i = 0u; i < W_RUNS; i++) {
        uint r = t + THREADS * i;
        if (r < RUNS_PER_ROW * BN) {
            uint at = (r / RUNS_PER_ROW) * SK + (r % RUNS_PER_ROW) * 4u;
            [[unroll]] for (uint j = 0u; j < 4u; j++) {
                ws[at + j] = wreg[4u * i + j];
            }
        }
    }
    if (X_HALF != 0u) {
        [[unroll]] for (uint i = 0u; i < X_LOADS / 2u; i++) {
            uint idx = t + THREADS * i;
            uint at = (idx / (BK / 8u)) * SK + (idx % (BK / 8u)) * 2u;
            xs[at] = xreg[2u * i];
            xs[at + 1u] = xreg[2u * i + 1u];
        }
        return;
    }
    [[unroll]] for (uint i = 0u; i < X_LOADS; i++) {
        uint idx = t + THREADS * i;
        xs[(idx / (BK / 4u)) * SK + idx % (BK / 4u)] = xreg[i];
    }
}

// The slices from kbeg into acc, each next one fetched with FETCH while
// the subgroups multiply the one in shared memory. A macro rather than a
// function taking the fetch as a flag: each loop compiles without the
// other's branches and acc stays in main. The fetch past the last slice
// reads in-range addresses only, and what it stores is never read.
#define MULTIPLY_SLICES(FETCH) \
    FETCH(n0, m0, kbeg); \
    store(); \
    barrier(); \
    for (uint s = 0u; s < steps; s++) { \
        FETCH(n0, m0, kbeg + (s + 1u) * BK); \
        [[unroll]] for (uint kk = 0u; kk < BK / 4u; kk += 4u) { \
            MAT_B fb[FRAGS_N]; \
            [[unroll]] for (uint b = 0u; b < FRAGS_N; b++) { \
                LOAD_COLS(fb[b], ws, (sn + 16u * b) * SK + kk, SK); \
            } \
            [[unroll]] for (uint a = 0u; a < FRAGS_M; a++) { \
                MAT_A fa; \
                LOAD_ROWS(fa, xs, (sm + 16u * a) * SK + kk, SK); \
                [[unroll]] for (uint b = 0u; b < FRAGS_N; b++) { \
                    acc[a][b] = MUL_ADD(fa, fb[b], acc[a][b]); \
                } \
            } \
        } \
        barrier(); \
        store(); \
        barrier(); \
    }

void main() {
    uint n0 = gl_WorkGroupID.x * BN;
    uint m0 = gl_WorkGroupID.y * BM;
    if (!expert_tile(m0, n0, BN, gl_LocalInvocationID.x, THREADS)) {
        return;
    }
    uint sg = gl_SubgroupID;
    uint sm = (sg / WARPS_N) * FRAGS_M * 16u;
    uint sn = (sg % WARPS_N) * FRAGS_N * 16u;

    MAT_C acc[FRAGS_M][FRAGS_N];
    [[unroll]] for (uint a = 0u; a < FRAGS_M; a++) {
        [[unroll]] for (uint b = 0u; b < FRAGS_N; b++) {
            acc[a][b] = MAT_C(0.0);
        }
    }

    uint kbeg = gl_WorkGroupID.z * pc.k_chunk;
    uint kend = pc.k_chunk == 0u ? pc.k : min(pc.k, kbeg + pc.k_chunk);
    uint ybase = gl_WorkGroupID.z * pc.m * pc.ldy;
    uint steps = (kend - kbeg + BK - 1u) / BK;
    if ((pc.k & 15u) == 0u) {
        MULTIPLY_SLICES(fetch_fast)
    } else {
        MULTIPLY_SLICES(fetch_any)
    }

    // Whole fragments without a bias go straight to y (16-byte aligned rows
    // as fragment stores want); the rest through shared memory.
    bool direct = !GATHERED && pc.has_bias == 0u && (pc.ldy & 3u) == 0u && (pc.row0 & 3u) == 0u;
    uint lane = gl_SubgroupInvocationID;
    [[unroll]] for (uint a = 0u; a < FRAGS_M; a++) {
        [[unroll]] for (uint b = 0u; b < FRAGS_N; b++) {
            uint row0 = m0 + sm + 16u * a;
            uint col0 = n0 + sn + 16u * b;
            if (direct && row0 + 16u <= pc.m && col0 + 16u <= pc.n) {
                STORE_ROWS(acc[a][b], y, ybase + row0 * pc.ldy + pc.row0 + col0, pc.ldy);
                continue;
            }
            // 16 floats a row: 8 uvec2s.
            STORE_ROWS(acc[a][b], ws, sg * 128u, 8u);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint e = lane; e < 256u; e += gl_SubgroupSize) {
                uint row = row0 + e / 16u;
                uint col = col0 + e % 16u;
                if (row < m_rows() && col < pc.n) {
                    float bv = pc.has_bias != 0u ? bias[pc.row0 + w_row(col)] : 0.0;
                    float v = uintBitsToFloat(ws[sg * 128u + e / 2u][e & 1u]);
                    y[ybase + y_row(row) * pc.ldy + pc.row0 + col] = v + bv;
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
