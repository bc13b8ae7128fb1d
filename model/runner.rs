//! The transformer forward pass: one short list of ops per layer, the
//! architecture's differences read from `ModelConfig`. One pass per call:
//! prefill batches every prompt row, decode runs one row; the only readback
//! is the sampled token id or the logits asked for.

use crate::backend::{
    check, AttentionParams, Buffer, ComputeBackend, LinearOpts, RopeParams, RopeStyle,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::{ModelConfig, NormKind};
use crate::model::source::{ModelSource, TensorSource};
use crate::model::weights::{FfnIn, Linear, ModelWeights, Norm, WeightOptions};
use std::path::Path;

/// How a model is put on a backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// KV-cache capacity in positions; `None` = the model's context, capped at 8192.
    pub context: Option<usize>,
    /// Most prompt rows per pass; longer prompts run in several passes.
    /// `None` = the backend's [`ComputeBackend::default_max_batch`].
    pub max_batch: Option<usize>,
    pub weights: WeightOptions,
    /// KV-cache element type (`F32` or `F16`); `None` = the backend's
    /// [`ComputeBackend::default_kv_dtype`] (f16 on Vulkan, f32 on the CPU).
    pub kv_cache: Option<DType>,
}

/// What a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The argmax of the last row's logits (greedy decoding: 4 bytes read back).
    Argmax,
    /// The last row's logits.
    LastLogits,
    /// Logits for every row fed (for parity checks).
    AllLogits,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Token(u32),
    /// `rows * vocab` values.
    Logits(Vec<f32>),
}

/// Keys under which a backend may keep the decode passes for replay.
const DECODE_GREEDY: u32 = 0;
const DECODE_LOGITS: u32 = 1;

/// Most greedy decode steps submitted back to back by [`Model::decode_greedy`].
pub const MAX_DECODE_STEPS: usize = 64;

/// Per-pass activations, sized for `max_batch` rows.
#[derive(Clone, Copy)]
struct Scratch {
    rows: usize,
    ids: Buffer,
    pos: Buffer,
    x: Buffer,
    h: Buffer,
    t: Buffer,
    q: Buffer,
    k: Buffer,
    v: Buffer,
    qn: Buffer,
    kn: Buffer,
    att: Buffer,
    gate: Buffer,
    up: Buffer,
    act: Buffer,
    last: Buffer,
    logits: Buffer,
    token: Buffer,
    /// Greedy decode steps: [count, tokens...] (see `append_token`).
    history: Buffer,
}

/// A model on a backend with its KV cache: feed token ids, get tokens or logits.
pub struct Model {
    be: Box<dyn ComputeBackend>,
    cfg: ModelConfig,
    w: ModelWeights,
    k_cache: Vec<Buffer>,
    v_cache: Vec<Buffer>,
    kv_dtype: DType,
    capacity: usize,
    n_past: usize,
    s: Scratch,
    logits_rows: usize,
    /// Decode passes are kept and replayed (see [`Model::set_replay`]).
    replay: bool,
}

fn f32_buf(be: &mut dyn ComputeBackend, n: usize) -> Result<Buffer> {
    be.alloc(n.max(1) * 4)
}

impl Model {
    /// Load a GGUF file or a Hugging Face directory onto `be`.
    pub fn load(
        be: Box<dyn ComputeBackend>,
        path: &Path,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        let src = ModelSource::open(path)?;
        Model::from_source(be, src.config()?, src.tensors(), opts, progress)
    }

