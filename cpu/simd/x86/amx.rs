//! AMX's tile unit for the integer prefill GEMM: the tile configuration,
//! the instructions used (behind [`TileUnit`], so tests on machines
//! without AMX run the same kernel on [`Emulated`] tiles), and the GEMM
//! tile whose per-scale-group epilogue in AVX-512 registers is the VNNI
//! 8-bit tile's (`intdot::vnni::tile`), operation for operation.
//!
//! Tiles, as `ldtilecfg` shapes them ([`TileConfig::gemm`]): 0..4 the i32
//! sums (16 × 16), 4 and 5 the activations (16 rows × `kt` bytes, row
//! major), 6 and 7 the weights (`kt / 4` rows × 64 bytes: per row one quad
//! of 4 consecutive values of each of 16 weight rows, which is exactly the
//! layout of a `pack_panel8` panel).

use core::arch::asm;
use core::arch::x86_64::*;

/// The 64 bytes `ldtilecfg` reads (palette 1: 8 tiles of up to 16 rows of
/// 64 bytes).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    /// Bytes per row of each tile (8..16 reserved, zero).
    colsb: [u16; 16],
    /// Rows of each tile (8..16 reserved, zero).
    rows: [u8; 16],
}

impl TileConfig {
    /// The GEMM's tiles for `kt` (16, 32 or 64) values per product.
    pub(crate) fn gemm(kt: usize) -> TileConfig {
        debug_assert!(matches!(kt, 16 | 32 | 64));
        let mut c = TileConfig {
            palette: 1,
            ..TileConfig::default()
        };
        for t in 0..8 {
            let (rows, colsb) = match t {
                0..4 => (16, 64),
                4 | 5 => (16, kt),
                _ => (kt / 4, 64),
            };
            c.rows[t] = rows as u8;
            c.colsb[t] = colsb as u16;
        }
        c
    }
}

/// The AMX instructions the GEMM uses; tile numbers are constants, as the
/// instructions encode them.
pub(crate) trait TileUnit {
    /// Whether this unit can run here (AMX present and lent to the process).
    fn ready() -> bool;
    /// `ldtilecfg`: shapes every tile and zeroes them.
    unsafe fn configure(&mut self, cfg: &TileConfig);
    /// `tilezero`.
    unsafe fn zero<const T: u8>(&mut self);
    /// `tileloadd`: tile `T`'s rows from `p`, `stride` bytes apart.
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize);
    /// `tilestored`: tile `T`'s rows to `p`, `stride` bytes apart.
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize);
    /// `tdpbsud`: `C += A · B`, signed bytes of `A`, unsigned of `B`.
    unsafe fn dot_su<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tdpbuud`: `C += A · B`, unsigned bytes of both.
    unsafe fn dot_uu<const C: u8, const A: u8, const B: u8>(&mut self);
    /// `tilerelease`: the tile state back to its initial (unused) one.
    unsafe fn release(&mut self);
}

/// The CPU's tile unit. Its methods need AMX with the tile data lent to
/// the process (`simd::amx::available`).
#[derive(Default)]
pub(crate) struct Hardware;

// SAFETY (every method): AMX is available and enabled for the process
// (the callers' contract, checked by `ready` where the unit is made); the
// asm touches only the tile registers and the memory named.
impl TileUnit for Hardware {
    fn ready() -> bool {
        super::super::amx::available()
    }

    #[inline(always)]
    unsafe fn configure(&mut self, cfg: &TileConfig) {
        asm!("ldtilecfg [{}]", in(reg) cfg, options(nostack, readonly, preserves_flags));
    }

    #[inline(always)]
    unsafe fn zero<const T: u8>(&mut self) {
        asm!("tilezero tmm{t}", t = const T, options(nostack, nomem, preserves_flags));
    }

    #[inline(always)]
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize) {
        asm!(
            "tileloadd tmm{t}, [{p} + {s}*1]",
            t = const T,
            p = in(reg) p,
            s = in(reg) stride,
            options(nostack, readonly, preserves_flags)
        );
    }

    #[inline(always)]
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize) {
        asm!(
            "tilestored [{p} + {s}*1], tmm{t}",
            t = const T,
            p = in(reg) p,
            s = in(reg) stride,
            options(nostack, preserves_flags)
        );
    }

    #[inline(always)]
    unsafe fn dot_su<const C: u8, const A: u8, const B: u8>(&mut self) {
        asm!(
            "tdpbsud tmm{c}, tmm{a}, tmm{b}",
            c = const C,
            a = const A,
            b = const B,
            options(nostack, nomem, preserves_flags)
        );
    }

    #[inline(always)]
    unsafe fn dot_uu<const C: u8, const A: u8, const B: u8>(&mut self) {
        asm!(
            "tdpbuud tmm{c}, tmm{a}, tmm{b}",
            c = const C,
            a = const A,
            b = const B,
            options(nostack, nomem, preserves_flags)
        );
    }

    #[inline(always)]
    unsafe fn release(&mut self) {
        asm!("tilerelease", options(nostack, nomem, preserves_flags));
    }
}

/// 16 activation rows packed for the A tiles (`simd::amx::TileActs`):
/// `hi` `[k / kt][16][kt]` signed bytes; with 16-bit activations (`256·hi
/// + lo`) `lo` the unsigned low bytes, same layout; `ds` `[k / span][2][16]`
/// each scale group's `d`, then `d·Σq`.
#[derive(Clone, Copy)]
pub(crate) struct ARows {
    pub hi: *const i8,
    pub lo: *const u8,
    pub ds: *const f32,
}

