//! Safe entry points of the AMX integer prefill GEMM (`x86::amx`): whether
//! the tile unit is usable, activation rows packed for its A tiles, and a
//! worker's configured tile unit running one tile at a time against
//! `pack_int8_panel` panels.

use super::x86::amx::{self, ARows, BRows, TileConfig};
use super::IntPanel;
use crate::cpu::act::{self, ActInt, ActRows, ACT_BLOCK};
use crate::cpu::par;
use std::sync::OnceLock;

pub(crate) use amx::{Hardware, TileUnit};

/// Activation rows a tile takes (and weight rows each of its two panels).
pub(crate) const ROWS: usize = 16;

/// Weight rows of a tile: two panels of [`ROWS`].
pub(crate) const COLS: usize = 2 * ROWS;

/// AMX-TILE and AMX-INT8 (CPUID leaf 7 EDX bits 24, 25), with the tile
/// data lent to this process by Linux (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`: without it the first tile instruction faults).
/// Asked once.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // SAFETY (unused where the Rust version makes it safe): CPUID leaf
        // 7 exists on every x86-64 CPU with AVX-512, which callers check first.
        #[allow(unused_unsafe)]
        let edx = unsafe { core::arch::x86_64::__cpuid_count(7, 0) }.edx;
        (edx >> 24) & 3 == 3 && lend_tile_data()
    })
}

#[cfg(target_os = "linux")]
fn lend_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with this request only changes which state
    // components the kernel saves for the process.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// Other systems have no known way to ask for the tile data.
#[cfg(not(target_os = "linux"))]
fn lend_tile_data() -> bool {
    false
}

/// Values per tile instruction for scale groups of `span` values.
fn kt(span: usize) -> usize {
    span.min(64)
}

/// [`ROWS`] activation rows laid out for the A tiles (see `x86::amx::ARows`).
#[derive(Default)]
pub(crate) struct TileRows {
    hi: Vec<i8>,
    lo: Vec<u8>,
    ds: Vec<f32>,
}

/// Every activation row of a matmul in groups of [`ROWS`] (the last
/// zero-padded), for scale groups of `span` values.
pub(crate) struct TileActs {
    pub groups: Vec<TileRows>,
    /// 16-bit activations (`lo` used).
    pub wide: bool,
    k: usize,
    span: usize,
}

impl TileActs {
    /// `m` rows of `x` (`[m, k]`) quantized per block as `T` (as
    /// `ActRows::quantize`), the groups in parallel when `par`.
    pub(crate) fn quantize<T: ActInt>(
        par: bool,
        x: &[f32],
        m: usize,
        k: usize,
        span: usize,
    ) -> TileActs {
        TileActs::make(par, m, k, span, T::MAX > 127.0, |g| {
            let rows = (m - g * ROWS).min(ROWS);
            pack_rows(
                &ActRows::<T>::quantize(&x[g * ROWS * k..], rows, k),
                0,
                span,
            )
        })
    }

    /// The rows of `a` (rows on int8 levels, `ActRows::levels`).
    pub(crate) fn from_rows(par: bool, a: &ActRows<i8>, span: usize) -> TileActs {
        TileActs::make(par, a.m, a.k, span, false, |g| pack_rows(a, g * ROWS, span))
    }

    fn make(
        par: bool,
        m: usize,
        k: usize,
        span: usize,
        wide: bool,
        pack: impl Fn(usize) -> TileRows + Sync + Send,
    ) -> TileActs {
        assert!(matches!(span, 16 | 32 | 256) && k.is_multiple_of(span));
        let mut groups: Vec<TileRows> =
            (0..m.div_ceil(ROWS)).map(|_| TileRows::default()).collect();
        par::chunks(par, &mut groups, 1, |g, slot| slot[0] = pack(g));
        TileActs {
            groups,
            wide,
            k,
            span,
        }
    }
}

