//! `argmax` (glsl/argmax.comp): one workgroup per row, `u32` results.

use super::super::VulkanBackend;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    n: u32,
}

impl VulkanBackend {
    pub(in crate::vk) fn encode_argmax(
        &mut self,
        x: &Buffer,
        out: &Buffer,
        rows: usize,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "argmax";
        if n == 0 {
            return Err(Error::op(OP, "rows must have at least one value"));
        }
        let total = rows
            .checked_mul(n)
            .ok_or_else(|| Error::op(OP, "rows * n overflows"))?;
        check::fits(OP, "x", x, total)?;
        check::fits(OP, "out", out, rows)?;
        if rows == 0 {
            return Ok(());
        }
        let push = Push {
            rows: u32_of(OP, "rows", rows)?,
            n: u32_of(OP, "n", n)?,
        };
        let groups = self.split_groups(OP, push.rows)?;
        self.dispatch(
            OP,
            plain("argmax"),
            &[read(x), write(out)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
