//! The ops of one value or one row at a time: embedding, glu, add, scale,
//! copy, argmax.

use crate::common::{
    assert_ulps, download_f32, download_u32, max_abs_diff, pass, rand_f32, upload_f32, upload_u32,
    weight_bytes,
};
use crate::{cols_for, cpu_backends, test_device, vulkan_backends, Named};
use vkllm::backend::Activation;
use vkllm::{reference, DType};

fn embedding_every_dtype_matches_reference((name, mut b): Named) {
    // The CPU dequantizes with ggml's exact operations, so its rows must be
    // bit-identical to the reference. Other backends may fuse `q*d + m` into
    // one rounding: 1e-6 of each value allows that, nothing more.
    for dtype in DType::ALL {
        // Besides the block lengths, 256 columns (whole blocks of every type).
        let mut widths = cols_for(dtype);
        if !widths.contains(&256) {
            widths.push(256);
        }
        for cols in widths {
            let rows = 19;
            let tb = weight_bytes(dtype, rows, cols, 3 + cols as u64);
            let ids = [0u32, 18, 5, 5, 11];
            let want = reference::embedding(dtype, &tb, rows, cols, &ids).unwrap();
            let w = b.upload_weight(dtype, rows, cols, &tb).unwrap();
            let idb = upload_u32(b.as_mut(), &ids);
            let out = b.alloc(ids.len() * cols * 4).unwrap();
            pass(b.as_mut(), |b| {
                b.embedding(&w, &idb, &out, ids.len()).unwrap()
            });
            let got = download_f32(b.as_mut(), &out, ids.len() * cols);
            let what = format!("{name} {dtype} cols={cols}");
            if name.starts_with("cpu") {
                assert_eq!(got, want, "{what}");
            } else {
                assert_ulps(&what, &got, &want, 1e-6);
            }
            b.free_weight(w);
        }
    }
}
test_device!(
    embedding_every_dtype_matches_reference,
    embedding_every_dtype_matches_reference_cpu,
    embedding_every_dtype_matches_reference_vulkan
);

fn glu_silu_and_gelu((name, mut b): Named) {
    // Tolerance: 1e-5 relative plus 1e-6 absolute (f32 exp/tanh vs f64), and
    // never more than 1e-5 absolute (gates reach 8). An odd length and a
    // longer one.
    for n in [1001, 5000] {
        let gate: Vec<f32> = rand_f32(n, 31).iter().map(|v| v * 8.0).collect();
        let up = rand_f32(n, 32);
        let (gb, ub) = (upload_f32(b.as_mut(), &gate), upload_f32(b.as_mut(), &up));
        for act in [Activation::Silu, Activation::GeluTanh] {
            for with_up in [true, false] {
                let want = reference::glu(act, &gate, with_up.then_some(&up[..])).unwrap();
                let out = b.alloc(n * 4).unwrap();
                pass(b.as_mut(), |b| {
                    b.glu(act, &gb, with_up.then_some(&ub), &out, n).unwrap()
                });
                let got = download_f32(b.as_mut(), &out, n);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let tol = (1e-5 * w.abs() + 1e-6).min(1e-5);
                    assert!(
                        (g - w).abs() <= tol,
                        "{name} {act:?} n={n} up={with_up} [{i}] {g} vs {w}"
                    );
                }
                b.free(out);
            }
        }
        b.free(gb);
        b.free(ub);
    }
}
test_device!(
    glu_silu_and_gelu,
    glu_silu_and_gelu_cpu,
    glu_silu_and_gelu_vulkan
);

