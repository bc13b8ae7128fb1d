// Causal flash attention for many query rows (prefill): one workgroup takes
// BR query vectors of one kv head's GQA group (query vector i is row
// i / G, head kv_head * G + i % G, so the G query heads that share a kv head
// share every K/V tile load), walks the keys BC at a time through shared
// memory with an online softmax, and writes normalized outputs. Keys outside
// the union of the tile's rows' ranges (causal end, sliding-window start) are
// never loaded, so fully masked tiles cost nothing; a key inside the union but
// outside one row's range is masked per (row, key).
//
// Scalar FMA code (no cooperative matrix) so it runs on every device; the
// inner loops read vec4s from shared memory with padded rows so 8 lanes of a
// quarter-warp hit distinct banks. Nothing here depends on the subgroup size.
//
// Specialization constant 0 packs head_dim (low 16 bits, a multiple of 4, at
// most 128) and BR (high 16 bits, 16 or 32; a multiple of 4 with BR * head_dim
// <= 4096), so shared arrays and register tiles are sized at pipeline creation.
// Bit 25: PAGED, a paged cache of one table (glsl/kv_pages.glsl; the rows
// share K tiles, so never per-row tables): the tile's cache rows are found
// once per tile, into shared memory, and its keys loaded one by one as
// unpaged, so a tile may straddle pages of any length. Bit 26: SINKS,
// sinks[h] joins head h's softmax denominator.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

const uint WG = 128u;
layout(local_size_x = 128) in;

layout(constant_id = 0) const uint SPEC = 64u | (32u << 16);
const uint D = SPEC & 0xFFFFu;
const uint BR = (SPEC >> 16) & 0xFFu;
// Bit 24: the KV cache holds f16 (read as 4 halves per 8-byte word).
const bool KV_F16 = ((SPEC >> 24) & 1u) != 0u;
const bool PAGED = ((SPEC >> 25) & 1u) != 0u;
const bool SINKS = ((SPEC >> 26) & 1u) != 0u;
// Keys per tile.
const uint BC = 32u;
// vec4 columns of a head, and the padded row stride (in vec4s) in shared memory.
const uint DC = D / 4u;
const uint QS = DC + 1u;
// Row stride of the score/probability tile (+1 against bank conflicts).
const uint PS = BC + 1u;
// Scores per invocation (S = Q·Kᵀ) and output vec4s per invocation (O += P·V).
const uint NS = BR * BC / WG;
const uint NACC = (BR * DC + WG - 1u) / WG;
const uint MAX_NACC = 8u;
const uint MAX_NS = 8u;

layout(binding = 0) readonly buffer Q { vec4 q4[]; };
layout(binding = 1) readonly buffer K { vec4 k4[]; };
layout(binding = 2) readonly buffer V { vec4 v4[]; };
layout(binding = 1) readonly buffer K16 { uvec2 k16[]; };
layout(binding = 2) readonly buffer V16 { uvec2 v16[]; };
vec4 halves4(uvec2 w) { return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y)); }
vec4 load_k(uint i) { return KV_F16 ? halves4(k16[i]) : k4[i]; }
vec4 load_v(uint i) { return KV_F16 ? halves4(v16[i]) : v4[i]; }
layout(binding = 3) readonly buffer Pos { uint pos[]; };
layout(binding = 4) writeonly buffer Out { vec4 o4[]; };
// Status words (see attention.comp): a position past the cache is recorded
// as position + 1 and the row attends to the cache it has.
layout(binding = 5) buffer Status { uint bad_id_plus_one; uint bad_pos_plus_one; uint bad_page_plus_one; } st;

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint n_kv_heads;
    uint head_dim;
    uint capacity;
    float scale;
    uint window;
    uint n_split_unused;
    uint split_len_unused;
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

shared vec4 qs[BR * QS];
// K tile, then (after the scores are taken) the V tile of the same keys.
shared vec4 kvs[BC * QS];
// Scores, then probabilities.
shared float ps[BR * PS];
// Per query vector: key range [k_lo, k_hi), running max and sum, and the
// rescale factor of the current tile.
shared uint k_lo[BR];
shared uint k_hi[BR];
shared float m_run[BR];
shared float l_run[BR];
shared float corr_s[BR];
// PAGED: the tile's cache rows (keys past the union: the last key's).
shared uint trow[PAGED ? BC : 1u];

const float NEG_INF = -1.0 / 0.0;

