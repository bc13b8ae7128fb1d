//! Instruction-set dispatch for the hot kernels: weight-row dot products
//! (dequantizing blocks in registers), row dequantization for GEMM panels,
//! f32 dots, and the register-blocked GEMM microkernel.
//!
//! The instruction set is chosen at run time (`is_x86_feature_detected!`);
//! every entry point here is safe and checks the slice lengths the unsafe
//! kernels rely on.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::cpu::act::{self, ActRows};
use crate::cpu::ActivationPrecision;
use crate::dtype::DType;
use crate::quants;
use std::ops::Range;

/// A CPU instruction set with its own kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// AVX-512 plus AMX's tile unit, which runs the integer prefill GEMM;
    /// every other kernel is AVX-512's.
    Amx,
    Avx512,
    Avx2,
    Neon,
    Scalar,
}

impl Isa {
    pub const ALL: [Isa; 5] = [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Scalar];

    /// The best instruction set this CPU supports.
    pub fn detect() -> Isa {
        Isa::ALL
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Scalar)
    }

    /// The name `VKLLM_CPU_ISA` takes.
    pub(crate) fn setting_name(self) -> &'static str {
        match self {
            Isa::Amx => "amx",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Neon => "neon",
            Isa::Scalar => "scalar",
        }
    }

    /// Whether this CPU can run the kernels of `self`.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512.available() && has_vnni() && amx::available(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            Isa::Scalar => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Amx => "avx512f+amx",
            Isa::Avx512 => "avx512f",
            Isa::Avx2 => "avx2+fma",
            Isa::Neon => "neon",
            Isa::Scalar => "scalar",
        }
    }

    /// Whether the AVX-512 kernels run here (AMX's too: it adds only the
    /// integer prefill tile).
    pub(crate) fn avx512(self) -> bool {
        matches!(self, Isa::Avx512 | Isa::Amx)
    }

    /// Whether the x86 kernels (AVX2 or AVX-512) run here.
    fn x86(self) -> bool {
        cfg!(target_arch = "x86_64") && (self.avx512() || self == Isa::Avx2)
    }

    /// Whether `dot_rows_int` has SIMD kernels here (AVX2, AVX-512), fast
    /// enough to serve prefill too.
    pub(crate) fn int_dots(self) -> bool {
        self.x86()
    }

    /// GEMM microkernel tile (activation rows, weight rows), or `None` when
    /// this instruction set has no GEMM kernel (row dots serve every `m` then).
    pub(crate) fn gemm_tile(self) -> Option<(usize, usize)> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => Some((x86::avx512::MR, x86::avx512::NR)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some((x86::avx2::MR, x86::avx2::NR)),
            _ => None,
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// Values handled per SIMD step for `dtype`: a whole block for quantized
/// types; floats go 16 at a time with a scalar tail.
fn simd_step(dtype: DType) -> usize {
    if dtype.is_quantized() {
        dtype.block_elems()
    } else {
        16
    }
}

/// Dots of each `k`-value weight row in `w` (rows of `row_bytes`) with the
/// `m` (1..=4) activation rows of `x` (`[m, k]`); `out` is `[rows, m]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dot_rows(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    assert!((1..=4).contains(&m) && x.len() >= m * k && out.len() >= rows * m);
    assert!(w.len() == rows * row_bytes && quant_row_ok(dtype, row_bytes, k));
    #[cfg(target_arch = "x86_64")]
    if isa.x86() && rows > 0 && x86::decodes(dtype) {
        return dot_rows_x86(isa, dtype, w, row_bytes, k, x, m, out);
    }
    dot_rows_portable(isa, dtype, w, row_bytes, k, x, m, out)
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn dot_rows_x86(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    // SAFETY: the instruction set was checked by `Isa::available` when the
    // backend was made; the caller asserted the lengths.
    unsafe {
        if isa.avx512() {
            x86::avx512::dot_rows(dtype, w, row_bytes, k, x, m, out)
        } else {
            x86::avx2::dot_rows(dtype, w, row_bytes, k, x, m, out)
        }
    }
    let simd_k = k - k % simd_step(dtype);
    if simd_k < k {
        // Float rows whose length is not a multiple of 16: the scalar tail.
        let eb = dtype.block_bytes();
        let mut tail = vec![0f32; k - simd_k];
        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
            if quants::dequantize_row(dtype, &row[simd_k * eb..], &mut tail).is_ok() {
                for i in 0..m {
                    let xs = &x[i * k + simd_k..(i + 1) * k];
                    out[r * m + i] += tail.iter().zip(xs).map(|(a, b)| a * b).sum::<f32>();
                }
            }
        }
    }
}

