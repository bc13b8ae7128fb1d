//! Paged KV caches (`KvPages`) on every op that touches the cache, through
//! scrambled page tables in pages of 16 and 64 positions, f32 and f16
//! caches: store_rows and rope_store write the rows their tables name and
//! nothing else; attention through one table (a prompt chunk) equals the
//! unpaged op over the cache that table maps, on the same backend (bit for
//! bit on Vulkan, the same kernel reading the same keys in the same order;
//! within 1e-5 on the CPU, whose contiguous fast path a scattered table
//! leaves); rows with tables of their own (a decode step of several
//! sequences) equal the reference over each row's own cache; a page past
//! the pool is never followed; short tables are errors. Attention sinks
//! and YaRN rope run through the paged kernels too (pages of 64, and of 4
//! for rows with tables of their own).

use crate::common::{
    attention_sinks, download_f32, gather_pages, max_abs_diff, paged_row, pass, rand_f32,
    scrambled_pages, upload_f32, upload_u32,
};
use crate::{
    cpu_backends, decode_vulkan_backends, download_f16, f16_unsupported, test_device, upload_f16,
    Named,
};
use vkllm::backend::{
    AttentionParams, Buffer, ComputeBackend, KvPages, RopeParams, RopeScaling, RopeStyle,
};
use vkllm::{reference, DType};

/// log2 of the page lengths tested: 16 and 64 positions.
const PAGE_LOG2S: [u32; 2] = [4, 6];

/// A cache buffer of `dtype` holding `data`, and the values it holds (f16:
/// rounded).
fn upload_cache(b: &mut dyn ComputeBackend, data: &[f32], dtype: DType) -> Cache {
    match dtype {
        DType::F16 => upload_f16(b, data),
        _ => (upload_f32(b, data), data.to_vec()),
    }
}

fn download_cache(b: &mut dyn ComputeBackend, buf: &Buffer, n: usize, dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F16 => download_f16(b, buf, n),
        _ => download_f32(b, buf, n),
    }
}

/// A paged result against the unpaged one: bit for bit on Vulkan, within
/// `cpu_tol` on the CPU.
fn assert_as_unpaged(name: &str, what: &str, got: &[f32], want: &[f32], cpu_tol: f32) {
    let err = max_abs_diff(got, want);
    if name.starts_with("cpu") {
        assert!(err <= cpu_tol, "{what}: error {err} vs unpaged");
    } else {
        assert!(got == want, "{what}: differs from unpaged (by up to {err})");
    }
}

/// `old` with row `at` of `width` values set to row `from` of `src`, for
/// each (at, from).
fn with_rows(old: &[f32], src: &[f32], width: usize, rows: &[(usize, usize)]) -> Vec<f32> {
    let mut out = old.to_vec();
    for &(at, from) in rows {
        out[at * width..(at + 1) * width].copy_from_slice(&src[from * width..(from + 1) * width]);
    }
    out
}

