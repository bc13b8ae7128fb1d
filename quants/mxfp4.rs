//! MXFP4 (OCP microscaling, as gpt-oss ships it; ggml-quants.c):
//! `{u8 e; u8 qs[16]}`, 32 FP4 (e2m1) values sharing the power-of-two
//! scale `2^(e − 127)`. ggml stores the e2m1 values doubled ([`KVALUES`])
//! and halves the scale instead ([`e8m0_half`]). Nibble `j` low is element
//! `j`, high is `j + 16`.

/// ggml's `kvalues_mxfp4`: e2m1 values times two.
pub(crate) const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `GGML_E8M0_TO_FP32_HALF`: `2^(e − 128)`, subnormal for e < 2.
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

pub(super) fn dequant_mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_half(b[0]);
    for j in 0..16 {
        y[j] = KVALUES[(b[1 + j] & 0xF) as usize] as f32 * d;
        y[j + 16] = KVALUES[(b[1 + j] >> 4) as usize] as f32 * d;
    }
}

/// The index of the value nearest `x` at scale `d` (first on ties).
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = (0u8, (KVALUES[0] as f32 * d - x).abs());
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best.1 {
            best = (i as u8, err);
        }
    }
    best.0
}

/// ggml's `quantize_row_mxfp4_ref`.
pub(super) fn quant_mxfp4(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    // Saturating casts: a block below 2⁻¹²⁵ gets the smallest scale.
    let e = if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0) as u8
    } else {
        0
    };
    let d = e8m0_half(e);
    b[0] = e;
    for j in 0..16 {
        b[1 + j] = best_index(x[j], d) | (best_index(x[j + 16], d) << 4);
    }
}
