//! One command buffer, one fence, one submit per pass; transfers record into
//! a second command buffer so a recorded pass survives them and can be
//! submitted again (replayed). Barriers come from
//! what each command reads and writes: a command that reads a buffer written
//! since the last barrier (RAW), or writes one read or written since then
//! (WAR, WAW), gets one global memory barrier before it; independent commands
//! (e.g. the Q, K, V projections of one input) get none.

use super::vk_err;
use crate::error::{Error, Result};
use ash::vk;
use std::collections::HashMap;

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

/// Work recorded in one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    pub submits: u32,
    pub barriers: u32,
    pub descriptor_sets: u32,
    pub dispatches: u32,
    pub copies: u32,
}

#[derive(Clone, Copy, Default)]
struct Pending {
    read: bool,
    written: bool,
}

pub struct Recorder {
    device: ash::Device,
    queue: vk::Queue,
    pass: Cmd,
    transfer: Cmd,
    /// The command buffer being recorded.
    pub cmd: vk::CommandBuffer,
    slot: Slot,
    fence: vk::Fence,
    desc_pools: Vec<vk::DescriptorPool>,
    desc_pool_next: usize,
    /// Accesses since the last barrier, by buffer id.
    pending: HashMap<u32, Pending>,
    recording: bool,
    /// The pass command buffer holds a complete, submitted pass.
    pass_ready: bool,
    pub stats: PassStats,
    /// Some while profiling: pass commands are bracketed by timestamps.
    timestamps: Option<Timestamps>,
    /// Query pools of an earlier profiling session, destroyed on drop.
    retired_pools: Vec<vk::QueryPool>,
}

