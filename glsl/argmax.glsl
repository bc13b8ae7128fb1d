// (value, index) arg-max reduction shared by argmax.comp and
// argmax_combine.comp. NONE marks "no candidate" (an empty slice, or only
// NaNs: a NaN never becomes a candidate). Among candidates the larger value
// wins and, on equal values, the smaller index: the first index on ties.
const uint NONE = 0xFFFFFFFFu;

// Whether candidate (v, i) beats the current best (bv, bi).
bool am_better(float v, uint i, float bv, uint bi) {
    return i != NONE && (bi == NONE || v > bv || (v == bv && i < bi));
}

// Up to 256 subgroups per workgroup (a 256-wide workgroup with subgroups of 1).
shared float am_v[256];
shared uint am_i[256];

// The workgroup's best of every invocation's (bv, bi); every invocation must
// call it and every invocation gets the result. Candidates are never NaN, so
// subgroupMax is exact; a lane without a candidate holds -inf with NONE, and
// NONE, the largest uint, loses every subgroupMin. Correct for any subgroup
// size: the per-subgroup results are folded by the first subgroup in strides
// of its size.
void am_reduce(inout float bv, inout uint bi) {
    float m = subgroupMax(bi == NONE ? -1.0 / 0.0 : bv);
    uint mi = subgroupMin((bi != NONE && bv == m) ? bi : NONE);
    barrier();
    if (subgroupElect()) {
        am_v[gl_SubgroupID] = m;
        am_i[gl_SubgroupID] = mi;
    }
    barrier();
    if (gl_SubgroupID == 0u) {
        bv = -1.0 / 0.0;
        bi = NONE;
        for (uint s = gl_SubgroupInvocationID; s < gl_NumSubgroups; s += gl_SubgroupSize) {
            if (am_better(am_v[s], am_i[s], bv, bi)) {
                bv = am_v[s];
                bi = am_i[s];
            }
        }
        m = subgroupMax(bi == NONE ? -1.0 / 0.0 : bv);
        mi = subgroupMin((bi != NONE && bv == m) ? bi : NONE);
        if (subgroupElect()) {
            am_v[0] = m;
            am_i[0] = mi;
        }
    }
    barrier();
    bv = am_v[0];
    bi = am_i[0];
}
