// y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]) for few rows m: each subgroup
// computes whole output rows, reduced with subgroupAdd: no shared memory and
// no barriers. A workgroup owns `rows_per_wg` consecutive rows and its
// subgroups take them in turn, so the result is right whatever subgroup size
// the driver picks. Each weight value is loaded once and dotted with all m
// rows of x.
//
// The anchor models' quant types (q4_k, q6_k, q4_0, q4_1, q8_0) go block by
// block: a block is split into LANES slices, each invocation decodes its
// block's header once and then all quants of its slice with wide loads, so a
// subgroup reads consecutive bytes. Other types dequantize 4 elements at a
// time through dequant.glsl.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer W { uint wdata[]; };
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(binding = 3) readonly buffer B { float bias[]; };

layout(push_constant) uniform Push {
    uint n;
    uint k;
    uint m;
    uint has_bias;
    uint rows_per_wg;
    // A weight larger than one binding may cover comes in parts of whole
    // rows, one dispatch each (vk/split.rs): this part's rows are y's
    // columns [row0, row0 + n) of ldy.
    uint row0;
    uint ldy;
} pc;

#include "dequant.glsl"

// Rows of x handled by one dispatch (vk/ops/matmul.rs GEMV_MAX_ROWS).
const uint MAX_M = 4u;

#if defined(TYPE_Q4_K) || defined(TYPE_Q6_K) || defined(TYPE_Q4_0) || defined(TYPE_Q4_1) || defined(TYPE_Q8_0)
#define BLOCKWISE
// Quant columns are whole blocks (multiples of 32), so every slice starts on
// a multiple of 4 elements and x can be read as vec4.
layout(binding = 1) readonly buffer X4 { vec4 x4[]; };

vec4 xv(uint r, uint col) {
    return x4[(r * pc.k + col) >> 2];
}

vec4 ibytes4(uint w) {
    int s = int(w);
    return vec4(bitfieldExtract(s, 0, 8), bitfieldExtract(s, 8, 8),
                bitfieldExtract(s, 16, 8), bitfieldExtract(s, 24, 8));
}
#endif

#if defined(TYPE_Q4_K)
// 36-word blocks are 16-byte aligned, so each slice's quants are one uvec4.
layout(binding = 0) readonly buffer W4 { uvec4 wdata4[]; };
const uint QK = 256u;
const uint BWORDS = 36u;
// Slice s: chunk s/2 (64 elements), bytes 16(s%2)..+15 of its 32 quant bytes,
// low nibbles for sub-block 2c and high nibbles for 2c+1.
const uint LANES = 8u;

uint sbyte(uvec3 s, uint b) {
    return (s[b >> 2] >> ((b & 3u) * 8u)) & 0xFFu;
}

// ggml get_scale_min_k4 on the 12 scale bytes held in registers.
vec2 k_sm(uvec3 s, uint j) {
    if (j < 4u) {
        return vec2(sbyte(s, j) & 63u, sbyte(s, j + 4u) & 63u);
    }
    return vec2((sbyte(s, j + 4u) & 0xFu) | ((sbyte(s, j - 4u) >> 6) << 4),
                (sbyte(s, j + 4u) >> 4) | ((sbyte(s, j) >> 6) << 4));
}

void block_dot(uint base, uint col0, uint sub, uint m, inout float acc[MAX_M]) {
    uint c = sub >> 1;
    uint hf = sub & 1u;
    vec2 dm = unpackHalf2x16(wdata[base]);
    uvec3 s = uvec3(wdata[base + 1u], wdata[base + 2u], wdata[base + 3u]);
    vec2 sm0 = k_sm(s, 2u * c);
    vec2 sm1 = k_sm(s, 2u * c + 1u);
    uvec4 q = wdata4[(base + 4u + 8u * c + 4u * hf) >> 2];
    vec4 qlo[4];
    vec4 qhi[4];
    for (uint w = 0u; w < 4u; w++) {
        qlo[w] = bytes4(q[w] & 0x0F0F0F0Fu);
        qhi[w] = bytes4((q[w] >> 4) & 0x0F0F0F0Fu);
    }
    uint col = col0 + 64u * c + 16u * hf;
    for (uint r = 0u; r < MAX_M; r++) {
        if (r < m) {
            vec4 dlo = vec4(0.0), slo = vec4(0.0), dhi = vec4(0.0), shi = vec4(0.0);
            for (uint w = 0u; w < 4u; w++) {
                vec4 xl = xv(r, col + 4u * w);
                vec4 xh = xv(r, col + 32u + 4u * w);
                dlo += qlo[w] * xl;
                slo += xl;
                dhi += qhi[w] * xh;
                shi += xh;
            }
            vec4 one = vec4(1.0);
            acc[r] += dm.x * (sm0.x * dot(dlo, one) + sm1.x * dot(dhi, one))
                    - dm.y * (sm0.y * dot(slo, one) + sm1.y * dot(shi, one));
        }
    }
}

