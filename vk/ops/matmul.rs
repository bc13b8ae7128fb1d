//! `matmul` and `linear`: subgroup-reduced GEMV (glsl/mul_mat_vec.comp, a
//! few output rows per subgroup, with the RMS norm of x and the residual add
//! folded in) for a few input rows, a GEMM beyond that:
//! f16 cooperative matrices (glsl/mul_mat_coopmat.comp) where the device has
//! them, f32 weight rows per lane on a CPU device (glsl/mul_mat_lanes.comp),
//! f32 FMA tiles (glsl/mul_mat.comp) elsewhere.

use super::{plain, read, typed, u32_of, write};
use super::{Encoder, OpState};
use crate::backend::{check, Activation, Buffer, LinearOpts, Weight};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::vk::caps::{GemvKernel, MatmulKernel};
use bytemuck::{Pod, Zeroable};

/// Weights (rows x cols) from which the cooperative-matrix GEMM reads x
/// converted to f16 by one dispatch of its own (half_rows.comp) rather
/// than in every workgroup: below Llama-3.2-1B's 2048 x 2048 the extra
/// dispatch costs more than it saves (benches/README.md, prefill GEMM).
const HALF_X_MIN_WEIGHTS: usize = 4 << 20;
/// Up to this many rows the GEMV kernel (MAX_M in mul_mat_vec.comp) beats tiling.
const GEMV_MAX_ROWS: usize = 4;
/// On a CPU device each subgroup of a GEMV whose subgroups take rows of
/// their own steps over this many groups of rows: fewer workgroups, each
/// with its start-up cost (benches/README.md, on a CPU device).
const CPU_GEMV_ROW_STEPS: u32 = 16;
/// Weight rows per GEMV group (NR in mul_mat_vec.comp): a subgroup takes 2
/// of its own (1, 4 and 8 ran slower: benches/README.md, decode GEMV rows);
/// a workgroup shares its type's `gemv.rows` (quants/types.rs).
const GEMV_ROWS_SUBGROUP: u32 = 2;

/// Whether an integer-dot GEMV (not a GLU: Q8OUT needs own rows) shares
/// its rows over the workgroup, as the f32 kernel does, instead of giving
/// each subgroup two of its own: `bytes` read of at least 4 MiB with at most
/// 2048 rows and at least twice as many columns (the down projections of
/// TinyLlama and Llama-3.2-1B), whose own-row subgroups are too few to keep
/// enough loads in flight. The 8B's weights, running beside its other
/// GEMVs, were slower shared (benches/README.md, decode GEMV rows).
fn shares_rows(bytes: usize, rows: usize, cols: usize) -> bool {
    bytes >= 4 << 20 && rows <= 2048 && cols >= 2 * rows
}

/// Below this many workgroups a GEMV leaves most of a large GPU idle, so its
/// workgroups widen (vk/caps.rs gemv_workgroup): a MoE router's 32 rows
/// (8 workgroups) took 8.4 µs a layer on an H200 at 128 invocations.
const GEMV_FEW_GROUPS: usize = 64;

/// Invocations of a workgroup whose subgroups take rows of their own (two
/// subgroups on NVIDIA): faster than 128 or 256 (benches/README.md, decode
/// GEMV rows).
const GEMV_SUBGROUP_ROWS_INVOCATIONS: usize = 64;
/// A GLU GEMV (integer dots, one row) of a weight up to this size writes its
/// output's int8 digits itself (mul_mat_vec.comp's Q8OUT), so the next
/// GEMV (the down projection) needs no quantize dispatch: each workgroup of
/// GLU_Q8OUT_INVOCATIONS takes one block of 32 outputs. Above this size
/// (the 8B's 66 MB) those fewer, longer-lived workgroups cost more than the
/// quantize dispatch they save (benches/README.md, decode GEMV rows).
const GLU_Q8OUT_MAX_BYTES: usize = 32 << 20;
const GLU_Q8OUT_INVOCATIONS: u32 = 512;
/// Up to this many columns (Q8IN_MAX_K in mul_mat_vec.comp, its shared
/// memory) such a GLU also quantizes its own input, each workgroup in shared
/// memory (mul_mat_vec_q8in), instead of a quantize dispatch and barrier
/// before it (benches/README.md, decode GEMV rows).
const GLU_Q8IN_MAX_COLS: usize = 4096;
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    n: u32,
    k: u32,
    m: u32,
    has_bias: u32,
    /// First output column (and bias index) this dispatch writes: nonzero
    /// for the later parts of a split weight (vk/weight_parts.rs).
    row0: u32,
    /// Row stride of y: the whole weight's rows.
    ldy: u32,
    /// K values each split of the reduction sums (0: one split).
    k_chunk: u32,
    /// Routed rows (the experts builds): slot s reads x row s / x_div; the
    /// experts stacked in the weight.
    x_div: u32,
    experts: u32,
}

