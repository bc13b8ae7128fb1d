//! Vulkan backend: raw Vulkan through `ash`, memory through gpu-allocator,
//! GLSL kernels from `glsl/` compiled to SPIR-V at build time.
//!
//! - `instance`: loader, instance, validation layer and messenger;
//! - `device`: physical device choice and the compute queue;
//! - `caps`: device capabilities, [`list_devices`];
//! - `memory`: buffers and staging; `layout`: weight repacking;
//! - `pipeline`: pipelines and layouts; `recorder`: command buffers,
//!   automatic barriers, descriptor sets, per-pass [`PassStats`];
//! - `ops/`: one encoder per op, recording through a narrow context
//!   (`ops::Encoder`); `compute`: the [`ComputeBackend`] impl, one line per op;
//! - `pass`, `transfer`, `profiler`: pass submission and checks, uploads and
//!   downloads, timestamps.
//!
//! Per-token values (token ids, positions, and through them the attention
//! length and the KV-cache row `store_rows`/`rope_store` write) are read by
//! the shaders from buffers, so a recorded pass can be submitted again after
//! new values are written: decode passes are kept per key and replayed
//! (`begin_replayable_pass`/`replay`); [`VulkanBackend::replay_pass`]
//! resubmits the last unkeyed pass.

mod caps;
mod compute;
mod coopmat_shapes;
mod device;
mod instance;
mod layout;
mod memory;
pub use memory::STAGING_CAP;
mod ops;
mod options;
mod pass;
mod pipeline;
mod profiler;
mod recorder;
#[cfg(test)]
mod tests;
mod transfer;
mod weight_parts;

pub use caps::{
    list_devices, Caps, DeviceInfo, GemvKernel, Kernels, MatmulKernel, PrefillAttention,
};
pub use ops::matmul::gemv_int_dot;
pub use options::{vulkan_required, KernelOverrides, MatmulOverride, Options, DEFAULT_SPIN_WAIT};
pub use pipeline::{GLSLC_INT_DOT, GLSL_COOPMAT_KHR, GLSL_COOPMAT_NV};
pub use recorder::PassStats;

/// Weights from this size take the integer-dot GEMV by default: below it the
/// extra quantize dispatch (a dependent step) costs more than the faster
/// kernel saves (benches/README.md, decode GEMV).
pub const GEMV_Q8_MIN_BYTES: usize = 8 << 20;

/// Bytes of the status words (see `VulkanBackend::status`).
const STATUS_BYTES: usize = 12;

use crate::backend::{Buffer, ComputeBackend};
use crate::error::{Error, Result};
use ash::vk;
use device::Device;
use instance::Instance;
use memory::Memory;
use pipeline::Pipelines;
use profiler::Profiler;
use recorder::Recorder;
use std::time::Duration;

/// The name of the device `--backend auto` would open, or why it would
/// use the CPU instead (see [`device::auto_choice`]).
pub fn auto_device(opts: &Options) -> std::result::Result<String, String> {
    let infos = list_devices().map_err(|e| e.to_string())?;
    let i = device::auto_choice(&infos, opts.device.as_deref())?;
    Ok(infos[i].name.clone())
}

/// Open the Vulkan backend as a trait object.
pub fn open(opts: &Options) -> Result<Box<dyn ComputeBackend>> {
    Ok(Box::new(VulkanBackend::new(opts)?))
}

/// A `vk::Result` as a one-sentence [`Error`] naming what was being done.
/// Device loss and memory exhaustion get their own variants, so a host app
/// can reopen the backend or ask for less instead of giving up.
pub(crate) fn vk_err(what: &str) -> impl Fn(vk::Result) -> Error + '_ {
    move |r| match r {
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => Error::out_of_device_memory(what),
        vk::Result::ERROR_OUT_OF_HOST_MEMORY => Error::out_of_host_memory(what),
        vk::Result::ERROR_DEVICE_LOST => Error::DeviceLost(what.to_string()),
        vk::Result::ERROR_INITIALIZATION_FAILED => {
            Error::Vulkan(format!("driver initialisation failed while {what}"))
        }
        vk::Result::ERROR_LAYER_NOT_PRESENT | vk::Result::ERROR_EXTENSION_NOT_PRESENT => {
            Error::Unsupported(format!(
                "a required Vulkan layer or extension is missing while {what}"
            ))
        }
        vk::Result::ERROR_FEATURE_NOT_PRESENT => Error::Unsupported(format!(
            "a required Vulkan device feature is missing while {what}"
        )),
        vk::Result::ERROR_INCOMPATIBLE_DRIVER => Error::Unsupported(format!(
            "the Vulkan driver is incompatible (Vulkan 1.2 needed) while {what}"
        )),
        other => Error::Vulkan(format!("{what} failed with {other:?}")),
    }
}

