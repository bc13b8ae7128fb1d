//! `flow_gemv` (glsl/flow_gemv.comp): a probe, not a model op. It times a
//! chain of dependent GEMVs whose dispatches meet at pipeline barriers
//! against one whose dispatches start early, load their weights and wait on
//! a count of the workgroups done in the step before (benches/dispatch.rs).

use super::Encoder;
use super::{atomic, plain, read, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::{Error, Result};
use crate::vk::VulkanBackend;
use bytemuck::{Pod, Zeroable};

/// Output rows per workgroup (ROWS in the shader).
const ROWS: usize = 8;
/// Largest n: a row is split over 32 lanes holding at most 4 16-byte weight
/// words (32 values each) apiece (MAX_N in the shader).
const MAX_N: usize = 32 * 32 * 4;
/// Polls of the count before a waiting workgroup gives up.
const SPIN_LIMIT: u32 = 1 << 20;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    step: u32,
    n: u32,
    wait: u32,
    spin_limit: u32,
    w_base: u32,
    backoff: u32,
}

/// How a step of the chain is ordered after the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowOrder {
    /// A pipeline barrier (the recorder's, from the step's reads and writes).
    Barrier,
    /// No barrier: the step's workgroups wait on the count of the one
    /// before, with `backoff` arithmetic steps between polls.
    Wait { backoff: u32 },
    /// As `Wait`, with a barrier before every even step: a step starts at
    /// most one ahead.
    WaitPairs,
    /// Neither (wrong results): what the steps cost with no dependency.
    Free,
}

/// Bytes of the probe's flow buffer for `steps` steps: four status words
/// and a count per step.
pub fn flow_gemv_flow_bytes(steps: usize) -> usize {
    16 + steps * 4
}

/// Bytes of one step's n x n 4-bit weights.
pub fn flow_gemv_weight_bytes(n: usize) -> usize {
    n * n / 2
}

impl Encoder<'_> {
    #[allow(clippy::too_many_arguments)]
    fn encode_flow_gemv(
        &mut self,
        flow: &Buffer,
        v: &Buffer,
        w: &Buffer,
        w_index: usize,
        n: usize,
        step: usize,
        order: FlowOrder,
    ) -> Result<()> {
        const OP: &str = "flow_gemv";
        if n == 0 || !n.is_multiple_of(1024) || n > MAX_N {
            return Err(Error::op(
                OP,
                format!("n = {n} is not a multiple of 1024 up to {MAX_N}"),
            ));
        }
        check::fits(OP, "flow", flow, flow_gemv_flow_bytes(step + 1) / 4)?;
        check::fits(OP, "v", v, (step + 2).saturating_mul(n))?;
        let w_bytes = flow_gemv_weight_bytes(n);
        check::fits(OP, "w", w, (w_index + 1).saturating_mul(w_bytes) / 4)?;
        let push = Push {
            step: u32_of(OP, "step", step)?,
            n: u32_of(OP, "n", n)?,
            wait: (order != FlowOrder::Barrier && order != FlowOrder::Free) as u32,
            spin_limit: SPIN_LIMIT,
            w_base: u32_of(OP, "w_base", w_index * w_bytes / 16)?,
            backoff: match order {
                FlowOrder::Wait { backoff } => backoff,
                _ => 0,
            },
        };
        let groups = u32_of(OP, "groups", n / ROWS)?;
        let binds = match order {
            FlowOrder::Barrier => [atomic(flow), write(v), read(w)],
            // Ordered (by a barrier) after what zeroed the counts; later
            // steps only through them.
            FlowOrder::Wait { .. } if step == 0 => [write(flow), atomic(v), read(w)],
            FlowOrder::WaitPairs if step.is_multiple_of(2) => [write(flow), atomic(v), read(w)],
            _ => [atomic(flow), atomic(v), read(w)],
        };
        self.dispatch(
            OP,
            plain("flow_gemv"),
            &binds,
            bytemuck::bytes_of(&push),
            [groups, 1, 1],
        )
    }
}

impl VulkanBackend {
    /// Record step `step` of the probe's chain into the current pass: with
    /// n x n weights number `w_index` of `w`, `v`'s row `step + 1` from its
    /// row `step`. A waiting chain's `flow` ([`flow_gemv_flow_bytes`]) must
    /// be zero before its first step; its first word then counts the
    /// workgroups that gave up waiting.
    #[allow(clippy::too_many_arguments)]
    pub fn flow_gemv(
        &mut self,
        flow: &Buffer,
        v: &Buffer,
        w: &Buffer,
        w_index: usize,
        n: usize,
        step: usize,
        order: FlowOrder,
    ) -> Result<()> {
        self.encode("flow_gemv", |cx| {
            cx.encode_flow_gemv(flow, v, w, w_index, n, step, order)
        })
    }
}
