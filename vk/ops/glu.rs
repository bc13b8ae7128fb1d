//! `glu` (glsl/glu.comp): `act(gate) * up` (gpt-oss's SwiGLU: its clamped
//! mix) over a grid-stride loop of 256-wide workgroups, also over rows of a
//! gate_up product (`linear_glu`).

use super::Encoder;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Activation, Buffer};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// Invocations per workgroup of the grid-stride loop.
const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    n: u32,
    act: u32,
    has_up: u32,
    /// Nonzero: gate and up are halves of rows of `2 * row` values in `gate`.
    row: u32,
}

/// glu.comp's (and mul_mat_vec.comp's GLU) code of an activation.
pub(super) fn act_code(act: Activation) -> u32 {
    match act {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
        Activation::SwigluOai => 2,
        Activation::Relu2 => 3,
    }
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_glu(
        &mut self,
        act: Activation,
        gate: &Buffer,
        up: Option<&Buffer>,
        out: &Buffer,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "glu";
        check::fits(OP, "gate", gate, n)?;
        check::fits(OP, "out", out, n)?;
        if let Some(u) = up {
            check::fits(OP, "up", u, n)?;
        }
        if act == Activation::SwigluOai && up.is_none() {
            return Err(Error::op(OP, "the gpt-oss SwiGLU needs an up input"));
        }
        if n == 0 {
            return Ok(());
        }
        let push = Push {
            n: u32_of(OP, "n", n)?,
            act: act_code(act),
            has_up: up.is_some() as u32,
            row: 0,
        };
        let groups = self.stride_groups(n, WG);
        // Without `up`, gate stands in at binding 1 (never read).
        let binds = [read(gate), read(up.unwrap_or(gate)), write(out)];
        self.dispatch(OP, plain("glu"), &binds, bytemuck::bytes_of(&push), groups)
    }

    /// `out[r, i] = act(gu[r, i]) * gu[r, n + i]` for `rows` rows of `2n` values.
    pub(in crate::vk) fn encode_glu_rows(
        &mut self,
        act: Activation,
        gu: &Buffer,
        out: &Buffer,
        rows: usize,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "glu";
        let total = rows
            .checked_mul(n)
            .ok_or_else(|| Error::op(OP, "rows * n overflows"))?;
        check::fits(OP, "gate_up", gu, total.saturating_mul(2))?;
        check::fits(OP, "out", out, total)?;
        if total == 0 {
            return Ok(());
        }
        let push = Push {
            n: u32_of(OP, "n", total)?,
            act: act_code(act),
            has_up: 1,
            row: u32_of(OP, "row", n)?,
        };
        let groups = self.stride_groups(total, WG);
        let binds = [read(gu), read(gu), write(out)];
        self.dispatch(OP, plain("glu"), &binds, bytemuck::bytes_of(&push), groups)
    }
}
