// Causal attention for many query rows (prefill) on cooperative matrices,
// for an f16 KV cache: the work split of attention_prefill.comp (one
// workgroup per BR = 64 query vectors of one kv head's GQA group; keys
// outside the union of the rows' ranges never loaded), with S = Q·Kᵀ and
// O = P·V as 16 x 16 f16 products accumulated in f32.
//
// One pass over the keys, an online softmax: each tile raises a row's
// running maximum, and O, already summed under the old one, is scaled by
// exp(old - new). Cooperative matrices leave which row each invocation's
// accumulator elements lie in to the implementation, so the kernel reads
// that map once, from a fragment loaded with each row's index, and scales
// element by element. Two passes (the maxima first) multiplied Q·Kᵀ twice
// and loaded K twice (benches/README.md, prefill attention).
//
// 4 subgroups of 32, subgroup w owning query vectors 16w..16w+15: its
// scores and probabilities stay in its own rows of shared memory, so only
// the K/V tiles, shared by all four, need workgroup barriers. Q is rounded
// to f16 (pre-scaled), P too.
//
// With n_split > 1 the keys are cut into chunks (attention_split.glsl) and
// workgroup z takes chunk z: SmolLM2's 512 rows are only 72 workgroups,
// each walking 288 dependent tile steps at depth 4096. A row whose keys lie
// in one chunk is written as usual by that chunk's workgroup; any other
// gets a (max, sum, unscaled O) per chunk it meets, which
// attention_combine.comp merges.
//
// Specialization constant 0: head_dim (a multiple of 16, at most 128) |
// PAGED << 16: a paged cache of one table (glsl/kv_pages.glsl; the rows share
// K tiles, so never per-row tables). Tiles go through registers and shared
// memory a key row at a time, each row looked up in the table as it is
// fetched (a tile ahead, so the lookup's latency hides with the load's):
// a tile may straddle pages of any length. SINKS << 17: sinks[h] joins head
// h's softmax denominator where a row is written whole (split partials
// leave it to attention_combine.comp).
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "coopmat.glsl"
#include "common.glsl"
#include "attention_split.glsl"

layout(local_size_x = 128) in;

layout(constant_id = 0) const uint SPEC = 64u;
const uint D = SPEC & 0xFFFFu;
const bool PAGED = ((SPEC >> 16) & 1u) != 0u;
const bool SINKS = ((SPEC >> 17) & 1u) != 0u;
// 16 x 16 fragments across a head (at most 8), and 4-half words per row.
const uint DF = D / 16u;
const uint DW = D / 4u;
const uint BR = 64u;
const uint BC = 32u;
// Row strides (in 4-half words, then floats): padded against bank
// conflicts, multiples of 16 bytes as fragment loads want.
const uint RS = DW + 2u;
const uint SS = BC + 4u;
const uint PW = BC / 4u + 2u;

layout(binding = 0) readonly buffer Q { vec4 q4[]; };
layout(binding = 1) readonly buffer K16 { uvec2 k16[]; };
layout(binding = 2) readonly buffer V16 { uvec2 v16[]; };
layout(binding = 3) readonly buffer Pos { uint pos[]; };
layout(binding = 4) writeonly buffer Out { vec4 o4[]; };
// Status words (see attention.comp): a position past the cache is recorded
// as position + 1 and the row attends to the cache it has.
layout(binding = 5) buffer Status { uint bad_id_plus_one; uint bad_pos_plus_one; uint bad_page_plus_one; } st;
// Per (row, head, split): max, sum, then head_dim unscaled outputs.
layout(binding = 6) writeonly buffer Part { float part[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    uint capacity;
    float scale;
    uint window;
    uint n_split;
    uint min_chunk; // keys per chunk at least
    uint page_log2;
    uint page_stride;
    uint n_pages;
    uint table_len;
} pc;

// SINKS: a logit per query head.
layout(binding = 8) readonly buffer Sinks { float sinks[]; };

#define KV_PAGES_BINDING 7
#define KV_PAGES_STATUS
#include "kv_pages.glsl"

// Q (BR rows) at first; then the K tile (BC rows) and the V tile after it.
shared uvec2 tiles[BR * RS];
// Scores, per subgroup its 16 rows; at the end, O fragments on their way out.
shared float ss[BR * SS];
// Probabilities as f16.
shared uvec2 ps[BR * PW];
shared uint k_lo[BR];
shared uint k_hi[BR];
// Per row, this tile's factor exp(old max - new max) for O.
shared float rescale[BR];

const float NEG_INF = -1.0 / 0.0;

// This subgroup's 16 query vectors, as A fragments across the head.
MAT_A qf[8];

uvec2 half4(vec4 v) {
    return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));
}

// The next K and V tiles in registers while the current one is multiplied:
// otherwise each of a long context's many tile loads waits in full before
// its multiply (benches/README.md, prefill attention).
const uint TILE_WORDS = (BC * DW + 127u) / 128u; // per invocation
uvec2 k_next[TILE_WORDS];
uvec2 v_next[TILE_WORDS];

