//! Vulkan backend: raw Vulkan through `ash`, memory through gpu-allocator,
//! GLSL kernels from `glsl/` compiled to SPIR-V at build time.
//!
//! - `instance`: loader, instance, validation layer and messenger;
//! - `device`: physical device choice and the compute queue;
//! - `caps`: device capabilities, [`list_devices`];
//! - `memory`: buffers and staging; `layout`: weight repacking;
//! - `pipeline`: pipelines and layouts; `recorder`: command buffers,
//!   automatic barriers, descriptor sets, per-pass [`PassStats`];
//! - `ops/`: one encoder per op family.
//!
//! Per-token values (token ids, positions, and through them the attention
//! length and the KV-cache row `store_rows`/`rope_store` write) are read by
//! the shaders from buffers, so a recorded pass can be submitted again after
//! new values are written: decode passes are kept per key and replayed
//! (`begin_replayable_pass`/`replay`); [`VulkanBackend::replay_pass`]
//! resubmits the last unkeyed pass.

mod caps;
mod device;
mod instance;
mod layout;
mod memory;
pub use memory::STAGING_CAP;
mod ops;
mod pipeline;
mod recorder;
mod split;

pub use caps::{list_devices, Caps, DeviceInfo, Kernels, MatmulKernel, PrefillAttention};
pub use pipeline::{GLSLC_INT_DOT, GLSL_COOPMAT_KHR, GLSL_COOPMAT_NV};
pub use recorder::PassStats;

/// Weights from this size take the integer-dot GEMV by default: below it the
/// extra quantize dispatch costs more than the faster kernel saves
/// (SmolLM2-135M, whose 576-wide weights are ~0.2 MiB, decoded at 705 tok/s
/// without it and 442 with it on every weight, on an H200).
pub const GEMV_Q8_MIN_BYTES: usize = 4 << 20;

use crate::backend::{
    Activation, AttentionParams, Buffer, ComputeBackend, DeviceMemoryUse, LinearOpts, RopeParams,
    Weight,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::profile::{ProfileEvent, Track};
use ash::vk;
use device::Device;
use instance::Instance;
use memory::Memory;
use pipeline::Pipelines;
use recorder::{Recorder, Slot};
use std::collections::HashMap;
use std::time::Instant;

/// Profiling state: the timeline origin, the tick conversion and the
/// events not yet taken.
struct Profiler {
    epoch: Instant,
    /// Nanoseconds per timestamp tick (`timestampPeriod`).
    period_ns: f64,
    /// The queue's `timestampValidBits` as a mask.
    valid_mask: u64,
    /// When the pass being recorded began.
    pass_begun: Instant,
    events: Vec<ProfileEvent>,
}

impl Profiler {
    fn us_since_epoch(&self, t: Instant) -> f64 {
        t.duration_since(self.epoch).as_secs_f64() * 1e6
    }
}

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
    /// next one, and every submit after it, fails as `VK_ERROR_DEVICE_LOST`
    /// would. A fault injector: tests use it to check that a GPU that stops
    /// answering mid-generation leaves a clean error and a model that drops.
    pub lose_device_after: Option<u64>,
}

