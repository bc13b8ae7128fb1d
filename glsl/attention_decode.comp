// Decode attention (a few query rows against a long cache), with online
// softmax. One workgroup per (kv head, tile of up to 4 of its query heads,
// row, key split): the query heads of one GQA group share every K and V
// read. No key tile goes through shared memory and no barrier runs in the
// key loop: the workgroup's lanes form clusters of C (vk/ops/attention.rs
// decode_tiles), a cluster takes whole keys, each lane 8R dims of them
// (16-byte loads of an f16 cache, consecutive lanes reading consecutive
// words) with the query heads' same dims in registers. A round issues U
// keys' K and V loads per cluster before any is used; a score is summed
// over the cluster's lanes by shuffles, and each cluster folds V into a
// running (max, sum, accumulator) per head of its own. The clusters meet
// once, at the end, in shared memory, a head at a time.
//
// The kernel it replaced staged 16- or 32-key tiles of K in shared memory
// (three barriers per tile) and ran slower, most at depth. The query goes
// through shared memory: each lane loading and roping its own 8R dims one
// after another was slower (benches/README.md, decode attention).
//
// The workgroup size is specialization constant 1 (vk/ops/attention.rs
// DecodePlan): 128 where the keys are split over many workgroups, 512 for
// one query head per workgroup over a short unsplit span.
//
// The split (attention_split.glsl) follows the row's span read from
// positions: splits past it exit at once. With n_split > 1 each split writes
// [max, sum, unnormalized out[head_dim]] to `part` and attention_combine.comp
// merges them; with n_split == 1 the result goes straight to `o`. (The last
// split to finish merging them itself ran slower for tiles of several heads:
// one workgroup per (kv head, head tile) merges what the combine spreads
// over 256; see MERGE below for where it pays.)
//
// With ROPE (a single row: a decode step) the kernel is also the step's rope
// and cache append: q is rotated as it is loaded, with the (cos, sin) that
// rope_rotations.comp computed once per pass for the step's position, and
// the workgroups whose split holds that position rotate the new k, round k
// and v as the cache stores them, take them from shared memory (the cache
// row may not be written yet) and (head tile 0) write them into the cache:
// rope_store's dispatch disappears.
//
// Built with MERGE (attention_decode_merge, where a head's merge is small:
// vk/ops/attention.rs merges_last) the last split of each (row, kv head,
// head tile) to finish, told by an arrival count that it resets, merges
// the splits itself, and attention_combine.comp's dispatch and barrier go.
//
// With Q8 and one split (or built with MERGE) the output also goes to
// binding 10 as int8 digits, as quantize_q8.comp would write them (the o
// projection's integer-dot GEMV reads them; with several splits and no
// MERGE attention_combine.comp writes them).
//
// PAGED (glsl/kv_pages.glsl; per-row tables too: every row's workgroups
// are its own): keys are walked in chunks of whole rounds, and before each
// the workgroup stages the chunk's page ids (at most PAGE_SLOTS) in shared
// memory, so a key's cache row costs a shared load and no global one
// before its K and V loads. A split of a few hundred keys (the usual
// decode) is one chunk, staged beside the query; longer ones pay two
// barriers per chunk (of 768 keys or more at pages of 16).
//
// SINKS (binding 13, a logit per query head): sink[h] joins head h's
// softmax denominator where a head's output is final: with one split, or in
// MERGE's merge; split partials leave it to the merge (attention_combine.comp
// or MERGE), which adds it once.
//
// Specialization constant 0: head_dim | heads per tile << 10 |
// log2(C) << 14 | (f16 KV cache) << 24 | ROPE << 25 | Q8 << 26 |
// PAGED << 27 | SINKS << 28. head_dim is a multiple of 8 C, C a power of
// two no larger than the subgroup, R = head_dim / 8C at most 8.
#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"

