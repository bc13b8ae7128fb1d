//! `out[r] = dequant(table[ids[r]])`.

use super::buffers::CpuWeight;
use super::simd::{self, Isa};
use crate::error::{Error, Result};
use rayon::prelude::*;

pub(crate) fn run(isa: Isa, w: &CpuWeight, ids: &[u32], out: &mut [f32]) -> Result<()> {
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= w.rows) {
        return Err(Error::op(
            "embedding",
            format!("token id {bad} >= {} table rows", w.rows),
        ));
    }
    if w.cols == 0 {
        return Ok(());
    }
    out.par_chunks_mut(w.cols)
        .zip(ids.par_iter())
        .for_each(|(dst, &id)| {
            let r = id as usize;
            simd::dequant_row(
                isa,
                w.dtype,
                &w.data[r * w.row_bytes..(r + 1) * w.row_bytes],
                dst,
            );
        });
    Ok(())
}
