//! Index of each row's largest value; the first one on ties (NaNs never
//! win), among the values a mask allows when there is one.

/// `allowed`: `n.div_ceil(32)` words a row, a bit per value.
pub(crate) fn run(x: &[f32], allowed: Option<&[u32]>, n: usize, out: &mut [u32]) {
    if n == 0 {
        out.fill(0);
        return;
    }
    let words = n.div_ceil(32);
    for (r, (o, row)) in out.iter_mut().zip(x.chunks_exact(n)).enumerate() {
        *o = match allowed {
            None => best(row.iter().copied().enumerate()),
            Some(mask) => {
                let bits = mask.get(r * words..(r + 1) * words).unwrap_or(&[]);
                best(
                    row.iter()
                        .copied()
                        .enumerate()
                        .filter(|&(i, _)| bits.get(i / 32).is_some_and(|w| w >> (i % 32) & 1 == 1)),
                )
            }
        };
    }
}

/// The first index of the largest non-NaN value, 0 when there is none.
fn best(values: impl Iterator<Item = (usize, f32)>) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, v) in values {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}
