//! `matmul`: subgroup-reduced GEMV (glsl/mul_mat_vec.comp, one subgroup per
//! output row) for a few input rows, shared-memory tiled GEMM
//! (glsl/mul_mat.comp) beyond that.

use super::super::VulkanBackend;
use super::{read, typed, u32_of, write};
use crate::backend::{check, Buffer, Weight};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// Up to this many rows the GEMV kernel (MAX_M in mul_mat_vec.comp) beats tiling.
const GEMV_MAX_ROWS: usize = 4;
/// Output tile edge of mul_mat.comp.
const TILE: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    n: u32,
    k: u32,
    m: u32,
    has_bias: u32,
    /// Output rows per GEMV workgroup (one per subgroup at a time).
    rows_per_wg: u32,
    /// First output column (and bias index) this dispatch writes: nonzero
    /// for the later parts of a split weight (vk/split.rs).
    row0: u32,
    /// Row stride of y: the whole weight's rows.
    ldy: u32,
}

impl VulkanBackend {
    pub(in crate::vk) fn encode_matmul(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        y: &Buffer,
        m: usize,
    ) -> Result<()> {
        // One dispatch per part of a split weight, each writing its columns of y.
        for i in 0..self.weight_parts(w) {
            let (part, row0) = self.weight_part(w, i)?;
            self.encode_matmul_part(&part, bias, x, y, m, row0, w.rows)?;
        }
        Ok(())
    }

    /// `y[:, row0..row0 + w.rows] = x · wᵀ (+ bias[row0..])`, y's rows `ldy` wide.
    #[allow(clippy::too_many_arguments)]
    fn encode_matmul_part(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        y: &Buffer,
        m: usize,
        row0: usize,
        ldy: usize,
    ) -> Result<()> {
        const OP: &str = "matmul";
        let (n, k) = (w.rows, w.cols);
        if n == 0 || k == 0 {
            return Err(Error::op(OP, format!("empty {n} x {k} weight")));
        }
        if m == 0 {
            return Ok(());
        }
        u32_of(OP, "weight elements", n.saturating_mul(k))?;
        let mk = m
            .checked_mul(k)
            .ok_or_else(|| Error::op(OP, "m * k overflows"))?;
        let mn = m
            .checked_mul(ldy)
            .ok_or_else(|| Error::op(OP, "m * n overflows"))?;
        check::fits(OP, "x", x, mk)?;
        check::fits(OP, "y", y, mn)?;
        if let Some(b) = bias {
            check::fits(OP, "bias", b, ldy)?;
        }
        let push = Push {
            n: u32_of(OP, "n", n)?,
            k: u32_of(OP, "k", k)?,
            m: u32_of(OP, "m", m)?,
            has_bias: bias.is_some() as u32,
            rows_per_wg: 1,
            row0: u32_of(OP, "row0", row0)?,
            ldy: u32_of(OP, "n", ldy)?,
        };
        // Without a bias, x stands in at binding 3 (never read).
        let binds = [read(&w.buf), read(x), write(y), read(bias.unwrap_or(x))];
        if m <= GEMV_MAX_ROWS {
            let wg = self.caps().gemv_workgroup();
            // One row per subgroup of the device's reported size; the shader
            // stays correct if the driver picks another size.
            let rows_per_wg = (wg / self.caps().subgroup_size.max(1)).max(1);
            let push = Push {
                rows_per_wg,
                ..push
            };
            let groups = self.split_groups(OP, push.n.div_ceil(rows_per_wg))?;
            self.dispatch(
                OP,
                typed("mul_mat_vec", w.dtype).spec(wg),
                &binds,
                bytemuck::bytes_of(&push),
                groups,
            )
        } else {
            let groups = [
                u32_of(OP, "n tiles", n.div_ceil(TILE))?,
                u32_of(OP, "m tiles", m.div_ceil(TILE))?,
                1,
            ];
            let max = self.caps().max_workgroup_count;
            if groups[0] > max[0] || groups[1] > max[1] {
                return Err(Error::op(
                    OP,
                    format!("{m} x {n} output exceeds the device's workgroup limits"),
                ));
            }
            self.dispatch(
                OP,
                typed("mul_mat", w.dtype),
                &binds,
                bytemuck::bytes_of(&push),
                groups,
            )
        }
    }
}
