//! Attention over f32 and f16 caches (prefill rows, decode spans and
//! splits, windows, GQA), and the fused rope, cache append and attention.

use crate::common::{self, download_f32, max_abs_diff, pass, rand_f32, upload_f32, upload_u32};
use crate::{
    assert_f16_close, cpu_backends, decode_vulkan_backends, download_f16, f16_of, f16_unsupported,
    test_device, upload_f16, Named,
};
use vkllm::backend::{AttentionParams, Buffer, ComputeBackend, RopeParams, RopeScaling, RopeStyle};
use vkllm::{reference, DType};

fn attention_gqa_positions_and_window((name, mut b): Named) {
    // Tolerance: 1e-5 of the largest value in the cache (outputs are convex
    // combinations of values; f32 softmax differs from f64 by ~1e-7 relative).
    // head_dim 80 > 64 takes two output slices per invocation; the positions
    // in 160 keys span three key chunks.
    for (n_heads, n_kv_heads) in [(4, 4), (9, 3), (8, 2), (6, 2)] {
        for (head_dim, window) in [(64, 0), (32, 0), (64, 8), (128, 0), (80, 0), (80, 50)] {
            for (capacity, positions) in [
                (40, vec![0u32]),
                (40, vec![5, 17, 39]),
                (40, (10..17).collect::<Vec<u32>>()),
                (160, vec![0, 70, 149]),
            ] {
                let p = AttentionParams {
                    rows: positions.len(),
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    capacity,
                    span: capacity,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    window,
                    kv_dtype: DType::F32,
                    pages: None,
                    next: None,
                    sinks: None,
                };
                let q: Vec<f32> = rand_f32(p.rows * n_heads * head_dim, 21)
                    .iter()
                    .map(|v| v * 4.0)
                    .collect();
                let k: Vec<f32> = rand_f32(capacity * n_kv_heads * head_dim, 22)
                    .iter()
                    .map(|v| v * 4.0)
                    .collect();
                let v = rand_f32(capacity * n_kv_heads * head_dim, 23);
                let want = reference::attention(&q, &k, &v, &positions, &p).unwrap();
                let qb = upload_f32(b.as_mut(), &q);
                let kb = upload_f32(b.as_mut(), &k);
                let vb = upload_f32(b.as_mut(), &v);
                let pb = upload_u32(b.as_mut(), &positions);
                let out = b.alloc(q.len() * 4).unwrap();
                pass(b.as_mut(), |b| {
                    b.attention(&qb, &kb, &vb, &pb, &out, &p).unwrap()
                });
                let got = download_f32(b.as_mut(), &out, q.len());
                let err = max_abs_diff(&got, &want);
                assert!(
                    err <= 1e-5,
                    "{name} attention {n_heads}/{n_kv_heads} hd={head_dim} window={window} pos={positions:?}: error {err}"
                );
                for buf in [qb, kb, vb, pb, out] {
                    b.free(buf);
                }
            }
        }
    }
}
test_device!(
    attention_gqa_positions_and_window,
    attention_gqa_positions_and_window_cpu: cpu_backends,
    attention_gqa_positions_and_window_vulkan: decode_vulkan_backends
);

