//! `attention` (glsl/attention.comp): one workgroup per (head, row).

use super::super::VulkanBackend;
use super::{atomic, plain, read, u32_of, write};
use crate::backend::{check, AttentionParams, Buffer};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// The shader keeps 8 output dims per invocation of a 64-wide workgroup.
const MAX_HEAD_DIM: usize = 512;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    scale: f32,
    window: u32,
}

impl VulkanBackend {
    pub(in crate::vk) fn encode_attention(
        &mut self,
        q: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        positions: &Buffer,
        out: &Buffer,
        p: &AttentionParams,
    ) -> Result<()> {
        const OP: &str = "attention";
        if p.n_heads == 0 || p.n_kv_heads == 0 || !p.n_heads.is_multiple_of(p.n_kv_heads) {
            return Err(Error::op(
                OP,
                format!(
                    "n_heads {} must be a positive multiple of n_kv_heads {}",
                    p.n_heads, p.n_kv_heads
                ),
            ));
        }
        if p.head_dim == 0 || p.head_dim > MAX_HEAD_DIM {
            return Err(Error::op(
                OP,
                format!("head_dim {} must be in 1..={MAX_HEAD_DIM}", p.head_dim),
            ));
        }
        let overflow = || Error::op(OP, "shape overflows");
        let q_elems = p
            .rows
            .checked_mul(p.n_heads * p.head_dim)
            .ok_or_else(overflow)?;
        let kv_elems = p
            .capacity
            .checked_mul(p.n_kv_heads * p.head_dim)
            .ok_or_else(overflow)?;
        check::fits(OP, "q", q, q_elems)?;
        check::fits(OP, "out", out, q_elems)?;
        check::fits(OP, "k_cache", k_cache, kv_elems)?;
        check::fits(OP, "v_cache", v_cache, kv_elems)?;
        check::fits(OP, "positions", positions, p.rows)?;
        if p.rows == 0 {
            return Ok(());
        }
        let push = Push {
            rows: u32_of(OP, "rows", p.rows)?,
            n_heads: u32_of(OP, "n_heads", p.n_heads)?,
            n_kv_heads: u32_of(OP, "n_kv_heads", p.n_kv_heads)?,
            head_dim: u32_of(OP, "head_dim", p.head_dim)?,
            capacity: u32_of(OP, "capacity", p.capacity)?,
            scale: p.scale,
            window: u32_of(OP, "window", p.window)?,
        };
        let max = self.caps().max_workgroup_count;
        if push.n_heads > max[0] || push.rows > max[1] {
            return Err(Error::op(
                OP,
                "rows or heads exceed the device's workgroup limits",
            ));
        }
        let status = self.status;
        self.dispatch(
            OP,
            plain("attention"),
            &[
                read(q),
                read(k_cache),
                read(v_cache),
                read(positions),
                write(out),
                atomic(&status),
            ],
            bytemuck::bytes_of(&push),
            [push.n_heads, push.rows, 1],
        )
    }
}