fn store_rows_and_rope_store_paged((name, mut b): Named) {
    // Five rows; tables of 128 positions. One table (a prompt chunk), or one
    // per row (the first two rows share theirs, a forked prefix). Each
    // stored row equals what the unpaged op stores at its position, in the
    // cache row its table names; every other pool row keeps its value
    // (exact). The last row stores nothing: its position is past its table
    // (one table) or its page past the pool (per row).
    let (rows, n_heads, n_kv, head_dim, len) = (5, 6, 2, 64, 128);
    let kvd = n_kv * head_dim;
    let rope = RopeParams {
        rows,
        n_heads,
        head_dim,
        rot_dim: 64,
        base: 10000.0,
        style: RopeStyle::Neox,
        scaling: None,
    };
    let q = rand_f32(rows * n_heads * head_dim, 41);
    let k = rand_f32(rows * kvd, 42);
    let v = rand_f32(rows * kvd, 43);
    for dtype in [DType::F32, DType::F16] {
        for log2 in PAGE_LOG2S {
            for per_row in [false, true] {
                let per = len >> log2;
                let pages = rows * per + 3;
                let (stride, positions, table) = if per_row {
                    let mut t = scrambled_pages(rows * per, pages, 1);
                    t.copy_within(0..per, per);
                    t[4 * per + (40 >> log2)] = pages as u32 + 3;
                    (per, [3u32, 21, 70, 127, 40], t)
                } else {
                    (0, [3u32, 21, 70, 127, 300], scrambled_pages(per, pages, 1))
                };
                let what = format!("{name} {dtype:?} pages of {} per_row {per_row}", 1 << log2);
                let old = rand_f32(pages * (kvd << log2), 44);
                // Unpaged, into caches of the positions the tables map.
                let zeros = vec![0f32; len * kvd];
                let bufs = [&q, &q, &k, &v].map(|d| upload_f32(b.as_mut(), d));
                let [q_flat, q_paged, kb, vb] = bufs;
                let pb = upload_u32(b.as_mut(), &positions);
                let (kc, _) = upload_cache(b.as_mut(), &zeros, dtype);
                let (vc, _) = upload_cache(b.as_mut(), &zeros, dtype);
                let (sc, _) = upload_cache(b.as_mut(), &zeros, dtype);
                b.begin_pass().unwrap();
                let r = b.rope_store(&q_flat, &kb, &vb, &pb, &kc, &vc, &rope, n_kv, dtype, None);
                b.end_pass().unwrap();
                let mut frees = vec![kc, vc, sc, pb];
                frees.extend(bufs);
                if f16_unsupported(r, &name) {
                    frees.into_iter().for_each(|buf| b.free(buf));
                    continue;
                }
                pass(b.as_mut(), |b| {
                    b.store_rows(&kb, &sc, &pb, rows, kvd, dtype, None).unwrap()
                });
                let [k_flat, v_flat, s_flat] =
                    [kc, vc, sc].map(|buf| download_cache(b.as_mut(), &buf, len * kvd, dtype));
                let q_want = download_f32(b.as_mut(), &q_flat, q.len());
                // Paged, into pools of old values.
                let tb = upload_u32(b.as_mut(), &table);
                let kv_pages = KvPages {
                    table: tb,
                    page_log2: log2,
                    stride,
                    pages,
                };
                let (kp, old) = upload_cache(b.as_mut(), &old, dtype);
                let (vp, _) = upload_cache(b.as_mut(), &old, dtype);
                let (sp, _) = upload_cache(b.as_mut(), &old, dtype);
                pass(b.as_mut(), |b| {
                    let pg = Some(&kv_pages);
                    b.rope_store(&q_paged, &kb, &vb, &pb, &kp, &vp, &rope, n_kv, dtype, pg)
                        .unwrap();
                    b.store_rows(&kb, &sp, &pb, rows, kvd, dtype, pg).unwrap();
                });
                let stored: Vec<(usize, usize)> = (0..rows - 1)
                    .map(|r| {
                        let t = &table[r * stride..];
                        (
                            paged_row(t, log2, positions[r] as usize),
                            positions[r] as usize,
                        )
                    })
                    .collect();
                let n = old.len();
                for (buf, flat, which) in [
                    (kp, &k_flat, "k"),
                    (vp, &v_flat, "v"),
                    (sp, &s_flat, "store_rows"),
                ] {
                    let got = download_cache(b.as_mut(), &buf, n, dtype);
                    let want = with_rows(&old, flat, kvd, &stored);
                    assert!(got == want, "{what}: {which} pool");
                    b.free(buf);
                }
                let got = download_f32(b.as_mut(), &q_paged, q.len());
                assert!(got == q_want, "{what}: q");
                b.free(tb);
                frees.into_iter().for_each(|buf| b.free(buf));
            }
        }
    }
}
test_device!(
    store_rows_and_rope_store_paged,
    store_rows_and_rope_store_paged_cpu: cpu_backends,
    store_rows_and_rope_store_paged_vulkan: decode_vulkan_backends
);

/// A cache buffer and the values it holds.
type Cache = (Buffer, Vec<f32>);