layout(local_size_x_id = 1) in;
layout(constant_id = 0) const uint SPEC = 64u | (1u << 10) | (3u << 14);
const uint HD = SPEC & 0x3FFu;
const uint GT = (SPEC >> 10) & 0xFu;
const uint C = 1u << ((SPEC >> 14) & 7u);
// Keys per cluster per round: 4 for one-head tiles, whose rounds are few
// workgroups' latency and which have registers to spare; tiles of several
// heads lost with 4, and loading a round ahead lost on every shape
// (benches/README.md, decode attention).
const uint U = GT == 1u ? 4u : 2u;
const bool KV_F16 = ((SPEC >> 24) & 1u) != 0u;
const bool ROPE = ((SPEC >> 25) & 1u) != 0u;
const bool Q8 = ((SPEC >> 26) & 1u) != 0u;
const bool PAGED = ((SPEC >> 27) & 1u) != 0u;
const bool SINKS = ((SPEC >> 28) & 1u) != 0u;
const uint WG = gl_WorkGroupSize.x;
const uint HD4 = HD / 4u;
const uint R = HD / (8u * C); // 8-value units per lane
const uint NC = WG / C; // clusters per workgroup
const uint ROUND = NC * U; // keys per round
// PAGED: page ids staged per chunk, enough for a round of pages of 16 (and
// 64 at least, so a chunk holds 63 pages' keys); vk/ops/attention.rs
// page_slots mirrors it. Shorter pages never come here (the host's
// DECODE_MIN_PAGE_LOG2): a chunk would hold less than a round.
const uint PAGE_SLOTS = ROUND / 16u + 2u > 64u ? ROUND / 16u + 2u : 64u;

