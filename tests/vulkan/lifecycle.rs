//! A backend's life: creation and drop, waits, pipeline statistics and
//! cache, barrier placement, replayed passes, descriptor pools, transfers.

use crate::common::{
    self, assert_close, download_f32, download_u32, pass, rand_f32, upload_f32, upload_u32,
    weight_bytes,
};
use crate::{assert_within, gemv_allowed, TOL};
use std::time::Duration;
use vkllm::backend::{AttentionParams, Buffer, ComputeBackend};
use vkllm::vk::{Options, VulkanBackend};
use vkllm::{reference, DType};

#[test]
fn backend_is_send() {
    fn is_send<T: Send>() {}
    is_send::<VulkanBackend>();
}

#[test]
fn create_and_destroy_repeatedly_with_validation() {
    if common::vulkan_backend().is_none() {
        return;
    }
    let opts = Options {
        validate: true,
        ..Options::from_env().unwrap()
    };
    for i in 0..5 {
        let mut b = VulkanBackend::new(&opts).unwrap();
        let data = rand_f32(1000, i);
        let buf = upload_f32(&mut b, &data);
        assert_eq!(download_f32(&mut b, &buf, 1000), data);
        b.begin_pass().unwrap();
        b.scale(&buf, 2.0, &buf, 1000).unwrap();
        b.end_pass().unwrap();
        let want: Vec<f32> = data.iter().map(|v| v * 2.0).collect();
        assert_eq!(download_f32(&mut b, &buf, 1000), want);
        b.free(buf);
    }
}

/// Asking for pipeline statistics (printed where the driver has
/// VK_KHR_pipeline_executable_properties; lavapipe has not) changes nothing
/// a pass computes, under the validation layer.
#[test]
fn pipeline_statistics_leave_results_alone() {
    if common::vulkan_backend().is_none() {
        return;
    }
    let opts = Options {
        validate: true,
        pipeline_stats: true,
        ..Options::from_env().unwrap()
    };
    let mut b = VulkanBackend::new(&opts).unwrap();
    let data = rand_f32(1000, 3);
    let buf = upload_f32(&mut b, &data);
    pass(&mut b, |b| b.scale(&buf, 0.5, &buf, 1000).unwrap());
    let want: Vec<f32> = data.iter().map(|v| v * 0.5).collect();
    assert_eq!(download_f32(&mut b, &buf, 1000), want);
}

/// A wait that polls the fence (`Options::spin_wait`) returns only once the
/// pass has finished, as the sleeping wait does: after every replay the
/// mapped buffer the pass writes last holds that pass's values. Each pass
/// flips their sign through 63 dependent dispatches, so a wait returning
/// early would read the previous pass's.
#[test]
fn polling_and_sleeping_waits_see_every_pass_finished() {
    if common::vulkan_backend().is_none() {
        return;
    }
    let n = 1 << 16;
    for spin in [Duration::ZERO, Duration::from_secs(5)] {
        let opts = Options {
            validate: true,
            spin_wait: Some(spin),
            ..Options::from_env().unwrap()
        };
        let mut b = VulkanBackend::new(&opts).unwrap();
        let mut want = rand_f32(n, 4);
        let a = upload_f32(&mut b, &want);
        let out = b.alloc_mapped(n * 4).unwrap();
        b.begin_replayable_pass(1).unwrap();
        for _ in 0..63 {
            b.scale(&a, -1.0, &a, n).unwrap();
        }
        b.copy(&a, 0, &out, 0, n * 4).unwrap();
        // end_pass runs the pass once; then each replay.
        b.end_pass().unwrap();
        for run in 0..8 {
            if run > 0 {
                assert!(b.replay(1, 1).unwrap(), "the pass was not kept");
            }
            want.iter_mut().for_each(|v| *v = -*v);
            assert_eq!(download_f32(&mut b, &out, n), want, "{spin:?}, run {run}");
        }
    }
}