/// A query of `q_len` values and K and V pools of `elems` values (q and
/// keys in [-4, 4], values in [-1, 1]) as `dtype` caches: (q, k pool, v
/// pool).
fn pools(
    b: &mut dyn ComputeBackend,
    q_len: usize,
    elems: usize,
    dtype: DType,
    seed: u64,
) -> (Vec<f32>, Cache, Cache) {
    let q: Vec<f32> = rand_f32(q_len, seed).iter().map(|x| x * 4.0).collect();
    let k: Vec<f32> = rand_f32(elems, seed + 1).iter().map(|x| x * 4.0).collect();
    let v = rand_f32(elems, seed + 2);
    (q, upload_cache(b, &k, dtype), upload_cache(b, &v, dtype))
}

fn attention_paged_one_table((name, mut b): Named) {
    // Rows of one sequence (stride 0) through a scrambled table of 192
    // positions, against the unpaged op over the cache it maps: Vulkan's
    // decode kernel (1 and 4 rows; every row on a CPU device), prefill tiles
    // (7 and 40 rows), the fallback (head_dim 6); GQA, a window; attention
    // sinks in pages of 64. Also within 4e-5 of the reference, as
    // attention's tests.
    // (n_heads, n_kv_heads, head_dim, window, positions)
    let cases: [(usize, usize, usize, usize, Vec<u32>); 5] = [
        (4, 4, 64, 0, vec![130]),
        (6, 2, 64, 0, vec![5, 20, 33, 77]),
        (9, 3, 64, 0, (100..107).collect()),
        (8, 2, 128, 37, (60..100).collect()),
        (2, 1, 6, 0, (90..97).collect()),
    ];
    let len = 192;
    for dtype in [DType::F32, DType::F16] {
        for log2 in PAGE_LOG2S {
            for (n_heads, n_kv_heads, head_dim, window, positions) in &cases {
                let (n_heads, n_kv_heads, head_dim, window) =
                    (*n_heads, *n_kv_heads, *head_dim, *window);
                let kvd = n_kv_heads * head_dim;
                let per = len >> log2;
                let pages = per + 5;
                let table = scrambled_pages(per, pages, 3);
                let rows = positions.len();
                let (q, (kp, k_pool), (vp, v_pool)) = pools(
                    b.as_mut(),
                    rows * n_heads * head_dim,
                    pages * (kvd << log2),
                    dtype,
                    51,
                );
                let k = gather_pages(&k_pool, &table, log2, kvd, len);
                let v = gather_pages(&v_pool, &table, log2, kvd, len);
                let sinks = (log2 == PAGE_LOG2S[1]).then(|| attention_sinks(n_heads, 52));
                let sb = sinks.as_ref().map(|s| upload_f32(b.as_mut(), s));
                let p = AttentionParams {
                    rows,
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    capacity: len,
                    span: len,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    window,
                    kv_dtype: dtype,
                    pages: None,
                    next: None,
                    sinks: sb,
                };
                let (kb, _) = upload_cache(b.as_mut(), &k, dtype);
                let (vb, _) = upload_cache(b.as_mut(), &v, dtype);
                let qb = upload_f32(b.as_mut(), &q);
                let pb = upload_u32(b.as_mut(), positions);
                let tb = upload_u32(b.as_mut(), &table);
                let [flat, paged] = [0, 1].map(|_| b.alloc(q.len() * 4).unwrap());
                let pp = AttentionParams {
                    pages: Some(KvPages {
                        table: tb,
                        page_log2: log2,
                        stride: 0,
                        pages,
                    }),
                    ..p
                };
                b.begin_pass().unwrap();
                let r = b.attention(&qb, &kb, &vb, &pb, &flat, &p);
                let r2 = b.attention(&qb, &kp, &vp, &pb, &paged, &pp);
                b.end_pass().unwrap();
                let what = format!(
                    "{name} {dtype:?} pages of {} {n_heads}/{n_kv_heads} hd {head_dim} rows {rows} \
                     sinks {}",
                    1 << log2,
                    sinks.is_some()
                );
                let mut bufs = vec![kb, vb, kp, vp, qb, pb, tb];
                bufs.extend(sb);
                if f16_unsupported(r.and(r2), &name) {
                    bufs.into_iter()
                        .chain([flat, paged])
                        .for_each(|buf| b.free(buf));
                    continue;
                }
                let [want, got] = [flat, paged].map(|buf| {
                    let out = download_f32(b.as_mut(), &buf, q.len());
                    b.free(buf);
                    out
                });
                bufs.into_iter().for_each(|buf| b.free(buf));
                assert_as_unpaged(&name, &what, &got, &want, 1e-5);
                let p32 = AttentionParams {
                    kv_dtype: DType::F32,
                    ..p
                };
                let exact =
                    reference::attention_with_sinks(&q, &k, &v, positions, &p32, sinks.as_deref())
                        .unwrap();
                let err = max_abs_diff(&got, &exact);
                assert!(err <= 4e-5, "{what}: error {err} vs the reference");
                if sinks.is_some() {
                    let plain = AttentionParams { sinks: None, ..p32 };
                    let without = reference::attention(&q, &k, &v, positions, &plain).unwrap();
                    let moved = max_abs_diff(&exact, &without);
                    assert!(moved > 0.05, "{what}: the sinks move it by {moved} only");
                }
            }
        }
    }
}
test_device!(
    attention_paged_one_table,
    attention_paged_one_table_cpu: cpu_backends,
    attention_paged_one_table_vulkan: decode_vulkan_backends
);