// K and V rows j0.. into k_next / v_next; keys at or past `hi` read as zeros.
void fetch_tile(uint j0, uint hi, uint kvh) {
    uint kv_stride = pc.n_kv_heads * DW;
    [[unroll]] for (uint n = 0u; n < TILE_WORDS; n++) {
        uint i = gl_LocalInvocationID.x + 128u * n;
        uint k = i / DW;
        uint j = j0 + k;
        bool live = i < BC * DW && j < hi;
        uint row = PAGED ? kv_row(0u, min(j, hi - 1u)) : j;
        uint at = row * kv_stride + kvh * DW + i % DW;
        k_next[n] = live ? k16[at] : uvec2(0u);
        v_next[n] = live ? v16[at] : uvec2(0u);
    }
}

// The fetched tile into shared memory: K rows at 0, V rows at BC.
void put_tile() {
    [[unroll]] for (uint n = 0u; n < TILE_WORDS; n++) {
        uint i = gl_LocalInvocationID.x + 128u * n;
        if (i < BC * DW) {
            uint k = i / DW;
            tiles[k * RS + i % DW] = k_next[n];
            tiles[(BC + k) * RS + i % DW] = v_next[n];
        }
    }
}

// This subgroup's scores of the K tile: S = Q·Kᵀ into its rows of ss.
void scores(uint w) {
    [[unroll]] for (uint c = 0u; c < BC / 16u; c++) {
        MAT_C s = MAT_C(0.0);
        [[unroll]] for (uint f = 0u; f < 8u; f++) {
            if (f < DF) {
                MAT_B kf;
                LOAD_COLS(kf, tiles, 16u * c * RS + 4u * f, RS);
                s = MUL_ADD(qf[f], kf, s);
            }
        }
        STORE_ROWS(s, ss, 16u * w * SS + 16u * c, SS);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint w = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint kvh = gl_WorkGroupID.y;
    uint group = pc.n_heads / pc.n_kv_heads;
    uint n_q = pc.rows * group;
    uint q0 = gl_WorkGroupID.x * BR;

    // Query vectors as f16, pre-scaled so scores need no multiply.
    for (uint i = t; i < BR * DW; i += 128u) {
        uint q = i / DW;
        uint qi = q0 + q;
        vec4 val = vec4(0.0);
        if (qi < n_q) {
            uint h = kvh * group + qi % group;
            val = q4[((qi / group) * pc.n_heads + h) * DW + i % DW] * pc.scale;
        }
        tiles[q * RS + i % DW] = half4(val);
    }
    if (t < BR) {
        uint qi = q0 + t;
        uint lo = 0u;
        uint hi = 0u;
        if (qi < n_q) {
            uint p = pos[qi / group];
            if (p >= pc.capacity) {
                atomicMax(st.bad_pos_plus_one, p + 1u);
            }
            hi = min(p + 1u, pc.capacity);
            lo = (pc.window > 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
            lo = min(lo, hi);
        }
        k_lo[t] = lo;
        k_hi[t] = hi;
    }
    barrier();
    [[unroll]] for (uint f = 0u; f < 8u; f++) {
        if (f < DF) {
            LOAD_ROWS(qf[f], tiles, 16u * w * RS + 4u * f, RS);
        }
    }
    // The union of the rows' key ranges (empty rows do not widen it).
    uint tile_lo = 0xFFFFFFFFu;
    uint tile_hi = 0u;
    for (uint q = 0u; q < BR; q++) {
        if (k_hi[q] > k_lo[q]) {
            tile_lo = min(tile_lo, k_lo[q]);
            tile_hi = max(tile_hi, k_hi[q]);
        }
    }
    // Lane pairs share a row: lane l takes keys 16 (l % 2).. of row l / 2.
    uint row = 16u * w + lane / 2u;
    uint half_k = 16u * (lane % 2u);
    uint lo = k_lo[row];
    uint hi = k_hi[row];
    uint split = gl_WorkGroupID.z;
    bool single = true; // this row's keys lie in one chunk
    bool mine = true;   // ... and it is this workgroup's
    if (pc.n_split > 1u) {
        uint len = prefill_chunk_len(pos[pc.rows - 1u], pc.capacity, pc.n_split, pc.min_chunk);
        uint c0 = split * len;
        uint c1 = split + 1u == pc.n_split ? 0xFFFFFFFFu : c0 + len;
        if (hi > lo) {
            uint first = prefill_chunk_of(lo, len, pc.n_split);
            uint last = prefill_chunk_of(hi - 1u, len, pc.n_split);
            single = first == last;
            mine = split >= first && split <= last;
        }
        tile_lo = max(tile_lo, c0);
        tile_hi = min(tile_hi, c1);
        lo = max(lo, c0);
        hi = max(min(hi, c1), lo);
        if (tile_lo >= tile_hi) {
            return; // uniform: every invocation read the same k_lo / k_hi
        }
    }
    barrier();

    // The accumulators' element-to-row map: a fragment of row indices.
    for (uint e = lane; e < 256u; e += gl_SubgroupSize) {
        ss[(16u * w + e / 16u) * SS + e % 16u] = float(e / 16u);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    MAT_C row_of;
    LOAD_ROWS(row_of, ss, 16u * w * SS, SS);
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // Per tile: S = Q·Kᵀ, the row's running max mx, P = exp(S - mx) (zero
    // where masked), l = Σ P and O = P·V, both scaled to the new max first.
    MAT_C o[8];
    [[unroll]] for (uint f = 0u; f < 8u; f++) {
        o[f] = MAT_C(0.0);
    }
    float mx = NEG_INF;
    float l = 0.0;
    if (tile_lo < tile_hi) {
        fetch_tile(tile_lo, tile_hi, kvh);
    }
    for (uint j0 = tile_lo; j0 < tile_hi; j0 += BC) {
        put_tile();
        barrier();
        if (j0 + BC < tile_hi) {
            fetch_tile(j0 + BC, tile_hi, kvh);
        }
        scores(w);
        float tile_mx = NEG_INF;
        [[unroll]] for (uint i = 0u; i < 16u; i++) {
            uint j = j0 + half_k + i;
            if (j >= lo && j < hi) {
                tile_mx = max(tile_mx, ss[row * SS + half_k + i]);
            }
        }
        float new_mx = max(mx, max(tile_mx, subgroupShuffleXor(tile_mx, 1u)));
        // A row without keys so far keeps O = l = 0 and its max -inf.
        bool none = new_mx == NEG_INF;
        float scale = none ? 1.0 : exp(mx - new_mx);
        float sub = none ? 0.0 : new_mx;
        mx = new_mx;
        l *= scale;
        [[unroll]] for (uint i = 0u; i < 16u; i += 4u) {
            vec4 p = vec4(0.0);
            [[unroll]] for (uint e = 0u; e < 4u; e++) {
                uint j = j0 + half_k + i + e;
                if (j >= lo && j < hi) {
                    p[e] = exp(ss[row * SS + half_k + i + e] - sub);
                }
            }
            l += p.x + p.y + p.z + p.w;
            ps[row * PW + (half_k + i) / 4u] = half4(p);
        }
        if (lane % 2u == 0u) {
            rescale[row] = scale;
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        MAT_C by;
        for (int e = 0; e < by.length(); e++) {
            by[e] = rescale[16u * w + uint(row_of[e])];
        }
        [[unroll]] for (uint f = 0u; f < 8u; f++) {
            if (f < DF) {
                for (int e = 0; e < by.length(); e++) {
                    o[f][e] *= by[e];
                }
            }
        }
        [[unroll]] for (uint c = 0u; c < BC / 16u; c++) {
            MAT_A pf;
            LOAD_ROWS(pf, ps, 16u * w * PW + 4u * c, PW);
            [[unroll]] for (uint f = 0u; f < 8u; f++) {
                if (f < DF) {
                    MAT_B vf;
                    LOAD_ROWS(vf, tiles, (BC + 16u * c) * RS + 4u * f, RS);
                    o[f] = MUL_ADD(pf, vf, o[f]);
                }
            }
        }
        barrier();
    }
    l += subgroupShuffleXor(l, 1u);

    // O / l (a split: O, max and sum), a fragment at a time through this
    // subgroup's rows of ss: lane l writes 8 values of row l / 2.
    uint qi = q0 + row;
    bool parts = !single;
    bool write = mine && qi < n_q;
    uint h = kvh * group + qi % group;
    uint pbase = (((qi / group) * pc.n_heads + h) * pc.n_split + split) * (D + 2u);
    if (parts && write && lane % 2u == 0u) {
        part[pbase] = mx;
        part[pbase + 1u] = l;
    }
    if (SINKS && !parts && mx != NEG_INF) {
        l += exp(sinks[h] - mx);
    }
    [[unroll]] for (uint f = 0u; f < 8u; f++) {
        if (f < DF) {
            STORE_ROWS(o[f], ss, 16u * w * SS, SS);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            if (parts && write) {
                uint from = row * SS + (lane % 2u) * 8u;
                uint at = pbase + 2u + 16u * f + (lane % 2u) * 8u;
                [[unroll]] for (uint e = 0u; e < 8u; e++) {
                    part[at + e] = ss[from + e];
                }
            } else if (write) {
                uint at = ((qi / group) * pc.n_heads + h) * DW + 4u * f + (lane % 2u) * 2u;
                uint from = row * SS + (lane % 2u) * 8u;
                float inv = l > 0.0 ? 1.0 / l : 0.0;
                o4[at] = vec4(ss[from], ss[from + 1u], ss[from + 2u], ss[from + 3u]) * inv;
                o4[at + 1u] = vec4(ss[from + 4u], ss[from + 5u], ss[from + 6u], ss[from + 7u]) * inv;
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
