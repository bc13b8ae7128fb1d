//! `vkllm selftest`: every kernel this machine would run, against the f64
//! scalar reference ([`crate::reference`]) on small random shapes: each CPU
//! instruction set it has, and each Vulkan device with every kernel variant
//! that device can be given (the GEMVs, integer-dot and f32, in both row
//! layouts; the GEMMs: tiles, lanes, cooperative matrices; decode attention
//! split and whole; each prefill attention kernel; f32 and f16 caches;
//! the norms; matmuls with the norm, bias and residual add folded in), per
//! weight type. Shapes and tolerances are those of the
//! parity tests in `tests/ops/` (named at each check), so a row passes here
//! exactly when the test's bound holds. For users on GPUs, CPUs and drivers
//! we never tested: a wrong kernel shows as a failed row, not as bad text.

use crate::backend::{AttentionParams, Buffer, ComputeBackend, LinearOpts};
use crate::cpu::act::{self, ACT_BLOCK};
use crate::cpu::{ActivationPrecision, CpuBackend, CpuKernelOptions, Isa};
use crate::error::{Error, Result};
use crate::vk::{GemvKernel, MatmulKernel, PrefillAttention, VulkanBackend};
use crate::{reference, DType};
use serde::Serialize;

/// One checked kernel: where it ran, what it computed, its worst element.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// `cpu-avx2`, `vulkan:0 NVIDIA H200`, ...
    pub device: String,
    /// The op and the kernel variant forced for it (`matmul gemv-q8-subgroup m=1`).
    pub op: String,
    /// The weight or cache type (`-` for ops without one).
    pub dtype: String,
    /// |got - want| at the element nearest its bound (relative to it).
    pub max_error: f64,
    /// That element's bound.
    pub bound: f64,
    pub pass: bool,
}

/// An op whose results a test may corrupt (see [`Options::break_op`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Matmul,
    Linear,
    RmsNorm,
    LayerNorm,
    Attention,
}

impl Op {
    pub const ALL: [Op; 5] = [
        Op::Matmul,
        Op::Linear,
        Op::RmsNorm,
        Op::LayerNorm,
        Op::Attention,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Matmul => "matmul",
            Op::Linear => "linear",
            Op::RmsNorm => "rms_norm",
            Op::LayerNorm => "layer_norm",
            Op::Attention => "attention",
        }
    }
}

/// How the self-test runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Test-only: move the first output of every run of this op by far more
    /// than its bound before the check, as a broken kernel would, so tests
    /// can show that the self-test fails when a kernel is wrong.
    pub break_op: Option<Op>,
}

/// Every instruction set of [`Isa::ALL`] this CPU runs, best first.
pub fn cpu_isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.available()).collect()
}

/// The CPU backend's kernels for `isa`, with each activation precision
/// the CLI offers (`--activations`): the default 16-bit digits and 8-bit
/// ones through the integer kernels, f32 through the float ones; and the
/// default again with weights left unrepacked.
pub fn run_cpu(isa: Isa, opts: &Options) -> Result<Vec<Row>> {
    let device = format!("cpu-{}", isa.name());
    let mut rows = Vec::new();
    for acts in [
        ActivationPrecision::Q16,
        ActivationPrecision::Q8,
        ActivationPrecision::F32,
    ] {
        let kernel = CpuKernelOptions {
            isa: Some(isa),
            repack: true,
            ..CpuKernelOptions::default()
        };
        let mut b = CpuBackend::with_options(None, kernel)?.with_activations(acts);
        let mut t = Tester::new(&device, opts, &mut rows);
        let label = format!("acts-{}", acts.name());
        for m in [1, 3, 36] {
            t.matmul_all(&mut b, &label, Rounding::of(acts), m)?;
        }
    }
    // Weights kept in GGUF rows (`VKLLM_CPU_REPACK=off`): the row kernels
    // that repacked types skip.
    let rows_only = CpuKernelOptions {
        isa: Some(isa),
        repack: false,
        ..CpuKernelOptions::default()
    };
    let mut b = CpuBackend::with_options(None, rows_only)?;
    let mut t = Tester::new(&device, opts, &mut rows);
    let acts = ActivationPrecision::default();
    let label = format!("acts-{}-unpacked", acts.name());
    for m in [1, 3, 36] {
        t.matmul_all(&mut b, &label, Rounding::of(acts), m)?;
    }
    let mut b = CpuBackend::with_options(
        None,
        CpuKernelOptions {
            isa: Some(isa),
            repack: true,
            ..CpuKernelOptions::default()
        },
    )?;
    let mut t = Tester::new(&device, opts, &mut rows);
    t.norms(&mut b, "")?;
    t.attention(&mut b, "decode", DType::F32, Shape::Decode, false)?;
    t.attention(&mut b, "prefill", DType::F32, Shape::Prefill, false)?;
    Ok(rows)
}