impl Recorder {
    pub fn new(device: &ash::Device, queue: vk::Queue, family: u32) -> Result<Recorder> {
        let pass = Cmd::new(device, family)?;
        let transfer = match Cmd::new(device, family) {
            Ok(t) => t,
            Err(e) => {
                // SAFETY: the pool is unused.
                unsafe { device.destroy_command_pool(pass.pool, None) };
                return Err(e);
            }
        };
        let mut rec = Recorder {
            device: device.clone(),
            queue,
            cmd: pass.buf,
            pass,
            transfer,
            slot: Slot::Pass,
            fence: vk::Fence::null(),
            desc_pools: Vec::new(),
            desc_pool_next: 0,
            pending: HashMap::new(),
            recording: false,
            pass_ready: false,
            stats: PassStats::default(),
            timestamps: None,
            retired_pools: Vec::new(),
        };
        // SAFETY: valid device; on failure Drop destroys what exists.
        rec.fence = unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) }
            .map_err(vk_err("creating the fence"))?;
        Ok(rec)
    }

    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// Start recording into `slot`'s command buffer. Every earlier submit
    /// has completed (submit waits), so its pools can be reset; recording a
    /// pass discards the previous one.
    pub fn begin(&mut self, slot: Slot) -> Result<()> {
        if self.recording {
            return Err(Error::Vulkan(
                "a command buffer is already being recorded".into(),
            ));
        }
        let (cmd, flags) = match slot {
            Slot::Pass => (&self.pass, vk::CommandBufferUsageFlags::empty()),
            Slot::Transfer => (&self.transfer, vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
        };
        // SAFETY: nothing recorded from these pools is pending on the GPU.
        unsafe {
            self.device
                .reset_command_pool(cmd.pool, vk::CommandPoolResetFlags::empty())
                .map_err(vk_err("resetting a command pool"))?;
            if slot == Slot::Pass {
                self.pass_ready = false;
                for &p in &self.desc_pools[..self.desc_pool_next.min(self.desc_pools.len())] {
                    self.device
                        .reset_descriptor_pool(p, vk::DescriptorPoolResetFlags::empty())
                        .map_err(vk_err("resetting a descriptor pool"))?;
                }
                self.desc_pool_next = 0;
            }
            self.device
                .begin_command_buffer(cmd.buf, &vk::CommandBufferBeginInfo::default().flags(flags))
                .map_err(vk_err("beginning the command buffer"))?;
        }
        self.cmd = cmd.buf;
        self.slot = slot;
        self.pending.clear();
        self.stats = PassStats::default();
        if let Some(ts) = &mut self.timestamps {
            if slot == Slot::Pass {
                ts.used = 0;
                ts.timed.clear();
            }
        }
        self.recording = true;
        Ok(())
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
            Slot::Pass if self.recording => self.timestamps.as_mut(),
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

    /// Before a dispatch or copy of the pass (after its barrier).
    pub fn time_begin(&mut self) -> Result<()> {
        self.write_timestamp(vk::PipelineStageFlags::TOP_OF_PIPE)
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
            self.barrier();
            self.stats.barriers += 1;
            self.pending.clear();
        }
        for id in reads {
            self.pending.entry(*id).or_default().read = true;
        }
        for id in writes {
            self.pending.entry(*id).or_default().written = true;
        }
    }

    /// A global barrier from every compute/transfer write to every later
    /// compute/transfer access and host reads.
    fn barrier(&self) {
        let mb = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::TRANSFER_WRITE
                    | vk::AccessFlags::HOST_READ,
            )];
        // SAFETY: recording command buffer.
        unsafe {
            self.device.cmd_pipeline_barrier(
                self.cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::COMPUTE_SHADER
                    | vk::PipelineStageFlags::TRANSFER
                    | vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &mb,
                &[],
                &[],
            )
        };
    }

    /// A descriptor set of `layout` from this pass's pools.
    pub fn descriptor_set(&mut self, layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet> {
        let layouts = [layout];
        loop {
            if self.desc_pool_next == 0 {
                self.desc_pool_next = 1;
            }
            if self.desc_pools.len() < self.desc_pool_next {
                let sizes = [vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(DESCRIPTORS_PER_POOL)];
                let info = vk::DescriptorPoolCreateInfo::default()
                    .max_sets(SETS_PER_POOL)
                    .pool_sizes(&sizes);
                // SAFETY: valid device and create info.
                let pool = unsafe { self.device.create_descriptor_pool(&info, None) }
                    .map_err(vk_err("creating a descriptor pool"))?;
                self.desc_pools.push(pool);
            }
            let info = vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(self.desc_pools[self.desc_pool_next - 1])
                .set_layouts(&layouts);
            // SAFETY: valid pool and layout.
            match unsafe { self.device.allocate_descriptor_sets(&info) } {
                Ok(sets) => {
                    self.stats.descriptor_sets += 1;
                    return Ok(sets[0]);
                }
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL) => {
                    self.desc_pool_next += 1;
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
        self.barrier();
        // SAFETY: the command buffer is in the recording state.
        unsafe { self.device.end_command_buffer(self.cmd) }
            .map_err(vk_err("ending the command buffer"))?;
        self.run(self.cmd)?;
        self.stats.submits += 1;
        if self.slot == Slot::Pass {
            self.pass_ready = true;
        }
        Ok(())
    }

    /// Submit the last recorded pass again, unchanged, and wait.
    pub fn resubmit_pass(&mut self) -> Result<()> {
        if self.recording || !self.pass_ready {
            return Err(Error::Vulkan("there is no recorded pass to replay".into()));
        }
        self.run(self.pass.buf)
    }

    /// The pass may no longer be replayed (a buffer it uses is gone).
    pub fn invalidate_pass(&mut self) {
        self.pass_ready = false;
    }

    fn run(&mut self, cmd: vk::CommandBuffer) -> Result<()> {
        let cmds = [cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: `cmd` is fully recorded and not pending (every submit is
        // waited for); the fence is unsignalled (reset after every wait).
        unsafe {
            self.device
                .queue_submit(self.queue, &submit, self.fence)
                .map_err(vk_err("submitting work"))?;
            self.device
                .wait_for_fences(&[self.fence], true, u64::MAX)
                .map_err(vk_err("waiting for the GPU"))?;
            self.device
                .reset_fences(&[self.fence])
                .map_err(vk_err("resetting the fence"))?;
        }
        Ok(())
    }
}

impl Drop for Recorder {
    /// The owner waits for the device to be idle before dropping.
    fn drop(&mut self) {
        // SAFETY: the device is idle and these objects belong to it.
        unsafe {
            for p in self.desc_pools.drain(..) {
                self.device.destroy_descriptor_pool(p, None);
            }
            let timestamp_pools = self.timestamps.take().map(|t| t.pools);
            for p in self
                .retired_pools
                .drain(..)
                .chain(timestamp_pools.into_iter().flatten())
            {
                self.device.destroy_query_pool(p, None);
            }
            self.device.destroy_fence(self.fence, None);
            self.device.destroy_command_pool(self.pass.pool, None);
            self.device.destroy_command_pool(self.transfer.pool, None);
        }
    }
}
