//! `embedding` (glsl/embedding.comp): gather and dequantize table rows by
//! ids read from a buffer; one workgroup per output row. Ids past the table
//! are flagged in the status buffer and reported when the pass ends.

use super::super::VulkanBackend;
use super::{atomic, read, typed, u32_of, write};
use crate::backend::{check, Buffer, Weight};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    cols: u32,
    table_rows: u32,
}

impl VulkanBackend {
    pub(in crate::vk) fn encode_embedding(
        &mut self,
        table: &Weight,
        ids: &Buffer,
        out: &Buffer,
        rows: usize,
    ) -> Result<()> {
        const OP: &str = "embedding";
        check::fits(OP, "ids", ids, rows)?;
        let n = rows
            .checked_mul(table.cols)
            .ok_or_else(|| Error::op(OP, "rows * cols overflows"))?;
        check::fits(OP, "out", out, n)?;
        u32_of(OP, "table elements", table.rows.saturating_mul(table.cols))?;
        if rows == 0 || table.cols == 0 {
            return Ok(());
        }
        let push = Push {
            rows: u32_of(OP, "rows", rows)?,
            cols: u32_of(OP, "cols", table.cols)?,
            table_rows: u32_of(OP, "table rows", table.rows)?,
        };
        let groups = self.split_groups(OP, push.rows)?;
        let status = self.status;
        self.dispatch(
            OP,
            typed("embedding", table.dtype),
            &[read(&table.buf), read(ids), write(out), atomic(&status)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