impl Options {
    pub fn from_env() -> Self {
        Options {
            device: std::env::var("VKLLM_DEVICE").ok().filter(|s| !s.is_empty()),
            validate: std::env::var("VKLLM_VALIDATE").as_deref() == Ok("1"),
            pipeline_cache: pipeline_cache_dir(),
            fail_alloc_after: env_count("VKLLM_FAIL_ALLOC_AFTER"),
            lose_device_after: env_count("VKLLM_LOSE_DEVICE_AFTER"),
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
    /// on the GPU: [bad token id + 1, bad position + 1], 0 when fine.
    status: Buffer,
    /// The pass being recorded allocated (and zeroes) buffers: not replayable.
    pass_allocs: bool,
    /// Rope inverse-frequency tables by (rot_dim, base bits), made on first use.
    rope_tables: HashMap<(u32, u32), Buffer>,
    /// Attention's per-split partials (decode), grown on demand.
    attn_scratch: Option<Buffer>,
    /// `linear`'s normed input and product for many rows, grown on demand.
    norm_scratch: Option<Buffer>,
    product_scratch: Option<Buffer>,
    /// `linear_glu`'s gate_up product for many rows.
    glu_scratch: Option<Buffer>,
    /// The cooperative-matrix GEMM's input as f16 (half_rows.comp).
    half_scratch: Option<Buffer>,
    /// What norm_scratch / half_scratch hold for the tiled GEMM.
    prepared_x: Option<ops::PreparedX>,
    /// x as int8 digits for the integer-dot GEMV (quantize_q8.comp).
    xq_scratch: Option<Buffer>,
    /// What xq_scratch holds, so matmuls of one input (Q, K and V) share it.
    xq_of: Option<ops::QuantizedX>,
    /// Smallest weight the integer-dot GEMV takes.
    gemv_q8_min_bytes: usize,
    /// Weights stored in several buffers (see split.rs), by their first part's id.
    split_weights: HashMap<u32, Vec<split::Part>>,
    /// Split weights above this many bytes even within the device's range.
    part_limit: Option<u64>,
    /// argmax's per-workgroup (value, index) partials, grown on demand.
    argmax_scratch: Option<Buffer>,
    /// Some while profiling is on.
    profile: Option<Profiler>,
    /// Kernel variants chosen for this device (and the environment).
    kernels: caps::Kernels,
}

impl VulkanBackend {
    pub fn new(opts: &Options) -> Result<VulkanBackend> {
        let inst = Instance::shared(opts.validate)?;
        let dev = Device::open(&inst, opts.device.as_deref())?;
        let kernels = dev.kernels;
        // On an error below, the parts made so far drop in reverse order,
        // each destroying its Vulkan objects before the device goes.
        let mut mem = Memory::new(
            &inst.instance,
            &dev.device,
            dev.physical,
            opts.fail_alloc_after,
        )?;
        let disk = opts.pipeline_cache.clone().map(|dir| {
            // SAFETY: valid physical device.
            let props = unsafe { inst.instance.get_physical_device_properties(dev.physical) };
            pipeline::DiskCache::for_device(dir, &props)
        });
        let pipes = Pipelines::new(&dev.device, disk)?;
        let mut rec = Recorder::new(&dev.device, dev.queue, dev.queue_family)?;
        rec.lose_device_after(opts.lose_device_after);
        let status = Buffer::new(mem.alloc_host_readable(8)?, 8);
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
            rope_tables: HashMap::new(),
            attn_scratch: None,
            norm_scratch: None,
            product_scratch: None,
            glu_scratch: None,
            half_scratch: None,
            prepared_x: None,
            xq_scratch: None,
            xq_of: None,
            gemv_q8_min_bytes: GEMV_Q8_MIN_BYTES,
            split_weights: HashMap::new(),
            part_limit: split::part_limit_from_env(),
            argmax_scratch: None,
            status,
            pass_allocs: false,
            profile: None,
            kernels,
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

    /// The GEMM kernel for matmuls of more than a few rows: the f32 tiles,
    /// or the cooperative-matrix kernel the backend opened with (its device
    /// feature is enabled only then). Tests use it to check both on one
    /// device; `VKLLM_MATMUL` chooses at open.
    pub fn set_matmul(&mut self, kernel: MatmulKernel) -> Result<()> {
        if kernel != MatmulKernel::Tiles && kernel != self.dev.kernels.matmul {
            return Err(Error::Unsupported(format!(
                "{} was opened with {:?} matmuls, not {kernel:?}",
                self.dev.info.name, self.dev.kernels.matmul
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

    fn caps(&self) -> &Caps {
        self.dev.caps()
    }

    /// A mask of the compute queue's valid timestamp bits, or why there are none.
    fn timestamp_mask(&self) -> Result<u64> {
        // SAFETY: the physical device belongs to this instance.
        let families = unsafe {
            self.inst
                .instance
                .get_physical_device_queue_family_properties(self.dev.physical)
        };
        let bits = families
            .get(self.dev.queue_family as usize)
            .map_or(0, |f| f.timestamp_valid_bits);
        match bits {
            0 => Err(Error::Unsupported(format!(
                "profiling needs timestamp queries, which the compute queue of {} does not support (timestampValidBits = 0)",
                self.dev.info.name
            ))),
            64.. => Ok(u64::MAX),
            b => Ok((1u64 << b) - 1),
        }
    }

    /// Submit the pass, recording its host spans and GPU timestamps.
    fn finish_profiled_pass(&mut self) -> Result<()> {
        let submitted = Instant::now();
        self.finish_recording()?;
        let done = Instant::now();
        let timed = self.rec.read_timestamps()?;
        let Some(p) = &mut self.profile else {
            return Ok(());
        };
        let (begun_us, submit_us) = (p.us_since_epoch(p.pass_begun), p.us_since_epoch(submitted));
        let host = |name, start_us: f64, end_us: f64| ProfileEvent {
            name,
            track: Track::Host,
            start_us,
            dur_us: end_us - start_us,
            bytes: 0,
        };
        p.events.push(host("record", begun_us, submit_us));
        p.events
            .push(host("submit+wait", submit_us, p.us_since_epoch(done)));
        // GPU ticks have their own origin: the pass's first command starts
        // at its submit time on the host timeline.
        let mask = p.valid_mask;
        let t0 = timed.iter().map(|t| t.1 & mask).min().unwrap_or(0);
        let us = |ticks: u64| ticks as f64 * p.period_ns / 1e3;
        let gpu: Vec<ProfileEvent> = timed
            .iter()
            .map(|&(t, start, end)| {
                let (start, end) = (start & mask, end & mask);
                ProfileEvent {
                    name: t.name,
                    track: Track::Gpu,
                    start_us: submit_us + us(start.saturating_sub(t0)),
                    dur_us: us(end.saturating_sub(start)),
                    bytes: t.bytes,
                }
            })
            .collect();
        p.events.extend(gpu);
        Ok(())
    }

    /// Zero buffers allocated since the last submit, in a submit of their
    /// own, so a pass (and its stats) holds only the work recorded into it.
    fn flush_fills(&mut self) -> Result<()> {
        if !self.pending_fills.is_empty() {
            self.begin_recording(Slot::Transfer)?;
            self.finish_recording()?;
        }
        Ok(())
    }

    fn begin_pass_in(&mut self, slot: Slot) -> Result<()> {
        if self.in_pass {
            return Err(Error::Vulkan(
                "begin_pass called twice without end_pass".into(),
            ));
        }
        self.flush_fills()?;
        if let Some(p) = &mut self.profile {
            p.pass_begun = Instant::now();
        }
        self.begin_recording(slot)?;
        self.in_pass = true;
        Ok(())
    }

    /// The host-mapped buffer behind `buf`, if it is one (see `alloc_mapped`).
    fn host_bytes(&mut self, buf: &Buffer) -> Result<Option<&mut [u8]>> {
        self.mem.resolve(buf)?;
        let db = self.mem.get_mut(buf.id)?;
        if !db.host {
            return Ok(None);
        }
        Ok(Some(db.mapped()?))
    }

    /// Begin a command buffer, zeroing buffers allocated since the last one.
    fn begin_recording(&mut self, slot: Slot) -> Result<()> {
        self.rec.begin(slot)?;
        // The previous submission has completed, so the host may reset it.
        self.mem.get_mut(self.status.id)?.mapped()?[..8].fill(0);
        for id in std::mem::take(&mut self.pending_fills) {
            if let Ok(b) = self.mem.get(id) {
                let buffer = b.buffer;
                self.rec.access(&[], &[id]);
                // SAFETY: recording command buffer, live buffer.
                unsafe {
                    self.dev
                        .device
                        .cmd_fill_buffer(self.rec.cmd, buffer, 0, vk::WHOLE_SIZE, 0)
                };
            }
        }
        Ok(())
    }

    /// Submit, wait, release deferred frees and surface validation messages.
    fn finish_recording(&mut self) -> Result<()> {
        let result = self.rec.submit();
        if result.is_err() {
            self.forget_tables();
        }
        for id in std::mem::take(&mut self.pending_frees) {
            self.mem.free(id);
        }
        result?;
        self.check_after_submit()
    }

    /// Validation messages and the status words of the submit just finished.
    fn check_after_submit(&mut self) -> Result<()> {
        self.inst.check_messages()?;
        let status = self.mem.get_mut(self.status.id)?.mapped()?;
        let word =
            |i: usize| u32::from_le_bytes([status[i], status[i + 1], status[i + 2], status[i + 3]]);
        let (bad_id, bad_pos) = (word(0), word(4));
        if bad_id != 0 {
            return Err(Error::op(
                "embedding",
                format!(
                    "token id {} is past the end of the embedding table",
                    bad_id - 1
                ),
            ));
        }
        if bad_pos != 0 {
            return Err(Error::op(
                "attention",
                format!("position {} is past the KV cache capacity", bad_pos - 1),
            ));
        }
        Ok(())
    }

    /// Submit the last pass again, unchanged, and wait: a decode step after
    /// the per-token values (token ids, positions) were uploaded into the
    /// buffers the pass reads. Fails inside a pass, before any pass, after a
    /// buffer was freed, or when the pass allocated buffers (they would be
    /// zeroed again).
    pub fn replay_pass(&mut self) -> Result<()> {
        if self.in_pass {
            return Err(Error::Vulkan("replay_pass called inside a pass".into()));
        }
        self.mem.get_mut(self.status.id)?.mapped()?[..8].fill(0);
        self.rec.resubmit_pass()?;
        self.check_after_submit()
    }

    /// Drop cached tables whose contents were written by a command buffer
    /// that may never have run; they are rebuilt on next use.
    fn forget_tables(&mut self) {
        let tables: Vec<Buffer> = self.rope_tables.drain().map(|(_, b)| b).collect();
        for t in tables {
            self.free(t);
        }
    }

    /// Record an op into the current pass; ops outside a pass are errors,
    /// as on every backend.
    fn record(&mut self, op: &'static str, f: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        if !self.in_pass {
            return Err(Error::op(op, "recorded outside begin_pass/end_pass"));
        }
        f(self)
    }

    fn check_range(op: &'static str, buf: &Buffer, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= buf.bytes => Ok(()),
            _ => Err(Error::op(
                op,
                format!(
                    "{len} bytes at offset {offset} do not fit a buffer of {} bytes",
                    buf.bytes
                ),
            )),
        }
    }

    fn transfer(
        &mut self,
        buf: &Buffer,
        offset: usize,
        len: usize,
        op: &'static str,
    ) -> Result<()> {
        if self.in_pass {
            return Err(Error::op(
                op,
                "not allowed inside a pass (after begin_pass, before end_pass)",
            ));
        }
        Self::check_range(op, buf, offset, len)?;
        self.mem.resolve(buf)?;
        Ok(())
    }

    /// An upload inside a pass: recorded with vkCmdUpdateBuffer, ordered by
    /// the same hazard tracking as the ops around it.
    fn record_upload(&mut self, buf: &Buffer, offset: usize, data: &[u8]) -> Result<()> {
        const OP: &str = "upload";
        if data.len() > crate::backend::PASS_UPLOAD_MAX
            || !offset.is_multiple_of(4)
            || !data.len().is_multiple_of(4)
        {
            return Err(Error::op(
                OP,
                "inside a pass an upload must be at most 64 KiB, 4-byte aligned",
            ));
        }
        Self::check_range(OP, buf, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let handle = self.mem.resolve(buf)?.buffer;
        self.rec.access(&[], &[buf.id]);
        // SAFETY: recording command buffer, live buffer, range checked above.
        unsafe {
            self.dev
                .device
                .cmd_update_buffer(self.rec.cmd, handle, offset as u64, data)
        };
        Ok(())
    }

    /// One staging copy in a submit of its own. `device_buf` is the id of
    /// the device buffer, read (`download`) or written, so the copy is
    /// ordered after the zero fill that may precede it in the same buffer.
    #[allow(clippy::too_many_arguments)]
    fn copy_chunk(
        &mut self,
        device_buf: u32,
        download: bool,
        src: vk::Buffer,
        src_off: u64,
        dst: vk::Buffer,
        dst_off: u64,
        n: u64,
    ) -> Result<()> {
        self.begin_recording(Slot::Transfer)?;
        if download {
            self.rec.access(&[device_buf], &[]);
        } else {
            self.rec.access(&[], &[device_buf]);
        }
        let region = [vk::BufferCopy::default()
            .src_offset(src_off)
            .dst_offset(dst_off)
            .size(n)];
        // SAFETY: recording command buffer; both ranges were bounds-checked.
        unsafe {
            self.dev
                .device
                .cmd_copy_buffer(self.rec.cmd, src, dst, &region)
        };
        self.finish_recording()
    }
}

impl Drop for VulkanBackend {
    /// Waits for the GPU; the fields then drop in declaration order:
    /// recorder, pipelines, memory, device, and the hold on the (shared) instance last.
    fn drop(&mut self) {
        // SAFETY: valid device; waiting has no preconditions.
        let _ = unsafe { self.dev.device.device_wait_idle() };
    }
}

impl ComputeBackend for VulkanBackend {
    /// f16: decode attention streams the whole cache every token, so half
    /// the bytes is up to twice the speed at depth; values lose ~3 decimal
    /// digits (stated and tested in tests/ops.rs).
    fn default_kv_dtype(&self) -> DType {
        DType::F16
    }

    /// 2048 rows where a binding may cover 2 GiB or more (a pass's widest
    /// buffers, the FFN activations and a prompt's logits, grow with it),
    /// else 512. On an H100, pp2048 of Llama-3.2-1B ran at 31,532 tok/s in
    /// passes of 512 rows, 41,783 in 1024 and 44,153 in one of 2048;
    /// Llama-3.1-8B at 6,636, 7,077 and 7,370.
    fn default_max_batch(&self) -> usize {
        if self.caps().max_storage_buffer_range >= 2 << 30 {
            2048
        } else {
            512
        }
    }

    fn name(&self) -> String {
        format!("vulkan ({})", self.dev.info.name)
    }

    fn last_pass_stats(&self) -> Option<PassStats> {
        Some(self.last_pass)
    }

    fn device_wait_ns(&self) -> Option<u64> {
        Some(self.rec.wait_ns)
    }

    fn set_profiling(&mut self, on: bool) -> Result<()> {
        if self.in_pass {
            return Err(Error::Vulkan("set_profiling called inside a pass".into()));
        }
        // Kept passes were recorded with or without timestamps.
        self.rec.invalidate_pass();
        if !on {
            self.profile = None;
            self.rec.set_timestamps(false);
            return Ok(());
        }
        if self.profile.is_none() {
            let valid_mask = self.timestamp_mask()?;
            // SAFETY: the physical device belongs to this instance.
            let limits = unsafe {
                self.inst
                    .instance
                    .get_physical_device_properties(self.dev.physical)
            }
            .limits;
            let now = Instant::now();
            self.profile = Some(Profiler {
                epoch: now,
                period_ns: f64::from(limits.timestamp_period),
                valid_mask,
                pass_begun: now,
                events: Vec::new(),
            });
            self.rec.set_timestamps(true);
        }
        Ok(())
    }

    fn take_profile(&mut self) -> Vec<ProfileEvent> {
        self.profile
            .as_mut()
            .map_or_else(Vec::new, |p| std::mem::take(&mut p.events))
    }

    fn device_memory(&self) -> Option<DeviceMemoryUse> {
        Some(self.mem.usage())
    }

    fn check_fits(&self, what: &str, bytes: u64) -> Result<()> {
        // SAFETY: valid instance and physical device.
        let props = unsafe {
            self.inst
                .instance
                .get_physical_device_memory_properties(self.dev.physical)
        };
        // Buffers live in the largest device-local heap; what this backend
        // already holds there is not available.
        let heaps =
            &props.memory_heaps[..(props.memory_heap_count as usize).min(props.memory_heaps.len())];
        let Some(heap) = heaps
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()
        else {
            return Ok(());
        };
        let available = heap.saturating_sub(self.mem.reserved_bytes());
        if bytes > available {
            return Err(Error::OutOfDeviceMemory {
                what: format!("allocating {what}"),
                needed: Some(bytes),
                available: Some(available),
            });
        }
        Ok(())
    }

    fn alloc(&mut self, bytes: usize) -> Result<Buffer> {
        let (id, handle, size) = self.mem.alloc(bytes)?;
        if self.rec.is_recording() {
            self.pass_allocs = true;
            self.rec.access(&[], &[id]);
            // SAFETY: recording command buffer, live buffer.
            unsafe {
                self.dev
                    .device
                    .cmd_fill_buffer(self.rec.cmd, handle, 0, size, 0)
            };
        } else {
            self.pending_fills.push(id);
        }
        Ok(Buffer::new(id, bytes))
    }

    fn alloc_mapped(&mut self, bytes: usize) -> Result<Buffer> {
        if self.rec.is_recording() {
            return Err(Error::Vulkan("alloc_mapped called inside a pass".into()));
        }
        let (id, _, _) = self.mem.alloc_mapped(bytes)?;
        if let Some(host) = self.host_bytes(&Buffer::new(id, bytes))? {
            host.fill(0);
        } else {
            self.pending_fills.push(id);
        }
        Ok(Buffer::new(id, bytes))
    }

    fn upload(&mut self, buf: &Buffer, offset: usize, data: &[u8]) -> Result<()> {
        if self.in_pass {
            return self.record_upload(buf, offset, data);
        }
        self.transfer(buf, offset, data.len(), "upload")?;
        if let Some(host) = self.host_bytes(buf)? {
            host[offset..offset + data.len()].copy_from_slice(data);
            return Ok(());
        }
        for (i, chunk) in data.chunks(STAGING_CAP as usize).enumerate() {
            let staging = self.mem.staging(chunk.len() as u64, false)?;
            staging.mapped()?[..chunk.len()].copy_from_slice(chunk);
            let src = staging.buffer;
            let dst = self.mem.resolve(buf)?.buffer;
            let at = (offset + i * STAGING_CAP as usize) as u64;
            self.copy_chunk(buf.id, false, src, 0, dst, at, chunk.len() as u64)?;
        }
        Ok(())
    }

    fn download(&mut self, buf: &Buffer, offset: usize, out: &mut [u8]) -> Result<()> {
        self.transfer(buf, offset, out.len(), "download")?;
        if let Some(host) = self.host_bytes(buf)? {
            out.copy_from_slice(&host[offset..offset + out.len()]);
            return Ok(());
        }
        for (i, chunk) in out.chunks_mut(STAGING_CAP as usize).enumerate() {
            let src = self.mem.resolve(buf)?.buffer;
            let dst = self.mem.staging(chunk.len() as u64, true)?.buffer;
            let at = (offset + i * STAGING_CAP as usize) as u64;
            self.copy_chunk(buf.id, true, src, at, dst, 0, chunk.len() as u64)?;
            let staging = self.mem.staging(chunk.len() as u64, true)?;
            chunk.copy_from_slice(&staging.mapped()?[..chunk.len()]);
        }
        Ok(())
    }

    fn free(&mut self, buf: Buffer) {
        for part in self.take_other_parts(&buf) {
            self.free(part);
        }
        self.pending_fills.retain(|&id| id != buf.id);
        self.rec.invalidate_pass();
        if self.rec.is_recording() {
            self.pending_frees.push(buf.id);
        } else {
            self.mem.free(buf.id);
        }
    }

    fn upload_weight(
        &mut self,
        dtype: DType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<Weight> {
        let limit = self.weight_part_bytes();
        if layout::packed_bytes(dtype, rows, cols)? as u64 > limit {
            return self.upload_split_weight(dtype, rows, cols, data, limit);
        }
        let packed = layout::repack(dtype, rows, cols, data)?;
        let buf = self.alloc(packed.len())?;
        if let Err(e) = self.upload(&buf, 0, &packed) {
            self.free(buf);
            return Err(e);
        }
        Ok(Weight {
            buf,
            dtype,
            rows,
            cols,
        })
    }

    fn begin_pass(&mut self) -> Result<()> {
        self.begin_pass_in(Slot::Pass)
    }

    fn begin_replayable_pass(&mut self, key: u32) -> Result<()> {
        // Timestamps of a replayed pass would belong to no recording.
        let slot = if self.profile.is_some() {
            Slot::Pass
        } else {
            Slot::Kept(key)
        };
        self.begin_pass_in(slot)
    }

    fn replay(&mut self, key: u32, times: usize) -> Result<bool> {
        if self.in_pass {
            return Err(Error::Vulkan("replay called inside a pass".into()));
        }
        if self.profile.is_some() || times == 0 {
            return Ok(times == 0);
        }
        self.flush_fills()?;
        self.mem.get_mut(self.status.id)?.mapped()?[..8].fill(0);
        let times = u32::try_from(times)
            .map_err(|_| Error::Vulkan(format!("{times} replays in one submit")))?;
        if !self.rec.replay(key, times)? {
            return Ok(false);
        }
        self.check_after_submit()?;
        Ok(true)
    }

    fn end_pass(&mut self) -> Result<()> {
        if !self.in_pass {
            return Err(Error::Vulkan("end_pass called without begin_pass".into()));
        }
        self.in_pass = false;
        let result = if self.profile.is_some() {
            self.finish_profiled_pass()
        } else {
            self.finish_recording()
        };
        if std::mem::take(&mut self.pass_allocs) {
            self.rec.invalidate_pass();
        }
        self.last_pass = self.rec.stats;
        result
    }

    fn embedding(&mut self, table: &Weight, ids: &Buffer, out: &Buffer, rows: usize) -> Result<()> {
        self.record("embedding", |b| b.encode_embedding(table, ids, out, rows))
    }

    fn matmul(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        y: &Buffer,
        m: usize,
    ) -> Result<()> {
        self.record("matmul", |b| b.encode_matmul(w, bias, x, y, m))
    }

    fn linear(
        &mut self,
        w: &Weight,
        x: &Buffer,
        y: &Buffer,
        m: usize,
        o: &LinearOpts,
    ) -> Result<()> {
        self.record("matmul", |b| b.encode_linear(w, x, y, m, o))
    }

    fn linear_glu(
        &mut self,
        act: Activation,
        gate_up: &Weight,
        x: &Buffer,
        out: &Buffer,
        m: usize,
        norm: Option<(&Buffer, f32)>,
    ) -> Result<()> {
        self.record("matmul", |b| {
            b.encode_linear_glu(act, gate_up, x, out, m, norm)
        })
    }

    fn rms_norm(
        &mut self,
        x: &Buffer,
        w: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.record("rms_norm", |b| b.encode_rms_norm(x, w, out, rows, dim, eps))
    }

    fn layer_norm(
        &mut self,
        x: &Buffer,
        w: &Buffer,
        bias: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.record("layer_norm", |b| {
            b.encode_layer_norm(x, w, bias, out, rows, dim, eps)
        })
    }

    fn rope(&mut self, x: &Buffer, positions: &Buffer, p: &RopeParams) -> Result<()> {
        self.record("rope", |b| b.encode_rope(x, positions, p))
    }

    fn attention(
        &mut self,
        q: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        positions: &Buffer,
        out: &Buffer,
        p: &AttentionParams,
    ) -> Result<()> {
        self.record("attention", |b| {
            b.encode_attention(q, k_cache, v_cache, positions, out, p)
        })
    }

    fn glu(
        &mut self,
        act: Activation,
        gate: &Buffer,
        up: Option<&Buffer>,
        out: &Buffer,
        n: usize,
    ) -> Result<()> {
        self.record("glu", |b| b.encode_glu(act, gate, up, out, n))
    }

    fn add(&mut self, a: &Buffer, bv: &Buffer, out: &Buffer, n: usize) -> Result<()> {
        self.record("add", |b| b.encode_add(a, bv, out, n))
    }

    fn scale(&mut self, x: &Buffer, s: f32, out: &Buffer, n: usize) -> Result<()> {
        self.record("scale", |b| b.encode_scale(x, s, out, n))
    }

    fn copy(
        &mut self,
        src: &Buffer,
        src_offset: usize,
        dst: &Buffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        self.record("copy", |b| {
            b.encode_copy(src, src_offset, dst, dst_offset, bytes)
        })
    }

    fn argmax(&mut self, x: &Buffer, out: &Buffer, rows: usize, n: usize) -> Result<()> {
        self.record("argmax", |b| b.encode_argmax(x, out, rows, n))
    }

    fn store_rows(
        &mut self,
        src: &Buffer,
        dst: &Buffer,
        positions: &Buffer,
        rows: usize,
        row_len: usize,
        dst_dtype: DType,
    ) -> Result<()> {
        self.record("store_rows", |b| {
            b.encode_store_rows(src, dst, positions, rows, row_len, dst_dtype)
        })
    }

    fn rope_store(
        &mut self,
        q: &Buffer,
        k: &Buffer,
        v: &Buffer,
        positions: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        p: &RopeParams,
        n_kv_heads: usize,
        kv_dtype: DType,
    ) -> Result<()> {
        self.record("rope_store", |b| {
            b.encode_rope_store(
                q, k, v, positions, k_cache, v_cache, p, n_kv_heads, kv_dtype,
            )
        })
    }

    fn append_token(&mut self, ids: &Buffer, positions: &Buffer, history: &Buffer) -> Result<()> {
        self.record("append_token", |b| {
            b.encode_append_token(ids, positions, history)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Mutex, MutexGuard};

    /// One validated backend at a time: the validation layer's global state
    /// is not safe against instances created concurrently (see
    /// `tests/common::hold_vulkan_lock`).
    fn validated() -> Option<(MutexGuard<'static, ()>, VulkanBackend)> {
        static LOCK: Mutex<()> = Mutex::new(());
        let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let opts = Options {
            validate: true,
            ..Options::from_env()
        };
        match VulkanBackend::new(&opts) {
            Ok(b) => Some((guard, b)),
            Err(e) if std::env::var("VKLLM_REQUIRE_VULKAN").as_deref() != Ok("1") => {
                eprintln!("skipping Vulkan: {e}");
                None
            }
            Err(e) => panic!("VKLLM_REQUIRE_VULKAN=1 but the Vulkan backend failed: {e}"),
        }
    }

    /// A host app matches what it can act on: device loss and the two kinds
    /// of memory exhaustion are variants of their own, not strings.
    #[test]
    fn vk_results_map_to_matchable_variants() {
        let e = vk_err("submitting a pass");
        assert!(
            matches!(e(vk::Result::ERROR_DEVICE_LOST), Error::DeviceLost(w) if w == "submitting a pass")
        );
        assert!(matches!(
            e(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY),
            Error::OutOfDeviceMemory { .. }
        ));
        assert!(matches!(
            e(vk::Result::ERROR_OUT_OF_HOST_MEMORY),
            Error::OutOfHostMemory { .. }
        ));
        assert!(matches!(
            e(vk::Result::ERROR_FEATURE_NOT_PRESENT),
            Error::Unsupported(_)
        ));
        assert!(matches!(e(vk::Result::TIMEOUT), Error::Vulkan(_)));
        assert_eq!(
            e(vk::Result::ERROR_DEVICE_LOST).to_string(),
            "the device was lost while submitting a pass; the backend must be reopened"
        );
        assert_eq!(
            e(vk::Result::ERROR_OUT_OF_DEVICE_MEMORY).to_string(),
            "out of device memory while submitting a pass"
        );
    }

    /// Destroying a backend that did work (and still holds buffers, weights,
    /// pipelines, descriptor pools) leaves nothing for the validation layer
    /// to report, e.g. objects outliving the device.
    #[test]
    fn teardown_is_validation_clean() {
        let Some((_one_at_a_time, mut b)) = validated() else {
            return;
        };
        let messages = b.inst.messages().expect("validation is on");
        let w = b.upload_weight(DType::F32, 4, 4, &[0u8; 64]).unwrap();
        let x = b.alloc(16).unwrap();
        let y = b.alloc(16).unwrap();
        b.begin_pass().unwrap();
        b.matmul(&w, None, &x, &y, 1).unwrap();
        b.end_pass().unwrap();
        let mut out = [0u8; 16];
        b.download(&y, 0, &mut out).unwrap();
        drop(b);
        let left = messages.lock().unwrap();
        assert!(left.is_empty(), "teardown reported: {left:?}");
    }

    /// Misuse reported by the validation layer surfaces as `Error::Vulkan`.
    #[test]
    fn validation_messages_become_errors() {
        let Some((_one_at_a_time, b)) = validated() else {
            return;
        };
        // A buffer without usage flags is invalid (VUID-VkBufferCreateInfo-usage-requiredbitmask).
        let info = vk::BufferCreateInfo::default().size(16);
        // SAFETY: deliberately invalid create info on a live device; the
        // buffer, if the driver makes one, is destroyed at once.
        unsafe {
            if let Ok(buf) = b.dev.device.create_buffer(&info, None) {
                b.dev.device.destroy_buffer(buf, None);
            }
        }
        match b.inst.check_messages() {
            Err(Error::Vulkan(msg)) => assert!(msg.contains("usage"), "{msg}"),
            other => panic!("expected a validation error, got {other:?}"),
        }
        assert!(b.inst.check_messages().is_ok(), "messages are drained");
    }
}
