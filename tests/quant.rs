//! GGUF block formats: hand-built blocks with values worked out by hand from
//! ggml's formulas (so bit-exactness is checked against the formula, not only
//! against our own code), and quantize → dequantize error bounds.

mod common;

use common::rand_f32;
use half::f16;
use vkllm::quants::{dequantize_row, quantize_row};
use vkllm::DType;

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// Quantize → dequantize stays within `bound * max|x|` of the input for every
/// block size, and quantizing the dequantized values again is stable.
#[test]
fn quantize_dequantize_error_bounds() {
    // Worst-case error per format for inputs in [-1, 1): Q8_0 half a step of
    // 1/127; Q4_1/Q5_1 half a step of 2/15 and 2/31; Q4_0/Q5_0 a full step
    // (1/8, 1/16) because the value opposite the signed max clips to the top
    // level; k-quants (6-bit sub-block scales, searched) measured about 0.07,
    // 0.038, 0.016, bounded at 1.3x; f16/bf16 their relative precision.
    // The small additive terms cover f16 rounding of the block scales.
    let cases = [
        (DType::F32, 0.0),
        (DType::F16, 1e-3),
        (DType::BF16, 8e-3),
        (DType::Q8_0, 0.5 / 127.0 + 1e-3),
        (DType::Q4_0, 1.0 / 8.0 + 1e-3),
        (DType::Q4_1, 0.5 * 2.0 / 15.0 + 2e-3),
        (DType::Q5_0, 1.0 / 16.0 + 1e-3),
        (DType::Q5_1, 0.5 * 2.0 / 31.0 + 2e-3),
        (DType::Q4K, 0.09),
        (DType::Q5K, 0.05),
        (DType::Q6K, 0.021),
        // Q2_K: 4 levels over each 16 values' range (half a step ≈ 1/3 of
        // it) with 4-bit scales and mins, measured 0.32; Q3_K: 8 signed
        // levels, the value opposite the signed max clipping, 0.22; IQ4_NL
        // and IQ4_XS: 16 non-linear levels, 0.12; bounded at ~1.3x.
        (DType::Q2K, 0.4),
        (DType::Q3K, 0.29),
        (DType::IQ4NL, 0.16),
        (DType::IQ4XS, 0.16),
        // Ternary: values round to {-1, 0, 1}·max|x|, half of max|x| at worst.
        (DType::TQ1_0, 0.5 + 1e-3),
        (DType::TQ2_0, 0.5 + 1e-3),
        // MXFP4: the scale s = 2^(⌊log2 max|x|⌋ - 2) ≤ max|x|/4 and the
        // widest gap inside the range (4s to 6s) is 2s: s at worst.
        (DType::MXFP4, 0.25 + 1e-3),
    ];
    // The 2- and 3-bit i-quants have no quantizer here: quantizing to them
    // is an error (not a panic), and every other type has a bound.
    let quantizable: Vec<DType> = DType::ALL
        .into_iter()
        .filter(|d| d.format().encode.is_some())
        .collect();
    for dtype in DType::ALL.into_iter().filter(|d| !quantizable.contains(d)) {
        let mut q = vec![0u8; dtype.block_bytes()];
        let x = vec![0.5; dtype.block_elems()];
        assert!(quantize_row(dtype, &x, &mut q).is_err(), "{dtype}");
    }
    assert_eq!(cases.len(), quantizable.len(), "a bound for every type");
    for (dtype, bound) in cases {
        let n = 4 * 256;
        let x = rand_f32(n, 7);
        let mut q = vec![0u8; dtype.row_bytes(n).unwrap()];
        quantize_row(dtype, &x, &mut q).unwrap();
        let mut y = vec![0f32; n];
        dequantize_row(dtype, &q, &mut y).unwrap();
        let err = common::max_abs_diff(&x, &y);
        assert!(err <= bound, "{dtype}: max error {err} > {bound}");
        // A typical error well below the worst case shows the quantizer is not degenerate.
        let rms = (x.iter().zip(&y).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / n as f32).sqrt();
        assert!(rms <= bound * 0.75 + 1e-9, "{dtype}: rms error {rms}");
    }
}