/// Rows `r0..r0 + ROWS` of `a` (those past `a.m` zero) as [`TileRows`].
fn pack_rows<T: ActInt>(a: &ActRows<T>, r0: usize, span: usize) -> TileRows {
    let (k, kt) = (a.k, kt(span));
    // One `d` per group: past a block only where every block has the row's.
    assert!(span <= ACT_BLOCK || a.row_scale);
    let wide = T::MAX > 127.0;
    let mut t = TileRows {
        hi: vec![0; ROWS * k],
        lo: vec![0; if wide { ROWS * k } else { 0 }],
        ds: vec![0.0; k / span * 2 * ROWS],
    };
    for i in 0..ROWS.min(a.m.saturating_sub(r0)) {
        let row = &a.qs[(r0 + i) * k..(r0 + i + 1) * k];
        for (c, chunk) in row.chunks_exact(kt).enumerate() {
            let at = (c * ROWS + i) * kt;
            let lo: &mut [u8] = if wide {
                &mut t.lo[at..at + kt]
            } else {
                &mut []
            };
            act::split_bytes(chunk, &mut t.hi[at..at + kt], lo, wide);
        }
        act::group_scales(a, r0 + i, i, ROWS, span, &mut t.ds);
    }
    t
}

/// One worker's tile unit during a matmul: configured for its scale groups
/// when made (one `ldtilecfg` per worker and call), released when dropped.
pub(crate) struct Tiles<U: TileUnit> {
    unit: U,
    span: usize,
}

impl<U: TileUnit + Default> Tiles<U> {
    /// A unit for scale groups of `span` values (16, 32 or 256).
    pub(crate) fn new(span: usize) -> Tiles<U> {
        assert!(matches!(span, 16 | 32 | 256) && U::ready());
        assert!(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma"));
        let mut unit = U::default();
        // SAFETY: the unit can run here (`ready`, asserted).
        unsafe { unit.configure(&TileConfig::gemm(kt(span))) };
        Tiles { unit, span }
    }

    /// Groups `g..g + mt` of `acts` (`mt` 1, or 2 with 8-bit activations)
    /// against the [`ROWS`]-row `pack_int8_panel` panels, into `out`
    /// (`[mt · ROWS][COLS]`).
    pub(crate) fn run(
        &mut self,
        acts: &TileActs,
        g: usize,
        mt: usize,
        panels: [&IntPanel; 2],
        out: &mut [f32],
    ) {
        let (k, span, wide) = (acts.k, acts.span, acts.wide);
        let groups = k / span;
        assert!(span == self.span && (mt == 1 || (mt == 2 && !wide)));
        assert!(g + mt <= acts.groups.len() && out.len() >= mt * ROWS * COLS);
        for p in panels {
            assert!(p.nr == ROWS && p.span == span && p.k == k && p.pw.len() >= k / 4 * ROWS);
            assert!(p.ps.len().min(p.po.len()) >= groups * ROWS);
        }
        let a = |t: &TileRows| {
            assert!(t.hi.len() == ROWS * k && t.ds.len() == groups * 2 * ROWS);
            assert!(t.lo.len() == if wide { ROWS * k } else { 0 });
            ARows {
                hi: t.hi.as_ptr(),
                lo: if wide {
                    t.lo.as_ptr()
                } else {
                    t.hi.as_ptr().cast()
                },
                ds: t.ds.as_ptr(),
            }
        };
        let b = panels.map(|p| BRows {
            pw: p.pw.as_ptr(),
            ps: p.ps.as_ptr(),
            po: p.po.as_ptr(),
        });
        let (u, o, rows) = (&mut self.unit, out.as_mut_ptr(), &acts.groups[g..g + mt]);
        // SAFETY: the unit holds `TileConfig::gemm(kt(span))` (`new`), and
        // AVX-512F and FMA were checked there; the rows and panels hold
        // `k` values of `ROWS` rows and `k / span` groups, and `out` the
        // tile, all asserted above.
        unsafe {
            match (mt, wide) {
                (1, false) => amx::gemm_tile::<U, 1, false>(u, span, groups, &[a(&rows[0])], &b, o),
                (1, true) => amx::gemm_tile::<U, 1, true>(u, span, groups, &[a(&rows[0])], &b, o),
                _ => {
                    let a2 = [a(&rows[0]), a(&rows[1])];
                    amx::gemm_tile::<U, 2, false>(u, span, groups, &a2, &b, o)
                }
            }
        }
    }
}

impl<U: TileUnit> Drop for Tiles<U> {
    fn drop(&mut self) {
        // SAFETY: the unit was configured (so is usable) in `new`.
        unsafe { self.unit.release() }
    }
}
