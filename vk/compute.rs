//! [`ComputeBackend`] for [`VulkanBackend`]: buffers, transfers and passes,
//! and every op as one line naming its encoder (vk/ops/<op>.rs).

use super::memory::STAGING_CAP;
use super::recorder::Slot;
use super::{layout, VulkanBackend, STATUS_BYTES};
use crate::backend::{
    Activation, AttentionParams, Buffer, ComputeBackend, DeviceMemoryUse, ExpertsParams, KvPages,
    LinearOpts, PassStats, RopeParams, RouteParams, Weight,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::profile::ProfileEvent;
use ash::vk;

/// Trait methods that record an op: each line gives the name the op's errors
/// carry, the method's parameters and the encoder method they go to.
macro_rules! encoded_ops {
    ($($name:literal: fn $op:ident($($arg:ident: $ty:ty),*) => $encoder:ident;)*) => {
        $(fn $op(&mut self, $($arg: $ty),*) -> Result<()> {
            self.encode($name, |cx| cx.$encoder($($arg),*))
        })*
    };
}

impl ComputeBackend for VulkanBackend {
    /// f16: decode attention streams the whole cache every token, so half
    /// the bytes is up to twice the speed at depth; values lose ~3 decimal
    /// digits (stated and tested in tests/ops/attention.rs).
    fn default_kv_dtype(&self) -> DType {
        DType::F16
    }

    /// 2048 rows where a binding may cover 2 GiB or more (a pass's widest
    /// buffers, the FFN activations and a prompt's logits, grow with it),
    /// else 512: longer passes run a long prompt faster (benches/README.md,
    /// prefill GEMM).
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
        self.switch_profiling(on)
    }

    fn take_profile(&mut self) -> Vec<ProfileEvent> {
        self.profile
            .as_mut()
            .map_or_else(Vec::new, |p| std::mem::take(&mut p.events))
    }

    fn device_memory(&self) -> Option<DeviceMemoryUse> {
        Some(self.mem.usage())
    }

    fn free_memory(&self) -> Option<u64> {
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
        let heap = heaps
            .iter()
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .max()?;
        Some(heap.saturating_sub(self.mem.reserved_bytes()))
    }

    fn max_op_buffer_bytes(&self) -> Option<u64> {
        Some(self.caps().max_storage_buffer_range)
    }

    fn check_fits(&self, what: &str, bytes: u64) -> Result<()> {
        let Some(available) = self.free_memory() else {
            return Ok(());
        };
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

    fn begin_kernel_survey(&mut self) -> Result<bool> {
        if self.in_pass {
            return Err(Error::Vulkan(
                "a kernel survey cannot start inside a pass".into(),
            ));
        }
        if self.prepare_kernels {
            self.pipes.begin_survey();
        }
        Ok(self.prepare_kernels)
    }

    fn end_kernel_survey(&mut self) -> Result<usize> {
        if self.in_pass {
            return Err(Error::Vulkan(
                "a kernel survey cannot end inside a pass".into(),
            ));
        }
        self.forget_unwritten();
        self.pipes.end_survey()
    }

    fn replay(&mut self, key: u32, times: usize) -> Result<bool> {
        if self.in_pass {
            return Err(Error::Vulkan("replay called inside a pass".into()));
        }
        if self.pipes.surveying() {
            return Ok(false); // nothing recorded in a survey runs
        }
        if self.profile.is_some() || times == 0 {
            return Ok(times == 0);
        }
        self.flush_fills()?;
        self.mem.get_mut(self.status.id)?.mapped()?[..STATUS_BYTES].fill(0);
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
        if self.pipes.surveying() {
            return self.discard_pass();
        }
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

    encoded_ops! {
        "embedding": fn embedding(table: &Weight, ids: &Buffer, out: &Buffer,
            rows: usize) => encode_embedding;
        "matmul": fn matmul(w: &Weight, bias: Option<&Buffer>, x: &Buffer, y: &Buffer,
            m: usize) => encode_matmul;
        "matmul": fn linear(w: &Weight, x: &Buffer, y: &Buffer, m: usize,
            o: &LinearOpts) => encode_linear;
        "matmul": fn linear_glu(act: Activation, gate_up: &Weight, x: &Buffer, out: &Buffer,
            m: usize, norm: Option<(&Buffer, f32)>) => encode_linear_glu;
        "rms_norm": fn rms_norm(x: &Buffer, w: &Buffer, out: &Buffer, rows: usize, dim: usize,
            eps: f32) => encode_rms_norm;
        "layer_norm": fn layer_norm(x: &Buffer, w: &Buffer, bias: &Buffer, out: &Buffer,
            rows: usize, dim: usize, eps: f32) => encode_layer_norm;
        "rope": fn rope(x: &Buffer, positions: &Buffer, p: &RopeParams) => encode_rope;
        "attention": fn attention(q: &Buffer, k_cache: &Buffer, v_cache: &Buffer,
            positions: &Buffer, out: &Buffer, p: &AttentionParams) => encode_attention;
        "glu": fn glu(act: Activation, gate: &Buffer, up: Option<&Buffer>, out: &Buffer,
            n: usize) => encode_glu;
        "add": fn add(a: &Buffer, b: &Buffer, out: &Buffer, n: usize) => encode_add;
        "scale": fn scale(x: &Buffer, s: f32, out: &Buffer, n: usize) => encode_scale;
        "round_i8": fn round_i8(x: &Buffer, out: &Buffer, rows: usize, dim: usize)
            => encode_round_i8;
        "copy": fn copy(src: &Buffer, src_offset: usize, dst: &Buffer, dst_offset: usize,
            bytes: usize) => encode_copy;
        "argmax": fn argmax(x: &Buffer, allowed: Option<&Buffer>, out: &Buffer, rows: usize,
            n: usize) => encode_argmax;
        "store_rows": fn store_rows(src: &Buffer, dst: &Buffer, positions: &Buffer, rows: usize,
            row_len: usize, dst_dtype: DType, pages: Option<&KvPages>) => encode_store_rows;
        "rope_store": fn rope_store(q: &Buffer, k: &Buffer, v: &Buffer, positions: &Buffer,
            k_cache: &Buffer, v_cache: &Buffer, p: &RopeParams, n_kv_heads: usize,
            kv_dtype: DType, pages: Option<&KvPages>) => encode_rope_store;
        "attention": fn rope_store_attention(q: &Buffer, k: &Buffer, v: &Buffer,
            positions: &Buffer, k_cache: &Buffer, v_cache: &Buffer, rope: &RopeParams,
            p: &AttentionParams, out: &Buffer) => encode_rope_store_attention;
        "append_token": fn append_token(ids: &Buffer, positions: &Buffer,
            history: &Buffer) => encode_append_token;
        "route_experts": fn route_experts(logits: &Buffer, ids: &Buffer, weights: &Buffer,
            p: &RouteParams) => encode_route_experts;
        "matmul_experts": fn matmul_experts(w: &Weight, bias: Option<&Buffer>, x: &Buffer,
            ids: &Buffer, y: &Buffer, p: &ExpertsParams) => encode_matmul_experts;
        "sum_experts": fn sum_experts(y: &Buffer, weights: &Buffer, out: &Buffer, rows: usize,
            k: usize, n: usize, add: bool) => encode_sum_experts;
    }
}
