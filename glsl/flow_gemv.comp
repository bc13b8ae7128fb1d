// What a decode step would gain if dependent GEMVs did not meet at pipeline
// barriers (benches/dispatch.rs): a chain of GEMVs v[p + 1] = W_p · v[p]
// (n x n, 4-bit weights), each dispatch recorded either after a barrier or
// without one. Without one (`wait`), a dispatch may start while the one
// before still runs: each workgroup loads its weights first, then waits
// until every workgroup of the step before has counted itself in `done`,
// then reads v[p]. That needs the step before to be wholly launched, which
// Vulkan does not promise: a waiting workgroup gives up after `spin_limit`
// polls and counts itself in `timeouts`. What it saves per step did not
// carry over to whole decode passes (benches/README.md, "Overlapping the
// waits").
#version 450

layout(local_size_x = 128) in;

// Rows per workgroup: each slice of 32 invocations takes two.
const uint ROWS = 8u;
// 16-byte weight words per invocation and row at most (n <= 1024 * MAX_WORDS).
const uint MAX_WORDS = 4u;
const uint MAX_N = 1024u * MAX_WORDS;

layout(binding = 0) volatile coherent buffer Flow {
    uint timeouts;
    uint pad0;
    uint pad1;
    uint pad2;
    // Workgroups done, by step.
    uint done[];
} f;
layout(binding = 1) coherent buffer V { float v[]; };
layout(binding = 1) coherent buffer V4 { vec4 v4[]; };
layout(binding = 2) readonly buffer W { uvec4 w[]; };

layout(push_constant) uniform Push {
    uint step;
    uint n;
    uint wait;
    uint spin_limit;
    // This step's weights, in 16-byte words.
    uint w_base;
    // Arithmetic steps between two polls of the count.
    uint backoff;
} pc;

shared vec4 xs[MAX_N / 4u];
shared float part[128];

void main() {
    uint t = gl_LocalInvocationIndex;
    uint lane = t % 32u;
    uint row = gl_WorkGroupID.x * ROWS + (t / 32u) * 2u;
    uint words = pc.n / 32u;
    uint mine = words / 32u;
    uvec4 wr[2u * MAX_WORDS];
    for (uint i = 0u; i < MAX_WORDS; i++) {
        if (i < mine) {
            wr[i] = w[pc.w_base + row * words + lane + 32u * i];
            wr[MAX_WORDS + i] = w[pc.w_base + (row + 1u) * words + lane + 32u * i];
        }
    }
    if (pc.wait != 0u && pc.step > 0u) {
        if (t == 0u) {
            uint spins = 0u;
            float idle = 1.0;
            // Plain loads of the count: an atomic per poll would queue
            // every waiting workgroup on one address.
            while (f.done[pc.step - 1u] < gl_NumWorkGroups.x) {
                for (uint i = 0u; i < pc.backoff; i++) {
                    idle = idle * 0.999 + 0.001;
                }
                // Uses `idle` (never above 1) so the pause is not removed.
                spins += idle > 2.0 ? 2u : 1u;
                if (spins >= pc.spin_limit) {
                    atomicAdd(f.timeouts, 1u);
                    break;
                }
            }
        }
        memoryBarrierBuffer();
        barrier();
    }
    uint src = pc.step * pc.n;
    for (uint i = t; i < pc.n / 4u; i += 128u) {
        xs[i] = v4[src / 4u + i];
    }
    barrier();
    float s0 = 0.0;
    float s1 = 0.0;
    for (uint i = 0u; i < MAX_WORDS; i++) {
        if (i < mine) {
            uint base = (lane + 32u * i) * 8u;
            for (uint c = 0u; c < 4u; c++) {
                vec4 a = xs[base + 2u * c];
                vec4 b = xs[base + 2u * c + 1u];
                uint q = wr[i][c];
                s0 += dot(vec4(q & 15u, (q >> 4u) & 15u, (q >> 8u) & 15u, (q >> 12u) & 15u) - 8.0, a)
                    + dot(vec4((q >> 16u) & 15u, (q >> 20u) & 15u, (q >> 24u) & 15u, q >> 28u) - 8.0, b);
                q = wr[MAX_WORDS + i][c];
                s1 += dot(vec4(q & 15u, (q >> 4u) & 15u, (q >> 8u) & 15u, (q >> 12u) & 15u) - 8.0, a)
                    + dot(vec4((q >> 16u) & 15u, (q >> 20u) & 15u, (q >> 24u) & 15u, q >> 28u) - 8.0, b);
            }
        }
    }
    for (uint r = 0u; r < 2u; r++) {
        part[t] = r == 0u ? s0 : s1;
        barrier();
        for (uint h = 16u; h > 0u; h >>= 1u) {
            if (lane < h) {
                part[t] += part[t + h];
            }
            barrier();
        }
        if (lane == 0u) {
            v[src + pc.n + row + r] = part[t] / float(pc.n);
        }
        barrier();
    }
    if (pc.wait != 0u) {
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) {
            atomicAdd(f.done[pc.step], 1u);
        }
    }
}
