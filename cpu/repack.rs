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
//! - Q4_K (2304 bytes): `d[16]`, `dmin[16]` f16, the 12 packed scale bytes
//!   as 12 planes of 16 (plane `i`, row `j` at `16i + j`), then the 128 `qs`
//!   bytes as 32 dword groups of 64 bytes (group `g`, row `j` at `64g + 4j`).
//! - Q6_K (3360 bytes): `d[16]` f16, the 16 scales as 16 planes of 16, then
//!   the 128 `ql` and 64 `qh` bytes as dword groups in the order the kernel
//!   reads them: 16 steps of 192 bytes (see `table`), so it streams.

use crate::dtype::DType;

/// Rows per interleaved group.
pub const R: usize = 16;

/// Whether weights of `dtype` are repacked (the types with kernels for it).
pub fn packs(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4K | DType::Q6K)
}

/// Where each byte of one row's block goes in its group's block: byte `i`
/// of row `j` lands at `table[j * block_bytes + i]`.
fn table(dtype: DType) -> Vec<usize> {
    let bb = dtype.block_bytes();
    let mut t = vec![0; R * bb];
    for j in 0..R {
        let t = &mut t[j * bb..(j + 1) * bb];
        // Dword `g` of a row (bytes `src0 + 4g..`) at `dst(g) + 4j`.
        let mut dwords = |src0: usize, n: usize, dst: &dyn Fn(usize) -> usize| {
            for g in 0..n {
                for b in 0..4 {
                    t[src0 + 4 * g + b] = dst(g) + 4 * j + b;
                }
            }
        };
        match dtype {
            DType::Q4_0 => {
                dwords(2, 4, &|g| 32 + 64 * g);
                t[0] = 2 * j;
                t[1] = 2 * j + 1;
            }
            DType::Q4K => {
                dwords(16, 32, &|g| 256 + 64 * g);
                for b in 0..2 {
                    t[b] = 2 * j + b;
                    t[2 + b] = 32 + 2 * j + b;
                }
                for i in 0..12 {
                    t[4 + i] = 64 + 16 * i + j;
                }
            }
            DType::Q6K => {
                // In the kernel's reading order: per half `n` and step
                // `l4`, the `ql` dwords `16n + l4` and `16n + 8 + l4`, then
                // the `qh` dword `8n + l4` (192 bytes a step).
                let step = |n: usize, l4: usize| 288 + 192 * (8 * n + l4);
                dwords(0, 32, &|g| step(g / 16, g % 8) + 64 * ((g % 16) / 8));
                dwords(128, 16, &|g| step(g / 8, g % 8) + 128);
                for i in 0..16 {
                    t[192 + i] = 32 + 16 * i + j;
                }
                t[208] = 2 * j;
                t[209] = 2 * j + 1;
            }
            _ => unreachable!("only types with `packs` are repacked"),
        }
    }
    t
}

/// [`table`] as runs of consecutive bytes, per row: `(src, dst, len)`,
/// `len` 1, 2 or 4 (the dwords move as words, so repacking and unpacking
/// run at copy speed rather than a byte at a time).
fn runs(dtype: DType) -> Vec<Vec<(usize, usize, usize)>> {
    let bb = dtype.block_bytes();
    let t = table(dtype);
    (0..R)
        .map(|j| {
            let tj = &t[j * bb..(j + 1) * bb];
            let mut v: Vec<(usize, usize, usize)> = Vec::new();
            for (i, &d) in tj.iter().enumerate() {
                match v.last_mut() {
                    Some((s0, d0, len)) if *len < 4 && *s0 + *len == i && *d0 + *len == d => {
                        *len += 1
                    }
                    _ => v.push((i, d, 1)),
                }
            }
            // Runs of 3 never occur in these layouts; split them anyway.
            v.into_iter()
                .flat_map(|(s, d, len)| match len {
                    3 => vec![(s, d, 2), (s + 2, d + 2, 1)],
                    _ => vec![(s, d, len)],
                })
                .collect()
        })
        .collect()
}