/// Every kernel variant of the Vulkan device `opts` opens (its kernel
/// overrides are ignored: each variant is forced in turn through the
/// backend's setters, and the device's own choice is among them).
pub fn run_vulkan(vk_opts: &crate::vk::Options, opts: &Options) -> Result<Vec<Row>> {
    let vk_opts = crate::vk::Options {
        kernels: crate::vk::KernelOverrides::default(),
        // Every kernel is checked, so all are worth making ahead (below).
        prepare_kernels: vk_opts.prepare_kernels.or(Some(true)),
        ..vk_opts.clone()
    };
    let mut b = VulkanBackend::new(&vk_opts)?;
    let info = b.device_info();
    // The driver's name up to its details: `llvmpipe (LLVM 15.0.6, ...)`.
    let short = info.name.split(" (").next().unwrap_or(&info.name);
    let device = format!("vulkan:{} {short}", info.index);
    // Drivers compile a kernel on the thread that first uses it: one after
    // another, the NVIDIA driver took over two minutes for these checks. A
    // dry round inside a kernel survey (its results dropped) makes them all
    // at once, in parallel, before the round that counts.
    if b.begin_kernel_survey()? {
        let mut dropped = Vec::new();
        let dry = vulkan_checks(&mut b, &mut Tester::new(&device, opts, &mut dropped));
        b.end_kernel_survey()?;
        dry?;
    }
    let mut rows = Vec::new();
    vulkan_checks(&mut b, &mut Tester::new(&device, opts, &mut rows))?;
    Ok(rows)
}