fn attention_paged_rows_own_tables((name, mut b): Named) {
    // A decode step of several sequences: each row its own table of 2048
    // positions (Vulkan: the decode kernel for any number of rows, or the
    // fallback for head_dim 6), the first two rows sharing the first half
    // of theirs (a forked prefix), ids scrambled, rows at depths from 0 to
    // 2000 (a CPU device's unsplit workgroups stage several chunks of page
    // ids); GQA, a window; pages of 16, 64 and 4 (Vulkan: too short for the
    // decode kernel, the fallback's); attention sinks in pages of 64 and 4.
    // Each row within 4e-5 of the reference over its own cache, as
    // attention's tests.
    // (n_heads, n_kv_heads, head_dim, window)
    let shapes = [
        (9, 3, 64, 0),
        (8, 2, 128, 300),
        (16, 1, 64, 0),
        (2, 1, 6, 0),
    ];
    let position_sets: [&[u32]; 2] = [&[2000, 1999, 5, 640, 1023], &[0, 77]];
    let len = 2048;
    for dtype in [DType::F32, DType::F16] {
        for log2 in [4, 6, 2] {
            for ((n_heads, n_kv_heads, head_dim, window), positions) in shapes
                .into_iter()
                .flat_map(|s| position_sets.map(|ps| (s, ps)))
            {
                let kvd = n_kv_heads * head_dim;
                let rows = positions.len();
                let per = len >> log2;
                let pages = rows * per + 5;
                let mut table = scrambled_pages(rows * per, pages, 7);
                table.copy_within(0..per / 2, per);
                let (q, (kp, k_pool), (vp, v_pool)) = pools(
                    b.as_mut(),
                    rows * n_heads * head_dim,
                    pages * (kvd << log2),
                    dtype,
                    61,
                );
                let qb = upload_f32(b.as_mut(), &q);
                let pb = upload_u32(b.as_mut(), positions);
                let tb = upload_u32(b.as_mut(), &table);
                let out = b.alloc(q.len() * 4).unwrap();
                let sinks = (log2 != 4).then(|| attention_sinks(n_heads, 62));
                let sb = sinks.as_ref().map(|s| upload_f32(b.as_mut(), s));
                let p = AttentionParams {
                    rows,
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    capacity: len,
                    span: len,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    window,
                    kv_dtype: dtype,
                    pages: Some(KvPages {
                        table: tb,
                        page_log2: log2,
                        stride: per,
                        pages,
                    }),
                    next: None,
                    sinks: sb,
                };
                b.begin_pass().unwrap();
                let r = b.attention(&qb, &kp, &vp, &pb, &out, &p);
                b.end_pass().unwrap();
                let mut bufs = vec![kp, vp, qb, pb, tb];
                bufs.extend(sb);
                if f16_unsupported(r, &name) {
                    bufs.into_iter().chain([out]).for_each(|buf| b.free(buf));
                    continue;
                }
                let got = download_f32(b.as_mut(), &out, q.len());
                bufs.into_iter().chain([out]).for_each(|buf| b.free(buf));
                let one = AttentionParams {
                    rows: 1,
                    kv_dtype: DType::F32,
                    pages: None,
                    ..p
                };
                let qd = n_heads * head_dim;
                for (r, &pos) in positions.iter().enumerate() {
                    let t = &table[r * per..(r + 1) * per];
                    let k = gather_pages(&k_pool, t, log2, kvd, len);
                    let v = gather_pages(&v_pool, t, log2, kvd, len);
                    let q_r = &q[r * qd..(r + 1) * qd];
                    let want = reference::attention_with_sinks(
                        q_r,
                        &k,
                        &v,
                        &[pos],
                        &one,
                        sinks.as_deref(),
                    )
                    .unwrap();
                    let err = max_abs_diff(&got[r * qd..(r + 1) * qd], &want);
                    assert!(
                        err <= 4e-5,
                        "{name} {dtype:?} pages of {} {n_heads}/{n_kv_heads} hd {head_dim} \
                         row {r} at {pos} of {positions:?}: error {err}",
                        1 << log2
                    );
                }
            }
        }
    }
}
test_device!(
    attention_paged_rows_own_tables,
    attention_paged_rows_own_tables_cpu: cpu_backends,
    attention_paged_rows_own_tables_vulkan: decode_vulkan_backends
);

