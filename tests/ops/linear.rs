//! `linear` and `linear_glu`: matmul with the norm, bias, residual add and
//! GLU folded in, and matmuls of one input sharing the work derived from it.

use crate::common::{download_f32, pass, rand_f32, upload_f32, weight_bytes};
use crate::matmul::{activation_bound, matmul_cpu_backends, matmul_vulkan_backends, Rounded};
use crate::test_device;
use vkllm::backend::{Activation, ComputeBackend, LinearOpts, Projection};
use vkllm::{reference, DType};

fn linear_folds_norm_bias_and_residual_add((name, mut b, acts): Rounded) {
    // y_old + rms_norm(x)·Wᵀ + b. Tolerance: 1e-5 of Σ|w·x̂| + |b| (as
    // matmul; the norm's scale carries its own f32 rounding, well inside
    // that) plus one rounding of the add.
    let eps = 1e-5;
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
        DType::Q5K,
        DType::TQ1_0,
        DType::TQ2_0,
        // The block-by-block GEMVs of the other types (quants/types.rs lanes).
        DType::IQ4NL,
        DType::IQ4XS,
        DType::MXFP4,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2K,
        DType::Q3K,
        DType::IQ2XXS,
        DType::IQ2XS,
        DType::IQ2S,
        DType::IQ3XXS,
        DType::IQ3S,
    ] {
        // At 2560 columns the int8 quantize spreads a row over three
        // workgroups (the last one ragged), each with its share of Σx².
        for (rows, cols, m) in [
            (37, 512, 1),
            (64, 512, 2),
            (9, 512, 4),
            (21, 512, 7),
            (5, 2560, 1),
            (3, 2560, 4),
            (6, 512, 36),
        ] {
            let wb = weight_bytes(dtype, rows, cols, (rows * 7 + cols) as u64);
            let wf = reference::dequantize(dtype, &wb, rows, cols).unwrap();
            let x: Vec<f32> = rand_f32(m * cols, 71).iter().map(|v| v * 3.0).collect();
            let nw: Vec<f32> = rand_f32(cols, 72).iter().map(|v| 1.0 + v).collect();
            let bias = rand_f32(rows, 73);
            let y_old = rand_f32(m * rows, 74);
            let xn = reference::rms_norm(&x, &nw, cols, eps).unwrap();
            let prod = reference::matmul(dtype, &wb, rows, cols, Some(&bias), &xn, m).unwrap();
            let want = reference::add(&y_old, &prod).unwrap();

            let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
            let (xb, nwb, bb, yb) = (
                upload_f32(b.as_mut(), &x),
                upload_f32(b.as_mut(), &nw),
                upload_f32(b.as_mut(), &bias),
                upload_f32(b.as_mut(), &y_old),
            );
            let opts = LinearOpts {
                bias: Some(&bb),
                norm: Some((&nwb, eps)),
                add: true,
            };
            pass(b.as_mut(), |b| b.linear(&w, &xb, &yb, m, &opts).unwrap());
            let got = download_f32(b.as_mut(), &yb, m * rows);
            for i in 0..m {
                let xr = &xn[i * cols..(i + 1) * cols];
                for r in 0..rows {
                    let wr = &wf[r * cols..(r + 1) * cols];
                    let mag: f32 =
                        wr.iter().zip(xr).map(|(a, c)| (a * c).abs()).sum::<f32>() + bias[r].abs();
                    let bound = activation_bound(acts, dtype, wr, xr, m);
                    let (g, e) = (got[i * rows + r], want[i * rows + r]);
                    assert!(
                        (g - e).abs() <= 1e-5 * mag + bound + 1e-6 * e.abs() + 1e-7,
                        "{name} {dtype} [{rows}x{cols}] m={m} y[{i},{r}] = {g}, want {e} (Σ|wx| {mag})"
                    );
                }
            }
            // Without norm, bias or add it is plain matmul.
            pass(b.as_mut(), |b| {
                b.linear(&w, &xb, &yb, m, &LinearOpts::default()).unwrap()
            });
            let plain = download_f32(b.as_mut(), &yb, m * rows);
            let yb2 = b.alloc(m * rows * 4).unwrap();
            pass(b.as_mut(), |b| b.matmul(&w, None, &xb, &yb2, m).unwrap());
            assert_eq!(
                plain,
                download_f32(b.as_mut(), &yb2, m * rows),
                "{name} {dtype} plain"
            );
            b.free_weight(w);
        }
    }
}
test_device!(
    linear_folds_norm_bias_and_residual_add,
    linear_folds_norm_bias_and_residual_add_cpu: matmul_cpu_backends,
    linear_folds_norm_bias_and_residual_add_vulkan: matmul_vulkan_backends
);