fn quant_row_ok(dtype: DType, row_bytes: usize, k: usize) -> bool {
    dtype.row_bytes(k).is_ok_and(|b| b == row_bytes)
}

/// Scalar, NEON and types without x86 decoders: dequantize each row with the
/// scalar decoder, then dot.
#[allow(clippy::too_many_arguments)]
fn dot_rows_portable(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    let mut row = vec![0f32; k];
    for (r, wr) in w.chunks_exact(row_bytes).enumerate() {
        if quants::dequantize_row(dtype, wr, &mut row).is_err() {
            continue;
        }
        for i in 0..m {
            out[r * m + i] = dot_f32(isa, &row, &x[i * k..(i + 1) * k]);
        }
    }
}

/// Activations quantized for the integer-dot decode kernels.
#[derive(Clone, Copy)]
pub(crate) enum ActQuant<'a> {
    I16(&'a ActRows<i16>),
    I8(&'a ActRows<i8>),
}

impl ActQuant<'_> {
    fn shape(&self) -> (usize, usize, usize, usize) {
        match self {
            ActQuant::I16(x) => (x.m, x.k, x.qs.len(), x.ds.len()),
            ActQuant::I8(x) => (x.m, x.k, x.qs.len(), x.ds.len()),
        }
    }
}

/// Whether rows of `cols` values of `dtype` stream faster through the row
/// kernel than repacked at `acts` on `isa`, so they stay GGUF rows: Q6_K
/// with 16-bit activations on AVX-512 VNNI (`intdot::vnni::q6_rows_i16`;
/// single-threaded from DRAM ~27 GB/s against the repacked kernel's ~19 at
/// 2048 columns), up to 4096 columns: its prepared activations (3 bytes a
/// value) then stay in L1, and at 8192 the repacked kernel was faster.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn rows_beat_repacked(
    isa: Isa,
    dtype: DType,
    acts: ActivationPrecision,
    cols: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() && dtype == DType::Q6K && acts == ActivationPrecision::Q16 {
        return cols <= 4096 && has_vnni();
    }
    false
}

/// Dots of each weight row in `w` (rows of `row_bytes`, a type with
/// `act::supports`) with the `m` (1..=4) quantized activation rows of `x`;
/// `out` is `[rows, m]`. Integer dots on AVX2 / AVX-512 VNNI, the scalar
/// `act::dot_row` elsewhere.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn dot_rows_int(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    x: ActQuant,
    out: &mut [f32],
) {
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    let (m, k, nq, nd) = x.shape();
    assert!(act::supports(dtype) && (1..=4).contains(&m) && k.is_multiple_of(act::ACT_BLOCK));
    assert!(w.len() == rows * row_bytes && quant_row_ok(dtype, row_bytes, k));
    assert!(nq == m * k && nd == m * k / act::ACT_BLOCK && out.len() >= rows * m);
    #[cfg(target_arch = "x86_64")]
    {
        use x86::intdot::{avx2, vnni};
        // SAFETY: the instruction set was checked when the backend was made
        // (VNNI here); the lengths were asserted above.
        unsafe {
            match (isa, x) {
                (Isa::Avx512 | Isa::Amx, ActQuant::I16(x)) if has_vnni() => {
                    return vnni::dot_rows_typed(dtype, w, row_bytes, x, out)
                }
                (Isa::Avx512 | Isa::Amx, ActQuant::I8(x)) if has_vnni() => {
                    return vnni::dot_rows_typed(dtype, w, row_bytes, x, out)
                }
                (Isa::Avx512 | Isa::Amx | Isa::Avx2, ActQuant::I16(x)) => {
                    return avx2::dot_rows_typed(dtype, w, row_bytes, x, out)
                }
                (Isa::Avx512 | Isa::Amx | Isa::Avx2, ActQuant::I8(x)) => {
                    return avx2::dot_rows_typed(dtype, w, row_bytes, x, out)
                }
                _ => {}
            }
        }
    }
    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
        for i in 0..m {
            out[r * m + i] = match x {
                ActQuant::I16(x) => act::dot_row(dtype, row, x, i),
                ActQuant::I8(x) => act::dot_row(dtype, row, x, i),
            };
        }
    }
}

