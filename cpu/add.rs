//! `add`: memory-bound, so a plain loop the compiler vectorizes.

/// `dst += other`, or `dst += dst` when both operands alias the output.
pub(crate) fn add_in_place(dst: &mut [f32], other: Option<&[f32]>) {
    match other {
        Some(b) => dst.iter_mut().zip(b).for_each(|(d, b)| *d += b),
        None => dst.iter_mut().for_each(|d| *d += *d),
    }
}