/// Dequantize one block and compare with values computed here from ggml's
/// formulas. Every scale, min and level is chosen so each expected value is
/// exact in f32, so the comparison is bit-for-bit whatever the operation order.
fn check_block(dtype: DType, block: &[u8], want: &[f32]) {
    let mut got = vec![0f32; want.len()];
    dequantize_row(dtype, block, &mut got).unwrap();
    assert_eq!(got, want, "{dtype}");
}

#[test]
fn q8_0_block_by_hand() {
    // y = q * d
    let mut b = h(0.5).to_vec();
    let q: Vec<i8> = (0..32)
        .map(|j| (j as i8 - 16) * 8 + if j == 31 { 7 } else { 0 })
        .collect();
    b.extend(q.iter().map(|v| *v as u8));
    let want: Vec<f32> = q.iter().map(|v| *v as f32 * 0.5).collect();
    assert_eq!(want[0], -64.0);
    check_block(DType::Q8_0, &b, &want);
}

#[test]
fn q4_0_block_by_hand() {
    // y[j] = (lo_j - 8) * d, y[j + 16] = (hi_j - 8) * d
    let mut b = h(2.0).to_vec();
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let mut want = vec![0f32; 32];
    for j in 0..16 {
        want[j] = (j as f32 - 8.0) * 2.0;
        want[j + 16] = (7.0 - j as f32) * 2.0;
    }
    check_block(DType::Q4_0, &b, &want);
}

#[test]
fn q4_1_block_by_hand() {
    // y = q * d + m
    let mut b = h(0.25).to_vec();
    b.extend(h(-1.0));
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let mut want = vec![0f32; 32];
    for j in 0..16 {
        want[j] = j as f32 * 0.25 - 1.0;
        want[j + 16] = (15 - j) as f32 * 0.25 - 1.0;
    }
    check_block(DType::Q4_1, &b, &want);
}

/// The 5th bits used by the Q5 tests: bit `e` of `qh` belongs to element `e`.
const QH5: u32 = 0xA5C3_0F69;

#[test]
fn q5_0_block_by_hand() {
    // y = ((q | bit_e << 4) - 16) * d
    let mut b = h(0.5).to_vec();
    b.extend(QH5.to_le_bytes());
    b.extend((0..16u8).map(|j| (j * 7 % 16) | ((j * 3 % 16) << 4)));
    let mut want = vec![0f32; 32];
    for j in 0..16 {
        let lo = (j * 7 % 16) as u32 | ((QH5 >> j) & 1) << 4;
        let hi = (j * 3 % 16) as u32 | ((QH5 >> (j + 16)) & 1) << 4;
        want[j] = (lo as f32 - 16.0) * 0.5;
        want[j + 16] = (hi as f32 - 16.0) * 0.5;
    }
    check_block(DType::Q5_0, &b, &want);
}

#[test]
fn q5_1_block_by_hand() {
    // y = (q | bit_e << 4) * d + m
    let mut b = h(0.125).to_vec();
    b.extend(h(3.0));
    b.extend(QH5.to_le_bytes());
    b.extend((0..16u8).map(|j| (j * 5 % 16) | ((j * 11 % 16) << 4)));
    let mut want = vec![0f32; 32];
    for j in 0..16 {
        let lo = (j * 5 % 16) as u32 | ((QH5 >> j) & 1) << 4;
        let hi = (j * 11 % 16) as u32 | ((QH5 >> (j + 16)) & 1) << 4;
        want[j] = lo as f32 * 0.125 + 3.0;
        want[j + 16] = hi as f32 * 0.125 + 3.0;
    }
    check_block(DType::Q5_1, &b, &want);
}

