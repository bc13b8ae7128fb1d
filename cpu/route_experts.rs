//! Mixture-of-experts routing: each row's `k` largest logits (the lower
//! expert first on ties; NaNs never win) and their weights.

use crate::backend::RouteParams;

pub(crate) fn run(logits: &[f32], p: &RouteParams, ids: &mut [u32], weights: &mut [f32]) {
    let (e, k) = (p.experts, p.k);
    let mut order: Vec<usize> = Vec::with_capacity(e);
    for ((row, ids), ws) in logits
        .chunks_exact(e)
        .zip(ids.chunks_exact_mut(k))
        .zip(weights.chunks_exact_mut(k))
    {
        order.clear();
        order.extend(0..e);
        // Stable: equal logits keep the lower index first.
        order.sort_by(|&a, &b| {
            let (x, y) = (row[a], row[b]);
            match (x.is_nan(), y.is_nan()) {
                (false, false) => y.total_cmp(&x),
                (a_nan, b_nan) => a_nan.cmp(&b_nan),
            }
        });
        let max = row[order[0]];
        // Softmax over the k chosen (renorm) or over every expert.
        let denom: f32 = if p.renorm {
            order[..k].iter().map(|&i| (row[i] - max).exp()).sum()
        } else {
            row.iter().map(|&v| (v - max).exp()).sum()
        };
        for ((id, w), &i) in ids.iter_mut().zip(ws.iter_mut()).zip(&order[..k]) {
            *id = i as u32;
            *w = (row[i] - max).exp() / denom;
        }
    }
}
