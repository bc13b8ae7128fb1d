//! The attention front in one op: rope on q (in place) and on k as it is
//! stored into the cache row of its position; v stored beside it.

use super::buffers::Store;
use super::{rope, store_rows};
use crate::backend::{Buffer, KvPages, RopeParams};
use crate::error::{Error, Result};

const OP: &str = "rope_store";

/// The k and v halves; `p` describes q (its `n_heads`), k has `n_kv_heads`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_kv(
    store: &mut Store,
    par: bool,
    k: &Buffer,
    v: &Buffer,
    positions: &Buffer,
    k_cache: &Buffer,
    v_cache: &Buffer,
    p: &RopeParams,
    n_kv_heads: usize,
    pages: Option<&KvPages>,
) -> Result<()> {
    let kp = RopeParams {
        n_heads: n_kv_heads,
        ..*p
    };
    let n = rope::check(&kp)?;
    let pos = store.u32s(OP, "positions", positions, p.rows)?.to_vec();
    let mut roped = store.f32s(OP, "k", k, n)?.to_vec();
    rope::run(par, &mut roped, &pos, &kp);
    let kvd = n_kv_heads
        .checked_mul(p.head_dim)
        .ok_or_else(|| Error::op(OP, "n_kv_heads * head_dim overflows"))?;
    store_rows::write_rows(store, &roped, k_cache, positions, p.rows, kvd, pages)?;
    store_rows::run(store, v, v_cache, positions, p.rows, kvd, pages)
}
