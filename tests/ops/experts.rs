//! The mixture-of-experts ops: route_experts, matmul_experts and
//! sum_experts against `vkllm::reference`.

use crate::common::{
    assert_ulps, download_f32, download_u32, pass, rand_f32, upload_f32, upload_u32, weight_bytes,
};
use crate::matmul::{
    activation_bound, matmul_cpu_backends, matmul_vulkan_backends, Rounded, Rounding,
};
use crate::{cols_for, cpu_backends, test_device, vulkan_backends, Named};
use vkllm::backend::{Activation, ComputeBackend, ExpertsParams, RouteParams};
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

fn route_experts_nan_and_signed_zero((name, mut b): Named) {
    // NaN never wins over a number (NaNs come last, the lower first), equal
    // numbers keep the lower expert first, +0 ranks above -0 (the total
    // order the CPU sorts by). Row 1's weights are NaN (its softmax sums a
    // NaN): only its ids are checked.
    let nan = f32::NAN;
    let (experts, k) = (8, 3);
    let logits = [
        [nan, 1.0, 3.0, nan, 3.0, f32::NEG_INFINITY, 0.0, 2.0],
        [nan, nan, nan, nan, nan, nan, nan, 5.0],
        [-0.0, 0.0, -1.0, -0.0, 0.0, -2.0, -3.0, -4.0],
    ];
    let want_ids = [[2, 4, 7], [7, 0, 1], [1, 4, 0]];
    let p = RouteParams {
        rows: 3,
        experts,
        k,
        renorm: true,
    };
    let lb = upload_f32(b.as_mut(), logits.as_flattened());
    let ids = b.alloc(3 * k * 4).unwrap();
    let ws = b.alloc(3 * k * 4).unwrap();
    pass(b.as_mut(), |b| b.route_experts(&lb, &ids, &ws, &p).unwrap());
    let got = download_u32(b.as_mut(), &ids, 3 * k);
    assert_eq!(got, want_ids.as_flattened(), "{name}");
    let w = download_f32(b.as_mut(), &ws, 3 * k);
    let e = |d: f32| d.exp();
    let row0 = [1.0, 1.0, e(-1.0)].map(|v| v / (2.0 + e(-1.0)));
    let row2 = [1.0, 1.0, 1.0].map(|v: f32| v / 3.0);
    for (g, want) in [(&w[..3], row0), (&w[6..], row2)] {
        assert_ulps(&name, g, &want, 1e-6);
    }
    assert!(w[3..6].iter().all(|v| v.is_nan()), "{name}: {w:?}");
}
test_device!(
    route_experts_nan_and_signed_zero,
    route_experts_nan_and_signed_zero_cpu,
    route_experts_nan_and_signed_zero_vulkan
);

