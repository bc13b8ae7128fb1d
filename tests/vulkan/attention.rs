//! The attention kernels: decode splits and their merges (and the int8
//! digits they write for the next projection), prefill on the flash tiles,
//! the decode kernel and cooperative matrices; paged caches on the decode
//! kernel at many rows and on cooperative matrices.

use crate::common::{
    self, assert_close, download_f32, pass, rand_f32, upload_f32, upload_u32, weight_bytes,
};
use crate::{assert_within, gemv_allowed, q8_everywhere, TOL};
use vkllm::backend::{AttentionParams, ComputeBackend, KvPages, NextWeight};
use vkllm::vk::{PrefillAttention, VulkanBackend};
use vkllm::{reference, DType};

/// The decode attention writes its output as the integer-dot GEMV's int8
/// digits too, from its split merge (attention_combine.comp) or, unsplit,
/// from attention_decode.comp itself, so the o projection after it skips its
/// quantize dispatch: the projection of that output must equal, bit for bit,
/// the projection of a copy of it, which quantize_q8.comp quantizes; and the
/// pass must hold one quantize dispatch, the copy's. Rows 1 and 3, head_dim
/// 64 and 128, unsplit short spans, spans of 32 and 16 splits whose last
/// one merges (attention_decode_merge) and long ones merged by a dispatch,
/// and each whole in tiles of several heads (a CPU device's plan);
/// Q4_0, Q4_K
/// (their block sums enter the dot) and Q8_0 weights (the integer-dot kernel
/// on for every size); every other case with attention sinks, which the
/// digits must include. Told no next weight, the attention writes only f32
/// and the projection quantizes for itself.
#[test]
fn attention_merge_quantizes_like_quantize_q8() {
    let Some(mut b) = q8_everywhere() else {
        return;
    };
    // The last column: merge dispatches (a split span: 4 heads over 5K keys)
    // in a GPU's plans; each case runs those and whole spans (a CPU
    // device's plan: one workgroup per kv head and tile of heads, no merge).
    let cases = [
        (1, 300, 9, 3, 64, DType::Q4_0, 0),
        (1, 5000, 4, 4, 128, DType::Q4K, 1),
        // Splits of one head each whose last one merges (and quantizes):
        // 32 of a group of 1, and 16 of an 8B's groups of 4 over a short
        // span (one head per workgroup there, not 4).
        (1, 1000, 4, 4, 128, DType::Q4K, 0),
        (1, 1000, 32, 8, 128, DType::Q4K, 0),
        // Over 5K keys: one head per workgroup for groups of 4 and 8 at
        // head_dim 64 (Llama-3.2-1B's, TinyLlama's), a merge dispatch for
        // groups of 16.
        (1, 5000, 32, 8, 64, DType::Q4_0, 0),
        (1, 5000, 32, 4, 64, DType::Q4_0, 0),
        (1, 5000, 32, 2, 64, DType::Q4_0, 1),
        (3, 100, 8, 2, 128, DType::Q8_0, 0),
        (3, 100, 8, 2, 128, DType::Q4K, 0),
    ];
    for (ci, ((rows, depth, n_heads, n_kv_heads, head_dim, dtype, merges), splits)) in cases
        .into_iter()
        .flat_map(|c| [(c, true), (c, false)])
        .enumerate()
    {
        b.set_decode_splits(splits);
        let merges = if splits { merges } else { 0 };
        let with_sinks = ci % 4 >= 2;
        let what = format!(
            "rows {rows} depth {depth} {n_heads}/{n_kv_heads} hd {head_dim} splits {splits} \
             sinks {with_sinks}"
        );
        let (mut p, positions, q, k, v) = attention_case(
            (rows, depth, n_heads, n_kv_heads, head_dim, 0),
            DType::F32,
            71,
        );
        let sinks = with_sinks.then(|| upload_f32(&mut b, &common::attention_sinks(n_heads, 75)));
        p.sinks = sinks;
        let dim = n_heads * head_dim;
        let n_out = 96;
        let wb = weight_bytes(dtype, n_out, dim, 72);
        let w = b.upload_weight(dtype, n_out, dim, &wb).unwrap();
        p.next = Some(NextWeight::of(&w));
        let (qb, kb, vb) = (
            upload_f32(&mut b, &q),
            upload_f32(&mut b, &k),
            upload_f32(&mut b, &v),
        );
        let pb = upload_u32(&mut b, &positions);
        let att = b.alloc(rows * dim * 4).unwrap();
        let copy = b.alloc(rows * dim * 4).unwrap();
        let (y_fused, y_copy) = (
            b.alloc(rows * n_out * 4).unwrap(),
            b.alloc(rows * n_out * 4).unwrap(),
        );
        pass(&mut b, |b| {
            b.attention(&qb, &kb, &vb, &pb, &att, &p).unwrap();
            b.matmul(&w, None, &att, &y_fused, rows).unwrap();
            b.copy(&att, 0, &copy, 0, rows * dim * 4).unwrap();
            b.matmul(&w, None, &copy, &y_copy, rows).unwrap();
        });
        // attention (and its merge), matmul, quantize (of the copy), matmul.
        assert_eq!(
            b.last_pass_stats().unwrap().dispatches,
            4 + merges,
            "{what}"
        );
        let fused = download_f32(&mut b, &y_fused, rows * n_out);
        let copied = download_f32(&mut b, &y_copy, rows * n_out);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&copied), "{what}");
        // And both are the projection of the attention (int8-digit steps).
        let a = download_f32(&mut b, &att, rows * dim);
        let want = reference::matmul(dtype, &wb, n_out, dim, None, &a, rows).unwrap();
        let allowed = gemv_allowed(&b, (dtype, &wb), n_out, dim, &a, rows);
        assert_within(&what, &fused, &want, &allowed);
        let unknown = AttentionParams { next: None, ..p };
        pass(&mut b, |b| {
            b.attention(&qb, &kb, &vb, &pb, &att, &unknown).unwrap();
            b.matmul(&w, None, &att, &y_copy, rows).unwrap();
        });
        // attention (and its merge), quantize, matmul.
        assert_eq!(
            b.last_pass_stats().unwrap().dispatches,
            3 + merges,
            "{what}: no next weight"
        );
        let a = download_f32(&mut b, &att, rows * dim);
        let want = reference::matmul(dtype, &wb, n_out, dim, None, &a, rows).unwrap();
        let allowed = gemv_allowed(&b, (dtype, &wb), n_out, dim, &a, rows);
        let got = download_f32(&mut b, &y_copy, rows * n_out);
        assert_within(&format!("{what}, no next weight"), &got, &want, &allowed);
        for buf in [qb, kb, vb, pb, att, copy, y_fused, y_copy]
            .into_iter()
            .chain(sinks)
        {
            b.free(buf);
        }
    }
}

