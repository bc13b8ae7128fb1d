//! `scale` (glsl/scale.comp): a grid-stride loop of 256-wide workgroups
//! over 16-byte values; the output may alias the input.

use super::Encoder;
use super::{plain, read_in_place, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::Result;
use bytemuck::{Pod, Zeroable};

/// Invocations per workgroup of the grid-stride loop.
const WG: u32 = 256;
/// At most this many workgroups, each looping: more streamed no faster
/// (benches/README.md, small kernels).
const MAX_GROUPS: usize = 1024;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    n: u32,
    s: f32,
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_scale(
        &mut self,
        x: &Buffer,
        s: f32,
        out: &Buffer,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "scale";
        check::fits(OP, "x", x, n)?;
        check::fits(OP, "out", out, n)?;
        if n == 0 {
            return Ok(());
        }
        let push = Push {
            n: u32_of(OP, "n", n)?,
            s,
        };
        let groups = self.stride_groups((n / 4).clamp(1, MAX_GROUPS * WG as usize), WG);
        self.dispatch(
            OP,
            plain("scale"),
            &[read_in_place(x), write(out)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
