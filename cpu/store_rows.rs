//! KV-cache append: rows of `src` to the rows of `dst` named by positions.

use super::attention::CacheRows;
use super::buffers::Store;
use crate::backend::{Buffer, KvPages};
use crate::error::{Error, Result};

const OP: &str = "store_rows";

pub(crate) fn run(
    store: &mut Store,
    src: &Buffer,
    dst: &Buffer,
    positions: &Buffer,
    rows: usize,
    row_len: usize,
    pages: Option<&KvPages>,
) -> Result<()> {
    let n = rows
        .checked_mul(row_len)
        .ok_or_else(|| Error::op(OP, "rows * row_len overflows"))?;
    let data = store.f32s(OP, "src", src, n)?.to_vec();
    write_rows(store, &data, dst, positions, rows, row_len, pages)
}

/// `rows` rows of `row_len` values from `data` into the cache rows of
/// their positions (through `pages`' tables when paged); a position past
/// the cache, or whose page is outside the pool, stores nothing.
pub(crate) fn write_rows(
    store: &mut Store,
    data: &[f32],
    dst: &Buffer,
    positions: &Buffer,
    rows: usize,
    row_len: usize,
    pages: Option<&KvPages>,
) -> Result<()> {
    let pos = store.u32s(OP, "positions", positions, rows)?.to_vec();
    let table = match pages {
        Some(pg) => Some(
            store
                .u32s(OP, "page table", &pg.table, pg.table.bytes / 4)?
                .to_vec(),
        ),
        None => None,
    };
    let cache = CacheRows::new(table.as_deref(), pages);
    let out: &mut [f32] = bytemuck::cast_slice_mut(store.words_mut(OP, "dst", dst)?);
    let capacity = out.len().checked_div(row_len).unwrap_or(0);
    for (r, (row, &p)) in data.chunks_exact(row_len.max(1)).zip(&pos).enumerate() {
        match cache.row(r, p as usize) {
            Some(at) if at < capacity => out[at * row_len..(at + 1) * row_len].copy_from_slice(row),
            _ => {}
        }
    }
    Ok(())
}
