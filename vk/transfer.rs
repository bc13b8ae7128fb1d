//! Uploads and downloads: through staging buffers in submits of their own
//! outside a pass, in place for host-mapped buffers, and recorded with
//! vkCmdUpdateBuffer inside a pass (ordered with the ops around them).

use super::ops::check_range;
use super::recorder::Slot;
use super::VulkanBackend;
use crate::backend::Buffer;
use crate::error::{Error, Result};
use ash::vk;

impl VulkanBackend {
    /// The host-mapped buffer behind `buf`, if it is one (see `alloc_mapped`).
    pub(super) fn host_bytes(&mut self, buf: &Buffer) -> Result<Option<&mut [u8]>> {
        self.mem.resolve(buf)?;
        let db = self.mem.get_mut(buf.id)?;
        if !db.host {
            return Ok(None);
        }
        Ok(Some(db.mapped()?))
    }

    pub(super) fn transfer(
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
        check_range(op, buf, offset, len)?;
        self.mem.resolve(buf)?;
        Ok(())
    }

    /// An upload inside a pass: recorded with vkCmdUpdateBuffer, ordered by
    /// the same hazard tracking as the ops around it.
    pub(super) fn record_upload(&mut self, buf: &Buffer, offset: usize, data: &[u8]) -> Result<()> {
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
        check_range(OP, buf, offset, data.len())?;
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
    pub(super) fn copy_chunk(
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
