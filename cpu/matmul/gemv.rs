//! Decode matmuls (up to [`GEMV_MAX_M`] activation rows, and short prefill
//! of the types whose row dots serve it): each weight row is read once
//! against each chunk of up to four activation rows; the team splits the
//! output rows. Projections of one input (q, k and v) run as one team job
//! ([`gemv_each`]), and the gate and up projections with the GLU after them
//! ([`gemv_glu`]): on 16 threads a job's hand-off costs about as much as
//! SmolLM2's k or v matrix takes to read.

use super::super::act::{self, ActDigits, ActInt, ActRows, ACT_BLOCK};
use super::super::buffers::WeightRows;
use super::super::glu;
use super::super::par::{self, Ctx};
use super::super::repack::R;
use super::super::simd::{self, ActQuant};
use super::super::ActivationPrecision;
use super::OutPtr;
use crate::backend::Activation;
use std::sync::{Arc, Mutex, OnceLock};

/// Above this many activation rows the panel GEMM wins over row dots.
pub(crate) const GEMV_MAX_M: usize = 4;

/// Weight bytes a decode task reads at least.
const MIN_TASK_BYTES: usize = 16 << 10;

/// One projection of a shared input: `y[m, w.rows] = x · wᵀ + bias`.
pub(crate) struct Part<'a> {
    pub w: WeightRows<'a>,
    pub bias: Option<&'a [f32]>,
    pub y: &'a mut [f32],
}

/// `y = x · wᵀ` for `m` rows of `x`.
pub(super) fn gemv(
    ctx: Ctx,
    w: WeightRows<'_>,
    x: &[f32],
    y: &mut [f32],
    m: usize,
    memo: Option<(&ActsMemo, u32)>,
) {
    let input = Input::new(ctx, &[w], x, m, memo);
    let n = w.rows;
    let per_task = task_rows(w, 1);
    let yp = OutPtr(y.as_mut_ptr());
    par::range_init(ctx.par, n.div_ceil(per_task), Scratch::default, |s, t| {
        let (r0, r1) = (t * per_task, ((t + 1) * per_task).min(n));
        input.rows(w, r0, r1, s, |i, r, v| {
            // SAFETY: (i, r) is in bounds of the [m, n] output and owned by
            // this task alone (rows r0..r1).
            unsafe { *yp.get().add(i * n + r) = v };
        });
    });
}

/// Every part's `y = x · wᵀ + bias` in one team job (the parts share
/// `x`'s columns and the work derived from `x`). Each output equals
/// [`gemv`]'s plus the bias bit for bit.
pub(crate) fn gemv_each(
    ctx: Ctx,
    parts: &mut [Part<'_>],
    x: &[f32],
    m: usize,
    memo: Option<(&ActsMemo, u32)>,
) {
    let ws: Vec<_> = parts.iter().map(|p| p.w).collect();
    let input = Input::new(ctx, &ws, x, m, memo);
    // (part, first row, end row) of each task.
    let mut tasks = Vec::new();
    for (p, w) in ws.iter().enumerate() {
        let per_task = task_rows(*w, 1);
        tasks.extend(
            (0..w.rows)
                .step_by(per_task)
                .map(|r0| (p, r0, (r0 + per_task).min(w.rows))),
        );
    }
    let outs: Vec<_> = parts
        .iter_mut()
        .map(|p| (p.w, p.bias, OutPtr(p.y.as_mut_ptr())))
        .collect();
    par::range_init(ctx.par, tasks.len(), Scratch::default, |s, t| {
        let (p, r0, r1) = tasks[t];
        let (w, bias, yp) = outs[p];
        let n = w.rows;
        input.rows(w, r0, r1, s, |i, r, v| {
            let v = bias.map_or(v, |b| v + b[r]);
            // SAFETY: (i, r) is in bounds of part p's [m, n] output and
            // owned by this task alone (its rows r0..r1).
            unsafe { *yp.get().add(i * n + r) = v };
        });
    });
}

/// Whether [`gemv_glu`] can take `gate_up`: its up half starts on a whole
/// group of the rows the kernels take together.
pub(crate) fn glu_fits(gate_up: WeightRows<'_>) -> bool {
    gate_up.rows.is_multiple_of(2) && (gate_up.rows / 2).is_multiple_of(row_group(gate_up))
}

/// Rows the kernels take together: a repacked group, or the four rows
/// `simd::dot_rows` sums at once for one activation row (rounding them
/// otherwise than alone). Tasks start on whole groups, so a product's bits
/// do not depend on how the rows were split.
fn row_group(w: WeightRows<'_>) -> usize {
    if w.packed {
        R
    } else {
        4
    }
}

/// `out[m, n] = act(x · Gᵀ) ⊙ (x · Uᵀ)` with `gate_up` holding G's `n`
/// rows then U's ([`glu_fits`]): each task takes the same rows of both
/// halves and applies the GLU to them, so the products never leave it.
/// Equals [`gemv`] then `glu::run` bit for bit.
pub(crate) fn gemv_glu(
    ctx: Ctx,
    act: Activation,
    gate_up: WeightRows<'_>,
    x: &[f32],
    out: &mut [f32],
    m: usize,
    memo: Option<(&ActsMemo, u32)>,
) {
    let input = Input::new(ctx, &[gate_up], x, m, memo);
    let n = gate_up.rows / 2;
    let per_task = task_rows(gate_up, 2);
    let op = OutPtr(out.as_mut_ptr());
    let init = || (Scratch::default(), Vec::new(), Vec::new());
    par::range_init(ctx.par, n.div_ceil(per_task), init, |(s, g, u), t| {
        let (r0, r1) = (t * per_task, ((t + 1) * per_task).min(n));
        let len = r1 - r0;
        for (half, vals) in [(0, &mut *g), (n, &mut *u)] {
            vals.resize(m * len, 0.0);
            input.rows(gate_up, half + r0, half + r1, s, |i, r, v| {
                vals[i * len + r - half - r0] = v;
            });
        }
        for i in 0..m {
            // SAFETY: row i's outputs r0..r1 lie in the [m, n] output and
            // are this task's alone.
            let o = unsafe { std::slice::from_raw_parts_mut(op.get().add(i * n + r0), len) };
            let row = i * len..(i + 1) * len;
            glu::run(false, act, &g[row.clone()], Some(&u[row]), o);
        }
    });
}

/// Rows a task of `w` takes, each read `reads` times (once per half the
/// GLU takes): at least ~16 KiB of weights, since smaller tasks cost more
/// in hand-off and in streams the prefetchers never got going on.
fn task_rows(w: WeightRows<'_>, reads: usize) -> usize {
    let min_rows = MIN_TASK_BYTES / (w.row_bytes * reads).max(1);
    let per_task = (w.rows / (par::threads() * 8)).clamp(8, 256).max(min_rows);
    per_task.next_multiple_of(row_group(w))
}

/// A worker's buffers: unpacked rows, and products before they are stored.
#[derive(Default)]
struct Scratch {
    rows: Vec<u8>,
    tmp: Vec<f32>,
}

/// What a decode job's tasks read of the input, made once per job.
struct Input<'a> {
    ctx: Ctx,
    x: &'a [f32],
    m: usize,
    prepared: Option<Arc<Prepared>>,
}

