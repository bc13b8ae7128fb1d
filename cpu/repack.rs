//! Weights repacked at load for the decode GEMV: each run of [`R`] rows is
//! stored interleaved, so one SIMD register holds the same 4 weight bytes
//! of 16 rows and a broadcast activation word feeds all 16 rows at once
//! (no per-row horizontal sums, one scale conversion per 16 rows). The
//! repacked bytes replace the GGUF ones (one copy in memory): a group of 16
//! rows occupies exactly the bytes its rows did, rows past the last whole
//! group stay as they were, and [`unpack_rows`] rebuilds GGUF rows for the
//! other consumers (prefill panels, embedding lookups, the f32 path).
//!
//! Per 16-row group, block `b` of every row is stored together, as:
//! - Q4_0 (288 bytes): `d[16]` f16, then 4 chunks of 64 bytes, chunk `c`
//!   holding bytes `4c..4c+4` of each row's 16 `qs` bytes (row `j` at `4j`).
//! - Q4_1 (320 bytes): `d[16]`, `m[16]` f16, then the `qs` chunks as Q4_0's.
//! - Q4_K (2304 bytes): `d[16]`, `dmin[16]` f16, the 12 packed scale bytes
//!   as 12 planes of 16 (plane `i`, row `j` at `16i + j`), then the 128 `qs`
//!   bytes as 32 dword groups of 64 bytes (group `g`, row `j` at `64g + 4j`).
//! - Q6_K (3360 bytes): `d[16]` f16, the 16 scales as 16 planes of 16, then
//!   the 128 `ql` and 64 `qh` bytes as dword groups in the order the kernel
//!   reads them: 16 steps of 192 bytes (see `table`), so it streams.
//! - TQ1_0 (864 bytes): `d[16]`, then the 48 `qs` and 4 `qh` bytes as 13
//!   dword groups of 64 bytes.
//! - TQ2_0 (1056 bytes): `d[16]`, then the 64 `qs` bytes as 16 dword
//!   groups of 64 bytes.

use crate::dtype::DType;

/// Rows per interleaved group.
pub const R: usize = 16;

/// Whether weights of `dtype` are repacked (its row's `cpu.repack`,
/// quants/types.rs: the types with a layout here and kernels for it).
pub fn packs(dtype: DType) -> bool {
    dtype.format().cpu.repack
}

/// A run of `n` equal pieces (`width` bytes: 1, 2 or 4) of a row's block:
/// piece `i` of row `j` moves from `src + width·i` to
/// `dst + stride·i + width·j` of its group's block.
struct Seg {
    src: usize,
    n: usize,
    width: usize,
    dst: usize,
    stride: usize,
}

const fn seg(src: usize, n: usize, width: usize, dst: usize, stride: usize) -> Seg {
    Seg {
        src,
        n,
        width,
        dst,
        stride,
    }
}

// Where every byte of a row's block goes (the layouts of the module doc).
const Q4_0: [Seg; 2] = [seg(0, 1, 2, 0, 0), seg(2, 4, 4, 32, 64)];
const Q4_1: [Seg; 3] = [
    seg(0, 1, 2, 0, 0),
    seg(2, 1, 2, 32, 0),
    seg(4, 4, 4, 64, 64),
];
const Q4K: [Seg; 4] = [
    seg(0, 1, 2, 0, 0),
    seg(2, 1, 2, 32, 0),
    seg(4, 12, 1, 64, 16),
    seg(16, 32, 4, 256, 64),
];
// ql dword `16n + 8·slot + l4` and qh dword `8n + l4` go to step
// `8n + l4` (192 bytes each, from 288): ql at slot·64, qh at 128.
const Q6K: [Seg; 8] = [
    seg(208, 1, 2, 0, 0),
    seg(192, 16, 1, 32, 16),
    seg(0, 8, 4, 288, 192),
    seg(32, 8, 4, 288 + 64, 192),
    seg(64, 8, 4, 288 + 1536, 192),
    seg(96, 8, 4, 288 + 1536 + 64, 192),
    seg(128, 8, 4, 288 + 128, 192),
    seg(160, 8, 4, 288 + 1536 + 128, 192),
];
// qs dword `g` to `32 + 64g`, after the 16 rows' `d`.
const TQ2_0: [Seg; 2] = [seg(64, 1, 2, 0, 0), seg(0, 16, 4, 32, 64)];
// qs dword `g` to `32 + 64g`, then the qh dword (group 12).
const TQ1_0: [Seg; 3] = [
    seg(52, 1, 2, 0, 0),
    seg(0, 12, 4, 32, 64),
    seg(48, 1, 4, 32 + 64 * 12, 0),
];

/// The pieces of `dtype`'s layout.
fn segments(dtype: DType) -> &'static [Seg] {
    match dtype {
        DType::Q4_0 => &Q4_0,
        DType::Q4_1 => &Q4_1,
        DType::TQ1_0 => &TQ1_0,
        DType::TQ2_0 => &TQ2_0,
        DType::Q4K => &Q4K,
        DType::Q6K => &Q6K,
        // Rows without `cpu.repack` never come here (`packs`).
        _ => unreachable!("no repacked layout for this type"),
    }
}