/// split_sum.comp's push constants.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SplitSumPush {
    n: u32,
    total: u32,
    splits: u32,
    has_bias: u32,
}

/// Workgroups a GEMM of one row tile aims for, about four per SM of a
/// 132-SM H100/H200, by splitting its reduction (each split's partial
/// output summed by split_sum.comp) into chunks of at least
/// GEMM_SPLIT_MIN_K: a decode step of several sequences (m of 5 to 64) has
/// too few output tiles to keep the GPU busy. Up to GEMM_SPLIT_MAX_ROWS
/// rows: 128-token prompts ran 5-10% slower split (benches/README.md,
/// batched decode).
const GEMM_SPLIT_TARGET_WGS: usize = 512;
const GEMM_SPLIT_MIN_K: usize = 256;
const GEMM_SPLIT_MAX_ROWS: usize = 64;

/// (splits, k values per split) of a one-row-tile GEMM of `tiles` output
/// tiles over `k`; (1, 0) where it runs unsplit.
fn gemm_splits(tiles: usize, k: usize) -> (usize, usize) {
    let s = GEMM_SPLIT_TARGET_WGS
        .div_ceil(tiles.max(1))
        .min(k / GEMM_SPLIT_MIN_K);
    if s <= 1 {
        return (1, 0);
    }
    // Whole 64-value slices per split (both GEMMs' k steps divide it).
    let chunk = k.div_ceil(s).next_multiple_of(64);
    (k.div_ceil(chunk), chunk)
}

/// mul_mat_vec.comp's push constants.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GemvPush {
    n: u32,
    k: u32,
    m: u32,
    /// 1: bias, 2: add to y, 4: RMS norm of x folded in, 8: subgroup rows,
    /// 16: GLU of gate_up rows, 32: GELU (else SiLU) for it, 64: y's int8
    /// digits too (Q8OUT), 128: gpt-oss's SwiGLU for the GLU.
    flags: u32,
    eps: f32,
    /// With the subgroup-rows flag: output rows of one workgroup.
    rows_per_wg: u32,
    /// As in [`Push`].
    row0: u32,
    ldy: u32,
    /// Routed rows (the experts builds): the experts stacked in the weight;
    /// slot s reads x row s / x_div.
    experts: u32,
    x_div: u32,
}

/// A matmul of routed rows (vk/ops/matmul_experts.rs) through the GEMV or
/// GEMM kernels' experts builds: the weight stacks `experts` matrices of
/// `n` rows, and each of `slots` output rows takes one of them.
#[derive(Clone, Copy)]
pub(super) struct Routed {
    /// The GEMV's slots' expert ids, or the GEMM's lists of slots per
    /// expert (expert_slots.comp).
    pub index: Buffer,
    pub experts: usize,
    pub n: usize,
    pub slots: usize,
    /// Slot s reads x row s / x_div.
    pub x_div: usize,
}

/// The input quantize_q8 last wrote into the backend's xq scratch: valid
/// while neither that input nor the scratch has been written since.
#[derive(Clone, Copy)]
pub(in crate::vk) struct QuantizedX {
    /// The buffer holding the digits.
    buf: Buffer,
    x: u32,
    nw: Option<u32>,
    m: usize,
    k: usize,
    /// The recorder's number of the quantize's write.
    at: u64,
}

/// What the tiled GEMM's prepared input (norm and/or f16 scratch) holds:
/// valid while neither x, the norm weights nor that scratch has been written
/// since the recorder's write number `at`.
#[derive(Clone, Copy)]
pub(in crate::vk) struct PreparedX {
    key: PreparedKey,
    at: u64,
}

/// The input a [`PreparedX`] was made from, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
struct PreparedKey {
    x: u32,
    /// Norm weights' id and eps bits.
    norm: Option<(u32, u32)>,
    half: bool,
    m: usize,
    k: usize,
}

