// y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]) for few rows m, optionally with
// the RMS norm of each x row folded in and the result added to y:
//   y[r, j] (+)= inv_r · Σ_i W[j, i] · x[r, i] · nw[i] (+ bias[j]),
//   inv_r = 1 / sqrt(Σ_i x[r, i]² / k + eps)  (1 without the norm flag).
// The norm is a scalar per x row, so it is applied after the dot products;
// the workgroup reads every x value of its rows anyway, so Σx² costs no
// extra loads and the separate rms_norm dispatch disappears.
//
// Each group of invocations computes NR consecutive output rows, splitting
// the reduction dimension between them; a slice of x is loaded once into
// registers and dotted with the NR weight rows. The group is the workgroup
// (subgroup sums, then one step through shared memory) or, with the
// SUBGROUP_ROWS flag, each subgroup on rows of its own (subgroup sums only;
// vk/caps.rs GemvKernel, VKLLM_GEMV).
//
// Built with Q8X (mul_mat_vec_q8, for the types whose row in quants/types.rs
// gives integer-dot lanes: the legacy types, the K-quants, the ternary
// types, the IQ4 and MXFP4 tables and the i-quant grids), x comes
// as two int8 digits per value (hi + lo / 254 steps of its block's scale)
// from quantize_q8.comp, with the norm weights already applied and Σx²
// stored beside it, and each slot's sums are packed 4 x int8 dot products
// (one instruction per 4 weights and digit on GPUs that accelerate them):
// the f32 path's ~5 instructions per 4-bit weight bound it well below
// memory speed.
//
// With the Q8OUT flag a workgroup takes whole blocks of 32 outputs and also
// writes them as int8 digits (q8.glsl, bit for bit quantize_q8.comp's), so
// the GEMV reading them next needs no quantize dispatch (vk/ops/matmul.rs
// GLU_Q8OUT_MAX_BYTES says where that pays).
//
// Built with Q8IN (mul_mat_vec_q8in, for the Q8OUT GLU), each workgroup
// turns its one f32 x row into those digits itself, in shared memory, bit
// for bit as quantize_q8.comp would (quantize_x), so the GLU needs no
// quantize dispatch before it either.
//
// Built with GEMV_LANES (build.rs passes the type's lanes from its row in
// quants/types.rs), the kernel
// goes block by block: a block is split into LANES slices, each invocation
// decodes its block's header once and then all quants of its slice with
// wide loads, so neighbouring invocations read consecutive bytes; the
// type's block below must take exactly that many slices. Other types
// dequantize 4 elements at a time through dequant.glsl.
//
// Built with EXPERTS (mul_mat_vec_experts, and with Q8X too
// mul_mat_vec_q8_experts; vk/ops/matmul_experts.rs), a GEMV per
// mixture-of-experts slot: workgroup z is slot s, which reads expert
// ids[s]'s n rows of the stacked weight (rows ids[s] * n ..), x row
// s / x_div, and writes y row s (one x row per workgroup); a slot whose id
// is past the experts gets zeros and reads nothing.
#version 450
#extension GL_GOOGLE_include_directive : require

#if defined(Q8IN)
#define Q8X
#endif
#if defined(Q8X)
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer W { uint wdata[]; };
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(binding = 2) buffer Y { float y[]; };
layout(binding = 3) readonly buffer B { float bias[]; };
layout(binding = 4) readonly buffer NW { float nw[]; };
layout(binding = 4) readonly buffer NW4 { vec4 nw4[]; };

// Flag bits (vk/ops/matmul.rs GemvPush).
const uint HAS_BIAS = 1u;
const uint ADD = 2u;
const uint NORM = 4u;
// Each subgroup takes NR rows of its own (k split over its lanes) instead of
// the workgroup sharing NR rows (k split over all invocations).
const uint SUBGROUP_ROWS = 8u;
// GLU: the weight holds n gate rows then n up rows (and the bias, if any,
// n gate values then n up values); output j is
// act(gate_j · x + bg_j) * (up_j · x + bu_j), each group of NR weight rows
// yielding NR/2 outputs. GELU picks the tanh GELU over SiLU; SWIGLU_OAI gpt-oss's clamped
// SwiGLU, act(g) * (clamp(u, -7, 7) + 1) (as glu.comp).
const uint GLU = 16u;
const uint GELU = 32u;
const uint SWIGLU_OAI = 128u;
const float OAI_ALPHA = 1.702;
const float OAI_LIMIT = 7.0;
// Q8OUT (Q8X, SUBGROUP_ROWS, one x row, rows_per_wg a multiple of 32 up to
// Q8OUT_ROWS): the workgroup also writes its outputs into binding 5 as
// quantize_q8.comp would without a norm.
const uint Q8OUT = 64u;

layout(push_constant) uniform Push {
    uint n;
    uint k;
    uint m;
    uint flags;
    float eps;
    // SUBGROUP_ROWS: rows of one workgroup, taken NR at a time by its subgroups.
    uint rows_per_wg;
    // A weight larger than one binding may cover comes in parts of whole
    // rows, one dispatch each (vk/split.rs): this part's rows are y's
    // columns [row0, row0 + n) of ldy.
    uint row0;
    uint ldy;
    // EXPERTS: the experts stacked in the weight, and slot s's x row is
    // s / x_div.
    uint experts;
    uint x_div;
} pc;

#if defined(EXPERTS)
layout(binding = 6) readonly buffer Ids { uint ids[]; };
// The slot's expert's first weight row (set first thing in main).
uint expert_w0;
// The x and y rows of the workgroup's row r (r = 0: one per slot).
#define XROW(r) (gl_WorkGroupID.z / pc.x_div + (r))
#define YROW(r) (gl_WorkGroupID.z + (r))
#else
const uint expert_w0 = 0u;
#define XROW(r) (r)
#define YROW(r) (r)
#endif

#if defined(GEMV_LANES) && (defined(TYPE_IQ2_XXS) || defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S) || defined(TYPE_IQ3_XXS) || defined(TYPE_IQ3_S))
// The grid in shared memory (filled first thing in main): a group's entry
// is picked by its index, so lanes read scattered words, which the
// constant cache or L1 would serialize.
#define IQ_GRID_SHARED
#endif
#include "dequant.glsl"

#if defined(Q8X)
#define Q8_OUT_BINDING 5 // Q8OUT's digits
#include "q8.glsl"

// quantize_q8.comp's rows: k/4 words of hi digits, k/4 of lo digits (in
// q8_at's order),
// k/32 (d, Σx̂), Σx² of each 1024 values.
layout(binding = 1) readonly buffer XQ4 { uvec4 xq4[]; };
layout(binding = 1) readonly buffer XQF { float xqf[]; };

// quantize_q8.comp's workgroups per row, each storing its share of Σx².
uint xq_parts() {
    return (pc.k + 1023u) / 1024u;
}

#if defined(Q8IN)
// The workgroup's x row as quantize_q8.comp lays it out (from word 0):
// k/16 uvec4s of hi digits then k/16 of lo digits, and the blocks' (d, Σ)
// (float k/2 + i of the row at xinf[i]). The host keeps k within Q8IN_MAX_K.
const uint Q8IN_MAX_K = 4096u;
shared uvec4 xin4[Q8IN_MAX_K / 8u];
shared float xinf[Q8IN_MAX_K / 16u];
// Σx² of each subgroup's units per round (subgroups of at least 8), and
// the row's total.
shared float xin_ss[Q8IN_MAX_K / 32u];
shared float xin_sq;
// uvec4 i (q8.glsl's q8_at order) of x row r's hi and lo digits, and float
// i of the row.
#define X_HI4(r, i) xin4[i]
#define X_LO4(r, i) xin4[pc.k / 16u + (i)]
#define X_FLOAT(i) xinf[(i) - pc.k / 2u]
#else
#define X_HI4(r, i) xq4[(r) * xq_stride() / 4u + (i)]
#define X_LO4(r, i) xq4[(r) * xq_stride() / 4u + lo4() + (i)]
#define X_FLOAT(i) xqf[i]
#endif

// Rounded up to 4 words so every row's digits start 16-byte aligned.
uint xq_stride() {
    return (pc.k / 2u + pc.k / 16u + xq_parts() + 3u) & ~3u;
}

// Offset in uvec4s from a row's hi digits to its lo digits.
uint lo4() {
    return pc.k / 16u;
}

// x row r's block of 32 values from column col (a multiple of 32): hi
// digits of values 0..15 in xs[0], 16..31 in xs[1], lo digits in xs[2..3];
// ds: the block's (d, Σx̂).
void x_block(uint r, uint col, out uvec4 xs[4], out vec2 ds) {
    uint at0 = q8_at(col / 16u, pc.k);
    uint at1 = q8_at(col / 16u + 1u, pc.k);
    xs[0] = X_HI4(r, at0);
    xs[1] = X_HI4(r, at1);
    xs[2] = X_LO4(r, at0);
    xs[3] = X_LO4(r, at1);
    uint d = r * xq_stride() + pc.k / 2u + 2u * (col / 32u);
    ds = vec2(X_FLOAT(d), X_FLOAT(d + 1u));
}

// hi + lo / 254 of integer digit sums.
float digits(int hi, int lo) {
    return float(hi) + float(lo) * (1.0 / 254.0);
}

// OpSDotKHR on 4 x int8 packed in each operand (SPV_KHR_integer_dot_product;
// glslc 2023.2 lacks GL_EXT_integer_dot_product, so it is declared here),
// then a plain add: the sums cannot overflow, and OpSDotAccSatKHR's
// saturation, which NVIDIA's dp4a lacks, cost 8% of an 8B decode step (H200).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot(uint a, uint b, spirv_literal int packed_4x8);

