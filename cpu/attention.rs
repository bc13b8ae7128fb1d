//! Causal GQA attention against the KV cache, one task per (row, head):
//! scores in f32, max-subtracted softmax (with the head's sink logit in its
//! max and denominator, where given), then the weighted sum of values.

use super::par::{self, Ctx};
use super::simd;
use crate::backend::{check, AttentionParams, KvPages};
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
    let cache_rows = check::kv_rows("attention", p.pages.as_ref(), p.rows, p.capacity)?;
    let nkv = cache_rows
        .checked_mul(per_row(p.n_kv_heads)?)
        .ok_or_else(overflow)?;
    Ok((nq, nkv))
}

/// Where row `r`'s positions live in the cache: a paged cache's tables
/// (see [`KvPages`]), or position = cache row.
#[derive(Clone, Copy)]
pub(crate) struct CacheRows<'a> {
    pages: Option<(&'a [u32], KvPages)>,
}

impl<'a> CacheRows<'a> {
    pub fn new(table: Option<&'a [u32]>, pages: Option<&KvPages>) -> Self {
        CacheRows {
            pages: table.zip(pages.copied()),
        }
    }

    /// The cache row of row `r`'s position `p`, or None where its page id
    /// is outside the pool.
    pub fn row(&self, r: usize, p: usize) -> Option<usize> {
        let Some((table, pg)) = self.pages else {
            return Some(p);
        };
        let page = *table.get(r * pg.stride + (p >> pg.page_log2))? as usize;
        (page < pg.pages).then_some(page << pg.page_log2 | (p & (pg.page_len() - 1)))
    }

    /// Checks that every page row `r` reads up to position `last` is in the pool.
    pub fn check(&self, op: &'static str, r: usize, last: usize) -> Result<()> {
        let Some((_, pg)) = self.pages else {
            return Ok(());
        };
        for p in (0..=last).step_by(pg.page_len()) {
            if self.row(r, p).is_none() {
                return Err(Error::op(
                    op,
                    format!(
                        "row {r}'s page table names a page outside the pool of {}",
                        pg.pages
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The cache row of `first` when positions `first..=last` of row `r`
    /// lie in consecutive cache rows (every unpaged cache; a paged one whose
    /// pages follow each other).
    fn contiguous(&self, r: usize, first: usize, last: usize) -> Option<usize> {
        let start = self.row(r, first)?;
        let Some((_, pg)) = self.pages else {
            return Some(start);
        };
        let mut p = (first | (pg.page_len() - 1)) + 1;
        while p <= last {
            if self.row(r, p)? != start + (p - first) {
                return None;
            }
            p += pg.page_len();
        }
        Some(start)
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    ctx: Ctx,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    positions: &[u32],
    cache: CacheRows,
    sinks: Option<&[f32]>,
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
    for (r, &pos) in positions.iter().enumerate() {
        cache.check("attention", r, pos as usize)?;
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
        // The caller checked `sinks` holds n_heads values.
        let sink = sinks.and_then(|s| s.get(h).copied());
        let mut scores = Vec::with_capacity(pos + 1 - first);
        if let Some(start) = cache.contiguous(r, first, pos) {
            // The span's keys are the cache rows from `start` on.
            let (f, l) = (start, start + (pos - first));
            if simd::attention_head(
                ctx.isa,
                qv,
                k,
                v,
                stride,
                kvo,
                f,
                l,
                p.scale,
                sink,
                &mut scores,
                o,
            ) {
                return;
            }
        }
        // Checked above: every position's page is in the pool.
        let at = |j: usize| cache.row(r, j).unwrap_or(0) * stride + kvo;
        scores.extend((first..=pos).map(|j| simd::dot_f32(ctx.isa, qv, &k[at(j)..]) * p.scale));
        let max = scores
            .iter()
            .chain(sink.as_ref())
            .cloned()
            .fold(f32::NEG_INFINITY, f32::max);
        let mut total = sink.map_or(0.0, |s| (s - max).exp());
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            total += *s;
        }
        o.fill(0.0);
        for (j, e) in (first..=pos).zip(scores.iter()) {
            simd::axpy(ctx.isa, *e, &v[at(j)..at(j) + hd], o);
        }
        let inv = 1.0 / total;
        for o in o.iter_mut() {
            *o *= inv;
        }
    });
    Ok(())
}