/// Dots of the weight rows in `w`, whole groups of `repack::R` rows (of
/// `row_bytes`) repacked by `cpu::repack`, with the `m` (1..=4) activation
/// rows of `x` (scales `ds`, `[m, k / 32]`); `out` is `[rows, m]`. Only for
/// instruction sets with [`Isa::int_dots`].
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn dot_rows_packed(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    ds: &[[f32; 2]],
    x: &act::ActDigits,
    out: &mut [f32],
) {
    use crate::cpu::repack::{self, R};
    let (m, k) = (x.m, x.k);
    let gb = R * row_bytes;
    let groups = w.len().checked_div(gb).unwrap_or(0);
    assert!(isa.int_dots() && repack::packs(dtype) && quant_row_ok(dtype, row_bytes, k));
    assert!((1..=4).contains(&m) && k.is_multiple_of(act::ACT_BLOCK) && w.len() == groups * gb);
    assert!(x.hi.len() == m * k && (x.lo.is_empty() || x.lo.len() == m * k));
    assert!(x.x32.len() == m * k / 16 && ds.len() == m * k / act::ACT_BLOCK);
    assert!(x.s256.len() == m * (k / 256));
    assert!(out.len() >= groups * R * m);
    #[cfg(target_arch = "x86_64")]
    {
        use x86::packed::{avx2, vnni, Xrow};
        let blocks = row_bytes / dtype.block_bytes();
        let (lo, vnni) = (!x.lo.is_empty(), isa.avx512() && has_vnni());
        let mut tmp = [0f32; R * 4];
        let row = |i: usize| Xrow {
            hi: x.hi[i * k..].as_ptr(),
            lo: if lo {
                x.lo[i * k..].as_ptr()
            } else {
                x.hi.as_ptr().cast()
            },
            ds: ds[i * k / act::ACT_BLOCK..].as_ptr(),
            x32: x.x32[i * k / 16..].as_ptr(),
            s256: x.s256[i * (k / 256)..].as_ptr(),
        };
        let xr: [Xrow; 4] = core::array::from_fn(|i| row(i.min(m - 1)));
        let xr = &xr[..m];
        for g in 0..groups {
            let wg = w[g * gb..].as_ptr();
            // SAFETY: the instruction set (and VNNI where used) was checked
            // when the backend was made; group g holds `blocks` blocks of 16
            // rows; `tmp` takes 16 values for each of the m ≤ 4 rows.
            unsafe {
                if vnni {
                    vnni::group_rows(dtype, wg, blocks, xr, lo, tmp.as_mut_ptr())
                } else {
                    avx2::group_rows(dtype, wg, blocks, xr, lo, tmp.as_mut_ptr())
                }
            }
            for i in 0..m {
                for (j, v) in tmp[R * i..R * (i + 1)].iter().enumerate() {
                    out[(g * R + j) * m + i] = *v;
                }
            }
        }
    }
}