impl<'a> Input<'a> {
    /// `x` (`[m, k]`, `k` the columns of every weight in `ws`) as `ws`'
    /// kernels read it.
    fn new(
        ctx: Ctx,
        ws: &[WeightRows<'_>],
        x: &'a [f32],
        m: usize,
        memo: Option<(&ActsMemo, u32)>,
    ) -> Input<'a> {
        let mut input = Input {
            ctx,
            x,
            m,
            prepared: None,
        };
        let Some(k) = ws.iter().find(|w| input.quantized(w)).map(|w| w.cols) else {
            return input;
        };
        // Quantized once per input (in chunks of up to 4 rows), shared by
        // every task and by the next matmuls reading the same buffer.
        let prepare = || Prepared {
            // Rows already on int8 levels (BitNet's) take the 8-bit kernels
            // at any integer precision: exact, and faster than 16 bits.
            acts: if let Some(levels) = level_rows(x, m, k) {
                IntActs::I8(levels)
            } else if ctx.acts == ActivationPrecision::Q16 {
                IntActs::I16(quantize_rows(x, m, k))
            } else {
                IntActs::I8(quantize_rows(x, m, k))
            },
            digits: OnceLock::new(),
        };
        let p = match memo {
            Some((memo, id)) => memo.get(
                ActsKey {
                    id,
                    m,
                    k,
                    acts: ctx.acts,
                },
                prepare,
            ),
            None => Arc::new(prepare()),
        };
        // Repacked groups take the group kernels, which read the
        // activations split into bytes: split once, before the tasks.
        if ws
            .iter()
            .any(|w| w.packed && w.rows >= R && input.quantized(w))
        {
            p.digits.get_or_init(|| p.acts.digits());
        }
        input.prepared = Some(p);
        input
    }

    /// Whether `w`'s kernels take the integer activations: decode, and
    /// prefill of repacked rows whose kernels serve it (`run`); not other
    /// prefill (instruction sets without a GEMM kernel come here).
    fn quantized(&self, w: &WeightRows<'_>) -> bool {
        (self.m <= GEMV_MAX_M || w.packed)
            && act::supports(w.dtype)
            && w.cols.is_multiple_of(ACT_BLOCK)
            && self.ctx.acts != ActivationPrecision::F32
    }

