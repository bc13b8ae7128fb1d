//! The measurement probes of `vkllm bench`: the copy probe's binding range.

use crate::common;
use vkllm::backend::ComputeBackend;

#[test]
fn copy_probe_fits_the_devices_binding_range() {
    // `vkllm bench` asks for 256 MiB; lavapipe binds at most 128 MiB, and
    // the probe's streaming kernel failed there. A request past the range
    // is probed at the range. (Devices that bind more than 1 GiB skip: the
    // request would allocate twice that.)
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let range = b
        .max_op_buffer_bytes()
        .expect("a Vulkan device has a binding range");
    if range > 1 << 30 {
        return;
    }
    let gbs = vkllm::bench::bandwidth::backend_copy_gbs(&mut b, range as usize + 4096, 1).unwrap();
    assert!(gbs.is_finite() && gbs > 0.0, "{gbs} GB/s");
}
