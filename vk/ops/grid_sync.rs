//! `grid_sync` (glsl/grid_sync.comp): a probe, not a model op. It times a
//! grid-wide barrier inside one dispatch against a chain of dependent
//! dispatches (benches/dispatch.rs), the question a persistent decode
//! kernel would hinge on.

use super::Encoder;
use super::{plain, u32_of, write};
use crate::backend::{check, Buffer};
use crate::error::{Error, Result};
use crate::vk::VulkanBackend;
use bytemuck::{Pod, Zeroable};

/// Invocations per workgroup (local_size_x in the shader).
const WG: usize = 128;
/// Polls of the generation word before a waiting workgroup gives up.
const SPIN_LIMIT: u32 = 1 << 20;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    phases: u32,
    first: u32,
    sync: u32,
    spin_limit: u32,
}

/// Bytes of the probe's buffer for `groups` workgroups: four status words
/// and two rounds of values.
pub fn grid_sync_bytes(groups: usize) -> usize {
    16 + 2 * groups * WG * 4
}

impl Encoder<'_> {
    fn encode_grid_sync(
        &mut self,
        data: &Buffer,
        groups: usize,
        phases: usize,
        first: usize,
        sync: bool,
    ) -> Result<()> {
        const OP: &str = "grid_sync";
        if groups == 0 || phases == 0 {
            return Err(Error::op(OP, "no workgroups or no rounds"));
        }
        check::fits(OP, "data", data, grid_sync_bytes(groups) / 4)?;
        let push = Push {
            phases: u32_of(OP, "phases", phases)?,
            first: u32_of(OP, "first", first)?,
            sync: sync as u32,
            spin_limit: SPIN_LIMIT,
        };
        let groups = u32_of(OP, "groups", groups)?;
        self.dispatch(
            OP,
            plain("grid_sync"),
            &[write(data)],
            bytemuck::bytes_of(&push),
            [groups, 1, 1],
        )
    }
}

impl VulkanBackend {
    /// Record `phases` rounds of the probe over `groups` workgroups into the
    /// current pass, starting at round `first`: one dispatch with grid
    /// barriers between its rounds (`sync`), or one round of one dispatch.
    /// `data` ([`grid_sync_bytes`]) must start zeroed; its third word then
    /// counts the workgroups that gave up waiting (the grid was not all
    /// resident).
    pub fn grid_sync(
        &mut self,
        data: &Buffer,
        groups: usize,
        phases: usize,
        first: usize,
        sync: bool,
    ) -> Result<()> {
        self.encode("grid_sync", |cx| {
            cx.encode_grid_sync(data, groups, phases, first, sync)
        })
    }
}
