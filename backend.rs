//! The `ComputeBackend` trait: the only seam in vkllm that knows about devices.
//!
//! Buffers are opaque handles owned by the backend. Ops are recorded between
//! [`ComputeBackend::begin_pass`] and [`ComputeBackend::end_pass`] and run in
//! recording order: the CPU backend executes each op as it is recorded, the
//! Vulkan backend records one command buffer and submits it once at
//! `end_pass`. Reads of results (`download`) happen only after `end_pass`.
//!
//! Conventions shared by every op:
//! - activations are row-major `f32`; token ids and positions are `u32`;
//! - a matrix of `m` rows and `k` columns is `m * k` contiguous elements;
//! - weights are `[n, k]` row-major in their storage dtype (GGUF layout), so
//!   `matmul` computes `y[m, n] = x[m, k] · Wᵀ (+ bias[n])`;
//! - values that change per token (token ids, positions, and through them the
//!   attention length) are read from buffers, never baked into a pass, so a
//!   recorded decode pass can be replayed.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::profile::ProfileEvent;

/// Handle to a device buffer. Cheap to copy; the memory belongs to the
/// backend that made it and lives until [`ComputeBackend::free`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buffer {
    pub(crate) id: u32,
    /// Size in bytes.
    pub bytes: usize,
}

impl Buffer {
    pub fn new(id: u32, bytes: usize) -> Self {
        Buffer { id, bytes }
    }
    pub fn id(&self) -> u32 {
        self.id
    }
}

/// A weight matrix `[rows, cols]` in its storage dtype (`cols` is the
/// reduction dimension of `matmul`; `rows` the output features).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weight {
    pub buf: Buffer,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
}

/// Rotary embedding pair layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i+1)`: GGUF llama after llama.cpp's q/k permutation.
    Interleaved,
    /// Pairs `(i, i + rot_dim/2)`: Hugging Face `rotate_half`, GGUF qwen2/phi3/gemma.
    Neox,
}

/// Rotary embedding of `rows * n_heads` vectors of `head_dim` values, in place.
/// Row `r` uses position `positions[r]`; only the first `rot_dim` values of
/// each head rotate (partial rotary); frequency `i` is `base^(-2i/rot_dim)`,
/// changed as `scaling` says where given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub rows: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub rot_dim: usize,
    pub base: f32,
    pub style: RopeStyle,
    /// YaRN context extension (gpt-oss), or None for plain rotary.
    pub scaling: Option<RopeScaling>,
}

impl RopeParams {
    /// The inverse frequency of rotary pair `i` (`i < rot_dim / 2`) as every
    /// backend rotates by it: `base^(-2i/rot_dim)`, with YaRN's mix of
    /// interpolated and extrapolated frequency (see [`RopeScaling`]), in f64
    /// rounded once to f32. The angle is then `pos as f32 * inv_freq` in
    /// f32, as Hugging Face's float32 rotary embedding takes it (YaRN's
    /// included: its mix is a per-frequency factor).
    pub fn inv_freq(&self, i: usize) -> f32 {
        let f = (self.base as f64).powf(-2.0 * i as f64 / self.rot_dim as f64);
        match self.scaling {
            Some(s) => s.mix(f, i) as f32,
            None => f as f32,
        }
    }

    /// What `cos θ` and `sin θ` are multiplied by: YaRN's `mscale`, else 1.
    pub fn mscale(&self) -> f32 {
        self.scaling.map_or(1.0, |s| s.mscale)
    }
}

/// YaRN rotary scaling (llama.cpp's `rope_yarn` with ext_factor 1; Hugging
/// Face's `rope_type: "yarn"`). For rotary pair `i`, with `θ_extrap = pos ·
/// base^(-2i/rot_dim)` and `θ_interp = freq_scale · θ_extrap`:
/// `ramp = 1 - clamp((i - low) / max(0.001, high - low), 0, 1)`,
/// `θ = θ_interp · (1 - ramp) + θ_extrap · ramp`, and `cos θ`, `sin θ` are
/// both multiplied by `mscale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeScaling {
    /// `1 / factor`: how much slower the interpolated frequencies turn.
    pub freq_scale: f32,
    /// Correction dims: pairs below `low` keep their frequency (ramp 1),
    /// pairs from `high` on are interpolated (ramp 0).
    pub low: f32,
    pub high: f32,
    /// Attention scaling folded into the rotation.
    pub mscale: f32,
}

impl RopeScaling {
    /// YaRN's parameters for a context extended `factor` times past
    /// `original_ctx` positions, as llama.cpp computes them
    /// (`ggml_rope_yarn_corr_dims`; Hugging Face's `find_correction_range`):
    /// the correction dim of `n` rotations is `rot_dim · ln(original_ctx /
    /// (2πn)) / (2 ln base)`; `low` is that of `beta_fast`, `high` that of
    /// `beta_slow`, floored and ceiled with `truncate` (llama.cpp always;
    /// Hugging Face unless the config says `truncate: false`, as gpt-oss's
    /// does), then clamped to `[0, rot_dim - 1]`. `mscale = 0.1 ln(factor) +
    /// 1`.
    pub fn yarn(
        factor: f32,
        original_ctx: usize,
        beta_fast: f32,
        beta_slow: f32,
        rot_dim: usize,
        base: f32,
        truncate: bool,
    ) -> RopeScaling {
        let dims = rot_dim as f64;
        let corr_dim = |rotations: f32| {
            let turns = original_ctx as f64 / (rotations as f64 * 2.0 * std::f64::consts::PI);
            dims * turns.ln() / (2.0 * (base as f64).ln())
        };
        let (mut low, mut high) = (corr_dim(beta_fast), corr_dim(beta_slow));
        if truncate {
            low = low.floor();
            high = high.ceil();
        }
        RopeScaling {
            freq_scale: (1.0 / factor as f64) as f32,
            low: low.max(0.0) as f32,
            high: high.min(dims - 1.0) as f32,
            mscale: (0.1 * (factor as f64).ln() + 1.0) as f32,
        }
    }

