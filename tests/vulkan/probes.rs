//! The measurement probes of `vkllm bench` and benches/dispatch.rs: grid
//! sync, flow-ordered GEMVs, the copy probe's binding range.

use crate::common::{self, download_u32, pass};
use vkllm::backend::ComputeBackend;
use vkllm::vk::VulkanBackend;

#[test]
fn grid_sync_probe_rounds_see_the_round_before() {
    // benches/dispatch.rs's probe: each round adds 1 to what another
    // workgroup wrote in the round before, so after n rounds from zeros
    // every value is n, whether the rounds are dispatches (with the
    // recorder's barriers) or meet at the grid barrier. A CPU device runs
    // workgroups one after another, so the grid barrier is checked there
    // only with one workgroup.
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let grid_groups = if b.device_info().kind == "CPU" { 1 } else { 64 };
    for (groups, sync) in [(4, false), (grid_groups, true)] {
        let bytes = vkllm::vk::grid_sync_bytes(groups);
        let data = b.alloc(bytes).unwrap();
        b.upload(&data, 0, &vec![0u8; bytes]).unwrap();
        let rounds = 5;
        pass(&mut b, |b| {
            if sync {
                b.grid_sync(&data, groups, rounds, 0, true).unwrap();
            } else {
                for i in 0..rounds {
                    b.grid_sync(&data, groups, 1, i, false).unwrap();
                }
            }
        });
        let words = download_u32(&mut b, &data, 4 + 2 * groups * 128);
        assert_eq!(words[2], 0, "no workgroup gave up waiting");
        // Round 4 (the last) read the first half and wrote the second.
        let last = &words[4 + groups * 128..];
        assert!(
            last.iter().all(|&w| f32::from_bits(w) == rounds as f32),
            "{groups} workgroups, sync {sync}: {:?}",
            &last[..8]
        );
        b.free(data);
    }
}

/// Steps of the flow_gemv probe's chain over `words` (three n x n weights)
/// from `first`, ordered by `order`: v's rows and the flow words.
fn flow_chain(
    b: &mut VulkanBackend,
    words: &[u32],
    first: &[f32],
    steps: usize,
    order: vkllm::vk::FlowOrder,
) -> (Vec<f32>, Vec<u32>) {
    use vkllm::vk::{flow_gemv_flow_bytes, flow_gemv_weight_bytes};
    let n = first.len();
    let copies = words.len() * 4 / flow_gemv_weight_bytes(n);
    let w = b.alloc(words.len() * 4).unwrap();
    b.upload(&w, 0, bytemuck::cast_slice(words)).unwrap();
    let v = b.alloc((steps + 1) * n * 4).unwrap();
    b.upload(&v, 0, &vec![0u8; (steps + 1) * n * 4]).unwrap();
    b.upload(&v, 0, bytemuck::cast_slice(first)).unwrap();
    let fb = flow_gemv_flow_bytes(steps);
    let flow = b.alloc(fb).unwrap();
    b.upload(&flow, 0, &vec![0u8; fb]).unwrap();
    pass(b, |b| {
        for i in 0..steps {
            b.flow_gemv(&flow, &v, &w, i % copies, n, i, order).unwrap();
        }
    });
    let flags = download_u32(b, &flow, 4 + steps);
    let vals = download_u32(b, &v, (steps + 1) * n)
        .into_iter()
        .map(f32::from_bits)
        .collect();
    for buf in [w, v, flow] {
        b.free(buf);
    }
    (vals, flags)
}

#[test]
fn flow_gemv_probe_waiting_chain_equals_the_barrier_chain() {
    // benches/dispatch.rs's probe: a chain of GEMVs whose dispatches wait
    // on counts instead of barriers must read every step's input after it
    // is written, so it gives the barrier chain's values exactly. The
    // waiting chains run without the validation layer: they leave Vulkan's
    // ordering on purpose (what the probe measures), and its
    // synchronization validation reports every step.
    use vkllm::vk::{flow_gemv_weight_bytes, FlowOrder, Options};
    let (n, steps, copies) = (1024, 6, 3);
    let words: Vec<u32> = (0..copies * flow_gemv_weight_bytes(n) / 4)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7))
        .collect();
    let first: Vec<f32> = (0..n).map(|i| ((i * 37) % 19) as f32 / 9.0 - 1.0).collect();
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let (barrier, _) = flow_chain(&mut b, &words, &first, steps, FlowOrder::Barrier);
    drop(b);
    // The scalar GEMV of step 0, so the chain computes what it says.
    let nib = |row: usize, i: usize| {
        let word = words[row * n / 8 + i / 8];
        ((word >> (4 * (i % 8))) & 15) as f32 - 8.0
    };
    for row in [0, 1, 517, n - 1] {
        let want: f32 = (0..n).map(|i| nib(row, i) * first[i]).sum::<f32>() / n as f32;
        let got = barrier[n + row];
        assert!((got - want).abs() < 1e-4, "row {row}: {got} vs {want}");
    }
    assert!(barrier[steps * n..].iter().any(|&x| x != 0.0));
    let unvalidated = Options {
        validate: false,
        ..Options::from_env()
    };
    let Some(mut b) = common::vulkan_with(&unvalidated) else {
        return;
    };
    for order in [FlowOrder::Wait { backoff: 8 }, FlowOrder::WaitPairs] {
        let (vals, flags) = flow_chain(&mut b, &words, &first, steps, order);
        assert_eq!(flags[0], 0, "{order:?}: no workgroup gave up waiting");
        assert!(
            flags[4..].iter().all(|&c| c as usize == n / 8),
            "{order:?}: every workgroup of every step counted itself: {:?}",
            &flags[4..]
        );
        assert!(vals == barrier, "{order:?}: the waiting chain differs");
    }
}

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
