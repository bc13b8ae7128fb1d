//! `y[m, n] = x[m, k] · Wᵀ + bias` with exactly dequantized weights.
//!
//! Decode (`m <= GEMV_MAX_M`), and short prefill of the repacked types whose
//! row dots beat the GEMM there (`packed_dots_max_m`: the ternary ones): each
//! weight row is read once against each chunk of up to four activation rows;
//! the team splits the output rows (`gemv.rs`). Rows of the types of
//! `act::supports` (legacy 4/5/8-bit, Q4_K, Q5_K, Q6_K) meet activations
//! rounded to 16-bit (default) or 8-bit integers per 32-value block in exact
//! integer dots (`ActivationPrecision`); other types, and
//! `ActivationPrecision::F32`, dequantize in registers and use f32 FMAs.
//! Prefill of those types with rounded activations, where the instruction
//! set has integer kernels (`Isa::int_dots`): the activations are quantized
//! once, as for decode, and each panel of weight rows is decoded once into
//! 16-bit integers that the integer tile reuses across all `m` rows, with
//! exact per-block integer sums; the team splits the panels. With int8
//! activations (rows on int8 levels, exact; or `ActivationPrecision::Q8`)
//! where the instruction set has it (`simd::int8_gemm`), both sides go as
//! bytes instead (`gemm_int8`): twice the products per instruction.
//! Other prefill: weight rows are dequantized once per panel of `NR` rows into an
//! f32 `[k, NR]` tile that the register-blocked microkernel reuses across all
//! `m` activation rows; the team splits the panels.

mod gemv;

pub(crate) use gemv::{gemv_each, gemv_glu, glu_fits, ActsMemo, Part, GEMV_MAX_M};

use super::act::{self, ActRows, ACT_BLOCK};
use super::buffers::WeightRows;
use super::par::{self, Ctx};
use super::simd;
use super::ActivationPrecision;
use gemv::gemv;

/// Raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a disjoint set of elements of one live slice.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
impl OutPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Shapes are checked by the caller: `x` is `[m, w.cols]`, `y` is `[m, w.rows]`,
/// `bias` has `w.rows` values.
pub(crate) fn run(
    ctx: Ctx,
    w: WeightRows<'_>,
    bias: Option<&[f32]>,
    x: &[f32],
    y: &mut [f32],
    m: usize,
    memo: Option<(&ActsMemo, u32)>,
) {
    let n = w.rows;
    if m == 0 || n == 0 {
        return;
    }
    let int = ctx.acts != ActivationPrecision::F32
        && act::supports(w.dtype)
        && w.cols.is_multiple_of(ACT_BLOCK);
    let row_dots = int && w.packed && m <= w.dtype.format().cpu.packed_dots_max_m;
    match ctx.isa.gemm_tile() {
        // An empty reduction leaves only the bias.
        _ if w.cols == 0 => y.fill(0.0),
        _ if row_dots => gemv(ctx, w, x, y, m, memo),
        #[cfg(target_arch = "x86_64")]
        _ if int && m > GEMV_MAX_M && ctx.isa == simd::Isa::Amx => {
            let levels = ActRows::levels_on(ctx.par, x, m, w.cols);
            gemm_amx::<simd::amx::Hardware>(ctx, w, x, levels.as_ref(), y, m)
        }
        _ if int && m > GEMV_MAX_M && ctx.isa.int_dots() => {
            // Rows on int8 levels (BitNet's) are exact as int8 at any
            // integer precision; other rows are int8 only when asked (Q8).
            let eight = simd::int8_gemm(ctx.isa, w.dtype);
            match eight
                .then(|| ActRows::levels_on(ctx.par, x, m, w.cols))
                .flatten()
            {
                Some(levels) => gemm_int8(ctx, w, x, Some(&levels), y, m),
                None if eight && ctx.acts == ActivationPrecision::Q8 => {
                    gemm_int8(ctx, w, x, None, y, m)
                }
                None => gemm_int(ctx, w, x, y, m),
            }
        }
        Some((mr, nr)) if m > GEMV_MAX_M => gemm(ctx, mr, nr, w, x, y, m),
        _ => gemv(ctx, w, x, y, m, memo),
    }
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(n) {
            for (v, b) in row.iter_mut().zip(b) {
                *v += b;
            }
        }
    }
}

