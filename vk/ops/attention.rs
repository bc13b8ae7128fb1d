//! `attention`. Decode (a few rows): glsl/attention.comp, one workgroup per
//! (head, row, key split), the cache split so a long context still fills the
//! GPU, then glsl/attention_combine.comp merges the splits. Prefill (more
//! rows): glsl/attention_prefill.comp, tiles of query rows of one GQA group
//! against key tiles in shared memory, so the cache is read once per tile of
//! rows instead of once per (row, head); head dims it cannot take fall back
//! to attention.comp without splits.

use super::super::VulkanBackend;
use super::{atomic, plain, read, u32_of, write};
use crate::backend::{check, AttentionParams, Buffer};
use crate::error::{Error, Result};
use crate::vk::caps::PrefillAttention;
use bytemuck::{Pod, Zeroable};

/// The shader keeps 8 output dims per invocation of a 64-wide workgroup.
const MAX_HEAD_DIM: usize = 512;
/// Rows up to which the keys are split across workgroups.
const SPLIT_MAX_ROWS: usize = 4;
/// Keys per split at least, and the most splits.
const SPLIT_KEYS: usize = 32;
const MAX_SPLITS: usize = 64;
/// attention_prefill.comp: invocations, keys per tile, most head_dim (its
/// register tile holds BR * head_dim / 128 <= 32 floats per invocation).
const FLASH_WG: usize = 128;
const FLASH_BC: usize = 32;
const FLASH_MAX_HEAD_DIM: usize = 128;

/// Shared memory attention_prefill.comp declares for `br` query vectors per
/// tile (mirrors its declarations).
fn flash_shared_bytes(br: usize, head_dim: usize) -> usize {
    let qs = head_dim / 4 + 1;
    (br + FLASH_BC) * qs * 16 + br * (FLASH_BC + 1) * 4 + 5 * br * 4
}

/// Query vectors per attention_prefill.comp workgroup for `head_dim`, or
/// None where the kernel cannot take it: 32 when it fits the device's shared
/// memory (more K/V reuse), else 16.
pub(in crate::vk) fn flash_tile(head_dim: usize, max_shared: u32) -> Option<usize> {
    if head_dim == 0 || !head_dim.is_multiple_of(4) || head_dim > FLASH_MAX_HEAD_DIM {
        return None;
    }
    [32, 16].into_iter().find(|&br| {
        (br * FLASH_BC).is_multiple_of(FLASH_WG)
            && flash_shared_bytes(br, head_dim) <= max_shared as usize
    })
}

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
    n_split: u32,
    split_len: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct CombinePush {
    rows: u32,
    n_heads: u32,
    head_dim: u32,
    n_split: u32,
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
        // The split depends on the capacity only, never on positions, so a
        // recorded pass stays valid for any position.
        let n_split = if p.rows <= SPLIT_MAX_ROWS {
            p.capacity.div_ceil(SPLIT_KEYS).clamp(1, MAX_SPLITS)
        } else {
            1
        };
        let split_len = p.capacity.div_ceil(n_split);
        let push = Push {
            rows: u32_of(OP, "rows", p.rows)?,
            n_heads: u32_of(OP, "n_heads", p.n_heads)?,
            n_kv_heads: u32_of(OP, "n_kv_heads", p.n_kv_heads)?,
            head_dim: u32_of(OP, "head_dim", p.head_dim)?,
            capacity: u32_of(OP, "capacity", p.capacity)?,
            scale: p.scale,
            window: u32_of(OP, "window", p.window)?,
            n_split: n_split as u32,
            split_len: u32_of(OP, "split_len", split_len)?,
        };
        let max = self.caps().max_workgroup_count;
        if push.n_heads > max[0] || push.rows > max[1] {
            return Err(Error::op(
                OP,
                "rows or heads exceed the device's workgroup limits",
            ));
        }
        let status = self.status;
        if p.rows > SPLIT_MAX_ROWS && self.kernels.attention == PrefillAttention::Flash {
            if let Some(br) = flash_tile(p.head_dim, self.caps().max_shared_memory) {
                let group = p.n_heads / p.n_kv_heads;
                let q_tiles = p.rows.checked_mul(group).ok_or_else(overflow)?.div_ceil(br);
                let q_tiles = u32_of(OP, "query tiles", q_tiles)?;
                if q_tiles > max[0] || push.n_kv_heads > max[1] {
                    return Err(Error::op(
                        OP,
                        "rows or heads exceed the device's workgroup limits",
                    ));
                }
                // Specialization constant 0: head_dim | BR << 16 (see the shader).
                let spec = push.head_dim | ((br as u32) << 16);
                return self.dispatch(
                    OP,
                    plain("attention_prefill").spec(spec),
                    &[
                        read(q),
                        read(k_cache),
                        read(v_cache),
                        read(positions),
                        write(out),
                        atomic(&status),
                    ],
                    bytemuck::bytes_of(&push),
                    [q_tiles, push.n_kv_heads, 1],
                );
            }
        }
        let part = self.scratch(
            |b| &mut b.attn_scratch,
            p.rows * p.n_heads * n_split * (p.head_dim + 2) * 4,
        )?;
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
                write(&part),
            ],
            bytemuck::bytes_of(&push),
            [push.n_heads, push.rows, push.n_split],
        )?;
        if n_split == 1 {
            return Ok(());
        }
        let combine = CombinePush {
            rows: push.rows,
            n_heads: push.n_heads,
            head_dim: push.head_dim,
            n_split: push.n_split,
        };
        self.dispatch(
            OP,
            plain("attention_combine"),
            &[read(&part), write(out)],
            bytemuck::bytes_of(&combine),
            [push.n_heads, push.rows, 1],
        )
    }
}