/// The Vulkan implementation of [`ComputeBackend`].
pub struct VulkanBackend {
    // Field order is drop order: children of the device first, then the
    // device, then this backend's hold on the shared instance.
    rec: Recorder,
    pipes: Pipelines,
    mem: Memory,
    dev: Device,
    inst: std::sync::Arc<Instance>,
    in_pass: bool,
    /// Buffers allocated outside a command buffer, zeroed at the next recording.
    pending_fills: Vec<u32>,
    /// Buffers freed while recorded commands may use them, destroyed after submit.
    pending_frees: Vec<u32>,
    last_pass: PassStats,
    /// Host-readable status words in which shaders flag input errors found
    /// on the GPU: [bad token id + 1, bad position + 1, page past the pool
    /// + 1], 0 when fine.
    status: Buffer,
    /// The pass being recorded allocated (and zeroes) buffers: not replayable.
    pass_allocs: bool,
    /// Scratch buffers and tables of the op encoders.
    ops: ops::OpState,
    /// Smallest weight the integer-dot GEMV takes.
    gemv_q8_min_bytes: usize,
    /// Weights stored in several buffers (see weight_parts.rs).
    splits: weight_parts::Splits,
    /// Split weights above this many bytes even within the device's range.
    part_limit: Option<u64>,
    /// Some while profiling is on.
    profile: Option<Profiler>,
    /// Kernel variants chosen for this device (and the options' overrides).
    kernels: caps::Kernels,
    /// Models make their kernels when they load (see [`Options::prepare_kernels`]).
    prepare_kernels: bool,
}

impl VulkanBackend {
    pub fn new(opts: &Options) -> Result<VulkanBackend> {
        let inst = Instance::shared(opts.validate)?;
        let dev = Device::open(
            &inst,
            opts.device.as_deref(),
            opts.pipeline_stats,
            &opts.kernels,
        )?;
        let kernels = dev.kernels;
        // On an error below, the parts made so far drop in reverse order,
        // each destroying its Vulkan objects before the device goes.
        let mut mem = Memory::new(
            &inst.instance,
            &dev.device,
            dev.physical,
            opts.fail_alloc_after,
        )?;
        // SAFETY: valid physical device.
        let props = unsafe { inst.instance.get_physical_device_properties(dev.physical) };
        let disk = opts
            .pipeline_cache
            .clone()
            .map(|dir| pipeline::DiskCache::for_device(dir, &props));
        let stats = dev.pipeline_stats.then(|| {
            ash::khr::pipeline_executable_properties::Device::new(&inst.instance, &dev.device)
        });
        let pipes = Pipelines::new(&dev.device, disk, stats)?;
        let mut rec = Recorder::new(&dev.device, dev.queue, dev.queue_family)?;
        rec.lose_device_after(opts.lose_device_after);
        rec.spin_wait(opts.spin_wait.unwrap_or(if dev.caps().cpu_device {
            Duration::ZERO
        } else {
            DEFAULT_SPIN_WAIT
        }));
        let status = Buffer::new(mem.alloc_host_readable(STATUS_BYTES)?, STATUS_BYTES);
        let prepare_kernels = opts.prepare_kernels.unwrap_or(!dev.caps().cpu_device);
        let backend = VulkanBackend {
            rec,
            pipes,
            mem,
            dev,
            inst,
            in_pass: false,
            pending_fills: Vec::new(),
            pending_frees: Vec::new(),
            last_pass: PassStats::default(),
            ops: ops::OpState::default(),
            gemv_q8_min_bytes: GEMV_Q8_MIN_BYTES,
            splits: weight_parts::Splits::default(),
            part_limit: opts.weight_part_bytes,
            status,
            pass_allocs: false,
            profile: None,
            kernels,
            prepare_kernels,
        };
        backend.inst.check_messages()?;
        Ok(backend)
    }

    /// Counters of the last completed pass.
    pub fn stats(&self) -> PassStats {
        self.last_pass
    }

    pub fn device_info(&self) -> &DeviceInfo {
        &self.dev.info
    }

    /// Bytes of pipeline-cache data read from disk when the backend opened
    /// (0: no usable cache file for this device and driver).
    pub fn pipeline_cache_loaded_bytes(&self) -> usize {
        self.pipes.loaded_bytes
    }