    /// YaRN's ramp of pair `i`: 1 where the frequency is kept, 0 where it
    /// is interpolated.
    pub fn ramp(&self, i: usize) -> f64 {
        let (low, high) = (self.low as f64, self.high as f64);
        let y = (i as f64 - low) / (high - low).max(0.001);
        1.0 - y.clamp(0.0, 1.0)
    }

    /// Pair `i`'s frequency from its unscaled one `extrap`: the
    /// interpolated `freq_scale · extrap` and `extrap` mixed by the ramp.
    pub fn mix(&self, extrap: f64, i: usize) -> f64 {
        let ramp = self.ramp(i);
        let interp = self.freq_scale as f64 * extrap;
        interp * (1.0 - ramp) + extrap * ramp
    }
}

/// A paged KV cache: the cache buffers hold `pages` pages of `1 <<
/// page_log2` positions, and row `r`'s position `p` lives in cache row
/// `table[r * stride + (p >> page_log2)] << page_log2 | p % page_len`
/// (`table` holds `u32` page ids). `stride` 0: every row reads the first
/// table (the rows of one sequence, a prompt chunk); otherwise each row has
/// a table of its own, `stride` entries apart (a decode step of several
/// sequences). Without pages, position `p` is cache row `p`.
///
/// A page id at or past `pages` is never followed: the row stores nothing
/// there, and attention over it fails (the CPU at the op; Vulkan when the
/// pass ends, having read page 0 in its place) or, on devices that cannot
/// report it, attends as if that position held nothing. The runner writes
/// only valid ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPages {
    pub table: Buffer,
    pub page_log2: u32,
    pub stride: usize,
    pub pages: usize,
}

impl KvPages {
    /// Positions per page.
    pub fn page_len(&self) -> usize {
        1 << self.page_log2
    }
    /// Rows of each cache buffer: `pages` pages.
    pub fn cache_rows(&self) -> usize {
        self.pages << self.page_log2
    }
}

/// Causal multi-head attention of `rows` query rows against a KV cache.
///
/// `q` is `[rows, n_heads * head_dim]`; the caches are `[capacity, n_kv_heads *
/// head_dim]` and already hold the keys/values of every position the rows can
/// see. Row `r` at position `p = positions[r]` attends to cache positions
/// `j <= p` with `p - j < window` when `window > 0` (sliding window). Query head
/// `h` uses kv head `h / (n_heads / n_kv_heads)` (GQA). Scores are multiplied
/// by `scale` before the softmax. The caches hold `kv_dtype` values (see
/// [`ComputeBackend::default_kv_dtype`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    pub rows: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Cache capacity in positions (rows of the cache buffers); with
    /// `pages`, the positions one sequence may hold (a row's table length
    /// times the page length; the buffers hold `pages.cache_rows()` rows).
    pub capacity: usize,
    /// The most positions any row of the pass attends (at most `capacity`):
    /// a device plans its key splits for this span. It bounds no result: a
    /// row past it attends its whole span, however the pass was planned.
    pub span: usize,
    pub scale: f32,
    pub window: usize,
    /// Element type of both caches: `F32` or `F16`.
    pub kv_dtype: DType,
    /// Where the positions live when the cache is paged.
    pub pages: Option<KvPages>,
    /// The weight that reads the output next (the o projection), when
    /// known: a device may write the output in the form that weight's matmul
    /// reads (Vulkan: int8 digits for its integer-dot GEMV).
    pub next: Option<NextWeight>,
    /// Attention sinks (gpt-oss): `[n_heads]` f32 logits, one per query
    /// head, that join that head's softmax denominator and nothing else:
    /// with scores `s_j` (already scaled) and `M = max(max_j s_j, sink)`,
    /// `p_j = exp(s_j - M) / (Σ_j exp(s_j - M) + exp(sink - M))`, and the
    /// output is `Σ_j p_j v_j` (no longer a convex combination of values).
    pub sinks: Option<Buffer>,
}

/// A weight's type and size in bytes, as an op that feeds it may need them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextWeight {
    pub dtype: DType,
    pub bytes: usize,
}

impl NextWeight {
    pub fn of(w: &Weight) -> NextWeight {
        NextWeight {
            dtype: w.dtype,
            bytes: w.buf.bytes,
        }
    }
}

/// What [`ComputeBackend::linear`] adds to a plain `matmul`.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinearOpts<'a> {
    /// `bias[n]`, added to every row.
    pub bias: Option<&'a Buffer>,
    /// RMS-normalize each row of x first, with these `[k]` weights and eps.
    pub norm: Option<(&'a Buffer, f32)>,
    /// Add the result to `y` instead of overwriting it (the residual add).
    pub add: bool,
}