/// ggml's 12-byte packing of eight 6-bit scales and mins: sub-blocks 0..4
/// keep their low 6 bits in bytes j (scale) and j+4 (min); sub-blocks 4..8
/// keep their low 4 bits in byte j+4 (scale low nibble, min high nibble) and
/// their top 2 bits in the top bits of bytes j-4 (scale) and j (min).
fn pack_scales(sc: [u8; 8], mn: [u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    q
}

const SC: [u8; 8] = [1, 2, 3, 63, 17, 33, 48, 5];
const MN: [u8; 8] = [0, 1, 2, 3, 40, 63, 7, 20];

/// 4-bit level of element `e` (0..256) in the k-quant tests.
fn lvl4(e: usize) -> u8 {
    ((e * 7 + e / 32) % 16) as u8
}

/// Q4_K/Q5_K `qs`: chunk `c` of 64 values keeps element `64c + l` in the low
/// nibble and `64c + 32 + l` in the high nibble of byte `32c + l`.
fn pack_qs(level: impl Fn(usize) -> u8) -> Vec<u8> {
    (0..128)
        .map(|i| {
            let (c, l) = (i / 32, i % 32);
            level(64 * c + l) | (level(64 * c + 32 + l) << 4)
        })
        .collect()
}

#[test]
fn q4_k_block_by_hand() {
    // y[e] = d * sc[e / 32] * q - dmin * m[e / 32]
    let (d, dmin) = (0.5f32, 0.25f32);
    let mut b = h(d).to_vec();
    b.extend(h(dmin));
    b.extend(pack_scales(SC, MN));
    b.extend(pack_qs(|e| lvl4(e) & 0x0F));
    let want: Vec<f32> = (0..256)
        .map(|e| d * SC[e / 32] as f32 * lvl4(e) as f32 - dmin * MN[e / 32] as f32)
        .collect();
    check_block(DType::Q4K, &b, &want);
}

#[test]
fn q5_k_block_by_hand() {
    // y[e] = d * sc[e / 32] * (q | h << 4) - dmin * m[e / 32]; the 5th bit of
    // element 64c + l is bit 2c of qh[l], of 64c + 32 + l bit 2c + 1.
    let (d, dmin) = (0.25f32, 0.5f32);
    let hbit = |e: usize| (e * 13 + 5).is_multiple_of(3) as u8;
    let mut qh = [0u8; 32];
    for e in 0..256 {
        let (c, half, l) = (e / 64, (e % 64) / 32, e % 32);
        qh[l] |= hbit(e) << (2 * c + half);
    }
    let mut b = h(d).to_vec();
    b.extend(h(dmin));
    b.extend(pack_scales(SC, MN));
    b.extend(qh);
    b.extend(pack_qs(lvl4));
    let want: Vec<f32> = (0..256)
        .map(|e| {
            let q = lvl4(e) as u32 | (hbit(e) as u32) << 4;
            d * SC[e / 32] as f32 * q as f32 - dmin * MN[e / 32] as f32
        })
        .collect();
    check_block(DType::Q5K, &b, &want);
}

#[test]
fn q6_k_block_by_hand() {
    // y[e] = d * sc[e / 16] * (q - 32), q 6 bits. In half h (128 values),
    // element 128h + 32g + l (g = 0..4) keeps its low 4 bits in ql[64h + l]
    // (g = 0 low nibble, g = 2 high) or ql[64h + 32 + l] (g = 1 low, g = 3
    // high), and its top 2 bits in bits 2g..2g+2 of qh[32h + l].
    let d = 0.125f32;
    let q6 = |e: usize| ((e * 37 + 11) % 64) as u8;
    let sc: [i8; 16] = [-3, 5, 1, 127, -128, 7, 2, -1, 9, 33, -17, 4, 6, -6, 64, 0];
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for e in 0..256 {
        let (hh, g, l) = (e / 128, (e % 128) / 32, e % 32);
        let q = q6(e);
        let idx = 64 * hh + l + if g % 2 == 1 { 32 } else { 0 };
        ql[idx] |= (q & 0x0F) << if g >= 2 { 4 } else { 0 };
        qh[32 * hh + l] |= (q >> 4) << (2 * g);
    }
    let mut b = ql.to_vec();
    b.extend(qh);
    b.extend(sc.iter().map(|v| *v as u8));
    b.extend(h(d));
    let want: Vec<f32> = (0..256)
        .map(|e| d * sc[e / 16] as f32 * (q6(e) as f32 - 32.0))
        .collect();
    check_block(DType::Q6K, &b, &want);
}

#[test]
fn float_rows_by_hand() {
    let vals = [1.0f32, -2.5, 65504.0, 1.0 / 1024.0];
    let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    check_block(DType::F32, &f32b, &vals);
    // f16 1.0 = 0x3C00, -2.5 = 0xC100, 65504 = 0x7BFF, 2^-10 = 0x1400.
    let f16b: Vec<u8> = [0x3C00u16, 0xC100, 0x7BFF, 0x1400]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    check_block(DType::F16, &f16b, &vals);
    // bf16 is the top half of the f32 bits: 1.0 = 0x3F80, -2.5 = 0xC020.
    let bf16b: Vec<u8> = [0x3F80u16, 0xC020]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    check_block(DType::BF16, &bf16b, &vals[..2]);
}

#[test]
fn wrong_row_lengths_are_errors() {
    let mut out = vec![0f32; 32];
    assert!(dequantize_row(DType::Q4_0, &[0u8; 17], &mut out).is_err());
    assert!(
        dequantize_row(DType::Q4K, &[0u8; 144], &mut out).is_err(),
        "32 is not a whole super-block"
    );
    assert!(quantize_row(DType::Q8_0, &out, &mut [0u8; 33]).is_err());
    assert!(quantize_row(DType::Q6K, &out[..31], &mut [0u8; 210]).is_err());
}

#[test]
fn quantizers_follow_ggml_on_simple_blocks() {
    // Q8_0 of 0..31 scaled: d = 31/127, q = round(x / d).
    let x: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let mut q = vec![0u8; 34];
    quantize_row(DType::Q8_0, &x, &mut q).unwrap();
    assert_eq!(&q[..2], &h(31.0 / 127.0));
    assert_eq!(q[2 + 31] as i8, 127);
    assert_eq!(q[2 + 1] as i8, 4); // round(1 * 127 / 31) = round(4.097)
                                   // Q4_0: the signed max (-8 here) maps to level 0 with d = max / -8 = 1.
    let mut x = vec![0f32; 32];
    x[5] = -8.0;
    x[6] = 7.0;
    let mut q = vec![0u8; 18];
    quantize_row(DType::Q4_0, &x, &mut q).unwrap();
    assert_eq!(&q[..2], &h(1.0));
    assert_eq!(q[2 + 5] & 0x0F, 0);
    assert_eq!(q[2 + 6] & 0x0F, 15);
    // All-zero blocks stay exactly zero.
    for dtype in DType::ALL
        .into_iter()
        .filter(|d| d.is_quantized() && d.format().encode.is_some())
    {
        let n = dtype.block_elems();
        let mut q = vec![0xAAu8; dtype.block_bytes()];
        quantize_row(dtype, &vec![0.0; n], &mut q).unwrap();
        let mut y = vec![1f32; n];
        dequantize_row(dtype, &q, &mut y).unwrap();
        assert!(y.iter().all(|v| *v == 0.0), "{dtype}");
    }
}

/// Every quantized type decodes blocks of random bytes (random finite f16
/// scales) exactly as the `gguf` Python package, an independent codec, does:
/// tests/data/quants/<type>.bin holds the blocks and then its values
/// (scripts/quant-fixtures.py writes them).
#[test]
fn dequantization_matches_the_gguf_package_bit_for_bit() {
    for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized()) {
        let path = common::root().join(format!("tests/data/quants/{dtype}.bin"));
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (bb, be) = (dtype.block_bytes(), dtype.block_elems());
        let blocks = data.len() / (bb + 4 * be);
        assert!(
            blocks > 0 && data.len() == blocks * (bb + 4 * be),
            "{dtype}: fixture size"
        );
        let (raw, values) = data.split_at(blocks * bb);
        let want: Vec<u32> = values
            .chunks_exact(4)
            .map(|v| u32::from_le_bytes([v[0], v[1], v[2], v[3]]))
            .collect();
        let mut got = vec![0f32; blocks * be];
        dequantize_row(dtype, raw, &mut got).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                *w,
                "{dtype} value {i}: {g} vs gguf's {}",
                f32::from_bits(*w)
            );
        }
    }
}