#[test]
fn decode_attention_last_split_merges_in_replayed_passes() {
    // SmolLM2's heads (9 / 3, head_dim 64) over a span planned for 1024
    // keys: split, and small enough for the last split to merge the others
    // (attention_decode_merge, no combine dispatch). Its arrival counts
    // must start at zero and be left at zero by every pass, so a replayed
    // pass at other positions (other numbers of active splits) still
    // merges once, with every split in.
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    b.set_decode_splits(true);
    let (mut p, _, q, k, v) = attention_case((1, 1100, 9, 3, 64, 0), DType::F32, 91);
    p.span = 1024;
    let (qb, kb, vb) = (
        upload_f32(&mut b, &q),
        upload_f32(&mut b, &k),
        upload_f32(&mut b, &v),
    );
    let pb = upload_u32(&mut b, &[0]);
    let ob = b.alloc(q.len() * 4).unwrap();
    // Again with attention sinks, which the merging split adds once.
    let sinks = common::attention_sinks(p.n_heads, 92);
    let sb = upload_f32(&mut b, &sinks);
    for (key, with_sinks) in [(3, false), (4, true)] {
        let p = AttentionParams {
            sinks: with_sinks.then_some(sb),
            ..p
        };
        let mut kept = Vec::new();
        for pos in [700u32, 1000, 40, 1023, 333] {
            b.upload(&pb, 0, bytemuck::bytes_of(&pos)).unwrap();
            let replayed = b.replay(key, 1).unwrap();
            if !replayed {
                b.begin_replayable_pass(key).unwrap();
                b.attention(&qb, &kb, &vb, &pb, &ob, &p).unwrap();
                b.end_pass().unwrap();
                assert_eq!(b.stats().dispatches, 1, "no merge dispatch");
            }
            kept.push(replayed);
            let got = download_f32(&mut b, &ob, q.len());
            let s = with_sinks.then_some(&sinks[..]);
            let want = reference::attention_with_sinks(&q, &k, &v, &[pos], &p, s).unwrap();
            let ones = vec![1.0f32; q.len()];
            let what = format!("position {pos} sinks {with_sinks}");
            assert_close(&what, &got, &want, &ones, TOL);
        }
        assert!(kept.ends_with(&[true, true, true]), "replays: {kept:?}");
    }
    for buf in [qb, kb, vb, pb, ob, sb] {
        b.free(buf);
    }
}