fn glu_relu2((name, mut b): Named) {
    // BitNet's squared ReLU: max(g, 0)² (· up), one f32 rounding per
    // product against f64, so within 2 ulps; negative gates give exact zeros.
    for n in [1001, 5000] {
        let gate: Vec<f32> = rand_f32(n, 35).iter().map(|v| v * 8.0).collect();
        let up = rand_f32(n, 36);
        assert!(gate.iter().any(|g| *g < 0.0) && gate.iter().any(|g| *g > 0.0));
        let (gb, ub) = (upload_f32(b.as_mut(), &gate), upload_f32(b.as_mut(), &up));
        for with_up in [true, false] {
            let want =
                reference::glu(Activation::Relu2, &gate, with_up.then_some(&up[..])).unwrap();
            let out = b.alloc(n * 4).unwrap();
            pass(b.as_mut(), |b| {
                b.glu(Activation::Relu2, &gb, with_up.then_some(&ub), &out, n)
                    .unwrap()
            });
            let got = download_f32(b.as_mut(), &out, n);
            for (i, ((g, w), x)) in got.iter().zip(&want).zip(&gate).enumerate() {
                if *x <= 0.0 {
                    assert_eq!(*g, 0.0, "{name} relu2 n={n} up={with_up} [{i}]");
                }
                assert!(
                    (g - w).abs() <= 2.5e-7 * w.abs(),
                    "{name} relu2 n={n} up={with_up} [{i}] {g} vs {w}"
                );
            }
            b.free(out);
        }
        b.free(gb);
        b.free(ub);
    }
}
test_device!(glu_relu2, glu_relu2_cpu, glu_relu2_vulkan);

fn round_i8_matches_reference((name, mut b): Named) {
    // BitNet's per-token int8 rounding. Rows: random ones of several widths
    // (one past a workgroup's 128, 2560 as the 2B model's), one of zeros
    // (its scale's floor of 1e-5 keeps them zero), and one whose largest
    // value is 127 so its scale is 1 and its values lie on ties (0.5 → 0,
    // 1.5 → 2, -2.5 → -2: to even). The CPU computes the reference's f32
    // arithmetic bit for bit; a GPU's division may be 2.5 ulps off, which
    // can move a value lying within 1e-4 of a level's tie by one level, so
    // there the result must be one of the two levels. In place too.
    let ties = {
        let mut r = vec![127.0f32, 0.5, 1.5, -2.5, 3.5, -0.5, 126.5, -126.5];
        r.resize(40, 0.25);
        r
    };
    for (rows, dim, data) in [
        (3, 129, None),
        (2, 2560, None),
        (5, 40, None),
        (1, 40, Some(vec![0f32; 40])),
        (1, 40, Some(ties)),
    ] {
        let x = data.unwrap_or_else(|| {
            rand_f32(rows * dim, dim as u64)
                .iter()
                .map(|v| v * 6.0)
                .collect()
        });
        let want = reference::round_i8(&x, dim).unwrap();
        for in_place in [false, true] {
            let xb = upload_f32(b.as_mut(), &x);
            let out = if in_place {
                xb
            } else {
                b.alloc(x.len() * 4).unwrap()
            };
            pass(b.as_mut(), |b| b.round_i8(&xb, &out, rows, dim).unwrap());
            let got = download_f32(b.as_mut(), &out, x.len());
            let what = format!("{name} rows={rows} dim={dim} in_place={in_place}");
            if name.starts_with("cpu") {
                assert_eq!(got, want, "{what}");
            } else {
                for (r, (gr, wr)) in got.chunks(dim).zip(want.chunks(dim)).enumerate() {
                    let xr = &x[r * dim..(r + 1) * dim];
                    let amax = xr.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-5);
                    let s = 127.0 / amax;
                    for (i, (g, w)) in gr.iter().zip(wr).enumerate() {
                        let v = xr[i] as f64 * s;
                        let near_tie = ((v - v.floor()) - 0.5).abs() < 1e-4;
                        let level = 1.0 / s;
                        let ok = if near_tie {
                            ((*g as f64 - *w as f64).abs() - level).abs() < 1e-5 * level.max(1.0)
                                || (g - w).abs() <= 1e-6 * w.abs()
                        } else {
                            (g - w).abs() <= 1e-6 * w.abs()
                        };
                        assert!(ok, "{what} [{r}, {i}]: {g} vs {w} (x {})", xr[i]);
                    }
                }
            }
            if !in_place {
                b.free(out);
            }
            b.free(xb);
        }
    }
    // The tie row rounds to even.
    let t = reference::round_i8(&[127.0, 0.5, 1.5, -2.5], 4).unwrap();
    assert_eq!(t, vec![127.0, 0.0, 2.0, -2.0]);
}
test_device!(
    round_i8_matches_reference,
    round_i8_matches_reference_cpu,
    round_i8_matches_reference_vulkan
);

