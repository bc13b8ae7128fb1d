//! Which layers each backend of a split model runs (`--tensor-split`, as
//! llama.cpp's `--split-mode layer`): consecutive ranges, in proportion to
//! the shares given or, by default, to each device's free memory.

use crate::backend::ComputeBackend;
use crate::error::{Error, Result};
use std::ops::Range;

/// Checks shares as `--tensor-split` takes them: one finite number above 0
/// per device (a device with no share is left out of `--devices` instead).
pub fn check_shares(shares: &[f64], devices: usize) -> Result<()> {
    if shares.len() != devices {
        return Err(Error::Invalid(format!(
            "--tensor-split has {} parts for {devices} devices; give one per device",
            shares.len()
        )));
    }
    if let Some(bad) = shares.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(Error::Invalid(format!(
            "--tensor-split part {bad} is not a number above 0"
        )));
    }
    Ok(())
}

/// Consecutive layer ranges covering `0..n_layer`, one per share, sized in
/// proportion to the shares (rounded at the boundaries), each holding at
/// least one layer.
pub fn layer_ranges(n_layer: usize, shares: &[f64]) -> Result<Vec<Range<usize>>> {
    check_shares(shares, shares.len())?;
    let parts = shares.len();
    if parts == 0 || n_layer < parts {
        return Err(Error::Invalid(format!(
            "{n_layer} layers cannot be split over {parts} devices; each needs at least one"
        )));
    }
    let total: f64 = shares.iter().sum();
    let mut ranges = Vec::with_capacity(parts);
    let (mut start, mut cum) = (0, 0.0);
    for (i, share) in shares.iter().enumerate() {
        cum += share;
        let left = parts - i - 1;
        // Rounded boundary, kept so this part and every later one get a layer.
        let end = if left == 0 {
            n_layer
        } else {
            ((cum / total * n_layer as f64).round() as usize).clamp(start + 1, n_layer - left)
        };
        ranges.push(start..end);
        start = end;
    }
    Ok(ranges)
}

/// The default shares: each backend's free memory where every one can
/// tell, equal shares otherwise.
pub fn default_shares(bes: &[Box<dyn ComputeBackend>]) -> Vec<f64> {
    let free: Option<Vec<f64>> = bes
        .iter()
        .map(|b| b.free_memory().filter(|&f| f > 0).map(|f| f as f64))
        .collect();
    free.unwrap_or_else(|| vec![1.0; bes.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(n: usize, shares: &[f64]) -> Vec<usize> {
        layer_ranges(n, shares)
            .unwrap()
            .iter()
            .map(|r| r.len())
            .collect()
    }

    #[test]
    fn ranges_follow_the_shares() {
        assert_eq!(lens(30, &[1.0, 1.0]), [15, 15]);
        assert_eq!(lens(32, &[3.0, 1.0]), [24, 8]);
        assert_eq!(lens(4, &[1.0]), [4]);
        assert_eq!(lens(5, &[1.0, 1.0, 1.0]), [2, 1, 2]);
        // Every device keeps a layer however small its share.
        assert_eq!(lens(4, &[1000.0, 1.0]), [3, 1]);
        assert_eq!(lens(4, &[1.0, 1000.0]), [1, 3]);
        assert_eq!(lens(2, &[1.0, 1.0]), [1, 1]);
        let r = layer_ranges(7, &[2.0, 5.0]).unwrap();
        assert_eq!((r[0].start, r[1].end), (0, 7));
        assert_eq!(r[0].end, r[1].start);
    }

    #[test]
    fn bad_shares_are_errors() {
        assert!(layer_ranges(1, &[1.0, 1.0]).is_err());
        assert!(layer_ranges(4, &[]).is_err());
        assert!(layer_ranges(4, &[0.0, 0.0]).is_err());
        assert!(layer_ranges(4, &[1.0, f64::NAN]).is_err());
        assert!(layer_ranges(4, &[-1.0, 2.0]).is_err());
        assert!(check_shares(&[1.0, 1.0, 1.0], 2).is_err());
        assert!(check_shares(&[1.0], 2).is_err());
        assert!(check_shares(&[3.0, 1.0], 2).is_ok());
    }
}
