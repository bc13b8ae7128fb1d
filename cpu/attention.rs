//! Causal GQA attention against the KV cache, one task per (row, head):
//! scores in f32, max-subtracted softmax, then the weighted sum of values.

use super::par::{self, Ctx};
use super::simd;
use crate::backend::AttentionParams;
use crate::error::{Error, Result};

/// Validates `p`; returns (values in q/out, values in each cache).
pub(crate) fn check(p: &AttentionParams) -> Result<(usize, usize)> {
    if p.n_kv_heads == 0 || !p.n_heads.is_multiple_of(p.n_kv_heads) {
        return Err(Error::op(
            "attention",
            format!(
                "{} query heads cannot share {} kv heads",
                p.n_heads, p.n_kv_heads
            ),
        ));
    }
    let overflow = || Error::op("attention", "shape overflows");
    let per_row = |heads: usize| heads.checked_mul(p.head_dim).ok_or_else(overflow);
    let nq = p
        .rows
        .checked_mul(per_row(p.n_heads)?)
        .ok_or_else(overflow)?;
    let nkv = p
        .capacity
        .checked_mul(per_row(p.n_kv_heads)?)
        .ok_or_else(overflow)?;
    Ok((nq, nkv))
}

pub(crate) fn run(
    ctx: Ctx,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    positions: &[u32],
    out: &mut [f32],
    p: &AttentionParams,
) -> Result<()> {
    let (hd, nh) = (p.head_dim, p.n_heads);
    if let Some(bad) = positions.iter().find(|&&pos| pos as usize >= p.capacity) {
        return Err(Error::op(
            "attention",
            format!("position {bad} >= cache capacity {}", p.capacity),
        ));
    }
    if hd == 0 || nh == 0 {
        return Ok(());
    }
    let group = nh / p.n_kv_heads;
    let stride = p.n_kv_heads * hd;
    par::chunks(ctx.par, out, hd, |t, o| {
        let (r, h) = (t / nh, t % nh);
        let pos = positions[r] as usize;
        let first = if p.window > 0 {
            (pos + 1).saturating_sub(p.window)
        } else {
            0
        };
        let kvo = (h / group) * hd;
        let qv = &q[t * hd..(t + 1) * hd];
        let mut scores = Vec::with_capacity(pos + 1 - first);
        if simd::attention_head(
            ctx.isa,
            qv,
            k,
            v,
            stride,
            kvo,
            first,
            pos,
            p.scale,
            &mut scores,
            o,
        ) {
            return;
        }
        scores.extend(
            (first..=pos).map(|j| simd::dot_f32(ctx.isa, qv, &k[j * stride + kvo..]) * p.scale),
        );
        let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            total += *s;
        }
        o.fill(0.0);
        for (j, e) in (first..=pos).zip(scores.iter()) {
            simd::axpy(ctx.isa, *e, &v[j * stride + kvo..j * stride + kvo + hd], o);
        }
        let inv = 1.0 / total;
        for o in o.iter_mut() {
            *o *= inv;
        }
    });
    Ok(())
}
