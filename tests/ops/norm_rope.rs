//! rms_norm, layer_norm, rope, and the KV-cache stores (rope_store,
//! store_rows) into f32 and f16 caches.

use crate::common::{
    assert_close, assert_ulps, download_f32, max_abs_diff, pass, rand_f32, upload_f32, upload_u32,
};
use crate::{
    assert_f16_close, cpu_backends, download_f16, f16_of, f16_unsupported, test_device, upload_f16,
    vulkan_backends, Named,
};
use vkllm::backend::{RopeParams, RopeScaling, RopeStyle};
use vkllm::{reference, DType};

/// Largest |value|, for tolerances relative to a tensor's scale.
fn amax(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |a, x| a.max(x.abs()))
}

fn rms_norm_and_layer_norm_match_reference((name, mut b): Named) {
    // Both in one pass, reading one input. rms_norm: within 1e-5 of each
    // value (f32 products after an f64-or-f32 mean; relative rounding ~1e-7
    // per step). layer_norm: the centred values cancel down to |x - mean|,
    // so within 1e-5 of the output's scale (its largest value, at most 1).
    // Up to 64 rows take wide workgroups on a GPU (vk/ops/rms_norm.rs).
    for (rows, dim) in [
        (1, 576),
        (3, 64),
        (17, 100),
        (2, 1536),
        (5, 1000),
        (3, 7),
        (70, 256),
    ] {
        let x: Vec<f32> = rand_f32(rows * dim, 1)
            .iter()
            .map(|v| v * 3.0 + 0.5)
            .collect();
        let w = rand_f32(dim, 2);
        let bias = rand_f32(dim, 3);
        let (xb, wb, bb) = (
            upload_f32(b.as_mut(), &x),
            upload_f32(b.as_mut(), &w),
            upload_f32(b.as_mut(), &bias),
        );
        let (o1, o2) = (
            b.alloc(rows * dim * 4).unwrap(),
            b.alloc(rows * dim * 4).unwrap(),
        );
        pass(b.as_mut(), |b| {
            b.rms_norm(&xb, &wb, &o1, rows, dim, 1e-5).unwrap();
            b.layer_norm(&xb, &wb, &bb, &o2, rows, dim, 1e-5).unwrap();
        });
        let want = reference::rms_norm(&x, &w, dim, 1e-5).unwrap();
        assert_ulps(
            &format!("{name} rms_norm {rows}x{dim}"),
            &download_f32(b.as_mut(), &o1, rows * dim),
            &want,
            1e-5,
        );
        let want = reference::layer_norm(&x, &w, &bias, dim, 1e-5).unwrap();
        let got = download_f32(b.as_mut(), &o2, rows * dim);
        let scale = vec![amax(&want).min(1.0); rows * dim];
        assert_close(
            &format!("{name} layer_norm {rows}x{dim}"),
            &got,
            &want,
            &scale,
            1e-5,
        );
        for buf in [xb, wb, bb, o1, o2] {
            b.free(buf);
        }
    }
}
test_device!(
    rms_norm_and_layer_norm_match_reference,
    rms_norm_and_layer_norm_match_reference_cpu,
    rms_norm_and_layer_norm_match_reference_vulkan
);

