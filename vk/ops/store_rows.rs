//! `store_rows` (glsl/store_rows.comp): the KV-cache append at positions
//! read on the device.

use super::kv_pages::{paged, table_binding, PagePush};
use super::Encoder;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Buffer, KvPages};
use crate::dtype::DType;
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    row_len: u32,
    capacity: u32,
    pages: PagePush,
}

impl Encoder<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(in crate::vk) fn encode_store_rows(
        &mut self,
        src: &Buffer,
        dst: &Buffer,
        positions: &Buffer,
        rows: usize,
        row_len: usize,
        dst_dtype: DType,
        pages: Option<&KvPages>,
    ) -> Result<()> {
        const OP: &str = "store_rows";
        let size = check::kv_value_bytes(OP, dst_dtype)?;
        let f16 = dst_dtype == DType::F16;
        if f16 && !row_len.is_multiple_of(2) {
            return Err(Error::op(
                OP,
                format!("an f16 destination needs an even row length, not {row_len}"),
            ));
        }
        let n = rows
            .checked_mul(row_len)
            .ok_or_else(|| Error::op(OP, "rows * row_len overflows"))?;
        check::fits(OP, "src", src, n)?;
        check::fits(OP, "positions", positions, rows)?;
        if n == 0 {
            return Ok(());
        }
        let capacity = dst.bytes / size / row_len;
        let push = Push {
            rows: u32_of(OP, "rows", rows)?,
            row_len: u32_of(OP, "row_len", row_len)?,
            capacity: u32_of(OP, "capacity", capacity)?,
            pages: PagePush::new(OP, pages, rows, capacity)?,
        };
        // f16: one invocation per pair of values (specialization constant 0).
        let groups = self.stride_groups(if f16 { n / 2 } else { n }, 256);
        let status = self.status;
        self.dispatch(
            OP,
            plain("store_rows").spec(u32::from(f16) | paged(pages) << 1),
            &[
                read(src),
                write(dst),
                read(positions),
                table_binding(pages, &status),
            ],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
