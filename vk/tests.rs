//! Unit tests of the backend's own Vulkan objects (validation, teardown).

use super::{vk_err, vulkan_required, Options, VulkanBackend};
use crate::backend::ComputeBackend;
use crate::dtype::DType;
use crate::error::Error;
use ash::vk;
use std::sync::{Mutex, MutexGuard};

/// One validated backend at a time: the validation layer's global state
/// is not safe against instances created concurrently (see
/// `tests/common::hold_vulkan_lock`).
fn validated() -> Option<(MutexGuard<'static, ()>, VulkanBackend)> {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let opts = Options {
        validate: true,
        ..Options::from_env().expect("the VKLLM_* settings")
    };
    match VulkanBackend::new(&opts) {
        Ok(b) => Some((guard, b)),
        Err(e) if !vulkan_required() => {
            eprintln!("skipping Vulkan: {e}");
            None
        }
        Err(e) => panic!("VKLLM_REQUIRE_VULKAN=1 but the Vulkan backend failed: {e}"),
    }
}

/// A host app matches what it can act on: device loss and the two kinds
/// of memory exhaustion are variants of their own, not strings.
#[test]
fn vk_results_map_to_matchable_variants() {
    let e = vk_err("submitting a pass");
    assert!(
        matches!(e(vk::Result::ERROR_DEVICE_LOST), Error::DeviceLost(w) if w == "submitting a pass")
    );
    assert!(matches!(
        e(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY),
        Error::OutOfDeviceMemory { .. }
    ));
    assert!(matches!(
        e(vk::Result::ERROR_OUT_OF_HOST_MEMORY),
        Error::OutOfHostMemory { .. }
    ));
    assert!(matches!(
        e(vk::Result::ERROR_FEATURE_NOT_PRESENT),
        Error::Unsupported(_)
    ));
    assert!(matches!(e(vk::Result::TIMEOUT), Error::Vulkan(_)));
    assert_eq!(
        e(vk::Result::ERROR_DEVICE_LOST).to_string(),
        "the device was lost while submitting a pass; the backend must be reopened"
    );
    assert_eq!(
        e(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY).to_string(),
        "out of device memory while submitting a pass"
    );
}

/// Destroying a backend that did work (and still holds buffers, weights,
/// pipelines, descriptor pools) leaves nothing for the validation layer
/// to report, e.g. objects outliving the device.
#[test]
fn teardown_is_validation_clean() {
    let Some((_one_at_a_time, mut b)) = validated() else {
        return;
    };
    let messages = b.inst.messages().expect("validation is on");
    let w = b.upload_weight(DType::F32, 4, 4, &[0u8; 64]).unwrap();
    let x = b.alloc(16).unwrap();
    let y = b.alloc(16).unwrap();
    b.begin_pass().unwrap();
    b.matmul(&w, None, &x, &y, 1).unwrap();
    b.end_pass().unwrap();
    let mut out = [0u8; 16];
    b.download(&y, 0, &mut out).unwrap();
    drop(b);
    let left = messages.lock().unwrap();
    assert!(left.is_empty(), "teardown reported: {left:?}");
}

/// Misuse reported by the validation layer surfaces as `Error::Vulkan`.
#[test]
fn validation_messages_become_errors() {
    let Some((_one_at_a_time, b)) = validated() else {
        return;
    };
    // A buffer without usage flags is invalid (VUID-VkBufferCreateInfo-usage-requiredbitmask).
    let info = vk::BufferCreateInfo::default().size(16);
    // SAFETY: deliberately invalid create info on a live device; the
    // buffer, if the driver makes one, is destroyed at once.
    unsafe {
        if let Ok(buf) = b.dev.device.create_buffer(&info, None) {
            b.dev.device.destroy_buffer(buf, None);
        }
    }
    match b.inst.check_messages() {
        Err(Error::Vulkan(msg)) => assert!(msg.contains("usage"), "{msg}"),
        other => panic!("expected a validation error, got {other:?}"),
    }
    assert!(b.inst.check_messages().is_ok(), "messages are drained");
}
