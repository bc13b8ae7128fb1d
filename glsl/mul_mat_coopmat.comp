// y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]) for many rows m on cooperative
// matrices (tensor cores): f16 inputs, f32 accumulation.
//
// Compiled twice per weight dtype by build.rs: -DCOOPMAT_KHR
// (GL_KHR_cooperative_matrix, needs a glslang that knows it) and
// -DCOOPMAT_NV (GL_NV_cooperative_matrix, which Debian's glslc compiles); the
// macros below are the only difference. The backend picks one from the
// device's extensions and its f16 x f16 -> f32 16x16x16 support.
//
// A workgroup of 128 invocations is 4 subgroups of 32 (the backend only
// picks this kernel where the subgroup size is 32) and computes a 64(m) x
// 128(n) output tile; subgroup s takes the 32 x 64 quarter (s / 2, s % 2):
// 2 x 4 fragments of 16 x 16. K goes BK = 32 at a time through two shared
// buffers: while the subgroups multiply one, the next k slice is fetched
// from memory into registers (W dequantized with dequant.glsl) and stored,
// as f16, into the other, so each step needs one barrier.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#if defined(COOPMAT_KHR)
#extension GL_KHR_cooperative_matrix : require
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MAT_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define LOAD_ROWS(mat, arr, off, stride) coopMatLoad(mat, arr, off, stride, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_COLS(mat, arr, off, stride) coopMatLoad(mat, arr, off, stride, gl_CooperativeMatrixLayoutColumnMajor)
#define STORE_ROWS(mat, arr, off, stride) coopMatStore(mat, arr, off, stride, gl_CooperativeMatrixLayoutRowMajor)
#define MUL_ADD(a, b, c) coopMatMulAdd(a, b, c)
#elif defined(COOPMAT_NV)
#extension GL_NV_cooperative_matrix : require
#define MAT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define LOAD_ROWS(mat, arr, off, stride) coopMatLoadNV(mat, arr, off, stride, false)
#define LOAD_COLS(mat, arr, off, stride) coopMatLoadNV(mat, arr, off, stride, true)
#define STORE_ROWS(mat, arr, off, stride) coopMatStoreNV(mat, arr, off, stride, false)
#define MUL_ADD(a, b, c) coopMatMulAddNV(a, b, c)
#else
#error "compile with -DCOOPMAT_KHR or -DCOOPMAT_NV"
#endif
#include "common.glsl"

layout(local_size_x = 128) in;

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
} pc;

#include "dequant.glsl"

const uint BM = 64u;
const uint BN = 128u;
const uint BK = 32u;
// Shared row stride in f16: 8 more than BK so rows start 16 bytes apart
// modulo the bank width (fewer conflicts), and a multiple of 16 bytes as
// fragment loads want.
const uint SK = BK + 8u;
// vec4 loads per invocation per k slice: W is BN x BK, x is BM x BK.
const uint W_LOADS = BN * BK / 4u / 128u;
const uint X_LOADS = BM * BK / 4u / 128u;

shared float16_t ws[2u * BN * SK];
shared float16_t xs[2u * BM * SK];
// One 16 x 16 f32 fragment per subgroup on its way out (bounds and bias).
shared float stage[4u * 256u];

vec4 wreg[W_LOADS];
vec4 xreg[X_LOADS];

// Fetch the k slice at k0 into registers; out-of-range elements are zeros.
void fetch(uint n0, uint m0, uint k0, bool vec_ok) {
    uint t = gl_LocalInvocationID.x;
    for (uint i = 0u; i < W_LOADS; i++) {
        uint idx = t + 128u * i;
        uint wn = n0 + idx / (BK / 4u);
        uint kk = k0 + (idx % (BK / 4u)) * 4u;
        vec4 v = vec4(0.0);
        if (wn < pc.n) {
            if (vec_ok && kk + 3u < pc.k) {
                v = dq4(wn * pc.k + kk);
            } else {
                for (uint j = 0u; j < 4u; j++) {
                    if (kk + j < pc.k) {
                        v[j] = dq1(wn * pc.k + kk + j);
                    }
                }
            }
        }
        wreg[i] = v;
    }
    for (uint i = 0u; i < X_LOADS; i++) {
        uint idx = t + 128u * i;
        uint xm = m0 + idx / (BK / 4u);
        uint kk = k0 + (idx % (BK / 4u)) * 4u;
        vec4 v = vec4(0.0);
        if (xm < pc.m) {
            for (uint j = 0u; j < 4u; j++) {
                if (kk + j < pc.k) {
                    v[j] = x[xm * pc.k + kk + j];
                }
            }
        }
        xreg[i] = v;
    }
}