#[test]
fn barriers_only_between_dependent_ops() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let (dim, n) = (64, 64);
    let x = rand_f32(dim, 51);
    let wq = weight_bytes(DType::F32, n, dim, 52);
    let wk = weight_bytes(DType::F32, n, dim, 53);
    let wv = weight_bytes(DType::F32, n, dim, 54);
    let xb = upload_f32(&mut b, &x);
    let mut ws = Vec::new();
    for wb in [&wq, &wk, &wv] {
        ws.push(b.upload_weight(DType::F32, n, dim, wb).unwrap());
    }
    let outs: Vec<Buffer> = (0..3).map(|_| b.alloc(n * 4).unwrap()).collect();
    let sum = b.alloc(n * 4).unwrap();

    // Three projections of the same input: independent, no barrier.
    b.begin_pass().unwrap();
    for (w, o) in ws.iter().zip(&outs) {
        b.matmul(w, None, &xb, o, 1).unwrap();
    }
    b.end_pass().unwrap();
    let s = b.stats();
    eprintln!("independent projections: {s:?}");
    assert_eq!(
        (s.dispatches, s.barriers, s.submits, s.descriptor_sets),
        (3, 0, 1, 3)
    );

    // A dependent chain: q + k -> sum, sum * 2 -> sum, sum + v -> sum.
    b.begin_pass().unwrap();
    for (w, o) in ws.iter().zip(&outs) {
        b.matmul(w, None, &xb, o, 1).unwrap();
    }
    b.add(&outs[0], &outs[1], &sum, n).unwrap();
    b.scale(&sum, 2.0, &sum, n).unwrap();
    b.add(&sum, &outs[2], &sum, n).unwrap();
    b.end_pass().unwrap();
    let s = b.stats();
    eprintln!("projections + dependent chain: {s:?}");
    assert_eq!((s.dispatches, s.barriers, s.submits), (6, 3, 1));

    // KV-cache append then attention over the cache: the copy's write is
    // read by attention (one barrier); the second copy, into the other
    // cache, is independent of the first.
    let cache = b.alloc(2 * n * 4).unwrap();
    let vcache = b.alloc(2 * n * 4).unwrap();
    let pos = upload_u32(&mut b, &[1]);
    let att_out = b.alloc(n * 4).unwrap();
    let att = AttentionParams {
        rows: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: n,
        capacity: 2,
        span: 2,
        scale: 0.125,
        window: 0,
        kv_dtype: DType::F32,
        pages: None,
        next: None,
        sinks: None,
    };
    b.begin_pass().unwrap();
    b.copy(&outs[1], 0, &cache, n * 4, n * 4).unwrap();
    b.copy(&outs[2], 0, &vcache, n * 4, n * 4).unwrap();
    b.attention(&outs[0], &cache, &vcache, &pos, &att_out, &att)
        .unwrap();
    b.end_pass().unwrap();
    let s = b.stats();
    eprintln!("kv append + attention: {s:?}");
    assert_eq!((s.copies, s.dispatches, s.barriers), (2, 1, 1));

    // Embedding and attention flag bad inputs in a shared status word with
    // atomics; that alone must not order them.
    let table = b.upload_weight(DType::F32, n, dim, &wq).unwrap();
    let ids = upload_u32(&mut b, &[3]);
    b.begin_pass().unwrap();
    b.embedding(&table, &ids, &outs[1], 1).unwrap();
    b.attention(&outs[0], &cache, &vcache, &pos, &att_out, &att)
        .unwrap();
    b.embedding(&table, &ids, &outs[2], 1).unwrap();
    b.end_pass().unwrap();
    let s = b.stats();
    eprintln!("two embeddings + attention: {s:?}");
    assert_eq!((s.dispatches, s.barriers), (3, 0));

    let q = reference::matmul(DType::F32, &wq, n, dim, None, &x, 1).unwrap();
    let k = reference::matmul(DType::F32, &wk, n, dim, None, &x, 1).unwrap();
    let v = reference::matmul(DType::F32, &wv, n, dim, None, &x, 1).unwrap();
    let want: Vec<f32> = (0..n).map(|i| (q[i] + k[i]) * 2.0 + v[i]).collect();
    let scale = vec![dim as f32; n];
    assert_close("chain", &download_f32(&mut b, &sum, n), &want, &scale, TOL);
}

