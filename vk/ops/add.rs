//! `add` (glsl/add.comp): a grid-stride loop of 256-wide workgroups; the
//! output may alias either input.

use super::Encoder;
use super::{plain, read_in_place, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::Result;
use bytemuck::{Pod, Zeroable};

/// Invocations per workgroup of the grid-stride loop.
const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    n: u32,
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_add(
        &mut self,
        a: &Buffer,
        b: &Buffer,
        out: &Buffer,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "add";
        check::fits(OP, "a", a, n)?;
        check::fits(OP, "b", b, n)?;
        check::fits(OP, "out", out, n)?;
        if n == 0 {
            return Ok(());
        }
        let push = Push {
            n: u32_of(OP, "n", n)?,
        };
        let groups = self.stride_groups(n, WG);
        self.dispatch(
            OP,
            plain("add"),
            &[read_in_place(a), read_in_place(b), write(out)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