fn matmuls_of_one_input_share_it_until_it_changes((name, mut b, _): Rounded) {
    // A pass of matmuls that read one input (as Q, K and V do) may share
    // work derived from it (Vulkan quantizes it once for decode, norms it and
    // converts it to f16 once for the tiled GEMM), but must see every change:
    // other norm weights, other rows, or a write to the input. Each product
    // must equal, bit for bit, the same product in a pass of its own. Cases:
    // decode rows (1, 2), tiled rows (8, 16), and a 2048 x 2048 weight
    // (the cooperative-matrix GEMM takes x as f16 there).
    let eps = 1e-5;
    let cases = [
        (512, 40, [1, 2], &[DType::Q4K, DType::Q4_0, DType::F16][..]),
        (512, 40, [8, 16], &[DType::Q4K, DType::Q4_0, DType::F16][..]),
        (2048, 2048, [8, 16], &[DType::Q4_0][..]),
    ];
    for (cols, rows, [m1, m2], dtypes) in cases {
        for &dtype in dtypes {
            let w: Vec<_> = (0..2)
                .map(|i| {
                    let wb = weight_bytes(dtype, rows, cols, 90 + i);
                    b.upload_weight(dtype, rows, cols, &wb).unwrap()
                })
                .collect();
            let x0 = rand_f32(m2 * cols, 91);
            let (xb, x0b, zb) = (
                upload_f32(b.as_mut(), &x0),
                upload_f32(b.as_mut(), &x0),
                upload_f32(b.as_mut(), &rand_f32(m2 * cols, 92)),
            );
            let nw = [93, 94].map(|s| upload_f32(b.as_mut(), &rand_f32(cols, s)));
            let opts = |i: usize| LinearOpts {
                norm: Some((&nw[i], eps)),
                ..LinearOpts::default()
            };
            // (weight, norm weights, rows of x, after x += z)
            let steps = [
                (0, Some(0), m1, false),
                (1, Some(0), m1, false),
                (1, Some(1), m1, false),
                (0, None, m1, false),
                (1, None, m2, false),
                (0, Some(0), m1, false),
                (0, None, m2, true),
                (1, Some(0), m1, true),
                (0, Some(0), m1, true),
            ];
            let ys: Vec<_> = steps
                .iter()
                .map(|_| b.alloc(m2 * rows * 4).unwrap())
                .collect();
            let run = |b: &mut dyn ComputeBackend, i: usize, x: &vkllm::backend::Buffer| {
                let (wi, norm, m, _) = steps[i];
                let o = norm.map_or(LinearOpts::default(), opts);
                b.linear(&w[wi], x, &ys[i], m, &o).unwrap();
            };
            pass(b.as_mut(), |b| {
                for i in 0..steps.len() {
                    if i == 6 {
                        b.add(&xb, &zb, &xb, m2 * cols).unwrap();
                    }
                    run(b, i, &xb);
                }
            });
            let shared: Vec<_> = ys
                .iter()
                .map(|y| download_f32(b.as_mut(), y, m2 * rows))
                .collect();
            for (i, step) in steps.iter().enumerate() {
                let x = if step.3 { &xb } else { &x0b };
                pass(b.as_mut(), |b| run(b, i, x));
                let alone = download_f32(b.as_mut(), &ys[i], m2 * rows);
                assert_eq!(
                    shared[i], alone,
                    "{name} {dtype} {rows}x{cols} step {i} {step:?}"
                );
            }
        }
    }
}
test_device!(
    matmuls_of_one_input_share_it_until_it_changes,
    matmuls_of_one_input_share_it_until_it_changes_cpu: matmul_cpu_backends,
    matmuls_of_one_input_share_it_until_it_changes_vulkan: matmul_vulkan_backends
);

