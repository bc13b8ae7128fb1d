//! `rope_store` (glsl/rope_store.comp): rope on q and k plus the KV-cache
//! append, one dispatch instead of four.

use super::kv_pages::{paged, table_binding, PagePush};
use super::Encoder;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Buffer, KvPages, RopeParams, RopeStyle};
use crate::dtype::DType;
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    rot_dim: u32,
    neox: u32,
    capacity: u32,
    /// SCALED: what cos and sin are multiplied by.
    mscale: f32,
    pages: PagePush,
}

impl Encoder<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::vk) fn encode_rope_store(
        &mut self,
        q: &Buffer,
        k: &Buffer,
        v: &Buffer,
        positions: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        p: &RopeParams,
        n_kv_heads: usize,
        kv_dtype: DType,
        pages: Option<&KvPages>,
    ) -> Result<()> {
        const OP: &str = "rope_store";
        let size = check::kv_value_bytes(OP, kv_dtype)?;
        let f16 = kv_dtype == DType::F16;
        if f16 && !p.head_dim.is_multiple_of(2) {
            return Err(Error::op(
                OP,
                format!("an f16 cache needs an even head_dim, not {}", p.head_dim),
            ));
        }
        if !p.rot_dim.is_multiple_of(2) || p.rot_dim > p.head_dim {
            return Err(Error::op(
                OP,
                format!(
                    "rot_dim {} must be even and at most head_dim {}",
                    p.rot_dim, p.head_dim
                ),
            ));
        }
        let overflow = || Error::op(OP, "shape overflows");
        let kvd = n_kv_heads.checked_mul(p.head_dim).ok_or_else(overflow)?;
        let q_elems = p
            .rows
            .checked_mul(p.n_heads)
            .and_then(|v| v.checked_mul(p.head_dim))
            .ok_or_else(overflow)?;
        let kv_elems = p.rows.checked_mul(kvd).ok_or_else(overflow)?;
        check::fits(OP, "q", q, q_elems)?;
        check::fits(OP, "k", k, kv_elems)?;
        check::fits(OP, "v", v, kv_elems)?;
        check::fits(OP, "positions", positions, p.rows)?;
        if kvd == 0 || p.rows == 0 {
            return Ok(());
        }
        let capacity = (k_cache.bytes.min(v_cache.bytes) / size) / kvd;
        // f16: each k/v unit is a pair of values stored as one word.
        let kv_units = if f16 { kv_elems / 2 } else { kv_elems };
        let units = p.rows * p.n_heads * (p.rot_dim / 2) + 2 * kv_units;
        u32_of(OP, "elements", units)?;
        let push = Push {
            rows: u32_of(OP, "rows", p.rows)?,
            n_heads: u32_of(OP, "n_heads", p.n_heads)?,
            n_kv_heads: u32_of(OP, "n_kv_heads", n_kv_heads)?,
            head_dim: u32_of(OP, "head_dim", p.head_dim)?,
            rot_dim: u32_of(OP, "rot_dim", p.rot_dim)?,
            neox: (p.style == RopeStyle::Neox) as u32,
            capacity: u32_of(OP, "capacity", capacity)?,
            mscale: p.mscale(),
            pages: PagePush::new(OP, pages, p.rows, capacity)?,
        };
        // Without rotation no table is read; positions stand in at its binding.
        let table = if p.rot_dim > 0 {
            self.rope_table(push.rot_dim, p)?
        } else {
            *positions
        };
        let scaled = u32::from(p.scaling.is_some());
        let groups = self.stride_groups(units, 256);
        let status = self.status;
        self.dispatch(
            OP,
            plain("rope_store").spec(u32::from(f16) | paged(pages) << 1 | scaled << 2),
            &[
                write(q),
                read(k),
                read(v),
                read(positions),
                read(&table),
                write(k_cache),
                write(v_cache),
                table_binding(pages, &status),
            ],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
