//! How to open the Vulkan backend, from the caller or the environment: every
//! `VKLLM_*` setting of this backend is parsed here, once, so the backend
//! and its kernel choice work from data.

use super::caps::{GemvKernel, PrefillAttention};
use crate::error::Result;
use crate::settings::{choice, count, setting, ON_OFF};
use std::time::Duration;

/// [`Options::spin_wait`] unless `VKLLM_SPIN_US` says otherwise: longer than
/// a decode step of the models this engine runs on the GPUs it targets
/// (benches/README.md, waiting on a pass).
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
    /// from that sleep costs a decode step tens of microseconds; polling
    /// buys them back for one busy host core while a pass runs
    /// (benches/README.md, waiting on a pass). `None`:
    /// [`DEFAULT_SPIN_WAIT`] on a GPU, no poll on a CPU implementation
    /// (lavapipe), whose own threads need the cores.
    pub spin_wait: Option<Duration>,
    /// `VKLLM_PREPARE_KERNELS=on|off`: whether a model's kernels are made
    /// when it loads, all at once and in parallel, instead of on first use
    /// ([`crate::backend::ComputeBackend::begin_kernel_survey`]). `None`:
    /// on, except on a CPU implementation (lavapipe), whose compiles would
    /// add seconds to each load for kernels a short run may never use.
    pub prepare_kernels: Option<bool>,
    /// Kernels forced instead of the device's defaults.
    pub kernels: KernelOverrides,
    /// `VKLLM_WEIGHT_PART_BYTES`: split weights above this many bytes even
    /// where the device's binding range allows more, to exercise the split
    /// path (vk/weight_parts.rs) on any device. `None` (or 0): the range alone.
    pub weight_part_bytes: Option<u64>,
}

/// Kernels forced for A/B runs and tests; each `None` (or `false`) leaves
/// the device's default ([`super::Kernels::choose`]). A forced kernel the
/// device cannot run fails when the backend opens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOverrides {
    /// `VKLLM_MATMUL=tiles|lanes|coopmat|coopmat-khr|coopmat-nv`.
    pub matmul: Option<MatmulOverride>,
    /// `VKLLM_ATTENTION=flash|rows|decode|coopmat`.
    pub attention: Option<PrefillAttention>,
    /// `VKLLM_GEMV=auto|workgroup|subgroup|gemm`.
    pub gemv: Option<GemvKernel>,
    /// `VKLLM_GEMV_X=f32` (`q8`, the default, takes integer dots where the
    /// device has them): decode matmuls keep their input in f32.
    pub gemv_x_f32: bool,
    /// `VKLLM_DECODE_ATTENTION=split` (`fused` is the default): a decode
    /// step's rope and cache append run in a dispatch of their own.
    pub decode_rope_split: bool,
    /// `VKLLM_DECODE_SPLITS=on|off`.
    pub decode_splits: Option<bool>,
}

/// A GEMM kernel forced by `VKLLM_MATMUL`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulOverride {
    Tiles,
    Lanes,
    /// Cooperative matrices through whichever extension the device has,
    /// KHR first.
    Coopmat,
    CoopmatKhr,
    CoopmatNv,
}

/// The words `VKLLM_MATMUL` takes.
const MATMUL_WORDS: [(&str, MatmulOverride); 5] = [
    ("tiles", MatmulOverride::Tiles),
    ("lanes", MatmulOverride::Lanes),
    ("coopmat", MatmulOverride::Coopmat),
    ("coopmat-khr", MatmulOverride::CoopmatKhr),
    ("coopmat-nv", MatmulOverride::CoopmatNv),
];

impl MatmulOverride {
    /// The word `VKLLM_MATMUL` takes for it.
    pub fn name(self) -> &'static str {
        MATMUL_WORDS
            .iter()
            .find(|(_, k)| *k == self)
            .map_or("", |(word, _)| word)
    }
}

impl Options {
    /// The options the `VKLLM_*` environment variables give: an error names
    /// the first variable set to a value it does not take.
    pub fn from_env() -> Result<Self> {
        let flag = [("1", true), ("0", false)];
        Ok(Options {
            device: setting("VKLLM_DEVICE")?,
            validate: choice("VKLLM_VALIDATE", &flag)?.unwrap_or(false),
            pipeline_cache: pipeline_cache_dir(),
            fail_alloc_after: count("VKLLM_FAIL_ALLOC_AFTER")?,
            lose_device_after: count("VKLLM_LOSE_DEVICE_AFTER")?,
            pipeline_stats: choice("VKLLM_PIPELINE_STATS", &flag)?.unwrap_or(false),
            spin_wait: count("VKLLM_SPIN_US")?.map(Duration::from_micros),
            prepare_kernels: choice("VKLLM_PREPARE_KERNELS", &ON_OFF)?,
            kernels: KernelOverrides {
                matmul: choice("VKLLM_MATMUL", &MATMUL_WORDS)?,
                attention: choice(
                    "VKLLM_ATTENTION",
                    &[
                        ("flash", PrefillAttention::Flash),
                        ("rows", PrefillAttention::Rows),
                        ("decode", PrefillAttention::Decode),
                        ("coopmat", PrefillAttention::Coopmat),
                    ],
                )?,
                gemv: choice(
                    "VKLLM_GEMV",
                    &[
                        ("auto", GemvKernel::Auto),
                        ("workgroup", GemvKernel::Workgroup),
                        ("subgroup", GemvKernel::Subgroup),
                        ("gemm", GemvKernel::Gemm),
                    ],
                )?,
                gemv_x_f32: choice("VKLLM_GEMV_X", &[("q8", false), ("f32", true)])?
                    .unwrap_or(false),
                decode_rope_split: choice(
                    "VKLLM_DECODE_ATTENTION",
                    &[("fused", false), ("split", true)],
                )?
                .unwrap_or(false),
                decode_splits: choice("VKLLM_DECODE_SPLITS", &ON_OFF)?,
            },
            weight_part_bytes: count("VKLLM_WEIGHT_PART_BYTES")?.filter(|&b| b > 0),
        })
    }
}

/// `VKLLM_REQUIRE_VULKAN=1`: a test or bench that cannot open the Vulkan
/// backend fails instead of skipping (CI sets it).
pub fn vulkan_required() -> bool {
    matches!(setting("VKLLM_REQUIRE_VULKAN"), Ok(Some(v)) if v == "1")
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
