//! The mixture-of-experts ops: route_experts, matmul_experts and
//! sum_experts against `vkllm::reference`.

use crate::common::{
    assert_ulps, download_f32, download_u32, pass, rand_f32, upload_f32, upload_u32, weight_bytes,
};
use crate::matmul::{activation_bound, matmul_cpu_backends, matmul_vulkan_backends, Rounded};
use crate::{cols_for, cpu_backends, test_device, vulkan_backends, Named};
use vkllm::backend::{ExpertsParams, RouteParams};
use vkllm::{reference, DType};

/// Logits whose chosen set depends on the tie-break: in each row, `k - 1`
/// experts above 10, then experts `a < b` tied at 5 for the last place,
/// the rest below 4.
fn tied_logits(rows: usize, experts: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut l: Vec<f32> = rand_f32(rows * experts, seed)
        .iter()
        .map(|v| v.clamp(-1.0, 1.0) * 4.0)
        .collect();
    for (r, row) in l.chunks_exact_mut(experts).enumerate() {
        let (a, b) = (r % experts, (r * 7 + 3) % experts);
        if a == b {
            continue;
        }
        let others = (0..experts).filter(|&i| i != a && i != b);
        for (j, i) in others.take(k - 1).enumerate() {
            row[i] = 10.0 + j as f32;
        }
        row[a] = 5.0;
        row[b] = 5.0;
    }
    l
}

fn route_experts_matches_reference((name, mut b): Named) {
    // Ids exactly (the lower expert first on ties); weights within 1e-5
    // relative (f32 exp and sum against f64).
    for (rows, experts, k) in [(1, 8, 2), (37, 8, 2), (5, 32, 4), (9, 128, 8), (3, 4, 4)] {
        let logits = tied_logits(rows, experts, k, (rows * experts + k) as u64);
        for renorm in [true, false] {
            let p = RouteParams {
                rows,
                experts,
                k,
                renorm,
            };
            let (want_ids, want_w) = reference::route_experts(&logits, &p).unwrap();
            let lb = upload_f32(b.as_mut(), &logits);
            let ids = b.alloc(rows * k * 4).unwrap();
            let ws = b.alloc(rows * k * 4).unwrap();
            pass(b.as_mut(), |b| b.route_experts(&lb, &ids, &ws, &p).unwrap());
            let what = format!("{name} rows={rows} experts={experts} k={k} renorm={renorm}");
            let got = download_u32(b.as_mut(), &ids, rows * k);
            // The reference breaks the planted ties toward the lower expert.
            for (r, chosen) in want_ids.chunks_exact(k).enumerate() {
                let (a, b) = (r % experts, (r * 7 + 3) % experts);
                if a != b && experts > k {
                    assert_eq!(chosen[k - 1] as usize, a.min(b), "{what} row {r}");
                }
            }
            assert_eq!(got, want_ids, "{what}");
            assert_ulps(
                &what,
                &download_f32(b.as_mut(), &ws, rows * k),
                &want_w,
                1e-5,
            );
        }
    }
}
test_device!(
    route_experts_matches_reference,
    route_experts_matches_reference_cpu,
    route_experts_matches_reference_vulkan
);

/// `rows * k` expert ids over `experts`: distinct within a token, expert 0
/// chosen by every token (one expert with many rows), the last never.
fn routed_ids(rows: usize, k: usize, experts: usize, seed: usize) -> Vec<u32> {
    let mut ids = Vec::with_capacity(rows * k);
    for r in 0..rows {
        ids.push(0);
        let mut e = (r * 5 + seed) % (experts - 2) + 1;
        for _ in 1..k {
            ids.push(e as u32);
            e = e % (experts - 2) + 1;
        }
    }
    ids
}

