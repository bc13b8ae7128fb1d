//! Index of each row's largest value; the first one on ties (NaNs never win).

pub(crate) fn run(x: &[f32], n: usize, out: &mut [u32]) {
    if n == 0 {
        out.fill(0);
        return;
    }
    for (o, row) in out.iter_mut().zip(x.chunks_exact(n)) {
        let mut best = 0;
        for (i, v) in row.iter().enumerate() {
            if *v > row[best] || row[best].is_nan() && !v.is_nan() {
                best = i;
            }
        }
        *o = best as u32;
    }
}
