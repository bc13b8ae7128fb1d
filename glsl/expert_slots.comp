// The slots routed to each expert, for the grouped GEMMs of
// matmul_experts (experts.glsl): workgroup e scans the `slots` expert ids
// in order and writes how many are e at word e and those slots, ascending,
// from word lists + e * slots (lists = experts + 1); workgroup `experts`
// collects the slots whose id is past the experts. Each invocation takes 4
// consecutive ids a step, so a step is one barrier per 4 ids a lane.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer Ids { uint ids[]; };
layout(binding = 1) writeonly buffer Lists { uint lists[]; };

layout(push_constant) uniform Push {
    uint slots;
    uint experts;
} pc;

const uint PER = 4u;
// Hits of each subgroup in one step (the host keeps workgroups within 256
// invocations).
shared uint sg_hits[256];

void main() {
    uint e = gl_WorkGroupID.x;
    uint at = pc.experts + 1u + e * pc.slots;
    uint count = 0u;
    uint step = PER * gl_WorkGroupSize.x;
    for (uint s0 = 0u; s0 < pc.slots; s0 += step) {
        uint first = s0 + PER * gl_LocalInvocationIndex;
        bool hit[PER];
        uint mine = 0u;
        [[unroll]] for (uint i = 0u; i < PER; i++) {
            uint s = first + i;
            hit[i] = false;
            if (s < pc.slots) {
                uint id = ids[s];
                hit[i] = e < pc.experts ? id == e : id >= pc.experts;
            }
            mine += uint(hit[i]);
        }
        uint before = subgroupExclusiveAdd(mine);
        uint here = subgroupAdd(mine);
        if (subgroupElect()) {
            sg_hits[gl_SubgroupID] = here;
        }
        barrier();
        uint offset = count + before;
        for (uint g = 0u; g < gl_NumSubgroups; g++) {
            uint h = sg_hits[g];
            offset += g < gl_SubgroupID ? h : 0u;
            count += h;
        }
        [[unroll]] for (uint i = 0u; i < PER; i++) {
            if (hit[i]) {
                lists[at + offset] = first + i;
                offset++;
            }
        }
        barrier();
    }
    if (gl_LocalInvocationIndex == 0u) {
        lists[e] = count;
    }
}
