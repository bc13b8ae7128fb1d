// Decode attention (a few query rows against a long cache), with online
// softmax. One workgroup per (kv head, tile of up to 8 of its query heads,
// row, key split): the query heads of one GQA group share every K and V read.
// Keys go in tiles of TK = 32, 16 at head_dim 128, 8 at 256 (fewer where
// shared memory is short; vk/ops/attention.rs decode_tiles). Every
// invocation first issues its V loads for the tile into registers, then the
// tile's K rows are loaded into shared memory by consecutive invocations
// reading consecutive words (coalesced). Invocation (head, key) scores one
// key from shared memory; then invocation (key lane, 4 dims) folds its keys'
// V rows, already in registers, into one accumulator per head, and the key
// lanes' partial sums meet once, at the end. The old kernel read V inside
// the softmax loop, one dependent load after another: on an H100,
// Llama-3.1-8B's layer at 4.6K positions took 53 us with the combine, now 31
// (benches/attention.rs). Prefetching the next tile into registers as well
// was slower (44 us), and so were 64-key tiles (49 us).
// No subgroup operation is used, so any subgroup size works.
//
// The split (attention_split.glsl) follows the row's span read from
// positions: splits past it exit at once. With n_split > 1 each split writes
// [max, sum, unnormalized out[head_dim]] to `part` and attention_combine.comp
// merges them; with n_split == 1 the result goes straight to `o`. (The last
// split to finish merging them itself, told by an atomic counter, ran slower
// on an H100: 758 -> 577 tok/s for SmolLM2 at 4.6K positions. Tried again on
// an H200 with 8 split loads in flight per invocation, it saved a barrier
// per layer but took the 8B's layer at 4.6K positions from 25 to 53 us
// (tg128 @4096 236 -> 199): one workgroup per (kv head, head tile) merges
// what the combine spreads over 256.)
//
// With ROPE (a single row: a decode step) the kernel is also the step's rope
// and cache append: q is rotated as it is loaded, with the (cos, sin) that
// rope_rotations.comp computed once per pass for the step's position, and
// the workgroups whose split holds that position rotate the new k, round k
// and v as the cache stores them, take them from shared memory as a last
// tile of one key (the cache row may not be written yet) and (head tile 0)
// write them into the cache: rope_store's dispatch disappears. (Issuing the
// first cached tile's loads before q is read was 2-3% slower on an H100.)
//
// Specialization constant 0: head_dim | heads per tile << 16 | key tile
// code << 24 (0: 32 keys, 1: 16, 2: 8) | (f16 KV cache) << 26 | ROPE << 27.
// head_dim is a
// multiple of 4, at most 256 (vk/ops/attention.rs checks, and sizes the
// tiles to the device's shared memory).
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 128) in;
layout(constant_id = 0) const uint SPEC = 64u | (1u << 16);
const uint HD = SPEC & 0xFFFFu;
const uint GT = (SPEC >> 16) & 0xFFu; // at most 8
const uint HD4 = HD / 4u;
const uint KS = HD4 + 1u; // padded K row in shared memory: conflict-free column reads
const uint WG = 128u;
const uint TK = 32u >> ((SPEC >> 24) & 3u); // divides SPLIT_MIN
const bool KV_F16 = ((SPEC >> 26) & 1u) != 0u;
const bool ROPE = ((SPEC >> 27) & 1u) != 0u;
const uint SC_PER = (GT * TK + WG - 1u) / WG; // scores per invocation per tile
const uint K_PER = (TK * HD4 + WG - 1u) / WG; // K words per invocation per tile
// V: invocation t folds dims 4 (t % HD4) onwards of keys t / HD4,
// t / HD4 + KL, ... of each tile (KL key lanes; invocations past KL * HD4 idle).
const uint KL = WG / HD4;
const uint VK = (TK + KL - 1u) / KL; // keys per invocation per tile

layout(binding = 0) readonly buffer Q { vec4 q4[]; };
layout(binding = 0) readonly buffer Qf { float qf[]; };
layout(binding = 1) readonly buffer K { vec4 k4[]; };
layout(binding = 2) readonly buffer V { vec4 v4[]; };
layout(binding = 3) readonly buffer Pos { uint pos[]; };
layout(binding = 4) writeonly buffer Out { vec4 o4[]; };
// Status words (see embedding.comp); a position past the cache is recorded in
// the second as position + 1 and the row attends to the cache it has.
layout(binding = 5) buffer Status { uint bad_id_plus_one; uint bad_pos_plus_one; } st;
layout(binding = 6) writeonly buffer Part { float part[]; };
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
} pc;

#include "attention_split.glsl"
#include "rope.glsl"

