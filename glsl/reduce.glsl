// Workgroup-wide reductions: subgroup ops first, then one shared-memory step
// across subgroups. Every invocation of the workgroup must call them.
shared float red_partial[64];

float wg_sum(float v) {
    float s = subgroupAdd(v);
    barrier();
    if (subgroupElect()) {
        red_partial[gl_SubgroupID] = s;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        total += red_partial[i];
    }
    return total;
}

float wg_max(float v) {
    float s = subgroupMax(v);
    barrier();
    if (subgroupElect()) {
        red_partial[gl_SubgroupID] = s;
    }
    barrier();
    float total = red_partial[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) {
        total = max(total, red_partial[i]);
    }
    return total;
}