/// 16 weight rows: a `pack_panel8` panel's digits and group scales.
#[derive(Clone, Copy)]
pub(crate) struct BRows {
    pub pw: *const i32,
    pub ps: *const f32,
    pub po: *const f32,
}

/// A C tile's sums as `tilestored` leaves them.
#[repr(C, align(64))]
struct Sums([[i32; 16]; 16]);

/// `MT` groups of 16 activation rows (`a`) against 32 weight rows (`b`),
/// `groups` scale groups of `span` values, into `out` (`[MT·16][32]`).
/// Per group the tiles sum each (activation row, weight row)'s products
/// exactly in i32, `kt = min(span, 64)` values per instruction; `WIDE`
/// (16-bit activations, `MT` 1) as `hi` × digits (`tdpbsud`) and `lo` ×
/// digits (`tdpbuud`) in tiles 0, 1 and 2, 3, joined as `(hi << 8) + lo`:
/// the 16-bit sums exactly (|Σ| < 32 · 255 · 2¹⁵ < 2³¹). Then scaled into
/// f32 as the VNNI tile does. `unit` must hold [`TileConfig::gemm`]`(kt)`.
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn gemm_tile<U: TileUnit, const MT: usize, const WIDE: bool>(
    unit: &mut U,
    span: usize,
    groups: usize,
    a: &[ARows; MT],
    b: &[BRows; 2],
    out: *mut f32,
) {
    const { assert!((MT == 1 || MT == 2) && !(WIDE && MT == 2)) };
    let kt = span.min(64);
    let four = MT == 2 || WIDE;
    let mut c = [const { Sums([[0; 16]; 16]) }; 4];
    core::ptr::write_bytes(out, 0, MT * 16 * 32);
    for t in 0..groups {
        unit.zero::<0>();
        unit.zero::<1>();
        if four {
            unit.zero::<2>();
            unit.zero::<3>();
        }
        for s in (t * span..(t + 1) * span).step_by(kt) {
            // Chunk s / kt of the activations, `16·kt` bytes; quad s / 4
            // of the panels, 16 i32s: both at byte 16·s.
            let at = 16 * s;
            unit.load::<4>(a[0].hi.add(at).cast(), kt);
            if WIDE {
                unit.load::<5>(a[0].lo.add(at), kt);
            } else if MT == 2 {
                unit.load::<5>(a[MT - 1].hi.add(at).cast(), kt);
            }
            unit.load::<6>(b[0].pw.cast::<u8>().add(at), 64);
            unit.load::<7>(b[1].pw.cast::<u8>().add(at), 64);
            unit.dot_su::<0, 4, 6>();
            unit.dot_su::<1, 4, 7>();
            if WIDE {
                unit.dot_uu::<2, 5, 6>();
                unit.dot_uu::<3, 5, 7>();
            } else if MT == 2 {
                unit.dot_su::<2, 5, 6>();
                unit.dot_su::<3, 5, 7>();
            }
        }
        unit.store::<0>(c[0].0.as_mut_ptr().cast(), 64);
        unit.store::<1>(c[1].0.as_mut_ptr().cast(), 64);
        if four {
            unit.store::<2>(c[2].0.as_mut_ptr().cast(), 64);
            unit.store::<3>(c[3].0.as_mut_ptr().cast(), 64);
        }
        for (mi, ar) in a.iter().enumerate() {
            let d = ar.ds.add(t * 2 * 16);
            for (j, br) in b.iter().enumerate() {
                let (s, o) = (
                    _mm512_loadu_ps(br.ps.add(t * 16)),
                    _mm512_loadu_ps(br.po.add(t * 16)),
                );
                let sums = |tile: usize, r: usize| _mm512_load_si512(c[tile].0[r].as_ptr().cast());
                for r in 0..16 {
                    let sum = if WIDE {
                        _mm512_add_epi32(_mm512_slli_epi32::<8>(sums(j, r)), sums(2 + j, r))
                    } else {
                        sums(2 * mi + j, r)
                    };
                    let acc = out.add((16 * mi + r) * 32 + 16 * j);
                    let scale = _mm512_mul_ps(s, _mm512_set1_ps(*d.add(r)));
                    let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, _mm512_loadu_ps(acc));
                    let v = _mm512_fmadd_ps(o, _mm512_set1_ps(*d.add(16 + r)), v);
                    _mm512_storeu_ps(acc, v);
                }
            }
        }
    }
}