fn rope_both_styles_partial_and_positions((name, mut b): Named) {
    // Tolerance: 1e-5 of the largest input (|x| <= 1). Both sides use the same
    // f32 angle (see reference::rope_angle); the rest is one f32 rotation.
    // Position 0 first (the identity), then near and far ones (up to 1000 rad).
    let positions = [0u32, 5, 1000, 33, 1, 17, 500];
    for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
        for (head_dim, rot_dim) in [(64, 64), (64, 32), (32, 32), (80, 24)] {
            let p = RopeParams {
                rows: positions.len(),
                n_heads: 3,
                head_dim,
                rot_dim,
                base: 10000.0,
                style,
                scaling: None,
            };
            let x = rand_f32(p.rows * p.n_heads * head_dim, 9);
            let mut want = x.clone();
            reference::rope(&mut want, &positions, &p).unwrap();
            let xb = upload_f32(b.as_mut(), &x);
            let pb = upload_u32(b.as_mut(), &positions);
            pass(b.as_mut(), |b| b.rope(&xb, &pb, &p).unwrap());
            let got = download_f32(b.as_mut(), &xb, x.len());
            let err = max_abs_diff(&got, &want);
            assert!(
                err <= 1e-5,
                "{name} rope {style:?} hd={head_dim} rot={rot_dim}: error {err}"
            );
            // Partial rotary leaves the tail of every head untouched, bit for bit.
            for (h, head) in got.chunks_exact(head_dim).enumerate() {
                assert_eq!(
                    &head[rot_dim..],
                    &x[h * head_dim + rot_dim..(h + 1) * head_dim],
                    "{name} tail"
                );
            }
            // Position 0 is the identity.
            assert_eq!(
                &got[..p.n_heads * head_dim],
                &x[..p.n_heads * head_dim],
                "{name} pos 0"
            );
        }
    }
}
test_device!(
    rope_both_styles_partial_and_positions,
    rope_both_styles_partial_and_positions_cpu,
    rope_both_styles_partial_and_positions_vulkan
);

fn store_rows_and_rope_store_write_the_cache_at_positions((name, mut b): Named) {
    // Tolerance as rope (1e-5); stores are exact.
    let (rows, n_heads, n_kv, head_dim, cap) = (3, 6, 2, 64, 12);
    let kvd = n_kv * head_dim;
    let positions = [7u32, 2, 40]; // the last is past the cache: stored nowhere
    for (style, rot_dim) in [
        (RopeStyle::Neox, 64),
        (RopeStyle::Interleaved, 32),
        (RopeStyle::Neox, 0),
    ] {
        let p = RopeParams {
            rows,
            n_heads,
            head_dim,
            rot_dim,
            base: 10000.0,
            style,
            scaling: None,
        };
        let q = rand_f32(rows * n_heads * head_dim, 61);
        let k = rand_f32(rows * kvd, 62);
        let v = rand_f32(rows * kvd, 63);
        let old = rand_f32(cap * kvd, 64);
        let (mut q_want, mut k_roped) = (q.clone(), k.clone());
        reference::rope(&mut q_want, &positions, &p).unwrap();
        let kp = RopeParams { n_heads: n_kv, ..p };
        reference::rope(&mut k_roped, &positions, &kp).unwrap();
        let (mut kc_want, mut vc_want) = (old.clone(), old.clone());
        reference::store_rows(&k_roped, &mut kc_want, &positions, kvd);
        reference::store_rows(&v, &mut vc_want, &positions, kvd);
        let bufs: Vec<_> = [&q, &k, &v, &old, &old]
            .iter()
            .map(|d| upload_f32(b.as_mut(), d))
            .collect();
        let pb = upload_u32(b.as_mut(), &positions);
        let (qb, kb, vb, kcb, vcb) = (&bufs[0], &bufs[1], &bufs[2], &bufs[3], &bufs[4]);
        pass(b.as_mut(), |b| {
            b.rope_store(qb, kb, vb, &pb, kcb, vcb, &p, n_kv, DType::F32, None)
                .unwrap()
        });
        let what = format!("{name} {style:?} rot={rot_dim}");
        let err = max_abs_diff(&download_f32(b.as_mut(), qb, q.len()), &q_want);
        assert!(err <= 1e-5, "{what}: q error {err}");
        let err = max_abs_diff(&download_f32(b.as_mut(), kcb, old.len()), &kc_want);
        assert!(err <= 1e-5, "{what}: k cache error {err}");
        assert_eq!(
            download_f32(b.as_mut(), vcb, old.len()),
            vc_want,
            "{what}: v cache"
        );
        // store_rows alone: exact, the same rows.
        let cache = upload_f32(b.as_mut(), &old);
        pass(b.as_mut(), |b| {
            b.store_rows(vb, &cache, &pb, rows, kvd, DType::F32, None)
                .unwrap()
        });
        assert_eq!(
            download_f32(b.as_mut(), &cache, old.len()),
            vc_want,
            "{what}: store_rows"
        );
    }
}
test_device!(
    store_rows_and_rope_store_write_the_cache_at_positions,
    store_rows_and_rope_store_write_the_cache_at_positions_cpu,
    store_rows_and_rope_store_write_the_cache_at_positions_vulkan
);