fn attention_decode_long_caches_gqa_and_windows((name, mut b): Named) {
    // Decode-sized cases (Vulkan: attention_decode.comp + the split combine):
    // caches of capacity 8192 read at short and long lengths, spans that
    // straddle a round of the clusters' keys and splits, GQA groups of 1, 2,
    // 3, 4 and 16 (several head tiles), head_dim 64, 80 (2 lanes a key, 5
    // units of 8 each), 128, 256, and 6 and 320 (not a multiple of 8, past
    // 256: the fallback kernel, whose loops lavapipe once cut short at ~6K
    // keys of head_dim 320), sliding windows shorter and longer
    // than the span, and up to 4 rows at different positions. Each case is
    // planned for the whole cache and for its own span (Vulkan: unsplit
    // where that is short), and a span planned too short must still attend
    // every key.
    // Tolerance: 4e-5 absolute (values in [-1, 1]; the CPU's f32 sums over
    // up to 8192 keys reach ~1.3e-5 against the f64 reference).
    let capacity = 8192;
    for (n_heads, n_kv_heads, head_dim) in [
        (9, 3, 64),
        (32, 8, 128),
        (16, 1, 64),
        (4, 4, 80),
        (8, 2, 256),
        (2, 1, 6),
        (4, 2, 320),
    ] {
        let kv = capacity * n_kv_heads * head_dim;
        let k: Vec<f32> = rand_f32(kv, 31).iter().map(|v| v * 4.0).collect();
        let v = rand_f32(kv, 32);
        let kb = upload_f32(b.as_mut(), &k);
        let vb = upload_f32(b.as_mut(), &v);
        let cases: [(&[u32], usize); 9] = [
            (&[0], 0),
            (&[31], 0),
            (&[32], 0),
            (&[100], 0),
            (&[4095], 0),
            (&[8191], 0),
            (&[8191], 512),
            (&[7, 2000, 8191], 1000),
            (&[0, 1, 33, 64], 16),
        ];
        let planned = |positions: &[u32]| {
            let end = *positions.iter().max().unwrap() as usize + 1;
            [capacity, end, end.div_ceil(4)]
        };
        let spans = cases
            .iter()
            .flat_map(|&(positions, window)| planned(positions).map(|s| (positions, window, s)));
        for (positions, window, span) in spans {
            let p = AttentionParams {
                rows: positions.len(),
                n_heads,
                n_kv_heads,
                head_dim,
                capacity,
                span,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window,
                kv_dtype: DType::F32,
                pages: None,
                next: None,
                sinks: None,
            };
            let q: Vec<f32> = rand_f32(p.rows * n_heads * head_dim, 33)
                .iter()
                .map(|v| v * 4.0)
                .collect();
            let want = reference::attention(&q, &k, &v, positions, &p).unwrap();
            let qb = upload_f32(b.as_mut(), &q);
            let pb = upload_u32(b.as_mut(), positions);
            let out = b.alloc(q.len() * 4).unwrap();
            pass(b.as_mut(), |b| {
                b.attention(&qb, &kb, &vb, &pb, &out, &p).unwrap()
            });
            let got = download_f32(b.as_mut(), &out, q.len());
            let err = max_abs_diff(&got, &want);
            assert!(
                err <= 4e-5,
                "{name} attention {n_heads}/{n_kv_heads} hd={head_dim} window={window} pos={positions:?} span {span}: error {err}"
            );
            for buf in [qb, pb, out] {
                b.free(buf);
            }
        }
        b.free(kb);
        b.free(vb);
    }
}
test_device!(
    attention_decode_long_caches_gqa_and_windows,
    attention_decode_long_caches_gqa_and_windows_cpu: cpu_backends,
    attention_decode_long_caches_gqa_and_windows_vulkan: decode_vulkan_backends
);

#[test]
fn attention_window_and_causality_change_the_result() {
    // Guards the reference itself: positions beyond `p` and outside the window
    // must not contribute, so poisoning them changes nothing.
    let p = AttentionParams {
        rows: 1,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 8,
        capacity: 10,
        span: 10,
        scale: 0.3,
        window: 3,
        kv_dtype: DType::F32,
        pages: None,
        next: None,
        sinks: None,
    };
    let q = rand_f32(16, 1);
    let k = rand_f32(80, 2);
    let v = rand_f32(80, 3);
    let base = reference::attention(&q, &k, &v, &[5], &p).unwrap();
    let mut v2 = v.clone();
    for j in (0..3).chain(6..10) {
        v2[j * 8..(j + 1) * 8].fill(100.0);
    }
    assert_eq!(reference::attention(&q, &k, &v2, &[5], &p).unwrap(), base);
    v2[3 * 8] = 100.0;
    assert_ne!(reference::attention(&q, &k, &v2, &[5], &p).unwrap(), base);
}