/// Tiles in plain Rust, computing what the instructions compute, for the
/// tests of machines without AMX (and, on AMX, against the hardware).
#[cfg(test)]
pub(crate) struct Emulated {
    cfg: TileConfig,
    tiles: [[u8; 1024]; 8],
}

#[cfg(test)]
impl Default for Emulated {
    fn default() -> Self {
        Emulated {
            cfg: TileConfig::default(),
            tiles: [[0; 1024]; 8],
        }
    }
}

#[cfg(test)]
impl Emulated {
    fn shape(&self, t: u8) -> (usize, usize) {
        assert!(self.cfg.palette == 1, "tile {t} used unconfigured");
        (
            self.cfg.rows[t as usize] as usize,
            self.cfg.colsb[t as usize] as usize,
        )
    }

    fn dword(&self, t: u8, r: usize, n: usize) -> [u8; 4] {
        let at = r * 64 + 4 * n;
        self.tiles[t as usize][at..at + 4]
            .try_into()
            .unwrap_or([0; 4])
    }

    /// `C[m][n] += Σ_k Σ_i A[m][4k + i] · B[k][4n + i]`, the bytes widened
    /// by `a` and `b` (signed or unsigned), shapes checked as the CPU does
    /// (it faults on a mismatch).
    fn dot<const C: u8, const A: u8, const B: u8>(&mut self, a: fn(u8) -> i32, b: fn(u8) -> i32) {
        let ((cr, cc), (ar, ac), (br, bc)) = (self.shape(C), self.shape(A), self.shape(B));
        assert!(cr == ar && cc == bc && ac / 4 == br && cc <= 64 && ac <= 64);
        for m in 0..cr {
            for n in 0..cc / 4 {
                let mut sum = i32::from_le_bytes(self.dword(C, m, n));
                for k in 0..ac / 4 {
                    let (x, w) = (self.dword(A, m, k), self.dword(B, k, n));
                    for i in 0..4 {
                        sum = sum.wrapping_add(a(x[i]).wrapping_mul(b(w[i])));
                    }
                }
                let at = m * 64 + 4 * n;
                self.tiles[C as usize][at..at + 4].copy_from_slice(&sum.to_le_bytes());
            }
        }
    }
}

// SAFETY (load and store): the callers' pointers are valid for the
// configured rows and bytes, as they must be for the hardware.
#[cfg(test)]
impl TileUnit for Emulated {
    fn ready() -> bool {
        true
    }

