// out[r] = dequant(table[ids[r]]): one workgroup per output row. An id past
// the table (ids live in a buffer, so the host cannot check them when
// recording) gives zeros and is recorded in the status word, which the host
// reads after the submit and turns into an error.
#version 450
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(local_size_x = 128) in;

layout(binding = 0) readonly buffer W { uint wdata[]; };
layout(binding = 1) readonly buffer Ids { uint ids[]; };
layout(binding = 2) writeonly buffer Out { float o[]; };
// Largest bad id + 1 seen in this submission; 0 when all were valid.
layout(binding = 3) buffer Status { uint bad_id_plus_one; uint bad_pos_plus_one; } st;

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
    uint table_rows;
} pc;

#include "dequant.glsl"

void main() {
    uint r = wg_linear();
    if (r >= pc.rows) {
        return;
    }
    uint id = ids[r];
    if (id >= pc.table_rows && gl_LocalInvocationID.x == 0u) {
        atomicMax(st.bad_id_plus_one, id + 1u);
    }
    for (uint c = gl_LocalInvocationID.x; c < pc.cols; c += gl_WorkGroupSize.x) {
        o[r * pc.cols + c] = id < pc.table_rows ? dq1(id * pc.cols + c) : 0.0;
    }
}