/// Integer GEMM tile of `isa` (activation rows, weight rows): AVX-512 VNNI's
/// or AVX2's. Only for instruction sets with [`Isa::int_dots`].
pub(crate) fn int_gemm_tile(isa: Isa) -> (usize, usize) {
    assert!(isa.int_dots());
    #[cfg(target_arch = "x86_64")]
    {
        use x86::intdot::{avx2, vnni};
        if isa.avx512() && has_vnni() {
            vnni::GEMM_TILE
        } else {
            avx2::GEMM_TILE
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("integer GEMM kernels exist on x86-64 only")
}

/// Up to one tile's worth of weight rows (`nr` of [`int_gemm_tile`])
/// decoded for the integer GEMM: 16-bit values in pairs, interleaved across
/// the rows, and per scale group each row's scale and offset (see the x86
/// `pack_panel`). Reused from panel to panel by one worker.
pub(crate) struct IntPanel {
    nr: usize,
    /// Reduction length and pairs per scale group of the rows packed last.
    k: usize,
    g: usize,
    pw: Vec<i32>,
    ps: Vec<f32>,
    po: Vec<f32>,
    /// Values per scale group of an 8-bit panel ([`IntPanel::new8`]); 0
    /// for a 16-bit one.
    span: usize,
}

impl IntPanel {
    /// Room for rows of up to `k` values; `k` a multiple of 32.
    pub(crate) fn new(isa: Isa, k: usize) -> IntPanel {
        let nr = int_gemm_tile(isa).1;
        // Q6_K has two scale groups per block.
        let groups = 2 * (k / act::ACT_BLOCK);
        IntPanel {
            nr,
            k: 0,
            g: 16,
            pw: vec![0; k / 2 * nr],
            ps: vec![0.0; groups * nr],
            po: vec![0.0; groups * nr],
            span: 0,
        }
    }

    /// An 8-bit panel ([`pack_int8_panel`]) for rows of up to `k` values,
    /// `span` ([`int8_span`]) dividing `k`; `isa` one of [`int8_gemm`].
    pub(crate) fn new8(isa: Isa, k: usize, span: usize) -> IntPanel {
        let nr = int8_gemm_tile(isa).1;
        IntPanel {
            nr,
            k: 0,
            g: 0,
            pw: vec![0; k / 4 * nr],
            ps: vec![0.0; k / span * nr],
            po: vec![0.0; k / span * nr],
            span,
        }
    }
}

/// Whether `isa` has the 8-bit integer GEMM for weights of `dtype` (one of
/// `act::supports`): AVX-512 VNNI for all, AVX2 for all but Q8_0, whose
/// unsigned digits (up to 255) would saturate `vpmaddubsw`'s i16 pairs.
pub(crate) fn int8_gemm(isa: Isa, dtype: DType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (isa.avx512() && has_vnni()) || (isa.int_dots() && dtype != DType::Q8_0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, dtype);
        false
    }
}

/// Values per scale group of the 8-bit integer GEMM for weights of `dtype`
/// (see the x86 `pack_panel8`): Q6_K's 16-value scales; the ternary types'
/// one `d` per 256 values when every activation row has one scale
/// (`row_scale`: the exact sums then span 256 values before scaling);
/// else one block.
pub(crate) fn int8_span(dtype: DType, row_scale: bool) -> usize {
    match dtype {
        DType::Q6K => 16,
        DType::TQ1_0 | DType::TQ2_0 if row_scale => 256,
        _ => act::ACT_BLOCK,
    }
}

/// 8-bit integer GEMM tile of `isa` (activation rows, weight rows); `isa`
/// as for [`int8_gemm`].
pub(crate) fn int8_gemm_tile(isa: Isa) -> (usize, usize) {
    assert!(isa.int_dots());
    #[cfg(target_arch = "x86_64")]
    {
        use x86::intdot::{avx2, vnni};
        if isa.avx512() && has_vnni() {
            vnni::GEMM8_TILE
        } else {
            avx2::GEMM8_TILE
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("integer GEMM kernels exist on x86-64 only")
}

/// The weight rows `w` (as for [`pack_int_panel`], `dtype` one of
/// [`int8_gemm`]) decoded into the 8-bit `panel` (`IntPanel::new8`).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn pack_int8_panel(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    panel: &mut IntPanel,
) {
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    let (nr, span) = (panel.nr, panel.span);
    assert!(int8_gemm(isa, dtype) && k.is_multiple_of(act::ACT_BLOCK) && rows <= nr);
    assert!(w.len() == rows * row_bytes && quant_row_ok(dtype, row_bytes, k));
    assert!(nr == int8_gemm_tile(isa).1 && span > 0 && k.is_multiple_of(span));
    assert!(span == int8_span(dtype, span == 256) && panel.pw.len() >= k / 4 * nr);
    assert!(panel.ps.len().min(panel.po.len()) >= k / span * nr);
    if rows < nr {
        panel.pw.fill(0);
        panel.ps.fill(0.0);
        panel.po.fill(0.0);
    }
    panel.k = k;
    #[cfg(target_arch = "x86_64")]
    {
        use x86::intdot::{avx2, vnni};
        let nb = k / act::ACT_BLOCK;
        let (pw, ps, po) = (
            panel.pw.as_mut_ptr(),
            panel.ps.as_mut_ptr(),
            panel.po.as_mut_ptr(),
        );
        let wp = w.as_ptr();
        // SAFETY: the instruction set was checked when the backend was made
        // (VNNI here); the panel holds `nb` blocks' quads and `k / span`
        // groups' scales and offsets for `nr` rows, and `w` `rows` rows of
        // `nb` blocks, all asserted above.
        unsafe {
            if isa.avx512() && has_vnni() {
                vnni::pack_panel8_typed(dtype, wp, row_bytes, rows, nb, span, pw, ps, po)
            } else {
                avx2::pack_panel8_typed(dtype, wp, row_bytes, rows, nb, span, pw, ps, po)
            }
        }
    }
}

/// One tile of the 8-bit integer GEMM: the activation rows packed by
/// `act::pack_quads` (`xq`, `xd`, with [`int8_gemm_tile`]'s `mr` and the
/// panel's span) against `panel`, into `out` (`[mr][nr]`).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn int8_gemm_tile_run(
    isa: Isa,
    panel: &IntPanel,
    xq: &[i32],
    xd: &[f32],
    out: &mut [f32],
) {
    let (mr, nr) = int8_gemm_tile(isa);
    let (k, span) = (panel.k, panel.span);
    assert!(span > 0 && panel.nr == nr && k.is_multiple_of(span));
    let groups = k / span;
    assert!(xq.len() == k / 4 * mr && xd.len() == groups * 2 * mr);
    assert!(out.len() >= mr * nr && panel.pw.len() >= k / 4 * nr);
    assert!(panel.ps.len().min(panel.po.len()) >= groups * nr);
    #[cfg(target_arch = "x86_64")]
    {
        use x86::intdot::{avx2, vnni};
        let (pw, ps, po) = (panel.pw.as_ptr(), panel.ps.as_ptr(), panel.po.as_ptr());
        let (xq, xd, o) = (xq.as_ptr(), xd.as_ptr(), out.as_mut_ptr());
        // SAFETY: instruction set (and VNNI for its tile) checked when the
        // backend was made; the lengths were asserted above.
        unsafe {
            if isa.avx512() && has_vnni() {
                vnni::gemm8_tile(span, pw, ps, po, groups, xq, xd, o)
            } else {
                avx2::gemm8_tile(span, pw, ps, po, groups, xq, xd, o)
            }
        }
    }
}

/// The weight rows `w` (rows of `row_bytes`, at most the panel's `nr`, of
/// `k` values of a type with `act::supports`) decoded into `panel`; rows
/// past them are zero.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn pack_int_panel(
    isa: Isa,
    dtype: DType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    panel: &mut IntPanel,
) {
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    let nr = panel.nr;
    assert!(act::supports(dtype) && k.is_multiple_of(act::ACT_BLOCK) && rows <= nr);
    assert!(w.len() == rows * row_bytes && quant_row_ok(dtype, row_bytes, k));
    assert!(nr == int_gemm_tile(isa).1 && panel.pw.len() >= k / 2 * nr);
    assert!(panel.ps.len().min(panel.po.len()) >= 2 * (k / act::ACT_BLOCK) * nr);
    if rows < nr {
        panel.pw.fill(0);
        panel.ps.fill(0.0);
        panel.po.fill(0.0);
    }
    panel.k = k;
    #[cfg(target_arch = "x86_64")]
    {
        use x86::intdot::{avx2, vnni};
        let nb = k / act::ACT_BLOCK;
        let (pw, ps, po) = (
            panel.pw.as_mut_ptr(),
            panel.ps.as_mut_ptr(),
            panel.po.as_mut_ptr(),
        );
        // SAFETY: the instruction set was checked when the backend was made
        // (VNNI here); the panel holds `nb` blocks' pairs, scales and
        // offsets (two groups a block) for `nr` rows, and `w` `rows` rows of
        // `nb` blocks, all asserted above.
        panel.g = unsafe {
            if isa.avx512() && has_vnni() {
                vnni::pack_panel_typed::<16>(dtype, w.as_ptr(), row_bytes, rows, nb, pw, ps, po)
            } else {
                avx2::pack_panel_typed::<16>(dtype, w.as_ptr(), row_bytes, rows, nb, pw, ps, po)
            }
        };
    }
}

