//! `out[r] = dequant(table[ids[r]])`.

use super::buffers::CpuWeight;
use super::par::{self, Ctx};
use super::simd;
use crate::error::{Error, Result};

pub(crate) fn run(ctx: Ctx, w: &CpuWeight, ids: &[u32], out: &mut [f32]) -> Result<()> {
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= w.rows) {
        return Err(Error::op(
            "embedding",
            format!("token id {bad} >= {} table rows", w.rows),
        ));
    }
    if w.cols == 0 {
        return Ok(());
    }
    par::chunks(ctx.par, out, w.cols, |i, dst| {
        let r = ids[i] as usize;
        let mut scratch = Vec::new();
        let row = w.rows_at(r, r + 1, &mut scratch);
        simd::dequant_row(ctx.isa, w.dtype, row, dst);
    });
    Ok(())
}
