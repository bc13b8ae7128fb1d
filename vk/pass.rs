//! The life of a pass: recording into a command buffer (after zeroing the
//! buffers allocated since the last one), submitting, and the checks after
//! it (validation messages, the status words shaders flag bad inputs in).

use super::recorder::Slot;
use super::{VulkanBackend, STATUS_BYTES};
use crate::backend::{Buffer, ComputeBackend};
use crate::error::{Error, Result};
use ash::vk;
use std::time::Instant;

impl VulkanBackend {
    /// Zero buffers allocated since the last submit, in a submit of their
    /// own, so a pass (and its stats) holds only the work recorded into it.
    pub(super) fn flush_fills(&mut self) -> Result<()> {
        if !self.pending_fills.is_empty() {
            self.begin_recording(Slot::Transfer)?;
            self.finish_recording()?;
        }
        Ok(())
    }

    pub(super) fn begin_pass_in(&mut self, slot: Slot) -> Result<()> {
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

    /// Begin a command buffer, zeroing buffers allocated since the last one.
    pub(super) fn begin_recording(&mut self, slot: Slot) -> Result<()> {
        self.rec.begin(slot)?;
        // The previous submission has completed, so the host may reset it.
        self.mem.get_mut(self.status.id)?.mapped()?[..STATUS_BYTES].fill(0);
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
    pub(super) fn finish_recording(&mut self) -> Result<()> {
        let result = self.rec.submit();
        if result.is_err() {
            self.forget_tables();
        }
        self.release_frees();
        result?;
        self.check_after_submit()
    }

    /// Validation messages and the status words of the submit just finished.
    pub(super) fn check_after_submit(&mut self) -> Result<()> {
        self.inst.check_messages()?;
        let status = self.mem.get_mut(self.status.id)?.mapped()?;
        let word =
            |i: usize| u32::from_le_bytes([status[i], status[i + 1], status[i + 2], status[i + 3]]);
        let (bad_id, bad_pos, bad_page) = (word(0), word(4), word(8));
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
        if bad_page != 0 {
            return Err(Error::op(
                "attention",
                format!("a page table names page {}, outside the pool", bad_page - 1),
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
        self.mem.get_mut(self.status.id)?.mapped()?[..STATUS_BYTES].fill(0);
        self.rec.resubmit_pass()?;
        self.check_after_submit()
    }

    /// Drop cached tables whose contents were written by a command buffer
    /// that may never have run; they are rebuilt on next use.
    fn forget_tables(&mut self) {
        let tables: Vec<Buffer> = self.ops.rope_tables.drain().map(|(_, b)| b).collect();
        for t in tables {
            self.free(t);
        }
    }

    /// End a pass recorded in a kernel survey without running it, and
    /// release the buffers freed while it was recorded.
    pub(super) fn discard_pass(&mut self) -> Result<()> {
        let result = self.rec.discard();
        self.release_frees();
        self.pass_allocs = false;
        result
    }

    /// Destroy the buffers freed while the last command buffer was
    /// recorded, now that it has run or never will.
    fn release_frees(&mut self) {
        for id in std::mem::take(&mut self.pending_frees) {
            self.mem.free(id);
        }
    }

    /// After a kernel survey, whose passes never ran: drop what encoders
    /// keep between passes on the word of commands recorded there (the rope
    /// tables, and the decode attention's arrival counts, zeroed by a fill
    /// in the pass that made them); both are made again on next use.
    pub(super) fn forget_unwritten(&mut self) {
        self.forget_tables();
        if let Some(b) = self.ops.attn_arrivals.take() {
            self.free(b);
        }
    }
}