int dot8(uint w, uint xv, int acc) {
    return acc + sdot(w, xv, 0);
}
#define XVEC uvec4
#define SUMS vec4
#else
#define XVEC vec4
#define SUMS vec2
#endif

// Weight rows per group (workgroup, or subgroup with SUBGROUP_ROWS), and
// rows of x one dispatch takes at most (vk/ops/matmul.rs GEMV_ROWS_*,
// GEMV_MAX_ROWS): the host specializes them, so one-row decode keeps only
// NR sums per invocation.
// Arrays take the largest sizes (spec-constant sizes break glslc's
// optimizer); after specialization every index is a constant, so the driver
// keeps only the used elements in registers.
layout(constant_id = 1) const uint NR = 4u;
layout(constant_id = 2) const uint MAX_M = 4u;
const uint NR_CAP = 8u;
const uint M_CAP = 4u;

// x[r, col..col+3] with the norm weights applied; its squares go to ss.
vec4 xv(uint r, uint col, inout float ss) {
    vec4 v = x4[(r * pc.k + col) >> 2];
    ss += dot(v, v);
    return (pc.flags & NORM) != 0u ? v * nw4[col >> 2] : v;
}

#if defined(Q8X) && !defined(GEMV_LANES)
#error "the integer-dot kernel goes block by block: build it with GEMV_LANES"
#endif

#if defined(GEMV_LANES)
#define BLOCKWISE
const uint LANES = GEMV_LANES;
#if !defined(IQ_GRID_SHARED)
// Words before the first block (the i-quants' grid).
const uint WORDS0 = 0u;
#endif

vec4 ibytes4(uint w) {
    int s = int(w);
    return vec4(bitfieldExtract(s, 0, 8), bitfieldExtract(s, 8, 8),
                bitfieldExtract(s, 16, 8), bitfieldExtract(s, 24, 8));
}

// The four bytes of w as floats, minus `bias`, without int-to-float
// conversions (a quarter-rate instruction on NVIDIA, and this kernel does one
// per weight): 2^23 + b has b in the mantissa, so OR it into 2^23's bits and
// subtract 2^23 + bias (exact for bytes).
vec4 fbytes4(uint w, float bias) {
    uvec4 b = uvec4(w, w >> 8, w >> 16, w >> 24) & 0xFFu;
    return uintBitsToFloat(b | 0x4B000000u) - (8388608.0 + bias);
}

// Bits 0..3 of h at bit 0 of each byte (q5's fifth bits): the multiply puts
// bit i at 8i (and the other copies where the mask drops them, without
// carries).
uint spread4(uint h) {
    return ((h & 0xFu) * 0x00204081u) & 0x01010101u;
}
#endif

#if defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// 36- and 44-word blocks are 16-byte aligned, so each slice's quants are one uvec4.
layout(binding = 0) readonly buffer W4 { uvec4 wdata4[]; };
#endif

#if defined(TYPE_Q4_K) || defined(TYPE_Q5_K)
// ggml get_scale_min_k4 for sub-blocks 2c and 2c + 1 on the 12 scale bytes
// held in registers: (scale, min) of each, (sc0, m0, sc1, m1). Both byte
// pairs sit at bytes 2(c % 2) of each word; every invocation computes both
// of ggml's cases and selects, so lanes on different c do not diverge.
vec4 k_sm2(uvec3 s, uint c) {
    uvec3 p = (s >> (16u * (c & 1u))) & 0xFFFFu;
    uvec2 lo = uvec2(p.x, p.y) & 0x3F3Fu;
    uvec2 hi = uvec2((p.z & 0x0F0Fu) | ((p.x >> 2) & 0x3030u),
                     ((p.z >> 4) & 0x0F0Fu) | ((p.y >> 2) & 0x3030u));
    uvec2 v = c < 2u ? lo : hi;
    return vec4(v.x & 0xFFu, v.y & 0xFFu, v.x >> 8, v.y >> 8);
}
#endif

#if defined(Q8X) && (defined(TYPE_Q4_K) || defined(TYPE_Q5_K) || defined(TYPE_Q6_K) || defined(TYPE_Q3_K) \
    || defined(TYPE_Q2_K))
// q8_run for rows of whole 64-value runs (K-quant rows are multiples of 256),
// without its tail case.
uint whole_run(uint grp, uint piece) {
    return piece * (pc.k / 64u) + grp;
}
#endif

#if !defined(BLOCKWISE)
#elif defined(Q8X) && (defined(TYPE_Q4_K) || defined(TYPE_Q5_K))
const uint QK = 256u;
#if defined(TYPE_Q4_K)
const uint BWORDS = 36u;
const uint QW = 4u; // first quant word
#else
const uint BWORDS = 44u;
const uint QW = 12u;
#endif
// Slot s: chunk s (64 values: sub-block 2s in the low nibbles of its 32
// quant bytes, 2s + 1 in the high ones; q5_k's fifth bits are bits 2s and
// 2s + 1 of the 32 qh bytes).
const uint XN = 8u;

// xs: the chunk's digits, 16 per uvec4: hi of sub-block 2s in xs[0..1], of
// 2s + 1 in xs[2..3], lo likewise in xs[4..7]; sums: (d, Σx̂) of both.
void load_x(uint r, uint col0, uint sub, out uvec4 xs[XN], out vec4 sums, inout float ss) {
    uint col = col0 + 64u * sub;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uint at = whole_run(col / 64u, i);
        xs[i] = X_HI4(r, at);
        xs[4u + i] = X_LO4(r, at);
    }
    uint d = r * xq_stride() + pc.k / 2u + 2u * (col / 32u);
    sums = vec4(X_FLOAT(d), X_FLOAT(d + 1u), X_FLOAT(d + 2u), X_FLOAT(d + 3u));
}

float slot_dot(uint base, uint sub, uvec4 xs[XN], vec4 sums) {
    uvec4 head = wdata4[base >> 2];
    vec2 dm = unpackHalf2x16(head.x);
    uvec3 s = head.yzw;
    vec4 sm = k_sm2(s, sub);
    vec2 sm0 = sm.xy;
    vec2 sm1 = sm.zw;
    uint q0 = (base + QW + 8u * sub) >> 2;
    ivec4 acc = ivec4(0); // (sub-block 2s hi, lo, 2s + 1 hi, lo)
    [[unroll]] for (uint h = 0u; h < 2u; h++) {
        uvec4 q = wdata4[q0 + h];
#if defined(TYPE_Q5_K)
        uvec4 qh = wdata4[((base + 4u) >> 2) + h] >> (2u * sub);
#endif
        [[unroll]] for (uint w = 0u; w < 4u; w++) {
            uint a = q[w] & 0x0F0F0F0Fu;
            uint b = (q[w] >> 4) & 0x0F0F0F0Fu;
#if defined(TYPE_Q5_K)
            a |= (qh[w] & 0x01010101u) << 4;
            b |= (qh[w] & 0x02020202u) << 3;
#endif
            acc.x = dot8(a, xs[h][w], acc.x);
            acc.y = dot8(a, xs[4u + h][w], acc.y);
            acc.z = dot8(b, xs[2u + h][w], acc.z);
            acc.w = dot8(b, xs[6u + h][w], acc.w);
        }
    }
    return dm.x * (sm0.x * sums.x * digits(acc.x, acc.y) + sm1.x * sums.z * digits(acc.z, acc.w))
         - dm.y * (sm0.y * sums.y + sm1.y * sums.w);
}

#elif defined(Q8X) && (defined(TYPE_Q6_K) || defined(TYPE_Q3_K) || defined(TYPE_Q2_K))
const uint QK = 256u;
// Slot s: half h = s/2, positions l = 16(s%2)..+15 of the half's four
// quarters t (elements 128h + 32t + l, each quarter one 16-value sub-block).
#if defined(TYPE_Q6_K)
const uint BWORDS = 53u;
const uint XN = 8u;
#elif defined(TYPE_Q3_K)
const uint BWORDS = 28u;
const uint XN = 8u;
#else
const uint BWORDS = 21u;
// And the quarters' digit sums (for q2_k's mins), hi in xs[8], lo in xs[9].
const uint XN = 10u;
#endif

// xs[t]: hi digits of quarter t's 16 values, xs[4 + t] the lo ones; sums[t]:
// the scale d of quarter t's block of 32.
void load_x(uint r, uint col0, uint sub, out uvec4 xs[XN], out vec4 sums, inout float ss) {
    uint col = col0 + 128u * (sub >> 1) + 16u * (sub & 1u);
    uint row = r * xq_stride();
    uint d = row + pc.k / 2u + 2u * (col / 32u);
    [[unroll]] for (uint t = 0u; t < 4u; t++) {
        // uvec4 col/16 + 2t: col/16 is 16·block + 8·(sub/2) + sub%2.
        uint at = whole_run(col / 64u + t / 2u, (sub & 1u) + 2u * (t & 1u));
        xs[t] = X_HI4(r, at);
        xs[4u + t] = X_LO4(r, at);
        sums[t] = X_FLOAT(d + 2u * t);
    }
#if defined(TYPE_Q2_K)
    ivec4 sh = ivec4(0);
    ivec4 sl = ivec4(0);
    [[unroll]] for (uint t = 0u; t < 4u; t++) {
        [[unroll]] for (uint w = 0u; w < 4u; w++) {
            sh[t] = dot8(0x01010101u, xs[t][w], sh[t]);
            sl[t] = dot8(0x01010101u, xs[4u + t][w], sl[t]);
        }
    }
    xs[8] = uvec4(sh);
    xs[9] = uvec4(sl);
#endif
}

