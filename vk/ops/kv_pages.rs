//! A paged KV cache on the device (glsl/kv_pages.glsl): the push-constant
//! words and the binding of the page table that every kernel touching the
//! cache takes. Unpaged, a kernel's PAGED specialization bit is off: it
//! reads no table and pays nothing, and the status words stand in at the
//! binding.

use super::{atomic, read, u32_of, Bind};
use crate::backend::{Buffer, KvPages};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// glsl/kv_pages.glsl's push constants (all 0 unpaged).
#[repr(C)]
#[derive(Clone, Copy, Default, Pod, Zeroable)]
pub(super) struct PagePush {
    pub page_log2: u32,
    /// Table entries from one row's table to the next (0: one shared table).
    pub page_stride: u32,
    /// Pages a kernel may follow: the pool, capped at the pages the cache
    /// buffers hold, so a page past it is never read or written.
    pub n_pages: u32,
    /// Entries of the table buffer: store_rows and rope_store bound their
    /// positions by it (they have no capacity to check them against).
    pub table_len: u32,
}

impl PagePush {
    /// The words for `pages` over `rows` rows whose cache buffers hold
    /// `cache_rows` rows; zeros unpaged.
    pub fn new(
        op: &'static str,
        pages: Option<&KvPages>,
        rows: usize,
        cache_rows: usize,
    ) -> Result<PagePush> {
        let Some(pg) = pages else {
            return Ok(PagePush::default());
        };
        if pg.page_log2 >= 31 {
            return Err(Error::op(
                op,
                format!("pages of 2^{} positions are too long", pg.page_log2),
            ));
        }
        // Row r's table starts at r * stride, computed in 32 bits.
        let last = rows
            .saturating_sub(1)
            .checked_mul(pg.stride)
            .ok_or_else(|| Error::op(op, "page tables overflow"))?;
        u32_of(op, "page table offset", last)?;
        Ok(PagePush {
            page_log2: pg.page_log2,
            page_stride: u32_of(op, "page table stride", pg.stride)?,
            n_pages: u32_of(op, "pages", pg.pages.min(cache_rows >> pg.page_log2))?,
            table_len: u32::try_from(pg.table.bytes / 4).unwrap_or(u32::MAX),
        })
    }
}

/// The PAGED specialization bit's value.
pub(super) fn paged(pages: Option<&KvPages>) -> u32 {
    u32::from(pages.is_some())
}

/// The page table's binding: the table, or (unpaged, never read) the
/// status words, which no barrier tracking sees.
pub(super) fn table_binding<'a>(pages: Option<&'a KvPages>, status: &'a Buffer) -> Bind<'a> {
    match pages {
        Some(pg) => read(&pg.table),
        None => atomic(status),
    }
}
