//! The narrow context an op encoder records through: the recorder, the
//! pipelines, the memory, the device's capabilities and the kernels chosen
//! for it, plus the state encoders keep between ops ([`OpState`]). The
//! backend builds one per recorded op, so an encoder sees nothing of passes,
//! transfers or profiling beyond whether commands are timed.

use super::super::caps::{Caps, Kernels};
use super::super::memory::Memory;
use super::super::pipeline::{Pipelines, PUSH_BYTES};
use super::super::recorder::Recorder;
use super::super::weight_parts::Splits;
use super::matmul::{PreparedX, QuantizedX};
use super::matmul_experts::ExpertSlots;
use super::rope::RopeKey;
use super::{Bind, KernelRef, MAX_BINDINGS};
use crate::backend::Buffer;
use crate::error::{Error, Result};
use ash::vk;
use std::collections::HashMap;

/// What encoders keep between ops: scratch buffers grown on demand, the
/// rope tables, and what the matmul scratch buffers hold.
#[derive(Default)]
pub(in crate::vk) struct OpState {
    /// Rope inverse-frequency tables by (rot_dim, base bits, YaRN scaling
    /// bits), made on first use.
    pub rope_tables: HashMap<RopeKey, Buffer>,
    /// A decode step's rotations by the key of their table: the buffer, the
    /// positions buffer they were made from and the recorder's number of
    /// their write (valid while neither has been written since).
    pub step_rotations: HashMap<RopeKey, (Buffer, u32, u64)>,
    /// Attention's per-split partials (decode), grown on demand.
    pub attn_scratch: Option<Buffer>,
    /// `linear`'s normed input and product for many rows, grown on demand.
    pub norm_scratch: Option<Buffer>,
    pub product_scratch: Option<Buffer>,
    /// A split-K GEMM's partial outputs (split_sum.comp adds them up).
    pub gemm_split_scratch: Option<Buffer>,
    /// `linear_glu`'s gate_up product for many rows.
    pub glu_scratch: Option<Buffer>,
    /// The cooperative-matrix GEMM's input as f16 (half_rows.comp).
    pub half_scratch: Option<Buffer>,
    /// What norm_scratch / half_scratch hold for the tiled GEMM.
    pub prepared_x: Option<PreparedX>,
    /// x as int8 digits for the integer-dot GEMV (quantize_q8.comp).
    pub xq_scratch: Option<Buffer>,
    /// The int8 digits last written (in xq_scratch or xq_out_scratch) and of
    /// what, so matmuls of one input (Q, K and V) share them.
    pub xq_of: Option<QuantizedX>,
    /// A GLU GEMV's output as int8 digits (mul_mat_vec.comp's Q8OUT),
    /// apart from xq_scratch, which that GEMV reads.
    pub xq_out_scratch: Option<Buffer>,
    /// Each expert's routed slots (expert_slots.comp) for the grouped GEMM,
    /// and of which ids.
    pub expert_slots_scratch: Option<Buffer>,
    pub expert_slots_of: Option<ExpertSlots>,
    /// argmax's per-workgroup (value, index) partials, grown on demand.
    pub argmax_scratch: Option<Buffer>,
    /// Decode attention's split arrival counts (attention_decode_merge):
    /// zeroed when made, and each pass leaves them zero.
    pub attn_arrivals: Option<Buffer>,
}

/// Everything an op encoder may touch while recording one op.
pub(in crate::vk) struct Encoder<'a> {
    pub device: &'a ash::Device,
    pub rec: &'a mut Recorder,
    pub pipes: &'a mut Pipelines,
    pub mem: &'a mut Memory,
    pub caps: &'a Caps,
    /// Kernel variants chosen for this device (and the environment).
    pub kernels: Kernels,
    /// Smallest weight the integer-dot GEMV takes.
    pub gemv_q8_min_bytes: usize,
    /// Weights stored in several buffers (vk/weight_parts.rs).
    pub splits: &'a Splits,
    pub state: &'a mut OpState,
    /// Buffers freed while the recorded commands may use them, destroyed
    /// by the backend after submit.
    pub frees: &'a mut Vec<u32>,
    /// The status words shaders flag input errors in (atomics only).
    pub status: Buffer,
    /// Commands are bracketed by timestamps (profiling on).
    pub timed: bool,
    /// Set where the op zeroed a buffer it made inside the pass: that
    /// pass cannot be kept for replay (its replays would zero it again).
    pub pass_allocs: &'a mut bool,
}

