// Shared by every shader: extensions and small helpers (each .comp starts
// with `#version 450` itself, which must come before any include).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// [[unroll]]: loops over register arrays (coopmat fragments above all) that
// the driver does not unroll itself end up in local memory.
#extension GL_EXT_control_flow_attributes : require

// Workgroup index flattened over x and y: big dispatches are split over two
// dimensions because maxComputeWorkGroupCount[0] may be as low as 65535.
uint wg_linear() {
    return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}
