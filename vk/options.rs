//! How to open the Vulkan backend, from the caller or the environment.

use std::time::Duration;

/// [`Options::spin_wait`] unless `VKLLM_SPIN_US` says otherwise: longer than
/// a decode step of the models this engine runs on the GPUs it targets
/// (Llama-3.1-8B Q4_K_M: ~3.3 ms on an H100).
pub const DEFAULT_SPIN_WAIT: Duration = Duration::from_millis(10);

/// How to open the Vulkan backend.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `VKLLM_DEVICE`: device index or name substring.
    pub device: Option<String>,
    /// `VKLLM_VALIDATE=1`: Khronos validation layer + debug messenger.
    pub validate: bool,
    /// Directory of the on-disk pipeline caches (one file per device and
    /// driver): `VKLLM_PIPELINE_CACHE`, `off` for none, by default
    /// `$XDG_CACHE_HOME/vkllm` or `~/.cache/vkllm`.
    pub pipeline_cache: Option<std::path::PathBuf>,
    /// `VKLLM_FAIL_ALLOC_AFTER=N`: the first N buffer allocations succeed
    /// and every later one fails as out of device memory. A fault injector:
    /// tests use it to check that running out mid-load or mid-pass leaves a
    /// clean error and a backend that still drops cleanly.
    pub fail_alloc_after: Option<u64>,
    /// `VKLLM_LOSE_DEVICE_AFTER=N`: the first N compute passes run; the
    /// next one, and every submit and wait for idle after it (the drop's
    /// too), fails as `VK_ERROR_DEVICE_LOST` would. A fault injector: tests
    /// use it to check that a GPU that stops answering mid-generation leaves
    /// a clean error and a model that drops.
    pub lose_device_after: Option<u64>,
    /// `VKLLM_PIPELINE_STATS=1`: print each pipeline's compiled statistics
    /// (registers, shared memory, ... as the driver names them) to stderr
    /// as it is created, where the device has
    /// VK_KHR_pipeline_executable_properties: occupancy explains kernels
    /// that stream below memory speed.
    pub pipeline_stats: bool,
    /// `VKLLM_SPIN_US`: how long the host polls a submitted pass's fence
    /// before it sleeps in vkWaitForFences (0: it sleeps at once). Waking
    /// from that sleep costs a decode step tens of microseconds: on an H100
    /// polling took tg128 up 2.5% (Llama-3.1-8B) to 7% (TinyLlama), at the
    /// price of one busy host core while a pass runs. `None`:
    /// [`DEFAULT_SPIN_WAIT`] on a GPU, no poll on a CPU implementation
    /// (lavapipe), whose own threads need the cores.
    pub spin_wait: Option<Duration>,
    /// `VKLLM_PREPARE_KERNELS=on|off`: whether a model's kernels are made
    /// when it loads, all at once and in parallel, instead of on first use
    /// ([`crate::backend::ComputeBackend::begin_kernel_survey`]). `None`:
    /// on, except on a CPU implementation (lavapipe), whose compiles would
    /// add seconds to each load for kernels a short run may never use.
    pub prepare_kernels: Option<bool>,
}

impl Options {
    pub fn from_env() -> Self {
        Options {
            device: std::env::var("VKLLM_DEVICE").ok().filter(|s| !s.is_empty()),
            validate: std::env::var("VKLLM_VALIDATE").as_deref() == Ok("1"),
            pipeline_cache: pipeline_cache_dir(),
            fail_alloc_after: env_count("VKLLM_FAIL_ALLOC_AFTER"),
            lose_device_after: env_count("VKLLM_LOSE_DEVICE_AFTER"),
            pipeline_stats: std::env::var("VKLLM_PIPELINE_STATS").as_deref() == Ok("1"),
            spin_wait: env_count("VKLLM_SPIN_US").map(Duration::from_micros),
            prepare_kernels: match std::env::var("VKLLM_PREPARE_KERNELS").as_deref() {
                Ok("on") => Some(true),
                Ok("off") => Some(false),
                _ => None,
            },
        }
    }
}

/// A count given in the environment variable `key`.
fn env_count(key: &str) -> Option<u64> {
    std::env::var(key).ok().and_then(|n| n.trim().parse().ok())
}

fn pipeline_cache_dir() -> Option<std::path::PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    match var("VKLLM_PIPELINE_CACHE") {
        Some(v) if v == "off" => None,
        Some(v) => Some(v.into()),
        None => var("XDG_CACHE_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| var("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
            .map(|d| d.join("vkllm")),
    }
}
