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
            None => first_max(row),
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

/// [`best`] over a whole row in two passes that vectorize (the largest
/// value, then its first index): the greedy step reads 128K logits a token.
fn first_max(row: &[f32]) -> u32 {
    // NaN compares false, so it never replaces a lane's maximum.
    let pick = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (m, v) in lanes.iter_mut().zip(c) {
            *m = pick(*m, *v);
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &v| pick(m, v));
    // None: every value is NaN.
    row.iter().position(|&v| v == max).map_or(0, |i| i as u32)
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

#[cfg(test)]
mod tests {
    use super::{best, first_max};

    #[test]
    fn first_max_picks_as_best_does() {
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        let rows: Vec<Vec<f32>> = vec![
            vec![],
            vec![nan; 11],
            vec![-inf, nan, -inf],
            vec![nan, 1.0, 3.0, 3.0, nan, 2.0, 3.0, 0.5, 3.0, -1.0],
            vec![-2.0; 19],
            (0..37).map(|i| ((i * 29) % 17) as f32).collect(),
            (0..40)
                .map(|i| if i == 33 { inf } else { -(i as f32) })
                .collect(),
        ];
        for row in rows {
            let want = best(row.iter().copied().enumerate());
            assert_eq!(first_max(&row), want, "{row:?}");
        }
    }
}
