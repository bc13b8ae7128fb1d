//! `scale`: memory-bound, so a plain loop the compiler vectorizes.

/// `dst *= s`.
pub(crate) fn scale_in_place(dst: &mut [f32], s: f32) {
    dst.iter_mut().for_each(|d| *d *= s);
}
