//! `append_token` (glsl/append_token.comp): greedy feedback between decode
//! steps submitted back to back.

use super::Encoder;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::Result;
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    len: u32,
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_append_token(
        &mut self,
        ids: &Buffer,
        positions: &Buffer,
        history: &Buffer,
    ) -> Result<()> {
        const OP: &str = "append_token";
        check::fits(OP, "ids", ids, 1)?;
        check::fits(OP, "positions", positions, 1)?;
        check::fits(OP, "history", history, 1)?;
        let push = Push {
            len: u32_of(OP, "history values", history.bytes / 4)?,
        };
        self.dispatch(
            OP,
            plain("append_token"),
            &[read(ids), write(positions), write(history)],
            bytemuck::bytes_of(&push),
            [1, 1, 1],
        )
    }
}
