//! Shared by the benches (a folder, so cargo does not take it for a bench).
#![allow(dead_code)]

use vkllm::backend::ComputeBackend;
use vkllm::profile::Track;

/// The Vulkan backend the environment selects, or None after saying why
/// `bench` has nothing to time.
pub fn vulkan(bench: &str) -> Option<Box<dyn ComputeBackend>> {
    match vkllm::vk::open(&vkllm::vk::Options::from_env()) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("{bench} bench: no Vulkan device ({e})");
            None
        }
    }
}

/// Deterministic pseudo-random f32s in [-1, 1) (xorshift).
pub fn rand(n: usize, seed: u64) -> Vec<f32> {
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

/// Seconds the GPU spent in the dispatches and copies of one pass of
/// `record`, by the backend's timestamp queries.
pub fn gpu_pass_seconds(
    b: &mut dyn ComputeBackend,
    record: impl FnOnce(&mut dyn ComputeBackend),
) -> f64 {
    b.set_profiling(true).unwrap();
    b.begin_pass().unwrap();
    record(b);
    b.end_pass().unwrap();
    let us: f64 = b
        .take_profile()
        .iter()
        .filter(|e| e.track == Track::Gpu)
        .map(|e| e.dur_us)
        .sum();
    b.set_profiling(false).unwrap();
    us * 1e-6
}