#if defined(TYPE_Q2_K)
// Element 128n + 32t + l (slot s: n = s/2, l = 16(s%2)..+15 of quarter t)
// is bit pair t of quant byte 32n + l; quarter t's scale byte 8n + 2t + s%2
// holds its 4-bit scale (low) and min (high).
float slot_dot(uint base, uint sub, uvec4 xs[XN], vec4 sums) {
    uint n = sub >> 1;
    uint j = sub & 1u;
    ivec4 hi = ivec4(0);
    ivec4 lo = ivec4(0);
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        uint q = wdata[base + 4u + 8u * n + 4u * j + w];
        [[unroll]] for (uint t = 0u; t < 4u; t++) {
            uint v = (q >> (2u * t)) & 0x03030303u;
            hi[t] = dot8(v, xs[t][w], hi[t]);
            lo[t] = dot8(v, xs[4u + t][w], lo[t]);
        }
    }
    uvec2 sw = uvec2(wdata[base + 2u * n], wdata[base + 2u * n + 1u]) >> (8u * j);
    uvec4 sb = uvec4(sw.x, sw.x >> 16, sw.y, sw.y >> 16) & 0xFFu;
    vec4 dots = vec4(digits(hi.x, lo.x), digits(hi.y, lo.y), digits(hi.z, lo.z), digits(hi.w, lo.w));
    ivec4 sh = ivec4(xs[8]);
    ivec4 sl = ivec4(xs[9]);
    vec4 xsum = vec4(digits(sh.x, sl.x), digits(sh.y, sl.y), digits(sh.z, sl.z), digits(sh.w, sl.w));
    vec2 dm = unpackHalf2x16(wdata[base + 20u]);
    return dm.x * dot(vec4(sb & 0xFu) * sums, dots) - dm.y * dot(vec4(sb >> 4) * sums, xsum);
}
#elif defined(TYPE_Q3_K)
// Element 128n + 32t + l (slot s: n = s/2, l = 16(s%2)..+15 of quarter t)
// is bit pair t of quant byte 32n + l plus 4 times bit 4n + t of hmask byte
// l, minus 4: each byte made the signed value through 128 (no borrows
// between bytes), so a packed dot takes the -4 for free.
float slot_dot(uint base, uint sub, uvec4 xs[XN], vec4 sums) {
    uint n = sub >> 1;
    uint j = sub & 1u;
    ivec4 hi = ivec4(0);
    ivec4 lo = ivec4(0);
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        uint q = wdata[base + 8u + 8u * n + 4u * j + w];
        uint hm = wdata[base + 4u * j + w] >> (4u * n);
        [[unroll]] for (uint t = 0u; t < 4u; t++) {
            uint v = ((q >> (2u * t)) & 0x03030303u) | (((hm >> t) & 0x01010101u) << 2);
            v = ((v | 0x80808080u) - 0x04040404u) ^ 0x80808080u;
            hi[t] = dot8(v, xs[t][w], hi[t]);
            lo[t] = dot8(v, xs[4u + t][w], lo[t]);
        }
    }
    // Quarter t's scale: 8n + 2t + j.
    uint j0 = 8u * n + j;
    vec4 sc = vec4(q3_scale_int(base, j0), q3_scale_int(base, j0 + 2u), q3_scale_int(base, j0 + 4u),
                   q3_scale_int(base, j0 + 6u));
    vec4 dots = vec4(digits(hi.x, lo.x), digits(hi.y, lo.y), digits(hi.z, lo.z), digits(hi.w, lo.w));
    return unpackHalf2x16(wdata[base + 27u]).x * dot(sc * sums, dots);
}
#else
// Each 6-bit quant q goes to the top of its byte with the high bit flipped:
// the signed byte 4(q - 32), so a packed dot takes the zero point for free
// (its sums are 4x, undone at the end). Quarter t's two high bits are bits
// 2t..2t+1 of the qh byte; flipping the upper of each pair once per word
// (0xAA) flips every quarter's sign bit.
float slot_dot(uint base, uint sub, uvec4 xs[XN], vec4 sums) {
    uint h = sub >> 1;
    uint j = sub & 1u;
    uint qa = base + 16u * h + 4u * j; // ql bytes 64h + 16j..: quarters 0 (low), 2 (high)
    uint qb = qa + 8u;                 // ql bytes 64h + 32 + 16j..: quarters 1, 3
    uint qhw = base + 32u + 8u * h + 4u * j;
    ivec4 hi = ivec4(0);
    ivec4 lo = ivec4(0);
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        uint a = wdata[qa + w];
        uint b = wdata[qb + w];
        uint e = wdata[qhw + w] ^ 0xAAAAAAAAu;
        uvec4 q = uvec4(((a << 2) & 0x3C3C3C3Cu) | ((e << 6) & 0xC0C0C0C0u),
                        ((b << 2) & 0x3C3C3C3Cu) | ((e << 4) & 0xC0C0C0C0u),
                        ((a >> 2) & 0x3C3C3C3Cu) | ((e << 2) & 0xC0C0C0C0u),
                        ((b >> 2) & 0x3C3C3C3Cu) | (e & 0xC0C0C0C0u));
        [[unroll]] for (uint t = 0u; t < 4u; t++) {
            hi[t] = dot8(q[t], xs[t][w], hi[t]);
            lo[t] = dot8(q[t], xs[4u + t][w], lo[t]);
        }
    }
    // Scales 8h + j + 2t: bytes j, 2 + j of words 48 + 2h (t = 0, 1) and 49 + 2h (t = 2, 3).
    int s01 = int(wdata[base + 48u + 2u * h]);
    int s23 = int(wdata[base + 49u + 2u * h]);
    vec4 sc = vec4(bitfieldExtract(s01, int(8u * j), 8), bitfieldExtract(s01, int(8u * j + 16u), 8),
                   bitfieldExtract(s23, int(8u * j), 8), bitfieldExtract(s23, int(8u * j + 16u), 8));
    vec4 dots = vec4(digits(hi.x, lo.x), digits(hi.y, lo.y), digits(hi.z, lo.z), digits(hi.w, lo.w));
    return 0.25 * unpackHalf2x16(wdata[base + 52u]).x * dot(sc * sums, dots);
}
#endif

#elif defined(Q8X) && (defined(TYPE_Q4_0) || defined(TYPE_Q4_1) || defined(TYPE_Q8_0) \
    || defined(TYPE_Q5_0) || defined(TYPE_Q5_1))
const uint QK = 32u;
#if defined(TYPE_Q8_0)
const uint BWORDS = 9u;
#elif defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
const uint BWORDS = 6u;
const uint QW = 2u; // first quant word, after qh
#else
const uint BWORDS = 5u;
const uint QW = 1u;
#endif
// One slot per block; xs: its 32 hi digits, then its 32 lo digits; sums:
// (d, Σx̂).
const uint XN = 4u;

void load_x(uint r, uint col0, uint sub, out uvec4 xs[XN], out vec4 sums, inout float ss) {
    vec2 ds;
    x_block(r, col0, xs, ds);
    sums = vec4(ds, 0.0, 0.0);
}

float slot_dot(uint base, uint sub, uvec4 xs[XN], vec4 sums) {
    int hi = 0;
    int lo = 0;
#if defined(TYPE_Q8_0)
    [[unroll]] for (uint w = 0u; w < 8u; w++) {
        uint q = wdata[base + 1u + w];
        hi = dot8(q, xs[w >> 2][w & 3u], hi);
        lo = dot8(q, xs[2u + (w >> 2)][w & 3u], lo);
    }
    return unpackHalf2x16(wdata[base]).x * sums.x * digits(hi, lo);
#else
    // Byte j: value j in the low nibble, value 16 + j in the high one
    // (q5: their fifth bits, qh bits j and 16 + j).
#if defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
    uint qh = wdata[base + 1u];
#endif
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        uint q = wdata[base + QW + w];
        uint a = q & 0x0F0F0F0Fu;
        uint b = (q >> 4) & 0x0F0F0F0Fu;
#if defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
        a |= spread4(qh >> (4u * w)) << 4;
        b |= spread4(qh >> (16u + 4u * w)) << 4;
#endif
        hi = dot8(a, xs[0][w], hi);
        lo = dot8(a, xs[2][w], lo);
        hi = dot8(b, xs[1][w], hi);
        lo = dot8(b, xs[3][w], lo);
    }
#if defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
    vec2 dm = q5_dm(base);
#else
    vec2 dm = q4_dm(base);
#endif
    return dm.x * sums.x * digits(hi, lo) + dm.y * sums.y;
#endif
}

#elif defined(Q8X) && defined(TYPE_TQ1_0)
const uint QK = 256u;
const uint BWORDS = 14u;
// Slot s (of 4), as the f32 slices below: quant bytes 8s..8s+7 (elements
// 32n + 8s..+7, activation block n), bytes 32 + 4s..+3 (elements
// 160 + 16n + 4s..+3, block 5 + n/2) and trit s of the qh bytes
// (elements 240 + 4s..+3, block 7).
const uint XN = 9u;

