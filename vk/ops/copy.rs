//! `copy`: vkCmdCopyBuffer between two buffers (the KV-cache append).

use super::{check_range, Encoder};
use crate::backend::Buffer;
use crate::error::{Error, Result};
use ash::vk;

impl Encoder<'_> {
    pub(in crate::vk) fn encode_copy(
        &mut self,
        src: &Buffer,
        src_offset: usize,
        dst: &Buffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        const OP: &str = "copy";
        if !src_offset.is_multiple_of(4)
            || !dst_offset.is_multiple_of(4)
            || !bytes.is_multiple_of(4)
        {
            return Err(Error::op(
                OP,
                format!(
                "offsets and size must be multiples of 4 (got {src_offset}, {dst_offset}, {bytes})"
            ),
            ));
        }
        check_range(OP, src, src_offset, bytes)?;
        check_range(OP, dst, dst_offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        let s = self.mem.resolve(src)?.buffer;
        let d = self.mem.resolve(dst)?.buffer;
        if src.id == dst.id && src_offset.max(dst_offset) < src_offset.min(dst_offset) + bytes {
            return Err(Error::op(OP, "source and destination ranges overlap"));
        }
        self.rec.access(&[src.id], &[dst.id]);
        let region = [vk::BufferCopy::default()
            .src_offset(src_offset as u64)
            .dst_offset(dst_offset as u64)
            .size(bytes as u64)];
        self.rec.time_begin()?;
        // SAFETY: recording command buffer; ranges checked above.
        unsafe { self.device.cmd_copy_buffer(self.rec.cmd, s, d, &region) };
        // Read and written once.
        self.rec.time_end(OP, 2 * bytes as u64)?;
        self.rec.stats.copies += 1;
        Ok(())
    }
}
