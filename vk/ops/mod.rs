//! Op encoders: shape checks, then one dispatch (or copy) recorded through
//! [`VulkanBackend::dispatch`], which declares reads and writes to the
//! recorder so it can place barriers.

mod append_token;
mod argmax;
mod attention;
mod copy;
mod elementwise;
mod embedding;
mod matmul;
mod norm;
mod rope;
mod rope_store;
mod store_rows;

use super::pipeline::{Spec, PUSH_BYTES};
use super::VulkanBackend;
use crate::backend::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use ash::vk;

pub(super) use matmul::{PreparedX, QuantizedX};

/// Most storage buffers any kernel binds (attention: 6).
const MAX_BINDINGS: usize = 7;

/// One storage-buffer binding of a dispatch.
pub(super) struct Bind<'a> {
    buf: &'a Buffer,
    write: bool,
    /// Left out of barrier tracking: only updated with atomics whose order
    /// does not matter (the status word).
    tracked: bool,
    /// A read that may be the op's output buffer too (elementwise in place).
    may_alias: bool,
}

pub(super) fn read(buf: &Buffer) -> Bind<'_> {
    Bind {
        buf,
        write: false,
        tracked: true,
        may_alias: false,
    }
}

/// A read of an elementwise op whose output may be this same buffer.
pub(super) fn read_in_place(buf: &Buffer) -> Bind<'_> {
    Bind {
        may_alias: true,
        ..read(buf)
    }
}

pub(super) fn write(buf: &Buffer) -> Bind<'_> {
    Bind {
        buf,
        write: true,
        tracked: true,
        may_alias: false,
    }
}

pub(super) fn atomic(buf: &Buffer) -> Bind<'_> {
    Bind {
        buf,
        write: true,
        tracked: false,
        may_alias: false,
    }
}

/// Which pipeline a dispatch runs.
pub(super) struct KernelRef {
    name: &'static str,
    /// The weight dtype variant, for shaders compiled per dtype.
    dtype: Option<DType>,
    /// Specialization constants 0.. (0: the workgroup size), all 0 when the
    /// shader has none.
    spec: Spec,
}

pub(super) fn plain(name: &'static str) -> KernelRef {
    KernelRef {
        name,
        dtype: None,
        spec: [0; 3],
    }
}

pub(super) fn typed(name: &'static str, dtype: DType) -> KernelRef {
    KernelRef {
        name,
        dtype: Some(dtype),
        spec: [0; 3],
    }
}

impl KernelRef {
    /// Specialization constant 0.
    pub(super) fn spec(self, c0: u32) -> KernelRef {
        self.specs([c0, 0, 0])
    }

    pub(super) fn specs(self, spec: Spec) -> KernelRef {
        KernelRef { spec, ..self }
    }
}

/// `v` as a u32 shader parameter, or an error naming the op.
pub(super) fn u32_of(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::op(
            op,
            format!("{what} = {v} exceeds the u32 range of the shaders"),
        )
    })
}

impl VulkanBackend {
    /// Workgroup counts `[x, y, 1]` covering `groups` workgroups, split over
    /// y when x would exceed the device limit (shaders use `wg_linear()`).
    pub(super) fn split_groups(&self, op: &'static str, groups: u32) -> Result<[u32; 3]> {
        let max = self.caps().max_workgroup_count;
        let x = groups.clamp(1, max[0]);
        let y = groups.div_ceil(x).max(1);
        if y > max[1] {
            return Err(Error::op(
                op,
                format!("{groups} workgroups exceed the device limits"),
            ));
        }
        Ok([x, y, 1])
    }

    /// Workgroups for a grid-stride loop over `n` items with `wg` invocations each.
    pub(super) fn stride_groups(&self, n: usize, wg: u32) -> [u32; 3] {
        let want = n.div_ceil(wg as usize).max(1);
        [
            want.min(self.caps().max_workgroup_count[0] as usize) as u32,
            1,
            1,
        ]
    }