    unsafe fn configure(&mut self, cfg: &TileConfig) {
        assert!(cfg.palette == 1 && cfg.rows.iter().all(|&r| r <= 16));
        assert!(cfg.colsb.iter().all(|&c| c <= 64));
        self.cfg = *cfg;
        self.tiles = [[0; 1024]; 8];
    }

    unsafe fn zero<const T: u8>(&mut self) {
        self.tiles[T as usize] = [0; 1024];
    }

    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        self.tiles[T as usize] = [0; 1024];
        for r in 0..rows {
            let src = core::slice::from_raw_parts(p.add(r * stride), colsb);
            self.tiles[T as usize][r * 64..r * 64 + colsb].copy_from_slice(src);
        }
    }

    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        for r in 0..rows {
            let dst = core::slice::from_raw_parts_mut(p.add(r * stride), colsb);
            dst.copy_from_slice(&self.tiles[T as usize][r * 64..r * 64 + colsb]);
        }
    }

    unsafe fn dot_su<const C: u8, const A: u8, const B: u8>(&mut self) {
        self.dot::<C, A, B>(|v| v as i8 as i32, |v| v as i32)
    }

    unsafe fn dot_uu<const C: u8, const A: u8, const B: u8>(&mut self) {
        self.dot::<C, A, B>(|v| v as i32, |v| v as i32)
    }

    unsafe fn release(&mut self) {
        *self = Emulated::default();
    }
}

#[cfg(test)]
mod tests {
    use super::{Emulated, Hardware, TileUnit};
    use crate::cpu::act::{self, ActRows};
    use crate::cpu::buffers::WeightRows;
    use crate::cpu::matmul::{gemm_amx, gemm_int8};
    use crate::cpu::par::Ctx;
    use crate::cpu::simd::Isa;
    use crate::cpu::ActivationPrecision as Acts;
    use crate::dtype::DType;
    use crate::random::uniform_f32 as rand;

    /// Activations of a case: quantized at a precision, or rows on int8
    /// levels (`ActRows::levels`, the ternary types' 256-value groups).
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Input {
        Q16,
        Q8,
        Levels,
    }

    /// A matmul's shapes and data.
    struct Case {
        dtype: DType,
        input: Input,
        w: Vec<u8>,
        x: Vec<f32>,
        n: usize,
        k: usize,
        m: usize,
    }

    impl Case {
        fn weights(&self) -> WeightRows<'_> {
            WeightRows {
                data: &self.w,
                dtype: self.dtype,
                rows: self.n,
                cols: self.k,
                row_bytes: self.w.len() / self.n,
                packed: false,
            }
        }

        fn levels(&self) -> Option<ActRows<i8>> {
            (self.input == Input::Levels)
                .then(|| ActRows::levels(&self.x, self.m, self.k).expect("rows on their levels"))
        }

        fn ctx(&self, isa: Isa) -> Ctx {
            let acts = if self.input == Input::Q16 {
                Acts::Q16
            } else {
                Acts::Q8
            };
            Ctx {
                isa,
                par: false,
                acts,
            }
        }