/// `f(r, g, width)` for every piece of row `j`'s block: row offset `r`,
/// group offset `g`.
#[inline(always)]
fn for_pieces(segs: &[Seg], j: usize, mut f: impl FnMut(usize, usize, usize)) {
    for sg in segs {
        for i in 0..sg.n {
            f(
                sg.src + sg.width * i,
                sg.dst + sg.stride * i + sg.width * j,
                sg.width,
            );
        }
    }
}

/// `to[t..t + w] = from[s..s + w]` for the widths the layouts use.
#[inline(always)]
fn piece(from: &[u8], s: usize, to: &mut [u8], t: usize, w: usize) {
    match w {
        4 => to[t..t + 4].copy_from_slice(&from[s..s + 4]),
        2 => to[t..t + 2].copy_from_slice(&from[s..s + 2]),
        _ => to[t] = from[s],
    }
}

/// `data` (`rows` GGUF rows of `row_bytes`) repacked into `out` (as long
/// as `data`): whole groups of [`R`] rows interleaved, the rest copied.
/// `data.len()` must be `rows * row_bytes`, a type with [`packs`]. Groups
/// are packed in parallel on the current team (`par::with_team`).
pub fn pack(dtype: DType, data: &[u8], rows: usize, row_bytes: usize, out: &mut [u8]) {
    assert!(packs(dtype) && data.len() == rows * row_bytes && out.len() == data.len());
    let bb = dtype.block_bytes();
    let nb = row_bytes / bb;
    let segs = segments(dtype);
    let gb = R * row_bytes;
    let whole = rows / R * gb;
    out[whole..].copy_from_slice(&data[whole..]);
    super::par::chunks(true, &mut out[..whole], gb, |g, dst| {
        for j in 0..R {
            for b in 0..nb {
                let s = g * gb + j * row_bytes + b * bb;
                let (row, group) = (&data[s..s + bb], &mut dst[b * R * bb..(b + 1) * R * bb]);
                for_pieces(segs, j, |r, g, w| piece(row, r, group, g, w));
            }
        }
    });
}

/// GGUF rows `r0..r1` of a weight repacked by [`pack`] (`rows` rows of
/// `row_bytes`) written to `out` (`(r1 - r0) * row_bytes` bytes). Every
/// prefill pass unpacks its weights' rows for the GEMM panels: a copy of
/// the loop per layout, its pieces known when compiled, runs several
/// times faster than one loop reading them (benches/README.md).
pub fn unpack_rows(
    dtype: DType,
    data: &[u8],
    rows: usize,
    row_bytes: usize,
    r0: usize,
    r1: usize,
    out: &mut [u8],
) {
    assert!(r0 <= r1 && r1 <= rows && out.len() == (r1 - r0) * row_bytes);
    let bb = dtype.block_bytes();
    let mut run = |segs: &'static [Seg]| unpack_with(segs, bb, data, rows, row_bytes, r0..r1, out);
    match dtype {
        DType::Q4_0 => run(&Q4_0),
        DType::Q4_1 => run(&Q4_1),
        DType::TQ1_0 => run(&TQ1_0),
        DType::TQ2_0 => run(&TQ2_0),
        DType::Q4K => run(&Q4K),
        DType::Q6K => run(&Q6K),
        // A layout not listed here: correct, through the general loop.
        // (This match repeats `segments`' on purpose: one dispatcher shared
        // by both, taking the loop as a closure, kept Q4_0 at 1.0 GB/s.)
        _ => run(segments(dtype)),
    }
}