fn attention_f16_cache((name, mut b): Named) {
    // Attention over f16 caches on every path: decode (attention_decode.comp;
    // capacity 8192, short and long spans, window, GQA, head_dim 64 and 128),
    // prefill rows (attention_prefill.comp) and the fallback
    // (attention.comp, head_dim 6). Tolerances: against the reference on the
    // f16-rounded caches, as f32 (4e-5: the kernels convert exactly);
    // against the reference on the unrounded f32 caches, 4e-3 absolute
    // (values in [-1, 1], keys up to 4: rounding K and V to f16 costs
    // ~3 significant digits; measured up to 8.4e-4 here). The CPU backend
    // refuses f16 caches.
    // (n_heads, n_kv_heads, head_dim, capacity, positions, window)
    type Case = (usize, usize, usize, usize, &'static [u32], usize);
    let cases: [Case; 7] = [
        (9, 3, 64, 8192, &[100], 0),
        (9, 3, 64, 8192, &[8191], 0),
        (32, 8, 128, 8192, &[4000], 0),
        (32, 8, 128, 8192, &[8191, 5], 512),
        (6, 2, 64, 40, &[10, 11, 12, 13, 14, 15, 39], 0),
        (4, 1, 128, 40, &[30, 31, 32, 33, 34, 35, 36], 8),
        (2, 1, 6, 40, &[39], 0),
    ];
    for (n_heads, n_kv_heads, head_dim, capacity, positions, window) in cases {
        let p = AttentionParams {
            rows: positions.len(),
            n_heads,
            n_kv_heads,
            head_dim,
            capacity,
            span: capacity,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
            kv_dtype: DType::F16,
            pages: None,
            next: None,
            sinks: None,
        };
        let kv = capacity * n_kv_heads * head_dim;
        let k: Vec<f32> = rand_f32(kv, 81).iter().map(|v| v * 4.0).collect();
        let v = rand_f32(kv, 82);
        let q: Vec<f32> = rand_f32(p.rows * n_heads * head_dim, 83)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let (kb, k16) = upload_f16(b.as_mut(), &k);
        let (vb, v16) = upload_f16(b.as_mut(), &v);
        let qb = upload_f32(b.as_mut(), &q);
        let pb = upload_u32(b.as_mut(), positions);
        let out = b.alloc(q.len() * 4).unwrap();
        b.begin_pass().unwrap();
        let r = b.attention(&qb, &kb, &vb, &pb, &out, &p);
        b.end_pass().unwrap();
        let what = format!("{name} {n_heads}/{n_kv_heads} hd={head_dim} pos={positions:?}");
        for buf in [kb, vb, qb, pb] {
            b.free(buf);
        }
        if f16_unsupported(r, &name) {
            b.free(out);
            continue;
        }
        let got = download_f32(b.as_mut(), &out, q.len());
        b.free(out);
        let p32 = AttentionParams {
            kv_dtype: DType::F32,
            ..p
        };
        let want = reference::attention(&q, &k16, &v16, positions, &p32).unwrap();
        let err = max_abs_diff(&got, &want);
        assert!(err <= 4e-5, "{what}: error {err} vs the rounded caches");
        let exact = reference::attention(&q, &k, &v, positions, &p32).unwrap();
        let err = max_abs_diff(&got, &exact);
        assert!(err <= 4e-3, "{what}: error {err} vs f32 caches");
    }
}
test_device!(
    attention_f16_cache,
    attention_f16_cache_cpu: cpu_backends,
    attention_f16_cache_vulkan: decode_vulkan_backends
);

fn rope_store_attention_appends_and_attends((name, mut b): Named) {
    // The decode step's attention front as one op (Vulkan: attention_decode.comp
    // ropes q as it loads it and appends the row's k and v in the workgroups
    // holding its position) against rope_store then attention on the same
    // backend and against the reference. The cache rows equal rope_store's
    // (v exactly; k within 1e-6, or one f16 ulp for f16 caches: the same
    // rotation code in another shader) and every other row is untouched; k
    // is within 1e-5 of the reference plus one f32 ulp of the angle p·θ
    // (|k| <= 4·√2 after rotation; a device may keep p·θ unrounded in a fused
    // multiply-add: up to 5.5e-3 at position 8191, measured 7.3e-4 on an
    // H100), plus one f16 ulp for f16 caches; q as rope_store rotates it is
    // within the same bound of the reference; and the attention equals the
    // reference's over the caches the op left and that q (4e-5 absolute, as
    // attention's tests).
    // Cases: GQA groups of 3, 4 and 16 (several head tiles), head_dim 64, 80,
    // 128, 256 and 6 (the fallback kernels), partial and no rotation, both
    // pair layouts, a window, positions at split boundaries and deep in an
    // 8192-key cache, f32 and f16 caches (which the CPU refuses); and
    // gpt-oss's YaRN rope with attention sinks (the rotation tolerances
    // times its mscale; the attention against the reference with sinks,
    // which must differ from the one without).
    // (n_heads, n_kv_heads, head_dim, rot_dim, style, capacity, position,
    // window, cache, YaRN and sinks)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        RopeStyle,
        usize,
        u32,
        usize,
        DType,
        bool,
    );
    use DType::{F16, F32};
    use RopeStyle::{Interleaved, Neox};
    let cases: [Case; 15] = [
        (9, 3, 64, 64, Neox, 8192, 8191, 0, F16, false),
        (9, 3, 64, 64, Neox, 8192, 600, 0, F16, false),
        (9, 3, 64, 64, Neox, 8192, 0, 0, F16, false),
        (9, 3, 64, 64, Interleaved, 8192, 32, 0, F32, false),
        (32, 8, 128, 128, Interleaved, 8192, 4000, 0, F32, false),
        (32, 8, 128, 128, Neox, 8192, 2047, 0, F16, false),
        (16, 1, 64, 32, Interleaved, 8192, 100, 0, F32, false),
        (4, 4, 80, 0, Neox, 8192, 31, 0, F32, false),
        (8, 2, 256, 256, Neox, 8192, 5000, 512, F16, false),
        (2, 1, 6, 6, Neox, 40, 39, 0, F32, false),
        // gpt-oss: YaRN and attention sinks, its heads and sliding window.
        (64, 8, 64, 64, Neox, 8192, 8191, 128, F16, true),
        (64, 8, 64, 64, Neox, 8192, 600, 0, F32, true),
        (9, 3, 64, 64, Neox, 8192, 0, 0, F32, true),
        (32, 8, 128, 128, Interleaved, 8192, 4000, 0, F16, true),
        (2, 1, 6, 6, Neox, 40, 39, 0, F32, true),
    ];
    for (n_heads, n_kv, head_dim, rot_dim, style, capacity, pos, window, dtype, oss) in cases {
        let what = format!(
            "{name} {n_heads}/{n_kv} hd={head_dim} rot={rot_dim} {style:?} pos={pos} {dtype:?} \
             yarn and sinks {oss}"
        );
        let kvd = n_kv * head_dim;
        let rope = RopeParams {
            rows: 1,
            n_heads,
            head_dim,
            rot_dim,
            base: 10000.0,
            style,
            scaling: oss.then(|| RopeScaling::yarn(32.0, 4096, 32.0, 1.0, rot_dim, 10000.0, false)),
        };
        let mscale = rope.scaling.map_or(1.0, |s| s.mscale);
        let sinks = oss.then(|| common::attention_sinks(n_heads, 96));
        let sb = sinks.as_ref().map(|s| upload_f32(b.as_mut(), s));
        let p = AttentionParams {
            rows: 1,
            n_heads,
            n_kv_heads: n_kv,
            head_dim,
            capacity,
            span: capacity,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
            kv_dtype: dtype,
            pages: None,
            next: None,
            sinks: sb,
        };
        let q: Vec<f32> = rand_f32(n_heads * head_dim, 91)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let k: Vec<f32> = rand_f32(kvd, 92).iter().map(|v| v * 4.0).collect();
        let v = rand_f32(kvd, 93);
        let k_old: Vec<f32> = rand_f32(capacity * kvd, 94)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let v_old = rand_f32(capacity * kvd, 95);
        let f16 = dtype == DType::F16;
        let upload_cache = |b: &mut dyn ComputeBackend, data: &[f32]| {
            if f16 {
                upload_f16(b, data)
            } else {
                (upload_f32(b, data), data.to_vec())
            }
        };
        let download_cache = |b: &mut dyn ComputeBackend, buf: &vkllm::backend::Buffer| {
            if f16 {
                download_f16(b, buf, capacity * kvd)
            } else {
                download_f32(b, buf, capacity * kvd)
            }
        };
        // The fused op, then rope_store alone on copies of the caches.
        let (kcb, k_old) = upload_cache(b.as_mut(), &k_old);
        let (vcb, v_old) = upload_cache(b.as_mut(), &v_old);
        let (kcb2, _) = upload_cache(b.as_mut(), &k_old);
        let (vcb2, _) = upload_cache(b.as_mut(), &v_old);
        let [qb, qb2, kb, vb] = [&q, &q, &k, &v].map(|d| upload_f32(b.as_mut(), d));
        let pb = upload_u32(b.as_mut(), &[pos]);
        let out = b.alloc(q.len() * 4).unwrap();
        b.begin_pass().unwrap();
        let r = b.rope_store_attention(&qb, &kb, &vb, &pb, &kcb, &vcb, &rope, &p, &out);
        b.end_pass().unwrap();
        let mut bufs = vec![kcb, vcb, kcb2, vcb2, qb, qb2, kb, vb, pb, out];
        bufs.extend(sb);
        if f16_unsupported(r, &name) {
            bufs.into_iter().for_each(|buf| b.free(buf));
            continue;
        }
        let got = download_f32(b.as_mut(), &out, q.len());
        pass(b.as_mut(), |b| {
            b.rope_store(&qb2, &kb, &vb, &pb, &kcb2, &vcb2, &rope, n_kv, dtype, None)
                .unwrap()
        });
        let [kc, vc, kc2, vc2] = [kcb, vcb, kcb2, vcb2].map(|buf| download_cache(b.as_mut(), &buf));
        // rope_store rotated q in place: the device's own rotation.
        let q_dev = download_f32(b.as_mut(), &qb2, q.len());
        bufs.into_iter().for_each(|buf| b.free(buf));
        let row = pos as usize * kvd..(pos as usize + 1) * kvd;
        if f16 {
            assert_f16_close(
                &kc[row.clone()],
                &kc2[row.clone()],
                &format!("{what}: k row vs rope_store"),
            );
        } else {
            let err = max_abs_diff(&kc[row.clone()], &kc2[row.clone()]);
            assert!(err <= 1e-6, "{what}: k row error {err} vs rope_store");
        }
        assert_eq!(vc, vc2, "{what}: v cache vs rope_store");
        let mut k_roped = k.clone();
        let kp = RopeParams {
            n_heads: n_kv,
            ..rope
        };
        reference::rope(&mut k_roped, &[pos], &kp).unwrap();
        let angle = 4.0 * std::f32::consts::SQRT_2 * pos as f32 * f32::EPSILON;
        let f16_ulp = |w: f32| {
            if f16 {
                w.abs().max(1.0 / 16384.0) / 1024.0
            } else {
                0.0
            }
        };
        for (i, (g, w)) in kc[row.clone()].iter().zip(&k_roped).enumerate() {
            let tol = (1e-5 + angle) * mscale + f16_ulp(*w);
            assert!(
                (g - w).abs() <= tol,
                "{what}: k row[{i}] {g} vs {w} (tolerance {tol})"
            );
        }
        let v_row = if f16 { f16_of(&v).1 } else { v.clone() };
        assert_eq!(vc[row.clone()], v_row[..], "{what}: v row");
        for (cache, old, which) in [(&kc, &k_old, "k"), (&vc, &v_old, "v")] {
            let outside = |c: &[f32]| [c[..row.start].to_vec(), c[row.end..].to_vec()].concat();
            assert!(
                outside(cache) == outside(old),
                "{what}: {which} rows past the position changed"
            );
        }
        let mut q_roped = q.clone();
        reference::rope(&mut q_roped, &[pos], &rope).unwrap();
        for (i, (g, w)) in q_dev.iter().zip(&q_roped).enumerate() {
            let tol = (1e-5 + angle) * mscale;
            assert!(
                (g - w).abs() <= tol,
                "{what}: q[{i}] {g} vs {w} (tolerance {tol})"
            );
        }
        let p32 = AttentionParams {
            kv_dtype: DType::F32,
            ..p
        };
        let want =
            reference::attention_with_sinks(&q_dev, &kc, &vc, &[pos], &p32, sinks.as_deref())
                .unwrap();
        if sinks.is_some() {
            let plain = AttentionParams { sinks: None, ..p32 };
            let without = reference::attention(&q_dev, &kc, &vc, &[pos], &plain).unwrap();
            let moved = max_abs_diff(&want, &without);
            assert!(moved > 0.05, "{what}: the sinks move it by {moved} only");
        }
        let err = max_abs_diff(&got, &want);
        let tol = 4e-5;
        assert!(
            err <= tol,
            "{what}: attention error {err} (tolerance {tol})"
        );
    }
}
test_device!(
    rope_store_attention_appends_and_attends,
    rope_store_attention_appends_and_attends_cpu: cpu_backends,
    rope_store_attention_appends_and_attends_vulkan: decode_vulkan_backends
);