/// One tile of the integer GEMM: the activation rows packed by
/// `act::pack_rows` (`xq`, `xd`, with [`int_gemm_tile`]'s `mr`) against
/// `panel`, into `out` (`[mr][nr]`).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn int_gemm_tile_run(
    isa: Isa,
    panel: &IntPanel,
    xq: &[i32],
    xd: &[f32],
    out: &mut [f32],
) {
    let (mr, nr) = int_gemm_tile(isa);
    let k = panel.k;
    let groups = k / 2 / panel.g;
    assert!(panel.nr == nr && xq.len() == k / 2 * mr && xd.len() == k / act::ACT_BLOCK * 2 * mr);
    assert!(out.len() >= mr * nr && panel.pw.len() >= k / 2 * nr);
    assert!(panel.ps.len().min(panel.po.len()) >= groups * nr);
    #[cfg(target_arch = "x86_64")]
    {
        use x86::intdot::{avx2, vnni};
        let (pw, ps, po) = (panel.pw.as_ptr(), panel.ps.as_ptr(), panel.po.as_ptr());
        let (xq, xd, o) = (xq.as_ptr(), xd.as_ptr(), out.as_mut_ptr());
        // SAFETY: instruction set (and VNNI for its tile) checked when the
        // backend was made; the lengths were asserted above.
        unsafe {
            if isa.avx512() && has_vnni() {
                vnni::gemm_tile(panel.g, pw, ps, po, groups, xq, xd, o)
            } else {
                avx2::gemm_tile(panel.g, pw, ps, po, groups, xq, xd, o)
            }
        }
    }
}