/// One of the projections [`ComputeBackend::linear_each`] makes of a
/// shared input: `y[m, w.rows] = x̂ · wᵀ + bias`.
#[derive(Clone, Copy, Debug)]
pub struct Projection<'a> {
    pub w: &'a Weight,
    pub bias: Option<&'a Buffer>,
    pub y: &'a Buffer,
}

/// `f(be, x̂)` with x̂ = `x` (`rows` of `dim`) RMS-normalized by `norm`
/// into a temporary buffer, or `x` itself without a norm: the input of
/// projections that fold their norm in.
pub fn with_normed<B: ComputeBackend + ?Sized>(
    be: &mut B,
    x: &Buffer,
    rows: usize,
    dim: usize,
    norm: Option<(&Buffer, f32)>,
    f: impl FnOnce(&mut B, &Buffer) -> Result<()>,
) -> Result<()> {
    let Some((nw, eps)) = norm else {
        return f(be, x);
    };
    let n = rows
        .checked_mul(dim)
        .ok_or_else(|| Error::op("matmul", "m * k overflows"))?;
    let t = be.alloc_temp(n.saturating_mul(4))?;
    let result = be
        .rms_norm(x, nw, &t, rows, dim, eps)
        .and_then(|()| f(be, &t));
    be.free_temp(t);
    result
}

/// [`ComputeBackend::linear_each`] as one `linear` per projection.
pub fn linear_apart<B: ComputeBackend + ?Sized>(
    be: &mut B,
    x: &Buffer,
    m: usize,
    norm: Option<(&Buffer, f32)>,
    outs: &[Projection],
) -> Result<()> {
    for p in outs {
        let opts = LinearOpts {
            bias: p.bias,
            norm,
            add: false,
        };
        be.linear(p.w, x, p.y, m, &opts)?;
    }
    Ok(())
}

/// Activation applied by [`ComputeBackend::glu`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    /// gpt-oss's clamped SwiGLU of gate `g` and up `u` (llama.cpp's
    /// `ggml_swiglu_oai`, alpha 1.702, limit 7): `g' = min(g, 7)`, `u' =
    /// clamp(u, -7, 7)`, `out = g' · sigmoid(1.702 g') · (u' + 1)`. Needs
    /// `up`: a glu without it is an error.
    SwigluOai,
    /// Squared ReLU, `max(x, 0)²` (BitNet b1.58's `relu2`).
    Relu2,
}

impl Activation {
    /// gpt-oss's SwiGLU constants: the sigmoid's slope and the clamp.
    pub const OAI_ALPHA: f32 = 1.702;
    pub const OAI_LIMIT: f32 = 7.0;
}

/// Mixture-of-experts routing of `rows` tokens over `experts` experts
/// ([`ComputeBackend::route_experts`]): each token takes the experts of its
/// `k` largest router logits (on equal logits the lower expert index
/// first), in that order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteParams {
    pub rows: usize,
    pub experts: usize,
    pub k: usize,
    /// The chosen experts' weights: the softmax over the `k` chosen logits
    /// (`true`: Mixtral, Qwen3-MoE with `norm_topk_prob`, gpt-oss; equal to
    /// the softmax over all experts renormalised over the `k`), or the
    /// softmax over all experts at the chosen ones (`false`).
    pub renorm: bool,
}

/// A matmul of routed rows ([`ComputeBackend::matmul_experts`]): `rows`
/// tokens, each routed to `k` experts, so `rows * k` output rows (slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertsParams {
    pub rows: usize,
    pub k: usize,
    /// Matrices stacked in the weight: expert `e` holds its rows
    /// `e * n .. (e + 1) * n`, `n = w.rows / experts`.
    pub experts: usize,
    /// x has a row per slot (`[rows * k, cols]`: the down projection of
    /// each slot's activation); otherwise one per token, shared by its `k`
    /// slots (`[rows, cols]`: the gate and up projections).
    pub x_per_slot: bool,
    /// Each expert's matrix is its gate's `n / 2` rows then its up's, and
    /// `y[s] = act(x·G_eᵀ + bias_g) ⊙ (x·U_eᵀ + bias_u)` (`n / 2` values
    /// a slot): the gated FFN's input in one op, as `linear_glu`.
    pub glu: Option<Activation>,
}

impl ExpertsParams {
    /// Output rows: one per (token, chosen expert).
    pub fn slots(&self) -> usize {
        self.rows.saturating_mul(self.k)
    }
}

/// What one recorded pass holds, on backends that record passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    pub submits: u32,
    pub barriers: u32,
    pub descriptor_sets: u32,
    pub dispatches: u32,
    pub copies: u32,
    /// Kernels the driver compiled while the pass was recorded (none once
    /// a model's kernels are made at load: [`ComputeBackend::begin_kernel_survey`]).
    pub kernels_made: u32,
}

impl std::fmt::Display for PassStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} submit, {} dispatches, {} copies, {} barriers, {} descriptor sets",
            self.submits, self.dispatches, self.copies, self.barriers, self.descriptor_sets
        )?;
        if self.kernels_made > 0 {
            write!(f, ", {} kernels compiled", self.kernels_made)?;
        }
        Ok(())
    }
}