/// quantize_q8.comp's push constants.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct QuantizePush {
    k: u32,
    m: u32,
    norm: u32,
    /// Words from one quantized row to the next.
    stride: u32,
}

/// Whether the integer-dot GEMV (mul_mat_vec_q8) has a variant for `dtype`.
pub fn gemv_int_dot(dtype: DType) -> bool {
    dtype.format().gemv.int_dot_lanes.is_some()
}

/// Values of x one quantize_q8 workgroup takes (256 invocations of 4).
const Q8_PART: usize = 1024;

/// Workgroups quantize_q8 spreads a row of `k` values over, each storing
/// the Σx² of its share (mul_mat_vec.comp's xq_parts).
fn q8_parts(k: usize) -> usize {
    k.div_ceil(Q8_PART)
}

/// Words of one quantize_q8 row of `k` values: two int8 digits per value,
/// (d, Σ) per block of 32, Σx² per part, padded to 16 bytes
/// (mul_mat_vec.comp's xq_stride).
fn q8_stride(k: usize) -> usize {
    (k / 2 + k / 16 + q8_parts(k) + 3) & !3
}

/// Units of work one GEMV output row splits into (mul_mat_vec.comp's
/// slots: the type's lanes per block where it goes block by block, 4 values
/// otherwise).
fn gemv_slots(dtype: DType, k: usize, q8: bool) -> usize {
    let gemv = dtype.format().gemv;
    match if q8 { gemv.int_dot_lanes } else { gemv.lanes } {
        Some(lanes) => k / dtype.block_elems() * lanes as usize,
        None => k.div_ceil(4),
    }
}