/// AVX-512 VNNI, with the BW and VL parts its kernels also use.
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
}

/// One weight row dequantized into `out` (`out.len()` values).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn dequant_row(isa: Isa, dtype: DType, w: &[u8], out: &mut [f32]) {
    let k = out.len();
    assert!(quant_row_ok(dtype, w.len(), k));
    #[cfg(target_arch = "x86_64")]
    if isa.x86() && x86::decodes(dtype) {
        let simd_k = k - k % simd_step(dtype);
        // SAFETY: instruction set checked at backend creation; row length asserted.
        unsafe {
            if isa.avx512() {
                x86::avx512::dequant_row(dtype, w, &mut out[..simd_k])
            } else {
                x86::avx2::dequant_row(dtype, w, &mut out[..simd_k])
            }
        }
        if simd_k < k {
            let _ = quants::dequantize_row(
                dtype,
                &w[simd_k * dtype.block_bytes()..],
                &mut out[simd_k..],
            );
        }
        return;
    }
    let _ = quants::dequantize_row(dtype, w, out);
}

/// `Σ a[i] * b[i]` (f32 accumulation); `b` must be at least as long as `a`.
pub(crate) fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    assert!(b.len() >= a.len());
    match isa {
        // SAFETY: instruction set checked at backend creation; lengths asserted.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => unsafe { x86::avx512::dot_f32(a, b) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::avx2::dot_f32(a, b) },
        // SAFETY: NEON checked at backend creation; lengths asserted.
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => unsafe { neon::dot_f32(a, b) },
        _ => dot_f32_scalar(a, b),
    }
}

