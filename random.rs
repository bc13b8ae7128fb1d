//! Deterministic pseudo-random values (xorshift) for tests, benches and
//! kernels' self-checks: the same seed gives the same values everywhere, with
//! no generator state to carry.

/// `n` values in [-1, 1) from `seed`.
pub fn uniform_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