fn kv_cache_f16_rope_store_and_store_rows((name, mut b): Named) {
    // f16 caches (Vulkan's default): k roped in f32 then rounded, v rounded,
    // rows past the cache stored nowhere, other rows untouched. Tolerance:
    // one f16 ulp of the reference rounded to f16. The CPU backend refuses
    // f16 caches (Error::Unsupported).
    let (rows, n_heads, n_kv, head_dim, cap) = (3, 6, 2, 64, 12);
    let kvd = n_kv * head_dim;
    let positions = [7u32, 2, 40];
    for (style, rot_dim) in [(RopeStyle::Neox, 64), (RopeStyle::Interleaved, 32)] {
        let p = RopeParams {
            rows,
            n_heads,
            head_dim,
            rot_dim,
            base: 10000.0,
            style,
            scaling: None,
        };
        let q = rand_f32(rows * n_heads * head_dim, 71);
        let k = rand_f32(rows * kvd, 72);
        let v = rand_f32(rows * kvd, 73);
        let old = rand_f32(cap * kvd, 74);
        let mut k_roped = k.clone();
        let kp = RopeParams { n_heads: n_kv, ..p };
        reference::rope(&mut k_roped, &positions, &kp).unwrap();
        let (_, old16) = f16_of(&old);
        let (mut kc_want, mut vc_want) = (old16.clone(), old16.clone());
        reference::store_rows(&f16_of(&k_roped).1, &mut kc_want, &positions, kvd);
        reference::store_rows(&f16_of(&v).1, &mut vc_want, &positions, kvd);
        let (qb, kb, vb) = (
            upload_f32(b.as_mut(), &q),
            upload_f32(b.as_mut(), &k),
            upload_f32(b.as_mut(), &v),
        );
        let (kcb, _) = upload_f16(b.as_mut(), &old);
        let (vcb, _) = upload_f16(b.as_mut(), &old);
        let pb = upload_u32(b.as_mut(), &positions);
        b.begin_pass().unwrap();
        let r = b.rope_store(&qb, &kb, &vb, &pb, &kcb, &vcb, &p, n_kv, DType::F16, None);
        b.end_pass().unwrap();
        if f16_unsupported(r, &name) {
            continue;
        }
        let what = format!("{name} {style:?} rot={rot_dim}");
        let kc = download_f16(b.as_mut(), &kcb, old.len());
        assert_f16_close(&kc, &kc_want, &format!("{what}: k cache"));
        let vc = download_f16(b.as_mut(), &vcb, old.len());
        assert_f16_close(&vc, &vc_want, &format!("{what}: v cache"));
        // store_rows alone into an f16 cache.
        let (cache, _) = upload_f16(b.as_mut(), &old);
        pass(b.as_mut(), |b| {
            b.store_rows(&vb, &cache, &pb, rows, kvd, DType::F16, None)
                .unwrap()
        });
        let got = download_f16(b.as_mut(), &cache, old.len());
        assert_f16_close(&got, &vc_want, &format!("{what}: store_rows"));
    }
    // An odd row length cannot be stored as f16 words.
    let (src, dst, pb) = (
        b.alloc(12).unwrap(),
        b.alloc(12).unwrap(),
        b.alloc(4).unwrap(),
    );
    b.begin_pass().unwrap();
    let r = b.store_rows(&src, &dst, &pb, 1, 3, DType::F16, None);
    b.end_pass().unwrap();
    assert!(r.is_err(), "{name}: odd f16 row accepted");
}
test_device!(
    kv_cache_f16_rope_store_and_store_rows,
    kv_cache_f16_rope_store_and_store_rows_cpu,
    kv_cache_f16_rope_store_and_store_rows_vulkan
);