fn matmul_experts_every_dtype_matches_reference((name, mut b, acts): Rounded) {
    // Tolerance as matmul's: 1e-5 of Σ|w·x| per output, plus what rounding
    // the activations may move it (a decode or a prefill GEMM, whichever
    // the backend takes).
    let experts = 6;
    for dtype in DType::ALL {
        let cols = cols_for(dtype)[0];
        for (n, rows, k, per_slot, with_bias) in [
            (32, 1, 2, false, false),
            (32, 1, 4, true, true),
            (16, 3, 2, true, false),
            (48, 37, 3, false, true),
            (32, 37, 2, true, false),
        ] {
            let seed = (n * 131 + cols + rows) as u64;
            let wb = weight_bytes(dtype, experts * n, cols, seed);
            let slots = rows * k;
            let x_rows = if per_slot { slots } else { rows };
            let x = rand_f32(x_rows * cols, seed + 1);
            let bias = rand_f32(experts * n, seed + 2);
            let bias = with_bias.then_some(bias.as_slice());
            let ids = routed_ids(rows, k, experts, n);
            let p = ExpertsParams {
                rows,
                k,
                experts,
                x_per_slot: per_slot,
            };
            let want = reference::matmul_experts(dtype, &wb, cols, bias, &x, &ids, &p).unwrap();
            let wf = reference::dequantize(dtype, &wb, experts * n, cols).unwrap();

            let w = b.upload_weight(dtype, experts * n, cols, &wb).unwrap();
            let xb = upload_f32(b.as_mut(), &x);
            let bb = bias.map(|v| upload_f32(b.as_mut(), v));
            let ib = upload_u32(b.as_mut(), &ids);
            let yb = b.alloc(slots * n * 4).unwrap();
            pass(b.as_mut(), |b| {
                b.matmul_experts(&w, bb.as_ref(), &xb, &ib, &yb, &p)
                    .unwrap()
            });
            let got = download_f32(b.as_mut(), &yb, slots * n);
            for s in 0..slots {
                let e = ids[s] as usize;
                let xr = if per_slot { s } else { s / k };
                let xr = &x[xr * cols..(xr + 1) * cols];
                for r in 0..n {
                    let wr = &wf[(e * n + r) * cols..(e * n + r + 1) * cols];
                    let mag: f32 = wr.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum::<f32>()
                        + bias.map_or(0.0, |v| v[e * n + r].abs());
                    let bound = activation_bound(acts, dtype, wr, xr, 1).max(activation_bound(
                        acts,
                        dtype,
                        wr,
                        xr,
                        1 << 20,
                    ));
                    let (g, want) = (got[s * n + r], want[s * n + r]);
                    assert!(
                        (g - want).abs() <= 1e-5 * mag + bound + 1e-7,
                        "{name} {dtype} n={n} cols={cols} rows={rows} k={k} per_slot={per_slot} \
                         y[{s},{r}] (expert {e}) = {g}, want {want} (Σ|wx| {mag})"
                    );
                }
            }
            b.free_weight(w);
        }
    }
}
test_device!(
    matmul_experts_every_dtype_matches_reference,
    matmul_experts_every_dtype_matches_reference_cpu: matmul_cpu_backends,
    matmul_experts_every_dtype_matches_reference_vulkan: matmul_vulkan_backends
);

fn sum_experts_matches_reference((name, mut b): Named) {
    // 1e-5 relative plus 1e-6 of the row's Σ|w·y| (f32 sums of k terms).
    for (rows, k, n) in [(1, 2, 64), (7, 8, 100), (33, 4, 2048)] {
        let y = rand_f32(rows * k * n, 3);
        let ws = rand_f32(rows * k, 4);
        let base = rand_f32(rows * n, 5);
        for add in [false, true] {
            let mut want = reference::sum_experts(&y, &ws, k, n);
            if add {
                want = reference::add(&want, &base).unwrap();
            }
            let (yb, wb) = (upload_f32(b.as_mut(), &y), upload_f32(b.as_mut(), &ws));
            let out = upload_f32(b.as_mut(), &base);
            pass(b.as_mut(), |b| {
                b.sum_experts(&yb, &wb, &out, rows, k, n, add).unwrap()
            });
            let got = download_f32(b.as_mut(), &out, rows * n);
            let scale: Vec<f32> = (0..rows * n)
                .map(|i| {
                    let (r, c) = (i / n, i % n);
                    let s: f32 = (0..k)
                        .map(|j| (ws[r * k + j] * y[(r * k + j) * n + c]).abs())
                        .sum();
                    s + want[i].abs() + base[i].abs() * add as u32 as f32
                })
                .collect();
            crate::common::assert_close(
                &format!("{name} rows={rows} k={k} n={n} add={add}"),
                &got,
                &want,
                &scale,
                1e-5,
            );
        }
    }
}
test_device!(
    sum_experts_matches_reference,
    sum_experts_matches_reference_cpu,
    sum_experts_matches_reference_vulkan
);