/// Reduction length above which `k` is split into chunks, so the activation
/// chunk swept by every panel (`m * kc` floats) stays in L2 and the panel
/// chunk in L1. Up to this length, one pass (SmolLM2's 576 and 1536 run at
/// full speed that way).
const K_SPLIT_ABOVE: usize = 1536;
/// Target chunk of the reduction when splitting.
const KC: usize = 256;

fn gemm(ctx: Ctx, mr: usize, nr: usize, w: WeightRows<'_>, x: &[f32], y: &mut [f32], m: usize) {
    let (n, k) = (w.rows, w.cols);
    let (be, bb) = (w.dtype.block_elems(), w.dtype.block_bytes());
    // Chunks hold whole blocks (and whole 16-value float steps).
    let kc = if k > K_SPLIT_ABOVE {
        KC.max(be).next_multiple_of(be.max(16))
    } else {
        k
    };
    let xp = simd::pack_activations(x, m, k, mr);
    let yp = OutPtr(y.as_mut_ptr());
    let isa = ctx.isa;
    for k0 in (0..k).step_by(kc) {
        let k1 = (k0 + kc).min(k);
        let kn = k1 - k0;
        par::range_init(
            ctx.par,
            n.div_ceil(nr),
            || (vec![0f32; kc * nr], vec![0f32; kc], Vec::new()),
            |(panel, row, scratch), p| {
                let r0 = p * nr;
                let nc = nr.min(n - r0);
                let row = &mut row[..kn];
                for j in 0..nr {
                    if j < nc {
                        let whole = w.rows_at(r0 + j, r0 + j + 1, scratch);
                        let bytes = &whole[k0 / be * bb..k1 / be * bb];
                        simd::dequant_row(isa, w.dtype, bytes, row);
                    } else {
                        row.fill(0.0);
                    }
                    for (kk, v) in row.iter().enumerate() {
                        panel[kk * nr + j] = *v;
                    }
                }
                // SAFETY: columns r0..r0 + nc of every output row belong to
                // this panel alone and lie inside the [m, n] output.
                unsafe { simd::gemm_panel(isa, panel, &xp, m, k0..k1, k, yp.get().add(r0), n, nc) };
            },
        );
    }
}