fn rope_store_attention_paged((name, mut b): Named) {
    // The decode step's fused front (Vulkan: attention_decode.comp's ROPE
    // mode appends the row's k and v where its table says) against the same
    // op unpaged over the cache the table maps: the output as unpaged (see
    // assert_as_unpaged), the new row's k and v exactly where the table
    // puts them, every other pool row untouched. A table of its own (stride
    // > 0) for pages of 64, and there gpt-oss's YaRN rope and attention
    // sinks, with the output also within 2e-4 of the reference over the
    // caches the op left and q roped by the reference (its rotation differs
    // from the device's by ~1e-6, which the scores carry) and away from the
    // reference without them.
    // (n_heads, n_kv_heads, head_dim, rot_dim, style, position, window, cache)
    type Case = (usize, usize, usize, usize, RopeStyle, u32, usize, DType);
    let cases: [Case; 5] = [
        (9, 3, 64, 64, RopeStyle::Neox, 700, 0, DType::F16),
        (9, 3, 64, 64, RopeStyle::Neox, 0, 0, DType::F32),
        (32, 8, 128, 128, RopeStyle::Interleaved, 1500, 0, DType::F32),
        (8, 2, 256, 256, RopeStyle::Neox, 1000, 512, DType::F16),
        (2, 1, 6, 6, RopeStyle::Neox, 39, 0, DType::F32),
    ];
    let len = 2048;
    for log2 in PAGE_LOG2S {
        for (n_heads, n_kv, head_dim, rot_dim, style, pos, window, dtype) in cases {
            let kvd = n_kv * head_dim;
            let per = len >> log2;
            let pages = per + 6;
            let table = scrambled_pages(per, pages, 5);
            let oss = log2 == PAGE_LOG2S[1];
            let yarn = RopeScaling::yarn(32.0, 4096, 32.0, 1.0, rot_dim, 10000.0, false);
            let rope = RopeParams {
                rows: 1,
                n_heads,
                head_dim,
                rot_dim,
                base: 10000.0,
                style,
                scaling: oss.then_some(yarn),
            };
            let sinks = oss.then(|| attention_sinks(n_heads, 74));
            let sb = sinks.as_ref().map(|s| upload_f32(b.as_mut(), s));
            let (q, (kp, k_pool), (vp, v_pool)) = pools(
                b.as_mut(),
                n_heads * head_dim,
                pages * (kvd << log2),
                dtype,
                71,
            );
            let k_flat = gather_pages(&k_pool, &table, log2, kvd, len);
            let v_flat = gather_pages(&v_pool, &table, log2, kvd, len);
            let (kb, _) = upload_cache(b.as_mut(), &k_flat, dtype);
            let (vb, _) = upload_cache(b.as_mut(), &v_flat, dtype);
            let k_new = rand_f32(kvd, 72);
            let v_new = rand_f32(kvd, 73);
            let [q_flat, q_paged, kn, vn] =
                [&q, &q, &k_new, &v_new].map(|d| upload_f32(b.as_mut(), d));
            let pb = upload_u32(b.as_mut(), &[pos]);
            let tb = upload_u32(b.as_mut(), &table);
            let [flat, paged] = [0, 1].map(|_| b.alloc(q.len() * 4).unwrap());
            let p = AttentionParams {
                rows: 1,
                n_heads,
                n_kv_heads: n_kv,
                head_dim,
                capacity: len,
                span: len,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window,
                kv_dtype: dtype,
                pages: None,
                next: None,
                sinks: sb,
            };
            let pp = AttentionParams {
                pages: Some(KvPages {
                    table: tb,
                    page_log2: log2,
                    stride: if log2 == 6 { per } else { 0 },
                    pages,
                }),
                ..p
            };
            b.begin_pass().unwrap();
            let r = b.rope_store_attention(&q_flat, &kn, &vn, &pb, &kb, &vb, &rope, &p, &flat);
            let r2 = b.rope_store_attention(&q_paged, &kn, &vn, &pb, &kp, &vp, &rope, &pp, &paged);
            b.end_pass().unwrap();
            let what = format!(
                "{name} {dtype:?} pages of {} {n_heads}/{n_kv} hd {head_dim} pos {pos} \
                 yarn and sinks {oss}",
                1 << log2
            );
            let mut bufs = vec![q_flat, q_paged, kn, vn, pb, tb];
            bufs.extend(sb);
            let caches = [kb, vb, kp, vp];
            if f16_unsupported(r.and(r2), &name) {
                bufs.into_iter()
                    .chain(caches)
                    .chain([flat, paged])
                    .for_each(|buf| b.free(buf));
                continue;
            }
            let [want, got] = [flat, paged].map(|buf| {
                let out = download_f32(b.as_mut(), &buf, q.len());
                b.free(buf);
                out
            });
            assert_as_unpaged(&name, &what, &got, &want, 1e-5);
            let [k_after, v_after] =
                [kb, vb].map(|buf| download_cache(b.as_mut(), &buf, len * kvd, dtype));
            if oss {
                let p32 = AttentionParams {
                    kv_dtype: DType::F32,
                    sinks: None,
                    ..p
                };
                let attend = |rope: &RopeParams, sinks: Option<&[f32]>| {
                    let mut q_roped = q.clone();
                    reference::rope(&mut q_roped, &[pos], rope).unwrap();
                    reference::attention_with_sinks(
                        &q_roped,
                        &k_after,
                        &v_after,
                        &[pos],
                        &p32,
                        sinks,
                    )
                    .unwrap()
                };
                let exact = attend(&rope, sinks.as_deref());
                let err = max_abs_diff(&got, &exact);
                assert!(err <= 2e-4, "{what}: error {err} vs the reference");
                let plain = attend(
                    &RopeParams {
                        scaling: None,
                        ..rope
                    },
                    None,
                );
                let moved = max_abs_diff(&exact, &plain);
                assert!(
                    moved > 0.05,
                    "{what}: YaRN and sinks move it by {moved} only"
                );
            }
            let n = k_pool.len();
            let [kp_after, vp_after] =
                [kp, vp].map(|buf| download_cache(b.as_mut(), &buf, n, dtype));
            let row = [(paged_row(&table, log2, pos as usize), pos as usize)];
            assert!(
                kp_after == with_rows(&k_pool, &k_after, kvd, &row),
                "{what}: k pool"
            );
            assert!(
                vp_after == with_rows(&v_pool, &v_after, kvd, &row),
                "{what}: v pool"
            );
            bufs.into_iter().chain(caches).for_each(|buf| b.free(buf));
        }
    }
}
test_device!(
    rope_store_attention_paged,
    rope_store_attention_paged_cpu: cpu_backends,
    rope_store_attention_paged_vulkan: decode_vulkan_backends
);