fn glu_swiglu_oai_clamps((name, mut b): Named) {
    // gpt-oss's SwiGLU: gates in [-10, 10] and ups in [-10, 10], so both
    // clamps (gate above 7, up beyond ±7) are reached, which the test
    // checks of its data; the result must differ from the unclamped SwiGLU
    // there. Tolerance: 1e-5 relative plus 1e-6 absolute (f32 exp vs f64;
    // outputs reach 7·8 = 56, so no absolute cap as for SiLU). Without up
    // the op is an error.
    for n in [1001, 5000] {
        let gate: Vec<f32> = rand_f32(n, 33).iter().map(|v| v * 10.0).collect();
        let up: Vec<f32> = rand_f32(n, 34).iter().map(|v| v * 10.0).collect();
        assert!(gate.iter().any(|g| *g > 7.5), "no gate past the clamp");
        assert!(up.iter().any(|u| *u > 7.5), "no up past the clamp");
        assert!(up.iter().any(|u| *u < -7.5), "no up below the clamp");
        let want = reference::glu(Activation::SwigluOai, &gate, Some(&up)).unwrap();
        // Unclamped: g·sigmoid(1.702 g)·(u + 1).
        let loose: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(&g, &u)| g / (1.0 + (-1.702 * g).exp()) * (u + 1.0))
            .collect();
        assert!(
            max_abs_diff(&want, &loose) > 1.0,
            "the clamps change nothing"
        );
        let (gb, ub) = (upload_f32(b.as_mut(), &gate), upload_f32(b.as_mut(), &up));
        let out = b.alloc(n * 4).unwrap();
        pass(b.as_mut(), |b| {
            b.glu(Activation::SwigluOai, &gb, Some(&ub), &out, n)
                .unwrap()
        });
        let got = download_f32(b.as_mut(), &out, n);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = 1e-5 * w.abs() + 1e-6;
            assert!(
                (g - w).abs() <= tol,
                "{name} SwigluOai n={n} [{i}] gate {} up {}: {g} vs {w}",
                gate[i],
                up[i]
            );
        }
        b.begin_pass().unwrap();
        let r = b.glu(Activation::SwigluOai, &gb, None, &out, n);
        b.end_pass().unwrap();
        assert!(r.is_err(), "{name}: SwigluOai without up accepted");
        for buf in [gb, ub, out] {
            b.free(buf);
        }
    }
}
test_device!(
    glu_swiglu_oai_clamps,
    glu_swiglu_oai_clamps_cpu,
    glu_swiglu_oai_clamps_vulkan
);

fn add_scale_copy_and_aliasing((name, mut b): Named) {
    // Exact: one f32 operation per value. 300,001 values: the CPU's adds
    // in chunks on its team, the last one ragged.
    for n in [777, 5000, 300_001] {
        let (x, y) = (rand_f32(n, 41), rand_f32(n, 42));
        let (xb, yb, out) = (
            upload_f32(b.as_mut(), &x),
            upload_f32(b.as_mut(), &y),
            b.alloc(n * 4).unwrap(),
        );
        pass(b.as_mut(), |b| {
            b.add(&xb, &yb, &out, n).unwrap();
            b.scale(&yb, 0.5, &yb, n).unwrap(); // in place
            b.add(&xb, &yb, &xb, n).unwrap(); // residual form: out aliases a
            b.scale(&xb, 0.5, &xb, n).unwrap(); // in place, after the aliased add
        });
        assert_eq!(
            download_f32(b.as_mut(), &out, n),
            reference::add(&x, &y).unwrap(),
            "{name} n={n} add"
        );
        let y_half = reference::scale(&y, 0.5);
        assert_eq!(
            download_f32(b.as_mut(), &yb, n),
            y_half,
            "{name} n={n} scale in place"
        );
        let sum = reference::add(&x, &y_half).unwrap();
        assert_eq!(
            download_f32(b.as_mut(), &xb, n),
            reference::scale(&sum, 0.5),
            "{name} n={n} add aliased, then scale in place"
        );
        for buf in [xb, yb, out] {
            b.free(buf);
        }
    }

    // copy: a KV-cache append at a row offset, and a copy between offsets
    // inside both buffers; the rest of the fresh destination stays zero.
    let y = rand_f32(32, 42);
    let src = upload_f32(b.as_mut(), &y);
    // (source offset, destination offset, length), in bytes.
    for (from, to, len) in [(0, 3 * 8 * 4, 16 * 4), (8, 16, 20)] {
        let dst = b.alloc(80 * 4).unwrap();
        pass(b.as_mut(), |b| b.copy(&src, from, &dst, to, len).unwrap());
        let got = download_f32(b.as_mut(), &dst, 80);
        let (at, n) = (to / 4, len / 4);
        let what = format!("{name} copy {len} bytes from {from} to {to}");
        assert_eq!(&got[at..at + n], &y[from / 4..from / 4 + n], "{what}");
        assert!(
            got[..at].iter().chain(&got[at + n..]).all(|v| *v == 0.0),
            "{what}: spill"
        );
        b.free(dst);
    }
}
test_device!(
    add_scale_copy_and_aliasing,
    add_scale_copy_and_aliasing_cpu,
    add_scale_copy_and_aliasing_vulkan
);

