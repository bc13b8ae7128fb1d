//! `round_i8` (glsl/round_i8.comp): one workgroup per row; the output may
//! alias the input.

use super::Encoder;
use super::{plain, read_in_place, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    dim: u32,
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_round_i8(
        &mut self,
        x: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
    ) -> Result<()> {
        const OP: &str = "round_i8";
        if dim == 0 {
            return Err(Error::op(OP, "dim must be positive"));
        }
        let n = rows
            .checked_mul(dim)
            .ok_or_else(|| Error::op(OP, "rows * dim overflows"))?;
        check::fits(OP, "x", x, n)?;
        check::fits(OP, "out", out, n)?;
        if rows == 0 {
            return Ok(());
        }
        let push = Push {
            rows: u32_of(OP, "rows", rows)?,
            dim: u32_of(OP, "dim", dim)?,
        };
        let groups = self.split_groups(OP, push.rows)?;
        self.dispatch(
            OP,
            plain("round_i8"),
            &[read_in_place(x), write(out)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