fn route_experts_past_the_device_bounds((name, mut b): Named) {
    // 300 experts, or k 17: the CPU routes them; Vulkan's kernel holds up
    // to 256 experts and k 16, and says so.
    for (experts, k) in [(300, 2), (32, 17)] {
        let p = RouteParams {
            rows: 2,
            experts,
            k,
            renorm: false,
        };
        let logits = rand_f32(2 * experts, 9);
        let lb = upload_f32(b.as_mut(), &logits);
        let ids = b.alloc(2 * k * 4).unwrap();
        let ws = b.alloc(2 * k * 4).unwrap();
        b.begin_pass().unwrap();
        let r = b.route_experts(&lb, &ids, &ws, &p);
        b.end_pass().unwrap();
        if name.starts_with("cpu") {
            r.unwrap();
            let (want, _) = reference::route_experts(&logits, &p).unwrap();
            assert_eq!(download_u32(b.as_mut(), &ids, 2 * k), want, "{name}");
            continue;
        }
        match r {
            Err(vkllm::Error::Unsupported(m)) => {
                assert!(m.contains("up to 256 experts and k up to 16"), "{m}")
            }
            other => panic!("{name}: {experts} experts, k {k}: {other:?}"),
        }
    }
}
test_device!(
    route_experts_past_the_device_bounds,
    route_experts_past_the_device_bounds_cpu,
    route_experts_past_the_device_bounds_vulkan
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

/// One matmul_experts shape: `experts` matrices of `n` rows of `dtype`
/// over `cols`, `rows` tokens each routed to `k` slots, x a row per slot
/// (`per_slot`) or per token, with a bias or not.
#[derive(Clone, Copy, Debug)]
struct Shape {
    dtype: DType,
    experts: usize,
    n: usize,
    cols: usize,
    rows: usize,
    k: usize,
    per_slot: bool,
    with_bias: bool,
}

/// Runs `s` routed by `ids` on `b` and checks every slot against the
/// reference: as matmul's tolerance, 1e-5 of Σ|w·x| per output plus what
/// rounding the activations may move it (a decode or a prefill GEMM,
/// whichever the backend takes). A slot whose id is at or past the experts
/// wants zeros (a device that cannot see ids writes them).
fn check_routed(name: &str, b: &mut dyn ComputeBackend, acts: Rounding, s: Shape, ids: &[u32]) {
    let Shape {
        dtype,
        experts,
        n,
        cols,
        rows,
        k,
        per_slot,
        with_bias,
    } = s;
    let seed = (n * 131 + cols + rows + experts) as u64;
    let wb = weight_bytes(dtype, experts * n, cols, seed);
    let slots = rows * k;
    let x_rows = if per_slot { slots } else { rows };
    let x = rand_f32(x_rows * cols, seed + 1);
    let bias = rand_f32(experts * n, seed + 2);
    let bias = with_bias.then_some(bias.as_slice());
    let p = ExpertsParams {
        rows,
        k,
        experts,
        x_per_slot: per_slot,
        glu: None,
    };
    // The reference over valid ids only (a bad id's slot reads expert 0).
    let valid: Vec<u32> = ids
        .iter()
        .map(|&e| if (e as usize) < experts { e } else { 0 })
        .collect();
    let want = reference::matmul_experts(dtype, &wb, cols, bias, &x, &valid, &p).unwrap();
    let wf = reference::dequantize(dtype, &wb, experts * n, cols).unwrap();

    let w = b.upload_weight(dtype, experts * n, cols, &wb).unwrap();
    let xb = upload_f32(b, &x);
    let bb = bias.map(|v| upload_f32(b, v));
    let ib = upload_u32(b, ids);
    // Filled with NaN, so a slot left unwritten fails.
    let yb = upload_f32(b, &vec![f32::NAN; slots * n]);
    pass(b, |b| {
        b.matmul_experts(&w, bb.as_ref(), &xb, &ib, &yb, &p)
            .unwrap()
    });
    let got = download_f32(b, &yb, slots * n);
    for slot in 0..slots {
        let e = ids[slot] as usize;
        let xr = if per_slot { slot } else { slot / k };
        let xr = &x[xr * cols..(xr + 1) * cols];
        for r in 0..n {
            let g = got[slot * n + r];
            if e >= experts {
                assert!(
                    g == 0.0,
                    "{name} {s:?} y[{slot},{r}] (bad id {e}) = {g}, want 0"
                );
                continue;
            }
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
            let want = want[slot * n + r];
            assert!(
                (g - want).abs() <= 1e-5 * mag + bound + 1e-7,
                "{name} {s:?} y[{slot},{r}] (expert {e}) = {g}, want {want} (Σ|wx| {mag})"
            );
        }
    }
    b.free_weight(w);
}

fn matmul_experts_every_dtype_matches_reference((name, mut b, acts): Rounded) {
    let experts = 6;
    for dtype in DType::ALL {
        let cols = cols_for(dtype)[0];
        for (n, rows, k, per_slot, with_bias) in [
            (32, 1, 2, false, false),
            (32, 1, 4, true, true),
            (16, 3, 2, true, false),
            (16, 4, 2, false, true),
            (48, 37, 3, false, true),
            (32, 37, 2, true, false),
            // Expert 0 takes all 130 rows: more than one row tile of every
            // GEMM (16, 64, 128 rows).
            (32, 130, 2, false, true),
        ] {
            let s = Shape {
                dtype,
                experts,
                n,
                cols,
                rows,
                k,
                per_slot,
                with_bias,
            };
            check_routed(&name, b.as_mut(), acts, s, &routed_ids(rows, k, experts, n));
        }
    }
}
test_device!(
    matmul_experts_every_dtype_matches_reference,
    matmul_experts_every_dtype_matches_reference_cpu: matmul_cpu_backends,
    matmul_experts_every_dtype_matches_reference_vulkan: matmul_vulkan_backends
);

/// `rows * k` ids over `experts`, spread by a hash (a token may repeat an
/// expert: the op takes any ids), the first slot of each token one of
/// three experts, so those take many rows.
fn hashed_ids(rows: usize, k: usize, experts: usize) -> Vec<u32> {
    (0..rows * k)
        .map(|s| match s % k {
            0 => (s / k % 3) as u32,
            _ => ((s * 2_654_435_761) % 1_000_003 % experts) as u32,
        })
        .collect()
}

fn matmul_experts_many_experts_match_reference((name, mut b, acts): Rounded) {
    // Qwen3-MoE's routing (128 experts, k 8) at decode and prefill sizes,
    // and 8 experts with more than 128 rows each over a wide weight: the
    // cooperative-matrix GEMM's large tile where the device has one.
    for dtype in [DType::F16, DType::Q8_0, DType::Q4K, DType::Q6K] {
        let cols = cols_for(dtype)[0];
        for (experts, n, rows, k) in [(128, 16, 1, 8), (128, 16, 3, 8), (128, 16, 40, 8)] {
            let s = Shape {
                dtype,
                experts,
                n,
                cols,
                rows,
                k,
                per_slot: false,
                with_bias: true,
            };
            check_routed(&name, b.as_mut(), acts, s, &hashed_ids(rows, k, experts));
        }
    }
    let s = Shape {
        dtype: DType::Q4_0,
        experts: 8,
        n: 1536,
        cols: 64,
        rows: 600,
        k: 2,
        per_slot: true,
        with_bias: false,
    };
    check_routed(
        &name,
        b.as_mut(),
        acts,
        s,
        &hashed_ids(s.rows, s.k, s.experts),
    );
}
test_device!(
    matmul_experts_many_experts_match_reference,
    matmul_experts_many_experts_match_reference_cpu: matmul_cpu_backends,
    matmul_experts_many_experts_match_reference_vulkan: matmul_vulkan_backends
);

fn matmul_experts_bad_ids((name, mut b, acts): Rounded) {
    // Ids at and past the experts: the CPU, which sees them, refuses the
    // op; a device writes zeros in their slots and the rest as usual, on
    // the GEMV (2 rows) and the GEMM (20 rows).
    let experts = 6;
    for rows in [2, 20] {
        let k = 2;
        let mut ids = routed_ids(rows, k, experts, 3);
        for (i, bad) in [6, 7, 1000, u32::MAX].into_iter().enumerate() {
            ids[(i * 5 + 1) % (rows * k)] = bad;
        }
        let s = Shape {
            dtype: DType::Q8_0,
            experts,
            n: 40,
            cols: 64,
            rows,
            k,
            per_slot: false,
            with_bias: true,
        };
        if !name.starts_with("cpu") {
            check_routed(&name, b.as_mut(), acts, s, &ids);
            continue;
        }
        let wb = weight_bytes(s.dtype, experts * s.n, s.cols, 1);
        let w = b
            .upload_weight(s.dtype, experts * s.n, s.cols, &wb)
            .unwrap();
        let xb = upload_f32(b.as_mut(), &rand_f32(rows * s.cols, 2));
        let ib = upload_u32(b.as_mut(), &ids);
        let yb = b.alloc(rows * k * s.n * 4).unwrap();
        let p = ExpertsParams {
            rows,
            k,
            experts,
            x_per_slot: false,
            glu: None,
        };
        b.begin_pass().unwrap();
        let r = b.matmul_experts(&w, None, &xb, &ib, &yb, &p);
        b.end_pass().unwrap();
        let e = r.expect_err("the CPU refuses ids past the experts");
        assert!(e.to_string().contains("past the 6 experts"), "{name}: {e}");
        b.free_weight(w);
    }
}
test_device!(
    matmul_experts_bad_ids,
    matmul_experts_bad_ids_cpu: matmul_cpu_backends,
    matmul_experts_bad_ids_vulkan: matmul_vulkan_backends
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

/// A GLU of each expert's gate and up rows (`ExpertsParams::glu`) against
/// the same backend's matmul_experts of those rows without it (checked
/// against the reference above) and the f64 GLU of its outputs: within
/// 1e-5 of `|act(g)·u| + |g·u|` (the GEMV's own GLU sums as its plain
/// GEMV does). Gates and ups past ±7, so SwiGLU-OAI's clamps matter.
fn matmul_experts_glu_matches_unfused((name, mut b, _): Rounded) {
    let experts = 6;
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
        DType::MXFP4,
    ] {
        let cols = cols_for(dtype)[0];
        for (half, rows, k, with_bias) in [
            (16, 1, 2, false),
            (32, 1, 4, true),
            (16, 3, 2, false),
            (32, 37, 3, true),
        ] {
            let n = 2 * half;
            let seed = (n * 7 + cols + rows) as u64;
            let wb = weight_bytes(dtype, experts * n, cols, seed);
            let x: Vec<f32> = rand_f32(rows * cols, seed + 1)
                .iter()
                .map(|v| v * 40.0)
                .collect();
            let bias: Vec<f32> = rand_f32(experts * n, seed + 2)
                .iter()
                .map(|v| v * 8.0)
                .collect();
            let ids = routed_ids(rows, k, experts, half);
            let w = b.upload_weight(dtype, experts * n, cols, &wb).unwrap();
            let xb = upload_f32(b.as_mut(), &x);
            let bb = with_bias.then(|| upload_f32(b.as_mut(), &bias));
            let ib = upload_u32(b.as_mut(), &ids);
            let slots = rows * k;
            for act in [Activation::Silu, Activation::SwigluOai] {
                let plain = ExpertsParams {
                    rows,
                    k,
                    experts,
                    x_per_slot: false,
                    glu: None,
                };
                let fused = ExpertsParams {
                    glu: Some(act),
                    ..plain
                };
                let full = b.alloc(slots * n * 4).unwrap();
                let yb = upload_f32(b.as_mut(), &vec![f32::NAN; slots * half]);
                pass(b.as_mut(), |b| {
                    b.matmul_experts(&w, bb.as_ref(), &xb, &ib, &full, &plain)
                        .unwrap();
                    b.matmul_experts(&w, bb.as_ref(), &xb, &ib, &yb, &fused)
                        .unwrap();
                });
                let full = download_f32(b.as_mut(), &full, slots * n);
                let got = download_f32(b.as_mut(), &yb, slots * half);
                let (gates, ups): (Vec<f32>, Vec<f32>) = full
                    .chunks_exact(n)
                    .map(|r| r.split_at(half))
                    .fold((Vec::new(), Vec::new()), |(mut g, mut u), (a, c)| {
                        g.extend_from_slice(a);
                        u.extend_from_slice(c);
                        (g, u)
                    });
                let want = reference::glu(act, &gates, Some(&ups)).unwrap();
                let clamped = gates.iter().chain(&ups).any(|v| v.abs() > 7.0);
                assert!(clamped, "{name} {dtype}: no value past the clamp");
                let scale: Vec<f32> = gates
                    .iter()
                    .zip(&ups)
                    .zip(&want)
                    .map(|((g, u), w)| w.abs() + (g * u).abs() + (g.abs() + u.abs()) * 0.1)
                    .collect();
                crate::common::assert_close(
                    &format!(
                        "{name} {dtype} {act:?} half={half} rows={rows} k={k} bias={with_bias}"
                    ),
                    &got,
                    &want,
                    &scale,
                    1e-5,
                );
            }
            b.free_weight(w);
        }
    }
}
test_device!(
    matmul_experts_glu_matches_unfused,
    matmul_experts_glu_matches_unfused_cpu: matmul_cpu_backends,
    matmul_experts_glu_matches_unfused_vulkan: matmul_vulkan_backends
);