// xs[n], n < 5: hi, hi, lo, lo digits of elements 32n + 8s..+7; xs[5 + j/2]:
// hi and lo digits of the middle bytes' trit j (x, y for even j, z, w for
// odd), j = 5 being the qh trit; sums: blocks 0..3's scales d, xs[8]
// blocks 4..7's (as float bits: eight scales, one vec4 of sums).
void load_x(uint r, uint col0, uint sub, out uvec4 xs[XN], out vec4 sums, inout float ss) {
    uint d = r * xq_stride() + pc.k / 2u + 2u * (col0 / 32u);
    [[unroll]] for (uint n = 0u; n < 5u; n++) {
        uint at = q8_at(col0 / 16u + 2u * n + (sub >> 1), pc.k);
        uvec4 h = X_HI4(r, at);
        uvec4 l = X_LO4(r, at);
        xs[n] = (sub & 1u) == 0u ? uvec4(h.xy, l.xy) : uvec4(h.zw, l.zw);
    }
    [[unroll]] for (uint j = 0u; j < 6u; j += 2u) {
        uint a = q8_at(col0 / 16u + 10u + j, pc.k);
        uint b = q8_at(col0 / 16u + 11u + j, pc.k);
        xs[5u + j / 2u] = uvec4(X_HI4(r, a)[sub], X_LO4(r, a)[sub], X_HI4(r, b)[sub],
                                X_LO4(r, b)[sub]);
    }
    [[unroll]] for (uint b = 0u; b < 4u; b++) {
        sums[b] = X_FLOAT(d + 2u * b);
        xs[8][b] = floatBitsToUint(X_FLOAT(d + 8u + 2u * b));
    }
}

// Trit n of each byte of w as the signed byte t (see the TQ2_0 slot below).
uint tq1_signed(uint w, uint n) {
    return (tq1_trits4(w, n) + 0x7F7F7F7Fu) ^ 0x80808080u;
}

float slot_dot(uint base, uint sub, uvec4 xs[XN], vec4 sums) {
    uvec2 a = uvec2(wdata[base + 2u * sub], wdata[base + 2u * sub + 1u]);
    uint b = wdata[base + 8u + sub];
    // Per activation block: hi0 / lo0 blocks 0..3, hi1 / lo1 blocks 4..7.
    ivec4 hi0 = ivec4(0), lo0 = ivec4(0), hi1 = ivec4(0), lo1 = ivec4(0);
    [[unroll]] for (uint n = 0u; n < 5u; n++) {
        uint t0 = tq1_signed(a.x, n);
        uint t1 = tq1_signed(a.y, n);
        int h = dot8(t1, xs[n].y, dot8(t0, xs[n].x, 0));
        int l = dot8(t1, xs[n].w, dot8(t0, xs[n].z, 0));
        if (n < 4u) {
            hi0[n] += h;
            lo0[n] += l;
        } else {
            hi1.x += h;
            lo1.x += l;
        }
        uint tm = tq1_signed(b, n);
        uvec2 xm = (n & 1u) == 0u ? xs[5u + n / 2u].xy : xs[5u + n / 2u].zw;
        hi1[1u + n / 2u] = dot8(tm, xm.x, hi1[1u + n / 2u]);
        lo1[1u + n / 2u] = dot8(tm, xm.y, lo1[1u + n / 2u]);
    }
    uint tq = tq1_signed(wdata[base + 12u], sub);
    hi1.w = dot8(tq, xs[7].z, hi1.w);
    lo1.w = dot8(tq, xs[7].w, lo1.w);
    vec4 d0 = vec4(hi0) + vec4(lo0) * (1.0 / 254.0);
    vec4 d1 = vec4(hi1) + vec4(lo1) * (1.0 / 254.0);
    return tq1_d(base) * (dot(sums, d0) + dot(uintBitsToFloat(xs[8]), d1));
}

#elif defined(Q8X) && defined(TYPE_TQ2_0)
const uint QK = 256u;
const uint BWORDS = 17u;
// Slot s (of 4): quant words 4s..4s+3, bytes 16(s%2)..+15 of half c = s/2,
// all four bit pairs p: elements 128c + 32p + 16(s%2)..+15, half of
// activation block 4c + p.
const uint XN = 8u;

// xs[p]: hi digits of bit pair p's 16 values, xs[4 + p] their lo digits;
// sums[p]: the scale d of their block.
void load_x(uint r, uint col0, uint sub, out uvec4 xs[XN], out vec4 sums, inout float ss) {
    uint col = col0 + 128u * (sub >> 1) + 16u * (sub & 1u);
    uint d = r * xq_stride() + pc.k / 2u;
    [[unroll]] for (uint p = 0u; p < 4u; p++) {
        uint at = q8_at((col + 32u * p) / 16u, pc.k);
        xs[p] = X_HI4(r, at);
        xs[4u + p] = X_LO4(r, at);
        sums[p] = X_FLOAT(d + 2u * ((col + 32u * p) / 32u));
    }
}

// The stored t + 1 becomes the signed byte t ((q + 127) ^ 128, no carry
// between bytes), so the packed dots need no zero-point term.
float slot_dot(uint base, uint sub, uvec4 xs[XN], vec4 sums) {
    ivec4 hi = ivec4(0);
    ivec4 lo = ivec4(0);
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        uint q = wdata[base + 4u * sub + w];
        [[unroll]] for (uint p = 0u; p < 4u; p++) {
            uint t = (((q >> (2u * p)) & 0x03030303u) + 0x7F7F7F7Fu) ^ 0x80808080u;
            hi[p] = dot8(t, xs[p][w], hi[p]);
            lo[p] = dot8(t, xs[4u + p][w], lo[p]);
        }
    }
    vec4 dots = vec4(digits(hi.x, lo.x), digits(hi.y, lo.y), digits(hi.z, lo.z),
                     digits(hi.w, lo.w));
    return unpackHalf2x16(wdata[base + 16u]).x * dot(sums, dots);
}

#elif defined(Q8X) && (defined(TYPE_MXFP4) || defined(TYPE_IQ4_NL) || defined(TYPE_IQ4_XS))
// 4-bit indices into a 16-value table of small integers (dequant.glsl's
// LUT16_TABLE), q4_0's nibble order, one scale per 32 values. Slot s: one
// such sub-block (sub-block s of an IQ4_XS block, the block of the others).
#if defined(TYPE_MXFP4)
const uint QK = 32u;
const uint BWORDS = 5u;
float lut_scale(uint base, uint b) {
    return mxfp4_d(base);
}
#else
const uint BWORDS = BW; // QK and BW: dequant.glsl's
float lut_scale(uint base, uint b) {
    return iq4_sub_scale(base, b);
}
#endif
const uint XN = 4u;
#define LUT_PAIRS
// Byte b's two values as int8: its low nibble's in byte 0, its high
// nibble's in byte 2 (filled first thing in main). Quant byte j holds
// elements j and 16 + j, so T[b0] | T[b1] << 8 packs elements (j, j + 1,
// 16 + j, 17 + j): four lookups give a word's 8 values as 2 packed words,
// against x digits rearranged the same way once per slot (load_x).
shared uint lut_pairs[256];

uint lut_pair_entry(uint b) {
    vec4 v = lut16_bytes(LUT16_TABLE, (b & 0xFu) | ((b >> 4) << 8));
    return (uint(int(v.x)) & 0xFFu) | ((uint(int(v.y)) & 0xFFu) << 16);
}

// Digit words (elements 4w..4w+3 in a, 16+4w.. in b) as (4w, 4w+1, 16+4w,
// 17+4w) and (4w+2, 4w+3, 18+4w, 19+4w).
uvec2 pair_digits(uint a, uint b) {
    return uvec2(bitfieldInsert(a, b, 16, 16), bitfieldInsert(b, a >> 16, 0, 16));
}

// xs: the sub-block's digits in pair_digits' order, hi in xs[0..1] (words
// 2w, 2w + 1 from quant word w), lo in xs[2..3]; sums.x: x's block scale.
void load_x(uint r, uint col0, uint sub, out uvec4 xs[XN], out vec4 sums, inout float ss) {
    uvec4 raw[4];
    vec2 ds;
    x_block(r, col0 + 32u * sub, raw, ds);
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        uvec2 h = pair_digits(raw[0][w], raw[1][w]);
        uvec2 l = pair_digits(raw[2][w], raw[3][w]);
        xs[w >> 1][2u * (w & 1u)] = h.x;
        xs[w >> 1][2u * (w & 1u) + 1u] = h.y;
        xs[2u + (w >> 1)][2u * (w & 1u)] = l.x;
        xs[2u + (w >> 1)][2u * (w & 1u) + 1u] = l.y;
    }
    sums = vec4(ds.x, 0.0, 0.0, 0.0);
}

float slot_dot(uint base, uint sub, uvec4 xs[XN], vec4 sums) {
    int hi = 0;
    int lo = 0;
    uint q0 = base + BWORDS - QK / 8u + 4u * sub;
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        uint q = wdata[q0 + w];
        uint a = lut_pairs[q & 0xFFu] | (lut_pairs[(q >> 8) & 0xFFu] << 8);
        uint b = lut_pairs[(q >> 16) & 0xFFu] | (lut_pairs[q >> 24] << 8);
        hi = dot8(a, xs[w >> 1][2u * (w & 1u)], hi);
        lo = dot8(a, xs[2u + (w >> 1)][2u * (w & 1u)], lo);
        hi = dot8(b, xs[w >> 1][2u * (w & 1u) + 1u], hi);
        lo = dot8(b, xs[2u + (w >> 1)][2u * (w & 1u) + 1u], lo);
    }
    return lut_scale(base, sub) * sums.x * digits(hi, lo);
}

#elif defined(Q8X) && (defined(TYPE_IQ2_XXS) || defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S) \
    || defined(TYPE_IQ3_XXS) || defined(TYPE_IQ3_S))
// The i-quant grid types (dequant.glsl: grid entries of unsigned bytes, the
// grid in shared memory, 8 sign bits per group of 8 values). Slot s:
// sub-block s (4 groups), one x block; its scale per 32 values, or per 16
// (IQ2_XS, IQ2_S: groups 0-1 and 2-3), so the dots sum per half.
const uint QK = 256u;
const uint BWORDS = BW;
const uint WORDS0 = GW;
const uint XN = 4u;