/// Every Vulkan check, each kernel variant set in turn on `b` and the
/// device's own choices restored at the end.
fn vulkan_checks(b: &mut VulkanBackend, t: &mut Tester) -> Result<()> {
    let caps = b.device_info().caps.clone();
    let opened = b.kernels();
    // Decode (m <= 4): each GEMV layout, with int8 activations for the
    // integer-dot types (forced for every size) and in f32.
    let exact = if opened.matmul.is_coopmat() {
        MatmulKernel::Tiles
    } else {
        opened.matmul
    };
    b.set_matmul(exact)?;
    for layout in [GemvKernel::Workgroup, GemvKernel::Subgroup] {
        let name = match layout {
            GemvKernel::Workgroup => "workgroup",
            _ => "subgroup",
        };
        b.set_gemv(layout);
        if opened.gemv_q8 {
            b.set_gemv_q8(Some(0))?;
            for m in [1, 3] {
                let label = format!("gemv-q8-{name}");
                let r = Rounding::DecodeSteps(127.0 * 254.0);
                t.matmul_types(b, &label, r, m, crate::vk::gemv_int_dot)?;
            }
        }
        b.set_gemv_q8(None)?;
        for m in [1, 3] {
            t.matmul_all(b, &format!("gemv-f32-{name}"), Rounding::None, m)?;
        }
    }
    // Prefill (m > 4) on each GEMM; the f32 ones also take decode rows, as
    // a CPU device's default (`GemvKernel::Gemm`) has them do.
    let mut gemms = vec![MatmulKernel::Tiles];
    if MatmulKernel::Lanes.available(&caps) {
        gemms.push(MatmulKernel::Lanes);
    }
    if opened.matmul.is_coopmat() {
        gemms.push(opened.matmul);
    }
    for gemm in gemms {
        b.set_matmul(gemm)?;
        let name = match gemm {
            MatmulKernel::Tiles => "gemm-tiles",
            MatmulKernel::Lanes => "gemm-lanes",
            MatmulKernel::CoopmatKhr => "gemm-coopmat-khr",
            MatmulKernel::CoopmatNv => "gemm-coopmat-nv",
        };
        if gemm.is_coopmat() {
            b.set_gemv(GemvKernel::Auto);
            t.matmul_all(b, name, Rounding::F16Gemm, 36)?;
        } else {
            b.set_gemv(GemvKernel::Gemm);
            for m in [1, 36] {
                t.matmul_all(b, name, Rounding::None, m)?;
            }
        }
    }
    b.set_matmul(opened.matmul)?;
    b.set_gemv(opened.gemv);
    b.set_gemv_q8(opened.gemv_q8.then_some(crate::vk::GEMV_Q8_MIN_BYTES))?;

    t.norms(b, "")?;
    // Attention over both cache types (f16 is Vulkan's default): decode with
    // the span split over workgroups and whole, prefill on each kernel.
    for kv in [DType::F32, DType::F16] {
        for splits in [true, false] {
            b.set_decode_splits(splits);
            let label = if splits {
                "decode-splits"
            } else {
                "decode-whole"
            };
            t.attention(b, label, kv, Shape::Decode, false)?;
        }
        b.set_decode_splits(opened.decode_splits);
        let mut kernels = vec![
            (PrefillAttention::Flash, "prefill-flash"),
            (PrefillAttention::Rows, "prefill-rows"),
            (PrefillAttention::Decode, "prefill-decode"),
        ];
        // Cooperative matrices take f16 caches only (Flash for f32 ones).
        if opened.attention == PrefillAttention::Coopmat && kv == DType::F16 {
            kernels.push((PrefillAttention::Coopmat, "prefill-coopmat"));
        }
        for (kernel, label) in kernels {
            b.set_attention(kernel)?;
            let f16_math = kernel == PrefillAttention::Coopmat;
            t.attention(b, label, kv, Shape::Prefill, f16_math)?;
        }
        b.set_attention(opened.attention)?;
    }
    Ok(())
}

/// How a backend rounds a matmul's inputs: the self-test's and the parity
/// tests' (tests/ops) allowance beside the f32 reference.
#[derive(Clone, Copy, Debug)]
pub enum Rounding {
    /// Not at all: f32 throughout.
    None,
    /// Activations of the CPU's integer-dot weight types, to steps of
    /// max|x_block| / .0.
    Steps(f32),
    /// As `Steps`, in decode (m <= 4) only, for Vulkan's integer-dot types.
    DecodeSteps(f32),
    /// Prefill weights and activations to f16 (cooperative matrices).
    F16Gemm,
}

impl Rounding {
    /// The CPU's rounding in activation mode `acts`.
    pub fn of(acts: ActivationPrecision) -> Rounding {
        match acts {
            ActivationPrecision::F32 => Rounding::None,
            ActivationPrecision::Q16 => Rounding::Steps(32767.0),
            ActivationPrecision::Q8 => Rounding::Steps(127.0),
        }
    }

    /// The most rounding the inputs can move one output: row `w` of the
    /// weight against row `x` of a matmul with `m` rows. Integer steps: each
    /// value moves by at most half a step, `max|x_block| / (2·MAX)`, times
    /// `|w|` (zero for other weight types: without CPU integer kernels for
    /// `Steps`, without an integer-dot GEMV for `DecodeSteps`, which is zero
    /// for prefill too). F16 GEMM: w and x each within 2⁻¹¹ relative (plus
    /// half f16's subnormal spacing, 2⁻²⁵), so each product within
    /// 2⁻¹⁰·|w·x| + 2⁻²⁵·(|w| + |x|) (zero for decode).
    pub fn bound(self, dtype: DType, w: &[f32], x: &[f32], m: usize) -> f64 {
        let max = match self {
            Rounding::None => return 0.0,
            Rounding::F16Gemm if m <= 4 => return 0.0,
            Rounding::F16Gemm => {
                let terms: f64 = w
                    .iter()
                    .zip(x)
                    .map(|(a, b)| {
                        let (a, b) = (f64::from(a.abs()), f64::from(b.abs()));
                        a * b / 1024.0 + (a + b) / 33_554_432.0
                    })
                    .sum();
                return terms * 1.01;
            }
            Rounding::DecodeSteps(_) if m > 4 || !crate::vk::gemv_int_dot(dtype) => return 0.0,
            Rounding::Steps(_) if !act::supports(dtype) => return 0.0,
            _ if !x.len().is_multiple_of(ACT_BLOCK) => return 0.0,
            Rounding::Steps(max) | Rounding::DecodeSteps(max) => f64::from(max),
        };
        w.chunks(ACT_BLOCK)
            .zip(x.chunks(ACT_BLOCK))
            .map(|(wb, xb)| {
                let step = f64::from(xb.iter().fold(0f32, |a, v| a.max(v.abs()))) / max;
                wb.iter().map(|w| f64::from(w.abs())).sum::<f64>() * step / 2.0
            })
            .sum()
    }
}

