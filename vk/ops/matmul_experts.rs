//! `matmul_experts` (mixture of experts): each of the `rows * k` slots gets
//! its expert's matrix of the stacked weight times its x row, the experts
//! read from `ids` on the device, so a recorded pass replays for any
//! routing. Few tokens (as `matmul` decides, vk/ops/matmul.rs) take the
//! GEMV's experts build (glsl/mul_mat_vec.comp with EXPERTS): workgroup z
//! is a slot and reads only its expert's rows. More take the GEMM kernel's
//! experts build (glsl/experts.glsl): glsl/expert_slots.comp lists each
//! expert's slots, then one dispatch runs the tiled GEMM on row tiles of
//! those lists (each workgroup row finds its expert and tile from the
//! lists' counts), on the x rows gathered from its list, and writes each
//! result row to its slot; workgroups past the lists' tiles exit at once.

use super::matmul::{floats, Routed};
use super::{plain, read, u32_of, write, Encoder};
use crate::backend::{check, Activation, Buffer, ExpertsParams, LinearOpts, Weight};
use crate::error::{Error, Result};
use bytemuck::{Pod, Zeroable};

/// expert_slots.comp's push constants.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SlotsPush {
    slots: u32,
    experts: u32,
}

/// Invocations of an expert_slots.comp workgroup on a GPU (its shared
/// memory's bound); a CPU device's is one subgroup, whose barriers cost per
/// subgroup (benches/README.md, on a CPU device).
const SLOTS_WG: u32 = 256;

/// What the expert-slots scratch holds: the lists of the `slots` ids in
/// the buffer `ids` over `experts`, valid while neither was written since
/// the recorder's write `at`. The gate, up and down projections of one
/// routing share them.
#[derive(Clone, Copy)]
pub(in crate::vk) struct ExpertSlots {
    ids: u32,
    slots: usize,
    experts: usize,
    at: u64,
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_matmul_experts(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        ids: &Buffer,
        y: &Buffer,
        p: &ExpertsParams,
    ) -> Result<()> {
        const OP: &str = "matmul_experts";
        let check::Experts {
            n,
            n_out,
            slots,
            x_rows,
            xn,
            yn,
        } = check::experts(OP, w, p)?;
        if w.rows == 0 || w.cols == 0 {
            return Err(Error::op(
                OP,
                format!("empty {} x {} weight", w.rows, w.cols),
            ));
        }
        check::fits(OP, "x", x, xn)?;
        check::fits(OP, "y", y, yn)?;
        check::fits(OP, "ids", ids, slots)?;
        if let Some(b) = bias {
            check::fits(OP, "bias", b, w.rows)?;
        }
        let parts = self.splits.parts(w);
        if parts > 1 {
            return Err(Error::Unsupported(format!(
                "matmul_experts on Vulkan of a weight stored in {parts} parts (larger than one \
                 storage buffer binding)"
            )));
        }
        if slots == 0 {
            return Ok(());
        }
        let routed = |index| Routed {
            index,
            experts: p.experts,
            n,
            slots,
            x_div: if p.x_per_slot { 1 } else { p.k },
        };
        // The GEMV's fused GLU has no squared ReLU: that goes through glu.comp.
        let gemv = self.takes_gemv(p.rows) && p.glu != Some(Activation::Relu2);
        if gemv {
            // The GEMV pairs a GLU's gate and up rows (and their biases).
            let o = LinearOpts {
                bias,
                ..LinearOpts::default()
            };
            let r = routed(*ids);
            return self.encode_gemv(w, x, y, x_rows, &o, p.glu, 0, n_out, false, Some(&r));
        }
        // The GEMM's GLU goes through a scratch buffer.
        let out = match p.glu {
            Some(_) => self.scratch(|b| &mut b.glu_scratch, floats(slots, n)?)?,
            None => *y,
        };
        let r = routed(self.encode_expert_slots(ids, slots, p.experts)?);
        let half = self.gemm_x_half(w.rows, w.cols);
        let x = self.gemm_input(x, None, x_rows, w.cols, half)?;
        self.encode_gemm(w, bias, &x, half, &out, slots, 0, n, Some(&r))?;
        match p.glu {
            Some(act) => self.encode_glu_rows(act, &out, y, slots, n_out),
            None => Ok(()),
        }
    }

    /// Each expert's slots of `ids` (and the bad ids' list) in the
    /// expert-slots scratch, as expert_slots.comp lays them out; reused
    /// while they stand.
    fn encode_expert_slots(
        &mut self,
        ids: &Buffer,
        slots: usize,
        experts: usize,
    ) -> Result<Buffer> {
        const OP: &str = "matmul_experts";
        if let (Some(c), Some(t)) = (self.state.expert_slots_of, self.state.expert_slots_scratch) {
            let same = (c.ids, c.slots, c.experts) == (ids.id, slots, experts);
            if same && self.still_derived(&t, c.at, [Some(c.ids), None]) {
                return Ok(t);
            }
        }
        let lists = experts
            .checked_add(1)
            .ok_or_else(|| Error::op(OP, "experts overflow"))?;
        // A count per list, then each list's room for every slot.
        let words = slots
            .checked_add(1)
            .and_then(|s| s.checked_mul(lists))
            .ok_or_else(|| Error::op(OP, "the experts' slot lists overflow"))?;
        u32_of(OP, "slot list words", words)?;
        let t = self.scratch(|b| &mut b.expert_slots_scratch, words * 4)?;
        let caps = self.caps();
        let wg = if caps.cpu_device {
            caps.subgroup_size.max(1)
        } else {
            SLOTS_WG.min(caps.max_workgroup_invocations)
        };
        let groups = u32_of(OP, "experts", lists)?;
        if groups > caps.max_workgroup_count[0] {
            return Err(Error::op(
                OP,
                format!("{experts} experts exceed the device's workgroup limits"),
            ));
        }
        let push = SlotsPush {
            slots: u32_of(OP, "slots", slots)?,
            experts: u32_of(OP, "experts", experts)?,
        };
        self.dispatch(
            OP,
            plain("expert_slots").spec(wg),
            &[read(ids), write(&t)],
            bytemuck::bytes_of(&push),
            [groups, 1, 1],
        )?;
        self.state.expert_slots_of = self.rec.last_write(t.id).map(|at| ExpertSlots {
            ids: ids.id,
            slots,
            experts,
            at,
        });
        Ok(t)
    }
}
