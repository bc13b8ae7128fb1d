//! `argmax` (glsl/argmax.comp, glsl/argmax_combine.comp), `u32` results,
//! over all of a row or the values a mask allows.
//! A long row is split over many workgroups that each write a (value, index)
//! partial to a backend-owned scratch buffer; one small workgroup per row then
//! reduces the partials. One workgroup per row (what short rows and many rows
//! get) streams a vocabulary row through a few SMs (benches/README.md, small
//! kernels).

use super::Encoder;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// Values per stage-one workgroup at least (256 invocations, 4 values each):
/// below this a row is not worth splitting.
const SLICE_MIN: usize = 1024;
/// Stage-one workgroups over all rows at most (about two per SM on a large
/// GPU), and per row at most (what the 64-wide combine folds in two steps).
const GROUPS_TOTAL: usize = 256;
const GROUPS_PER_ROW: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    n: u32,
    groups: u32,
    slice: u32,
    /// 1: only the values `allowed` marks compete.
    masked: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct CombinePush {
    rows: u32,
    groups: u32,
}

/// (workgroups per row, values per workgroup) for `rows` rows of `n` values:
/// depends on the shape only, so a recorded pass replays for any input.
pub(in crate::vk) fn argmax_split(rows: usize, n: usize) -> (usize, usize) {
    let cap = (GROUPS_TOTAL / rows.max(1)).clamp(1, GROUPS_PER_ROW);
    let want = n.div_ceil(SLICE_MIN).clamp(1, cap);
    let slice = n.div_ceil(want).max(1);
    (n.div_ceil(slice).max(1), slice)
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_argmax(
        &mut self,
        x: &Buffer,
        allowed: Option<&Buffer>,
        out: &Buffer,
        rows: usize,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "argmax";
        if n == 0 {
            return Err(Error::op(OP, "rows must have at least one value"));
        }
        let total = rows
            .checked_mul(n)
            .ok_or_else(|| Error::op(OP, "rows * n overflows"))?;
        check::fits(OP, "x", x, total)?;
        check::fits(OP, "out", out, rows)?;
        if let Some(a) = allowed {
            let words = rows
                .checked_mul(n.div_ceil(32))
                .ok_or_else(|| Error::op(OP, "rows * n overflows"))?;
            check::fits(OP, "allowed", a, words)?;
        }
        if rows == 0 {
            return Ok(());
        }
        let (groups, slice) = argmax_split(rows, n);
        let push = Push {
            rows: u32_of(OP, "rows", rows)?,
            n: u32_of(OP, "n", n)?,
            groups: groups as u32,
            slice: u32_of(OP, "slice", slice)?,
            masked: u32::from(allowed.is_some()),
        };
        let all = rows
            .checked_mul(groups)
            .ok_or_else(|| Error::op(OP, "rows * groups overflows"))?;
        let wgs = self.split_groups(OP, u32_of(OP, "workgroups", all)?)?;
        // Not zeroed: stage one writes every partial stage two reads.
        let part = self.scratch(|b| &mut b.argmax_scratch, all * 8)?;
        self.dispatch(
            OP,
            plain("argmax"),
            &[
                read(x),
                write(out),
                write(&part),
                read(allowed.unwrap_or(x)),
            ],
            bytemuck::bytes_of(&push),
            wgs,
        )?;
        if groups == 1 {
            return Ok(());
        }
        let combine = CombinePush {
            rows: push.rows,
            groups: push.groups,
        };
        let wgs = self.split_groups(OP, push.rows)?;
        self.dispatch(
            OP,
            plain("argmax_combine"),
            &[read(&part), write(out)],
            bytemuck::bytes_of(&combine),
            wgs,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::argmax_split;

    #[test]
    fn splits_cover_the_row_without_empty_groups() {
        for rows in [1, 2, 3, 7, 300] {
            for n in [1, 50, 1023, 1024, 1025, 49152, 128256, 262144, 1 << 24] {
                let (g, s) = argmax_split(rows, n);
                assert!((1..=128).contains(&g), "{rows}x{n}: {g} groups");
                assert!(g * s >= n && (g - 1) * s < n, "{rows}x{n}: {g} x {s}");
            }
        }
        assert_eq!(argmax_split(1, 49152).0, 48);
        assert_eq!(argmax_split(1, 50).0, 1);
    }
}