/// Vulkan's scale (also the copy probe's streaming kernel) loops its grid
/// of at most 1024 workgroups, 4 vec4s per invocation and pass: 9M values
/// take three passes, the last partial, and a 3-value tail.
fn scale_streams_past_its_grid((name, mut b): Named) {
    let n = 9_000_003;
    let x = rand_f32(n, 43);
    let xb = upload_f32(b.as_mut(), &x);
    let out = b.alloc(n * 4).unwrap();
    pass(b.as_mut(), |b| b.scale(&xb, -1.5, &out, n).unwrap());
    let got = download_f32(b.as_mut(), &out, n);
    let want = reference::scale(&x, -1.5);
    let wrong = got.iter().zip(&want).filter(|(g, w)| g != w).count();
    assert_eq!(wrong, 0, "{name}: {wrong} of {n} values differ");
}
test_device!(
    scale_streams_past_its_grid,
    scale_streams_past_its_grid_cpu,
    scale_streams_past_its_grid_vulkan
);

fn argmax_first_on_ties((name, mut b): Named) {
    // Per row length, four rows: a tie (the first index wins), the maximum
    // at the last index, all values equal (0), the maximum at index 0.
    for (n, [first, second]) in [(50usize, [3, 7]), (1000, [5, 700])] {
        let mut x = rand_f32(4 * n, 51 + n as u64);
        x[first] = 5.0;
        x[second] = 5.0;
        x[2 * n - 1] = 2.0;
        x[2 * n..3 * n].fill(-1.0);
        x[3 * n] = 2.5;
        let want = reference::argmax(&x, n).unwrap();
        assert_eq!(want, vec![first as u32, n as u32 - 1, 0, 0], "n={n}");
        let xb = upload_f32(b.as_mut(), &x);
        let out = b.alloc(4 * 4).unwrap();
        pass(b.as_mut(), |b| b.argmax(&xb, None, &out, 4, n).unwrap());
        assert_eq!(download_u32(b.as_mut(), &out, 4), want, "{name} n={n}");
    }
}
test_device!(
    argmax_first_on_ties,
    argmax_first_on_ties_cpu,
    argmax_first_on_ties_vulkan
);

