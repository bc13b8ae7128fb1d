//! Routed rows: the slots of each expert gathered into one matmul of its
//! own matrix (a GEMM when several rows chose it), the results scattered
//! back to their slots.

use super::buffers::{CpuWeight, WeightRows};
use super::par::Ctx;
use super::{glu, matmul};
use crate::backend::ExpertsParams;
use crate::error::{Error, Result};

/// Shapes are checked by the caller: `x` has `p.rows` (or `p.slots()`)
/// rows of `w.cols`, `y` `p.slots()` rows of `n = w.rows / p.experts` (half
/// that with a GLU),
/// `bias` `p.experts * n` values, `ids` `p.slots()`.
pub(crate) fn run(
    ctx: Ctx,
    w: &CpuWeight,
    bias: Option<&[f32]>,
    x: &[f32],
    ids: &[u32],
    y: &mut [f32],
    p: &ExpertsParams,
) -> Result<()> {
    let (k, cols) = (p.k, w.cols);
    let n = w.rows / p.experts;
    if let Some(&bad) = ids.iter().find(|&&e| e as usize >= p.experts) {
        return Err(Error::op(
            "matmul_experts",
            format!("expert id {bad} is past the {} experts", p.experts),
        ));
    }
    let mut slots: Vec<Vec<usize>> = vec![Vec::new(); p.experts];
    for (s, &e) in ids.iter().enumerate() {
        slots[e as usize].push(s);
    }
    let (mut xs, mut ys, mut unpacked) = (Vec::new(), Vec::new(), Vec::new());
    for (e, chosen) in slots.iter().enumerate().filter(|(_, c)| !c.is_empty()) {
        xs.clear();
        for &s in chosen {
            let r = if p.x_per_slot { s } else { s / k };
            xs.extend_from_slice(&x[r * cols..(r + 1) * cols]);
        }
        ys.resize(chosen.len() * n, 0.0);
        let rows = match w.rows_view(e * n, n) {
            Some(v) => v,
            // Repacked groups straddle two experts: the rows read back.
            None => WeightRows {
                data: w.rows_at(e * n, (e + 1) * n, &mut unpacked),
                rows: n,
                packed: false,
                ..w.all()
            },
        };
        let b = bias.map(|b| &b[e * n..(e + 1) * n]);
        matmul::run(ctx, rows, b, &xs, &mut ys, chosen.len(), None);
        match p.glu {
            Some(act) => {
                let half = n / 2;
                for (&s, row) in chosen.iter().zip(ys.chunks_exact(n)) {
                    let (gate, up) = row.split_at(half);
                    glu::run(false, act, gate, Some(up), &mut y[s * half..(s + 1) * half]);
                }
            }
            None => {
                for (&s, row) in chosen.iter().zip(ys.chunks_exact(n)) {
                    y[s * n..(s + 1) * n].copy_from_slice(row);
                }
            }
        }
    }
    Ok(())
}
