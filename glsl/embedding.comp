// out[r] = dequant(table[ids[r]]): one workgroup per output row and slice of
// 128 columns (workgroup z), one column per invocation: a decode step gathers
// a single row, and one workgroup walking it took several dispatches' time
// (benches/README.md, small kernels). An id past
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
    // Rows in this binding: a table larger than one binding may cover comes
    // in parts of whole rows, one dispatch each (vk/split.rs); this part
    // holds rows [row0, row0 + table_rows) of total_rows.
    uint table_rows;
    uint row0;
    uint total_rows;
} pc;

#include "dequant.glsl"

void main() {
    uint r = wg_linear();
    if (r >= pc.rows) {
        return;
    }
    uint id = ids[r];
    bool valid = id < pc.total_rows;
    if (!valid && gl_LocalInvocationID.x == 0u) {
        atomicMax(st.bad_id_plus_one, id + 1u);
    }
    // Another part's row (a bad id is zeroed by the part at row 0).
    if (valid ? (id < pc.row0 || id - pc.row0 >= pc.table_rows) : pc.row0 != 0u) {
        return;
    }
    uint c = gl_WorkGroupID.z * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (c < pc.cols) {
        o[r * pc.cols + c] = valid ? dq1((id - pc.row0) * pc.cols + c) : 0.0;
    }
}