    /// A backend-owned scratch buffer (the field `slot` picks), grown to at
    /// least `bytes`. Not zeroed: its users write every value they read in
    /// the same pass, so a pass that grows it can still be replayed (growing
    /// frees the old buffer, which invalidates kept passes that bound it).
    pub(super) fn scratch(
        &mut self,
        slot: fn(&mut VulkanBackend) -> &mut Option<Buffer>,
        bytes: usize,
    ) -> Result<Buffer> {
        let bytes = bytes.max(4);
        match *slot(self) {
            Some(b) if b.bytes >= bytes => Ok(b),
            old => {
                if let Some(b) = old {
                    crate::backend::ComputeBackend::free(self, b);
                }
                let (id, _, _) = self.mem.alloc(bytes)?;
                let b = Buffer::new(id, bytes);
                *slot(self) = Some(b);
                Ok(b)
            }
        }
    }

    /// Record one dispatch of `kernel` over `groups` with `binds` at bindings
    /// 0.. and `push` as push constants.
    pub(super) fn dispatch(
        &mut self,
        op: &'static str,
        kernel: KernelRef,
        binds: &[Bind<'_>],
        push: &[u8],
        groups: [u32; 3],
    ) -> Result<()> {
        // Workgroups read inputs while others write the output, so an output
        // may only alias inputs that are read and written at the same index.
        for w in binds.iter().filter(|b| b.write) {
            if binds
                .iter()
                .any(|r| !r.write && !r.may_alias && r.buf.id == w.buf.id)
            {
                return Err(Error::op(op, "the output buffer aliases an input"));
            }
        }
        if binds.len() > MAX_BINDINGS {
            return Err(Error::op(op, "too many buffer bindings"));
        }
        // Fixed-size scratch: recording a dispatch allocates nothing on the heap.
        let max_range = self.caps().max_storage_buffer_range;
        let mut infos = [vk::DescriptorBufferInfo::default(); MAX_BINDINGS];
        for (info, b) in infos.iter_mut().zip(binds) {
            let db = self.mem.resolve(b.buf)?;
            if db.size > max_range {
                return Err(Error::op(
                    op,
                    format!(
                        "a buffer of {} bytes exceeds the device's maxStorageBufferRange ({max_range})",
                        db.size
                    ),
                ));
            }
            *info = vk::DescriptorBufferInfo::default()
                .buffer(db.buffer)
                .offset(0)
                .range(vk::WHOLE_SIZE);
        }
        if push.len() > PUSH_BYTES as usize {
            return Err(Error::op(op, "push constants too large"));
        }
        let mut push_data = [0u8; PUSH_BYTES as usize];
        push_data[..push.len()].copy_from_slice(push);

        let kernel = self
            .pipes
            .get(kernel.name, kernel.dtype, binds.len() as u32, kernel.spec)?;
        let (pipeline, layout, set_layout) = (kernel.pipeline, kernel.layout, kernel.set_layout);
        let set = self.rec.descriptor_set(set_layout)?;
        let mut writes = [vk::WriteDescriptorSet::default(); MAX_BINDINGS];
        for (i, (w, info)) in writes.iter_mut().zip(&infos).take(binds.len()).enumerate() {
            *w = vk::WriteDescriptorSet::default()
                .dst_set(set)
                .dst_binding(i as u32)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(std::slice::from_ref(info));
        }
        let (mut reads, mut n_reads) = ([0u32; MAX_BINDINGS], 0);
        let (mut written, mut n_written) = ([0u32; MAX_BINDINGS], 0);
        for b in binds.iter().filter(|b| b.tracked) {
            if b.write {
                written[n_written] = b.buf.id;
                n_written += 1;
            } else {
                reads[n_reads] = b.buf.id;
                n_reads += 1;
            }
        }
        self.rec.access(&reads[..n_reads], &written[..n_written]);
        self.rec.time_begin()?;
        let d = &self.dev.device;
        let cmd = self.rec.cmd;
        // SAFETY: the set, pipeline and layout are live; the command buffer is recording.
        unsafe {
            d.update_descriptor_sets(&writes[..binds.len()], &[]);
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
            d.cmd_bind_descriptor_sets(cmd, vk::PipelineBindPoint::COMPUTE, layout, 0, &[set], &[]);
            d.cmd_push_constants(cmd, layout, vk::ShaderStageFlags::COMPUTE, 0, &push_data);
            d.cmd_dispatch(cmd, groups[0], groups[1], groups[2]);
        }
        if self.profile.is_some() {
            let bytes = binds
                .iter()
                .filter(|b| b.tracked)
                .map(|b| b.buf.bytes as u64);
            self.rec.time_end(op, bytes.sum())?;
        }
        self.rec.stats.dispatches += 1;
        Ok(())
    }
}