// Store the fetched slice, as f16, into shared buffer `buf`.
void store(uint buf) {
    uint t = gl_LocalInvocationID.x;
    for (uint i = 0u; i < W_LOADS; i++) {
        uint idx = t + 128u * i;
        uint at = buf * BN * SK + (idx / (BK / 4u)) * SK + (idx % (BK / 4u)) * 4u;
        f16vec4 h = f16vec4(wreg[i]);
        for (uint j = 0u; j < 4u; j++) {
            ws[at + j] = h[j];
        }
    }
    for (uint i = 0u; i < X_LOADS; i++) {
        uint idx = t + 128u * i;
        uint at = buf * BM * SK + (idx / (BK / 4u)) * SK + (idx % (BK / 4u)) * 4u;
        f16vec4 h = f16vec4(xreg[i]);
        for (uint j = 0u; j < 4u; j++) {
            xs[at + j] = h[j];
        }
    }
}

void main() {
    uint n0 = gl_WorkGroupID.x * BN;
    uint m0 = gl_WorkGroupID.y * BM;
    uint sg = gl_SubgroupID;
    uint sm = (sg / 2u) * 32u;
    uint sn = (sg % 2u) * 64u;
    bool vec_ok = (pc.k & 3u) == 0u;

    MAT_C acc[2][4];
    for (uint a = 0u; a < 2u; a++) {
        for (uint b = 0u; b < 4u; b++) {
            acc[a][b] = MAT_C(0.0);
        }
    }

    uint steps = (pc.k + BK - 1u) / BK;
    fetch(n0, m0, 0u, vec_ok);
    store(0u);
    barrier();
    for (uint s = 0u; s < steps; s++) {
        uint cur = s & 1u;
        bool more = s + 1u < steps;
        if (more) {
            fetch(n0, m0, (s + 1u) * BK, vec_ok);
        }
        for (uint kk = 0u; kk < BK; kk += 16u) {
            MAT_A fa[2];
            for (uint a = 0u; a < 2u; a++) {
                LOAD_ROWS(fa[a], xs, cur * BM * SK + (sm + 16u * a) * SK + kk, SK);
            }
            for (uint b = 0u; b < 4u; b++) {
                MAT_B fb;
                LOAD_COLS(fb, ws, cur * BN * SK + (sn + 16u * b) * SK + kk, SK);
                for (uint a = 0u; a < 2u; a++) {
                    acc[a][b] = MUL_ADD(fa[a], fb, acc[a][b]);
                }
            }
        }
        // The other buffer was last read in step s - 1, before the barrier
        // that ended it.
        if (more) {
            store(cur ^ 1u);
        }
        barrier();
    }

    uint lane = gl_SubgroupInvocationID;
    for (uint a = 0u; a < 2u; a++) {
        for (uint b = 0u; b < 4u; b++) {
            STORE_ROWS(acc[a][b], stage, sg * 256u, 16u);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint e = lane; e < 256u; e += gl_SubgroupSize) {
                uint row = m0 + sm + 16u * a + e / 16u;
                uint col = n0 + sn + 16u * b + e % 16u;
                if (row < pc.m && col < pc.n) {
                    float bv = pc.has_bias != 0u ? bias[pc.row0 + col] : 0.0;
                    y[row * pc.ldy + pc.row0 + col] = stage[sg * 256u + e] + bv;
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