layout(binding = 0) readonly buffer Qf { float qf[]; };
// A cache word: 8 halves, or 4 f32 bit patterns.
layout(binding = 1) readonly buffer K { uvec4 kw[]; };
layout(binding = 2) readonly buffer V { uvec4 vw[]; };
layout(binding = 3) readonly buffer Pos { uint pos[]; };
layout(binding = 4) writeonly buffer Out { float o[]; };
// Status words (see embedding.comp); a position past the cache is recorded in
// the second as position + 1 and the row attends to the cache it has; a
// page past the pool in the third (glsl/kv_pages.glsl).
layout(binding = 5) buffer Status { uint bad_id_plus_one; uint bad_pos_plus_one; uint bad_page_plus_one; } st;
#if defined(MERGE)
// MERGE: the last split to finish reads the others' partials.
layout(binding = 6) coherent writeonly buffer Part { float part[]; };
layout(binding = 6) coherent readonly buffer PartIn { float part_in[]; };
// MERGE: splits finished per (row, kv head, head tile), back to 0 after each pass.
layout(binding = 11) coherent buffer Arrivals { uint arrived[]; };
#else
layout(binding = 6) writeonly buffer Part { float part[]; };
#endif
// ROPE: the step's new k and v rows, (cos, sin) of the step's position
// per frequency.
layout(binding = 7) readonly buffer KNew { float knew[]; };
layout(binding = 8) readonly buffer VNew { vec4 vnew4[]; };
layout(binding = 9) readonly buffer Rot { vec2 rot_cs[]; }; // rope_rotations.comp
// The cache rows ROPE appends (bindings 1 and 2 again).
layout(binding = 1) writeonly buffer KOut { vec4 kout4[]; };
layout(binding = 2) writeonly buffer VOut { vec4 vout4[]; };
layout(binding = 1) writeonly buffer KOut16 { uvec2 kout16[]; };
layout(binding = 2) writeonly buffer VOut16 { uvec2 vout16[]; };
// SINKS: a logit per query head.
layout(binding = 13) readonly buffer Sinks { float sinks[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint n_heads;
    uint n_kv_heads;
    uint capacity;
    float scale;
    uint window;
    uint n_split;
    uint head_tiles;
    uint rot_dim;
    uint neox;
    uint q8_stride;
    uint page_log2;
    uint page_stride;
    uint n_pages;
    uint table_len;
} pc;

#include "attention_split.glsl"
#include "rope.glsl"
// Q8: the output as int8 digits too, rows q8_stride words apart.
#define Q8_OUT_BINDING 10
#include "q8.glsl"
#if defined(MERGE)
#include "reduce.glsl"
#endif
#define KV_PAGES_BINDING 12
#define KV_PAGES_STATUS
#include "kv_pages.glsl"

shared vec4 qs[GT * HD4];
// The clusters' accumulators of one head, their maxima and sums.
shared vec4 red[NC * HD4];
shared float red_m[NC];
shared float red_l[NC];
// ROPE: the row's own k and v as the cache holds them: the stored words
// (two f16 pairs in .xy, or four f32 bit patterns), unpacked as a cache
// load would be, so no compiler can fold the f16 rounding away.
shared uvec4 kf[HD4];
shared uvec4 vf[HD4];
// Q8: a head's output.
shared vec4 outs[HD4];
// PAGED: the current chunk's page ids, from its first key's page on.
shared uint kpage[PAGED ? PAGE_SLOTS : 1u];

// PAGED: keys per chunk, whole rounds whose pages fit PAGE_SLOTS: at most
// PAGE_SLOTS - 1 pages' keys, so any start meets at most PAGE_SLOTS pages.
uint chunk_keys() {
    uint k = pc.page_log2 >= 23u ? 0x80000000u : (PAGE_SLOTS - 1u) << pc.page_log2;
    return k / ROUND * ROUND;
}

// PAGED: row r's page ids of keys [c0, c1) into kpage (c0 < c1; the whole
// workgroup calls it, a barrier before any reads them).
void stage_pages(uint r, uint c0, uint c1) {
    uint first = c0 >> pc.page_log2;
    uint n = ((c1 - 1u) >> pc.page_log2) - first + 1u;
    for (uint i = gl_LocalInvocationID.x; i < n; i += WG) {
        kpage[i] = kv_page_checked(r, first + i);
    }
}

vec4 halves4(uvec2 w) { return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y)); }
// Four values as the cache's words, and back.
uvec4 stored(vec4 x) {
    return KV_F16 ? uvec4(packHalf2x16(x.xy), packHalf2x16(x.zw), 0u, 0u) : floatBitsToUint(x);
}
vec4 unstored(uvec4 w) {
    return KV_F16 ? halves4(w.xy) : uintBitsToFloat(w);
}

// Unit u (8 values) of cache row `row` (position * n_kv_heads + kv head) as
// two vec4.
void load_unit(bool is_k, uint row, uint u, out vec4 a, out vec4 b) {
    if (KV_F16) {
        uvec4 w = is_k ? kw[row * (HD / 8u) + u] : vw[row * (HD / 8u) + u];
        a = halves4(w.xy);
        b = halves4(w.zw);
    } else {
        uint i = row * HD4 + 2u * u;
        a = uintBitsToFloat(is_k ? kw[i] : vw[i]);
        b = uintBitsToFloat(is_k ? kw[i + 1u] : vw[i + 1u]);
    }
}

// ROPE: (cos, sin) for element d of a head (unused past rot_dim).
vec2 rotation(uint d) {
    return d < pc.rot_dim ? rot_cs[rope_freq(d, pc.rot_dim, pc.neox != 0u)] : vec2(1.0, 0.0);
}