/// `y[i] += a * x[i]`; `x` must be at least as long as `y`.
pub(crate) fn axpy(isa: Isa, a: f32, x: &[f32], y: &mut [f32]) {
    assert!(x.len() >= y.len());
    match isa {
        // SAFETY: instruction set checked at backend creation; lengths asserted.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => unsafe { x86::avx512::axpy(a, x, y) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::avx2::axpy(a, x, y) },
        _ => y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x),
    }
}

/// Attention for one (query row, head) whose `o.len()` dims fit registers
/// (see the x86 `attention_head`), with the head's `sink` logit in its
/// softmax: `false` when no such kernel applies, and the caller uses the
/// general path.
// `scores` is a Vec because the kernel fills it by pushing.
#[allow(clippy::too_many_arguments, clippy::ptr_arg)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) fn attention_head(
    isa: Isa,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    stride: usize,
    kvo: usize,
    first: usize,
    last: usize,
    scale: f32,
    sink: Option<f32>,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) -> bool {
    let hd = o.len();
    let fits = q.len() >= hd && last * stride + kvo + hd <= k.len().min(v.len()) && first <= last;
    if !fits {
        return false;
    }
    match isa {
        // SAFETY: instruction set checked at backend creation; every key and
        // value row read (first..=last) lies inside `k`/`v`, checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => unsafe {
            x86::avx512::attention_head(q, k, v, stride, kvo, first, last, scale, sink, scores, o)
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe {
            x86::avx2::attention_head(q, k, v, stride, kvo, first, last, scale, sink, scores, o)
        },
        _ => false,
    }
}

/// Eight independent partial sums, so the compiler can vectorize and the
/// rounding matches the SIMD kernels' blocked order in spirit.
fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[8 * c + l] * b[8 * c + l];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

/// `x` (`[m, k]`) regrouped as `[ceil(m / mr), k, mr]` (zero-padded), so the
/// GEMM microkernel reads its `mr` activation rows as one contiguous stream:
/// rows `k` floats apart would alias in L1 whenever `4k` is a multiple of 4 KiB.
pub(crate) fn pack_activations(x: &[f32], m: usize, k: usize, mr: usize) -> Vec<f32> {
    let blocks = m.div_ceil(mr);
    let mut out = vec![0f32; blocks * k * mr];
    for (i, row) in x.chunks_exact(k).take(m).enumerate() {
        let block = &mut out[(i / mr) * k * mr..];
        for (kk, v) in row.iter().enumerate() {
            block[kk * mr + i % mr] = *v;
        }
    }
    out
}

/// `y[i * ldy + j] (+)= Σ_{kk in k} x[i, kk] * panel[kk - k.start, j]` for
/// `i < m`, `j < ncols`: `panel` is `[k.len(), nr]`, `xp` the activations
/// (`k_total` columns) packed by [`pack_activations`] with this instruction
/// set's [`Isa::gemm_tile`]. Chunks after the first (`k.start > 0`) add to `y`.
/// Only for instruction sets with a GEMM kernel.
///
/// # Safety
/// `y` must be valid for writes of `ncols` values at `y + i * ldy` for every `i < m`.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(crate) unsafe fn gemm_panel(
    isa: Isa,
    panel: &[f32],
    xp: &[f32],
    m: usize,
    k: Range<usize>,
    k_total: usize,
    y: *mut f32,
    ldy: usize,
    ncols: usize,
) {
    let (mr, nr) = isa.gemm_tile().unwrap_or((1, 0));
    let kc = k.len();
    assert!(k.end <= k_total && panel.len() >= kc * nr && ncols <= nr);
    assert!(xp.len() >= m.div_ceil(mr) * mr * k_total);
    // Packed block b starts at b * k_total * mr; within it column kk is at kk * mr.
    let x = &xp[k.start * mr..];
    let accumulate = k.start > 0;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => {
            x86::avx512::gemm_panel(panel, x, m, k_total, kc, y, ldy, ncols, accumulate)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2::gemm_panel(panel, x, m, k_total, kc, y, ldy, ncols, accumulate),
        _ => {}
    }
}