#elif defined(TYPE_Q6_K)
const uint QK = 256u;
const uint BWORDS = 53u;
// Slice s: half h = s/4, positions l0 = 8(s%4)..+7 of all four quarters.
const uint LANES = 8u;

void block_dot(uint base, uint col0, uint sub, uint m, inout float acc[MAX_M]) {
    uint h = sub >> 2;
    uint l0 = 8u * (sub & 3u);
    uint wo = l0 >> 2;
    uvec2 qa = uvec2(wdata[base + 16u * h + wo], wdata[base + 16u * h + wo + 1u]);
    uvec2 qb = uvec2(wdata[base + 16u * h + 8u + wo], wdata[base + 16u * h + 9u + wo]);
    uvec2 qh = uvec2(wdata[base + 32u + 8u * h + wo], wdata[base + 33u + 8u * h + wo]);
    // Scales 8h + l0/16 + 2t for quarters t = 0..3 sit in bytes of words 48+2h, 49+2h.
    vec4 sc = ibytes4(wdata[base + 48u + 2u * h]);
    vec4 sc2 = ibytes4(wdata[base + 49u + 2u * h]);
    float d = unpackHalf2x16(wdata[base + 52u]).x;
    vec4 st = (l0 >> 4) == 0u ? vec4(sc.x, sc.z, sc2.x, sc2.z) : vec4(sc.y, sc.w, sc2.y, sc2.w);
    st *= d;
    uint col = col0 + 128u * h + l0;
    for (uint r = 0u; r < MAX_M; r++) {
        if (r < m) {
            vec4 part = vec4(0.0);
            for (uint w = 0u; w < 2u; w++) {
                uint c = col + 4u * w;
                uint lo = qa[w] & 0x0F0F0F0Fu;
                uint lo2 = qb[w] & 0x0F0F0F0Fu;
                uint hi = (qa[w] >> 4) & 0x0F0F0F0Fu;
                uint hi2 = (qb[w] >> 4) & 0x0F0F0F0Fu;
                uint b = qh[w];
                part.x += dot(bytes4(lo | ((b & 0x03030303u) << 4)) - 32.0, xv(r, c));
                part.y += dot(bytes4(lo2 | (((b >> 2) & 0x03030303u) << 4)) - 32.0, xv(r, c + 32u));
                part.z += dot(bytes4(hi | (((b >> 4) & 0x03030303u) << 4)) - 32.0, xv(r, c + 64u));
                part.w += dot(bytes4(hi2 | (((b >> 6) & 0x03030303u) << 4)) - 32.0, xv(r, c + 96u));
            }
            acc[r] += dot(part, st);
        }
    }
}

#elif defined(TYPE_Q4_0) || defined(TYPE_Q4_1)
const uint QK = 32u;
const uint BWORDS = 5u;
// Slice s: quant bytes 8s..8s+7, i.e. elements 8s..+7 and 16+8s..+7.
const uint LANES = 2u;

void block_dot(uint base, uint col0, uint sub, uint m, inout float acc[MAX_M]) {
    vec2 dm = q4_dm(base);
    uint w0 = wdata[base + 1u + 2u * sub];
    uint w1 = wdata[base + 2u + 2u * sub];
    vec4 lo0 = bytes4(w0 & 0x0F0F0F0Fu), lo1 = bytes4(w1 & 0x0F0F0F0Fu);
    vec4 hi0 = bytes4((w0 >> 4) & 0x0F0F0F0Fu), hi1 = bytes4((w1 >> 4) & 0x0F0F0F0Fu);
    uint col = col0 + 8u * sub;
    for (uint r = 0u; r < MAX_M; r++) {
        if (r < m) {
            vec4 a = xv(r, col), b = xv(r, col + 4u);
            vec4 c = xv(r, col + 16u), e = xv(r, col + 20u);
            vec4 dq = lo0 * a + lo1 * b + hi0 * c + hi1 * e;
            vec4 sx = a + b + c + e;
            acc[r] += dm.x * dot(dq, vec4(1.0)) + dm.y * dot(sx, vec4(1.0));
        }
    }
}