fn argmax_vocab_rows_split_over_workgroups((name, mut b): Named) {
    // Decode-sized rows (SmolLM2's and Llama-3's vocabularies, one and a few
    // rows), so the Vulkan backend splits each row over many workgroups:
    // ties across workgroup slices keep the first index, NaNs never win (a
    // row that starts with NaN still finds its maximum), -inf rows give 0.
    for n in [49152usize, 128256] {
        let rows = 4;
        let mut x = rand_f32(rows * n, 53);
        let mut want = vec![0u32; rows];
        // Row 0: equal maxima in distant slices (and at both ends).
        for i in [n - 1, 40_000, 1_000, 777] {
            x[i] = 9.0;
        }
        want[0] = 777;
        // Row 1: NaNs everywhere else, including first and beyond the max.
        let r1 = &mut x[n..2 * n];
        for (i, v) in r1.iter_mut().enumerate() {
            if i % 3 == 0 {
                *v = f32::NAN;
            }
        }
        r1[n - 2] = 7.5;
        want[1] = n as u32 - 2;
        // Row 2: all -inf; row 3: all NaN (nothing wins: 0).
        x[2 * n..3 * n].fill(f32::NEG_INFINITY);
        x[3 * n..4 * n].fill(f32::NAN);
        let xb = upload_f32(b.as_mut(), &x);
        let out = b.alloc(rows * 4).unwrap();
        pass(b.as_mut(), |b| b.argmax(&xb, None, &out, rows, n).unwrap());
        assert_eq!(download_u32(b.as_mut(), &out, rows), want, "{name} n={n}");
        // One row (decode), against the reference.
        let one = rand_f32(n, 54);
        let ob = upload_f32(b.as_mut(), &one);
        pass(b.as_mut(), |b| b.argmax(&ob, None, &out, 1, n).unwrap());
        assert_eq!(
            download_u32(b.as_mut(), &out, 1),
            reference::argmax(&one, n).unwrap(),
            "{name} n={n} one row"
        );
    }
}
test_device!(
    argmax_vocab_rows_split_over_workgroups,
    argmax_vocab_rows_split_over_workgroups_cpu,
    argmax_vocab_rows_split_over_workgroups_vulkan
);

fn argmax_among_allowed_ids((name, mut b): Named) {
    // A grammar's mask: per row, a random half of the ids allowed, then
    // row 0's maximum forbidden (the best allowed wins), row 1 a tie of
    // allowed values in distant slices (the first wins) beside a larger
    // forbidden one, row 2 nothing allowed (0), row 3 only NaNs allowed (0).
    for n in [50usize, 1000, 128256] {
        let rows = 4;
        let words = n.div_ceil(32);
        let mut x = rand_f32(rows * n, 61 + n as u64);
        let mut allow: Vec<u32> = rand_f32(rows * words, 62)
            .iter()
            .map(|v| v.to_bits() ^ (v.to_bits() >> 7))
            .collect();
        let set = |a: &mut Vec<u32>, r: usize, i: usize, on: bool| {
            let (w, bit) = (r * words + i / 32, 1u32 << (i % 32));
            a[w] = if on { a[w] | bit } else { a[w] & !bit };
        };
        // Ids past n in the last word are never read.
        let top = (0..n)
            .max_by(|&i, &j| x[i].total_cmp(&x[j]).then(j.cmp(&i)))
            .unwrap_or(0);
        set(&mut allow, 0, top, false);
        let (a, c) = (n / 7, n - 2);
        x[n + a] = 8.0;
        x[n + c] = 8.0;
        x[n + n / 2] = 9.0;
        set(&mut allow, 1, a, true);
        set(&mut allow, 1, c, true);
        set(&mut allow, 1, n / 2, false);
        allow[2 * words..3 * words].fill(0);
        x[3 * n..4 * n].fill(f32::NAN);
        let allowed = |r: usize, i: usize| allow[r * words + i / 32] >> (i % 32) & 1 == 1;
        let want = reference::argmax_allowed(&x, n, &allowed).unwrap();
        assert_ne!(want[0] as usize, top, "n={n}");
        assert_eq!(&want[1..], &[a as u32, 0, 0], "n={n}");
        let xb = upload_f32(b.as_mut(), &x);
        let ab = upload_u32(b.as_mut(), &allow);
        let out = b.alloc(rows * 4).unwrap();
        pass(b.as_mut(), |b| {
            b.argmax(&xb, Some(&ab), &out, rows, n).unwrap()
        });
        assert_eq!(download_u32(b.as_mut(), &out, rows), want, "{name} n={n}");
        // A mask shorter than the rows is refused.
        let short = upload_u32(b.as_mut(), &allow[..rows * words - 1]);
        b.begin_pass().unwrap();
        let err = b.argmax(&xb, Some(&short), &out, rows, n);
        b.end_pass().unwrap();
        assert!(err.is_err(), "{name} n={n}: a short mask was taken");
    }
}
test_device!(
    argmax_among_allowed_ids,
    argmax_among_allowed_ids_cpu,
    argmax_among_allowed_ids_vulkan
);