/// Device memory held by a backend's allocator ([`ComputeBackend::device_memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemoryUse {
    /// Memory blocks obtained from the driver.
    pub reserved_bytes: u64,
    /// Bytes of those blocks handed out to live buffers.
    pub allocated_bytes: u64,
    /// Live buffers.
    pub allocations: usize,
}

/// Largest upload allowed inside a pass (Vulkan's `vkCmdUpdateBuffer` limit).
pub const PASS_UPLOAD_MAX: usize = 65536;

/// Devices implement this trait; the model runner talks to nothing else.
///
/// `Send`, so a backend (and the [`crate::model::Model`] that owns it) can be
/// built on one thread and used on another; not `Sync`: every call takes
/// `&mut self`, one thread at a time. Separate backends are independent and
/// may run on separate threads at once.
pub trait ComputeBackend: Send {
    /// Human-readable device name, e.g. `cpu (avx2+fma, 2 threads)`.
    fn name(&self) -> String;

    /// Device memory this backend holds through its allocator, where it
    /// has one (soak and leak tests watch it stay flat).
    fn device_memory(&self) -> Option<DeviceMemoryUse> {
        None
    }

    /// Bytes this backend could still allocate for buffers, where it can
    /// tell (a split model's default shares follow it).
    fn free_memory(&self) -> Option<u64> {
        None
    }

    /// What the last recorded pass holds (submits, dispatches, barriers,
    /// descriptor sets), where the backend records passes; a replayed pass
    /// is the one recorded last under its key.
    fn last_pass_stats(&self) -> Option<PassStats> {
        None
    }

    /// Nanoseconds the host has spent blocked waiting for the device since
    /// the backend was made; `None` where ops run on the calling thread. Wall
    /// time minus this is the host's own cost (recording, submitting).
    fn device_wait_ns(&self) -> Option<u64> {
        None
    }

    /// Switch profiling on or off (outside a pass). While on, every pass
    /// records timed events for [`ComputeBackend::take_profile`]; backends
    /// that cannot time their work return `Error::Unsupported`.
    fn set_profiling(&mut self, on: bool) -> Result<()> {
        if on {
            return Err(Error::Unsupported(format!(
                "profiling is not available on the {} backend (use --backend vulkan)",
                self.name()
            )));
        }
        Ok(())
    }
    /// The events recorded since the last call (empty when profiling is off).
    fn take_profile(&mut self) -> Vec<ProfileEvent> {
        Vec::new()
    }

    /// The KV-cache element type a model gets unless the caller asks for
    /// another ([`DType::F32`] or [`DType::F16`]; see `store_rows`,
    /// `rope_store` and `attention`, which take it with the cache buffers).
    /// Backends that cannot hold `F16` caches return an error from those
    /// ops when asked to.
    fn default_kv_dtype(&self) -> DType {
        DType::F32
    }

    /// Prompt rows per pass when [`crate::model::LoadOptions`] does not say.
    fn default_max_batch(&self) -> usize {
        512
    }

