//! `rope` (glsl/rope.comp): in place, per-row positions from a buffer. The
//! inverse frequencies come from a table computed on the host like the
//! reference (f64 power rounded to f32, [`RopeParams::inv_freq`]; YaRN's
//! mix of frequencies included), so angles at long positions match it
//! instead of inheriting the GPU's `pow` error. YaRN's mscale is the
//! shaders' SCALED mode, so unscaled rope runs the code it always ran.

use super::Encoder;
use super::{plain, read, u32_of, write};
use crate::backend::{check, Buffer, RopeParams, RopeStyle};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    n_heads: u32,
    head_dim: u32,
    rot_dim: u32,
    neox: u32,
    /// SCALED: what cos and sin are multiplied by.
    mscale: f32,
}

/// glsl/rope_rotations.comp's push constants.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RotationsPush {
    half_rot: u32,
    mscale: f32,
}

/// A rope table's key: rot_dim, the bits of base and of the YaRN scaling.
pub(in crate::vk) type RopeKey = (u32, u32, Option<[u32; 4]>);

fn rope_key(rot_dim: u32, p: &RopeParams) -> RopeKey {
    let scaling = p
        .scaling
        .map(|s| [s.freq_scale, s.low, s.high, s.mscale].map(f32::to_bits));
    (rot_dim, p.base.to_bits(), scaling)
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_rope(
        &mut self,
        x: &Buffer,
        positions: &Buffer,
        p: &RopeParams,
    ) -> Result<()> {
        const OP: &str = "rope";
        if !p.rot_dim.is_multiple_of(2) || p.rot_dim > p.head_dim {
            return Err(Error::op(
                OP,
                format!(
                    "rot_dim {} must be even and at most head_dim {}",
                    p.rot_dim, p.head_dim
                ),
            ));
        }
        let n = p
            .rows
            .checked_mul(p.n_heads)
            .and_then(|v| v.checked_mul(p.head_dim))
            .ok_or_else(|| Error::op(OP, "rows * n_heads * head_dim overflows"))?;
        check::fits(OP, "x", x, n)?;
        check::fits(OP, "positions", positions, p.rows)?;
        let pairs = p.rows * p.n_heads * (p.rot_dim / 2);
        if pairs == 0 {
            return Ok(());
        }
        u32_of(OP, "rotated pairs", pairs)?;
        let push = Push {
            rows: u32_of(OP, "rows", p.rows)?,
            n_heads: u32_of(OP, "n_heads", p.n_heads)?,
            head_dim: u32_of(OP, "head_dim", p.head_dim)?,
            rot_dim: u32_of(OP, "rot_dim", p.rot_dim)?,
            neox: (p.style == RopeStyle::Neox) as u32,
            mscale: p.mscale(),
        };
        let table = self.rope_table(push.rot_dim, p)?;
        let groups = self.stride_groups(pairs, 256);
        // Specialization constant 0: SCALED.
        self.dispatch(
            OP,
            plain("rope").spec(u32::from(p.scaling.is_some())),
            &[write(x), read(positions), read(&table)],
            bytemuck::bytes_of(&push),
            groups,
        )
    }

    /// The `rot_dim / 2` inverse frequencies of `p` (`base^(-2i/rot_dim)`,
    /// YaRN-mixed where scaled), written into the current command buffer
    /// the first time they are needed.
    pub(super) fn rope_table(&mut self, rot_dim: u32, p: &RopeParams) -> Result<Buffer> {
        let key = rope_key(rot_dim, p);
        if let Some(t) = self.state.rope_tables.get(&key) {
            return Ok(*t);
        }
        let p = RopeParams {
            rot_dim: rot_dim as usize,
            ..*p
        };
        let freqs: Vec<f32> = (0..rot_dim as usize / 2).map(|i| p.inv_freq(i)).collect();
        let data: &[u8] = bytemuck::cast_slice(&freqs);
        // vkCmdUpdateBuffer takes at most 65536 bytes.
        if data.len() > 65536 {
            return Err(Error::op("rope", format!("rot_dim {rot_dim} is too large")));
        }
        let (id, handle, _) = self.mem.alloc(data.len())?;
        self.rec.access(&[], &[id]);
        // SAFETY: recording command buffer; the new buffer holds `data`.
        unsafe { self.device.cmd_update_buffer(self.rec.cmd, handle, 0, data) };
        let table = Buffer::new(id, data.len());
        self.state.rope_tables.insert(key, table);
        Ok(table)
    }

    /// (cos, sin) of `positions[0]` times each of `p`'s frequencies
    /// (`rot_dim / 2` of them), times YaRN's mscale where scaled
    /// (glsl/rope_rotations.comp), for a decode step's fused attention: made
    /// once per pass and reused by every layer while the positions are
    /// unchanged.
    pub(super) fn step_rotations(
        &mut self,
        positions: &Buffer,
        rot_dim: u32,
        p: &RopeParams,
    ) -> Result<Buffer> {
        let key = rope_key(rot_dim, p);
        let kept = self.state.step_rotations.get(&key).copied();
        if let Some((buf, pos, at)) = kept {
            let valid = pos == positions.id
                && self.rec.last_write(buf.id) == Some(at)
                && self.rec.last_write(pos).is_none_or(|w| w < at);
            if valid {
                return Ok(buf);
            }
        }
        let table = self.rope_table(rot_dim, p)?;
        let half = rot_dim / 2;
        let buf = match kept {
            Some((buf, _, _)) => buf,
            None => {
                let bytes = half as usize * 8;
                let (id, _, _) = self.mem.alloc(bytes)?;
                Buffer::new(id, bytes)
            }
        };
        // Multiplying by an mscale of 1 is exact: unscaled rotations are
        // what they were.
        let push = RotationsPush {
            half_rot: half,
            mscale: p.mscale(),
        };
        self.dispatch(
            "rope",
            plain("rope_rotations"),
            &[read(positions), read(&table), write(&buf)],
            bytemuck::bytes_of(&push),
            [half.div_ceil(64).max(1), 1, 1],
        )?;
        let at = self
            .rec
            .last_write(buf.id)
            .ok_or_else(|| Error::op("rope", "the rotations were not recorded"))?;
        self.state
            .step_rotations
            .insert(key, (buf, positions.id, at));
        Ok(buf)
    }
}
