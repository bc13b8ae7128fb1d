//! The chosen experts' outputs of each row, mixed by their weights.

pub(crate) fn run(y: &[f32], weights: &[f32], k: usize, n: usize, add: bool, out: &mut [f32]) {
    for ((o, ys), ws) in out
        .chunks_exact_mut(n)
        .zip(y.chunks_exact(k * n))
        .zip(weights.chunks_exact(k))
    {
        if !add {
            o.fill(0.0);
        }
        for (yj, &w) in ys.chunks_exact(n).zip(ws) {
            for (o, v) in o.iter_mut().zip(yj) {
                *o += w * v;
            }
        }
    }
}