/// The attention shapes checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// One row deep in a 160-position cache.
    Decode,
    /// Seven consecutive rows.
    Prefill,
}

/// Runs checks on one device and collects their rows.
struct Tester<'a> {
    device: &'a str,
    opts: &'a Options,
    rows: &'a mut Vec<Row>,
}

impl<'a> Tester<'a> {
    fn new(device: &'a str, opts: &'a Options, rows: &'a mut Vec<Row>) -> Self {
        Tester { device, opts, rows }
    }

    /// Records one check: `got` against `want` elementwise within `bound(i)`,
    /// after the fault [`Options::break_op`] asks for.
    fn record(
        &mut self,
        op: Op,
        variant: String,
        dtype: &str,
        mut got: Vec<f32>,
        want: &[f32],
        bound: impl Fn(usize) -> f64,
    ) {
        if self.opts.break_op == Some(op) {
            // Past its bound even where rounding bounds are wide (Q8).
            if let Some(g) = got.first_mut() {
                *g += (2.0 * bound(0) + 1.0) as f32;
            }
        }
        // The element nearest (or furthest past) its bound; NaN fails.
        let (mut max_error, mut worst_bound, mut worst) = (0.0, bound(0), 0.0);
        let mut pass = got.len() == want.len();
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let err = (f64::from(g) - f64::from(w)).abs();
            let b = bound(i);
            if err.is_nan() {
                pass = false;
                (max_error, worst_bound, worst) = (f64::INFINITY, b, f64::INFINITY);
                continue;
            }
            let ratio = if b > 0.0 { err / b } else { f64::INFINITY };
            if err > b {
                pass = false;
            }
            if ratio > worst || (ratio == worst && err > max_error) {
                (max_error, worst_bound, worst) = (err, b, ratio);
            }
        }
        let op = if variant.is_empty() {
            op.name().to_string()
        } else {
            format!("{} {variant}", op.name())
        };
        self.rows.push(Row {
            device: self.device.to_string(),
            op,
            dtype: dtype.to_string(),
            max_error,
            bound: worst_bound,
            pass,
        });
    }

    /// [`Tester::matmul_types`] on every weight type.
    fn matmul_all(
        &mut self,
        b: &mut dyn ComputeBackend,
        variant: &str,
        r: Rounding,
        m: usize,
    ) -> Result<()> {
        self.matmul_types(b, variant, r, m, |_| true)
    }

    /// `y = x·Wᵀ + bias` for every weight type `which` takes, 33 rows of
    /// one column count per block size (tests/ops/matmul.rs
    /// `matmul_every_dtype_matches_reference`: within 1e-5 of Σ|w·x| + |b|,
    /// plus the activations' rounding, plus 1e-7).
    fn matmul_types(
        &mut self,
        b: &mut dyn ComputeBackend,
        variant: &str,
        r: Rounding,
        m: usize,
        which: impl Fn(DType) -> bool,
    ) -> Result<()> {
        let rows = 33;
        for dtype in DType::ALL.into_iter().filter(|&d| which(d)) {
            let cols = match dtype.block_elems() {
                1 => 100,
                32 => 96,
                _ => 256,
            };
            let wb = weight_bytes(dtype, rows, cols, (rows * 131 + cols) as u64)?;
            let x = crate::random::uniform_f32(m * cols, 11 + m as u64);
            let bias = crate::random::uniform_f32(rows, 5);
            let want = reference::matmul(dtype, &wb, rows, cols, Some(&bias), &x, m)?;
            let wf = reference::dequantize(dtype, &wb, rows, cols)?;
            let w = b.upload_weight(dtype, rows, cols, &wb)?;
            let xb = upload(b, &x)?;
            let bb = upload(b, &bias)?;
            let yb = b.alloc(m * rows * 4)?;
            let ran = run_pass(b, |b| b.matmul(&w, Some(&bb), &xb, &yb, m));
            let got = ran.and_then(|()| download(b, &yb, m * rows));
            b.free_weight(w);
            for buf in [xb, bb, yb] {
                b.free(buf);
            }
            let got = got?;
            let bound = |i: usize| {
                let (row, out) = (i / rows, i % rows);
                let xr = &x[row * cols..(row + 1) * cols];
                let wr = &wf[out * cols..(out + 1) * cols];
                let mag = abs_dot(wr, xr) + f64::from(bias[out].abs());
                1e-5 * mag + r.bound(dtype, wr, xr, m) + 1e-7
            };
            let label = format!("{variant} m={m}");
            self.record(Op::Matmul, label, dtype.name(), got, &want, bound);
            if m == 1 || m == 36 {
                self.linear(b, variant, r, m, dtype, (cols, &wb))?;
            }
        }
        Ok(())
    }

    /// `y += rms_norm(x)·Wᵀ + bias`, the norm, bias and residual add folded
    /// into the matmul (tests/ops/linear.rs
    /// `linear_folds_norm_bias_and_residual_add`: within 1e-5 of
    /// Σ|w·x̂| + |b|, plus the activations' rounding, plus 1e-6 of the
    /// result and 1e-7).
    fn linear(
        &mut self,
        b: &mut dyn ComputeBackend,
        variant: &str,
        r: Rounding,
        m: usize,
        dtype: DType,
        (cols, wb): (usize, &[u8]),
    ) -> Result<()> {
        let (rows, eps) = (33, 1e-5);
        let wf = reference::dequantize(dtype, wb, rows, cols)?;
        let x: Vec<f32> = crate::random::uniform_f32(m * cols, 71)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        let nw: Vec<f32> = crate::random::uniform_f32(cols, 72)
            .iter()
            .map(|v| 1.0 + v)
            .collect();
        let bias = crate::random::uniform_f32(rows, 73);
        let y_old = crate::random::uniform_f32(m * rows, 74);
        let xn = reference::rms_norm(&x, &nw, cols, eps)?;
        let prod = reference::matmul(dtype, wb, rows, cols, Some(&bias), &xn, m)?;
        let want = reference::add(&y_old, &prod)?;
        let w = b.upload_weight(dtype, rows, cols, wb)?;
        let (xb, nwb, bb, yb) = (
            upload(b, &x)?,
            upload(b, &nw)?,
            upload(b, &bias)?,
            upload(b, &y_old)?,
        );
        let opts = LinearOpts {
            bias: Some(&bb),
            norm: Some((&nwb, eps)),
            add: true,
        };
        let ran = run_pass(b, |b| b.linear(&w, &xb, &yb, m, &opts));
        let got = ran.and_then(|()| download(b, &yb, m * rows));
        b.free_weight(w);
        for buf in [xb, nwb, bb, yb] {
            b.free(buf);
        }
        let got = got?;
        let bound = |i: usize| {
            let (row, out) = (i / rows, i % rows);
            let xr = &xn[row * cols..(row + 1) * cols];
            let wr = &wf[out * cols..(out + 1) * cols];
            let mag = abs_dot(wr, xr) + f64::from(bias[out].abs());
            1e-5 * mag + r.bound(dtype, wr, xr, m) + 1e-6 * f64::from(want[i].abs()) + 1e-7
        };
        let label = format!("{variant} m={m}");
        self.record(Op::Linear, label, dtype.name(), got, &want, bound);
        Ok(())
    }

    /// rms_norm and layer_norm (tests/ops/norm_rope.rs
    /// `rms_norm_and_layer_norm_match_reference`: rms_norm within 1e-5 of
    /// each value, layer_norm within 1e-5 of the output's scale) on one
    /// row of 576 and on 70 rows of 256 (wide workgroups on a GPU).
    fn norms(&mut self, b: &mut dyn ComputeBackend, variant: &str) -> Result<()> {
        for (rows, dim) in [(1, 576), (70, 256)] {
            let x: Vec<f32> = crate::random::uniform_f32(rows * dim, 1)
                .iter()
                .map(|v| v * 3.0 + 0.5)
                .collect();
            let w = crate::random::uniform_f32(dim, 2);
            let bias = crate::random::uniform_f32(dim, 3);
            let (xb, wb, bb) = (upload(b, &x)?, upload(b, &w)?, upload(b, &bias)?);
            let (o1, o2) = (b.alloc(rows * dim * 4)?, b.alloc(rows * dim * 4)?);
            let ran = run_pass(b, |b| {
                b.rms_norm(&xb, &wb, &o1, rows, dim, 1e-5)?;
                b.layer_norm(&xb, &wb, &bb, &o2, rows, dim, 1e-5)
            });
            let got = ran
                .and_then(|()| Ok((download(b, &o1, rows * dim)?, download(b, &o2, rows * dim)?)));
            for buf in [xb, wb, bb, o1, o2] {
                b.free(buf);
            }
            let (g1, g2) = got?;
            let label = format!("{variant}{rows}x{dim}");
            let want = reference::rms_norm(&x, &w, dim, 1e-5)?;
            let rel = |i: usize| 1e-5 * f64::from(want[i].abs().max(1e-6));
            self.record(Op::RmsNorm, label.clone(), "f32", g1, &want, rel);
            let want = reference::layer_norm(&x, &w, &bias, dim, 1e-5)?;
            let scale = f64::from(want.iter().fold(0f32, |a, v| a.max(v.abs())).min(1.0));
            self.record(Op::LayerNorm, label, "f32", g2, &want, |_| 1e-5 * scale);
        }
        Ok(())
    }

    /// Attention with GQA (8 heads over 2), head_dim 64, over a `kv` cache:
    /// within 1e-5 of the f64 reference over f32 caches
    /// (tests/ops/attention.rs `attention_gqa_positions_and_window`), 4e-5
    /// over the f16-rounded ones (`attention_f16_cache`). `f16_math`: the
    /// kernel rounds q·scale and the probabilities to f16 (cooperative
    /// matrices): the reference takes the same rounded q, and the
    /// probabilities' rounding leaves 2e-3 (tests/vulkan/attention.rs
    /// `attention_prefill_coopmat_f16_cache`).
    fn attention(
        &mut self,
        b: &mut dyn ComputeBackend,
        variant: &str,
        kv: DType,
        shape: Shape,
        f16_math: bool,
    ) -> Result<()> {
        let (n_heads, n_kv_heads, head_dim) = (8, 2, 64);
        let (capacity, positions): (usize, Vec<u32>) = match shape {
            Shape::Decode => (160, vec![149]),
            Shape::Prefill => (40, (10..17).collect()),
        };
        let p = AttentionParams {
            rows: positions.len(),
            n_heads,
            n_kv_heads,
            head_dim,
            capacity,
            span: capacity,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: 0,
            kv_dtype: kv,
            pages: None,
            next: None,
            sinks: None,
        };
        let cache = capacity * n_kv_heads * head_dim;
        let q: Vec<f32> = crate::random::uniform_f32(p.rows * n_heads * head_dim, 21)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let k: Vec<f32> = crate::random::uniform_f32(cache, 22)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        let v = crate::random::uniform_f32(cache, 23);
        let (kb, k) = upload_cache(b, &k, kv)?;
        let (vb, v) = upload_cache(b, &v, kv)?;
        let qb = upload(b, &q)?;
        let pb = b.alloc(positions.len() * 4)?;
        b.upload(&pb, 0, bytemuck::cast_slice(&positions))?;
        let out = b.alloc(q.len() * 4)?;
        let ran = run_pass(b, |b| b.attention(&qb, &kb, &vb, &pb, &out, &p));
        let got = ran.and_then(|()| download(b, &out, q.len()));
        for buf in [kb, vb, qb, pb, out] {
            b.free(buf);
        }
        let got = got?;
        let (q, p32, tol) = if f16_math {
            let rounded = q
                .iter()
                .map(|&x| half::f16::from_f32(x * p.scale).to_f32())
                .collect();
            let p32 = AttentionParams {
                kv_dtype: DType::F32,
                scale: 1.0,
                ..p
            };
            (rounded, p32, 2e-3)
        } else {
            let p32 = AttentionParams {
                kv_dtype: DType::F32,
                ..p
            };
            (q, p32, if kv == DType::F16 { 4e-5 } else { 1e-5 })
        };
        let want = reference::attention(&q, &k, &v, &positions, &p32)?;
        self.record(
            Op::Attention,
            variant.to_string(),
            kv.name(),
            got,
            &want,
            |_| tol,
        );
        Ok(())
    }
}