/// A KV cache of `dtype` (F32, or F16 on backends that hold it) with the
/// values it holds (f16: rounded).
fn upload_cache(b: &mut dyn ComputeBackend, data: &[f32], dtype: DType) -> (Buffer, Vec<f32>) {
    match dtype {
        DType::F16 => upload_f16(b, data),
        _ => (upload_f32(b, data), data.to_vec()),
    }
}

/// Attention of `p` with attention sinks on `b` (the caches `kb`, `vb`
/// hold `k`, `v` as `p.kv_dtype`) against the reference with sinks, within
/// 4e-5 absolute (values in [-1, 1]: outputs are weighted sums with
/// weights summing to at most 1; as attention's tests, on the f16-rounded
/// caches for f16). The reference with sinks must differ from the one
/// without by more than 0.05, so a backend ignoring them fails. False where
/// `b` refuses the cache's dtype.
#[allow(clippy::too_many_arguments)]
fn check_sinks(
    b: &mut dyn ComputeBackend,
    name: &str,
    what: &str,
    p: &AttentionParams,
    positions: &[u32],
    q: &[f32],
    (kb, k): (&Buffer, &[f32]),
    (vb, v): (&Buffer, &[f32]),
) -> bool {
    let sinks = common::attention_sinks(p.n_heads, 41 + p.head_dim as u64);
    let sb = upload_f32(b, &sinks);
    let qb = upload_f32(b, q);
    let pb = upload_u32(b, positions);
    let out = b.alloc(q.len() * 4).unwrap();
    let ps = AttentionParams {
        sinks: Some(sb),
        ..*p
    };
    b.begin_pass().unwrap();
    let r = b.attention(&qb, kb, vb, &pb, &out, &ps);
    b.end_pass().unwrap();
    let refused = f16_unsupported(r, name);
    let got = download_f32(b, &out, q.len());
    for buf in [sb, qb, pb, out] {
        b.free(buf);
    }
    if refused {
        return false;
    }
    let p32 = AttentionParams {
        kv_dtype: DType::F32,
        ..*p
    };
    let want = reference::attention_with_sinks(q, k, v, positions, &p32, Some(&sinks)).unwrap();
    let plain = reference::attention(q, k, v, positions, &p32).unwrap();
    let moved = max_abs_diff(&want, &plain);
    assert!(
        moved > 0.05,
        "{what}: the sinks move the result by {moved} only"
    );
    let err = max_abs_diff(&got, &want);
    assert!(err <= 4e-5, "{name} {what}: error {err} with sinks");
    true
}