        /// `gemm_amx` on the tile unit `U`.
        fn amx<U: TileUnit + Default>(&self) -> Vec<f32> {
            let mut y = vec![f32::NAN; self.m * self.n];
            let (w, levels) = (self.weights(), self.levels());
            gemm_amx::<U>(
                self.ctx(Isa::Avx512),
                w,
                &self.x,
                levels.as_ref(),
                &mut y,
                self.m,
            );
            y
        }
    }

    /// Every integer-dot type, with 16-bit, 8-bit and int8-level
    /// activations; partial tiles in `m` (5: one group of 16; 37: a pair
    /// and a padded single) and `n` (45: a whole and a part panel, 13
    /// rows of the second 16 there); odd numbers of blocks (7 of 32, or 3
    /// of 256); random weights, and activations at ±full scale.
    fn cases() -> Vec<Case> {
        let mut out = Vec::new();
        for dtype in DType::ALL.into_iter().filter(|&d| act::supports(d)) {
            let k = if dtype.block_elems() == 256 { 768 } else { 224 };
            let n = 45;
            let rb = dtype.row_bytes(k).expect("whole blocks");
            let mut w = vec![0u8; n * rb];
            for (r, row) in w.chunks_exact_mut(rb).enumerate() {
                let v = rand(k, 11 + r as u64);
                crate::quants::quantize_row(dtype, &v, row).expect("a quantizable row");
            }
            for m in [5, 37] {
                for input in [Input::Q16, Input::Q8, Input::Levels] {
                    let x: Vec<f32> = match input {
                        // Integers of each row's levels (127 first: the
                        // row's largest), times 1 / s.
                        Input::Levels => (0..m * k)
                            .map(|i| {
                                if i % k == 0 {
                                    127
                                } else {
                                    (i * 37 % 255) as i32 - 127
                                }
                            })
                            .map(|q| q as f32 * 0.031)
                            .collect(),
                        _ if m == 37 => vec![-1.0; m * k],
                        _ => rand(m * k, 5 + k as u64).iter().map(|v| v * 4.0).collect(),
                    };
                    let w = w.clone();
                    out.push(Case {
                        dtype,
                        input,
                        w,
                        x,
                        n,
                        k,
                        m,
                    });
                }
            }
        }
        out
    }

    /// The emulated tile GEMM against `act::dot_row`'s exact integer sums
    /// (within f32 rounding of the products' magnitudes), and with 8-bit
    /// activations bit for bit against the VNNI tile whose epilogue it
    /// mirrors.
    #[test]
    fn the_tile_kernel_equals_the_scalar_integer_dot() {
        if !Isa::Avx512.available() || !crate::cpu::simd::int8_gemm(Isa::Avx512, DType::Q8_0) {
            return;
        }
        for c in cases() {
            let got = c.amx::<Emulated>();
            let (k, rb) = (c.k, c.w.len() / c.n);
            let (x16, x8) = (
                ActRows::<i16>::quantize(&c.x, c.m, k),
                ActRows::<i8>::quantize(&c.x, c.m, k),
            );
            let levels = c.levels();
            let mut wf = vec![0f32; k];
            for r in 0..c.n {
                let row = &c.w[r * rb..(r + 1) * rb];
                crate::quants::dequantize_row(c.dtype, row, &mut wf).expect("a row");
                for i in 0..c.m {
                    let want = match (&levels, c.input) {
                        (Some(l), _) => act::dot_row(c.dtype, row, l, i),
                        (None, Input::Q16) => act::dot_row(c.dtype, row, &x16, i),
                        _ => act::dot_row(c.dtype, row, &x8, i),
                    };
                    let xr = &c.x[i * k..(i + 1) * k];
                    let mag: f32 = wf.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum();
                    let v = got[i * c.n + r];
                    assert!(
                        (v - want).abs() <= 1e-5 * mag + 1e-6,
                        "{} {:?} m={} row {r} act {i}: {v}, want {want}",
                        c.dtype,
                        c.input,
                        c.m
                    );
                }
            }
            if c.input != Input::Q16 {
                let mut vnni = vec![f32::NAN; c.m * c.n];
                let ctx = c.ctx(Isa::Avx512);
                gemm_int8(ctx, c.weights(), &c.x, levels.as_ref(), &mut vnni, c.m);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert!(
                    bits(&got) == bits(&vnni),
                    "{} {:?} m={}",
                    c.dtype,
                    c.input,
                    c.m
                );
            }
        }
    }

    /// The CPU's tiles compute what the emulated ones do, bit for bit
    /// (runs only where AMX is: `VKLLM`'s `Isa::Amx`).
    #[test]
    fn hardware_tiles_equal_the_emulated_ones() {
        if !Isa::Amx.available() {
            eprintln!("no AMX here: skipped");
            return;
        }
        for c in cases() {
            let (hw, emu) = (c.amx::<Hardware>(), c.amx::<Emulated>());
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&hw) == bits(&emu),
                "{} {:?} m={}",
                c.dtype,
                c.input,
                c.m
            );
        }
    }
}