thread_local! {
    /// `gemm_int`'s packed activations, reused by the next call on this thread.
    static PACKED_X: std::cell::Cell<(Vec<i32>, Vec<f32>)> = const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// Prefill with integer dots: activations quantized once into groups of
/// `mr` rows (`act::pack_rows`), then per panel of `nr` weight rows one
/// decode into 16-bit integers (`simd::pack_int_panel`), reused by every
/// group's tile.
fn gemm_int(ctx: Ctx, w: WeightRows<'_>, x: &[f32], y: &mut [f32], m: usize) {
    let isa = ctx.isa;
    let (n, k, rb) = (w.rows, w.cols, w.row_bytes);
    let (mr, nr) = simd::int_gemm_tile(isa);
    let groups = m.div_ceil(mr);
    let (gq, gd) = (k / 2 * mr, k / ACT_BLOCK * 2 * mr);
    // Kept from call to call (a fresh allocation page-faults on first write).
    let (mut xq, mut xd) = PACKED_X.take();
    xq.resize(groups * gq, 0);
    xd.resize(groups * gd, 0.0);
    // Scales first (serially: small), then the values per group in parallel.
    let mut dgroups: Vec<&mut [f32]> = xd.chunks_mut(gd).collect();
    let dgroups: Vec<std::sync::Mutex<&mut [f32]>> =
        dgroups.drain(..).map(std::sync::Mutex::new).collect();
    par::chunks(ctx.par, &mut xq, gq, |g, q| {
        let rows = &x[g * mr * k..((g + 1) * mr).min(m) * k];
        let mut d = dgroups[g].lock().unwrap_or_else(|e| e.into_inner());
        match ctx.acts {
            ActivationPrecision::Q8 => act::pack_rows::<i8>(rows, k, mr, q, &mut d),
            _ => act::pack_rows::<i16>(rows, k, mr, q, &mut d),
        }
    });
    drop(dgroups);
    let yp = OutPtr(y.as_mut_ptr());
    par::range_init(
        ctx.par,
        n.div_ceil(nr),
        || (simd::IntPanel::new(isa, k), vec![0f32; mr * nr], Vec::new()),
        |(panel, tile, scratch), p| {
            let r0 = p * nr;
            let nc = nr.min(n - r0);
            let rows = w.rows_at(r0, r0 + nc, scratch);
            simd::pack_int_panel(isa, w.dtype, rows, rb, k, panel);
            for g in 0..groups {
                let (q, d) = (&xq[g * gq..(g + 1) * gq], &xd[g * gd..(g + 1) * gd]);
                simd::int_gemm_tile_run(isa, panel, q, d, tile);
                store_tile(tile, yp, g * mr, mr.min(m - g * mr), n, r0, nr, nc);
            }
        },
    );
    PACKED_X.set((xq, xd));
}

/// Rows `0..mm` and columns `0..nc` of a `[mr][nr]` tile into rows `i0..`
/// and columns `r0..` of the `[m, n]` output behind `yp`; the caller owns
/// those columns alone.
#[allow(clippy::too_many_arguments)]
fn store_tile(
    tile: &[f32],
    yp: OutPtr,
    i0: usize,
    mm: usize,
    n: usize,
    r0: usize,
    nr: usize,
    nc: usize,
) {
    for i in 0..mm {
        for (j, v) in tile[i * nr..i * nr + nc].iter().enumerate() {
            // SAFETY: (i0 + i, r0 + j) lies in the [m, n] output; columns
            // r0..r0 + nc belong to the calling panel alone.
            unsafe { *yp.get().add((i0 + i) * n + r0 + j) = *v };
        }
    }
}

/// [`gemm_int`] with 8-bit integers: activations as int8 quads
/// (`act::pack_quads`) from `levels` (rows on int8 levels, exact) or
/// quantized per block, each panel of weight rows decoded once into
/// unsigned digits (`simd::pack_int8_panel`): twice the products per
/// instruction of the 16-bit tile, half the panel bytes.
pub(super) fn gemm_int8(
    ctx: Ctx,
    w: WeightRows<'_>,
    x: &[f32],
    levels: Option<&ActRows<i8>>,
    y: &mut [f32],
    m: usize,
) {
    let isa = ctx.isa;
    let (n, k, rb) = (w.rows, w.cols, w.row_bytes);
    let (mr, nr) = simd::int8_gemm_tile(isa);
    let span = simd::int8_span(w.dtype, levels.is_some());
    let groups = m.div_ceil(mr);
    let (gq, gd) = (k / 4 * mr, k / span * 2 * mr);
    // Kept from call to call (a fresh allocation page-faults on first write).
    let (mut xq, mut xd) = PACKED_X.take();
    xq.resize(groups * gq, 0);
    xd.resize(groups * gd, 0.0);
    let xds: Vec<std::sync::Mutex<&mut [f32]>> =
        xd.chunks_mut(gd).map(std::sync::Mutex::new).collect();
    par::chunks(ctx.par, &mut xq, gq, |g, q| {
        let mut d = xds[g].lock().unwrap_or_else(|e| e.into_inner());
        match levels {
            Some(a) => act::pack_quads(a, g * mr, mr, span, q, &mut d),
            None => {
                let rows = ((g + 1) * mr).min(m) - g * mr;
                let a = ActRows::<i8>::quantize(&x[g * mr * k..], rows, k);
                act::pack_quads(&a, 0, mr, span, q, &mut d)
            }
        }
    });
    drop(xds);
    let yp = OutPtr(y.as_mut_ptr());
    par::range_init(
        ctx.par,
        n.div_ceil(nr),
        || {
            (
                simd::IntPanel::new8(isa, k, span),
                vec![0f32; mr * nr],
                Vec::new(),
            )
        },
        |(panel, tile, scratch), p| {
            let r0 = p * nr;
            let nc = nr.min(n - r0);
            let rows = w.rows_at(r0, r0 + nc, scratch);
            simd::pack_int8_panel(isa, w.dtype, rows, rb, k, panel);
            for g in 0..groups {
                let (q, d) = (&xq[g * gq..(g + 1) * gq], &xd[g * gd..(g + 1) * gd]);
                simd::int8_gemm_tile_run(isa, panel, q, d, tile);
                store_tile(tile, yp, g * mr, mr.min(m - g * mr), n, r0, nr, nc);
            }
        },
    );
    PACKED_X.set((xq, xd));
}

/// [`gemm_int8`] on AMX's tile unit (`simd::amx`): activation rows in
/// groups of 16 as bytes (`levels`, or quantized: 8-bit with
/// `ActivationPrecision::Q8`, else 16-bit split into two bytes), each
/// panel of 32 weight rows decoded once into two `pack_int8_panel`
/// panels, then one tile of 16 or 32 activation rows at a time (32 with
/// 8-bit rows: the four C tiles of 16 × 16 fill the unit).
#[cfg(target_arch = "x86_64")]
pub(super) fn gemm_amx<U: simd::amx::TileUnit + Default>(
    ctx: Ctx,
    w: WeightRows<'_>,
    x: &[f32],
    levels: Option<&ActRows<i8>>,
    y: &mut [f32],
    m: usize,
) {
    use simd::amx::{TileActs, Tiles, COLS, ROWS};
    let isa = ctx.isa;
    let (n, k, rb) = (w.rows, w.cols, w.row_bytes);
    let span = simd::int8_span(w.dtype, levels.is_some());
    let acts = match levels {
        Some(a) => TileActs::from_rows(ctx.par, a, span),
        None if ctx.acts == ActivationPrecision::Q8 => {
            TileActs::quantize::<i8>(ctx.par, x, m, k, span)
        }
        None => TileActs::quantize::<i16>(ctx.par, x, m, k, span),
    };
    let mt = if acts.wide || m <= ROWS { 1 } else { 2 };
    let yp = OutPtr(y.as_mut_ptr());
    par::range_init(
        ctx.par,
        n.div_ceil(COLS),
        || {
            let panel = || simd::IntPanel::new8(isa, k, span);
            let tile = vec![0f32; mt * ROWS * COLS];
            (Tiles::<U>::new(span), [panel(), panel()], tile, Vec::new())
        },
        |(tiles, panels, tile, scratch), p| {
            let r0 = p * COLS;
            let nc = COLS.min(n - r0);
            for (h, panel) in panels.iter_mut().enumerate() {
                let (a, b) = ((r0 + h * ROWS).min(n), (r0 + (h + 1) * ROWS).min(n));
                let rows = w.rows_at(a, b, scratch);
                simd::pack_int8_panel(isa, w.dtype, rows, rb, k, panel);
            }
            for g in (0..acts.groups.len()).step_by(mt) {
                let gt = mt.min(acts.groups.len() - g);
                tiles.run(&acts, g, gt, [&panels[0], &panels[1]], tile);
                let (i0, rows) = (g * ROWS, (m - g * ROWS).min(gt * ROWS));
                store_tile(tile, yp, i0, rows, n, r0, COLS, nc);
            }
        },
    );
}