    /// Rows `r0..r1` of `w` (`r0` a multiple of [`R`] below the repacked
    /// groups) against every activation row: `put(i, r, x_i · w_r)`.
    fn rows(
        &self,
        w: WeightRows<'_>,
        r0: usize,
        r1: usize,
        s: &mut Scratch,
        mut put: impl FnMut(usize, usize, f32),
    ) {
        let (isa, m, k, rb) = (self.ctx.isa, self.m, w.cols, w.row_bytes);
        let int_acts = match &self.prepared {
            Some(p) if self.quantized(&w) => Some(p),
            _ => None,
        };
        let packed_rows = if w.packed { w.rows / R * R } else { 0 };
        s.tmp.resize((r1 - r0) * 4, 0.0);
        for i0 in (0..m).step_by(4) {
            let mm = (m - i0).min(4);
            let c = i0 / 4;
            let mut r = r0;
            if let Some(p) = int_acts {
                let pr1 = r1.min(packed_rows);
                if pr1 > r0 {
                    let dg = p.digits.get_or_init(|| p.acts.digits());
                    let (wd, out) = (&w.data[r0 * rb..pr1 * rb], &mut s.tmp[..(pr1 - r0) * mm]);
                    simd::dot_rows_packed(isa, w.dtype, wd, rb, p.acts.ds(c), &dg[c], out);
                    r = pr1;
                }
            }
            if r < r1 {
                let rows = w.rows_at(r, r1, &mut s.rows);
                let out = &mut s.tmp[(r - r0) * mm..(r1 - r0) * mm];
                match int_acts {
                    Some(p) => simd::dot_rows_int(isa, w.dtype, rows, rb, p.acts.chunk(c), out),
                    None => {
                        let xs = &self.x[i0 * k..(i0 + mm) * k];
                        simd::dot_rows(isa, w.dtype, rows, rb, k, xs, mm, out)
                    }
                }
            }
            for r in 0..r1 - r0 {
                for i in 0..mm {
                    put(i0 + i, r0 + r, s.tmp[r * mm + i]);
                }
            }
        }
    }
}

/// The decode activations last quantized from an input buffer, kept for
/// the next matmuls that read it unchanged (projections of one input that
/// run apart: BitNet's scaled q, k and v; gate and up of two types). The
/// store forgets them when the buffer is written ([`ActsMemo::forget`]).
#[derive(Default)]
pub(crate) struct ActsMemo(Mutex<Option<(ActsKey, Arc<Prepared>)>>);

/// What a memo entry was quantized from and how.
#[derive(Clone, Copy, PartialEq, Eq)]
struct ActsKey {
    id: u32,
    m: usize,
    k: usize,
    acts: ActivationPrecision,
}

/// Decode activations, and (made on first need) their split into bytes
/// for the repacked kernels.
struct Prepared {
    acts: IntActs,
    digits: OnceLock<Vec<ActDigits>>,
}

impl ActsMemo {
    /// Buffer `id` is about to be written: its entry is stale.
    pub fn forget(&mut self, id: u32) {
        let memo = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        if memo.as_ref().is_some_and(|(key, _)| key.id == id) {
            *memo = None;
        }
    }

    fn get(&self, key: ActsKey, make: impl FnOnce() -> Prepared) -> Arc<Prepared> {
        let mut memo = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match &*memo {
            Some((k, p)) if *k == key => Arc::clone(p),
            _ => {
                let p = Arc::new(make());
                *memo = Some((key, Arc::clone(&p)));
                p
            }
        }
    }
}

/// Decode activations quantized for the integer kernels, one entry per
/// chunk of up to 4 rows.
enum IntActs {
    I16(Vec<ActRows<i16>>),
    I8(Vec<ActRows<i8>>),
}

impl IntActs {
    fn chunk(&self, c: usize) -> ActQuant<'_> {
        match self {
            IntActs::I16(v) => ActQuant::I16(&v[c]),
            IntActs::I8(v) => ActQuant::I8(&v[c]),
        }
    }

    /// Chunk `c`'s per-block scales.
    fn ds(&self, c: usize) -> &[[f32; 2]] {
        match self {
            IntActs::I16(v) => &v[c].ds,
            IntActs::I8(v) => &v[c].ds,
        }
    }

    /// Every chunk split into bytes for the repacked kernels.
    fn digits(&self) -> Vec<ActDigits> {
        match self {
            IntActs::I16(v) => v.iter().map(ActDigits::new).collect(),
            IntActs::I8(v) => v.iter().map(ActDigits::new).collect(),
        }
    }
}

/// `x` (`[m, k]`) quantized in chunks of up to 4 rows, as `gemv` consumes it.
fn quantize_rows<T: ActInt>(x: &[f32], m: usize, k: usize) -> Vec<ActRows<T>> {
    (0..m)
        .step_by(4)
        .map(|i0| ActRows::quantize(&x[i0 * k..], (m - i0).min(4), k))
        .collect()
}

/// [`quantize_rows`] for rows on int8 levels ([`ActRows::levels`]), or
/// `None` when any chunk is not.
fn level_rows(x: &[f32], m: usize, k: usize) -> Option<Vec<ActRows<i8>>> {
    (0..m)
        .step_by(4)
        .map(|i0| ActRows::levels(&x[i0 * k..], (m - i0).min(4), k))
        .collect()
}
