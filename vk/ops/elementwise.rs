//! Elementwise ops: `glu` (glsl/glu.comp), `add` (glsl/add.comp), `scale`
//! (glsl/scale.comp), each a grid-stride loop of 256-wide workgroups.

use super::Encoder;
use super::{plain, read, read_in_place, u32_of, write};
use crate::backend::{check, Activation, Buffer};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

const WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GluPush {
    n: u32,
    gelu: u32,
    has_up: u32,
    /// Nonzero: gate and up are halves of rows of `2 * row` values in `gate`.
    row: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AddPush {
    n: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ScalePush {
    n: u32,
    s: f32,
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
        if n == 0 {
            return Ok(());
        }
        let push = GluPush {
            n: u32_of(OP, "n", n)?,
            gelu: (act == Activation::GeluTanh) as u32,
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
        let push = GluPush {
            n: u32_of(OP, "n", total)?,
            gelu: (act == Activation::GeluTanh) as u32,
            has_up: 1,
            row: u32_of(OP, "row", n)?,
        };
        let groups = self.stride_groups(total, WG);
        let binds = [read(gu), read(gu), write(out)];
        self.dispatch(OP, plain("glu"), &binds, bytemuck::bytes_of(&push), groups)
    }

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
        let push = AddPush {
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
        let push = ScalePush {
            n: u32_of(OP, "n", n)?,
            s,
        };
        let groups = self.stride_groups(n, WG);
        self.dispatch(
            OP,
            plain("scale"),
            &[read_in_place(x), write(out)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