fn linear_glu_matches_separate_projections((name, mut b, acts): Rounded) {
    // out = act(x̂·Gᵀ) ⊙ (x̂·Uᵀ). Each product may be off by its matmul bound
    // e = 1e-5·Σ|w·x̂| (+ the activation rounding of CPU modes); the result
    // then by |act'|·e_g·|u| + |act(g)|·e_u with |act'| < 1.2 for SiLU,
    // tanh-GELU and gpt-oss's g·sigmoid(1.702 g) (SiLU's derivative of
    // 1.702 g), plus one rounding; gpt-oss's SwiGLU multiplies by
    // clamp(u, -7, 7) + 1 instead of u (its clamps only shrink errors). Its
    // cases take inputs 4 times larger, so gates and ups pass ±7 (checked):
    // one row through the GLU GEMV, 3 and 36 rows through the GEMM and
    // glu.comp's rows on Vulkan.
    let eps = 1e-5;
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4K,
        DType::Q6K,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::IQ4XS,
        DType::Q5K,
        DType::Q3K,
        DType::IQ2S,
    ] {
        let cols = 256;
        // n = 32: whole blocks of outputs, so one-row integer-dot GLUs write
        // their output's digits and quantize their own input (mul_mat_vec.comp
        // Q8OUT, Q8IN).
        for (n, m, act, with_norm) in [
            (19, 1, Activation::Silu, true),
            (32, 1, Activation::Silu, true),
            (32, 1, Activation::GeluTanh, false),
            (19, 3, Activation::GeluTanh, false),
            (19, 6, Activation::Silu, true),
            (19, 36, Activation::Silu, true),
            (32, 1, Activation::SwigluOai, true),
            (19, 3, Activation::SwigluOai, false),
            (19, 36, Activation::SwigluOai, true),
            // BitNet's squared ReLU: the GEMV's fused GLU lacks it, so it
            // goes through the glu op on Vulkan.
            (32, 1, Activation::Relu2, false),
            (19, 3, Activation::Relu2, true),
        ] {
            let oai = act == Activation::SwigluOai;
            let big = if oai { 4.0 } else { 1.0 };
            let wb = weight_bytes(dtype, 2 * n, cols, (n * 5 + cols) as u64);
            let wf = reference::dequantize(dtype, &wb, 2 * n, cols).unwrap();
            let x: Vec<f32> = rand_f32(m * cols, 81)
                .iter()
                .map(|v| v * 2.0 * big)
                .collect();
            let nw: Vec<f32> = rand_f32(cols, 82).iter().map(|v| (1.0 + v) * big).collect();
            let xn = if with_norm {
                reference::rms_norm(&x, &nw, cols, eps).unwrap()
            } else {
                x.clone()
            };
            let gu = reference::matmul(dtype, &wb, 2 * n, cols, None, &xn, m).unwrap();
            if oai {
                let (gates, ups): (Vec<f32>, Vec<f32>) = gu
                    .chunks_exact(2 * n)
                    .flat_map(|row| (0..n).map(move |i| (row[i], row[n + i])))
                    .unzip();
                assert!(
                    gates.iter().any(|g| *g > 7.5),
                    "{dtype} m={m}: no gate past 7"
                );
                assert!(ups.iter().any(|u| *u > 7.5), "{dtype} m={m}: no up past 7");
                assert!(
                    ups.iter().any(|u| *u < -7.5),
                    "{dtype} m={m}: no up below -7"
                );
            }
            let w = b.upload_weight(dtype, 2 * n, cols, &wb).unwrap();
            let (xb, nwb, out) = (
                upload_f32(b.as_mut(), &x),
                upload_f32(b.as_mut(), &nw),
                b.alloc(m * n * 4).unwrap(),
            );
            let norm = with_norm.then_some((&nwb, eps));
            pass(b.as_mut(), |b| {
                b.linear_glu(act, &w, &xb, &out, m, norm).unwrap()
            });
            let got = download_f32(b.as_mut(), &out, m * n);
            for r in 0..m {
                let xr = &xn[r * cols..(r + 1) * cols];
                let row = &gu[r * 2 * n..(r + 1) * 2 * n];
                let want = reference::glu(act, &row[..n], Some(&row[n..])).unwrap();
                for i in 0..n {
                    let err = |j: usize| {
                        let wr = &wf[j * cols..(j + 1) * cols];
                        let mag: f32 = wr.iter().zip(xr).map(|(a, c)| (a * c).abs()).sum();
                        1e-5 * mag + activation_bound(acts, dtype, wr, xr, m)
                    };
                    let (g, u) = (row[i], row[n + i]);
                    let act_g = reference::activate(act, g as f64) as f32;
                    let u = if oai { u.clamp(-7.0, 7.0) + 1.0 } else { u };
                    let bound = 1.2 * err(i) * u.abs()
                        + act_g.abs() * err(n + i)
                        + 1e-6 * want[i].abs()
                        + 1e-7;
                    let v = got[r * n + i];
                    assert!(
                        (v - want[i]).abs() <= bound,
                        "{name} {dtype} m={m} {act:?} out[{r},{i}] = {v}, want {}",
                        want[i]
                    );
                }
            }
            b.free_weight(w);
        }
    }
}
test_device!(
    linear_glu_matches_separate_projections,
    linear_glu_matches_separate_projections_cpu: matmul_cpu_backends,
    linear_glu_matches_separate_projections_vulkan: matmul_vulkan_backends
);

