//! `rms_norm` (glsl/rms_norm.comp): one workgroup per row.

use super::Encoder;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// Invocations of a workgroup (one row): a decode step's few rows each get
/// a wide one, as its loads' latency bounds it (an H200's 2880-value row
/// took 15 µs with 128 scalar invocations); many rows fill the GPU anyway.
const ROW_INVOCATIONS: u32 = 128;
const FEW_ROWS: usize = 64;
const FEW_ROWS_INVOCATIONS: u32 = 512;

/// rms_norm.comp's and layer_norm.comp's push constants.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(super) struct Push {
    pub rows: u32,
    dim: u32,
    eps: f32,
}

impl Encoder<'_> {
    /// Push constants of both norms (layer_norm.rs too), after the shape
    /// checks they share.
    pub(super) fn norm_push(
        op: &'static str,
        x: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<Push> {
        if dim == 0 {
            return Err(Error::op(op, "dim must be positive"));
        }
        let n = rows
            .checked_mul(dim)
            .ok_or_else(|| Error::op(op, "rows * dim overflows"))?;
        check::fits(op, "x", x, n)?;
        check::fits(op, "out", out, n)?;
        Ok(Push {
            rows: u32_of(op, "rows", rows)?,
            dim: u32_of(op, "dim", dim)?,
            eps,
        })
    }

    pub(in crate::vk) fn encode_rms_norm(
        &mut self,
        x: &Buffer,
        w: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "rms_norm";
        let push = Self::norm_push(OP, x, out, rows, dim, eps)?;
        check::fits(OP, "w", w, dim)?;
        if rows == 0 {
            return Ok(());
        }
        let groups = self.split_groups(OP, push.rows)?;
        let caps = self.caps();
        let wg = if rows <= FEW_ROWS && !caps.cpu_device {
            // One invocation per 4 values (the vec4 loop), a subgroup at least.
            let want = dim.div_ceil(4).clamp(32, FEW_ROWS_INVOCATIONS as usize);
            (want.next_power_of_two() as u32)
                .min(FEW_ROWS_INVOCATIONS)
                .min(caps.max_workgroup_invocations)
        } else {
            ROW_INVOCATIONS
        };
        self.dispatch(
            OP,
            plain("rms_norm").spec(wg),
            &[read(x), read(w), write(out)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