/// `dst[d..d + len] = src[s..s + len]` for each run.
#[inline]
fn copy_runs(runs: &[(usize, usize, usize)], src: &[u8], dst: &mut [u8], inverse: bool) {
    for &(s, d, len) in runs {
        let (s, d) = if inverse { (d, s) } else { (s, d) };
        match len {
            4 => dst[d..d + 4].copy_from_slice(&src[s..s + 4]),
            2 => dst[d..d + 2].copy_from_slice(&src[s..s + 2]),
            _ => dst[d] = src[s],
        }
    }
}

/// `data` (`rows` GGUF rows of `row_bytes`) repacked: whole groups of
/// [`R`] rows interleaved, the rest copied. `data.len()` must be
/// `rows * row_bytes`, a type with [`packs`]. Groups are packed in
/// parallel on the current team (`par::with_team`).
pub fn pack(dtype: DType, data: &[u8], rows: usize, row_bytes: usize) -> Vec<u8> {
    assert!(packs(dtype) && data.len() == rows * row_bytes);
    let bb = dtype.block_bytes();
    let nb = row_bytes / bb;
    let runs = runs(dtype);
    let mut out = vec![0u8; data.len()];
    let gb = R * row_bytes;
    let whole = rows / R * gb;
    out[whole..].copy_from_slice(&data[whole..]);
    super::par::chunks(true, &mut out[..whole], gb, |g, dst| {
        let src = &data[g * gb..(g + 1) * gb];
        for (j, rj) in runs.iter().enumerate() {
            for b in 0..nb {
                let o = &mut dst[b * R * bb..(b + 1) * R * bb];
                let s = &src[j * row_bytes + b * bb..j * row_bytes + (b + 1) * bb];
                copy_runs(rj, s, o, false);
            }
        }
    });
    out
}

/// GGUF rows `r0..r1` of a weight repacked by [`pack`] (`rows` rows of
/// `row_bytes`) written to `out` (`(r1 - r0) * row_bytes` bytes).
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
    let nb = row_bytes / bb;
    let packed_rows = rows / R * R;
    let runs = (r0 < packed_rows).then(|| runs(dtype));
    for r in r0..r1 {
        let dst = &mut out[(r - r0) * row_bytes..(r - r0 + 1) * row_bytes];
        let Some(runs) = runs.as_ref().filter(|_| r < packed_rows) else {
            dst.copy_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
            continue;
        };
        let base = r / R * R * row_bytes;
        for b in 0..nb {
            let src = &data[base + b * R * bb..base + (b + 1) * R * bb];
            copy_runs(&runs[r % R], src, &mut dst[b * bb..(b + 1) * bb], true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packing permutes bytes within each group and unpacking restores
    /// every row, including rows past the last whole group.
    #[test]
    fn pack_round_trips() {
        for dtype in [DType::Q4_0, DType::Q4K, DType::Q6K] {
            let rb = dtype.row_bytes(512).unwrap();
            let rows = 2 * R + 3;
            let data: Vec<u8> = (0..rows * rb).map(|i| (i * 7 + i / 251) as u8).collect();
            let p = pack(dtype, &data, rows, rb);
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

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Rows at the extremes of each type's integer ranges, so the exact
    /// sums reach their bounds: Q4_0 nibbles 15; Q4_K nibbles 15, scales and
    /// mins 63; Q6_K `q − 32 = −32` with scale −128. `d` (and `dmin`) 1.
    fn extreme_rows(dtype: DType, rows: usize, k: usize) -> Vec<u8> {
        let rb = dtype.row_bytes(k).unwrap();
        let one = half::f16::from_f32(1.0).to_bits().to_le_bytes();
        let mut block = vec![0u8; dtype.block_bytes()];
        match dtype {
            DType::Q4_0 => {
                block[..2].copy_from_slice(&one);
                block[2..].fill(0xFF);
            }
            DType::Q4K => {
                block[..2].copy_from_slice(&one);
                block[2..4].copy_from_slice(&one);
                block[4..].fill(0xFF);
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
        let packed = pack(dtype, data, rows, rb);
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
            for dtype in [DType::Q4_0, DType::Q4K, DType::Q6K] {
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