/// YaRN cases: (head_dim, rot_dim, style, base, scaling). gpt-oss's config
/// (as its Hugging Face config says, `truncate: false`), one truncated as
/// llama.cpp does with partial rotary, and hand-made ramps with mscale 1
/// (so the frequency mix alone is seen), one of them a step (low == high).
fn yarn_cases() -> [(usize, usize, RopeStyle, f32, RopeScaling); 4] {
    let ramp = |low, high| RopeScaling {
        freq_scale: 0.25,
        low,
        high,
        mscale: 1.0,
    };
    [
        (
            64,
            64,
            RopeStyle::Neox,
            150000.0,
            RopeScaling::yarn(32.0, 4096, 32.0, 1.0, 64, 150000.0, false),
        ),
        (
            80,
            32,
            RopeStyle::Interleaved,
            10000.0,
            RopeScaling::yarn(8.0, 2048, 32.0, 1.0, 32, 10000.0, true),
        ),
        (64, 64, RopeStyle::Interleaved, 10000.0, ramp(3.0, 9.0)),
        (64, 48, RopeStyle::Neox, 10000.0, ramp(5.0, 5.0)),
    ]
}

/// Positions up to gpt-oss's context (131072).
const YARN_POSITIONS: [u32; 7] = [0, 5, 1000, 4095, 4096, 70000, 131071];

/// How far a rotated value (|x| <= 1 before) may be from the reference at
/// `pos`: 1e-5 as unscaled rope, plus the device's reduction of angles up
/// to `pos` radians to [-pi, pi] (glsl/rope.glsl: ~4e-11 of the angle), all
/// times mscale.
fn yarn_tolerance(pos: u32, mscale: f32) -> f32 {
    (1e-5 + 6e-11 * pos as f32) * mscale.max(1.0)
}

/// `got` within [`yarn_tolerance`] of `want`, rows of `row_len` at `positions`.
fn assert_rope_close(what: &str, got: &[f32], want: &[f32], row_len: usize, mscale: f32) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = yarn_tolerance(YARN_POSITIONS[i / row_len], mscale);
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: {g} vs {w} (tolerance {tol})"
        );
    }
}

