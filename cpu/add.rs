//! `add`: memory-bound, so a plain loop the compiler vectorizes, in
//! chunks on the team for prefill's rows.

use super::par;

/// Values a task adds.
const CHUNK: usize = 1 << 14;

/// `dst = first + other` (`first` omitted: `dst += other`; both omitted:
/// `dst += dst`, both operands aliasing the output).
pub(crate) fn run(par: bool, dst: &mut [f32], first: Option<&[f32]>, other: Option<&[f32]>) {
    par::chunks(par, dst, CHUNK, |c, d| {
        let at = c * CHUNK..c * CHUNK + d.len();
        if let Some(a) = first {
            d.copy_from_slice(&a[at.clone()]);
        }
        match other {
            Some(b) => d.iter_mut().zip(&b[at]).for_each(|(d, b)| *d += b),
            None => d.iter_mut().for_each(|d| *d += *d),
        }
    });
}