#elif defined(TYPE_Q8_0)
const uint QK = 32u;
const uint BWORDS = 9u;
// Slice s: quant bytes (elements) 8s..8s+7.
const uint LANES = 4u;

void block_dot(uint base, uint col0, uint sub, uint m, inout float acc[MAX_M]) {
    float d = unpackHalf2x16(wdata[base]).x;
    vec4 q0 = ibytes4(wdata[base + 1u + 2u * sub]);
    vec4 q1 = ibytes4(wdata[base + 2u + 2u * sub]);
    uint col = col0 + 8u * sub;
    for (uint r = 0u; r < MAX_M; r++) {
        if (r < m) {
            acc[r] += d * (dot(q0, xv(r, col)) + dot(q1, xv(r, col + 4u)));
        }
    }
}
#endif

#if defined(BLOCKWISE)
// Slots are (block, slice) pairs of one row; two per step so each invocation
// has two blocks' loads in flight. `m` is a literal at every call site, so
// after inlining the row loops of block_dot have no branches.
void row_dot(uint row, uint m, inout float acc[MAX_M]) {
    uint nb = pc.k / QK;
    uint rowbase = row * nb * BWORDS;
    uint total = nb * LANES;
    uint width = gl_SubgroupSize;
    uint s = gl_SubgroupInvocationID;
    for (; s + width < total; s += 2u * width) {
        uint s2 = s + width;
        block_dot(rowbase + (s / LANES) * BWORDS, (s / LANES) * QK, s % LANES, m, acc);
        block_dot(rowbase + (s2 / LANES) * BWORDS, (s2 / LANES) * QK, s2 % LANES, m, acc);
    }
    if (s < total) {
        block_dot(rowbase + (s / LANES) * BWORDS, (s / LANES) * QK, s % LANES, m, acc);
    }
}
#else
void row_dot(uint row, uint m, inout float acc[MAX_M]) {
    uint lane = gl_SubgroupInvocationID;
    uint width = gl_SubgroupSize;
    uint wbase = row * pc.k;
    if ((pc.k & 3u) == 0u) {
        for (uint i = lane * 4u; i < pc.k; i += width * 4u) {
            vec4 wv = dq4(wbase + i);
            for (uint r = 0u; r < MAX_M; r++) {
                if (r < m) {
                    uint xb = r * pc.k + i;
                    acc[r] += dot(wv, vec4(x[xb], x[xb + 1u], x[xb + 2u], x[xb + 3u]));
                }
            }
        }
    } else {
        for (uint i = lane; i < pc.k; i += width) {
            float wv = dq1(wbase + i);
            for (uint r = 0u; r < MAX_M; r++) {
                if (r < m) {
                    acc[r] += wv * x[r * pc.k + i];
                }
            }
        }
    }
}
#endif

void main() {
    uint first = wg_linear() * pc.rows_per_wg;
    uint last = min(first + pc.rows_per_wg, pc.n);
    uint m = min(pc.m, MAX_M);
    for (uint row = first + gl_SubgroupID; row < last; row += gl_NumSubgroups) {
        float acc[MAX_M];
        for (uint r = 0u; r < MAX_M; r++) {
            acc[r] = 0.0;
        }
        if (m == 1u) {
            row_dot(row, 1u, acc);
        } else if (m == 2u) {
            row_dot(row, 2u, acc);
        } else if (m == 3u) {
            row_dot(row, 3u, acc);
        } else {
            row_dot(row, 4u, acc);
        }
        float b = pc.has_bias != 0u ? bias[pc.row0 + row] : 0.0;
        for (uint r = 0u; r < MAX_M; r++) {
            if (r < m) {
                float total = subgroupAdd(acc[r]);
                if (subgroupElect()) {
                    y[r * pc.ldy + pc.row0 + row] = total + b;
                }
            }
        }
    }
}