/// Bytes of `rows * cols` f32 values.
pub(super) fn floats(rows: usize, cols: usize) -> Result<usize> {
    rows.checked_mul(cols)
        .and_then(|v| v.checked_mul(4))
        .ok_or_else(|| Error::op("matmul", "scratch size overflows"))
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_matmul(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        y: &Buffer,
        m: usize,
    ) -> Result<()> {
        let opts = LinearOpts {
            bias,
            ..LinearOpts::default()
        };
        self.encode_linear(w, x, y, m, &opts)
    }

    /// `y (+)= rms_norm(x) · Wᵀ + bias`: one GEMV dispatch for a few rows;
    /// beyond that the norm and the add are dispatches of their own around
    /// the tiled GEMM, through scratch buffers.
    pub(in crate::vk) fn encode_linear(
        &mut self,
        w: &Weight,
        x: &Buffer,
        y: &Buffer,
        m: usize,
        o: &LinearOpts,
    ) -> Result<()> {
        const OP: &str = "matmul";
        let (n, k) = (w.rows, w.cols);
        if n == 0 || k == 0 {
            return Err(Error::op(OP, format!("empty {n} x {k} weight")));
        }
        if m == 0 {
            return Ok(());
        }
        let mk = m
            .checked_mul(k)
            .ok_or_else(|| Error::op(OP, "m * k overflows"))?;
        let mn = m
            .checked_mul(n)
            .ok_or_else(|| Error::op(OP, "m * n overflows"))?;
        check::fits(OP, "x", x, mk)?;
        check::fits(OP, "y", y, mn)?;
        if let Some(b) = o.bias {
            check::fits(OP, "bias", b, n)?;
        }
        if let Some((nw, _)) = o.norm {
            check::fits(OP, "norm weights", nw, k)?;
        }
        if !self.takes_gemv(m) {
            return self.encode_linear_tiled(w, x, y, m, o);
        }
        // One dispatch per part of a split weight, each writing its columns of y.
        for i in 0..self.splits.parts(w) {
            let (part, row0) = self.splits.part(w, i)?;
            self.encode_gemv(&part, x, y, m, o, None, row0, n, false, None)?;
        }
        Ok(())
    }

    /// `out[m, n] = act(norm(x)·Gᵀ) ⊙ (norm(x)·Uᵀ)`, `gate_up` = G's n rows
    /// then U's: one GEMV dispatch for a few rows, else the tiled GEMM into a
    /// scratch buffer and the row-wise glu.
    pub(in crate::vk) fn encode_linear_glu(
        &mut self,
        act: Activation,
        gate_up: &Weight,
        x: &Buffer,
        out: &Buffer,
        m: usize,
        norm: Option<(&Buffer, f32)>,
    ) -> Result<()> {
        const OP: &str = "matmul";
        if !gate_up.rows.is_multiple_of(2) {
            return Err(Error::op(
                OP,
                format!(
                    "a gate_up weight has an even row count, not {}",
                    gate_up.rows
                ),
            ));
        }
        let n = gate_up.rows / 2;
        let o = LinearOpts {
            norm,
            ..LinearOpts::default()
        };
        // The GEMV's fused GLU has no squared ReLU: that goes through glu.comp.
        if !self.takes_gemv(m) || self.splits.parts(gate_up) > 1 || act == Activation::Relu2 {
            let t = self.scratch(|b| &mut b.glu_scratch, floats(m, 2 * n)?)?;
            self.encode_linear(gate_up, x, &t, m, &o)?;
            return self.encode_glu_rows(act, &t, out, m, n);
        }
        check::fits(OP, "x", x, m.saturating_mul(gate_up.cols))?;
        check::fits(OP, "out", out, m.saturating_mul(n))?;
        if let Some((nw, _)) = norm {
            check::fits(OP, "norm weights", nw, gate_up.cols)?;
        }
        if m == 0 {
            return Ok(());
        }
        let q8out = gate_up.buf.bytes <= GLU_Q8OUT_MAX_BYTES;
        self.encode_gemv(gate_up, x, out, m, &o, Some(act), 0, n, q8out, None)
    }

    /// `y[:, row0..row0 + w.rows] (+)= ...` for a (part of a) weight, y's
    /// rows `ldy` wide; with `glu`, w is a gate_up weight of `2 * ldy` rows.
    /// With `q8out` the integer-dot kernel also writes one row of y as int8
    /// digits where it can (whole blocks, one part). With `routed`, y has a
    /// row per slot, each from its expert's rows of w and its row of x's `m`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn encode_gemv(
        &mut self,
        w: &Weight,
        x: &Buffer,
        y: &Buffer,
        m: usize,
        o: &LinearOpts,
        glu: Option<Activation>,
        row0: usize,
        ldy: usize,
        q8out: bool,
        routed: Option<&Routed>,
    ) -> Result<()> {
        const OP: &str = "matmul";
        u32_of(OP, "weight elements", w.rows.saturating_mul(w.cols))?;
        // Rows of one matrix (an expert's when routed) and the weight bytes
        // the dispatch reads (each slot its expert's).
        let (rows, bytes) = match routed {
            None => (w.rows, w.buf.bytes),
            Some(r) => (r.n, (w.buf.bytes / r.experts).saturating_mul(r.slots)),
        };
        // Small weights take the f32 kernel unless x is quantized already
        // (K and V after Q): quantizing is a dispatch of its own. Experts
        // go by their whole weight: Qwen3-30B-A3B's 8 chosen (7 MB read)
        // decoded 1-2% faster with integer dots (benches/README.md).
        let q8_bytes = if routed.is_some() { w.buf.bytes } else { bytes };
        let q8 = w.cols.is_multiple_of(32)
            && (self.takes_q8(w.dtype, q8_bytes)
                || gemv_int_dot(w.dtype)
                    && self.kernels.gemv_q8
                    && self
                        .quantized(x, o.norm.map(|(nw, _)| nw), m, w.cols)
                        .is_some());
        let few_rows = glu.is_none() && shares_rows(bytes, rows, w.cols);
        let own_rows = self.kernels.gemv.subgroup_rows(q8, few_rows);
        let nr = if own_rows {
            GEMV_ROWS_SUBGROUP
        } else {
            w.dtype.format().gemv.rows
        };
        // Outputs per group of nr weight rows: GLU pairs them.
        let outs = if glu.is_some() { nr / 2 } else { nr };
        let n_out = if glu.is_some() { rows / 2 } else { rows };
        let wg_q8out = GLU_Q8OUT_INVOCATIONS.min(self.caps().max_workgroup_invocations);
        let q8out = q8out
            && q8
            && own_rows
            && m == 1
            && n_out.is_multiple_of(32)
            && row0 == 0
            && wg_q8out >= self.caps().subgroup_size;
        let nw = o.norm.map(|(nw, _)| nw);
        let (x, kernel) =
            if q8out && w.cols <= GLU_Q8IN_MAX_COLS && self.quantized(x, nw, m, w.cols).is_none() {
                (*x, "mul_mat_vec_q8in")
            } else if q8 {
                let kernel = match routed {
                    None => "mul_mat_vec_q8",
                    Some(_) => "mul_mat_vec_q8_experts",
                };
                (self.encode_quantize_q8(x, nw, m, w.cols)?, kernel)
            } else {
                let kernel = match routed {
                    None => "mul_mat_vec",
                    Some(_) => "mul_mat_vec_experts",
                };
                (*x, kernel)
            };
        // Not where x's own digits are in the output scratch (a GLU of a
        // GLU's output): the dispatch would overwrite what it reads.
        let yq = if q8out && self.state.xq_out_scratch.is_none_or(|b| b.id != x.id) {
            Some(self.q8_scratch_in(|b| &mut b.xq_out_scratch, m, n_out)?.0)
        } else {
            None
        };
        // One-row decode keeps only its own sums in registers; so does a
        // workgroup of a routed slot, which has one x row.
        let gemv_m = if routed.is_some() { 1 } else { m };
        let max_m = if gemv_m == 1 { 1 } else { GEMV_MAX_ROWS as u32 };
        let (wg, rows_per_wg) = if yq.is_some() {
            (wg_q8out, 32)
        } else if own_rows {
            let wg = self
                .caps()
                .gemv_workgroup(GEMV_SUBGROUP_ROWS_INVOCATIONS, false);
            let steps = if self.caps().cpu_device {
                CPU_GEMV_ROW_STEPS
            } else {
                1
            };
            (
                wg,
                outs * (wg / self.caps().subgroup_size.max(1)).max(1) * steps,
            )
        } else {
            // An invocation per output (row, x row) finishes the sums.
            let few = routed.is_none() && n_out.div_ceil(outs as usize) < GEMV_FEW_GROUPS;
            let wg = self
                .caps()
                .gemv_workgroup(gemv_slots(w.dtype, w.cols, q8), few)
                .max(outs * max_m)
                .next_multiple_of(self.caps().subgroup_size.max(1));
            (wg, outs)
        };
        let push = GemvPush {
            n: u32_of(OP, "n", n_out)?,
            k: u32_of(OP, "k", w.cols)?,
            m: u32_of(OP, "m", gemv_m)?,
            flags: o.bias.is_some() as u32
                | (o.add as u32) << 1
                | (o.norm.is_some() as u32) << 2
                | (own_rows as u32) << 3
                | (glu.is_some() as u32) << 4
                | ((glu == Some(Activation::GeluTanh)) as u32) << 5
                | (yq.is_some() as u32) << 6
                | ((glu == Some(Activation::SwigluOai)) as u32) << 7,
            eps: o.norm.map_or(0.0, |(_, eps)| eps),
            rows_per_wg,
            row0: u32_of(OP, "row0", row0)?,
            ldy: u32_of(OP, "n", ldy)?,
            experts: u32_of(OP, "experts", routed.map_or(0, |r| r.experts))?,
            x_div: u32_of(OP, "x_div", routed.map_or(1, |r| r.x_div))?,
        };
        let mut groups = self.split_groups(OP, push.n.div_ceil(rows_per_wg))?;
        if let Some(r) = routed {
            // Workgroup z is the slot.
            groups[2] = u32_of(OP, "slots", r.slots)?;
            if groups[2] > self.caps().max_workgroup_count[2] {
                return Err(Error::op(
                    OP,
                    format!("{} slots exceed the device's workgroup limits", r.slots),
                ));
            }
        }
        // Absent bias and norm weights: x stands in at their bindings (never
        // read); the ids binding is there only when routed.
        let binds = [
            read(&w.buf),
            read(&x),
            write(y),
            read(o.bias.unwrap_or(&x)),
            read(o.norm.map_or(&x, |(nw, _)| nw)),
            write(yq.as_ref().unwrap_or(y)),
            read(routed.map_or(&x, |r| &r.index)),
        ];
        let bound = if routed.is_some() { 7 } else { 6 };
        self.dispatch(
            OP,
            typed(kernel, w.dtype).specs([wg, nr, max_m]),
            &binds[..bound],
            bytemuck::bytes_of(&push),
            groups,
        )?;
        if let Some(yq) = yq {
            self.mark_quantized(y, None, m, n_out, &yq);
        }
        Ok(())
    }

    /// Whether a matmul of `m` rows runs as a GEMV (mul_mat_vec.comp), not
    /// the matmul kernel.
    pub(super) fn takes_gemv(&self, m: usize) -> bool {
        m <= GEMV_MAX_ROWS && self.kernels.gemv != GemvKernel::Gemm
    }

    /// Whether a weight of `dtype` and `bytes` takes the integer-dot GEMV
    /// (where the device has it) even when its input is not quantized yet.
    pub(in crate::vk) fn takes_q8(&self, dtype: DType, bytes: usize) -> bool {
        self.kernels.gemv_q8
            && self.kernels.gemv != GemvKernel::Gemm
            && gemv_int_dot(dtype)
            && bytes >= self.gemv_q8_min_bytes
    }

    /// `m` rows of x (times the norm weights `nw`) as int8 digits per block
    /// of 32 in a scratch buffer, for mul_mat_vec_q8; `k` a multiple of 32.
    fn encode_quantize_q8(
        &mut self,
        x: &Buffer,
        nw: Option<&Buffer>,
        m: usize,
        k: usize,
    ) -> Result<Buffer> {
        // Its own name in profiles: the dispatch is part of a matmul's cost.
        const OP: &str = "quantize";
        if let Some(t) = self.quantized(x, nw, m, k) {
            return Ok(t);
        }
        let (t, stride) = self.q8_scratch(m, k)?;
        let push = QuantizePush {
            k: u32_of(OP, "k", k)?,
            m: u32_of(OP, "m", m)?,
            norm: nw.is_some() as u32,
            stride: u32_of(OP, "stride", stride)?,
        };
        let binds = [read(x), read(nw.unwrap_or(x)), write(&t)];
        self.dispatch(
            OP,
            plain("quantize_q8"),
            &binds,
            bytemuck::bytes_of(&push),
            [u32_of(OP, "parts", q8_parts(k))?, push.m, 1],
        )?;
        self.mark_quantized(x, nw, m, k, &t);
        Ok(t)
    }

    /// The backend's xq scratch, sized for `m` quantized rows of `k`
    /// values, and their stride in words (quantize_q8.comp's layout).
    pub(in crate::vk) fn q8_scratch(&mut self, m: usize, k: usize) -> Result<(Buffer, usize)> {
        self.q8_scratch_in(|b| &mut b.xq_scratch, m, k)
    }

    /// [`Encoder::q8_scratch`] in the scratch buffer `slot`.
    fn q8_scratch_in(
        &mut self,
        slot: fn(&mut OpState) -> &mut Option<Buffer>,
        m: usize,
        k: usize,
    ) -> Result<(Buffer, usize)> {
        let stride = q8_stride(k);
        let bytes = m
            .checked_mul(stride)
            .and_then(|v| v.checked_mul(4))
            .ok_or_else(|| Error::op("quantize", "quantized x size overflows"))?;
        Ok((self.scratch(slot, bytes)?, stride))
    }

    /// Note that the dispatch just recorded wrote `xq` as `x` quantized
    /// (normed by `nw`): matmuls of that input skip their quantize while
    /// neither is written again. A dispatch that writes x too must bind x
    /// before xq, so x's write is numbered first.
    pub(in crate::vk) fn mark_quantized(
        &mut self,
        x: &Buffer,
        nw: Option<&Buffer>,
        m: usize,
        k: usize,
        xq: &Buffer,
    ) {
        self.state.xq_of = self.rec.last_write(xq.id).map(|at| QuantizedX {
            buf: *xq,
            x: x.id,
            nw: nw.map(|b| b.id),
            m,
            k,
            at,
        });
    }

    /// The xq scratch when it holds `m` rows of `x` (times `nw`) quantized
    /// in this recording and neither was written since.
    fn quantized(&self, x: &Buffer, nw: Option<&Buffer>, m: usize, k: usize) -> Option<Buffer> {
        let c = self.state.xq_of?;
        let same = (c.x, c.nw, c.m, c.k) == (x.id, nw.map(|b| b.id), m, k);
        (same && self.still_derived(&c.buf, c.at, [Some(c.x), c.nw])).then_some(c.buf)
    }

    /// Whether `scratch` still holds what the recorder's write number `at`
    /// derived from the buffers `inputs`: neither it nor they were written
    /// since.
    pub(super) fn still_derived(
        &self,
        scratch: &Buffer,
        at: u64,
        inputs: [Option<u32>; 2],
    ) -> bool {
        self.rec.last_write(scratch.id) == Some(at)
            && inputs
                .into_iter()
                .flatten()
                .all(|id| self.rec.last_write(id).is_none_or(|w| w < at))
    }

    /// Many rows: [rms_norm →] tiled GEMM [→ add], the intermediate values
    /// in scratch buffers of the backend.
    fn encode_linear_tiled(
        &mut self,
        w: &Weight,
        x: &Buffer,
        y: &Buffer,
        m: usize,
        o: &LinearOpts,
    ) -> Result<()> {
        let (n, k) = (w.rows, w.cols);
        let out = if o.add {
            self.scratch(|b| &mut b.product_scratch, floats(m, n)?)?
        } else {
            *y
        };
        let half = self.gemm_x_half(n, k);
        let x = self.gemm_input(x, o.norm, m, k, half)?;
        // One dispatch per part of a split weight, each writing its columns.
        for i in 0..self.splits.parts(w) {
            let (part, row0) = self.splits.part(w, i)?;
            self.encode_gemm(&part, o.bias, &x, half, &out, m, row0, n, None)?;
        }
        if o.add {
            self.encode_add(y, &out, y, m * n)?;
        }
        Ok(())
    }

    /// Whether the GEMM of an `n x k` weight reads x as f16 converted
    /// beforehand (the cooperative-matrix kernels, `HALF_X_MIN_WEIGHTS`).
    pub(super) fn gemm_x_half(&self, n: usize, k: usize) -> bool {
        self.kernels.matmul.is_coopmat()
            && k.is_multiple_of(16)
            && n.saturating_mul(k) >= HALF_X_MIN_WEIGHTS
    }

    /// x as the tiled GEMM reads it: RMS-normed (`norm`) and/or f16 (`half`)
    /// in scratch buffers, or x itself. Q, K and V of one input share it:
    /// the second and third find it prepared, skip a norm and a conversion
    /// each, and, reading the same scratch, need no barrier between their
    /// GEMMs.
    pub(super) fn gemm_input(
        &mut self,
        x: &Buffer,
        norm: Option<(&Buffer, f32)>,
        m: usize,
        k: usize,
        half: bool,
    ) -> Result<Buffer> {
        if norm.is_none() && !half {
            return Ok(*x);
        }
        let key = PreparedKey {
            x: x.id,
            norm: norm.map(|(nw, eps)| (nw.id, eps.to_bits())),
            half,
            m,
            k,
        };
        if let Some(t) = self.prepared(&key) {
            return Ok(t);
        }
        let mut t = *x;
        if let Some((nw, eps)) = norm {
            let normed = self.scratch(|b| &mut b.norm_scratch, floats(m, k)?)?;
            self.encode_rms_norm(x, nw, &normed, m, k, eps)?;
            t = normed;
        }
        if half {
            t = self.encode_half_rows(&t, m * k)?;
        }
        self.state.prepared_x = self.rec.last_write(t.id).map(|at| PreparedX { key, at });
        Ok(t)
    }

    /// The scratch holding `key`'s input prepared in this recording, while
    /// neither it, x nor the norm weights were written since.
    fn prepared(&self, key: &PreparedKey) -> Option<Buffer> {
        let c = self.state.prepared_x.filter(|c| c.key == *key)?;
        let t = if key.half {
            self.state.half_scratch?
        } else {
            self.state.norm_scratch?
        };
        let inputs = [Some(key.x), key.norm.map(|(nw, _)| nw)];
        self.still_derived(&t, c.at, inputs).then_some(t)
    }

    /// `n` values of x as f16 in the half scratch (n % 4 == 0).
    fn encode_half_rows(&mut self, x: &Buffer, n: usize) -> Result<Buffer> {
        const OP: &str = "matmul";
        let bytes = n
            .checked_mul(2)
            .ok_or_else(|| Error::op(OP, "f16 x size overflows"))?;
        let t = self.scratch(|b| &mut b.half_scratch, bytes)?;
        let n4 = u32_of(OP, "x values / 4", n / 4)?;
        let groups = self.stride_groups(n / 4, 256);
        self.dispatch(
            OP,
            plain("half_rows"),
            &[read(x), write(&t)],
            bytemuck::bytes_of(&n4),
            groups,
        )?;
        Ok(t)
    }

    /// The tiled GEMM (m > GEMV_MAX_ROWS) for a (part of a) weight, its
    /// output columns from `row0` of y's `ldy`; shapes already checked.
    /// `x_half`: x holds f16 values (the cooperative-matrix kernels only).
    /// With `routed`, the grouped GEMM of `m` slots: each workgroup row a
    /// tile of one expert's list (or of the bad ids' list), the lists'
    /// tiles in order (glsl/experts.glsl).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn encode_gemm(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        x_half: bool,
        y: &Buffer,
        m: usize,
        row0: usize,
        ldy: usize,
        routed: Option<&Routed>,
    ) -> Result<()> {
        const OP: &str = "matmul";
        let (n, k) = (routed.map_or(w.rows, |r| r.n), w.cols);
        u32_of(OP, "weight elements", w.rows.saturating_mul(k))?;
        let (shader, tn, tm) = match routed {
            None => self.kernels.matmul.shader(n, m),
            Some(r) => self.kernels.matmul.experts_shader(n, m, r.experts),
        };
        // Routed: as many row tiles as the lists can have, each list's last
        // partial (the workgroups past the lists' tiles exit at once).
        let m_tiles = match routed {
            None => m.div_ceil(tm),
            Some(r) => m
                .div_ceil(tm)
                .saturating_add(r.experts.saturating_add(1).min(m)),
        };
        let tiles = [n.div_ceil(tn), m_tiles];
        // A few rows of a whole weight, on the kernels that split (not the
        // lanes of a CPU device, whose workgroups are its threads).
        let splits_here = routed.is_none()
            && m <= GEMM_SPLIT_MAX_ROWS
            && tiles[1] == 1
            && row0 == 0
            && ldy == n
            && self.kernels.matmul != MatmulKernel::Lanes;
        let (splits, k_chunk) = if splits_here {
            gemm_splits(tiles[0], k)
        } else {
            (1, 0)
        };
        let part = if splits > 1 {
            let floats = floats(m, n)?
                .checked_mul(splits)
                .ok_or_else(|| Error::op(OP, "split outputs overflow"))?;
            Some(self.scratch(|b| &mut b.gemm_split_scratch, floats * 4)?)
        } else {
            None
        };
        let push = Push {
            n: u32_of(OP, "n", n)?,
            k: u32_of(OP, "k", k)?,
            m: u32_of(OP, "m", m)?,
            has_bias: (bias.is_some() && part.is_none()) as u32,
            row0: u32_of(OP, "row0", row0)?,
            ldy: u32_of(OP, "n", ldy)?,
            k_chunk: u32_of(OP, "k_chunk", k_chunk)?,
            x_div: u32_of(OP, "x_div", routed.map_or(1, |r| r.x_div))?,
            experts: u32_of(OP, "experts", routed.map_or(0, |r| r.experts))?,
        };
        let out = part.as_ref().unwrap_or(y);
        // Without a bias, x stands in at binding 3 (never read); the lists
        // are bound only when routed.
        let binds = [
            read(&w.buf),
            read(x),
            write(out),
            read(bias.unwrap_or(x)),
            read(routed.map_or(x, |r| &r.index)),
        ];
        let bound = if routed.is_some() { 5 } else { 4 };
        let groups = [
            u32_of(OP, "n tiles", tiles[0])?,
            u32_of(OP, "m tiles", tiles[1])?,
            u32_of(OP, "splits", splits)?,
        ];
        let max = self.caps().max_workgroup_count;
        if groups[0] > max[0] || groups[1] > max[1] || groups[2] > max[2] {
            return Err(Error::op(
                OP,
                format!("{m} x {n} output exceeds the device's workgroup limits"),
            ));
        }
        self.dispatch(
            OP,
            typed(shader, w.dtype).spec(u32::from(x_half)),
            &binds[..bound],
            bytemuck::bytes_of(&push),
            groups,
        )?;
        let Some(part) = part else {
            return Ok(());
        };
        let total = m * n;
        let sum = SplitSumPush {
            n: u32_of(OP, "n", n)?,
            total: u32_of(OP, "m * n", total)?,
            splits: u32_of(OP, "splits", splits)?,
            has_bias: bias.is_some() as u32,
        };
        let groups = self.stride_groups(total, 256);
        self.dispatch(
            OP,
            plain("split_sum"),
            &[read(&part), write(y), read(bias.unwrap_or(&part))],
            bytemuck::bytes_of(&sum),
            groups,
        )
    }
}
