//! Rotary embedding in place. Angles follow Hugging Face's float32 rotary
//! embedding: `inv_freq_i = base^(-2i/rot_dim)` (YaRN-mixed where scaled,
//! [`RopeParams::inv_freq`]) rounded to f32, `theta = pos * inv_freq_i` in
//! f32, so large positions round as the reference does; YaRN's mscale
//! multiplies cos and sin.

use super::par;
use crate::backend::{RopeParams, RopeStyle};
use crate::error::{Error, Result};

/// Validates `p`; returns the number of values rotated over (`rows * n_heads * head_dim`).
pub(crate) fn check(p: &RopeParams) -> Result<usize> {
    if p.rot_dim > p.head_dim || !p.rot_dim.is_multiple_of(2) {
        return Err(Error::op(
            "rope",
            format!(
                "rot_dim {} must be even and <= head_dim {}",
                p.rot_dim, p.head_dim
            ),
        ));
    }
    p.rows
        .checked_mul(p.n_heads)
        .and_then(|v| v.checked_mul(p.head_dim))
        .ok_or_else(|| Error::op("rope", "rows * n_heads * head_dim overflows"))
}

pub(crate) fn run(par: bool, x: &mut [f32], positions: &[u32], p: &RopeParams) {
    let half = p.rot_dim / 2;
    let row_len = p.n_heads * p.head_dim;
    if row_len == 0 || half == 0 {
        return;
    }
    let inv_freq: Vec<f32> = (0..half).map(|i| p.inv_freq(i)).collect();
    let mscale = p.scaling.map(|s| s.mscale);
    par::chunks(par, x, row_len, |r, row| {
        let pos = positions[r];
        let (cos, sin): (Vec<f32>, Vec<f32>) = inv_freq
            .iter()
            .map(|f| {
                let theta = (pos as f32 * f) as f64;
                let (c, s) = (theta.cos() as f32, theta.sin() as f32);
                match mscale {
                    Some(m) => (c * m, s * m),
                    None => (c, s),
                }
            })
            .unzip();
        for head in row.chunks_exact_mut(p.head_dim) {
            for i in 0..half {
                let (a, b) = match p.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x0 * sin[i] + x1 * cos[i];
            }
        }
    });
}