// Grid bytes g with the bytes whose sign bit (the low 4 of s) is set
// negated: no grid value is 0, so ~g + 1 carries into no other byte.
uint signed_grid(uint g, uint s) {
    uint one = spread4(s);
    return (g ^ (one * 0xFFu)) + one;
}

// xs: the sub-block's digits, hi of values 0..15 in xs[0], 16..31 in xs[1],
// lo in xs[2..3]; sums.x: x's block scale.
void load_x(uint r, uint col0, uint sub, out uvec4 xs[XN], out vec4 sums, inout float ss) {
    vec2 ds;
    x_block(r, col0 + 32u * sub, xs, ds);
    sums = vec4(ds.x, 0.0, 0.0, 0.0);
}

float slot_dot(uint base, uint sub, uvec4 xs[XN], vec4 sums) {
    ivec4 acc = ivec4(0); // (groups 0-1 hi, lo, groups 2-3 hi, lo)
    [[unroll]] for (uint l = 0u; l < 4u; l++) {
        uint s = iq_signs(base, sub, l);
        [[unroll]] for (uint h = 0u; h < 2u; h++) {
            uint t = signed_grid(iq_grid_word(base, sub, l, h), s >> (4u * h));
            uint w = 2u * l + h; // x word of values 4w..4w+3
            acc[2u * (l >> 1)] = dot8(t, xs[w >> 2][w & 3u], acc[2u * (l >> 1)]);
            acc[2u * (l >> 1) + 1u] = dot8(t, xs[2u + (w >> 2)][w & 3u], acc[2u * (l >> 1) + 1u]);
        }
    }
    return sums.x * (iq_db(base, sub, 0u) * digits(acc.x, acc.y)
                     + iq_db(base, sub, 2u) * digits(acc.z, acc.w));
}

#elif defined(TYPE_Q4_K)
const uint QK = 256u;
const uint BWORDS = 36u;
// Slice s: chunk s/2 (64 elements), bytes 16(s%2)..+15 of its 32 quant bytes,
// low nibbles for sub-block 2c and high nibbles for 2c+1.
const uint XN = 8u;

// x of slice `sub` of the block at column col0: 16 low-nibble then 16
// high-nibble elements; `sums` their two sums (the min terms need them).
void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    uint col = col0 + 64u * (sub >> 1) + 16u * (sub & 1u);
    vec4 slo = vec4(0.0), shi = vec4(0.0);
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        xs[w] = xv(r, col + 4u * w, ss);
        xs[4u + w] = xv(r, col + 32u + 4u * w, ss);
        slo += xs[w];
        shi += xs[4u + w];
    }
    sums = vec2(dot(slo, vec4(1.0)), dot(shi, vec4(1.0)));
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    uint c = sub >> 1;
    uvec4 head = wdata4[base >> 2];
    vec2 dm = unpackHalf2x16(head.x);
    uvec3 s = head.yzw;
    vec4 sm = k_sm2(s, c);
    vec2 sm0 = sm.xy;
    vec2 sm1 = sm.zw;
    uvec4 q = wdata4[(base + 4u + 8u * c + 4u * (sub & 1u)) >> 2];
    vec4 dlo = vec4(0.0), dhi = vec4(0.0);
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        dlo += fbytes4(q[w] & 0x0F0F0F0Fu, 0.0) * xs[w];
        dhi += fbytes4((q[w] >> 4) & 0x0F0F0F0Fu, 0.0) * xs[4u + w];
    }
    return dm.x * (sm0.x * dot(dlo, vec4(1.0)) + sm1.x * dot(dhi, vec4(1.0)))
         - dm.y * (sm0.y * sums.x + sm1.y * sums.y);
}

#elif defined(TYPE_Q6_K)
const uint QK = 256u;
const uint BWORDS = 53u;
// Slice s: half h = s/4, positions l0 = 8(s%4)..+7 of all four quarters.
const uint XN = 8u;

// xs[2t + w]: quarter t, positions l0 + 4w..+3.
void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    uint col = col0 + 128u * (sub >> 2) + 8u * (sub & 3u);
    [[unroll]] for (uint t = 0u; t < 4u; t++) {
        xs[2u * t] = xv(r, col + 32u * t, ss);
        xs[2u * t + 1u] = xv(r, col + 32u * t + 4u, ss);
    }
    sums = vec2(0.0);
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
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
    vec4 part = vec4(0.0);
    [[unroll]] for (uint w = 0u; w < 2u; w++) {
        uint lo = qa[w] & 0x0F0F0F0Fu;
        uint lo2 = qb[w] & 0x0F0F0F0Fu;
        uint hi = (qa[w] >> 4) & 0x0F0F0F0Fu;
        uint hi2 = (qb[w] >> 4) & 0x0F0F0F0Fu;
        uint b = qh[w];
        part.x += dot(fbytes4(lo | ((b & 0x03030303u) << 4), 32.0), xs[w]);
        part.y += dot(fbytes4(lo2 | (((b >> 2) & 0x03030303u) << 4), 32.0), xs[2u + w]);
        part.z += dot(fbytes4(hi | (((b >> 4) & 0x03030303u) << 4), 32.0), xs[4u + w]);
        part.w += dot(fbytes4(hi2 | (((b >> 6) & 0x03030303u) << 4), 32.0), xs[6u + w]);
    }
    return d * dot(part, st);
}

#elif defined(TYPE_TQ1_0)
const uint QK = 256u;
const uint BWORDS = 14u;
// Slice s (of 4): quant bytes 8s..8s+7 (all five trits: elements
// 32n + 8s..+7), bytes 32 + 4s..+3 (elements 160 + 16n + 4s..+3) and
// trit s of the four qh bytes (elements 240 + 4s..+3): 64 elements, the
// same work in every slice.
const uint XN = 16u;

// xs[2n], xs[2n + 1]: the first bytes' trit n; xs[10 + n]: the middle
// bytes' trit n; xs[15]: the qh trit.
void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    [[unroll]] for (uint n = 0u; n < 5u; n++) {
        xs[2u * n] = xv(r, col0 + 32u * n + 8u * sub, ss);
        xs[2u * n + 1u] = xv(r, col0 + 32u * n + 8u * sub + 4u, ss);
        xs[10u + n] = xv(r, col0 + 160u + 16u * n + 4u * sub, ss);
    }
    xs[15] = xv(r, col0 + 240u + 4u * sub, ss);
    sums = vec2(0.0);
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    uvec2 a = uvec2(wdata[base + 2u * sub], wdata[base + 2u * sub + 1u]);
    uint b = wdata[base + 8u + sub];
    vec4 acc = fbytes4(tq1_trits4(wdata[base + 12u], sub), 1.0) * xs[15];
    [[unroll]] for (uint n = 0u; n < 5u; n++) {
        acc += fbytes4(tq1_trits4(a.x, n), 1.0) * xs[2u * n]
             + fbytes4(tq1_trits4(a.y, n), 1.0) * xs[2u * n + 1u]
             + fbytes4(tq1_trits4(b, n), 1.0) * xs[10u + n];
    }
    return tq1_d(base) * dot(acc, vec4(1.0));
}

#elif defined(TYPE_TQ2_0)
const uint QK = 256u;
const uint BWORDS = 17u;
// Slice s (of 8): quant bytes 8s..8s+7, i.e. bytes 8(s%4).. of half
// c = s/4, all four bit pairs p: elements 128c + 32p + 8(s%4)..+7.
const uint XN = 8u;

// xs[2p], xs[2p + 1]: bit pair p's 8 elements.
void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    uint col = col0 + 128u * (sub >> 2) + 8u * (sub & 3u);
    [[unroll]] for (uint p = 0u; p < 4u; p++) {
        xs[2u * p] = xv(r, col + 32u * p, ss);
        xs[2u * p + 1u] = xv(r, col + 32u * p + 4u, ss);
    }
    sums = vec2(0.0);
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    uvec2 q = uvec2(wdata[base + 2u * sub], wdata[base + 2u * sub + 1u]);
    vec4 acc = vec4(0.0);
    [[unroll]] for (uint p = 0u; p < 4u; p++) {
        // fbytes4's bias turns the stored t + 1 into t.
        acc += fbytes4((q.x >> (2u * p)) & 0x03030303u, 1.0) * xs[2u * p]
             + fbytes4((q.y >> (2u * p)) & 0x03030303u, 1.0) * xs[2u * p + 1u];
    }
    return unpackHalf2x16(wdata[base + 16u]).x * dot(acc, vec4(1.0));
}

#elif defined(TYPE_Q4_0) || defined(TYPE_Q4_1)
const uint QK = 32u;
const uint BWORDS = 5u;
// Slice s: quant bytes 8s..8s+7, i.e. elements 8s..+7 and 16+8s..+7.
const uint XN = 4u;

void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    uint col = col0 + 8u * sub;
    xs[0] = xv(r, col, ss);
    xs[1] = xv(r, col + 4u, ss);
    xs[2] = xv(r, col + 16u, ss);
    xs[3] = xv(r, col + 20u, ss);
    sums = vec2(dot(xs[0] + xs[1] + xs[2] + xs[3], vec4(1.0)), 0.0);
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    vec2 dm = q4_dm(base);
    uint w0 = wdata[base + 1u + 2u * sub];
    uint w1 = wdata[base + 2u + 2u * sub];
    vec4 dq = fbytes4(w0 & 0x0F0F0F0Fu, 0.0) * xs[0] + fbytes4(w1 & 0x0F0F0F0Fu, 0.0) * xs[1]
            + fbytes4((w0 >> 4) & 0x0F0F0F0Fu, 0.0) * xs[2]
            + fbytes4((w1 >> 4) & 0x0F0F0F0Fu, 0.0) * xs[3];
    return dm.x * dot(dq, vec4(1.0)) + dm.y * sums.x;
}