/// Runs `f` in a pass of its own; an error from `f` still ends the pass.
fn run_pass(
    b: &mut dyn ComputeBackend,
    f: impl FnOnce(&mut dyn ComputeBackend) -> Result<()>,
) -> Result<()> {
    b.begin_pass()?;
    let r = f(b);
    let end = b.end_pass();
    r.and(end)
}

fn upload(b: &mut dyn ComputeBackend, data: &[f32]) -> Result<Buffer> {
    let buf = b.alloc(std::mem::size_of_val(data))?;
    b.upload(&buf, 0, bytemuck::cast_slice(data))?;
    Ok(buf)
}

fn download(b: &mut dyn ComputeBackend, buf: &Buffer, n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0f32; n];
    b.download(buf, 0, bytemuck::cast_slice_mut(&mut out))?;
    Ok(out)
}

/// A cache of `dtype` (f32 or f16) holding `data`, and the values it holds.
fn upload_cache(
    b: &mut dyn ComputeBackend,
    data: &[f32],
    dtype: DType,
) -> Result<(Buffer, Vec<f32>)> {
    if dtype != DType::F16 {
        return Ok((upload(b, data)?, data.to_vec()));
    }
    let h: Vec<half::f16> = data.iter().map(|&x| half::f16::from_f32(x)).collect();
    let buf = b.alloc(h.len() * 2)?;
    b.upload(&buf, 0, bytemuck::cast_slice(&h))?;
    Ok((buf, h.iter().map(|x| x.to_f32()).collect()))
}