    /// The kernel variants this backend dispatches.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// The GEMM kernel for matmuls of more than a few rows: an f32 kernel
    /// the device can run (tiles, lanes), or the cooperative-matrix kernel
    /// the backend opened with (its device feature is enabled only then).
    /// Tests use it to check each on one device; [`KernelOverrides::matmul`]
    /// chooses at open.
    pub fn set_matmul(&mut self, kernel: MatmulKernel) -> Result<()> {
        let opened = self.dev.kernels.matmul;
        if (kernel.is_coopmat() && kernel != opened) || !kernel.available(self.caps()) {
            return Err(Error::Unsupported(format!(
                "{} was opened with {opened:?} matmuls and cannot run {kernel:?}",
                self.dev.info.name
            )));
        }
        self.kernels.matmul = kernel;
        // Kept passes were recorded with the other kernel.
        self.rec.invalidate_pass();
        Ok(())
    }

    /// The integer-dot GEMV (see [`Kernels::gemv_q8`]) off (`None`) or on
    /// for weights of at least `min_bytes` (the default is
    /// [`GEMV_Q8_MIN_BYTES`]); on needs the device's integer dot products,
    /// enabled when the backend opened with them available. Tests use it to
    /// check both kernels on one device, at every size.
    pub fn set_gemv_q8(&mut self, min_bytes: Option<usize>) -> Result<()> {
        if min_bytes.is_some() && !self.dev.kernels.gemv_q8 {
            return Err(Error::Unsupported(format!(
                "{} was opened without integer dot products (VKLLM_GEMV_X=f32, or the \
                 device lacks them)",
                self.dev.info.name
            )));
        }
        self.kernels.gemv_q8 = min_bytes.is_some();
        self.gemv_q8_min_bytes = min_bytes.unwrap_or(usize::MAX);
        // Kept passes were recorded with the other kernel.
        self.rec.invalidate_pass();
        Ok(())
    }

    /// The prefill attention kernel (see [`PrefillAttention`]; cooperative
    /// matrices only where the matmuls have them): tests use it to check
    /// each on one device.
    pub fn set_attention(&mut self, kernel: PrefillAttention) -> Result<()> {
        if kernel == PrefillAttention::Coopmat && !self.kernels.matmul.is_coopmat() {
            return Err(Error::Unsupported(format!(
                "{} runs {:?} matmuls, not the cooperative-matrix attention's",
                self.dev.info.name, self.kernels.matmul
            )));
        }
        self.kernels.attention = kernel;
        // Kept passes were recorded with the other kernel.
        self.rec.invalidate_pass();
        Ok(())
    }

    /// How decode matmuls run (see [`GemvKernel`]): tests use it to check
    /// both the GEMVs and the matmul kernel on one device.
    pub fn set_gemv(&mut self, gemv: GemvKernel) {
        self.kernels.gemv = gemv;
        // Kept passes were recorded with the other kernel.
        self.rec.invalidate_pass();
    }

    /// Decode attention split over many workgroups (a GPU's plans) or one
    /// per (kv head, tile of heads) (see [`Kernels::decode_splits`]). Tests
    /// use it to check both plans on one device.
    pub fn set_decode_splits(&mut self, on: bool) {
        self.kernels.decode_splits = on;
        // Kept passes were recorded with the other plan.
        self.rec.invalidate_pass();
    }

    /// Wait for the device to finish its work: `Error::DeviceLost` once it
    /// is lost. Dropping the backend waits the same way, then frees
    /// everything whatever the answer (valid on a lost device).
    pub fn wait_idle(&mut self) -> Result<()> {
        self.rec.wait_idle()
    }

    fn caps(&self) -> &Caps {
        self.dev.caps()
    }

    /// Record an op into the current pass through its encoder; ops outside
    /// a pass are errors, as on every backend.
    fn encode(
        &mut self,
        op: &'static str,
        f: impl FnOnce(&mut ops::Encoder) -> Result<()>,
    ) -> Result<()> {
        if !self.in_pass {
            return Err(Error::op(op, "recorded outside begin_pass/end_pass"));
        }
        f(&mut ops::Encoder {
            device: &self.dev.device,
            rec: &mut self.rec,
            pipes: &mut self.pipes,
            mem: &mut self.mem,
            caps: self.dev.caps(),
            kernels: self.kernels,
            gemv_q8_min_bytes: self.gemv_q8_min_bytes,
            splits: &self.splits,
            state: &mut self.ops,
            frees: &mut self.pending_frees,
            status: self.status,
            timed: self.profile.is_some(),
            pass_allocs: &mut self.pass_allocs,
        })
    }
}

impl Drop for VulkanBackend {
    /// Waits for the GPU; the fields then drop in declaration order:
    /// recorder, pipelines, memory, device, and the hold on the (shared) instance last.
    fn drop(&mut self) {
        // A lost device answers DeviceLost and its objects may still be
        // destroyed; a drop has no one to report to.
        let _ = self.wait_idle();
    }
}