/// [`unpack_rows`] with the layout's pieces `segs` (inlined per layout).
#[inline(always)]
fn unpack_with(
    segs: &'static [Seg],
    bb: usize,
    data: &[u8],
    rows: usize,
    row_bytes: usize,
    range: std::ops::Range<usize>,
    out: &mut [u8],
) {
    let r0 = range.start;
    let nb = row_bytes / bb;
    let packed_rows = rows / R * R;
    for r in range {
        let dst = &mut out[(r - r0) * row_bytes..(r - r0 + 1) * row_bytes];
        if r >= packed_rows {
            dst.copy_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
            continue;
        }
        let base = r / R * R * row_bytes;
        for b in 0..nb {
            let group = &data[base + b * R * bb..base + (b + 1) * R * bb];
            let row = &mut dst[b * bb..(b + 1) * bb];
            for_pieces(segs, r % R, |r, g, w| piece(group, g, row, r, w));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packing permutes bytes within each group and unpacking restores
    /// every row, including rows past the last whole group.
    fn packed(dtype: DType, data: &[u8], rows: usize, rb: usize) -> Vec<u8> {
        let mut out = vec![0u8; data.len()];
        pack(dtype, data, rows, rb, &mut out);
        out
    }

    #[test]
    fn pack_round_trips() {
        for dtype in DType::ALL.into_iter().filter(|&d| packs(d)) {
            let rb = dtype.row_bytes(512).unwrap();
            let rows = 2 * R + 3;
            let data: Vec<u8> = (0..rows * rb).map(|i| (i * 7 + i / 251) as u8).collect();
            let p = packed(dtype, &data, rows, rb);
            let mut sorted = (p.clone(), data.clone());
            sorted.0.sort_unstable();
            sorted.1.sort_unstable();
            assert_eq!(sorted.0, sorted.1, "{dtype}: not a permutation");
            let mut back = vec![0u8; rows * rb];
            unpack_rows(dtype, &p, rows, rb, 0, rows, &mut back);
            assert!(back == data, "{dtype}");
            let mut one = vec![0u8; rb];
            unpack_rows(dtype, &p, rows, rb, R + 5, R + 6, &mut one);
            assert!(one == data[(R + 5) * rb..(R + 6) * rb], "{dtype}");
        }
    }

    use crate::cpu::act::{self, ActDigits, ActInt, ActRows};
    use crate::cpu::simd::{self, Isa};

    use crate::random::uniform_f32 as rand;

    /// Rows at the extremes of each type's integer ranges, so the exact
    /// sums reach their bounds: Q4_0 / Q4_1 nibbles 15; Q4_K nibbles 15,
    /// scales and mins 63; Q6_K `q − 32 = −32` with scale −128; TQ2_0 digits
    /// 3 (the bits' largest, past the ternary 2), TQ1_0 bytes 255. `d` (and
    /// `m`, `dmin`) 1.
    fn extreme_rows(dtype: DType, rows: usize, k: usize) -> Vec<u8> {
        let rb = dtype.row_bytes(k).unwrap();
        let one = half::f16::from_f32(1.0).to_bits().to_le_bytes();
        let mut block = vec![0u8; dtype.block_bytes()];
        match dtype {
            DType::Q4_0 => {
                block[..2].copy_from_slice(&one);
                block[2..].fill(0xFF);
            }
            DType::Q4_1 | DType::Q4K => {
                block[..2].copy_from_slice(&one);
                block[2..4].copy_from_slice(&one);
                block[4..].fill(0xFF);
            }
            DType::TQ1_0 => {
                block[..52].fill(0xFF);
                block[52..].copy_from_slice(&one);
            }
            DType::TQ2_0 => {
                block[..64].fill(0xFF);
                block[64..].copy_from_slice(&one);
            }
            _ => {
                block[192..208].fill(0x80);
                block[208..].copy_from_slice(&one);
            }
        }
        block.repeat(rows * rb / block.len())
    }

    fn check<T: ActInt>(isa: Isa, dtype: DType, data: &[u8], rows: usize, k: usize, x: &[f32]) {
        let rb = dtype.row_bytes(k).unwrap();
        let packed = packed(dtype, data, rows, rb);
        let mut wf = vec![0f32; k];
        for m in 1..=4 {
            let xq = ActRows::<T>::quantize(x, m, k);
            let mut out = vec![0f32; rows / R * R * m];
            let w = &packed[..rows / R * R * rb];
            simd::dot_rows_packed(isa, dtype, w, rb, &xq.ds, &ActDigits::new(&xq), &mut out);
            for r in 0..rows / R * R {
                let row = &data[r * rb..(r + 1) * rb];
                crate::quants::dequantize_row(dtype, row, &mut wf).unwrap();
                for i in 0..m {
                    let want = act::dot_row(dtype, row, &xq, i);
                    let xr = &x[i * k..(i + 1) * k];
                    let mag: f32 = wf.iter().zip(xr).map(|(a, b)| (a * b).abs()).sum();
                    let got = out[r * m + i];
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-6,
                        "{isa:?} {dtype} m={m} row {r} act {i}: {got}, want {want}"
                    );
                }
            }
        }
    }

    /// The group kernels of both instruction sets against `act::dot_row`
    /// (exact integer sums), with random and extreme weights and
    /// activations, 16- and 8-bit.
    #[test]
    fn packed_dots_match_the_scalar_dots() {
        let (rows, k) = (2 * R + 5, 1024);
        for isa in [Isa::Avx512, Isa::Avx2] {
            if !isa.available() || !isa.int_dots() {
                continue;
            }
            for dtype in DType::ALL.into_iter().filter(|&d| packs(d)) {
                let rb = dtype.row_bytes(k).unwrap();
                let mut data = vec![0u8; rows * rb];
                for (r, row) in data.chunks_exact_mut(rb).enumerate() {
                    crate::quants::quantize_row(dtype, &rand(k, 7 + r as u64), row).unwrap();
                }
                let x: Vec<f32> = rand(4 * k, 3).iter().map(|v| v * 4.0).collect();
                check::<i16>(isa, dtype, &data, rows, k, &x);
                check::<i8>(isa, dtype, &data, rows, k, &x);
                let ext = extreme_rows(dtype, rows, k);
                for sign in [1.0, -1.0] {
                    let x = vec![sign; 4 * k];
                    check::<i16>(isa, dtype, &ext, rows, k, &x);
                    check::<i8>(isa, dtype, &ext, rows, k, &x);
                }
            }
        }
    }
}