#elif defined(TYPE_Q8_0)
const uint QK = 32u;
const uint BWORDS = 9u;
// Slice s: quant bytes (elements) 8s..8s+7.
const uint XN = 2u;

void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    uint col = col0 + 8u * sub;
    xs[0] = xv(r, col, ss);
    xs[1] = xv(r, col + 4u, ss);
    sums = vec2(0.0);
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    float d = unpackHalf2x16(wdata[base]).x;
    // Flipping the sign bits makes the signed bytes q + 128.
    return d * (dot(fbytes4(wdata[base + 1u + 2u * sub] ^ 0x80808080u, 128.0), xs[0])
              + dot(fbytes4(wdata[base + 2u + 2u * sub] ^ 0x80808080u, 128.0), xs[1]));
}
#elif defined(TYPE_MXFP4) || defined(TYPE_IQ4_NL) || defined(TYPE_IQ4_XS)
// 4-bit indices into a 16-value table (dequant.glsl's), in 32-value
// sub-blocks of 4 quant words each laid out as q4_0's (word w holding
// elements 4w..4w+3 in its low nibbles and 16+4w.. in its high ones), each
// sub-block with one scale. Slice s: quant words WPS·s..WPS·s+WPS-1 of the
// block's QWORDS, within one sub-block (WPS <= 4: MXFP4 and IQ4_NL take 1,
// 2 or 4 lanes, IQ4_XS 8, 16 or 32), so its scale is decoded once.
#if defined(TYPE_MXFP4)
const uint QK = 32u;
const uint BWORDS = 5u;
float lut16_scale(uint base, uint b) {
    return mxfp4_d(base);
}
#else
const uint BWORDS = BW; // QK and BW: dequant.glsl's
float lut16_scale(uint base, uint b) {
    return iq4_sub_scale(base, b);
}
#endif
const uint QWORDS = QK / 8u;
const uint QW0 = BWORDS - QWORDS; // the quants end the block
const uint WPS = QWORDS / LANES;
const uint XN = 2u * WPS;

// The table in shared memory (filled first thing in main): 16 floats sit in
// 16 banks, so any mix of indices reads without conflicts, where the
// constant array's divergent indices serialize.
shared float lut16[16];

vec4 lut16_4(uint w) {
    return vec4(lut16[w & 0xFu], lut16[(w >> 8) & 0xFu], lut16[(w >> 16) & 0xFu],
                lut16[(w >> 24) & 0xFu]);
}

void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    [[unroll]] for (uint w = 0u; w < WPS; w++) {
        uint qw = WPS * sub + w;
        uint col = col0 + 32u * (qw >> 2) + 4u * (qw & 3u);
        xs[w] = xv(r, col, ss);
        xs[WPS + w] = xv(r, col + 16u, ss);
    }
    sums = vec2(0.0);
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    vec4 dq = vec4(0.0);
    [[unroll]] for (uint w = 0u; w < WPS; w++) {
        uint q = wdata[base + QW0 + WPS * sub + w];
        dq += lut16_4(q) * xs[w] + lut16_4(q >> 4) * xs[WPS + w];
    }
    return lut16_scale(base, (WPS * sub) >> 2) * dot(dq, vec4(1.0));
}
#elif defined(TYPE_Q5_0) || defined(TYPE_Q5_1)
const uint QK = 32u;
const uint BWORDS = 6u;
// Slice s: quant words WPS·s.. of the block's 4 (as q4_0's, word w holding
// elements 4w..4w+3 in its low nibbles and 16+4w.. in its high ones), their
// fifth bits from qh bits 4w.. and 16+4w.. (1, 2 or 4 lanes).
const uint WPS = 4u / LANES;
const uint XN = 2u * WPS;

void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    vec4 sum = vec4(0.0);
    [[unroll]] for (uint w = 0u; w < WPS; w++) {
        uint col = col0 + 4u * (WPS * sub + w);
        xs[w] = xv(r, col, ss);
        xs[WPS + w] = xv(r, col + 16u, ss);
        sum += xs[w] + xs[WPS + w];
    }
    sums = vec2(dot(sum, vec4(1.0)), 0.0);
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    vec2 dm = q5_dm(base);
    uint qh = wdata[base + 1u];
    vec4 dq = vec4(0.0);
    [[unroll]] for (uint w = 0u; w < WPS; w++) {
        uint qw = WPS * sub + w;
        uint q = wdata[base + 2u + qw];
        uint lo = (q & 0x0F0F0F0Fu) | (spread4(qh >> (4u * qw)) << 4);
        uint hi = ((q >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16u + 4u * qw)) << 4);
        dq += fbytes4(lo, 0.0) * xs[w] + fbytes4(hi, 0.0) * xs[WPS + w];
    }
    return dm.x * dot(dq, vec4(1.0)) + dm.y * sums.x;
}

#elif defined(TYPE_Q5_K)
const uint QK = 256u;
const uint BWORDS = 44u;
// As q4_k's slices (chunk s/2, quant bytes 16(s%2)..+15 of its 32), with
// the fifth bits from qh bytes 16(s%2)..+15: bit 2c for the low nibbles,
// 2c + 1 for the high ones.
const uint XN = 8u;

void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    uint col = col0 + 64u * (sub >> 1) + 16u * (sub & 1u);
    vec4 slo = vec4(0.0), shi = vec4(0.0);
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        xs[w] = xv(r, col + 4u * w, ss);
        xs[4u + w] = xv(r, col + 32u + 4u * w, ss);
        slo += xs[w];
        shi += xs[4u + w];
    }
    sums = vec2(dot(slo, vec4(1.0)), dot(shi, vec4(1.0)));
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    uint c = sub >> 1;
    uvec4 head = wdata4[base >> 2];
    vec2 dm = unpackHalf2x16(head.x);
    vec4 sm = k_sm2(head.yzw, c);
    uvec4 q = wdata4[(base + 12u + 8u * c + 4u * (sub & 1u)) >> 2];
    uvec4 qh = wdata4[(base + 4u + 4u * (sub & 1u)) >> 2];
    vec4 dlo = vec4(0.0), dhi = vec4(0.0);
    [[unroll]] for (uint w = 0u; w < 4u; w++) {
        uint h = qh[w] >> (2u * c);
        uint lo = (q[w] & 0x0F0F0F0Fu) | ((h & 0x01010101u) << 4);
        uint hi = ((q[w] >> 4) & 0x0F0F0F0Fu) | ((h & 0x02020202u) << 3);
        dlo += fbytes4(lo, 0.0) * xs[w];
        dhi += fbytes4(hi, 0.0) * xs[4u + w];
    }
    return dm.x * (sm.x * dot(dlo, vec4(1.0)) + sm.z * dot(dhi, vec4(1.0)))
         - dm.y * (sm.y * sums.x + sm.w * sums.y);
}

#elif defined(TYPE_Q2_K) || defined(TYPE_Q3_K)
const uint QK = 256u;
#if defined(TYPE_Q2_K)
const uint BWORDS = 21u;
const uint QW = 4u; // first quant word
#else
const uint BWORDS = 28u;
const uint QW = 8u;
#endif
// Element 128n + 32p + l is bit pair p of quant byte 32n + l. Slice s:
// half n = s / (LANES/2), positions l0 = PL·(s % (LANES/2))..+PL-1 of its
// four quarters p (8 lanes: 8 positions, 16 lanes: 4), all within one
// 16-value scale each.
const uint HS = LANES / 2u;
const uint WPS = 8u / HS; // quant words of a slice
const uint XN = 4u * WPS;

void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    uint col = col0 + 128u * (sub / HS) + 4u * WPS * (sub % HS);
    [[unroll]] for (uint p = 0u; p < 4u; p++) {
        [[unroll]] for (uint w = 0u; w < WPS; w++) {
            xs[WPS * p + w] = xv(r, col + 32u * p + 4u * w, ss);
        }
    }
    sums = vec2(0.0);
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    uint n = sub / HS;
    uint l0 = 4u * WPS * (sub % HS);
    uint qw = base + QW + 8u * n + l0 / 4u;
    vec4 part = vec4(0.0);
#if defined(TYPE_Q2_K)
    vec4 xsum = vec4(0.0);
#endif
    [[unroll]] for (uint w = 0u; w < WPS; w++) {
        uint q = wdata[qw + w];
#if defined(TYPE_Q3_K)
        // The high bit of element (n, p, l) is bit 4n + p of hmask byte l;
        // clear means 4 less.
        uint hm = wdata[base + l0 / 4u + w] >> (4u * n);
#endif
        [[unroll]] for (uint p = 0u; p < 4u; p++) {
            uint v = (q >> (2u * p)) & 0x03030303u;
#if defined(TYPE_Q2_K)
            part[p] += dot(fbytes4(v, 0.0), xs[WPS * p + w]);
            xsum[p] += dot(xs[WPS * p + w], vec4(1.0));
#else
            v |= ((hm >> p) & 0x01010101u) << 2;
            part[p] += dot(fbytes4(v, 4.0), xs[WPS * p + w]);
#endif
        }
    }
    // Scale j = 8n + 2p + l0/16 for quarter p.
    uint j0 = 8u * n + l0 / 16u;
