//! One command buffer, one fence, one submit per pass. Barriers come from
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
/// Storage-buffer descriptors per pool (5 bindings per set at most).
const DESCRIPTORS_PER_POOL: u32 = SETS_PER_POOL * 5;

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
    pool: vk::CommandPool,
    pub cmd: vk::CommandBuffer,
    fence: vk::Fence,
    desc_pools: Vec<vk::DescriptorPool>,
    desc_pool_next: usize,
    /// Accesses since the last barrier, by buffer id.
    pending: HashMap<u32, Pending>,
    recording: bool,
    pub stats: PassStats,
}

impl Recorder {
    pub fn new(device: &ash::Device, queue: vk::Queue, family: u32) -> Result<Recorder> {
        let d = device;
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(family)
            .flags(vk::CommandPoolCreateFlags::TRANSIENT);
        // SAFETY: valid device and create infos throughout.
        let pool = unsafe { d.create_command_pool(&info, None) }
            .map_err(vk_err("creating the command pool"))?;
        let mut rec = Recorder {
            device: d.clone(),
            queue,
            pool,
            cmd: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            desc_pools: Vec::new(),
            desc_pool_next: 0,
            pending: HashMap::new(),
            recording: false,
            stats: PassStats::default(),
        };
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        rec.cmd = unsafe { d.allocate_command_buffers(&alloc) }
            .map_err(vk_err("allocating the command buffer"))?[0];
        rec.fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }
            .map_err(vk_err("creating the fence"))?;
        Ok(rec)
    }

    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// Start a command buffer. The previous one has completed (submit waits),
    /// so the command and descriptor pools can be reset.
    pub fn begin(&mut self) -> Result<()> {
        if self.recording {
            return Err(Error::Vulkan(
                "a command buffer is already being recorded".into(),
            ));
        }
        // SAFETY: nothing recorded from these pools is pending on the GPU.
        unsafe {
            self.device
                .reset_command_pool(self.pool, vk::CommandPoolResetFlags::empty())
                .map_err(vk_err("resetting the command pool"))?;
            for &p in &self.desc_pools[..self.desc_pool_next.min(self.desc_pools.len())] {
                self.device
                    .reset_descriptor_pool(p, vk::DescriptorPoolResetFlags::empty())
                    .map_err(vk_err("resetting a descriptor pool"))?;
            }
            self.device
                .begin_command_buffer(
                    self.cmd,
                    &vk::CommandBufferBeginInfo::default()
                        .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                )
                .map_err(vk_err("beginning the command buffer"))?;
        }
        self.desc_pool_next = 0;
        self.pending.clear();
        self.stats = PassStats::default();
        self.recording = true;
        Ok(())
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
        let cmds = [self.cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: the command buffer was recorded by this recorder; the fence
        // is unsignalled (reset after every wait).
        unsafe {
            self.device
                .end_command_buffer(self.cmd)
                .map_err(vk_err("ending the command buffer"))?;
            self.device
                .queue_submit(self.queue, &submit, self.fence)
                .map_err(vk_err("submitting work"))?;
            self.stats.submits += 1;
            self.device
                .wait_for_fences(&[self.fence], true, u64::MAX)
                .map_err(vk_err("waiting for the GPU"))?;
            self.device
                .reset_fences(&[self.fence])
                .map_err(vk_err("resetting the fence"))?;
        }
        Ok(())
    }

    /// Destroy everything; the device must be idle.
    pub fn destroy(&mut self) {
        // SAFETY: the device is idle and these objects belong to it.
        unsafe {
            for p in self.desc_pools.drain(..) {
                self.device.destroy_descriptor_pool(p, None);
            }
            self.device.destroy_fence(self.fence, None);
            self.device.destroy_command_pool(self.pool, None);
        }
    }
}
