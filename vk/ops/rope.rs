//! `rope` (glsl/rope.comp): in place, per-row positions from a buffer.

use super::super::VulkanBackend;
use super::{read, u32_of, write};
use crate::backend::{check, Buffer, RopeParams, RopeStyle};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    n_heads: u32,
    head_dim: u32,
    rot_dim: u32,
    base: f32,
    neox: u32,
}

impl VulkanBackend {
    pub(in crate::vk) fn encode_rope(
        &mut self,
        x: &Buffer,
        positions: &Buffer,
        p: &RopeParams,
    ) -> Result<()> {
        const OP: &str = "rope";
        if p.rot_dim % 2 != 0 || p.rot_dim > p.head_dim {
            return Err(Error::op(
                OP,
                format!(
                    "rot_dim {} must be even and at most head_dim {}",
                    p.rot_dim, p.head_dim
                ),
            ));
        }
        let n = p
            .rows
            .checked_mul(p.n_heads)
            .and_then(|v| v.checked_mul(p.head_dim))
            .ok_or_else(|| Error::op(OP, "rows * n_heads * head_dim overflows"))?;
        check::fits(OP, "x", x, n)?;
        check::fits(OP, "positions", positions, p.rows)?;
        let pairs = p.rows * p.n_heads * (p.rot_dim / 2);
        if pairs == 0 {
            return Ok(());
        }
        u32_of(OP, "rotated pairs", pairs)?;
        let push = Push {
            rows: u32_of(OP, "rows", p.rows)?,
            n_heads: u32_of(OP, "n_heads", p.n_heads)?,
            head_dim: u32_of(OP, "head_dim", p.head_dim)?,
            rot_dim: u32_of(OP, "rot_dim", p.rot_dim)?,
            base: p.base,
            neox: (p.style == RopeStyle::Neox) as u32,
        };
        let groups = self.stride_groups(pairs, 256);
        self.dispatch(
            OP,
            "rope",
            0,
            &[write(x), read(positions)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
