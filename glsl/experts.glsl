// The GEMMs' mixture-of-experts builds (-DEXPERTS; vk/ops/matmul_experts.rs):
// one dispatch for every expert, each expert's x rows the slots routed to
// it, gathered. expert_slots.comp lists them: word e (e < lists = experts
// + 1) holds list e's length, list e (in slot order) starts at word
// lists + e * pc.m (pc.m: the slots), and list `experts` holds the slots
// whose id is past the experts. Workgroup y counts the lists' row tiles in
// order (the host dispatches at least as many as there can be: slots / tile
// + lists), so no workgroup is spent on an expert's absent rows. Slot s
// reads x row s / pc.x_div and writes y row s; expert e's weight rows are
// e * pc.n ..
//
// The including shader declares `pc` (n, m, ldy, x_div, experts), `y`, and
// EXPERT_TILE_M, its output tile's rows, then calls expert_tile first
// (every invocation) and addresses rows through x_row, y_row, w_row and
// m_rows: outside these builds they are the plain GEMM's.
#if defined(EXPERTS)
layout(binding = 4) readonly buffer Slots { uint slot_list[]; };

// The tile's slots.
shared uint tile_slots[EXPERT_TILE_M];
uint tile_m0;
// Rows routed to this workgroup's expert.
uint tile_count;
// The expert's first weight row.
uint expert_w0;

// Whether the workgroup has rows to compute; if so m0 becomes its tile's
// first row in its expert's list. The list of bad ids gets zeros in its
// rows' columns n0 .. n0 + tn, and nothing read. `threads` invocations,
// at least a subgroup's lanes unless fewer; uniform over the workgroup.
bool expert_tile(inout uint m0, uint n0, uint tn, uint tid, uint threads) {
    uint lists = pc.experts + 1u;
    uint t = gl_WorkGroupID.y;
    // Each subgroup walks the lists' tile counts, a lane per list, to the
    // one holding tile t: the same loads and sums in every subgroup.
    uint width = min(gl_SubgroupSize, threads);
    uint lane = gl_SubgroupInvocationID;
    uint before = 0u;
    uint e = lists;
    for (uint e0 = 0u; e0 < lists; e0 += width) {
        uint l = e0 + lane;
        uint c = l < lists ? slot_list[l] : 0u;
        uint tiles = (c + EXPERT_TILE_M - 1u) / EXPERT_TILE_M;
        uint upto = before + subgroupInclusiveAdd(tiles);
        e = subgroupMin(upto > t ? l : 0xFFFFFFFFu);
        if (e != 0xFFFFFFFFu) {
            uint first = subgroupMin(l == e ? upto - tiles : 0xFFFFFFFFu);
            tile_count = subgroupMin(l == e ? c : 0xFFFFFFFFu);
            m0 = (t - first) * EXPERT_TILE_M;
            break;
        }
        before = subgroupMax(upto);
    }
    if (e >= lists) {
        return false;
    }
    tile_m0 = m0;
    expert_w0 = e * pc.n;
    uint rows = min(EXPERT_TILE_M, tile_count - m0);
    for (uint i = tid; i < rows; i += threads) {
        tile_slots[i] = slot_list[lists + e * pc.m + m0 + i];
    }
    barrier();
    if (e + 1u < lists) {
        return true;
    }
    for (uint i = tid; i < rows * tn; i += threads) {
        uint col = n0 + i % tn;
        if (col < pc.n) {
            y[tile_slots[i / tn] * pc.ldy + col] = 0.0;
        }
    }
    return false;
}

uint x_row(uint r) {
    return tile_slots[r - tile_m0] / pc.x_div;
}
uint y_row(uint r) {
    return tile_slots[r - tile_m0];
}
uint w_row(uint r) {
    return expert_w0 + r;
}
uint m_rows() {
    return tile_count;
}
// Output rows are scattered: no whole-fragment stores straight to y.
const bool GATHERED = true;
#else
// Macros, so the plain builds compile as they did before these existed.
#define expert_tile(m0, n0, tn, tid, threads) true
#define x_row(r) (r)
#define y_row(r) (r)
#define w_row(r) (r)
#define m_rows() pc.m
const bool GATHERED = false;
#endif
