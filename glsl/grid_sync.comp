// What a persistent kernel would pay per dependent step (benches/dispatch.rs):
// `phases` rounds in which every workgroup reads what another wrote in the
// round before, separated (with `sync`) by a grid-wide barrier instead of a
// dispatch boundary and a pipeline barrier. Without `sync` one dispatch runs
// one round, and the host chains dispatches.
//
// The grid barrier (an arrival count, reset by the last workgroup to
// arrive, and a generation number the others spin on) needs every
// workgroup of the grid resident at once, which Vulkan does not promise:
// a waiting workgroup gives up after `spin_limit` polls and counts itself in
// `timeouts`, so a grid too large for the device ends, flagged, instead of
// hanging.
#version 450

layout(local_size_x = 128) in;

layout(binding = 0) coherent buffer Data {
    uint arrived;
    uint gen;
    uint timeouts;
    uint pad;
    // Two rounds' values (128 per workgroup), alternating by round.
    float v[];
} d;

layout(push_constant) uniform Push {
    uint phases;
    uint first;
    uint sync;
    uint spin_limit;
} pc;

void grid_barrier(uint groups) {
    barrier();
    if (gl_LocalInvocationIndex == 0u) {
        memoryBarrierBuffer();
        // Read before arriving: the last arrival bumps it only after ours.
        uint gen = atomicOr(d.gen, 0u);
        if (atomicAdd(d.arrived, 1u) == groups - 1u) {
            atomicExchange(d.arrived, 0u);
            memoryBarrierBuffer();
            atomicAdd(d.gen, 1u);
        } else {
            uint spins = 0u;
            while (atomicOr(d.gen, 0u) == gen) {
                spins++;
                if (spins == pc.spin_limit) {
                    atomicAdd(d.timeouts, 1u);
                    break;
                }
            }
        }
        memoryBarrierBuffer();
    }
    barrier();
}

void main() {
    uint groups = gl_NumWorkGroups.x;
    uint g = gl_WorkGroupID.x;
    uint t = gl_LocalInvocationIndex;
    uint n = groups * 128u;
    for (uint p = pc.first; p < pc.first + pc.phases; p++) {
        if (p > pc.first && pc.sync != 0u) {
            grid_barrier(groups);
        }
        uint src = (p & 1u) * n;
        uint dst = n - src;
        d.v[dst + g * 128u + t] = d.v[src + ((g + 1u) % groups) * 128u + t] + 1.0;
    }
}
