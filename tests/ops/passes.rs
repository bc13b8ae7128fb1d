//! Passes and buffers: errors for bad shapes and handles, uploads ordered
//! inside a pass, append_token, mapped buffers.

use crate::common::{download_f32, download_u32, pass, upload_f32, upload_u32, weight_bytes};
use crate::{cpu_backends, test_device, vulkan_backends, Named};
use vkllm::backend::{AttentionParams, ComputeBackend, RopeParams, RopeStyle};
use vkllm::cpu::CpuBackend;
use vkllm::DType;

fn bad_shapes_and_handles_are_errors((name, mut b): Named) {
    let b = b.as_mut();
    let wb = weight_bytes(DType::Q4_0, 4, 64, 1);
    assert!(
        b.upload_weight(DType::Q4_0, 4, 64, &wb[1..]).is_err(),
        "{name}: short weight"
    );
    assert!(
        b.upload_weight(DType::Q4_0, 4, 60, &wb).is_err(),
        "{name}: cols not whole blocks"
    );
    let w = b.upload_weight(DType::Q4_0, 4, 64, &wb).unwrap();
    let small = b.alloc(63 * 4).unwrap();
    let y = b.alloc(4 * 4).unwrap();
    assert!(
        b.upload(&small, 250, &[0; 8]).is_err(),
        "{name}: upload overrun"
    );
    b.begin_pass().unwrap();
    assert!(
        b.matmul(&w, None, &small, &y, 1).is_err(),
        "{name}: x too small"
    );
    assert!(
        b.matmul(&w, None, &y, &y, 1).is_err(),
        "{name}: x too small / aliased"
    );
    let ids = b.alloc(4).unwrap();
    let bad_rope = RopeParams {
        rows: 1,
        n_heads: 1,
        head_dim: 8,
        rot_dim: 10,
        base: 1e4,
        style: RopeStyle::Neox,
        scaling: None,
    };
    assert!(
        b.rope(&small, &ids, &bad_rope).is_err(),
        "{name}: rot_dim > head_dim"
    );
    let bad_attn = AttentionParams {
        rows: 1,
        n_heads: 3,
        n_kv_heads: 2,
        head_dim: 8,
        capacity: 4,
        span: 4,
        scale: 1.0,
        window: 0,
        kv_dtype: DType::F32,
        pages: None,
        next: None,
        sinks: None,
    };
    assert!(
        b.attention(&small, &small, &small, &ids, &y, &bad_attn)
            .is_err(),
        "{name}: heads % kv heads"
    );
    assert!(
        b.rms_norm(&small, &small, &y, 2, 64, 1e-5).is_err(),
        "{name}: rms_norm out too small"
    );
    assert!(
        b.copy(&small, 2, &y, 0, 4).is_err(),
        "{name}: unaligned copy"
    );
    b.end_pass().unwrap();
    // Out-of-range token id: the CPU sees ids and refuses; a device that
    // cannot see them must still never read outside the table (zeros).
    let ones: Vec<f32> = vec![1.0; 8];
    let table = b
        .upload_weight(DType::F32, 2, 4, bytemuck::cast_slice(&ones))
        .unwrap();
    let id = upload_u32(b, &[2]);
    let out = b.alloc(16).unwrap();
    b.begin_pass().unwrap();
    let r = b.embedding(&table, &id, &out, 1);
    let end = b.end_pass();
    if r.is_ok() && end.is_ok() {
        assert_eq!(
            download_f32(b, &out, 4),
            vec![0.0; 4],
            "{name}: token id out of range must give zeros, not another row"
        );
    }
    // A freed handle.
    b.free(small);
    let mut buf = [0u8; 4];
    assert!(
        b.download(&small, 0, &mut buf).is_err(),
        "{name}: freed buffer"
    );
    b.begin_pass().unwrap();
    assert!(b.scale(&small, 1.0, &y, 1).is_err(), "{name}: freed input");
    b.end_pass().unwrap();
}
test_device!(
    bad_shapes_and_handles_are_errors,
    bad_shapes_and_handles_are_errors_cpu,
    bad_shapes_and_handles_are_errors_vulkan
);