/// (rows, depth, n_heads, n_kv_heads, head_dim, window) of a prefill
/// attention case.
type AttentionShape = (usize, usize, usize, usize, usize, usize);

/// A prefill attention case: `rows` query rows at positions `depth`.. of a
/// cache of depth + rows + 5, with random q and k in [-2, 2] (large scores
/// make the softmax peaky, so a wrong running max or a masked key leaking in
/// shows) and v in [-1, 1]. Returns (params, positions, q, k, v).
fn attention_case(
    (rows, depth, n_heads, n_kv_heads, head_dim, window): AttentionShape,
    kv_dtype: DType,
    seed: u64,
) -> (AttentionParams, Vec<u32>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let p = AttentionParams {
        rows,
        n_heads,
        n_kv_heads,
        head_dim,
        capacity: depth + rows + 5,
        span: depth + rows + 5,
        scale: 1.0 / (head_dim as f32).sqrt(),
        window,
        kv_dtype,
        pages: None,
        next: None,
        sinks: None,
    };
    let positions: Vec<u32> = (depth as u32..(depth + rows) as u32).collect();
    let doubled = |v: Vec<f32>| -> Vec<f32> { v.iter().map(|x| x * 2.0).collect() };
    let kv = p.capacity * n_kv_heads * head_dim;
    let q = doubled(rand_f32(rows * n_heads * head_dim, seed));
    let k = doubled(rand_f32(kv, seed + 1));
    let v = rand_f32(kv, seed + 2);
    (p, positions, q, k, v)
}

/// Prefill attention (the device's prefill kernel, the flash tiles and the
/// decode kernel for every row, `VKLLM_ATTENTION=decode`, with the device's
/// own decode plans, for more than 4 rows; the decode kernel for 1): many rows of consecutive
/// positions at depth 0 and after a long prior cache, GQA ratios 1/3/4,
/// head_dim 64 and 128, with and without a sliding window, every other case
/// with attention sinks. Outputs are (with sinks, sub-)convex combinations
/// of values in [-1, 1], so the bound is absolute: TOL (1e-4; f32 online
/// softmax against the f64 reference differs by ~1e-6 here).
#[test]
fn attention_prefill_many_rows_long_cache() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    let mut kernels = vec![b.kernels().attention];
    for k in [PrefillAttention::Flash, PrefillAttention::Decode] {
        if !kernels.contains(&k) {
            kernels.push(k);
        }
    }
    for kernel in kernels {
        b.set_attention(kernel).unwrap();
        prefill_many_rows_long_cache(&mut b);
    }
}

fn prefill_many_rows_long_cache(b: &mut VulkanBackend) {
    eprintln!(
        "kernels: {}; shared memory {} B",
        b.kernels(),
        b.device_info().caps.max_shared_memory
    );
    // (rows, depth, n_heads, n_kv_heads, head_dim, window)
    let cases = [
        (1, 0, 4, 4, 64, 0),
        (7, 0, 9, 3, 64, 0),
        (64, 0, 8, 2, 128, 0),
        (130, 0, 6, 2, 64, 0),
        (130, 0, 4, 1, 128, 40),
        (1, 650, 8, 2, 128, 0),
        (7, 650, 4, 4, 128, 0),
        (64, 620, 9, 3, 64, 0),
        (130, 600, 8, 2, 64, 0),
        (64, 610, 4, 1, 128, 100),
        (130, 640, 6, 2, 64, 37),
        (33, 700, 3, 3, 80, 0),
    ];
    for (ci, case) in cases.into_iter().enumerate() {
        let (mut p, positions, q, k, v) = attention_case(case, DType::F32, 1000 + 10 * ci as u64);
        let (rows, depth, n_heads, n_kv_heads, head_dim, window) = case;
        let (qb, kb, vb) = (upload_f32(b, &q), upload_f32(b, &k), upload_f32(b, &v));
        let pb = upload_u32(b, &positions);
        let ob = b.alloc(q.len() * 4).unwrap();
        let sinks = (ci % 2 == 1).then(|| common::attention_sinks(n_heads, 1001 + ci as u64));
        let sb = sinks.as_ref().map(|s| upload_f32(b, s));
        p.sinks = sb;
        pass(b, |b| b.attention(&qb, &kb, &vb, &pb, &ob, &p).unwrap());
        let got = download_f32(b, &ob, q.len());
        let want =
            reference::attention_with_sinks(&q, &k, &v, &positions, &p, sinks.as_deref()).unwrap();
        let scale = vec![1.0f32; q.len()];
        assert_close(
            &format!(
                "attention rows {rows} depth {depth} heads {n_heads}/{n_kv_heads} \
                 hd {head_dim} window {window} sinks {}",
                sb.is_some()
            ),
            &got,
            &want,
            &scale,
            TOL,
        );
        for buf in [qb, kb, vb, pb, ob].into_iter().chain(sb) {
            b.free(buf);
        }
    }
}