fn rope_yarn_scaling((name, mut b): Named) {
    // YaRN through rope and rope_store (f32 and f16 caches, which the CPU
    // refuses), in one pass with the same shapes unscaled, so a table of
    // one is never taken for the other's. Tolerances: yarn_tolerance; the
    // f16 cache within one f16 ulp of the reference rounded to f16 beyond
    // that. Each case's result is checked to differ from the unscaled
    // rotation, so a backend ignoring the scaling fails.
    let positions = YARN_POSITIONS;
    let (rows, n_heads, n_kv) = (positions.len(), 3, 1);
    for (head_dim, rot_dim, style, base, scaling) in yarn_cases() {
        let p = RopeParams {
            rows,
            n_heads,
            head_dim,
            rot_dim,
            base,
            style,
            scaling: Some(scaling),
        };
        let plain = RopeParams { scaling: None, ..p };
        let kp = RopeParams { n_heads: n_kv, ..p };
        let what = format!("{name} {style:?} hd={head_dim} rot={rot_dim} {scaling:?}");
        let row_len = n_heads * head_dim;
        let kvd = n_kv * head_dim;
        let x = rand_f32(rows * row_len, 101);
        let k = rand_f32(rows * kvd, 102);
        let v = rand_f32(rows * kvd, 103);
        let (mut want, mut want_plain, mut k_want) = (x.clone(), x.clone(), k.clone());
        reference::rope(&mut want, &positions, &p).unwrap();
        reference::rope(&mut want_plain, &positions, &plain).unwrap();
        reference::rope(&mut k_want, &positions, &kp).unwrap();
        let moved = max_abs_diff(&want, &want_plain);
        assert!(
            moved > 0.1,
            "{what}: scaling changes the reference by {moved} only"
        );
        let cap = 131072;
        let [xb, xb_plain, qb, kb, vb] = [&x, &x, &x, &k, &v].map(|d| upload_f32(b.as_mut(), d));
        let pb = upload_u32(b.as_mut(), &positions);
        let [kc, vc] = [0, 1].map(|_| b.alloc(cap * kvd * 4).unwrap());
        pass(b.as_mut(), |b| {
            b.rope(&xb, &pb, &p).unwrap();
            b.rope(&xb_plain, &pb, &plain).unwrap();
            b.rope_store(&qb, &kb, &vb, &pb, &kc, &vc, &p, n_kv, DType::F32, None)
                .unwrap();
        });
        let got = download_f32(b.as_mut(), &xb, x.len());
        assert_rope_close(
            &format!("{what}: rope"),
            &got,
            &want,
            row_len,
            scaling.mscale,
        );
        let got = download_f32(b.as_mut(), &xb_plain, x.len());
        assert_rope_close(
            &format!("{what}: unscaled"),
            &got,
            &want_plain,
            row_len,
            1.0,
        );
        let got = download_f32(b.as_mut(), &qb, x.len());
        assert_rope_close(
            &format!("{what}: rope_store q"),
            &got,
            &want,
            row_len,
            scaling.mscale,
        );
        let mut kc_got = vec![0f32; rows * kvd];
        for (r, &pos) in positions.iter().enumerate() {
            let mut bytes = vec![0u8; kvd * 4];
            b.download(&kc, pos as usize * kvd * 4, &mut bytes).unwrap();
            kc_got[r * kvd..(r + 1) * kvd].copy_from_slice(bytemuck::cast_slice(&bytes));
        }
        assert_rope_close(
            &format!("{what}: k cache"),
            &kc_got,
            &k_want,
            kvd,
            scaling.mscale,
        );
        // Partial rotary: the tail of every head passes untouched.
        let got = download_f32(b.as_mut(), &xb, x.len());
        for (h, head) in got.chunks_exact(head_dim).enumerate() {
            assert_eq!(
                &head[rot_dim..],
                &x[h * head_dim + rot_dim..(h + 1) * head_dim],
                "{what}: tail"
            );
        }
        for buf in [xb, xb_plain, qb, kc, vc] {
            b.free(buf);
        }
        // An f16 cache: the rows as the reference's, rounded.
        let (kc16, _) = upload_f16(b.as_mut(), &vec![0f32; cap * kvd]);
        let (vc16, _) = upload_f16(b.as_mut(), &vec![0f32; cap * kvd]);
        let qb = upload_f32(b.as_mut(), &x);
        b.begin_pass().unwrap();
        let r = b.rope_store(&qb, &kb, &vb, &pb, &kc16, &vc16, &p, n_kv, DType::F16, None);
        b.end_pass().unwrap();
        if !f16_unsupported(r, &name) {
            let all = download_f16(b.as_mut(), &kc16, cap * kvd);
            for (r, &pos) in positions.iter().enumerate() {
                let got = &all[pos as usize * kvd..(pos as usize + 1) * kvd];
                let want = f16_of(&k_want[r * kvd..(r + 1) * kvd]).1;
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let tol =
                        yarn_tolerance(pos, scaling.mscale) + w.abs().max(1.0 / 16384.0) / 1024.0;
                    assert!(
                        (g - w).abs() <= tol,
                        "{what}: f16 k row {r}[{i}] {g} vs {w} (tolerance {tol})"
                    );
                }
            }
        }
        for buf in [kc16, vc16, qb, kb, vb, pb] {
            b.free(buf);
        }
    }
}
test_device!(
    rope_yarn_scaling,
    rope_yarn_scaling_cpu,
    rope_yarn_scaling_vulkan
);