fn linear_each_equals_linear_on_each_weight((name, mut b, _): Rounded) {
    // q, k and v from one input in one op must equal, bit for bit, each
    // projection run alone: types mixed as in a Q4_K_M file (Q6_K v),
    // repacked weights whose rows end inside a 16-row group, a type without
    // integer dots, decode rows (one job on the CPU) and 5 rows (apart).
    let eps = 1e-5;
    let cols = 512;
    let mixes: [[(DType, usize); 3]; 3] = [
        [(DType::Q4K, 64), (DType::Q4K, 16), (DType::Q6K, 16)],
        [(DType::Q4_0, 40), (DType::Q4_1, 21), (DType::F16, 9)],
        [(DType::Q8_0, 32), (DType::IQ4XS, 24), (DType::Q5K, 37)],
    ];
    for mix in mixes {
        for m in [1, 2, 4, 5] {
            for (with_norm, with_bias) in [(true, false), (false, true), (true, true)] {
                let x = rand_f32(m * cols, 101);
                let (xb, nwb) = (
                    upload_f32(b.as_mut(), &x),
                    upload_f32(b.as_mut(), &rand_f32(cols, 102)),
                );
                let norm = with_norm.then_some((&nwb, eps));
                let ws: Vec<_> = mix
                    .iter()
                    .enumerate()
                    .map(|(i, &(dtype, rows))| {
                        let wb = weight_bytes(dtype, rows, cols, 103 + i as u64);
                        let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
                        let bias = upload_f32(b.as_mut(), &rand_f32(rows, 106 + i as u64));
                        let ys = [0, 1].map(|_| b.alloc(m * rows * 4).unwrap());
                        (w, bias, ys)
                    })
                    .collect();
                let outs: Vec<_> = ws
                    .iter()
                    .map(|(w, bias, ys)| Projection {
                        w,
                        bias: with_bias.then_some(bias),
                        y: &ys[0],
                    })
                    .collect();
                pass(b.as_mut(), |b| b.linear_each(&xb, m, norm, &outs).unwrap());
                for (i, (w, bias, ys)) in ws.iter().enumerate() {
                    let opts = LinearOpts {
                        bias: with_bias.then_some(bias),
                        norm,
                        add: false,
                    };
                    pass(b.as_mut(), |b| b.linear(w, &xb, &ys[1], m, &opts).unwrap());
                    let [each, alone] = ys
                        .each_ref()
                        .map(|y| download_f32(b.as_mut(), y, m * w.rows));
                    assert_eq!(
                        each, alone,
                        "{name} {:?} projection {i} m={m} norm {with_norm} bias {with_bias}",
                        mix[i]
                    );
                }
                for (w, _, _) in ws {
                    b.free_weight(w);
                }
            }
        }
    }
}
test_device!(
    linear_each_equals_linear_on_each_weight,
    linear_each_equals_linear_on_each_weight_cpu: matmul_cpu_backends,
    linear_each_equals_linear_on_each_weight_vulkan: matmul_vulkan_backends
);