/// GPU-only: prefill attention on cooperative matrices
/// (attention_prefill_coopmat.comp) over an f16 cache, where the device
/// gets it (skipped, with a note, elsewhere). The kernel rounds q·scale and
/// the probabilities to f16; the reference takes the same rounded q (with
/// scale 1) and the f16 cache, so what is left is the probabilities'
/// rounding (2⁻¹¹ of each weight; outputs within 1 in magnitude): 2e-3
/// absolute. Cases cross the 64-vector query tile and the 32-key tile, with
/// GQA groups of 1-4, head_dim 64 and 128, windows, rows deep into the
/// cache, and more query vectors than rows (keys past each row masked per
/// row); every other case with attention sinks (split ones too, which
/// attention_combine.comp adds).
#[test]
fn attention_prefill_coopmat_f16_cache() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    if b.kernels().attention != PrefillAttention::Coopmat {
        eprintln!(
            "skipped: {} gets {}, not cooperative-matrix attention",
            b.device_info().name,
            b.kernels()
        );
        return;
    }
    // (rows, depth, n_heads, n_kv_heads, head_dim, window)
    let cases = [
        (7, 0, 9, 3, 64, 0),
        (64, 0, 8, 2, 128, 0),
        (130, 0, 6, 2, 64, 0),
        (130, 0, 4, 1, 128, 40),
        (7, 650, 4, 4, 128, 0),
        (64, 620, 9, 3, 64, 0),
        (130, 600, 8, 2, 64, 0),
        (64, 610, 4, 1, 128, 100),
        (300, 4000, 32, 8, 128, 0),
        // Key splits (from capacities of 1024 up), with a window.
        (130, 1500, 8, 2, 64, 300),
        (200, 2100, 9, 3, 64, 0),
    ];
    let f16 = |v: &[f32]| -> Vec<half::f16> { v.iter().map(|&x| half::f16::from_f32(x)).collect() };
    for (ci, case) in cases.into_iter().enumerate() {
        let (mut p, positions, q, k, v) = attention_case(case, DType::F16, 2000 + 10 * ci as u64);
        let (rows, depth, n_heads, n_kv_heads, head_dim, window) = case;
        let sinks = (ci % 2 == 1).then(|| common::attention_sinks(n_heads, 2001 + ci as u64));
        let sb = sinks.as_ref().map(|s| upload_f32(&mut b, s));
        p.sinks = sb;
        let (k, v) = (f16(&k), f16(&v));
        let (kb, vb) = (b.alloc(k.len() * 2).unwrap(), b.alloc(v.len() * 2).unwrap());
        b.upload(&kb, 0, bytemuck::cast_slice(&k)).unwrap();
        b.upload(&vb, 0, bytemuck::cast_slice(&v)).unwrap();
        let qb = upload_f32(&mut b, &q);
        let pb = upload_u32(&mut b, &positions);
        let ob = b.alloc(q.len() * 4).unwrap();
        pass(&mut b, |b| {
            b.attention(&qb, &kb, &vb, &pb, &ob, &p).unwrap()
        });
        let got = download_f32(&mut b, &ob, q.len());
        let q16: Vec<f32> = f16(&q.iter().map(|x| x * p.scale).collect::<Vec<_>>())
            .iter()
            .map(|h| h.to_f32())
            .collect();
        let widen = |h: &[half::f16]| -> Vec<f32> { h.iter().map(|x| x.to_f32()).collect() };
        let p32 = AttentionParams {
            scale: 1.0,
            kv_dtype: DType::F32,
            ..p
        };
        let want = reference::attention_with_sinks(
            &q16,
            &widen(&k),
            &widen(&v),
            &positions,
            &p32,
            sinks.as_deref(),
        )
        .unwrap();
        let scale = vec![1.0f32; q.len()];
        assert_close(
            &format!(
                "coopmat attention rows {rows} depth {depth} heads {n_heads}/{n_kv_heads} \
                 hd {head_dim} window {window} sinks {}",
                sb.is_some()
            ),
            &got,
            &want,
            &scale,
            2e-3,
        );
        for buf in [qb, kb, vb, pb, ob].into_iter().chain(sb) {
            b.free(buf);
        }
    }
}