#if defined(TYPE_Q2_K)
    // Scale byte j: 4-bit scale (low), 4-bit min (high).
    uvec2 sw = uvec2(wdata[base + 2u * n], wdata[base + 2u * n + 1u]) >> (8u * (l0 / 16u));
    uvec4 sb = uvec4(sw.x, sw.x >> 16, sw.y, sw.y >> 16) & 0xFFu;
    vec2 dm = unpackHalf2x16(wdata[base + 20u]);
    return dm.x * dot(vec4(sb & 0xFu), part) - dm.y * dot(vec4(sb >> 4), xsum);
#else
    vec4 sc = vec4(q3_scale_int(base, j0), q3_scale_int(base, j0 + 2u), q3_scale_int(base, j0 + 4u),
                   q3_scale_int(base, j0 + 6u));
    return unpackHalf2x16(wdata[base + 27u]).x * dot(sc, part);
#endif
}

#elif defined(TYPE_IQ2_XXS) || defined(TYPE_IQ2_XS) || defined(TYPE_IQ2_S) || defined(TYPE_IQ3_XXS) \
    || defined(TYPE_IQ3_S)
// The i-quant grid types: groups of 8 values, each from a grid entry
// (dequant.glsl iq_grid_word, the grid in shared memory) with 8 sign bits and
// its sub-block's (IQ2_XS, IQ2_S: half sub-block's) scale. Slice s: groups
// GPS·s..GPS·s+GPS-1 of the block's 32 (8 lanes: one sub-block, 16: half,
// 32: one group). The blocks follow the grid's GW words.
const uint QK = 256u;
const uint BWORDS = BW;
const uint WORDS0 = GW;
const uint GPS = 32u / LANES;
const uint XN = 2u * GPS;

void load_x(uint r, uint col0, uint sub, out vec4 xs[XN], out vec2 sums, inout float ss) {
    uint col = col0 + 8u * GPS * sub;
    [[unroll]] for (uint g = 0u; g < GPS; g++) {
        xs[2u * g] = xv(r, col + 8u * g, ss);
        xs[2u * g + 1u] = xv(r, col + 8u * g + 4u, ss);
    }
    sums = vec2(0.0);
}

// The four grid bytes of w as floats, negated where sign bits s (the low 4)
// are set: the bits go straight into the floats' sign bits.
vec4 iq_signed4(uint w, uint s) {
    uvec4 neg = (uvec4(s << 31, s << 30, s << 29, s << 28)) & 0x80000000u;
    return uintBitsToFloat(floatBitsToUint(fbytes4(w, 0.0)) ^ neg);
}

float slot_dot(uint base, uint sub, vec4 xs[XN], vec2 sums) {
    float acc = 0.0;
    [[unroll]] for (uint g = 0u; g < GPS; g++) {
        uint grp = GPS * sub + g;
        uint ib = grp >> 2;
        uint l = grp & 3u;
        uint s = iq_signs(base, ib, l);
        float v = dot(iq_signed4(iq_grid_word(base, ib, l, 0u), s), xs[2u * g])
                + dot(iq_signed4(iq_grid_word(base, ib, l, 1u), s >> 4), xs[2u * g + 1u]);
        acc += iq_db(base, ib, l) * v;
    }
    return acc;
}

#elif defined(Q8X)
#error "no integer-dot decode here for this type (its int_dot_lanes in quants/types.rs)"
#else
#error "no block-by-block decode here for this type (its lanes in quants/types.rs)"
#endif

// Outputs per group of NR weight rows.
uint out_rows() {
    return (pc.flags & GLU) != 0u ? NR / 2u : NR;
}

// Weight row j of the group whose first output is row0, clamped to the last
// row (duplicates are computed but never stored).
uint weight_row(uint row0, uint j) {
    if ((pc.flags & GLU) != 0u) {
        uint h = NR / 2u;
        return expert_w0
               + (j < h ? min(row0 + j, pc.n - 1u) : pc.n + min(row0 + j - h, pc.n - 1u));
    }
    return expert_w0 + min(row0 + j, pc.n - 1u);
}

float act(float v) {
    if ((pc.flags & GELU) != 0u) {
        // As glu.comp: tanh's argument clamped (some drivers overflow to NaN).
        float t = clamp(0.7978845608028654 * (v + 0.044715 * v * v * v), -15.0, 15.0);
        return 0.5 * v * (1.0 + tanh(t));
    }
    if ((pc.flags & SWIGLU_OAI) != 0u) {
        float g = min(v, OAI_LIMIT);
        return g / (1.0 + exp(-OAI_ALPHA * g));
    }
    return v / (1.0 + exp(-v));
}

// This invocation's share (slices lane, lane + width, ...) of rows
// row0..row0+NR-1 (clamped to the last row: duplicates are computed but never
// stored). `m` is a literal at every call site, so after inlining the row
// loops have no branches.
#if defined(BLOCKWISE)
void rows_dot(uint row0, uint lane, uint width, uint m, inout float acc[NR_CAP * M_CAP], inout float ss[M_CAP]) {
    uint nb = pc.k / QK;
    uint rowbase[NR_CAP];
    [[unroll]] for (uint j = 0u; j < NR; j++) {
        rowbase[j] = WORDS0 + weight_row(row0, j) * nb * BWORDS;
    }
    for (uint s = lane; s < nb * LANES; s += width) {
        uint blk = s / LANES;
        uint sub = s % LANES;
        [[unroll]] for (uint r = 0u; r < MAX_M; r++) {
            if (r < m) {
                XVEC xs[XN];
                SUMS sums;
                load_x(XROW(r), blk * QK, sub, xs, sums, ss[r]);
                [[unroll]] for (uint j = 0u; j < NR; j++) {
                    acc[j * MAX_M + r] += slot_dot(rowbase[j] + blk * BWORDS, sub, xs, sums);
                }
            }
        }
    }
}
#else
void rows_dot(uint row0, uint lane, uint width, uint m, inout float acc[NR_CAP * M_CAP], inout float ss[M_CAP]) {
    uint wbase[NR_CAP];
    [[unroll]] for (uint j = 0u; j < NR; j++) {
        wbase[j] = weight_row(row0, j) * pc.k;
    }
    if ((pc.k & 3u) == 0u) {
        for (uint i = lane * 4u; i < pc.k; i += width * 4u) {
            [[unroll]] for (uint r = 0u; r < MAX_M; r++) {
                if (r < m) {
                    vec4 xs = xv(XROW(r), i, ss[r]);
                    [[unroll]] for (uint j = 0u; j < NR; j++) {
                        acc[j * MAX_M + r] += dot(dq4(wbase[j] + i), xs);
                    }
                }
            }
        }
    } else {
        for (uint i = lane; i < pc.k; i += width) {
            [[unroll]] for (uint r = 0u; r < MAX_M; r++) {
                if (r < m) {
                    float v = x[XROW(r) * pc.k + i];
                    ss[r] += v * v;
                    float xs = (pc.flags & NORM) != 0u ? v * nw[i] : v;
                    [[unroll]] for (uint j = 0u; j < NR; j++) {
                        acc[j * MAX_M + r] += dq1(wbase[j] + i) * xs;
                    }
                }
            }
        }
    }
}
#endif

// Subgroup partial sums on their way to the workgroup's total: NR * MAX_M
// dot products and MAX_M sums of squares per subgroup.
const uint MAX_SUBGROUPS = 32u;
shared float part_acc[MAX_SUBGROUPS][NR_CAP * M_CAP];
shared float part_ss[MAX_SUBGROUPS][M_CAP];
#if defined(Q8X)
// Q8OUT: a workgroup's outputs (rows_per_wg at most).
const uint Q8OUT_ROWS = 64u;
shared float qo[Q8OUT_ROWS];
#endif

// What storing output (row, x row r) reads besides its dot products: the
// bias, y's old value (ADD) and, for int8 x with the norm, x's Σx² parts.
// Loaded before the dot products: each would otherwise be one more memory
// round trip at the end, and the small decode GEMVs are bound by latency.
struct Extra {
    float bias;
    // GLU: the up row's bias (the weight's rows n on, like its rows).
    float up_bias;
    float y;
    float sq;
};

Extra load_extra(uint row, uint r) {
    Extra e = Extra(0.0, 0.0, 0.0, 0.0);
    if ((pc.flags & HAS_BIAS) != 0u) {
        e.bias = bias[pc.row0 + expert_w0 + row];
        if ((pc.flags & GLU) != 0u) {
            e.up_bias = bias[pc.row0 + expert_w0 + pc.n + row];
        }
    }
    if ((pc.flags & ADD) != 0u) {
        e.y = y[YROW(r) * pc.ldy + pc.row0 + row];
    }
#if defined(Q8IN)
    if ((pc.flags & NORM) != 0u) {
        e.sq = xin_sq;
    }
#elif defined(Q8X)
    if ((pc.flags & NORM) != 0u) {
        uint parts = XROW(r) * xq_stride() + pc.k / 2u + pc.k / 16u;
        for (uint p = 0u; p < xq_parts(); p++) {
            e.sq += xqf[parts + p];
        }
    }
#endif
    return e;
}

// Output (row, x row r) from its dot product (and with GLU the up row's,
// `up`), Σx² and what load_extra read for it.
void store(uint row, uint r, float total, float up, float sq, Extra e) {
    if ((pc.flags & NORM) != 0u) {
#if defined(Q8X)
        sq = e.sq;
#endif
        float inv = inversesqrt(sq / float(pc.k) + pc.eps);
        total *= inv;
        up *= inv;
    }
    if ((pc.flags & HAS_BIAS) != 0u) {
        total += e.bias;
        up += e.up_bias;
    }
    if ((pc.flags & GLU) != 0u) {
        if ((pc.flags & SWIGLU_OAI) != 0u) {
            up = clamp(up, -OAI_LIMIT, OAI_LIMIT) + 1.0;
        }
        total = act(total) * up;
    }
    if ((pc.flags & ADD) != 0u) {
        total += e.y;
    }
    y[YROW(r) * pc.ldy + pc.row0 + row] = total;
#if defined(Q8X)
    if ((pc.flags & Q8OUT) != 0u) {
        qo[row % pc.rows_per_wg] = total;
    }
#endif
}