shared vec4 qs[GT * HD4];
shared vec4 ks[TK * KS];
shared vec4 ss4[GT * TK / 4u]; // the tile's scores, head-major
// The key lanes' partial sums of one head, on their way to the first lane.
shared vec4 red[WG];
shared float red_l[WG];
// ROPE: the row's own k and v as the cache holds them: the stored words
// (two f16 pairs in .xy, or four f32 bit patterns), unpacked as a cache
// load would be, so no compiler can fold the f16 rounding away.
shared uvec4 kf[HD4];
shared uvec4 vf[HD4];

// An f16 cache binds the same buffers as 4 halves per 8-byte word.
layout(binding = 1) readonly buffer K16 { uvec2 k16[]; };
layout(binding = 2) readonly buffer V16 { uvec2 v16[]; };
vec4 halves4(uvec2 w) { return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y)); }
vec4 load_k(uint i) { return KV_F16 ? halves4(k16[i]) : k4[i]; }
vec4 load_v(uint i) { return KV_F16 ? halves4(v16[i]) : v4[i]; }
// Four values as the cache's words, and back.
uvec4 stored(vec4 x) {
    return KV_F16 ? uvec4(packHalf2x16(x.xy), packHalf2x16(x.zw), 0u, 0u) : floatBitsToUint(x);
}
vec4 unstored(uvec4 w) {
    return KV_F16 ? halves4(w.xy) : uintBitsToFloat(w);
}

float score(uint hh, uint kk) {
    return ss4[(hh * TK + kk) / 4u][(hh * TK + kk) % 4u];
}

// The tile of keys [j0, min(j0 + TK, j_end)) into registers: this
// invocation's V words (keys lane, lane + KL, ...) and its share of K.
void fetch(uint j0, uint j_end, uint lane, uint d4, uint stride4, uint koff4,
           out vec4 vr[VK], out vec4 kr[K_PER]) {
    uint nk = min(TK, j_end - j0);
    [[unroll]] for (uint i = 0u; i < VK; i++) {
        uint kk = lane + KL * i;
        vr[i] = lane < KL && kk < nk ? load_v((j0 + kk) * stride4 + koff4 + d4) : vec4(0.0);
    }
    [[unroll]] for (uint i = 0u; i < K_PER; i++) {
        uint u = gl_LocalInvocationID.x + i * WG;
        uint kk = u / HD4;
        kr[i] = u < TK * HD4 && kk < nk
            ? load_k((j0 + kk) * stride4 + koff4 + (u - kk * HD4))
            : vec4(0.0);
    }
}

// ROPE: the row's own key, a tile of one, from kf / vf.
void fetch_own(uint lane, uint d4, out vec4 vr[VK], out vec4 kr[K_PER]) {
    [[unroll]] for (uint i = 0u; i < VK; i++) {
        vr[i] = lane == 0u && i == 0u ? unstored(vf[d4]) : vec4(0.0);
    }
    [[unroll]] for (uint i = 0u; i < K_PER; i++) {
        uint u = gl_LocalInvocationID.x + i * WG;
        kr[i] = u < HD4 ? unstored(kf[u]) : vec4(0.0);
    }
}

// Key lane 0 of dims 4 d4 onwards sums every key lane's partials of one
// head (query head `hg`, running max mh) from red / red_l and writes them out.
void write_head(float mh, uint d4, uint hg, uint r, uint split) {
    vec4 a = vec4(0.0);
    float ls = 0.0;
    for (uint k = 0u; k < KL; k++) {
        a += red[k * HD4 + d4];
        ls += red_l[k * HD4 + d4];
    }
    if (pc.n_split == 1u) {
        float inv = ls > 0.0 ? 1.0 / ls : 0.0;
        o4[(r * pc.n_heads + hg) * HD4 + d4] = a * inv;
    } else {
        uint pb = ((r * pc.n_heads + hg) * pc.n_split + split) * (HD + 2u);
        if (d4 == 0u) {
            part[pb] = mh;
            part[pb + 1u] = ls;
        }
        for (uint c = 0u; c < 4u; c++) {
            part[pb + 2u + 4u * d4 + c] = a[c];
        }
    }
}

// ROPE: (cos, sin) for element d of a head (unused past rot_dim).
vec2 rotation(uint d) {
    return d < pc.rot_dim ? rot_cs[rope_freq(d, pc.rot_dim, pc.neox != 0u)] : vec2(1.0, 0.0);
}