/// The decode kernel over page tables of each row's own (a decode step of
/// many sequences, `KvPages::stride` > 0, which takes it for any number of
/// rows) at 1, 4, 64 and 256 rows: scrambled ids in a pool the rows share
/// pages of, pages of 16 and 64, a window; in a CPU device's plans (whole
/// spans, several chunks of page ids per workgroup) and a GPU's (key
/// splits, merged by attention_combine.comp or by the last split); with
/// the o projection's int8 digits out where the device has the
/// integer-dot GEMV (the projection of them within `gemv_allowed` of the
/// reference); attention sinks in pages of 64. Each row within TOL of the
/// reference over its own cache.
#[test]
fn attention_decode_paged_rows() {
    let Some(mut b) = q8_everywhere().or_else(common::vulkan_backend) else {
        return;
    };
    let q8 = b.kernels().gemv_q8;
    // (rows, n_heads, n_kv_heads, head_dim, positions a table maps, window)
    let cases = [
        (1, 4, 4, 128, 1024, 0),
        (4, 9, 3, 64, 1024, 0),
        (64, 9, 3, 64, 512, 0),
        (256, 8, 2, 64, 256, 32),
    ];
    for ((rows, n_heads, n_kv_heads, head_dim, len, window), log2, splits) in cases
        .into_iter()
        .flat_map(|c| [(c, 4u32), (c, 6)])
        .flat_map(|(c, l)| [(c, l, false), (c, l, true)])
    {
        b.set_decode_splits(splits);
        let what = format!(
            "rows {rows} {n_heads}/{n_kv_heads} hd {head_dim} pages of {} splits {splits}",
            1 << log2
        );
        let kvd = n_kv_heads * head_dim;
        let per = len >> log2;
        let pages = 2 * per + 7;
        let table: Vec<u32> = (0..rows)
            .flat_map(|r| common::scrambled_pages(per, pages, 3 * r))
            .collect();
        let positions: Vec<u32> = (0..rows)
            .map(|r| ((len - 1).saturating_sub(37 * r % len)) as u32)
            .collect();
        let q: Vec<f32> = common::rand_f32(rows * n_heads * head_dim, 101)
            .iter()
            .map(|x| x * 2.0)
            .collect();
        let pool = pages * (kvd << log2);
        let k: Vec<f32> = common::rand_f32(pool, 102)
            .iter()
            .map(|x| x * 2.0)
            .collect();
        let v = common::rand_f32(pool, 103);
        let (qb, kb, vb) = (
            upload_f32(&mut b, &q),
            upload_f32(&mut b, &k),
            upload_f32(&mut b, &v),
        );
        let (pb, tb) = (upload_u32(&mut b, &positions), upload_u32(&mut b, &table));
        let dim = n_heads * head_dim;
        let att = b.alloc(rows * dim * 4).unwrap();
        let (n_out, wdtype) = (64, DType::Q8_0);
        let wb = weight_bytes(wdtype, n_out, dim, 104);
        let w = b.upload_weight(wdtype, n_out, dim, &wb).unwrap();
        let y = b.alloc(rows * n_out * 4).unwrap();
        let sinks = (log2 == 6).then(|| common::attention_sinks(n_heads, 105));
        let sb = sinks.as_ref().map(|s| upload_f32(&mut b, s));
        let p = AttentionParams {
            rows,
            n_heads,
            n_kv_heads,
            head_dim,
            capacity: len,
            span: len,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window,
            kv_dtype: DType::F32,
            pages: Some(KvPages {
                table: tb,
                page_log2: log2,
                stride: per,
                pages,
            }),
            next: q8.then(|| NextWeight::of(&w)),
            sinks: sb,
        };
        pass(&mut b, |b| {
            b.attention(&qb, &kb, &vb, &pb, &att, &p).unwrap();
            b.matmul(&w, None, &att, &y, rows).unwrap();
        });
        let got = download_f32(&mut b, &att, rows * dim);
        let one = AttentionParams {
            rows: 1,
            pages: None,
            next: None,
            ..p
        };
        for (r, &pos) in positions.iter().enumerate() {
            let t = &table[r * per..(r + 1) * per];
            let kr = common::gather_pages(&k, t, log2, kvd, len);
            let vr = common::gather_pages(&v, t, log2, kvd, len);
            let qr = &q[r * dim..(r + 1) * dim];
            let want =
                reference::attention_with_sinks(qr, &kr, &vr, &[pos], &one, sinks.as_deref())
                    .unwrap();
            let ones = vec![1.0f32; dim];
            let row = &got[r * dim..(r + 1) * dim];
            assert_close(&format!("{what}: row {r} at {pos}"), row, &want, &ones, TOL);
        }
        let projected = download_f32(&mut b, &y, rows * n_out);
        let want = reference::matmul(wdtype, &wb, n_out, dim, None, &got, rows).unwrap();
        let allowed = gemv_allowed(&b, (wdtype, &wb), n_out, dim, &got, rows);
        assert_within(&format!("{what}: projection"), &projected, &want, &allowed);
        for buf in [qb, kb, vb, pb, tb, att, y].into_iter().chain(sb) {
            b.free(buf);
        }
        b.free_weight(w);
    }
}

