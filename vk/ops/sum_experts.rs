//! `sum_experts` (glsl/sum_experts.comp): the chosen experts' outputs of
//! each row mixed by their weights, a grid-stride loop over the output.

use super::Encoder;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::Result;
use bytemuck::{Pod, Zeroable};

/// Invocations per workgroup of the grid-stride loop.
const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    total: u32,
    n: u32,
    k: u32,
    add: u32,
}

impl Encoder<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::vk) fn encode_sum_experts(
        &mut self,
        y: &Buffer,
        weights: &Buffer,
        out: &Buffer,
        rows: usize,
        k: usize,
        n: usize,
        add: bool,
    ) -> Result<()> {
        const OP: &str = "sum_experts";
        // rows * k fits where rows * k * n does, for n > 0.
        let (on, yn) = check::sum_experts(OP, rows, k, n)?;
        check::fits(OP, "y", y, yn)?;
        check::fits(OP, "weights", weights, rows.saturating_mul(k))?;
        check::fits(OP, "out", out, on)?;
        if on == 0 {
            return Ok(());
        }
        u32_of(OP, "rows * k * n", yn)?;
        let push = Push {
            total: u32_of(OP, "rows * n", on)?,
            n: u32_of(OP, "n", n)?,
            k: u32_of(OP, "k", k)?,
            add: add as u32,
        };
        // With `add` each invocation reads the value of out it writes.
        let groups = self.stride_groups(on, WG);
        self.dispatch(
            OP,
            plain("sum_experts"),
            &[read(y), read(weights), write(out)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
