//! The mixture-of-experts ops in recorded passes: a replayed pass routes by
//! the ids (or router logits) it finds in device memory at each replay, on
//! the GEMV (few tokens) and the grouped GEMM (many).

use crate::common::{self, assert_close, download_f32, rand_f32, upload_f32};
use crate::TOL;
use vkllm::backend::{Buffer, ComputeBackend, ExpertsParams, RouteParams};
use vkllm::vk::VulkanBackend;
use vkllm::{reference, DType};

/// The device's own kernel plans (on lavapipe every matmul takes the GEMM)
/// and, where they differ, a GPU's (few rows on the GEMV).
fn backends() -> Vec<VulkanBackend> {
    common::vulkan_exact_backend()
        .into_iter()
        .chain(common::vulkan_gpu_plans_backend())
        .collect()
}

/// `values` written into the host-mapped buffer `buf` (no pass).
fn write_mapped<T: bytemuck::Pod>(b: &mut VulkanBackend, buf: &Buffer, values: &[T]) {
    b.upload(buf, 0, bytemuck::cast_slice(values)).unwrap();
}

/// `y` of `slots` rows of `n` against the reference of `w` (f32 `[experts
/// * n, cols]`) routed by `ids`: within TOL of Σ|w·x| per output.
fn check_experts(what: &str, got: &[f32], w: &[f32], x: &[f32], ids: &[u32], p: &ExpertsParams) {
    let cols = x.len() / if p.x_per_slot { p.slots() } else { p.rows };
    let wb: &[u8] = bytemuck::cast_slice(w);
    let want = reference::matmul_experts(DType::F32, wb, cols, None, x, ids, p).unwrap();
    let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<f32>>();
    let (wa, xa) = (abs(w), abs(x));
    let mag = reference::matmul_experts(
        DType::F32,
        bytemuck::cast_slice(&wa),
        cols,
        None,
        &xa,
        ids,
        p,
    )
    .unwrap();
    assert_close(what, got, &want, &mag, TOL);
}

#[test]
fn matmul_experts_replays_new_ids() {
    let (experts, n, cols, k) = (8, 24, 64, 2);
    let w = rand_f32(experts * n * cols, 71);
    for mut b in backends() {
        let wt = b
            .upload_weight(DType::F32, experts * n, cols, bytemuck::cast_slice(&w))
            .unwrap();
        for rows in [2, 24] {
            let p = ExpertsParams {
                rows,
                k,
                experts,
                x_per_slot: false,
                glu: None,
            };
            let x = rand_f32(rows * cols, 72);
            let xb = upload_f32(&mut b, &x);
            let ids = b.alloc_mapped(p.slots() * 4).unwrap();
            let y = b.alloc(p.slots() * n * 4).unwrap();
            let key = 7;
            for (run, shift) in [0u32, 3, 5].into_iter().enumerate() {
                let chosen: Vec<u32> = (0..p.slots() as u32)
                    .map(|s| (s * 3 + shift + s / 5) % experts as u32)
                    .collect();
                write_mapped(&mut b, &ids, &chosen);
                if run == 0 {
                    b.begin_replayable_pass(key).unwrap();
                    b.matmul_experts(&wt, None, &xb, &ids, &y, &p).unwrap();
                    b.end_pass().unwrap();
                } else {
                    assert!(
                        b.replay(key, 1).unwrap(),
                        "rows {rows}: the pass was not kept"
                    );
                }
                let got = download_f32(&mut b, &y, p.slots() * n);
                let what = format!("{} rows {rows} run {run}", b.name());
                check_experts(&what, &got, &w, &x, &chosen, &p);
            }
            for buf in [xb, ids, y] {
                b.free(buf);
            }
        }
        b.free_weight(wt);
    }
}

#[test]
fn moe_pass_replays_new_router_logits() {
    // route_experts -> matmul_experts (per token) -> sum_experts, the
    // logits rewritten on the host between replays: each replay routes anew.
    let (experts, n, cols, k) = (16, 32, 64, 4);
    let w = rand_f32(experts * n * cols, 81);
    for mut b in backends() {
        let wt = b
            .upload_weight(DType::F32, experts * n, cols, bytemuck::cast_slice(&w))
            .unwrap();
        for rows in [1, 20] {
            let route = RouteParams {
                rows,
                experts,
                k,
                renorm: true,
            };
            let p = ExpertsParams {
                rows,
                k,
                experts,
                x_per_slot: false,
                glu: None,
            };
            let x = rand_f32(rows * cols, 82);
            let xb = upload_f32(&mut b, &x);
            let logits = b.alloc_mapped(rows * experts * 4).unwrap();
            let ids = b.alloc(p.slots() * 4).unwrap();
            let ws = b.alloc(p.slots() * 4).unwrap();
            let y = b.alloc(p.slots() * n * 4).unwrap();
            let out = b.alloc(rows * n * 4).unwrap();
            let key = 8;
            let mut routings = Vec::new();
            for run in 0..3 {
                let l = rand_f32(rows * experts, 90 + run);
                write_mapped(&mut b, &logits, &l);
                if run == 0 {
                    b.begin_replayable_pass(key).unwrap();
                    b.route_experts(&logits, &ids, &ws, &route).unwrap();
                    b.matmul_experts(&wt, None, &xb, &ids, &y, &p).unwrap();
                    b.sum_experts(&y, &ws, &out, rows, k, n, false).unwrap();
                    b.end_pass().unwrap();
                } else {
                    assert!(
                        b.replay(key, 1).unwrap(),
                        "rows {rows}: the pass was not kept"
                    );
                }
                let (chosen, mix) = reference::route_experts(&l, &route).unwrap();
                let wb: &[u8] = bytemuck::cast_slice(&w);
                let ye =
                    reference::matmul_experts(DType::F32, wb, cols, None, &x, &chosen, &p).unwrap();
                let want = reference::sum_experts(&ye, &mix, k, n);
                let scale: Vec<f32> = (0..rows * n)
                    .map(|i| {
                        let (r, c) = (i / n, i % n);
                        let e = |j: usize| chosen[r * k + j] as usize;
                        (0..k)
                            .map(|j| {
                                let wr = &w[(e(j) * n + c) * cols..(e(j) * n + c + 1) * cols];
                                let xr = &x[r * cols..(r + 1) * cols];
                                mix[r * k + j].abs()
                                    * wr.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum::<f32>()
                            })
                            .sum::<f32>()
                    })
                    .collect();
                let got = download_f32(&mut b, &out, rows * n);
                let what = format!("{} rows {rows} run {run}", b.name());
                assert_close(&what, &got, &want, &scale, TOL);
                routings.push(chosen);
            }
            assert!(
                routings[0] != routings[1],
                "the logits should route differently"
            );
            for buf in [xb, logits, ids, ws, y, out] {
                b.free(buf);
            }
        }
        b.free_weight(wt);
    }
}
