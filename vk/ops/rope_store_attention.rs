//! `rope_store_attention`: a decode step (one row) in one dispatch of
//! glsl/attention_decode.comp in its ROPE mode, which ropes q as it loads it
//! and appends the row's k and v to the cache in the workgroups whose key
//! split holds the row's position (paged caches too: the row's table
//! names the cache row); everything else as `rope_store` then `attention`.

use super::attention::{cache_rows, Append};
use super::Encoder;
use crate::backend::{check, AttentionParams, Buffer, RopeParams, RopeStyle};
use crate::error::{Error, Result};

impl Encoder<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::vk) fn encode_rope_store_attention(
        &mut self,
        q: &Buffer,
        k: &Buffer,
        v: &Buffer,
        positions: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        rope: &RopeParams,
        p: &AttentionParams,
        out: &Buffer,
    ) -> Result<()> {
        const OP: &str = "attention";
        if (rope.rows, rope.n_heads, rope.head_dim) != (p.rows, p.n_heads, p.head_dim) {
            return Err(Error::op(
                OP,
                "the rope and attention parameters describe different rows or heads",
            ));
        }
        let plan = self.decode_plan(p);
        let fused = self.kernels.decode_rope
            && p.rows == 1
            && p.n_kv_heads > 0
            && p.n_heads.is_multiple_of(p.n_kv_heads)
            && rope.rot_dim.is_multiple_of(2)
            && rope.rot_dim <= rope.head_dim;
        let Some(plan) = plan.filter(|_| fused) else {
            self.encode_rope_store(
                q,
                k,
                v,
                positions,
                k_cache,
                v_cache,
                rope,
                p.n_kv_heads,
                p.kv_dtype,
                p.pages.as_ref(),
            )?;
            return self.encode_attention(q, k_cache, v_cache, positions, out, p);
        };
        let kvd = p.n_kv_heads * p.head_dim;
        let cache = cache_rows(OP, p)?
            .checked_mul(kvd)
            .ok_or_else(|| Error::op(OP, "shape overflows"))?;
        check::fits(OP, "q", q, p.n_heads * p.head_dim)?;
        check::fits(OP, "out", out, p.n_heads * p.head_dim)?;
        check::fits(OP, "k", k, kvd)?;
        check::fits(OP, "v", v, kvd)?;
        check::fits(OP, "positions", positions, 1)?;
        if let Some(s) = &p.sinks {
            check::fits(OP, "sinks", s, p.n_heads)?;
        }
        check::fits_kv(OP, "k_cache", k_cache, cache, p.kv_dtype)?;
        check::fits_kv(OP, "v_cache", v_cache, cache, p.kv_dtype)?;
        let rot_dim = rope.rot_dim as u32;
        // Without rotation none are read; positions stand in for them.
        let rotations = if rot_dim > 0 {
            self.step_rotations(positions, rot_dim, rope)?
        } else {
            *positions
        };
        let append = Append {
            k,
            v,
            rotations,
            rot_dim,
            neox: rope.style == RopeStyle::Neox,
        };
        self.encode_attention_decode([q, k_cache, v_cache, positions, out], p, plan, Some(append))
    }
}
