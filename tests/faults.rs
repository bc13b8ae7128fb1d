//! Faults leave clean errors and nothing behind: a Vulkan backend created
//! and dropped 100 times, loads that fail halfway, device memory running out
//! during a load or a pass (injected with `VKLLM_FAIL_ALLOC_AFTER`, see
//! `vk::Options::fail_alloc_after`), the device lost mid-generation and at
//! the drop's wait for idle (`VKLLM_LOSE_DEVICE_AFTER`). Each test holds the
//! Vulkan lock, so the tests of this file run one at a time and their
//! process figures are their own.

mod common;

use common::process::{assert_flat, process};
use std::process::Command;
use vkllm::model::{LoadOptions, Want};
use vkllm::vk::{Options, VulkanBackend};
use vkllm::{ComputeBackend, ErrorKind};

/// Vulkan options of this run, or `None` (test skipped) without a device.
fn vulkan_options() -> Option<Options> {
    common::vulkan_backend()?;
    Some(Options::from_env().unwrap())
}

fn small_context() -> LoadOptions {
    LoadOptions {
        context: Some(64),
        ..LoadOptions::default()
    }
}

#[test]
fn vulkan_backend_created_and_dropped_100_times_leaks_nothing() {
    // On the NVIDIA driver the 23rd backend of one process once failed at
    // instance creation (VK_ERROR_INCOMPATIBLE_DRIVER): this makes 100, each
    // with a buffer and a pass, and checks the process is left as it was.
    let Some(opts) = vulkan_options() else {
        return;
    };
    let mut warm = None;
    for i in 0..100 {
        let mut be =
            VulkanBackend::new(&opts).unwrap_or_else(|e| panic!("backend {} of 100: {e}", i + 1));
        let x = common::upload_f32(&mut be, &[1.0, 2.0, 3.0, 4.0]);
        be.begin_pass().unwrap();
        be.scale(&x, 2.0, &x, 4).unwrap();
        be.end_pass().unwrap();
        assert_eq!(common::download_f32(&mut be, &x, 4), [2.0, 4.0, 6.0, 8.0]);
        drop(be);
        if i == 9 {
            warm = Some(process());
        }
    }
    assert_flat("100 Vulkan backends", warm.unwrap(), process(), 24);
}

/// Device buffers a full load of SmolLM2 makes (weights, KV cache, scratch).
fn allocations_of_a_load(opts: &Options) -> usize {
    let be = Box::new(VulkanBackend::new(opts).unwrap());
    let mut m = common::load_model(be, &common::smollm2(), &small_context());
    m.backend().device_memory().unwrap().allocations
}

#[test]
fn device_memory_running_out_during_a_load_is_a_clean_error_and_frees_it() {
    let Some(opts) = vulkan_options() else {
        return;
    };
    let total = allocations_of_a_load(&opts) as u64;
    assert!(total > 20, "a load makes {total} buffers");
    let mut warm = None;
    // Failures at the first buffer, among the weights, at the KV cache and
    // at the last scratch buffer; each load's backend is dropped with it.
    let points = [0, 1, total / 3, total / 2, total - 20, total - 1];
    for round in 0..4 {
        for &after in &points {
            let opts = Options {
                fail_alloc_after: Some(after),
                ..opts.clone()
            };
            // With no buffer at all, opening the backend fails already.
            let e = match VulkanBackend::new(&opts) {
                Err(e) => e,
                Ok(be) => vkllm::open::load(
                    vec![Box::new(be)],
                    &common::smollm2(),
                    &small_context(),
                    &mut |_, _| {},
                )
                .err()
                .unwrap_or_else(|| panic!("a load with {after} buffers of {total} succeeded")),
            };
            assert_eq!(e.kind(), ErrorKind::OutOfDeviceMemory, "{e}");
            assert!(
                e.to_string()
                    .starts_with("out of device memory while allocating "),
                "{e}"
            );
        }
        if round == 0 {
            warm = Some(process());
        }
    }
    assert_flat("loads failing halfway", warm.unwrap(), process(), 24);
}

#[test]
fn device_memory_running_out_during_a_pass_is_a_clean_error() {
    let Some(opts) = vulkan_options() else {
        return;
    };
    // Every buffer the load needs, and not one more: the first pass's
    // on-demand scratch (rope tables, attention partials) is refused.
    let opts = Options {
        fail_alloc_after: Some(allocations_of_a_load(&opts) as u64),
        ..opts
    };
    let be = Box::new(VulkanBackend::new(&opts).unwrap());
    let mut m = common::load_model(be, &common::smollm2(), &small_context());
    let e = m
        .forward(&[1, 2, 3], Want::LastLogits)
        .expect_err("the pass ran");
    assert_eq!(e.kind(), ErrorKind::OutOfDeviceMemory, "{e}");
    // The host app can still report, reset and drop the model.
    m.reset();
    assert!(m.forward(&[1], Want::LastLogits).is_err());
    drop(m);
}

