//! KV-cache append: rows of `src` to the rows of `dst` named by positions.

use super::buffers::Store;
use crate::backend::Buffer;
use crate::error::{Error, Result};

const OP: &str = "store_rows";

pub(crate) fn run(
    store: &mut Store,
    src: &Buffer,
    dst: &Buffer,
    positions: &Buffer,
    rows: usize,
    row_len: usize,
) -> Result<()> {
    let n = rows
        .checked_mul(row_len)
        .ok_or_else(|| Error::op(OP, "rows * row_len overflows"))?;
    let pos = store.u32s(OP, "positions", positions, rows)?.to_vec();
    let data = store.f32s(OP, "src", src, n)?.to_vec();
    let out: &mut [f32] = bytemuck::cast_slice_mut(store.words_mut(OP, "dst", dst)?);
    let capacity = out.len().checked_div(row_len).unwrap_or(0);
    for (row, &p) in data.chunks_exact(row_len.max(1)).zip(&pos) {
        let p = p as usize;
        if p < capacity {
            out[p * row_len..(p + 1) * row_len].copy_from_slice(row);
        }
    }
    Ok(())
}
