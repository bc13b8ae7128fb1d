//! `route_experts` (glsl/route_experts.comp): one workgroup per row picks
//! its k experts, one round per pick, and writes their ids and weights.

use super::Encoder;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Buffer, RouteParams};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// The shader's bounds (MAX_EXPERTS, MAX_K): its logits live in registers,
/// 4 per invocation of 64; its picks in shared memory.
const MAX_EXPERTS: usize = 256;
const MAX_K: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    experts: u32,
    k: u32,
    renorm: u32,
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_route_experts(
        &mut self,
        logits: &Buffer,
        ids: &Buffer,
        weights: &Buffer,
        p: &RouteParams,
    ) -> Result<()> {
        const OP: &str = "route_experts";
        let (n, nk) = check::route(OP, p)?;
        if p.experts > MAX_EXPERTS || p.k > MAX_K {
            return Err(Error::Unsupported(format!(
                "route_experts on Vulkan takes up to {MAX_EXPERTS} experts and k up to {MAX_K}, \
                 not {} experts and k {}",
                p.experts, p.k
            )));
        }
        check::fits(OP, "logits", logits, n)?;
        check::fits(OP, "ids", ids, nk)?;
        check::fits(OP, "weights", weights, nk)?;
        if p.rows == 0 {
            return Ok(());
        }
        let push = Push {
            rows: u32_of(OP, "rows", p.rows)?,
            experts: p.experts as u32,
            k: p.k as u32,
            renorm: p.renorm as u32,
        };
        u32_of(OP, "rows * experts", n)?;
        let groups = self.split_groups(OP, push.rows)?;
        self.dispatch(
            OP,
            plain("route_experts"),
            &[read(logits), write(ids), write(weights)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }
}