// Row r's new k (rotated) and v of kv head kvh into kf / vf, rounded as
// the cache stores them; `store`: into the cache row of position `p` too
// (paged: unless its page is past the pool, flagged by the key loop's
// staging).
void own_kv(uint r, uint kvh, uint p, bool store) {
    uint t = gl_LocalInvocationID.x;
    bool neox = pc.neox != 0u;
    if (t >= HD4) {
        return;
    }
    uint base = kvh * HD;
    vec4 k;
    [[unroll]] for (uint c = 0u; c < 4u; c++) {
        uint d = 4u * t + c;
        k[c] = rope_apply(d, knew[base + d], knew[base + rope_mate(d, pc.rot_dim, neox)],
                          rotation(d), pc.rot_dim, neox);
    }
    vec4 v = vnew4[kvh * HD4 + t];
    uvec4 kwd = stored(k);
    uvec4 vwd = stored(v);
    kf[t] = kwd;
    vf[t] = vwd;
    uint row = p;
    if (PAGED) {
        uint page = kv_page(r, p >> pc.page_log2);
        store = store && page < pc.n_pages;
        row = kv_page_row(page, p);
    }
    if (store) {
        uint at = row * pc.n_kv_heads * HD4 + kvh * HD4 + t;
        if (KV_F16) {
            kout16[at] = kwd.xy;
            vout16[at] = vwd.xy;
        } else {
            kout4[at] = k;
            vout4[at] = v;
        }
    }
}

// Element d of the query head starting at `base`, pre-scaled;
// with ROPE rotated as it loads.
float query(uint base, uint d) {
    float x = qf[base + d];
    if (ROPE) {
        bool neox = pc.neox != 0u;
        x = rope_apply(d, x, qf[base + rope_mate(d, pc.rot_dim, neox)], rotation(d),
                       pc.rot_dim, neox);
    }
    return x * pc.scale;
}

// Q8: head hg's output (in outs) as int8 digits, blocks of 32 as
// quantize_q8.comp would write them (head_dim a multiple of 32; called by
// the whole workgroup).
void store_head_q8(uint r, uint hg) {
    uint qu = q8_unit_index();
    if (qu < HD4) {
        q8_store(r * pc.q8_stride, pc.n_heads * HD, hg * HD4 + qu, q8_unit(outs[qu]));
    }
}

#if defined(MERGE)
// Partial outputs one invocation merges per head at most (the host picks
// MERGE only where heads per tile x its share of splits fits).
const uint MERGE_LOADS = 32u;
shared bool merges;
shared float mw[WG];
shared float msum[WG];

// After this workgroup wrote its split's partials: the last of the row's
// active splits to arrive (n_active of them) merges every split's
// partials of the tile's heads, as attention_combine.comp would, into o.
// Needs head_dim <= WG and n_active <= WG.
void merge_last(uint r, uint kvh, uint h0, uint group, uint n_active) {
    uint t = gl_LocalInvocationID.x;
    memoryBarrierBuffer(); // this workgroup's partials before its arrival
    barrier();
    if (t == 0u) {
        uint at = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
        bool last = atomicAdd(arrived[at], 1u) == n_active - 1u;
        if (last) {
            atomicExchange(arrived[at], 0u);
        }
        merges = last;
    }
    barrier();
    if (!merges) {
        return; // uniform
    }
    memoryBarrierBuffer(); // the other splits' partials after their arrivals
    const uint groups = WG / HD; // invocations on a dim: split groups
    uint g = t / HD;
    uint d = t - g * HD;
    uint stride = HD + 2u;
    for (uint h = 0u; h < GT; h++) {
        if (h0 + h >= group) {
            break; // uniform
        }
        uint hg = kvh * group + h0 + h;
        uint base = (r * pc.n_heads + hg) * pc.n_split * stride;
        // Every load first (see attention_combine.comp).
        float pv[MERGE_LOADS];
        [[unroll]] for (uint j = 0u; j < MERGE_LOADS; j++) {
            uint s = g + j * groups;
            pv[j] = g < groups && s < n_active ? part_in[base + s * stride + 2u + d] : 0.0;
        }
        float m0 = t < n_active ? part_in[base + t * stride] : -1.0 / 0.0;
        float l0 = t < n_active ? part_in[base + t * stride + 1u] : 0.0;
        float big = wg_max(m0);
        float w = t < n_active ? exp(m0 - big) : 0.0;
        mw[t] = w;
        float l = wg_sum(w * l0);
        if (SINKS && big != -1.0 / 0.0) {
            l += exp(sinks[hg] - big);
        }
        barrier(); // mw visible
        float a = 0.0;
        [[unroll]] for (uint j = 0u; j < MERGE_LOADS; j++) {
            uint s = g + j * groups;
            if (g < groups && s < n_active) {
                a += mw[s] * pv[j];
            }
        }
        msum[t] = a;
        barrier();
        if (t < HD) {
            float total = 0.0;
            for (uint k = 0u; k < groups; k++) {
                total += msum[k * HD + t];
            }
            float val = l > 0.0 ? total / l : 0.0;
            o[(r * pc.n_heads + hg) * HD + t] = val;
            if (Q8) {
                outs[t / 4u][t % 4u] = val;
            }
        }
        if (Q8) {
            barrier(); // outs complete
            store_head_q8(r, hg);
        }
        barrier(); // mw and msum free for the next head
    }
}
#endif