#if defined(Q8IN)
// x's one row into xin4 / xinf, and its Σx² into xin_sq, bit for bit as
// quantize_q8.comp computes them: unit u (4 values) in the lane it has there
// (q8_unit_index(), rounds of a workgroup), and Σx² summed as there, by
// subgroup, then 1024 values' subgroups in order, then those parts in
// order (load_extra). Every invocation calls it.
void quantize_x() {
    uint units = pc.k / 4u;
    for (uint base = 0u; base < units; base += gl_WorkGroupSize.x) {
        uint u = base + q8_unit_index();
        bool live = u < units;
        // Both loads issued before the subgroup sum waits on x.
        vec4 v = live ? x4[u] : vec4(0.0);
        vec4 g = live && (pc.flags & NORM) != 0u ? nw4[u] : vec4(1.0);
        float ss = subgroupAdd(dot(v, v));
        Q8Unit dg = q8_unit(v * g); // every lane: a block is live or not as a whole
        if (live) {
            xin4[q8_at(u / 4u, pc.k)][u % 4u] = dg.hi;
            xin4[pc.k / 16u + q8_at(u / 4u, pc.k)][u % 4u] = dg.lo;
            if (u % 8u == 0u) {
                xinf[u / 4u] = dg.block.x;
                xinf[u / 4u + 1u] = dg.block.y;
            }
        }
        uint first = base + gl_SubgroupID * gl_SubgroupSize;
        if (subgroupElect() && first < units) {
            xin_ss[first / gl_SubgroupSize] = ss;
        }
    }
    barrier();
    if (gl_LocalInvocationIndex == 0u && (pc.flags & NORM) != 0u) {
        uint chunks = (units + gl_SubgroupSize - 1u) / gl_SubgroupSize;
        uint per_part = 256u / gl_SubgroupSize; // quantize_q8.comp's workgroup
        float sq = 0.0;
        for (uint c0 = 0u; c0 < chunks; c0 += per_part) {
            float part = 0.0;
            for (uint c = c0; c < min(c0 + per_part, chunks); c++) {
                part += xin_ss[c];
            }
            sq += part;
        }
        xin_sq = sq;
    }
    barrier();
}
#endif

#if defined(Q8X)
// Q8OUT: the workgroup's outputs [first, last) (whole blocks of 32) as
// int8 digits, rows of pc.n values.
void store_q8(uint first, uint last) {
    barrier(); // qo complete
    uint qu = q8_unit_index();
    if (qu < (last - first) / 4u) {
        vec4 v = vec4(qo[4u * qu], qo[4u * qu + 1u], qo[4u * qu + 2u], qo[4u * qu + 3u]);
        q8_store(0u, pc.n, first / 4u + qu, q8_unit(v));
    }
}
#endif

// The NR × MAX_M dot products and MAX_M sums of squares of rows row0.., this
// subgroup's share summed.
void rows(uint row0, uint lane, uint width, uint m, out float acc[NR_CAP * M_CAP], out float ss[M_CAP]) {
    [[unroll]] for (uint i = 0u; i < NR * MAX_M; i++) {
        acc[i] = 0.0;
    }
    [[unroll]] for (uint r = 0u; r < MAX_M; r++) {
        ss[r] = 0.0;
    }
    if (m == 1u) {
        rows_dot(row0, lane, width, 1u, acc, ss);
    } else if (m == 2u) {
        rows_dot(row0, lane, width, 2u, acc, ss);
    } else if (m == 3u) {
        rows_dot(row0, lane, width, 3u, acc, ss);
    } else {
        rows_dot(row0, lane, width, 4u, acc, ss);
    }
    [[unroll]] for (uint i = 0u; i < NR * MAX_M; i++) {
        acc[i] = subgroupAdd(acc[i]);
    }
    [[unroll]] for (uint r = 0u; r < MAX_M; r++) {
        ss[r] = subgroupAdd(ss[r]);
    }
}

#if defined(EXPERTS)
// Whether the workgroup's slot has an expert; if not, zeros in its output
// rows (the workgroup's, from wg_rows outputs per workgroup). Uniform.
bool routed(uint wg_rows) {
    uint e = ids[gl_WorkGroupID.z];
    if (e < pc.experts) {
        // A GLU's expert holds 2n rows: its gate's n, then its up's.
        expert_w0 = e * ((pc.flags & GLU) != 0u ? 2u * pc.n : pc.n);
        return true;
    }
    uint first = wg_linear() * wg_rows;
    for (uint row = first + gl_LocalInvocationIndex; row < min(first + wg_rows, pc.n);
         row += gl_WorkGroupSize.x) {
        y[YROW(0u) * pc.ldy + pc.row0 + row] = 0.0;
    }
    return false;
}
#endif

void main() {
#if (defined(TYPE_MXFP4) || defined(TYPE_IQ4_NL) || defined(TYPE_IQ4_XS)) && defined(BLOCKWISE) \
    && !defined(Q8X)
    for (uint i = gl_LocalInvocationIndex; i < 16u; i += gl_WorkGroupSize.x) {
        lut16[i] = lut16_bytes(LUT16_TABLE, i).x;
    }
    barrier();
#endif
#if defined(LUT_PAIRS)
    for (uint i = gl_LocalInvocationIndex; i < 256u; i += gl_WorkGroupSize.x) {
        lut_pairs[i] = lut_pair_entry(i);
    }
    barrier();
#endif
#if defined(IQ_GRID_SHARED)
    for (uint i = gl_LocalInvocationIndex; i < GW; i += gl_WorkGroupSize.x) {
        iq_grid_sh[i] = wdata[i];
    }
    barrier();
#endif
#if defined(Q8IN)
    quantize_x(); // one x row (the host's condition)
#endif
#if defined(EXPERTS)
    if (!routed((pc.flags & SUBGROUP_ROWS) != 0u ? pc.rows_per_wg : out_rows())) {
        return;
    }
#endif
    uint m = min(pc.m, MAX_M);
    float acc[NR_CAP * M_CAP];
    float ss[M_CAP];
    if ((pc.flags & SUBGROUP_ROWS) != 0u) {
        // The subgroups take the workgroup's rows NR at a time, so any
        // subgroup size the driver picks covers them. Lane i stores outputs
        // t = i, i + gl_SubgroupSize, ... of the group (t = j * MAX_M + r:
        // row j, x row r), having loaded the first one's extras early.
        uint first = wg_linear() * pc.rows_per_wg;
        uint last = min(first + pc.rows_per_wg, pc.n);
        uint outs = out_rows();
        uint i = gl_SubgroupInvocationID;
        for (uint row0 = first + gl_SubgroupID * outs; row0 < last; row0 += gl_NumSubgroups * outs) {
            Extra e = Extra(0.0, 0.0, 0.0, 0.0);
            if (i < NR * MAX_M && i % MAX_M < m && i / MAX_M < outs && row0 + i / MAX_M < last) {
                e = load_extra(row0 + i / MAX_M, i % MAX_M);
            }
            rows(row0, gl_SubgroupInvocationID, gl_SubgroupSize, m, acc, ss);
            [[unroll]] for (uint t = 0u; t < NR * MAX_M; t++) {
                uint j = t / MAX_M;
                uint r = t % MAX_M;
                if (t % gl_SubgroupSize == i && r < m && j < outs && row0 + j < last) {
                    // With GLU, j < NR/2 pairs with up row j + NR/2.
                    uint up_t = min(t + (NR / 2u) * MAX_M, NR * MAX_M - 1u);
                    Extra et = t == i ? e : load_extra(row0 + j, r);
                    store(row0 + j, r, acc[t], acc[up_t], ss[r], et);
                }
            }
        }
#if defined(Q8X)
        if ((pc.flags & Q8OUT) != 0u) {
            store_q8(first, last); // uniform: flags and the workgroup's rows
        }
#endif
        return;
    }
    uint row0 = wg_linear() * out_rows();
    if (row0 >= pc.n) {
        return;
    }
    // Invocation i finishes output (row0 + i / MAX_M, x row i % MAX_M).
    uint i = gl_LocalInvocationIndex;
    uint row = row0 + i / MAX_M;
    uint r = i % MAX_M;
    bool stores = i < out_rows() * MAX_M && r < m && row < pc.n;
    Extra e = Extra(0.0, 0.0, 0.0, 0.0);
    if (stores) {
        e = load_extra(row, r);
    }
    rows(row0, gl_LocalInvocationIndex, gl_WorkGroupSize.x, m, acc, ss);
    if (subgroupElect()) {
        [[unroll]] for (uint t = 0u; t < NR * MAX_M; t++) {
            part_acc[gl_SubgroupID][t] = acc[t];
        }
        [[unroll]] for (uint t = 0u; t < MAX_M; t++) {
            part_ss[gl_SubgroupID][t] = ss[t];
        }
    }
    barrier();
    if (!stores) {
        return;
    }
    uint up_i = min(i + (NR / 2u) * MAX_M, NR * MAX_M - 1u);
    float total = 0.0;
    float up = 0.0;
    float sq = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; g++) {
        total += part_acc[g][i];
        up += part_acc[g][up_i];
        sq += part_ss[g][r];
    }
    store(row, r, total, up, sq, e);
}