// The row's new k (rotated) and v of kv head kvh into kf / vf, rounded as
// the cache stores them; `store`: into the cache row `p` too.
void own_kv(uint kvh, uint p, bool store) {
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
    uvec4 kw = stored(k);
    uvec4 vw = stored(v);
    kf[t] = kw;
    vf[t] = vw;
    if (store) {
        uint at = p * pc.n_kv_heads * HD4 + kvh * HD4 + t;
        if (KV_F16) {
            kout16[at] = kw.xy;
            vout16[at] = vw.xy;
        } else {
            kout4[at] = k;
            vout4[at] = v;
        }
    }
}

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

    // ROPE: the split holding the row's position (its last key) takes the
    // new k and v from kf / vf, as a last tile (uniform per workgroup).
    bool own = ROPE && p < pc.capacity && p >= j_begin && p < j_end;
    uint j_cached = own ? p : j_end; // keys [j_begin, j_cached) come from the cache
    uint tiles = (j_cached - j_begin + TK - 1u) / TK + (own ? 1u : 0u);
    uint stride4 = pc.n_kv_heads * HD4;
    uint koff4 = kvh * HD4;
    uint lane = t / HD4; // key lane
    uint d4 = t - lane * HD4;

    // The tile's query vectors, pre-scaled (heads past the group read zeros);
    // with ROPE rotated as they load, each value's pair partner read too.
    for (uint u = t; u < GT * HD4; u += WG) {
        uint hh = u / HD4;
        uint hl = h0 + hh;
        uint d = 4u * (u - hh * HD4);
        uint base = (r * pc.n_heads + kvh * group + hl) * HD;
        vec4 qv = vec4(0.0);
        if (hl < group && ROPE) {
            bool neox = pc.neox != 0u;
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                uint mate = base + rope_mate(d + c, pc.rot_dim, neox);
                qv[c] = rope_apply(d + c, qf[base + d + c], qf[mate], rotation(d + c), pc.rot_dim, neox);
            }
        } else if (hl < group) {
            qv = q4[(base + d) / 4u];
        }
        qs[u] = qv * pc.scale;
    }
    if (own) {
        own_kv(kvh, p, h0 == 0u);
        barrier();
    }

    // The running max is the same in every invocation (each reads every
    // score); sums and accumulators cover the invocation's own keys.
    float m[GT];
    float l[GT];
    vec4 acc[GT];
    [[unroll]] for (uint h = 0u; h < GT; h++) {
        m[h] = -1.0 / 0.0;
        l[h] = 0.0;
        acc[h] = vec4(0.0);
    }
    for (uint tile = 0u; tile < tiles; tile++) {
        bool own_tile = own && tile + 1u == tiles;
        uint j0 = j_begin + tile * TK;
        uint nk = own_tile ? 1u : min(TK, j_cached - j0);
        vec4 vc[VK];
        vec4 kr[K_PER];
        if (own_tile) {
            fetch_own(lane, d4, vc, kr);
        } else {
            fetch(j0, j_cached, lane, d4, stride4, koff4, vc, kr);
        }
        barrier(); // the previous tile's readers are done (and qs is visible)
        [[unroll]] for (uint i = 0u; i < K_PER; i++) {
            uint u = t + i * WG;
            uint kk = u / HD4;
            if (u < TK * HD4 && kk < nk) {
                ks[kk * KS + (u - kk * HD4)] = kr[i];
            }
        }
        barrier();
        [[unroll]] for (uint i = 0u; i < SC_PER; i++) {
            uint u = t + i * WG;
            if (u < GT * TK) {
                uint hh = u / TK;
                uint kk = u - hh * TK;
                float s = -1.0 / 0.0;
                if (kk < nk) {
                    // Two accumulators: half the dependent FMA chain.
                    vec4 a = vec4(0.0);
                    vec4 b = vec4(0.0);
                    [[unroll]] for (uint d = 0u; d + 1u < HD4; d += 2u) {
                        a += qs[hh * HD4 + d] * ks[kk * KS + d];
                        b += qs[hh * HD4 + d + 1u] * ks[kk * KS + d + 1u];
                    }
                    if ((HD4 & 1u) != 0u) {
                        a += qs[hh * HD4 + HD4 - 1u] * ks[kk * KS + HD4 - 1u];
                    }
                    a += b;
                    s = (a.x + a.y) + (a.z + a.w);
                }
                ss4[u / 4u][u % 4u] = s;
            }
        }
        barrier();
        [[unroll]] for (uint h = 0u; h < GT; h++) {
            vec4 tm = ss4[h * TK / 4u];
            [[unroll]] for (uint c = 1u; c < TK / 4u; c++) {
                tm = max(tm, ss4[h * TK / 4u + c]);
            }
            float nm = max(m[h], max(max(tm.x, tm.y), max(tm.z, tm.w)));
            float corr = exp(m[h] - nm);
            vec4 a = acc[h] * corr;
            float ls = l[h] * corr;
            [[unroll]] for (uint i = 0u; i < VK; i++) {
                uint kk = lane + KL * i;
                if (kk < nk) {
                    float pk = exp(score(h, kk) - nm);
                    ls += pk;
                    a += pk * vc[i];
                }
            }
            acc[h] = a;
            l[h] = ls;
            m[h] = nm;
        }
    }

    // The key lanes meet: lane 0 of each dim group sums the others', one
    // head at a time.
    [[unroll]] for (uint h = 0u; h < GT; h++) {
        barrier();
        red[t] = acc[h];
        red_l[t] = l[h];
        barrier();
        if (t < HD4 && h0 + h < group) {
            write_head(m[h], t, kvh * group + h0 + h, r, split);
        }
    }
}