void main() {
    uint t = gl_LocalInvocationID.x;
    uint kvh = gl_WorkGroupID.x / pc.head_tiles;
    uint h0 = (gl_WorkGroupID.x - kvh * pc.head_tiles) * GT; // first head in the group
    uint r = gl_WorkGroupID.y;
    uint split = gl_WorkGroupID.z;
    uint group = pc.n_heads / pc.n_kv_heads;
    uint p = pos[r];
    if (p >= pc.capacity && t == 0u && gl_WorkGroupID.x == 0u && split == 0u) {
        atomicMax(st.bad_pos_plus_one, p + 1u);
    }
    Span sp = decode_span(p, pc.capacity, pc.window, pc.n_split);
    if (pc.n_split > 1u && split >= sp.n_active) {
        return; // past the span: the combine reads only active splits
    }
    uint j_begin = sp.start + split * sp.len;
    uint j_end = min(j_begin + sp.len, sp.end);
    // ROPE: the split holding the row's position takes its k and v from
    // kf / vf (uniform per workgroup).
    bool own = ROPE && p < pc.capacity && p >= j_begin && p < j_end;

    // The tile's query vectors, pre-scaled, through shared memory (heads
    // past the group read zeros): loaded by the whole workgroup, not 8R
    // dims per lane one after another (see the top).
    for (uint u = t; u < GT * HD4; u += WG) {
        uint hh = u / HD4;
        uint hl = h0 + hh;
        uint d = 4u * (u - hh * HD4);
        uint base = (r * pc.n_heads + kvh * group + hl) * HD;
        vec4 qv = vec4(0.0);
        if (hl < group) {
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                qv[c] = query(base, d + c);
            }
        }
        qs[u] = qv;
    }
    if (own) {
        own_kv(r, kvh, p, h0 == 0u);
    }
    // PAGED: the keys a chunk at a time, [page0 << page_log2 or later,
    // chunk_end), the first staged here, beside the query; unpaged, one
    // chunk of the whole split.
    uint chunk = PAGED ? chunk_keys() : 0u;
    uint chunk_end = PAGED ? j_begin + min(chunk, j_end - j_begin) : j_end;
    uint page0 = j_begin >> pc.page_log2;
    if (PAGED && j_begin < chunk_end) {
        stage_pages(r, j_begin, chunk_end);
    }
    barrier();

    uint sl = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    uint cl = sl / C; // this lane's cluster
    uint lane = sl - cl * C;
    // This lane's query dims: unit lane + C i, i < R.
    vec4 qa[GT][R];
    vec4 qb[GT][R];
    [[unroll]] for (uint h = 0u; h < GT; h++) {
        [[unroll]] for (uint i = 0u; i < R; i++) {
            uint unit = lane + C * i;
            qa[h][i] = qs[h * HD4 + 2u * unit];
            qb[h][i] = qs[h * HD4 + 2u * unit + 1u];
        }
    }

    float m[GT];
    float l[GT];
    vec4 aa[GT][R];
    vec4 ab[GT][R];
    [[unroll]] for (uint h = 0u; h < GT; h++) {
        m[h] = -1.0 / 0.0;
        l[h] = 0.0;
        [[unroll]] for (uint i = 0u; i < R; i++) {
            aa[h][i] = vec4(0.0);
            ab[h][i] = vec4(0.0);
        }
    }

    uint nkv = pc.n_kv_heads;
    for (uint j0 = j_begin; j0 < j_end; j0 += ROUND) {
        if (PAGED && j0 == chunk_end) {
            // The next chunk (uniform), staged once the last one's ids are read.
            page0 = j0 >> pc.page_log2;
            chunk_end = j0 + min(chunk, j_end - j0);
            barrier();
            stage_pages(r, j0, chunk_end);
            barrier();
        }
        // Every load of the round first: key j0 + u NC + cl, dims of this lane.
        vec4 ka[U][R], kb[U][R], va[U][R], vb[U][R];
        [[unroll]] for (uint u = 0u; u < U; u++) {
            // Past the span: a key of it, read and then masked (a chunk is
            // whole rounds, so only the last chunk has such keys).
            uint j = min(j0 + u * NC + cl, chunk_end - 1u);
            bool mine = own && j == p;
            uint at = PAGED ? kv_page_row(kpage[(j >> pc.page_log2) - page0], j) : j;
            uint row = at * nkv + kvh;
            [[unroll]] for (uint i = 0u; i < R; i++) {
                uint unit = lane + C * i;
                if (mine) {
                    ka[u][i] = unstored(kf[2u * unit]);
                    kb[u][i] = unstored(kf[2u * unit + 1u]);
                    va[u][i] = unstored(vf[2u * unit]);
                    vb[u][i] = unstored(vf[2u * unit + 1u]);
                } else {
                    load_unit(true, row, unit, ka[u][i], kb[u][i]);
                    load_unit(false, row, unit, va[u][i], vb[u][i]);
                }
            }
        }
        // Scores (every lane of a cluster ends with its key's), then the
        // running softmax folds the round in.
        float s[U][GT];
        [[unroll]] for (uint u = 0u; u < U; u++) {
            bool ok = j0 + u * NC + cl < j_end;
            [[unroll]] for (uint h = 0u; h < GT; h++) {
                float x = 0.0;
                [[unroll]] for (uint i = 0u; i < R; i++) {
                    x += dot(qa[h][i], ka[u][i]) + dot(qb[h][i], kb[u][i]);
                }
                [[unroll]] for (uint b = 1u; b < C; b <<= 1u) {
                    x += subgroupShuffleXor(x, b); // the cluster's sum
                }
                s[u][h] = ok ? x : -1.0 / 0.0;
            }
        }
        [[unroll]] for (uint h = 0u; h < GT; h++) {
            float nm = m[h];
            [[unroll]] for (uint u = 0u; u < U; u++) {
                nm = max(nm, s[u][h]);
            }
            float corr = nm == m[h] ? 1.0 : exp(m[h] - nm);
            float ls = l[h] * corr;
            [[unroll]] for (uint i = 0u; i < R; i++) {
                aa[h][i] *= corr;
                ab[h][i] *= corr;
            }
            [[unroll]] for (uint u = 0u; u < U; u++) {
                float pk = s[u][h] == -1.0 / 0.0 ? 0.0 : exp(s[u][h] - nm);
                ls += pk;
                [[unroll]] for (uint i = 0u; i < R; i++) {
                    aa[h][i] += pk * va[u][i];
                    ab[h][i] += pk * vb[u][i];
                }
            }
            l[h] = ls;
            m[h] = nm;
        }
    }

    // The clusters meet, a head at a time: every invocation takes output
    // dims t, t + WG, ... of the head. Built with UNSPLIT (big workgroups,
    // one head over an unsplit span), those of a subgroup first merge by
    // shuffles (C <= the subgroup's size, so no cluster straddles two) and
    // the subgroups meet in shared memory. A 128-wide workgroup merges its
    // 16 clusters in shared memory: with the shuffles in its code, even
    // behind a specialization constant, NVIDIA's compiler spilled registers
    // (benches/README.md, decode attention).