    pub fn from_source(
        mut be: Box<dyn ComputeBackend>,
        cfg: ModelConfig,
        src: &dyn TensorSource,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        let max_batch = opts.max_batch.unwrap_or_else(|| be.default_max_batch());
        if max_batch == 0 {
            return Err(Error::Invalid("max_batch must be at least 1".into()));
        }
        let capacity = opts.context.unwrap_or(cfg.n_ctx.min(8192)).max(1);
        let kv_dtype = opts.kv_cache.unwrap_or_else(|| be.default_kv_dtype());
        let kv_size = check::kv_value_bytes("kv cache", kv_dtype)?;
        let too_big = || {
            Error::Invalid(format!(
                "a {} KV cache of {capacity} positions x {} values is not possible",
                kv_dtype.name(),
                cfg.kv_dim()
            ))
        };
        let kv_bytes = capacity
            .checked_mul(cfg.kv_dim())
            .and_then(|n| n.checked_mul(kv_size))
            .ok_or_else(too_big)?;
        let kv_total = (kv_bytes as u64)
            .checked_mul(2 * cfg.n_layer as u64)
            .ok_or_else(too_big)?;
        let kv_what = format!("the {} KV cache of {capacity} positions", kv_dtype.name());
        // Checked before the weights load (a context too large fails in
        // a moment, not after the whole file is read) and again after, when
        // the weights hold their share of the memory.
        be.check_fits(&kv_what, kv_total)?;
        let w = ModelWeights::load(&cfg, src, be.as_mut(), opts.weights, progress)?;
        be.check_fits(&kv_what, kv_total)?;
        let mut k_cache = Vec::with_capacity(cfg.n_layer);
        let mut v_cache = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            k_cache.push(be.alloc(kv_bytes.max(4))?);
            v_cache.push(be.alloc(kv_bytes.max(4))?);
        }
        let rows = max_batch.min(capacity);
        let b = be.as_mut();
        // Per-token values and the chosen token are written and read by the
        // host in place: a decode step is one submit with no copies.
        let s = Scratch {
            rows,
            ids: b.alloc_mapped(rows * 4)?,
            pos: b.alloc_mapped(rows * 4)?,
            x: f32_buf(b, rows * cfg.n_embd)?,
            h: f32_buf(b, rows * cfg.n_embd)?,
            t: f32_buf(b, rows * cfg.n_embd)?,
            q: f32_buf(b, rows * cfg.q_dim())?,
            k: f32_buf(b, rows * cfg.kv_dim())?,
            v: f32_buf(b, rows * cfg.kv_dim())?,
            qn: f32_buf(b, rows * cfg.q_dim())?,
            kn: f32_buf(b, rows * cfg.kv_dim())?,
            att: f32_buf(b, rows * cfg.q_dim())?,
            gate: f32_buf(b, rows * cfg.n_ff)?,
            up: f32_buf(b, rows * cfg.n_ff)?,
            act: f32_buf(b, rows * cfg.n_ff)?,
            last: f32_buf(b, cfg.n_embd)?,
            logits: f32_buf(b, cfg.vocab)?,
            token: b.alloc_mapped(4)?,
            history: b.alloc_mapped((1 + MAX_DECODE_STEPS) * 4)?,
        };
        Ok(Model {
            be,
            cfg,
            w,
            k_cache,
            v_cache,
            kv_dtype,
            capacity,
            n_past: 0,
            s,
            logits_rows: 1,
            replay: true,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    pub fn backend_name(&self) -> String {
        self.be.name()
    }
    /// The device cost of the last pass (one decode step after generation).
    pub fn last_pass_stats(&self) -> Option<crate::backend::PassStats> {
        self.be.last_pass_stats()
    }
    /// See [`ComputeBackend::device_wait_ns`].
    pub fn device_wait_ns(&self) -> Option<u64> {
        self.be.device_wait_ns()
    }
    /// See [`ComputeBackend::set_profiling`].
    pub fn set_profiling(&mut self, on: bool) -> Result<()> {
        self.be.set_profiling(on)
    }
    /// See [`ComputeBackend::take_profile`].
    pub fn take_profile(&mut self) -> Vec<crate::profile::ProfileEvent> {
        self.be.take_profile()
    }
    pub fn backend(&mut self) -> &mut dyn ComputeBackend {
        self.be.as_mut()
    }
    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> usize {
        self.w.bytes
    }
    /// Positions already in the KV cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }
    /// KV-cache capacity in positions.
    /// KV-cache element type.
    pub fn kv_dtype(&self) -> DType {
        self.kv_dtype
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Keep decode passes and replay them (the default), or record every
    /// pass afresh: the two give the same results, so this is for tests and
    /// A/B timing.
    pub fn set_replay(&mut self, on: bool) {
        self.replay = on;
    }
    /// Forget the sequence (the cache is overwritten, not cleared).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }
    /// Pretend `n` positions are cached (benchmarks at depth; contents are whatever is there).
    pub fn set_n_past(&mut self, n: usize) -> Result<()> {
        if n > self.capacity {
            return Err(Error::Invalid(format!(
                "depth {n} exceeds the context of {} positions",
                self.capacity
            )));
        }
        self.n_past = n;
        Ok(())
    }

    /// Append `ids` to the sequence and return what `want` asks for, after the last id.
    pub fn forward(&mut self, ids: &[u32], want: Want) -> Result<Output> {
        if ids.is_empty() {
            return Err(Error::Invalid("no tokens to evaluate".into()));
        }
        if self.n_past + ids.len() > self.capacity {
            return Err(Error::Invalid(format!(
                "{} cached + {} new tokens exceed the context of {} positions",
                self.n_past,
                ids.len(),
                self.capacity
            )));
        }
        self.check_ids(ids)?;
        if let ([id], Want::Argmax) = (ids, want) {
            return Ok(Output::Token(self.decode_greedy(*id, 1)?[0]));
        }
        let mut all = Vec::new();
        let mut out = None;
        let chunks: Vec<&[u32]> = ids.chunks(self.s.rows).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            let step_want = match want {
                Want::AllLogits => Want::AllLogits,
                _ if last => want,
                _ => Want::LastLogits, // intermediate chunks only fill the cache
            };
            let o = self.pass(chunk, step_want, last || want == Want::AllLogits)?;
            match (o, want) {
                (Some(Output::Logits(l)), Want::AllLogits) => all.extend(l),
                (o, _) if last => out = o,
                _ => {}
            }
        }
        Ok(match want {
            Want::AllLogits => Output::Logits(all),
            _ => out.ok_or_else(|| Error::Invalid("no output".into()))?,
        })
    }

    /// `steps` greedy tokens after `first`, chosen on the device: each step's
    /// argmax feeds the next step's embedding, and the steps run back to back
    /// (one submit on backends that replay passes), read back once. The cache
    /// then holds `first` and every returned token but the last.
    pub fn decode_greedy(&mut self, first: u32, steps: usize) -> Result<Vec<u32>> {
        if steps == 0 {
            return Ok(Vec::new());
        }
        if steps > MAX_DECODE_STEPS {
            return Err(Error::Invalid(format!(
                "{steps} decode steps at once; at most {MAX_DECODE_STEPS}"
            )));
        }
        if self.n_past + steps > self.capacity {
            return Err(Error::Invalid(format!(
                "{} cached + {steps} new tokens exceed the context of {} positions",
                self.n_past, self.capacity
            )));
        }
        self.check_ids(&[first])?;
        let s = self.s;
        self.be.upload(&s.ids, 0, &first.to_le_bytes())?;
        self.be
            .upload(&s.pos, 0, &(self.n_past as u32).to_le_bytes())?;
        self.be.upload(&s.history, 0, &0u32.to_le_bytes())?;
        let mut done = 0;
        while done < steps {
            if self.replay && self.be.replay(DECODE_GREEDY, steps - done)? {
                break;
            }
            self.begin(Some(DECODE_GREEDY))?;
            self.record_closed(1, Want::Argmax, true, true)?;
            done += 1;
        }
        let mut words = vec![0u32; 1 + steps];
        self.be
            .download(&s.history, 0, bytemuck::cast_slice_mut(&mut words))?;
        if words[0] as usize != steps {
            return Err(Error::Invalid(format!(
                "the device ran {} decode steps, {steps} were submitted",
                words[0]
            )));
        }
        self.n_past += steps;
        Ok(words[1..].to_vec())
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.vocab
            )));
        }
        Ok(())
    }

    /// Greedy next token after `ids`.
    pub fn next_token(&mut self, ids: &[u32]) -> Result<u32> {
        match self.forward(ids, Want::Argmax)? {
            Output::Token(t) => Ok(t),
            Output::Logits(_) => Err(Error::Invalid("expected a token".into())),
        }
    }

    /// Logits after the last of `ids`.
    pub fn logits(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        match self.forward(ids, Want::LastLogits)? {
            Output::Logits(l) => Ok(l),
            Output::Token(_) => Err(Error::Invalid("expected logits".into())),
        }
    }

    fn norm(&mut self, n: &Norm, x: Buffer, out: Buffer, rows: usize) -> Result<()> {
        let (d, eps) = (self.cfg.n_embd, self.cfg.norm_eps);
        match (self.cfg.norm, n.b) {
            (NormKind::Layer, Some(b)) => self.be.layer_norm(&x, &n.w, &b, &out, rows, d, eps),
            _ => self.be.rms_norm(&x, &n.w, &out, rows, d, eps),
        }
    }

    /// Norm `n` ahead of projections: an RMS norm is folded into them
    /// (returned as their norm weights); a layer norm runs into `out`.
    fn pre_norm(
        &mut self,
        n: &Norm,
        x: Buffer,
        out: Buffer,
        rows: usize,
    ) -> Result<(Buffer, Option<Buffer>)> {
        match (self.cfg.norm, n.b) {
            (NormKind::Layer, Some(_)) => {
                self.norm(n, x, out, rows)?;
                Ok((out, None))
            }
            _ => Ok((x, Some(n.w))),
        }
    }

    /// `y (+)= norm(x) · Wᵀ + b` (see [`ComputeBackend::linear`]).
    fn linear(
        &mut self,
        l: &Linear,
        x: Buffer,
        norm: Option<Buffer>,
        y: Buffer,
        m: usize,
        add: bool,
    ) -> Result<()> {
        let opts = LinearOpts {
            bias: l.b.as_ref(),
            norm: norm.as_ref().map(|w| (w, self.cfg.norm_eps)),
            add,
        };
        self.be.linear(&l.w, &x, &y, m, &opts)
    }

    /// The residual stream after a block: `x += W·input`, or with a
    /// post-norm (Gemma) `x += norm(W·input)`.
    fn residual(&mut self, l: &Linear, post: Option<Norm>, input: Buffer, m: usize) -> Result<()> {
        let s = self.s;
        let e = self.cfg.n_embd;
        match post {
            Some(n) => {
                self.linear(l, input, None, s.h, m, false)?;
                self.norm(&n, s.h, s.t, m)?;
                self.be.add(&s.x, &s.t, &s.x, m * e)
            }
            None => self.linear(l, input, None, s.x, m, true),
        }
    }

    /// Begin a pass, kept under `key` for replay when replay is on.
    fn begin(&mut self, key: Option<u32>) -> Result<()> {
        match key {
            Some(k) if self.replay => self.be.begin_replayable_pass(k),
            _ => self.be.begin_pass(),
        }
    }

    /// Record the ops of a pass begun by the caller and end it, closing it
    /// on an error too so the model stays usable (the first error wins).
    fn record_closed(&mut self, m: usize, want: Want, read: bool, feedback: bool) -> Result<()> {
        let recorded = self.record(m, want, read, feedback);
        let ended = self.be.end_pass();
        recorded.and(ended)
    }

    /// Record the ops of one pass over the `m` ids and positions already in
    /// the scratch buffers: embeddings, the layers, the head. With
    /// `feedback` (a single-row greedy step) the token goes back into `ids`
    /// for the next step (`append_token`).
    fn record(&mut self, m: usize, want: Want, read: bool, feedback: bool) -> Result<()> {
        let c = self.cfg.clone();
        let s = self.s;
        let logits = s.logits;
        let e = c.n_embd;
        self.be.embedding(&self.w.tok_embd, &s.ids, &s.x, m)?;
        if let Some(pe) = self.w.pos_embd {
            self.be.embedding(&pe, &s.pos, &s.t, m)?;
            self.be.add(&s.x, &s.t, &s.x, m * e)?;
        }
        if let Some(sc) = c.embed_scale {
            self.be.scale(&s.x, sc, &s.x, m * e)?;
        }
        for il in 0..c.n_layer {
            let lw = self.w.layers[il];
            let lc = c.layers[il];
            // Attention block.
            let (h, nw) = self.pre_norm(&lw.attn_norm, s.x, s.h, m)?;
            self.linear(&lw.q, h, nw, s.q, m, false)?;
            self.linear(&lw.k, h, nw, s.k, m, false)?;
            self.linear(&lw.v, h, nw, s.v, m, false)?;
            let (mut q, mut k) = (s.q, s.k);
            if let (Some(qn), Some(kn)) = (lw.q_norm, lw.k_norm) {
                self.be
                    .rms_norm(&s.q, &qn.w, &s.qn, m * c.n_head, c.head_dim, c.norm_eps)?;
                self.be
                    .rms_norm(&s.k, &kn.w, &s.kn, m * c.n_head_kv, c.head_dim, c.norm_eps)?;
                (q, k) = (s.qn, s.kn);
            }
            // Learned positions (no rope): rot_dim 0 only stores k and v.
            let rope = RopeParams {
                rows: m,
                n_heads: c.n_head,
                head_dim: c.head_dim,
                rot_dim: c.rope.map_or(0, |r| r.rot_dim),
                base: lc.rope_base,
                style: c.rope.map_or(RopeStyle::Neox, |r| r.style),
            };
            self.be.rope_store(
                &q,
                &k,
                &s.v,
                &s.pos,
                &self.k_cache[il],
                &self.v_cache[il],
                &rope,
                c.n_head_kv,
                self.kv_dtype,
            )?;
            let ap = AttentionParams {
                rows: m,
                n_heads: c.n_head,
                n_kv_heads: c.n_head_kv,
                head_dim: c.head_dim,
                capacity: self.capacity,
                scale: c.attn_scale,
                window: lc.window,
                kv_dtype: self.kv_dtype,
            };
            self.be.attention(
                &q,
                &self.k_cache[il],
                &self.v_cache[il],
                &s.pos,
                &s.att,
                &ap,
            )?;
            self.residual(&lw.o, lw.attn_post_norm, s.att, m)?;
            // Feed-forward block.
            let (h, nw) = self.pre_norm(&lw.ffn_norm, s.x, s.h, m)?;
            match lw.ffn_in {
                FfnIn::GateUp(w) => {
                    let norm = nw.as_ref().map(|w| (w, c.norm_eps));
                    self.be.linear_glu(c.act, &w, &h, &s.act, m, norm)?;
                }
                FfnIn::Split { gate: Some(g), up } => {
                    self.linear(&g, h, nw, s.gate, m, false)?;
                    self.linear(&up, h, nw, s.up, m, false)?;
                    self.be
                        .glu(c.act, &s.gate, Some(&s.up), &s.act, m * c.n_ff)?;
                }
                FfnIn::Split { gate: None, up } => {
                    self.linear(&up, h, nw, s.up, m, false)?;
                    self.be.glu(c.act, &s.up, None, &s.act, m * c.n_ff)?;
                }
            }
            self.residual(&lw.down, lw.ffn_post_norm, s.act, m)?;
        }
        let output_norm = self.w.output_norm;
        let output = self.w.output;
        let head = Linear { w: output, b: None };
        if want == Want::AllLogits {
            let (h, nw) = self.pre_norm(&output_norm, s.x, s.h, m)?;
            self.linear(&head, h, nw, logits, m, false)?;
        } else if read {
            // Only the last row's logits are needed.
            let last = if m == 1 {
                s.x
            } else {
                self.be.copy(&s.x, (m - 1) * e * 4, &s.last, 0, e * 4)?;
                s.last
            };
            let (h, nw) = self.pre_norm(&output_norm, last, s.h, 1)?;
            self.linear(&head, h, nw, logits, 1, false)?;
            if want == Want::Argmax && feedback {
                self.be.argmax(&logits, &s.ids, 1, c.vocab)?;
                self.be.append_token(&s.ids, &s.pos, &s.history)?;
            } else if want == Want::Argmax {
                self.be.argmax(&logits, &s.token, 1, c.vocab)?;
            }
        }
        Ok(())
    }

    /// One pass over `ids` (at most `max_batch` rows). Single-row passes
    /// that read logits are kept by the backend and replayed.
    fn pass(&mut self, ids: &[u32], want: Want, read: bool) -> Result<Option<Output>> {
        let m = ids.len();
        let c = self.cfg.clone();
        let positions: Vec<u32> = (self.n_past..self.n_past + m).map(|p| p as u32).collect();
        let logit_rows = if want == Want::AllLogits { m } else { 1 };
        if logit_rows > self.logits_rows {
            self.be.free(self.s.logits);
            self.s.logits = f32_buf(self.be.as_mut(), logit_rows * c.vocab)?;
            self.logits_rows = logit_rows;
        }
        let s = self.s;
        self.be.upload(&s.ids, 0, bytemuck::cast_slice(ids))?;
        self.be
            .upload(&s.pos, 0, bytemuck::cast_slice(&positions))?;
        if m == 1 && read && want == Want::LastLogits {
            if !(self.replay && self.be.replay(DECODE_LOGITS, 1)?) {
                self.begin(Some(DECODE_LOGITS))?;
                self.record_closed(m, want, read, false)?;
            }
        } else {
            self.begin(None)?;
            self.record_closed(m, want, read, false)?;
        }
        self.n_past += m;
        if !read {
            return Ok(None);
        }
        Ok(Some(match want {
            Want::Argmax => {
                let mut t = [0u8; 4];
                self.be.download(&s.token, 0, &mut t)?;
                Output::Token(u32::from_le_bytes(t))
            }
            _ => {
                let mut v = vec![0f32; logit_rows * c.vocab];
                self.be
                    .download(&s.logits, 0, bytemuck::cast_slice_mut(&mut v))?;
                Output::Logits(v)
            }
        }))
    }
}
