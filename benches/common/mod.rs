//! Shared by the benches (a folder, so cargo does not take it for a bench).
#![allow(dead_code)]

use vkllm::backend::ComputeBackend;
use vkllm::profile::Track;

/// The Vulkan backend the environment selects, or None after saying why
/// `bench` has nothing to time.
pub fn vulkan(bench: &str) -> Option<Box<dyn ComputeBackend>> {
    match vkllm::vk::Options::from_env().and_then(|o| vkllm::vk::open(&o)) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("{bench} bench: no Vulkan device ({e})");
            None
        }
    }
}

/// Bytes of weights a bench rotates over: `VKLLM_BENCH_ROTATE_MB` when set
/// (small values keep the weights in cache), else `default`.
pub fn rotate_bytes(default: usize) -> usize {
    std::env::var("VKLLM_BENCH_ROTATE_MB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(default, |mb| mb << 20)
}

/// The bench's arguments that are not flags (cargo passes `--bench`),
/// lower-cased: the names of what to run, all when empty.
pub fn wanted() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.to_ascii_lowercase())
        .collect()
}

/// Deterministic pseudo-random f32s in [-1, 1).
pub fn rand(n: usize, seed: u64) -> Vec<f32> {
    vkllm::random::uniform_f32(n, seed)
}

/// Seconds of untimed passes before a shape's first measurement: right
/// after an upload (fresh host memory) short passes run slow for up to a
/// second, so without them one run reads far below the next
/// (benches/README.md, dispatch, memory and the probes).
pub const SETTLE_SECS: f64 = 1.5;

/// Runs passes of `record`, untimed, for [`SETTLE_SECS`].
pub fn settle(b: &mut dyn ComputeBackend, record: impl Fn(&mut dyn ComputeBackend)) {
    let start = std::time::Instant::now();
    while start.elapsed().as_secs_f64() < SETTLE_SECS {
        b.begin_pass().unwrap();
        record(b);
        b.end_pass().unwrap();
    }
}

/// Seconds the device spent in the ops of one pass of `record`: the GPU's
/// dispatches and copies by its timestamp queries, the CPU's ops by the
/// wall clock.
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