#[test]
fn out_of_device_memory_in_the_cli_is_one_line_and_exit_1() {
    if vulkan_options().is_none() {
        return;
    }
    let model = common::smollm2();
    for after in ["0", "30"] {
        let o = Command::new(env!("CARGO_BIN_EXE_vkllm"))
            .args(["generate", "-b", "vulkan", "-m"])
            .arg(&model)
            .args(["--prompt-ids", "1,2,3", "-n", "2"])
            .env("VKLLM_FAIL_ALLOC_AFTER", after)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "after {after}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "after {after}: {stderr}");
        assert!(
            lines[0].starts_with("error: out of device memory while allocating "),
            "{stderr}"
        );
    }
}

#[test]
fn device_lost_during_generation_is_a_clean_error_and_the_model_drops() {
    let Some(opts) = vulkan_options() else {
        return;
    };
    for after in [0, 2] {
        let opts = Options {
            lose_device_after: Some(after),
            ..opts.clone()
        };
        let be = Box::new(VulkanBackend::new(&opts).unwrap());
        let mut m = common::load_model(be, &common::smollm2(), &small_context());
        // `after` passes run; a forward takes at least one.
        let e = (1..=after as u32 + 1)
            .find_map(|id| m.forward(&[id], Want::LastLogits).err())
            .unwrap_or_else(|| panic!("{} passes ran, {after} were allowed", after + 1));
        assert_eq!(e.kind(), ErrorKind::DeviceLost, "{e}");
        assert!(
            e.to_string()
                .starts_with("the device was lost while submitting work"),
            "{e}"
        );
        // A lost device stays lost; the host app can still reset and drop
        // the model.
        m.reset();
        let e = m.forward(&[1], Want::LastLogits).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DeviceLost, "{e}");
        drop(m);
        // The drop's wait answered DeviceLost; it left no validation
        // message (opening checks them).
        VulkanBackend::new(&opts).unwrap();
    }
}

#[test]
fn a_lost_device_waits_idle_as_lost_and_drops_cleanly() {
    // A driver that lost the device answers vkDeviceWaitIdle, which the drop
    // calls, with VK_ERROR_DEVICE_LOST; the injected loss does the same.
    let Some(opts) = vulkan_options() else {
        return;
    };
    let opts = Options {
        lose_device_after: Some(1),
        ..opts
    };
    // 16 MiB per round, so a backend whose memory outlived its drop shows.
    let n = 4 << 20;
    let mut warm = None;
    for round in 0..20 {
        // Opening fails on validation messages left by the last drop.
        let mut be = VulkanBackend::new(&opts)
            .unwrap_or_else(|e| panic!("backend after {round} lost ones: {e}"));
        let x = common::upload_f32(&mut be, &vec![1.0; n]);
        for pass in 0..2 {
            be.begin_pass().unwrap();
            be.scale(&x, 2.0, &x, n).unwrap();
            match (pass, be.end_pass()) {
                (0, r) => r.unwrap(),
                (_, r) => assert_eq!(r.unwrap_err().kind(), ErrorKind::DeviceLost),
            }
        }
        for _ in 0..2 {
            let e = be.wait_idle().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::DeviceLost, "{e}");
            assert!(
                e.to_string()
                    .starts_with("the device was lost while waiting for the device to be idle"),
                "{e}"
            );
        }
        let mut out = vec![0u8; 16];
        let e = be.download(&x, 0, &mut out).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DeviceLost, "{e}");
        drop(be);
        if round == 4 {
            warm = Some(process());
        }
    }
    VulkanBackend::new(&opts).expect("no validation messages from the last drop");
    assert_flat("lost devices dropped", warm.unwrap(), process(), 24);
}

#[test]
fn device_lost_in_the_cli_is_one_line_and_exit_1() {
    if vulkan_options().is_none() {
        return;
    }
    // Lost among the generated tokens' passes.
    let o = Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args(["generate", "-b", "vulkan", "-m"])
        .arg(common::smollm2())
        .args(["--prompt-ids", "1,2,3", "-n", "8"])
        .env("VKLLM_LOSE_DEVICE_AFTER", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("error: the device was lost while submitting work"),
        "{stderr}"
    );
}

#[test]
fn cpu_loads_failing_halfway_free_what_they_allocated() {
    common::hold_vulkan_lock();
    // The last layer's down projection is renamed away: the load fails
    // after every other weight is in memory, every round.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-last-ffn-down.gguf");
    let mut bytes = std::fs::read(common::smollm2()).unwrap();
    let name = b"blk.29.ffn_down.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("SmolLM2 has 30 layers");
    bytes[at + name.len() - 1] = b'x';
    std::fs::write(&path, &bytes).unwrap();
    let mut warm = None;
    for round in 0..12 {
        let mut layers_done = 0;
        let e = vkllm::open::load(
            vec![common::cpu()],
            &path,
            &small_context(),
            &mut |done, _| layers_done = done,
        )
        .err()
        .expect("a model without blk.29.ffn_down loaded");
        assert!(e.to_string().contains("blk.29.ffn_down.weight"), "{e}");
        assert!(
            layers_done >= 30,
            "it failed early, after {layers_done} layers"
        );
        if round == 1 {
            warm = Some(process());
        }
    }
    assert_flat("CPU loads failing halfway", warm.unwrap(), process(), 24);
}