    /// Checks, before allocating, that `bytes` more bytes for `what` (e.g.
    /// "the f32 KV cache of 8192 positions") fit in the memory the backend
    /// allocates from; the error ([`Error::OutOfHostMemory`] or
    /// [`Error::OutOfDeviceMemory`]) says how much is needed and available.
    /// Large requests are checked because a refused allocation is not
    /// always reported: the OS may grant host memory it later cannot back.
    /// Backends that cannot tell accept.
    fn check_fits(&self, what: &str, bytes: u64) -> Result<()> {
        let _ = (what, bytes);
        Ok(())
    }
    /// The largest buffer one op may read or write whole, where the device
    /// limits it (Vulkan: `maxStorageBufferRange`, 128 MiB on lavapipe).
    fn max_op_buffer_bytes(&self) -> Option<u64> {
        None
    }
    /// A zero-initialised buffer of `bytes` bytes.
    fn alloc(&mut self, bytes: usize) -> Result<Buffer>;
    /// A buffer like [`ComputeBackend::alloc`] that the host writes and reads
    /// in place, without a copy or submit (per-token values, the sampled
    /// token). Its uploads and downloads are outside passes.
    fn alloc_mapped(&mut self, bytes: usize) -> Result<Buffer> {
        self.alloc(bytes)
    }
    /// Copy `data` into `buf` at byte `offset`. Inside a pass the write is
    /// ordered with the recorded ops (per-token ids and positions, so a decode
    /// step is one submit); there it must be at most [`PASS_UPLOAD_MAX`] bytes
    /// with offset and length multiples of 4.
    fn upload(&mut self, buf: &Buffer, offset: usize, data: &[u8]) -> Result<()>;
    /// Copy `out.len()` bytes from `buf` at byte `offset`. Not allowed inside a pass.
    fn download(&mut self, buf: &Buffer, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Release a buffer. Freeing an unknown handle is a no-op.
    fn free(&mut self, buf: Buffer);
    /// A buffer of at least `bytes` bytes, contents unspecified, for an
    /// intermediate of the default fused ops (`linear`, ...): backends may
    /// keep and reuse them instead of allocating on every call.
    fn alloc_temp(&mut self, bytes: usize) -> Result<Buffer> {
        self.alloc(bytes)
    }
    /// Give back a buffer of [`ComputeBackend::alloc_temp`].
    fn free_temp(&mut self, buf: Buffer) {
        self.free(buf)
    }

    /// Upload a `[rows, cols]` weight stored as `dtype` (GGUF block bytes).
    /// Backends may repack the data for their kernels.
    fn upload_weight(
        &mut self,
        dtype: DType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<Weight>;
    /// Release a weight.
    fn free_weight(&mut self, w: Weight) {
        self.free(w.buf)
    }

    /// Start recording a forward pass.
    fn begin_pass(&mut self) -> Result<()>;
    /// Run everything recorded since `begin_pass` and wait for it.
    fn end_pass(&mut self) -> Result<()>;
    /// Start recording a pass that the backend may keep under `key` and run
    /// again with [`ComputeBackend::replay`] (a decode step). It must read
    /// every per-token value from buffers and allocate nothing. Ends with
    /// `end_pass`, which runs it once.
    fn begin_replayable_pass(&mut self, key: u32) -> Result<()> {
        let _ = key;
        self.begin_pass()
    }
    /// Run the pass kept under `key` `times` times back to back and wait.
    /// `Ok(false)` when none is kept (never recorded, or invalidated because
    /// a buffer was freed): the caller records it again. Backends that run
    /// ops as they are recorded keep nothing.
    fn replay(&mut self, key: u32, times: usize) -> Result<bool> {
        let _ = (key, times);
        Ok(false)
    }

    /// Start a kernel survey: until [`ComputeBackend::end_kernel_survey`],
    /// passes are recorded only to learn which compiled kernels they use,
    /// and nothing recorded runs (the buffers they write keep what they
    /// held). `Ok(false)`, and no survey, where there is nothing to make
    /// ahead: a backend that runs ops as they are recorded, or one told not
    /// to.
    fn begin_kernel_survey(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// End the survey and make the kernels its passes use that do not exist
    /// yet (in parallel where the device allows), so a model's first real
    /// pass does not wait on them. Returns how many were made.
    fn end_kernel_survey(&mut self) -> Result<usize> {
        Ok(0)
    }

    /// `out[r] = dequant(table[ids[r]])` for `rows` ids; `out` is `[rows, table.cols]`.
    /// An id past the table is an error where the backend can see ids (CPU);
    /// a device that cannot writes zeros and never reads outside the table.
    /// The runner checks ids against the vocabulary before they reach a pass.
    fn embedding(&mut self, table: &Weight, ids: &Buffer, out: &Buffer, rows: usize) -> Result<()>;
    /// `y[m, w.rows] = x[m, w.cols] · Wᵀ + bias`.
    fn matmul(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        y: &Buffer,
        m: usize,
    ) -> Result<()>;
    /// `y[m, w.rows] (+)= rms_norm(x) · Wᵀ + bias`: a projection with the
    /// norm before it and the residual add after it folded in, as `o` asks.
    /// Backends fuse what they can; this default runs the separate ops
    /// through temporary buffers.
    fn linear(
        &mut self,
        w: &Weight,
        x: &Buffer,
        y: &Buffer,
        m: usize,
        o: &LinearOpts,
    ) -> Result<()> {
        with_normed(self, x, m, w.cols, o.norm, |be, input| {
            if !o.add {
                return be.matmul(w, o.bias, input, y, m);
            }
            let n = m
                .checked_mul(w.rows)
                .ok_or_else(|| Error::op("matmul", "m * k overflows"))?;
            let t = be.alloc_temp(n.saturating_mul(4))?;
            let r = be
                .matmul(w, o.bias, input, &t, m)
                .and_then(|()| be.add(y, &t, y, n));
            be.free_temp(t);
            r
        })
    }
    /// Projections of one input, as q, k and v read the attention's: for
    /// each `p` of `outs`, `p.y[m, p.w.rows] = rms_norm(x) · p.wᵀ + p.bias`
    /// (x itself without `norm`). Backends that can run them as one op do
    /// (the CPU: one team job where each would cost a hand-off); this
    /// default runs [`ComputeBackend::linear`] for each.
    fn linear_each(
        &mut self,
        x: &Buffer,
        m: usize,
        norm: Option<(&Buffer, f32)>,
        outs: &[Projection],
    ) -> Result<()> {
        linear_apart(self, x, m, norm, outs)
    }
    /// The gated feed-forward input in one op: `out[m, n] = act(x̂·Gᵀ) ⊙
    /// (x̂·Uᵀ)` (as [`ComputeBackend::glu`] mixes gate and up), x̂ = `x`
    /// RMS-normalized with `norm` when given, `gate_up` holding G's `n` rows
    /// followed by U's.
    fn linear_glu(
        &mut self,
        act: Activation,
        gate_up: &Weight,
        x: &Buffer,
        out: &Buffer,
        m: usize,
        norm: Option<(&Buffer, f32)>,
    ) -> Result<()>;
    /// Per row of `dim`: `out = x / sqrt(mean(x²) + eps) * w`. `w` has `dim` values.
    fn rms_norm(
        &mut self,
        x: &Buffer,
        w: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()>;
    /// Per row of `dim`: `out = (x - mean) / sqrt(var + eps) * w + b`.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &mut self,
        x: &Buffer,
        w: &Buffer,
        b: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()>;
    /// Rotary embedding in place on `x`, positions from `positions` (`u32` per row).
    fn rope(&mut self, x: &Buffer, positions: &Buffer, p: &RopeParams) -> Result<()>;
    /// Attention (see [`AttentionParams`]); writes `out` `[rows, n_heads * head_dim]`.
    fn attention(
        &mut self,
        q: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        positions: &Buffer,
        out: &Buffer,
        p: &AttentionParams,
    ) -> Result<()>;
    /// `out[i] = act(gate[i]) * up[i]`, or `act(gate[i])` without `up`; `n`
    /// values ([`Activation::SwigluOai`]: its own mix of both, `up` required).
    fn glu(
        &mut self,
        act: Activation,
        gate: &Buffer,
        up: Option<&Buffer>,
        out: &Buffer,
        n: usize,
    ) -> Result<()>;
    /// Per row of `dim` values: each value rounded to the 255 int8 levels
    /// of the row's largest magnitude and back, `out = clamp(round(x · s),
    /// -128, 127) / s` with `s = 127 / max(max|x|, 1e-5)` and ties to even
    /// (BitNet's per-token activation quantization, as transformers'
    /// `ActQuant` computes it). `out` may alias `x`.
    fn round_i8(&mut self, x: &Buffer, out: &Buffer, rows: usize, dim: usize) -> Result<()>;
    /// `out[i] = a[i] + b[i]` for `n` values (`out` may alias `a`).
    fn add(&mut self, a: &Buffer, b: &Buffer, out: &Buffer, n: usize) -> Result<()>;
    /// `out[i] = x[i] * s` for `n` values (`out` may alias `x`).
    fn scale(&mut self, x: &Buffer, s: f32, out: &Buffer, n: usize) -> Result<()>;
    /// Copy `bytes` bytes from `src` at `src_offset` to `dst` at `dst_offset`
    /// (the KV-cache append); offsets and size are multiples of 4.
    fn copy(
        &mut self,
        src: &Buffer,
        src_offset: usize,
        dst: &Buffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()>;
    /// Index of the largest value of each row (`u32`; the first on ties;
    /// NaNs never win; a row without a candidate gives 0). With `allowed`
    /// (`n.div_ceil(32)` words a row, bit `i % 32` of word `i / 32` for value
    /// `i`) only the values it marks compete: a grammar's mask applied where
    /// the logits are, so the host reads one id instead of the vocabulary.
    fn argmax(
        &mut self,
        x: &Buffer,
        allowed: Option<&Buffer>,
        out: &Buffer,
        rows: usize,
        n: usize,
    ) -> Result<()>;
    /// `dst` row `positions[r]` = `src` row `r` for `rows` rows of `row_len`
    /// values (the KV-cache append at positions read on the device); `dst`
    /// holds `dst_dtype` values (`F32`, or `F16` rounded from `src`, with an
    /// even `row_len`). A position past `dst` is skipped (the attention op
    /// reports it). With `pages` the rows go where the tables say.
    #[allow(clippy::too_many_arguments)]
    fn store_rows(
        &mut self,
        src: &Buffer,
        dst: &Buffer,
        positions: &Buffer,
        rows: usize,
        row_len: usize,
        dst_dtype: DType,
        pages: Option<&KvPages>,
    ) -> Result<()>;
    /// The attention front of a step in one op: [`ComputeBackend::rope`] on
    /// `q` in place (`p.n_heads` heads), `k` (`n_kv_heads` heads) roped with
    /// the same parameters into `k_cache` row `positions[r]`, `v` copied into
    /// `v_cache` row `positions[r]`. `p.rot_dim == 0`: no rotation (learned
    /// positions). A position past the caches stores nothing. The caches
    /// hold `kv_dtype` values (as `store_rows`' `dst_dtype`), paged as
    /// `pages` says.
    #[allow(clippy::too_many_arguments)]
    fn rope_store(
        &mut self,
        q: &Buffer,
        k: &Buffer,
        v: &Buffer,
        positions: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        p: &RopeParams,
        n_kv_heads: usize,
        kv_dtype: DType,
        pages: Option<&KvPages>,
    ) -> Result<()>;
    /// [`ComputeBackend::rope_store`] then [`ComputeBackend::attention`] over
    /// the same rows and heads (`rope` and `p` must agree): the front of an
    /// attention block as one op, which backends fuse where they can (on
    /// Vulkan a decode step's rope, cache append and attention are one
    /// dispatch). `q` may be left unrotated.
    #[allow(clippy::too_many_arguments)]
    fn rope_store_attention(
        &mut self,
        q: &Buffer,
        k: &Buffer,
        v: &Buffer,
        positions: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        rope: &RopeParams,
        p: &AttentionParams,
        out: &Buffer,
    ) -> Result<()> {
        self.rope_store(
            q,
            k,
            v,
            positions,
            k_cache,
            v_cache,
            rope,
            p.n_kv_heads,
            p.kv_dtype,
            p.pages.as_ref(),
        )?;
        self.attention(q, k_cache, v_cache, positions, out, p)
    }
    /// Greedy feedback after a decode step: `history[1 + history[0]] =
    /// ids[0]`, `history[0] += 1`, `positions[0] += 1`, so the next step
    /// embeds the token just chosen at the next position, with no host
    /// round trip. `history` holds `1 + steps` values.
    fn append_token(&mut self, ids: &Buffer, positions: &Buffer, history: &Buffer) -> Result<()>;

    /// Mixture-of-experts routing (see [`RouteParams`]): `logits` is
    /// `[rows, experts]`; writes `ids` `[rows, k]` (`u32` expert indices) and
    /// `weights` `[rows, k]` (`f32`).
    fn route_experts(
        &mut self,
        logits: &Buffer,
        ids: &Buffer,
        weights: &Buffer,
        p: &RouteParams,
    ) -> Result<()>;
    /// `y[s] = x[s or s / k] · W_eᵀ + bias[e]` for every slot `s` of
    /// `p.slots()`, `e = ids[s]` (see [`ExpertsParams`]): `y` is `[rows * k,
    /// n]`, `bias` (optional) `[experts, n]`, `n = w.rows / experts`. Only the
    /// chosen experts' rows are read. An id at or past `experts` is an error
    /// where the backend can see ids (CPU); a device that cannot writes
    /// zeros for that slot and never reads outside the weight.
    fn matmul_experts(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        ids: &Buffer,
        y: &Buffer,
        p: &ExpertsParams,
    ) -> Result<()>;
    /// `out[r] (+)= Σ_j weights[r * k + j] · y[r * k + j]` over rows of `n`
    /// values, for `rows` rows: the chosen experts' outputs mixed (added to
    /// `out` with `add`, the residual stream).
    #[allow(clippy::too_many_arguments)]
    fn sum_experts(
        &mut self,
        y: &Buffer,
        weights: &Buffer,
        out: &Buffer,
        rows: usize,
        k: usize,
        n: usize,
        add: bool,
    ) -> Result<()>;
}

/// Checks shared by every backend's op entry points, so shape errors read the
/// same whichever device runs.
pub mod check {
    use super::{Buffer, ExpertsParams, KvPages, RouteParams, Weight};
    use crate::dtype::DType;
    use crate::error::{Error, Result};

    /// Bytes per value of a KV cache of `dtype`: 4 (`F32`) or 2 (`F16`).
    pub fn kv_value_bytes(op: &'static str, dtype: DType) -> Result<usize> {
        match dtype {
            DType::F32 => Ok(4),
            DType::F16 => Ok(2),
            other => Err(Error::op(
                op,
                format!("a KV cache holds f32 or f16, not {}", other.name()),
            )),
        }
    }

    /// `buf` must hold at least `elems` values of the KV-cache `dtype`.
    pub fn fits_kv(
        op: &'static str,
        what: &str,
        buf: &Buffer,
        elems: usize,
        dtype: DType,
    ) -> Result<()> {
        let size = kv_value_bytes(op, dtype)?;
        let need = elems
            .checked_mul(size)
            .ok_or_else(|| Error::op(op, format!("{what}: {elems} elements overflow")))?;
        if buf.bytes < need {
            return Err(Error::op(
                op,
                format!(
                    "{what} holds {} bytes but {elems} {} values ({need} bytes) are needed",
                    buf.bytes,
                    dtype.name()
                ),
            ));
        }
        Ok(())
    }

    /// Rows the cache buffers of an op over `rows` rows must hold, for
    /// sequences of up to `capacity` positions: `capacity` unpaged, else
    /// the pages' rows, once the page table is checked to hold every row's
    /// table (`capacity` positions' pages each).
    pub fn kv_rows(
        op: &'static str,
        pages: Option<&KvPages>,
        rows: usize,
        capacity: usize,
    ) -> Result<usize> {
        let Some(pg) = pages else {
            return Ok(capacity);
        };
        if pg.page_log2 >= 31 {
            return Err(Error::op(
                op,
                format!("pages of 2^{} positions are too long", pg.page_log2),
            ));
        }
        let per_row = capacity.div_ceil(pg.page_len());
        if pg.stride != 0 && pg.stride < per_row {
            return Err(Error::op(
                op,
                format!(
                    "page tables {} entries apart cannot map {capacity} positions in pages of {}",
                    pg.stride,
                    pg.page_len()
                ),
            ));
        }
        let entries = match pg.stride {
            0 => per_row,
            s => rows
                .saturating_sub(1)
                .checked_mul(s)
                .and_then(|n| n.checked_add(per_row))
                .ok_or_else(|| Error::op(op, "page tables overflow"))?,
        };
        fits(op, "page table", &pg.table, entries)?;
        pg.pages
            .checked_mul(pg.page_len())
            .ok_or_else(|| Error::op(op, "pages overflow"))
    }

    /// `buf` must hold at least `elems` 4-byte values.
    pub fn fits(op: &'static str, what: &str, buf: &Buffer, elems: usize) -> Result<()> {
        let need = elems
            .checked_mul(4)
            .ok_or_else(|| Error::op(op, format!("{what}: {elems} elements overflow")))?;
        if buf.bytes < need {
            return Err(Error::op(
                op,
                format!(
                    "{what} holds {} bytes but {elems} values ({need} bytes) are needed",
                    buf.bytes
                ),
            ));
        }
        Ok(())
    }

    /// route_experts' parameters: `k` of 1 to `experts`. Returns the
    /// logits' and the picks' value counts (`rows * experts`, `rows * k`).
    pub fn route(op: &'static str, p: &RouteParams) -> Result<(usize, usize)> {
        if p.k == 0 || p.k > p.experts {
            return Err(Error::op(
                op,
                format!("{} of {} experts cannot be chosen", p.k, p.experts),
            ));
        }
        match (p.rows.checked_mul(p.experts), p.rows.checked_mul(p.k)) {
            (Some(n), Some(nk)) => Ok((n, nk)),
            _ => Err(Error::op(op, "rows * experts overflows")),
        }
    }

    /// What matmul_experts' shapes come to ([`super::ExpertsParams`]).
    #[derive(Clone, Copy, Debug)]
    pub struct Experts {
        /// Rows of one expert's matrix (`w.rows / experts`).
        pub n: usize,
        /// Values of one slot's output: `n`, or `n / 2` with a GLU.
        pub n_out: usize,
        /// `rows * k`.
        pub slots: usize,
        /// Rows of x: `slots`, or `rows` where the slots share theirs.
        pub x_rows: usize,
        /// Values of x and of y.
        pub xn: usize,
        pub yn: usize,
    }

    /// matmul_experts' weight splits into `p.experts` matrices and its
    /// sizes count.
    pub fn experts(op: &'static str, w: &Weight, p: &ExpertsParams) -> Result<Experts> {
        if p.experts == 0 || !w.rows.is_multiple_of(p.experts) {
            return Err(Error::op(
                op,
                format!("{} rows do not split into {} experts", w.rows, p.experts),
            ));
        }
        let n = w.rows / p.experts;
        if p.glu.is_some() && !n.is_multiple_of(2) {
            return Err(Error::op(
                op,
                format!("an expert's gate and up rows are an even count, not {n}"),
            ));
        }
        let n_out = if p.glu.is_some() { n / 2 } else { n };
        let slots = p.rows.checked_mul(p.k);
        let x_rows = if p.x_per_slot { slots } else { Some(p.rows) };
        let yn = slots.and_then(|s| s.checked_mul(n_out));
        let xn = x_rows.and_then(|r| r.checked_mul(w.cols));
        match (slots, x_rows, xn, yn) {
            (Some(slots), Some(x_rows), Some(xn), Some(yn)) => Ok(Experts {
                n,
                n_out,
                slots,
                x_rows,
                xn,
                yn,
            }),
            _ => Err(Error::op(op, "rows * columns overflows")),
        }
    }

    /// sum_experts' value counts: out's `rows * n` and y's `rows * k * n`.
    pub fn sum_experts(
        op: &'static str,
        rows: usize,
        k: usize,
        n: usize,
    ) -> Result<(usize, usize)> {
        let yn = rows.checked_mul(k).and_then(|v| v.checked_mul(n));
        match (rows.checked_mul(n), yn) {
            (Some(on), Some(yn)) => Ok((on, yn)),
            _ => Err(Error::op(op, "rows * n overflows")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{RopeParams, RopeScaling, RopeStyle};

    /// gpt-oss's rope (head_dim 64, base 150000) with its YaRN config
    /// (factor 32 over 4096 positions, beta_fast 32, beta_slow 1).
    fn gpt_oss(truncate: bool) -> RopeParams {
        RopeParams {
            rows: 1,
            n_heads: 1,
            head_dim: 64,
            rot_dim: 64,
            base: 150000.0,
            style: RopeStyle::Neox,
            scaling: Some(RopeScaling::yarn(
                32.0, 4096, 32.0, 1.0, 64, 150000.0, truncate,
            )),
        }
    }

    fn close(got: f64, want: f64, what: &str) {
        assert!(
            (got - want).abs() <= 1e-6 * want.abs(),
            "{what}: {got} vs {want}"
        );
    }

    #[test]
    fn yarn_matches_gpt_oss_numbers() {
        // By hand (Python, f64): the correction dim of n rotations is
        // 64 ln(4096 / (2πn)) / (2 ln 150000): 8.092779115512402 for n = 32,
        // 17.39802450158856 for n = 1; mscale = 0.1 ln 32 + 1.
        for (truncate, low, high) in [
            (false, 8.092779115512402, 17.39802450158856),
            (true, 8.0, 18.0),
        ] {
            let p = gpt_oss(truncate);
            let s = p.scaling.unwrap();
            let what = format!("truncate {truncate}");
            close(s.low as f64, low, &format!("{what}: low"));
            close(s.high as f64, high, &format!("{what}: high"));
            close(
                s.freq_scale as f64,
                1.0 / 32.0,
                &format!("{what}: freq_scale"),
            );
            close(
                s.mscale as f64,
                1.3465735902799727,
                &format!("{what}: mscale"),
            );
            // Pair i's frequency: 150000^(-i/32) below low, that over 32
            // from high on, mixed by the ramp 1 - (i - low) / (high - low)
            // between (Python, f64 from the f32 low and high).
            let want: [(usize, f64); 5] = if truncate {
                [
                    (0, 1.0),
                    (9, 0.031620752066373825),
                    (12, 0.007015713956207037),
                    (17, 0.00022794779215473682),
                    (18, 3.830881178146228e-05),
                ]
            } else {
                [
                    (0, 1.0),
                    (9, 0.031705696135759354),
                    (12, 0.006794958841055632),
                    (17, 0.0001293185487156734),
                    (18, 3.830881178146228e-05),
                ]
            };
            for (i, f) in want {
                close(p.inv_freq(i) as f64, f, &format!("{what}: inv_freq({i})"));
            }
        }
        // A ramp past the last dim: high clamps to rot_dim - 1.
        let s = RopeScaling::yarn(32.0, 1 << 20, 0.5, 0.001, 64, 10000.0, true);
        assert_eq!(s.high, 63.0);
        assert!(s.low <= s.high);
    }
}