fn attention_sinks_decode_splits_and_windows((name, mut b): Named) {
    // Attention sinks on decode rows (Vulkan: attention_decode.comp, with a
    // GPU's plans its key splits merged by attention_combine.comp or by
    // the last split, MERGE, or unsplit spans; a CPU device's whole spans)
    // and the fallback (head_dim 6 and 320: attention.comp): caches of
    // 8192 at short and long spans, windows, up to 4 rows, GQA groups of 1
    // to 8 (gpt-oss's 64 heads over 8), f32 and f16 caches (which the CPU
    // refuses). Each case planned for the whole cache and for its own span.
    // Tolerance and sinks: check_sinks.
    let capacity = 8192;
    for (n_heads, n_kv_heads, head_dim) in [
        (9, 3, 64),
        (64, 8, 64),
        (32, 8, 128),
        (4, 4, 80),
        (2, 1, 6),
        (4, 2, 320),
    ] {
        let kv = capacity * n_kv_heads * head_dim;
        let k: Vec<f32> = rand_f32(kv, 131).iter().map(|v| v * 4.0).collect();
        let v = rand_f32(kv, 132);
        for dtype in [DType::F32, DType::F16] {
            let (kb, k) = upload_cache(b.as_mut(), &k, dtype);
            let (vb, v) = upload_cache(b.as_mut(), &v, dtype);
            let cases: [(&[u32], usize); 6] = [
                (&[0], 0),
                (&[100], 0),
                (&[8191], 0),
                (&[8191], 128),
                (&[7, 2000, 8191], 1000),
                (&[0, 1, 33, 64], 16),
            ];
            for (positions, window) in cases {
                let end = *positions.iter().max().unwrap() as usize + 1;
                for span in [capacity, end] {
                    let p = AttentionParams {
                        rows: positions.len(),
                        n_heads,
                        n_kv_heads,
                        head_dim,
                        capacity,
                        span,
                        scale: 1.0 / (head_dim as f32).sqrt(),
                        window,
                        kv_dtype: dtype,
                        pages: None,
                        next: None,
                        sinks: None,
                    };
                    let q: Vec<f32> = rand_f32(p.rows * n_heads * head_dim, 133)
                        .iter()
                        .map(|v| v * 4.0)
                        .collect();
                    let what = format!(
                        "{n_heads}/{n_kv_heads} hd={head_dim} {dtype:?} window={window} \
                         pos={positions:?} span {span}"
                    );
                    let caches = ((&kb, &k[..]), (&vb, &v[..]));
                    if !check_sinks(
                        b.as_mut(),
                        &name,
                        &what,
                        &p,
                        positions,
                        &q,
                        caches.0,
                        caches.1,
                    ) {
                        break;
                    }
                }
            }
            b.free(kb);
            b.free(vb);
        }
    }
}
test_device!(
    attention_sinks_decode_splits_and_windows,
    attention_sinks_decode_splits_and_windows_cpu: cpu_backends,
    attention_sinks_decode_splits_and_windows_vulkan: decode_vulkan_backends
);