impl Encoder<'_> {
    pub(in crate::vk) fn caps(&self) -> &Caps {
        self.caps
    }

    /// Workgroup counts `[x, y, 1]` covering `groups` workgroups, split over
    /// y when x would exceed the device limit (shaders use `wg_linear()`).
    pub(in crate::vk) fn split_groups(&self, op: &'static str, groups: u32) -> Result<[u32; 3]> {
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
    pub(in crate::vk) fn stride_groups(&self, n: usize, wg: u32) -> [u32; 3] {
        let want = n.div_ceil(wg as usize).max(1);
        [
            want.min(self.caps().max_workgroup_count[0] as usize) as u32,
            1,
            1,
        ]
    }

    /// A scratch buffer of [`OpState`] (the field `slot` picks), grown to at
    /// least `bytes`. Not zeroed: its users write every value they read in
    /// the same pass, so a pass that grows it can still be replayed (growing
    /// frees the old buffer, which invalidates kept passes that bound it).
    pub(in crate::vk) fn scratch(
        &mut self,
        slot: fn(&mut OpState) -> &mut Option<Buffer>,
        bytes: usize,
    ) -> Result<Buffer> {
        self.grow_scratch(slot, bytes, false)
    }

    /// [`Encoder::scratch`] zeroed when it is made (a fill recorded in this
    /// pass, which then is not kept), for values the kernels leave as they
    /// found them.
    pub(in crate::vk) fn zeroed_scratch(
        &mut self,
        slot: fn(&mut OpState) -> &mut Option<Buffer>,
        bytes: usize,
    ) -> Result<Buffer> {
        self.grow_scratch(slot, bytes, true)
    }

    fn grow_scratch(
        &mut self,
        slot: fn(&mut OpState) -> &mut Option<Buffer>,
        bytes: usize,
        zeroed: bool,
    ) -> Result<Buffer> {
        let bytes = bytes.max(4);
        if let Some(b) = *slot(self.state) {
            if b.bytes >= bytes {
                return Ok(b);
            }
            self.free(b);
        }
        let (id, handle, size) = self.mem.alloc(bytes)?;
        if zeroed {
            self.rec.access(&[], &[id]);
            // SAFETY: recording command buffer, live buffer.
            unsafe {
                self.device
                    .cmd_fill_buffer(self.rec.cmd, handle, 0, size, 0)
            };
            *self.pass_allocs = true;
        }
        let b = Buffer::new(id, bytes);
        *slot(self.state) = Some(b);
        Ok(b)
    }

    /// Release a buffer the encoders own (never a split weight, never
    /// waiting to be zeroed): kept passes may bind it, and the commands
    /// recorded so far may use it, so the backend destroys it after submit.
    fn free(&mut self, buf: Buffer) {
        self.rec.invalidate_pass();
        self.frees.push(buf.id);
    }

    /// Record one dispatch of `kernel` over `groups` with `binds` at bindings
    /// 0.. and `push` as push constants.
    pub(in crate::vk) fn dispatch(
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
        if self.pipes.surveying() {
            // Only the kernel is wanted; the accesses keep what encoders
            // learn from them (what was written last) as in a real pass.
            let bindings = binds.len() as u32;
            self.pipes
                .note(kernel.name, kernel.dtype, bindings, kernel.spec);
            self.rec.access(&reads[..n_reads], &written[..n_written]);
            return Ok(());
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

        let (kernel, made) =
            self.pipes
                .get(kernel.name, kernel.dtype, binds.len() as u32, kernel.spec)?;
        let (pipeline, layout, set_layout) = (kernel.pipeline, kernel.layout, kernel.set_layout);
        if made {
            self.rec.stats.kernels_made += 1;
        }
        let set = self.rec.descriptor_set(set_layout)?;
        let mut writes = [vk::WriteDescriptorSet::default(); MAX_BINDINGS];
        for (i, (w, info)) in writes.iter_mut().zip(&infos).take(binds.len()).enumerate() {
            *w = vk::WriteDescriptorSet::default()
                .dst_set(set)
                .dst_binding(i as u32)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(std::slice::from_ref(info));
        }
        self.rec.access(&reads[..n_reads], &written[..n_written]);
        self.rec.time_begin()?;
        let d = self.device;
        let cmd = self.rec.cmd;
        // SAFETY: the set, pipeline and layout are live; the command buffer is recording.
        unsafe {
            d.update_descriptor_sets(&writes[..binds.len()], &[]);
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
            d.cmd_bind_descriptor_sets(cmd, vk::PipelineBindPoint::COMPUTE, layout, 0, &[set], &[]);
            d.cmd_push_constants(cmd, layout, vk::ShaderStageFlags::COMPUTE, 0, &push_data);
            d.cmd_dispatch(cmd, groups[0], groups[1], groups[2]);
        }
        if self.timed {
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
