//! `embedding` (glsl/embedding.comp): gather and dequantize table rows by
//! ids read from a buffer; one workgroup per output row and slice of
//! [`EMBEDDING_COLS`] columns. Ids past the table
//! are flagged in the status buffer and reported when the pass ends.

use super::Encoder;
use super::{atomic, read, typed, u32_of, write};
use crate::backend::{check, Buffer, Weight};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// Columns one workgroup writes (embedding.comp's local size).
const EMBEDDING_COLS: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    cols: u32,
    /// Rows of this part of the table (all of them unless split, vk/weight_parts.rs).
    table_rows: u32,
    /// The part's first row: ids outside `[row0, row0 + table_rows)` are
    /// another part's to write.
    row0: u32,
    /// Rows of the whole table: ids past it are flagged.
    total_rows: u32,
}

impl Encoder<'_> {
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
        if rows == 0 || table.cols == 0 {
            return Ok(());
        }
        // One dispatch per part of a split table, each writing the rows whose ids it holds.
        for i in 0..self.splits.parts(table) {
            let (part, row0) = self.splits.part(table, i)?;
            u32_of(OP, "table elements", part.rows.saturating_mul(part.cols))?;
            let push = Push {
                rows: u32_of(OP, "rows", rows)?,
                cols: u32_of(OP, "cols", table.cols)?,
                table_rows: u32_of(OP, "table rows", part.rows)?,
                row0: u32_of(OP, "row0", row0)?,
                total_rows: u32_of(OP, "table rows", table.rows)?,
            };
            let [x, y, _] = self.split_groups(OP, push.rows)?;
            let slices = u32_of(OP, "column slices", table.cols.div_ceil(EMBEDDING_COLS))?;
            if slices > self.caps().max_workgroup_count[2] {
                return Err(Error::op(
                    OP,
                    "columns exceed the device's workgroup limits",
                ));
            }
            let groups = [x, y, slices];
            let status = self.status;
            self.dispatch(
                OP,
                typed("embedding", table.dtype),
                &[read(&part.buf), read(ids), write(out), atomic(&status)],
                bytemuck::bytes_of(&push),
                groups,
            )?;
        }
        Ok(())
    }
}