void main() {
    uint t = gl_LocalInvocationID.x;
    uint kvh = gl_WorkGroupID.y;
    uint group = pc.n_heads / pc.n_kv_heads;
    uint n_q = pc.rows * group;
    uint q0 = gl_WorkGroupID.x * BR;
    uint kv_stride4 = pc.n_kv_heads * DC;
    uint koff4 = kvh * DC;

    // Query vectors in shared memory, pre-scaled so scores need no multiply.
    for (uint i = t; i < BR * DC; i += WG) {
        uint q = i / DC;
        uint dc = i % DC;
        uint qi = q0 + q;
        vec4 val = vec4(0.0);
        if (qi < n_q) {
            uint r = qi / group;
            uint h = kvh * group + qi % group;
            val = q4[(r * pc.n_heads + h) * DC + dc] * pc.scale;
        }
        qs[q * QS + dc] = val;
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
        m_run[t] = NEG_INF;
        l_run[t] = 0.0;
    }
    barrier();
    // The union of the rows' key ranges (empty rows do not widen it).
    uint tile_lo = 0xFFFFFFFFu;
    uint tile_hi = 0u;
    for (uint q = 0u; q < BR; q++) {
        if (k_hi[q] > k_lo[q]) {
            tile_lo = min(tile_lo, k_lo[q]);
            tile_hi = max(tile_hi, k_hi[q]);
        }
    }

    vec4 acc[MAX_NACC];
    for (uint i = 0u; i < MAX_NACC; i++) {
        acc[i] = vec4(0.0);
    }

    for (uint j0 = tile_lo; j0 < tile_hi; j0 += BC) {
        if (PAGED) {
            if (t < BC) {
                trow[t] = kv_row(0u, min(j0 + t, tile_hi - 1u));
            }
            barrier();
        }
        // K tile (keys past the union read as zeros and are masked below).
        for (uint i = t; i < BC * DC; i += WG) {
            uint k = i / DC;
            uint dc = i % DC;
            uint j = j0 + k;
            uint row = PAGED ? trow[k] : j;
            kvs[k * QS + dc] = j < tile_hi ? load_k(row * kv_stride4 + koff4 + dc) : vec4(0.0);
        }
        barrier();
        // Scores: invocation t takes key t % BC of query vectors t / BC + (WG / BC) * i.
        {
            uint k = t % BC;
            uint qb = t / BC;
            float s[MAX_NS];
            for (uint i = 0u; i < NS; i++) {
                s[i] = 0.0;
            }
            for (uint dc = 0u; dc < DC; dc++) {
                vec4 kv = kvs[k * QS + dc];
                for (uint i = 0u; i < NS; i++) {
                    s[i] += dot(qs[(qb + (WG / BC) * i) * QS + dc], kv);
                }
            }
            uint j = j0 + k;
            for (uint i = 0u; i < NS; i++) {
                uint q = qb + (WG / BC) * i;
                bool ok = j >= k_lo[q] && j < k_hi[q];
                ps[q * PS + k] = ok ? s[i] : NEG_INF;
            }
        }
        barrier();
        // V tile over the K tile (every score is taken), while BR invocations
        // run the online softmax of one query vector each.
        for (uint i = t; i < BC * DC; i += WG) {
            uint k = i / DC;
            uint dc = i % DC;
            uint j = j0 + k;
            uint row = PAGED ? trow[k] : j;
            kvs[k * QS + dc] = j < tile_hi ? load_v(row * kv_stride4 + koff4 + dc) : vec4(0.0);
        }
        if (t < BR) {
            float m_old = m_run[t];
            float mx = m_old;
            for (uint k = 0u; k < BC; k++) {
                mx = max(mx, ps[t * PS + k]);
            }
            // No key seen yet (mx = -inf): nothing to rescale, all p = 0.
            float corr = mx == NEG_INF ? 1.0 : exp(m_old - mx);
            float sum = 0.0;
            for (uint k = 0u; k < BC; k++) {
                float sv = ps[t * PS + k];
                float p = sv == NEG_INF ? 0.0 : exp(sv - mx);
                ps[t * PS + k] = p;
                sum += p;
            }
            m_run[t] = mx;
            l_run[t] = l_run[t] * corr + sum;
            corr_s[t] = corr;
        }
        barrier();
        // O = O * corr + P·V: invocation t owns (query, vec4 column) pairs
        // t + WG * i; with DC dividing WG its column is the same for every i,
        // so each V vec4 is read once per key.
        for (uint i = 0u; i < NACC; i++) {
            uint q = min((t + WG * i) / DC, BR - 1u);
            acc[i] *= corr_s[q];
        }
        for (uint k = 0u; k < BC; k++) {
            for (uint i = 0u; i < NACC; i++) {
                uint idx = t + WG * i;
                if (idx < BR * DC) {
                    acc[i] += ps[(idx / DC) * PS + k] * kvs[k * QS + idx % DC];
                }
            }
        }
        barrier();
    }

    for (uint i = 0u; i < NACC; i++) {
        uint idx = t + WG * i;
        uint q = idx / DC;
        uint qi = q0 + q;
        if (idx < BR * DC && qi < n_q) {
            uint dc = idx % DC;
            uint r = qi / group;
            uint h = kvh * group + qi % group;
            float l = l_run[q];
            if (SINKS && m_run[q] != NEG_INF) {
                l += exp(sinks[h] - m_run[q]);
            }
            o4[(r * pc.n_heads + h) * DC + dc] = l > 0.0 ? acc[i] / l : vec4(0.0);
        }
    }
}