#if defined(UNSPLIT)
    for (uint b = C; b < gl_SubgroupSize; b <<= 1u) {
        [[unroll]] for (uint h = 0u; h < GT; h++) {
            float om = subgroupShuffleXor(m[h], b);
            float ol = subgroupShuffleXor(l[h], b);
            float nm = max(m[h], om);
            float c0 = m[h] == -1.0 / 0.0 ? 0.0 : exp(m[h] - nm);
            float c1 = om == -1.0 / 0.0 ? 0.0 : exp(om - nm);
            l[h] = l[h] * c0 + ol * c1;
            m[h] = nm;
            [[unroll]] for (uint i = 0u; i < R; i++) {
                aa[h][i] = aa[h][i] * c0 + subgroupShuffleXor(aa[h][i], b) * c1;
                ab[h][i] = ab[h][i] * c0 + subgroupShuffleXor(ab[h][i], b) * c1;
            }
        }
    }
    // A slot in shared memory per subgroup.
    uint ns = gl_NumSubgroups;
    uint sg = gl_SubgroupID;
    bool leads = gl_SubgroupInvocationID < C;
#else
    // A slot in shared memory per cluster.
    uint ns = NC;
    uint sg = cl;
    bool leads = true;
#endif
    [[unroll]] for (uint h = 0u; h < GT; h++) {
        barrier();
        if (leads) {
            if (lane == 0u) {
                red_m[sg] = m[h];
                red_l[sg] = l[h];
            }
            [[unroll]] for (uint i = 0u; i < R; i++) {
                uint unit = lane + C * i;
                red[sg * HD4 + 2u * unit] = aa[h][i];
                red[sg * HD4 + 2u * unit + 1u] = ab[h][i];
            }
        }
        barrier();
        uint hg = kvh * group + h0 + h;
        if (h0 + h >= group) {
            continue;
        }
        float mx = -1.0 / 0.0;
        for (uint c = 0u; c < ns; c++) {
            mx = max(mx, red_m[c]);
        }
        // One split: the head's output is final here, its sink joins it.
        float sink_w = SINKS && pc.n_split == 1u && mx != -1.0 / 0.0 ? exp(sinks[hg] - mx) : 0.0;
        for (uint d = t; d < HD; d += WG) {
            float a = 0.0;
            float ls = 0.0;
            for (uint c = 0u; c < ns; c++) {
                float w = red_m[c] == -1.0 / 0.0 ? 0.0 : exp(red_m[c] - mx);
                a += w * red[c * HD4 + d / 4u][d % 4u];
                ls += w * red_l[c];
            }
            if (pc.n_split == 1u) {
                ls += sink_w;
                float val = ls > 0.0 ? a / ls : 0.0;
                o[(r * pc.n_heads + hg) * HD + d] = val;
                if (Q8) {
                    outs[d / 4u][d % 4u] = val;
                }
            } else {
                uint pb = ((r * pc.n_heads + hg) * pc.n_split + split) * (HD + 2u);
                if (d == 0u) {
                    part[pb] = mx;
                    part[pb + 1u] = ls;
                }
                part[pb + 2u + d] = a;
            }
        }
        if (Q8 && pc.n_split == 1u) {
            barrier(); // outs complete
            store_head_q8(r, hg);
        }
    }
#if defined(MERGE)
    merge_last(r, kvh, h0, group, sp.n_active);
#endif
}