/// GPU-only: the cooperative-matrix prefill kernel over a paged f16 cache
/// (one table, scrambled ids, pages of 16 and 64: its 32-key tiles
/// straddle pages) equals it over the cache the table maps, bit for bit,
/// unsplit and with key splits and a window.
#[test]
fn attention_prefill_coopmat_paged() {
    let Some(mut b) = common::vulkan_backend() else {
        return;
    };
    if b.kernels().attention != PrefillAttention::Coopmat {
        eprintln!(
            "skipped: {} gets {}, not cooperative-matrix attention",
            b.device_info().name,
            b.kernels()
        );
        return;
    }
    // (rows, depth, n_heads, n_kv_heads, head_dim, window)
    let cases = [
        (130, 600, 8, 2, 64, 0),
        (64, 610, 4, 1, 128, 100),
        (200, 2100, 9, 3, 64, 0),
        (130, 1500, 8, 2, 64, 300),
    ];
    let upload_f16 = |b: &mut VulkanBackend, v: &[f32]| {
        let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
        let buf = b.alloc(h.len() * 2).unwrap();
        b.upload(&buf, 0, bytemuck::cast_slice(&h)).unwrap();
        buf
    };
    for (case, log2) in cases.into_iter().flat_map(|c| [(c, 4u32), (c, 6)]) {
        let (rows, depth, n_heads, n_kv_heads, head_dim, window) = case;
        let (mut p, positions, q, _, _) = attention_case(case, DType::F16, 3000);
        let len = p.capacity.next_multiple_of(1 << log2);
        p.capacity = len;
        p.span = len;
        let kvd = n_kv_heads * head_dim;
        let per = len >> log2;
        let pages = per + 6;
        let table = common::scrambled_pages(per, pages, 11);
        let pool = pages * (kvd << log2);
        let k: Vec<f32> = common::rand_f32(pool, 3001)
            .iter()
            .map(|x| x * 2.0)
            .collect();
        let v = common::rand_f32(pool, 3002);
        let (kp, vp) = (upload_f16(&mut b, &k), upload_f16(&mut b, &v));
        let kf = common::gather_pages(&k, &table, log2, kvd, len);
        let vf = common::gather_pages(&v, &table, log2, kvd, len);
        let (kb, vb) = (upload_f16(&mut b, &kf), upload_f16(&mut b, &vf));
        let qb = upload_f32(&mut b, &q);
        let (pb, tb) = (upload_u32(&mut b, &positions), upload_u32(&mut b, &table));
        let (flat, paged) = (b.alloc(q.len() * 4).unwrap(), b.alloc(q.len() * 4).unwrap());
        let pp = AttentionParams {
            pages: Some(KvPages {
                table: tb,
                page_log2: log2,
                stride: 0,
                pages,
            }),
            ..p
        };
        pass(&mut b, |b| {
            b.attention(&qb, &kb, &vb, &pb, &flat, &p).unwrap();
            b.attention(&qb, &kp, &vp, &pb, &paged, &pp).unwrap();
        });
        let want = download_f32(&mut b, &flat, q.len());
        let got = download_f32(&mut b, &paged, q.len());
        assert!(
            got == want,
            "coopmat attention rows {rows} depth {depth} heads {n_heads}/{n_kv_heads} \
             hd {head_dim} window {window} pages of {}: paged differs",
            1 << log2
        );
        for buf in [kp, vp, kb, vb, qb, pb, tb, flat, paged] {
            b.free(buf);
        }
    }
}