fn paged_attention_bad_tables_are_errors((name, mut b): Named) {
    // A page past the pool under an attended position fails the op (the
    // CPU) or its pass (Vulkan, flagged on the device, nothing read outside
    // the cache), for a decode row, prefill rows and per-row tables; the
    // backend then runs a good pass. Tables too short for the capacity
    // (check::kv_rows), per-row tables closer than that, too few of them
    // for the rows, and pages of 2^31 positions are errors at the op.
    let (n_heads, n_kv_heads, head_dim, log2, len) = (4, 2, 64, 4u32, 128);
    let kvd = n_kv_heads * head_dim;
    let per = len >> log2;
    let pages = 2 * per + 1;
    let (q, (kp, _), (vp, _)) = pools(
        b.as_mut(),
        8 * n_heads * head_dim,
        pages * (kvd << log2),
        DType::F32,
        81,
    );
    let qb = upload_f32(b.as_mut(), &q);
    let out = b.alloc(q.len() * 4).unwrap();
    let attend =
        |b: &mut dyn ComputeBackend, rows: usize, table: &[u32], stride: usize, log2: u32| {
            let positions: Vec<u32> = (0..rows as u32).map(|r| 100 + r).collect();
            let pb = upload_u32(b, &positions);
            let tb = upload_u32(b, table);
            let p = AttentionParams {
                rows,
                n_heads,
                n_kv_heads,
                head_dim,
                capacity: len,
                span: len,
                scale: 0.125,
                window: 0,
                kv_dtype: DType::F32,
                pages: Some(KvPages {
                    table: tb,
                    page_log2: log2,
                    stride,
                    pages,
                }),
                next: None,
                sinks: None,
            };
            b.begin_pass().unwrap();
            let r = b.attention(&qb, &kp, &vp, &pb, &out, &p);
            let r = r.and(b.end_pass());
            b.free(pb);
            b.free(tb);
            r
        };
    let good = scrambled_pages(2 * per, pages, 9);
    let mut bad = good[..per].to_vec();
    bad[3] = pages as u32 + 7; // positions 48..64, which every row attends
    for (rows, stride) in [(1, 0), (7, 0), (6, per)] {
        let what = format!("{name} rows {rows} stride {stride}");
        // One table, or the same one for every row.
        let tables = |t: &[u32]| t.repeat(if stride > 0 { rows } else { 1 });
        let r = attend(b.as_mut(), rows, &tables(&bad), stride, log2);
        assert!(r.is_err(), "{what}: page past the pool");
        attend(b.as_mut(), rows, &tables(&good[..per]), stride, log2)
            .unwrap_or_else(|e| panic!("{what}: good pass after: {e}"));
    }
    let short = &good[..per - 1];
    assert!(
        attend(b.as_mut(), 1, short, 0, log2).is_err(),
        "{name}: short table"
    );
    assert!(
        attend(b.as_mut(), 2, &good, per - 1, log2).is_err(),
        "{name}: stride < pages a row maps"
    );
    assert!(
        attend(b.as_mut(), 3, &good, per, log2).is_err(),
        "{name}: too few tables for the rows"
    );
    assert!(
        attend(b.as_mut(), 1, &good, 0, 31).is_err(),
        "{name}: pages of 2^31"
    );
    for buf in [kp, vp, qb, out] {
        b.free(buf);
    }
}
test_device!(
    paged_attention_bad_tables_are_errors,
    paged_attention_bad_tables_are_errors_cpu: cpu_backends,
    paged_attention_bad_tables_are_errors_vulkan: decode_vulkan_backends
);