#[test]
fn replayed_pass_reads_new_token_and_position() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let (vocab, dim, cap) = (16, 64, 8);
    let table_bytes = weight_bytes(DType::Q8_0, vocab, dim, 71);
    let table = b
        .upload_weight(DType::Q8_0, vocab, dim, &table_bytes)
        .unwrap();
    let wb = weight_bytes(DType::Q4_0, vocab, dim, 72);
    let w = b.upload_weight(DType::Q4_0, vocab, dim, &wb).unwrap();
    let kv = rand_f32(cap * dim, 73);
    let kc = upload_f32(&mut b, &kv);
    let ids = upload_u32(&mut b, &[3]);
    let pos = upload_u32(&mut b, &[0]);
    let h = b.alloc(dim * 4).unwrap();
    let a = b.alloc(dim * 4).unwrap();
    let logits = b.alloc(vocab * 4).unwrap();
    let best = b.alloc(4).unwrap();
    let att = AttentionParams {
        rows: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: dim,
        capacity: cap,
        span: cap,
        scale: 0.125,
        window: 0,
        kv_dtype: DType::F32,
        pages: None,
        next: None,
        sinks: None,
    };
    // One decode step: embed, attend over positions 0..=pos, project, argmax.
    let record = |b: &mut VulkanBackend| {
        pass(b, |b| {
            b.embedding(&table, &ids, &h, 1).unwrap();
            b.attention(&h, &kc, &kc, &pos, &a, &att).unwrap();
            b.matmul(&w, None, &a, &logits, 1).unwrap();
            b.argmax(&logits, None, &best, 1, vocab).unwrap();
        })
    };
    let expect = |token: u32, p: u32| {
        let e = reference::embedding(DType::Q8_0, &table_bytes, vocab, dim, &[token]).unwrap();
        let at = reference::attention(&e, &kv, &kv, &[p], &att).unwrap();
        let y = reference::matmul(DType::Q4_0, &wb, vocab, dim, None, &at, 1).unwrap();
        (at, y)
    };
    record(&mut b);
    for (token, p) in [(5u32, 2u32), (11, 6)] {
        b.upload(&ids, 0, bytemuck::bytes_of(&token)).unwrap();
        b.upload(&pos, 0, bytemuck::bytes_of(&p)).unwrap();
        b.replay_pass().unwrap();
        let got = download_f32(&mut b, &logits, vocab);
        let (at, want) = expect(token, p);
        let allowed = gemv_allowed(&b, (DType::Q4_0, &wb), vocab, dim, &at, 1);
        assert_within(
            &format!("replay token {token} pos {p}"),
            &got,
            &want,
            &allowed,
        );
        assert_eq!(
            download_u32(&mut b, &best, 1),
            reference::argmax(&got, vocab).unwrap()
        );
    }
    // A freed buffer ends replays.
    let tmp = b.alloc(4).unwrap();
    b.free(tmp);
    assert!(b.replay_pass().is_err(), "replay after free");
}

#[test]
fn passes_longer_than_one_descriptor_pool() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    // 1500 dispatches need more descriptor sets than one pool holds (1024);
    // the second pass reuses the pools after their reset.
    let x = upload_f32(&mut b, &[0.0; 8]);
    let ones = upload_f32(&mut b, &[1.0; 8]);
    for round in 1..=2 {
        pass(&mut b, |b| {
            for _ in 0..1500 {
                b.add(&x, &ones, &x, 8).unwrap();
            }
        });
        let s = b.stats();
        assert_eq!(
            (s.dispatches, s.descriptor_sets, s.barriers),
            (1500, 1500, 1499)
        );
        assert_eq!(download_f32(&mut b, &x, 8), vec![1500.0 * round as f32; 8]);
    }
}

#[test]
fn large_upload_download_round_trip() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    // Larger than the 64 MiB staging buffer, so transfers go in chunks.
    let bytes = 100 << 20;
    let data: Vec<u8> = (0..bytes).map(|i| (i * 7 + i / 4096) as u8).collect();
    let buf = b.alloc(bytes + 12).unwrap();
    b.upload(&buf, 12, &data).unwrap();
    let mut out = vec![0u8; bytes];
    b.download(&buf, 12, &mut out).unwrap();
    assert!(out == data, "round trip differs");
    let mut head = [1u8; 12];
    b.download(&buf, 0, &mut head).unwrap();
    assert_eq!(head, [0u8; 12]);
}

/// The pipeline cache goes to disk when the backend drops and comes back
/// when the next one opens; a file from elsewhere (here: garbage under the
/// same name) is ignored, not an error. (lavapipe keeps its pipelines in
/// Mesa's own cache and writes only the 32-byte header; NVIDIA's driver
/// writes the pipelines too.)
#[test]
fn pipeline_cache_round_trips_through_disk() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        pipeline_cache: Some(dir.path().to_path_buf()),
        ..Options::from_env().unwrap()
    };
    let run = |b: &mut VulkanBackend| {
        let x = upload_f32(b, &[1.0, 2.0, 3.0, 4.0]);
        let y = b.alloc(16).unwrap();
        pass(b, |b| b.scale(&x, 2.0, &y, 4).unwrap());
        assert_eq!(download_f32(b, &y, 4), [2.0, 4.0, 6.0, 8.0]);
    };
    let Some(mut b) = common::vulkan_with(&opts) else {
        return;
    };
    assert_eq!(b.pipeline_cache_loaded_bytes(), 0, "an empty directory");
    run(&mut b);
    drop(b);
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "one cache file: {files:?}");
    let written = std::fs::metadata(&files[0]).unwrap().len() as usize;
    assert!(written >= 32, "the header at least");
    let mut b = common::vulkan_with(&opts).unwrap();
    assert_eq!(
        b.pipeline_cache_loaded_bytes(),
        written,
        "the cache was read back"
    );
    eprintln!(
        "{}: {written} bytes of pipeline cache",
        b.device_info().name
    );
    run(&mut b);
    drop(b);
    std::fs::write(&files[0], vec![7u8; 4096]).unwrap();
    let mut b = common::vulkan_with(&opts).unwrap();
    assert_eq!(
        b.pipeline_cache_loaded_bytes(),
        0,
        "a foreign file is ignored"
    );
    run(&mut b);
}