#[test]
fn cpu_ops_outside_a_pass_are_errors() {
    let mut b = CpuBackend::new(Some(1));
    let x = upload_f32(&mut b, &[1.0, 2.0]);
    assert!(b.scale(&x, 2.0, &x, 2).is_err());
    assert!(b.end_pass().is_err());
    b.begin_pass().unwrap();
    assert!(b.begin_pass().is_err());
}

fn uploads_inside_a_pass_land_in_order((name, mut b): Named) {
    // Per-token inputs (ids, positions) are written inside the pass that uses
    // them, so a decode step is one submit; each write must be ordered
    // between the ops around it.
    let b = b.as_mut();
    let x = upload_f32(b, &[0.0, 0.0]);
    let y = b.alloc(8).unwrap();
    let z = b.alloc(8).unwrap();
    b.begin_pass().unwrap();
    b.upload(&x, 0, bytemuck::cast_slice(&[1.0f32, 2.0]))
        .unwrap();
    b.scale(&x, 2.0, &y, 2).unwrap();
    b.upload(&x, 0, bytemuck::cast_slice(&[5.0f32, 5.0]))
        .unwrap();
    b.scale(&x, 2.0, &z, 2).unwrap();
    b.end_pass().unwrap();
    assert_eq!(
        download_f32(b, &y, 2),
        vec![2.0, 4.0],
        "{name}: first upload"
    );
    assert_eq!(
        download_f32(b, &z, 2),
        vec![10.0, 10.0],
        "{name}: second upload"
    );
    // Inside a pass only small, 4-byte-aligned writes are recordable.
    b.begin_pass().unwrap();
    assert!(
        b.upload(&x, 2, &[0; 4]).is_err(),
        "{name}: unaligned upload"
    );
    b.end_pass().unwrap();
}
test_device!(
    uploads_inside_a_pass_land_in_order,
    uploads_inside_a_pass_land_in_order_cpu,
    uploads_inside_a_pass_land_in_order_vulkan
);

fn append_token_records_the_token_and_advances((name, mut b): Named) {
    let ids = upload_u32(b.as_mut(), &[42]);
    let pos = upload_u32(b.as_mut(), &[9]);
    let history = upload_u32(b.as_mut(), &[0, 0, 0, 0]);
    for t in [42u32, 7] {
        b.upload(&ids, 0, &t.to_le_bytes()).unwrap();
        pass(b.as_mut(), |b| {
            b.append_token(&ids, &pos, &history).unwrap()
        });
    }
    assert_eq!(
        download_u32(b.as_mut(), &history, 4),
        [2, 42, 7, 0],
        "{name}"
    );
    assert_eq!(download_u32(b.as_mut(), &pos, 1), [11], "{name}");
}
test_device!(
    append_token_records_the_token_and_advances,
    append_token_records_the_token_and_advances_cpu,
    append_token_records_the_token_and_advances_vulkan
);

fn mapped_buffers_round_trip_and_feed_ops((name, mut b): Named) {
    let m = b.alloc_mapped(16).unwrap();
    assert_eq!(download_u32(b.as_mut(), &m, 4), [0; 4], "{name}: zeroed");
    b.upload(&m, 4, &5u32.to_le_bytes()).unwrap();
    let x = upload_f32(b.as_mut(), &[1.0, 9.0, 3.0]);
    pass(b.as_mut(), |b| b.argmax(&x, None, &m, 1, 3).unwrap());
    assert_eq!(download_u32(b.as_mut(), &m, 4), [1, 5, 0, 0], "{name}");
}
test_device!(
    mapped_buffers_round_trip_and_feed_ops,
    mapped_buffers_round_trip_and_feed_ops_cpu,
    mapped_buffers_round_trip_and_feed_ops_vulkan
);
