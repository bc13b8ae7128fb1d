//! Weights larger than one storage-buffer binding may cover.
//!
//! A binding spans at most `maxStorageBufferRange` bytes: 128 MiB on
//! lavapipe, 4 GiB on NVIDIA. Gemma 3's 262,144 × 640 token embedding (also
//! its tied output head) is 189 MB even as Q8_0. Such a weight is stored as
//! several buffers of whole rows, each within the range; matmul and embedding
//! dispatch once per part, the shaders taking the part's first row (`row0`)
//! to place its output columns or pick its table rows. The weight's own
//! `buf` is its first part and keys the list of all parts.

use super::{layout, VulkanBackend};
use crate::backend::{Buffer, ComputeBackend, Weight};
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::collections::HashMap;

/// Rows `[row0, row0 + rows)` of a split weight, in a buffer of their own.
#[derive(Clone, Copy, Debug)]
pub(super) struct Part {
    pub buf: Buffer,
    pub row0: usize,
    pub rows: usize,
}

/// The parts of every split weight, by their first part's id.
#[derive(Default)]
pub(super) struct Splits(HashMap<u32, Vec<Part>>);

impl Splits {
    /// Number of parts of `w` (1 unless split).
    pub(super) fn parts(&self, w: &Weight) -> usize {
        self.0.get(&w.buf.id).map_or(1, Vec::len)
    }

    /// Part `i` of `w` as a weight of its own, and its first row in `w`.
    pub(super) fn part(&self, w: &Weight, i: usize) -> Result<(Weight, usize)> {
        match self.0.get(&w.buf.id) {
            None if i == 0 => Ok((*w, 0)),
            None => Err(Error::Invalid(format!(
                "weight part {i} of an unsplit weight"
            ))),
            Some(parts) => {
                let p = parts
                    .get(i)
                    .ok_or_else(|| Error::Invalid(format!("weight part {i} of {}", parts.len())))?;
                Ok((
                    Weight {
                        buf: p.buf,
                        dtype: w.dtype,
                        rows: p.rows,
                        cols: w.cols,
                    },
                    p.row0,
                ))
            }
        }
    }
}

impl VulkanBackend {
    /// Split weights uploaded from now on into parts of at most `bytes`
    /// (never more than the device's binding range allows). For tests of the
    /// split path with small weights.
    pub fn set_weight_part_limit(&mut self, bytes: u64) {
        self.part_limit = Some(bytes.max(1));
    }

    /// Largest buffer one weight part may occupy.
    pub(super) fn weight_part_bytes(&self) -> u64 {
        let range = self.caps().max_storage_buffer_range;
        self.part_limit.map_or(range, |l| l.min(range))
    }

    /// Upload a `[rows, cols]` weight as parts of whole rows, each repacked
    /// on its own and at most `limit` bytes.
    pub(super) fn upload_split_weight(
        &mut self,
        dtype: DType,
        rows: usize,
        cols: usize,
        data: &[u8],
        limit: u64,
    ) -> Result<Weight> {
        let row_bytes = dtype.row_bytes(cols)?;
        if rows.checked_mul(row_bytes) != Some(data.len()) {
            return Err(Error::Shape(format!(
                "a {rows} x {cols} {dtype} weight needs {} bytes, got {}",
                rows.saturating_mul(row_bytes),
                data.len()
            )));
        }
        // packed_bytes rounds each buffer up to a word, so one packed row
        // bounds every row's share of a part.
        let packed_row = layout::packed_bytes(dtype, 1, cols)? as u64;
        let per_part = usize::try_from(limit / packed_row.max(1)).unwrap_or(usize::MAX);
        if per_part == 0 {
            return Err(Error::Shape(format!(
                "one row of a {rows} x {cols} {dtype} weight ({packed_row} bytes) exceeds the \
                 {limit} bytes a storage buffer binding may cover"
            )));
        }
        let mut parts: Vec<Part> = Vec::with_capacity(rows.div_ceil(per_part));
        let mut row0 = 0;
        while row0 < rows {
            let n = per_part.min(rows - row0);
            let bytes = &data[row0 * row_bytes..(row0 + n) * row_bytes];
            let uploaded = layout::repack(dtype, n, cols, bytes).and_then(|packed| {
                let buf = self.alloc(packed.len())?;
                match self.upload(&buf, 0, &packed) {
                    Ok(()) => Ok(buf),
                    Err(e) => {
                        self.free(buf);
                        Err(e)
                    }
                }
            });
            match uploaded {
                Ok(buf) => parts.push(Part { buf, row0, rows: n }),
                Err(e) => {
                    for p in parts {
                        self.free(p.buf);
                    }
                    return Err(e);
                }
            }
            row0 += n;
        }
        let Some(first) = parts.first().map(|p| p.buf) else {
            return Err(Error::Shape(format!(
                "cannot split an empty {rows} x {cols} weight"
            )));
        };
        if parts.len() > 1 {
            self.splits.0.insert(first.id, parts);
        }
        Ok(Weight {
            buf: first,
            dtype,
            rows,
            cols,
        })
    }

    /// The other parts of a split weight whose first part `buf` is being
    /// freed (empty for any other buffer).
    pub(super) fn take_other_parts(&mut self, buf: &Buffer) -> Vec<Buffer> {
        self.splits
            .0
            .remove(&buf.id)
            .map(|parts| parts.into_iter().skip(1).map(|p| p.buf).collect())
            .unwrap_or_default()
    }
}