#[test]
fn linear_glu_is_the_cpu_matmul_then_glu_bit_for_bit() {
    // The CPU runs decode GLUs as one job whose tasks apply the GLU to the
    // rows they multiplied; that must change no bit against the product
    // and the glu op apart (n = 19: a row group split between the halves,
    // so the product runs apart). (Vulkan's fused GLU kernels round otherwise:
    // `linear_glu_matches_separate_projections` bounds them.)
    let cols = 512;
    for (name, mut b, _) in matmul_cpu_backends() {
        for (dtype, n) in [
            (DType::Q4K, 32),
            (DType::Q6K, 48),
            (DType::Q4_1, 64),
            (DType::F16, 20),
            (DType::F16, 19),
        ] {
            for m in [1, 3] {
                for act in [
                    Activation::Silu,
                    Activation::GeluTanh,
                    Activation::SwigluOai,
                ] {
                    let wb = weight_bytes(dtype, 2 * n, cols, 111);
                    let w = b.upload_weight(dtype, 2 * n, cols, &wb).unwrap();
                    let x: Vec<f32> = rand_f32(m * cols, 112).iter().map(|v| 4.0 * v).collect();
                    let (xb, nwb) = (
                        upload_f32(b.as_mut(), &x),
                        upload_f32(b.as_mut(), &rand_f32(cols, 113)),
                    );
                    let norm = Some((&nwb, 1e-5));
                    let [out, gu, g, u, apart] =
                        [n, 2 * n, n, n, n].map(|r| b.alloc(m * r * 4).unwrap());
                    pass(b.as_mut(), |b| {
                        b.linear_glu(act, &w, &xb, &out, m, norm).unwrap();
                        let opts = LinearOpts {
                            norm,
                            ..LinearOpts::default()
                        };
                        b.linear(&w, &xb, &gu, m, &opts).unwrap();
                        for i in 0..m {
                            let (row, half) = (i * 2 * n * 4, n * 4);
                            b.copy(&gu, row, &g, i * half, half).unwrap();
                            b.copy(&gu, row + half, &u, i * half, half).unwrap();
                        }
                        b.glu(act, &g, Some(&u), &apart, m * n).unwrap();
                    });
                    assert_eq!(
                        download_f32(b.as_mut(), &out, m * n),
                        download_f32(b.as_mut(), &apart, m * n),
                        "{name} {dtype} n={n} m={m} {act:?}"
                    );
                    b.free_weight(w);
                }
            }
        }
    }
}

#[test]
fn cpu_decode_products_do_not_depend_on_the_thread_count() {
    // Decode tasks split a weight's rows by the thread count; they start on
    // whole row groups (four rows that `dot_rows` sums together for one
    // activation row, sixteen repacked ones), so the split never changes a
    // bit. Before, f16 rows at a task boundary inside a group were summed
    // alone, and the last bits moved with the thread count.
    let (rows, cols) = (300, 512);
    for dtype in [DType::F16, DType::Q4_1, DType::Q4K, DType::IQ4XS] {
        let wb = weight_bytes(dtype, rows, cols, 121);
        for m in 1..=4 {
            let x = rand_f32(m * cols, 122);
            let runs: Vec<_> = [1, 2, 3, 5]
                .into_iter()
                .map(|threads| {
                    let mut b = vkllm::cpu::CpuBackend::new(Some(threads));
                    let w = b.upload_weight(dtype, rows, cols, &wb).unwrap();
                    let (xb, yb) = (upload_f32(&mut b, &x), b.alloc(m * rows * 4).unwrap());
                    pass(&mut b, |b| {
                        b.linear(&w, &xb, &yb, m, &LinearOpts::default()).unwrap()
                    });
                    (threads, download_f32(&mut b, &yb, m * rows))
                })
                .collect();
            for (threads, y) in &runs[1..] {
                assert_eq!(&runs[0].1, y, "{dtype} m={m}: {threads} threads against 1");
            }
        }
    }
}
