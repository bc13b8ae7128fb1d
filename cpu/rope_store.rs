//! The attention front in one op: rope on q (in place) and on k as it is
//! stored into the cache row of its position; v stored beside it.

use super::buffers::Store;
use super::{rope, store_rows};
use crate::backend::{Buffer, RopeParams};
use crate::error::{Error, Result};

const OP: &str = "rope_store";

/// The k and v halves; `p` describes q (its `n_heads`), k has `n_kv_heads`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_kv(
    store: &mut Store,
    k: &Buffer,
    v: &Buffer,
    positions: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    p: &RopeParams,
    n_kv_heads: usize,
) -> Result<()> {
    let kp = RopeParams {
        n_heads: n_kv_heads,
        ..*p
    };
    let n = rope::check(&kp)?;
    let pos = store.u32s(OP, "positions", positions, p.rows)?.to_vec();
    let mut roped = store.f32s(OP, "k", k, n)?.to_vec();
    rope::run(false, &mut roped, &pos, &kp);
    let kvd = n_kv_heads
        .checked_mul(p.head_dim)
        .ok_or_else(|| Error::op(OP, "n_kv_heads * head_dim overflows"))?;
    let out: &mut [f32] = bytemuck::cast_slice_mut(store.words_mut(OP, "k_cache", k_cache)?);
    let capacity = out.len() / kvd.max(1);
    for (row, &at) in roped.chunks_exact(kvd.max(1)).zip(&pos) {
        let at = at as usize;
        if at < capacity {
            out[at * kvd..(at + 1) * kvd].copy_from_slice(row);
        }
    }
    store_rows::run(store, v, v_cache, positions, p.rows, kvd)
}
