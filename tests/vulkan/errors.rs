//! Error paths: a bad device selection, out-of-range shapes and handles,
//! bad token ids and positions reported when the pass ends.

use crate::common::{self, download_f32, pass, upload_f32, upload_u32, weight_bytes};
use vkllm::backend::{AttentionParams, Buffer, ComputeBackend, RopeParams, RopeStyle};
use vkllm::vk::{Options, VulkanBackend};
use vkllm::{DType, Error};

#[test]
fn bad_device_selection_is_a_typed_error() {
    if common::vulkan_backend().is_none() {
        return;
    }
    for sel in ["no-such-device-anywhere", "99"] {
        let opts = Options {
            device: Some(sel.into()),
            ..Options::default()
        };
        match VulkanBackend::new(&opts) {
            Err(Error::Vulkan(msg)) => assert!(msg.contains(sel), "{msg}"),
            Err(e) => panic!("wrong error kind: {e}"),
            Ok(_) => panic!("VKLLM_DEVICE={sel} should not open"),
        }
    }
}

#[test]
fn out_of_range_shapes_are_errors() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let small = b.alloc(16).unwrap();
    let big = b.alloc(64).unwrap();
    let wb = weight_bytes(DType::Q4_0, 4, 32, 1);
    assert!(
        b.upload_weight(DType::Q4_0, 4, 33, &wb).is_err(),
        "cols not whole blocks"
    );
    assert!(
        b.upload_weight(DType::Q4_0, 5, 32, &wb).is_err(),
        "too few bytes"
    );
    assert!(
        b.upload(&small, 10, &[0u8; 8]).is_err(),
        "upload past the end"
    );
    // Out of memory is a variant a host app can match (and back off from).
    match b.alloc(1 << 50) {
        Err(e @ Error::OutOfDeviceMemory { .. }) => {
            assert!(e.to_string().contains("memory"), "{e}");
            assert_eq!(e.kind(), vkllm::ErrorKind::OutOfDeviceMemory);
        }
        other => panic!("a 1 PiB buffer should be out of device memory, got {other:?}"),
    }
    let w = b.upload_weight(DType::Q4_0, 4, 32, &wb).unwrap();
    assert!(
        b.scale(&small, 1.0, &small, 4).is_err(),
        "op outside a pass"
    );

    b.begin_pass().unwrap();
    assert!(b.matmul(&w, None, &small, &big, 1).is_err(), "x too small");
    assert!(b.matmul(&w, None, &big, &big, 1).is_err(), "y aliases x");
    let rope = RopeParams {
        rows: 1,
        n_heads: 1,
        head_dim: 4,
        rot_dim: 3,
        base: 1e4,
        style: RopeStyle::Neox,
        scaling: None,
    };
    assert!(b.rope(&small, &big, &rope).is_err(), "odd rot_dim");
    let att = AttentionParams {
        rows: 1,
        n_heads: 3,
        n_kv_heads: 2,
        head_dim: 1,
        capacity: 1,
        span: 1,
        scale: 1.0,
        window: 0,
        kv_dtype: DType::F32,
        pages: None,
        next: None,
        sinks: None,
    };
    assert!(
        b.attention(&small, &small, &small, &small, &big, &att)
            .is_err(),
        "3 heads over 2"
    );
    assert!(
        b.copy(&small, 0, &big, 56, 12).is_err(),
        "copy past the end"
    );
    assert!(b.copy(&small, 2, &big, 8, 4).is_err(), "unaligned copy");
    assert!(b.argmax(&small, None, &big, 1, 0).is_err(), "empty rows");
    assert!(
        b.rms_norm(&small, &small, &small, 1, 4, 1e-5).is_err(),
        "out aliases x"
    );
    assert!(
        b.download(&small, 0, &mut [0u8; 4]).is_err(),
        "download inside a pass"
    );
    assert!(b.begin_pass().is_err(), "nested pass");
    b.end_pass().unwrap();
    assert!(b.end_pass().is_err(), "end without begin");

    let forged = Buffer::new(small.id(), 1 << 20);
    assert!(
        b.upload(&forged, 0, &[0u8; 1024]).is_err(),
        "handle larger than its buffer"
    );
    let gone = b.alloc(4).unwrap();
    b.free(gone);
    b.begin_pass().unwrap();
    assert!(b.scale(&gone, 1.0, &big, 1).is_err(), "freed buffer");
    b.end_pass().unwrap();

    // A token id past the table is reported when the pass ends.
    let table = b.upload_weight(DType::F32, 2, 4, &[0u8; 32]).unwrap();
    let ids = upload_u32(&mut b, &[1, 5]);
    b.begin_pass().unwrap();
    b.embedding(&table, &ids, &big, 2).unwrap();
    match b.end_pass() {
        Err(Error::Op {
            op: "embedding",
            msg,
        }) => assert!(msg.contains('5'), "{msg}"),
        other => panic!("expected a bad token id error, got {other:?}"),
    }

    // So is a position past the KV cache.
    let cache = b.alloc(2 * 4 * 4).unwrap();
    let pos = upload_u32(&mut b, &[2]);
    let one_head = AttentionParams {
        rows: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 4,
        capacity: 2,
        span: 2,
        scale: 1.0,
        window: 0,
        kv_dtype: DType::F32,
        pages: None,
        next: None,
        sinks: None,
    };
    b.begin_pass().unwrap();
    b.attention(&small, &cache, &cache, &pos, &big, &one_head)
        .unwrap();
    match b.end_pass() {
        Err(Error::Op {
            op: "attention",
            msg,
        }) => assert!(msg.contains('2'), "{msg}"),
        other => panic!("expected a bad position error, got {other:?}"),
    }

    // The backend still works after all of that.
    let x = upload_f32(&mut b, &[1.0, 2.0, 3.0, 4.0]);
    pass(&mut b, |b| b.scale(&x, 3.0, &x, 4).unwrap());
    assert_eq!(download_f32(&mut b, &x, 4), vec![3.0, 6.0, 9.0, 12.0]);
}