/// Random weights of `dtype` (tests/common `weight_bytes`): quantized from
/// values in [-1, 1) where the type has an encoder, else random block bytes
/// with a small f16 scale first in each block.
fn weight_bytes(dtype: DType, rows: usize, cols: usize, seed: u64) -> Result<Vec<u8>> {
    let rb = dtype.row_bytes(cols)?;
    let n = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::Invalid("self-test weight size overflows".into()))?;
    let vals = crate::random::uniform_f32(n, seed);
    let mut out = vec![0u8; rows * rb];
    if dtype.format().encode.is_some() {
        for (src, dst) in vals.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
            crate::quants::quantize_row(dtype, src, dst)?;
        }
        return Ok(out);
    }
    for (b, v) in out.iter_mut().zip(&vals) {
        *b = ((v + 1.0) * 128.0) as u8;
    }
    for (block, v) in out
        .chunks_exact_mut(dtype.block_bytes())
        .zip(vals.iter().rev())
    {
        block[..2].copy_from_slice(&half::f16::from_f32(v * 0.01).to_bits().to_le_bytes());
    }
    Ok(out)
}

/// The rows as a table: device/ISA, op, type, max error, bound, result.
pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<28} {:<36} {:<8} {:>10} {:>10}  result\n",
        "device", "op", "type", "max error", "bound"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<28} {:<36} {:<8} {:>10.3e} {:>10.3e}  {}\n",
            r.device,
            r.op,
            r.dtype,
            r.max_error,
            r.bound,
            if r.pass { "pass" } else { "FAIL" }
        ));
    }
    s
}

/// Σ|w·x|: the scale a dot product's rounding error grows with.
fn abs_dot(w: &[f32], x: &[f32]) -> f64 {
    w.iter().zip(x).map(|(a, c)| f64::from((a * c).abs())).sum()
}
