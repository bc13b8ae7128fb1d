//! aarch64 NEON: the f32 dot used after scalar row dequantization.

use core::arch::aarch64::*;

/// `Σ a[i] * b[i]`; `b.len() >= a.len()` (checked by the caller).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (s, v) in acc.iter_mut().enumerate() {
            *v = vfmaq_f32(
                *v,
                vld1q_f32(pa.add(i + 4 * s)),
                vld1q_f32(pb.add(i + 4 * s)),
            );
        }
        i += 16;
    }
    let mut sum = vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ));
    while i < n {
        sum += a[i] * b[i];
        i += 1;
    }
    sum
}
