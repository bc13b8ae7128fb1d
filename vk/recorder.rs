//! One command buffer, one fence, one submit per pass; transfers record into
//! a command buffer of their own so a recorded pass survives them and can be
//! submitted again (replayed). Passes recorded under a key ([`Slot::Kept`],
//! decode steps) keep their own command buffer and descriptor pools, so
//! several can be replayed in any order. Barriers come from
//! what each command reads and writes: a command that reads a buffer written
//! since the last barrier (RAW), or writes one read or written since then
//! (WAR, WAW), gets one global memory barrier before it; independent commands
//! (e.g. the Q, K, V projections of one input) get none.

use super::vk_err;
pub use crate::backend::PassStats;
use crate::error::{Error, Result};
use ash::vk;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Descriptor sets per pool; more pools are made when a pass needs them.
const SETS_PER_POOL: u32 = 1024;
/// Storage-buffer descriptors per pool (6 bindings per set at most).
const DESCRIPTORS_PER_POOL: u32 = SETS_PER_POOL * 6;

/// Timestamp queries per pool; a pass with more timed commands opens another
/// pool. Even, so the two queries of a command share a pool.
const QUERIES_PER_POOL: u32 = 1024;

/// A command timed in the pass: what it was and the bytes it binds.
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    pub name: &'static str,
    pub bytes: u64,
}

/// Timestamp queries of the pass being recorded (profiling on).
#[derive(Default)]
struct Timestamps {
    pools: Vec<vk::QueryPool>,
    /// Queries written in this pass, two per timed command.
    used: u32,
    timed: Vec<Timed>,
}

/// Which command buffer a recording goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// A pass: may be submitted again until the next pass is recorded.
    Pass,
    /// A pass kept under a key until a buffer is freed: replayed per token.
    Kept(u32),
    /// Staging copies and zero fills: submitted once.
    Transfer,
}

struct Cmd {
    pool: vk::CommandPool,
    buf: vk::CommandBuffer,
}

impl Cmd {
    fn new(device: &ash::Device, family: u32) -> Result<Cmd> {
        let info = vk::CommandPoolCreateInfo::default().queue_family_index(family);
        // SAFETY: valid device and create infos.
        let pool = unsafe { device.create_command_pool(&info, None) }
            .map_err(vk_err("creating a command pool"))?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: as above.
        match unsafe { device.allocate_command_buffers(&alloc) } {
            Ok(bufs) => Ok(Cmd { pool, buf: bufs[0] }),
            Err(e) => {
                // SAFETY: the pool is unused.
                unsafe { device.destroy_command_pool(pool, None) };
                Err(vk_err("allocating a command buffer")(e))
            }
        }
    }
}

/// A pass's command buffer with the descriptor pools its sets come from.
struct Recording {
    cmd: Cmd,
    pools: Vec<vk::DescriptorPool>,
    /// Pools in use by the recording (the rest are spare).
    pools_used: usize,
    /// Holds a complete, submitted pass that may be submitted again.
    ready: bool,
}

impl Recording {
    fn new(device: &ash::Device, family: u32) -> Result<Recording> {
        Ok(Recording {
            cmd: Cmd::new(device, family)?,
            pools: Vec::new(),
            pools_used: 0,
            ready: false,
        })
    }