fn attention_sinks_prefill_rows((name, mut b): Named) {
    // Attention sinks on prompt rows (Vulkan: the flash tiles,
    // attention_prefill.comp, with a GPU's plans; the decode kernel for
    // every row on a CPU device; attention.comp for head_dim 6): 7, 40 and
    // 130 consecutive rows at depths 0 to 60, GQA, windows shorter than the
    // rows, f32 and f16 caches (which the CPU refuses). Tolerance and
    // sinks: check_sinks.
    // (rows, first position, n_heads, n_kv_heads, head_dim, window)
    let cases = [
        (7, 10, 6, 2, 64, 0),
        (40, 60, 8, 2, 128, 37),
        (130, 0, 9, 3, 64, 0),
        (130, 20, 4, 1, 128, 40),
        (40, 5, 2, 1, 6, 0),
    ];
    let capacity = 200;
    for (rows, first, n_heads, n_kv_heads, head_dim, window) in cases {
        let kv = capacity * n_kv_heads * head_dim;
        let k: Vec<f32> = rand_f32(kv, 141).iter().map(|v| v * 4.0).collect();
        let v = rand_f32(kv, 142);
        let q: Vec<f32> = rand_f32(rows * n_heads * head_dim, 143)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let positions: Vec<u32> = (first..first + rows as u32).collect();
        for dtype in [DType::F32, DType::F16] {
            let p = AttentionParams {
                rows,
                n_heads,
                n_kv_heads,
                head_dim,
                capacity,
                span: capacity,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window,
                kv_dtype: dtype,
                pages: None,
                next: None,
                sinks: None,
            };
            let (kb, k) = upload_cache(b.as_mut(), &k, dtype);
            let (vb, v) = upload_cache(b.as_mut(), &v, dtype);
            let what = format!(
                "rows {rows} from {first} {n_heads}/{n_kv_heads} hd={head_dim} {dtype:?} \
                 window={window}"
            );
            check_sinks(
                b.as_mut(),
                &name,
                &what,
                &p,
                &positions,
                &q,
                (&kb, &k),
                (&vb, &v),
            );
            b.free(kb);
            b.free(vb);
        }
    }
}
test_device!(
    attention_sinks_prefill_rows,
    attention_sinks_prefill_rows_cpu: cpu_backends,
    attention_sinks_prefill_rows_vulkan: decode_vulkan_backends
);