    fn destroy(&mut self, device: &ash::Device) {
        // SAFETY: the device is idle (the owner waits) and these objects belong to it.
        unsafe {
            for p in self.pools.drain(..) {
                device.destroy_descriptor_pool(p, None);
            }
            device.destroy_command_pool(self.cmd.pool, None);
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Pending {
    read: bool,
    written: bool,
}

pub struct Recorder {
    device: ash::Device,
    queue: vk::Queue,
    family: u32,
    pass: Recording,
    kept: HashMap<u32, Recording>,
    transfer: Cmd,
    /// The command buffer being recorded.
    pub cmd: vk::CommandBuffer,
    slot: Slot,
    fence: vk::Fence,
    /// Accesses since the last barrier, by buffer id.
    pending: HashMap<u32, Pending>,
    /// Writes declared so far (never reset), and by buffer id the number of
    /// the last one in this recording: lets an encoder tell whether a buffer
    /// changed since it derived something from it.
    writes: u64,
    last_write: HashMap<u32, u64>,
    recording: bool,
    pub stats: PassStats,
    /// Nanoseconds spent waiting for submitted work since creation.
    pub wait_ns: u64,
    /// How long a wait polls the fence before it sleeps (`Options::spin_wait`).
    spin: Duration,
    /// Some while profiling: pass commands are bracketed by timestamps.
    timestamps: Option<Timestamps>,
    /// Query pools of an earlier profiling session, destroyed on drop.
    retired_pools: Vec<vk::QueryPool>,
    /// Passes to run before an injected device loss
    /// (`Options::lose_device_after`).
    passes_left: Option<u64>,
    /// Set when the device is lost, injected or reported by the driver,
    /// to how: every later submit and wait fails with it.
    lost: Option<&'static str>,
}

impl Recorder {
    pub fn new(device: &ash::Device, queue: vk::Queue, family: u32) -> Result<Recorder> {
        let mut pass = Recording::new(device, family)?;
        let transfer = match Cmd::new(device, family) {
            Ok(t) => t,
            Err(e) => {
                pass.destroy(device);
                return Err(e);
            }
        };
        let mut rec = Recorder {
            device: device.clone(),
            queue,
            family,
            cmd: pass.cmd.buf,
            pass,
            kept: HashMap::new(),
            transfer,
            slot: Slot::Pass,
            fence: vk::Fence::null(),
            pending: HashMap::new(),
            writes: 0,
            last_write: HashMap::new(),
            recording: false,
            stats: PassStats::default(),
            wait_ns: 0,
            spin: Duration::ZERO,
            timestamps: None,
            retired_pools: Vec::new(),
            passes_left: None,
            lost: None,
        };
        // SAFETY: valid device; on failure Drop destroys what exists.
        rec.fence = unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) }
            .map_err(vk_err("creating the fence"))?;
        Ok(rec)
    }

    /// Poll a submitted pass's fence for up to `spin` before sleeping.
    pub fn spin_wait(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// Inject a device loss after `passes` passes (`None`: never).
    pub fn lose_device_after(&mut self, passes: Option<u64>) {
        self.passes_left = passes;
    }

    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// Start recording into `slot`'s command buffer. Every earlier submit
    /// has completed (submit waits), so its pools can be reset; recording a
    /// pass discards the one recorded before into the same slot.
    pub fn begin(&mut self, slot: Slot) -> Result<()> {
        if self.recording {
            return Err(Error::Vulkan(
                "a command buffer is already being recorded".into(),
            ));
        }
        if let Slot::Kept(key) = slot {
            if !self.kept.contains_key(&key) {
                let r = Recording::new(&self.device, self.family)?;
                self.kept.insert(key, r);
            }
        }
        let device = self.device.clone();
        let (cmd, flags) = match slot {
            Slot::Transfer => (&self.transfer, vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            _ => {
                let r = self.recording_mut(slot)?;
                // SAFETY: nothing allocated from these pools is pending on the GPU.
                unsafe {
                    for &p in &r.pools[..r.pools_used] {
                        device
                            .reset_descriptor_pool(p, vk::DescriptorPoolResetFlags::empty())
                            .map_err(vk_err("resetting a descriptor pool"))?;
                    }
                }
                r.pools_used = 0;
                r.ready = false;
                // A kept pass is submitted several times in one batch (decode
                // steps back to back), which needs simultaneous use.
                let flags = if slot == Slot::Pass {
                    vk::CommandBufferUsageFlags::empty()
                } else {
                    vk::CommandBufferUsageFlags::SIMULTANEOUS_USE
                };
                (&r.cmd, flags)
            }
        };
        // SAFETY: nothing recorded from this pool is pending on the GPU.
        unsafe {
            device
                .reset_command_pool(cmd.pool, vk::CommandPoolResetFlags::empty())
                .map_err(vk_err("resetting a command pool"))?;
            device
                .begin_command_buffer(cmd.buf, &vk::CommandBufferBeginInfo::default().flags(flags))
                .map_err(vk_err("beginning the command buffer"))?;
        }
        self.cmd = cmd.buf;
        self.slot = slot;
        self.pending.clear();
        self.last_write.clear();
        self.stats = PassStats::default();
        if let Some(ts) = &mut self.timestamps {
            if slot != Slot::Transfer {
                ts.used = 0;
                ts.timed.clear();
            }
        }
        self.recording = true;
        Ok(())
    }

    /// The pass recording of `slot` (not the transfer buffer).
    fn recording_mut(&mut self, slot: Slot) -> Result<&mut Recording> {
        match slot {
            Slot::Pass => Ok(&mut self.pass),
            Slot::Kept(key) => self
                .kept
                .get_mut(&key)
                .ok_or_else(|| Error::Vulkan(format!("no pass is kept under key {key}"))),
            Slot::Transfer => Err(Error::Vulkan(
                "the transfer command buffer has no descriptor sets".into(),
            )),
        }
    }

    /// Time the commands of later passes (on) or stop (off). The query pools
    /// stay until drop: a recorded pass may still reference them.
    pub fn set_timestamps(&mut self, on: bool) {
        if on {
            self.timestamps.get_or_insert_with(Timestamps::default);
        } else if let Some(ts) = self.timestamps.take() {
            self.retired_pools.extend(ts.pools);
        }
    }

    fn timing(&mut self) -> Option<&mut Timestamps> {
        match self.slot {
            Slot::Transfer => None,
            _ if self.recording => self.timestamps.as_mut(),
            _ => None,
        }
    }

    /// Write the next timestamp of the pass at `stage`, opening (and
    /// resetting, in the command buffer) a query pool when one fills.
    fn write_timestamp(&mut self, stage: vk::PipelineStageFlags) -> Result<()> {
        let (device, cmd) = (self.device.clone(), self.cmd);
        let Some(ts) = self.timing() else {
            return Ok(());
        };
        let (pool_index, query) = (
            (ts.used / QUERIES_PER_POOL) as usize,
            ts.used % QUERIES_PER_POOL,
        );
        if ts.pools.len() <= pool_index {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(QUERIES_PER_POOL);
            // SAFETY: valid device and create info.
            let pool = unsafe { device.create_query_pool(&info, None) }
                .map_err(vk_err("creating a timestamp query pool"))?;
            ts.pools.push(pool);
        }
        let pool = ts.pools[pool_index];
        // SAFETY: recording command buffer, live pool; queries are reset
        // (in submission order) before this pass writes them.
        unsafe {
            if query == 0 {
                device.cmd_reset_query_pool(cmd, pool, 0, QUERIES_PER_POOL);
            }
            device.cmd_write_timestamp(cmd, stage, pool, query);
        }
        ts.used += 1;
        Ok(())
    }

    /// Before a dispatch or copy of the pass (after its barrier). At the
    /// bottom of the pipe: the start is when the work before it has ended. A
    /// top-of-pipe timestamp is not held by the barrier, so it fired while
    /// the previous dispatch still ran and dependent dispatches read up to
    /// twice their length (an 8B decode token's matmuls summed to 2x its
    /// wall time).
    pub fn time_begin(&mut self) -> Result<()> {
        self.write_timestamp(vk::PipelineStageFlags::BOTTOM_OF_PIPE)
    }

    /// After the dispatch or copy that [`Recorder::time_begin`] opened.
    pub fn time_end(&mut self, name: &'static str, bytes: u64) -> Result<()> {
        self.write_timestamp(vk::PipelineStageFlags::BOTTOM_OF_PIPE)?;
        if let Some(ts) = self.timing() {
            ts.timed.push(Timed { name, bytes });
        }
        Ok(())
    }

    /// The commands timed in the last submitted pass with their (start,
    /// end) ticks; empty when profiling is off.
    pub fn read_timestamps(&mut self) -> Result<Vec<(Timed, u64, u64)>> {
        let Some(ts) = &mut self.timestamps else {
            return Ok(Vec::new());
        };
        let mut ticks = vec![0u64; ts.used as usize];
        for (pool, chunk) in ts
            .pools
            .iter()
            .zip(ticks.chunks_mut(QUERIES_PER_POOL as usize))
        {
            // SAFETY: the pass was submitted and waited for; these queries
            // were reset and written by it.
            unsafe {
                self.device.get_query_pool_results(
                    *pool,
                    0,
                    chunk,
                    vk::QueryResultFlags::WAIT | vk::QueryResultFlags::TYPE_64,
                )
            }
            .map_err(vk_err("reading timestamp queries"))?;
        }
        let timed = std::mem::take(&mut ts.timed);
        ts.used = 0;
        Ok(timed
            .into_iter()
            .zip(ticks.chunks_exact(2))
            .map(|(t, pair)| (t, pair[0], pair[1]))
            .collect())
    }

    /// Declare that the next command reads `reads` and writes `writes`,
    /// recording a barrier first when it depends on earlier commands.
    pub fn access(&mut self, reads: &[u32], writes: &[u32]) {
        let hazard = reads
            .iter()
            .any(|id| self.pending.get(id).is_some_and(|p| p.written))
            || writes
                .iter()
                .any(|id| self.pending.get(id).is_some_and(|p| p.written || p.read));
        if hazard {
            self.barrier(false);
            self.stats.barriers += 1;
            self.pending.clear();
        }
        for id in reads {
            self.pending.entry(*id).or_default().read = true;
        }
        for id in writes {
            self.pending.entry(*id).or_default().written = true;
            self.writes += 1;
            self.last_write.insert(*id, self.writes);
        }
    }

    /// The number of the last write to buffer `id` in this recording
    /// (numbers only grow, across recordings too), None if not written.
    pub fn last_write(&self, id: u32) -> Option<u64> {
        self.last_write.get(&id).copied()
    }

    /// A global barrier from every compute/transfer write to later
    /// compute/transfer accesses, and to host reads when `host` (only at the
    /// end of a submission: a host stage inside a pass costs NVIDIA a flush
    /// per barrier).
    fn barrier(&self, host: bool) {
        let (mut dst_access, mut dst_stage) = (
            vk::AccessFlags::SHADER_READ
                | vk::AccessFlags::SHADER_WRITE
                | vk::AccessFlags::TRANSFER_READ
                | vk::AccessFlags::TRANSFER_WRITE,
            vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
        );
        if host {
            dst_access |= vk::AccessFlags::HOST_READ;
            dst_stage |= vk::PipelineStageFlags::HOST;
        }
        let mb = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(dst_access)];
        // SAFETY: recording command buffer.
        unsafe {
            self.device.cmd_pipeline_barrier(
                self.cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                dst_stage,
                vk::DependencyFlags::empty(),
                &mb,
                &[],
                &[],
            )
        };
    }

    /// A descriptor set of `layout` from the pools of the pass being recorded.
    pub fn descriptor_set(&mut self, layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet> {
        let layouts = [layout];
        let device = self.device.clone();
        let r = self.recording_mut(self.slot)?;
        loop {
            if r.pools_used == 0 {
                r.pools_used = 1;
            }
            if r.pools.len() < r.pools_used {
                let sizes = [vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(DESCRIPTORS_PER_POOL)];
                let info = vk::DescriptorPoolCreateInfo::default()
                    .max_sets(SETS_PER_POOL)
                    .pool_sizes(&sizes);
                // SAFETY: valid device and create info.
                let pool = unsafe { device.create_descriptor_pool(&info, None) }
                    .map_err(vk_err("creating a descriptor pool"))?;
                r.pools.push(pool);
            }
            let info = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(r.pools[r.pools_used - 1])
                .set_layouts(&layouts);
            // SAFETY: valid pool and layout.
            match unsafe { device.allocate_descriptor_sets(&info) } {
                Ok(sets) => {
                    self.stats.descriptor_sets += 1;
                    return Ok(sets[0]);
                }
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL) => {
                    r.pools_used += 1;
                }
                Err(e) => return Err(vk_err("allocating a descriptor set")(e)),
            }
        }
    }

    /// Finish, submit and wait. A closing barrier makes every write of this
    /// submission visible to later submissions and to the host.
    pub fn submit(&mut self) -> Result<()> {
        if !self.recording {
            return Err(Error::Vulkan("no command buffer is being recorded".into()));
        }
        self.recording = false;
        self.barrier(true);
        // SAFETY: the command buffer is in the recording state.
        unsafe { self.device.end_command_buffer(self.cmd) }
            .map_err(vk_err("ending the command buffer"))?;
        self.run(self.cmd, 1, self.slot != Slot::Transfer)?;
        self.stats.submits += 1;
        if self.slot != Slot::Transfer {
            self.recording_mut(self.slot)?.ready = true;
        }
        Ok(())
    }

    /// End the command buffer being recorded without submitting it (a pass
    /// recorded only to learn its kernels); the next `begin` resets it.
    pub fn discard(&mut self) -> Result<()> {
        if !self.recording {
            return Err(Error::Vulkan("no command buffer is being recorded".into()));
        }
        self.recording = false;
        // SAFETY: the command buffer is in the recording state.
        unsafe { self.device.end_command_buffer(self.cmd) }
            .map_err(vk_err("ending the command buffer"))?;
        if self.slot != Slot::Transfer {
            self.recording_mut(self.slot)?.ready = false;
        }
        Ok(())
    }

    /// Submit the last recorded [`Slot::Pass`] again, unchanged, and wait.
    pub fn resubmit_pass(&mut self) -> Result<()> {
        if self.recording || !self.pass.ready {
            return Err(Error::Vulkan("there is no recorded pass to replay".into()));
        }
        self.run(self.pass.cmd.buf, 1, true)
    }

    /// Submit the pass kept under `key` `times` times in one batch and wait;
    /// false when no valid pass is kept under it.
    pub fn replay(&mut self, key: u32, times: u32) -> Result<bool> {
        if self.recording {
            return Err(Error::Vulkan("replay called while recording".into()));
        }
        match self.kept.get(&key) {
            Some(r) if r.ready => {
                let cmd = r.cmd.buf;
                self.run(cmd, times, true)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// No recorded pass may be submitted again (a buffer one uses is gone,
    /// or how passes are recorded changed).
    pub fn invalidate_pass(&mut self) {
        self.pass.ready = false;
        for r in self.kept.values_mut() {
            r.ready = false;
        }
    }

    /// `cmd` `times` times in one submit, then wait; `pass`: it is a
    /// compute pass (not a transfer).
    fn run(&mut self, cmd: vk::CommandBuffer, times: u32, pass: bool) -> Result<()> {
        if pass {
            if let Some(left) = &mut self.passes_left {
                if *left == 0 {
                    self.lost = Some("a loss injected by VKLLM_LOSE_DEVICE_AFTER");
                }
                *left = left.saturating_sub(1);
            }
        }
        if let Some(how) = self.lost {
            return Err(Error::DeviceLost(format!("submitting work ({how})")));
        }
        let cmds = vec![cmd; times.max(1) as usize];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: `cmd` is fully recorded and not pending (every submit is
        // waited for; repeats within a batch are kept passes, recorded for
        // simultaneous use); the fence is unsignalled (reset after every wait).
        let result = unsafe {
            self.device
                .queue_submit(self.queue, &submit, self.fence)
                .map_err(vk_err("submitting work"))
                .and_then(|()| {
                    let waiting = Instant::now();
                    let waited = self.wait_fence();
                    self.wait_ns += waiting.elapsed().as_nanos() as u64;
                    waited.map_err(vk_err("waiting for the GPU"))
                })
                .and_then(|()| {
                    self.device
                        .reset_fences(&[self.fence])
                        .map_err(vk_err("resetting the fence"))
                })
        };
        // After a real loss the fence's state is unknown: later submits
        // fail here instead of passing it to the driver again.
        self.note_loss(&result);
        result
    }

    /// Wait for the fence: poll it for up to `self.spin`, then sleep. A
    /// decode step ends within the poll, which sees it at once; the sleeping
    /// wait would first have to be woken.
    fn wait_fence(&self) -> ash::prelude::VkResult<()> {
        let polling = Instant::now();
        while polling.elapsed() < self.spin {
            // SAFETY: the fence belongs to this device.
            if unsafe { self.device.get_fence_status(self.fence) }? {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        // SAFETY: as above.
        unsafe { self.device.wait_for_fences(&[self.fence], true, u64::MAX) }
    }

    /// Wait until the device has finished everything submitted. On a lost
    /// device this fails with `DeviceLost`, as the driver's
    /// vkDeviceWaitIdle does; the real wait runs first even then, so the
    /// caller may destroy the device's objects either way.
    pub fn wait_idle(&mut self) -> Result<()> {
        // SAFETY: valid device; the recorder owns its only queue.
        let waited = unsafe { self.device.device_wait_idle() }
            .map_err(vk_err("waiting for the device to be idle"));
        self.note_loss(&waited);
        match (waited, self.lost) {
            (Ok(()), Some(how)) => Err(Error::DeviceLost(format!(
                "waiting for the device to be idle ({how})"
            ))),
            (other, _) => other,
        }
    }

    fn note_loss(&mut self, result: &Result<()>) {
        if matches!(result, Err(Error::DeviceLost(_))) && self.lost.is_none() {
            self.lost = Some("lost at an earlier call");
        }
    }
}

impl Drop for Recorder {
    /// The owner waits for the device to be idle before dropping.
    fn drop(&mut self) {
        // SAFETY: the device is idle and these objects belong to it.
        self.pass.destroy(&self.device);
        for (_, mut r) in self.kept.drain() {
            r.destroy(&self.device);
        }
        // SAFETY: as above.
        unsafe {
            let timestamp_pools = self.timestamps.take().map(|t| t.pools);
            for p in self
                .retired_pools
                .drain(..)
                .chain(timestamp_pools.into_iter().flatten())
            {
                self.device.destroy_query_pool(p, None);
            }
            self.device.destroy_fence(self.fence, None);
            self.device.destroy_command_pool(self.transfer.pool, None);
        }
    }
}
