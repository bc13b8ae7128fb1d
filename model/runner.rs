//! The transformer forward pass: one short list of ops per layer, the
//! architecture's differences read from `ModelConfig`. One pass per call:
//! prefill batches every prompt row, decode runs one row; the only readback
//! is the sampled token id or the logits asked for.

use crate::backend::{AttentionParams, Buffer, ComputeBackend, RopeParams};
use crate::error::{Error, Result};
use crate::model::config::{ModelConfig, NormKind};
use crate::model::gguf::GgufFile;
use crate::model::hf::HfCheckpoint;
use crate::model::source::TensorSource;
use crate::model::weights::{Linear, ModelWeights, Norm, WeightOptions};
use std::path::Path;

/// How a model is put on a backend.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// KV-cache capacity in positions; `None` = the model's context, capped at 8192.
    pub context: Option<usize>,
    /// Most prompt rows per pass; longer prompts run in several passes.
    pub max_batch: usize,
    pub weights: WeightOptions,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            context: None,
            max_batch: 512,
            weights: WeightOptions::default(),
        }
    }
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
}

/// A model on a backend with its KV cache: feed token ids, get tokens or logits.
pub struct Model {
    be: Box<dyn ComputeBackend>,
    cfg: ModelConfig,
    w: ModelWeights,
    k_cache: Vec<Buffer>,
    v_cache: Vec<Buffer>,
    capacity: usize,
    n_past: usize,
    s: Scratch,
    logits_rows: usize,
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
        if path.is_dir() {
            let hf = HfCheckpoint::open(path)?;
            let cfg = hf.config.clone();
            Model::from_source(be, cfg, &hf, opts, progress)
        } else {
            let g = GgufFile::open(path)?;
            let cfg = ModelConfig::from_gguf(&g, None)?;
            Model::from_source(be, cfg, &g, opts, progress)
        }
    }

    pub fn from_source(
        mut be: Box<dyn ComputeBackend>,
        cfg: ModelConfig,
        src: &dyn TensorSource,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        if opts.max_batch == 0 {
            return Err(Error::Invalid("max_batch must be at least 1".into()));
        }
        let w = ModelWeights::load(&cfg, src, be.as_mut(), opts.weights, progress)?;
        let capacity = opts.context.unwrap_or(cfg.n_ctx.min(8192)).max(1);
        let mut k_cache = Vec::with_capacity(cfg.n_layer);
        let mut v_cache = Vec::with_capacity(cfg.n_layer);
        for _ in 0..cfg.n_layer {
            k_cache.push(f32_buf(be.as_mut(), capacity * cfg.kv_dim())?);
            v_cache.push(f32_buf(be.as_mut(), capacity * cfg.kv_dim())?);
        }
        let rows = opts.max_batch.min(capacity);
        let b = be.as_mut();
        let s = Scratch {
            rows,
            ids: f32_buf(b, rows)?,
            pos: f32_buf(b, rows)?,
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
            token: f32_buf(b, 1)?,
        };
        Ok(Model {
            be,
            cfg,
            w,
            k_cache,
            v_cache,
            capacity,
            n_past: 0,
            s,
            logits_rows: 1,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    pub fn backend_name(&self) -> String {
        self.be.name()
    }
    /// The device cost of the last pass (one decode step after generation).
    pub fn last_pass_stats(&self) -> Option<String> {
        self.be.last_pass_stats()
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
    pub fn capacity(&self) -> usize {
        self.capacity
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
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.vocab
            )));
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

    fn linear(&mut self, l: &Linear, x: Buffer, y: Buffer, m: usize) -> Result<()> {
        self.be.matmul(&l.w, l.b.as_ref(), &x, &y, m)
    }

    /// Record the ops of one pass: embeddings, the layers, the head.
    fn record(
        &mut self,
        ids: &[u32],
        positions: &[u32],
        want: Want,
        read: bool,
        logits: Buffer,
    ) -> Result<()> {
        let m = ids.len();
        let c = self.cfg.clone();
        let s = self.s;
        let (e, kvd) = (c.n_embd, c.kv_dim());
        // Inside the pass, so a decode step is a single submit.
        self.be.upload(&s.ids, 0, bytemuck::cast_slice(ids))?;
        self.be.upload(&s.pos, 0, bytemuck::cast_slice(positions))?;
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
            self.norm(&lw.attn_norm, s.x, s.h, m)?;
            self.linear(&lw.q, s.h, s.q, m)?;
            self.linear(&lw.k, s.h, s.k, m)?;
            self.linear(&lw.v, s.h, s.v, m)?;
            let (mut q, mut k) = (s.q, s.k);
            if let (Some(qn), Some(kn)) = (lw.q_norm, lw.k_norm) {
                self.be
                    .rms_norm(&s.q, &qn.w, &s.qn, m * c.n_head, c.head_dim, c.norm_eps)?;
                self.be
                    .rms_norm(&s.k, &kn.w, &s.kn, m * c.n_head_kv, c.head_dim, c.norm_eps)?;
                (q, k) = (s.qn, s.kn);
            }
            if let Some(r) = c.rope {
                let p = |n_heads| RopeParams {
                    rows: m,
                    n_heads,
                    head_dim: c.head_dim,
                    rot_dim: r.rot_dim,
                    base: lc.rope_base,
                    style: r.style,
                };
                self.be.rope(&q, &s.pos, &p(c.n_head))?;
                self.be.rope(&k, &s.pos, &p(c.n_head_kv))?;
            }
            let at = self.n_past * kvd * 4;
            self.be.copy(&k, 0, &self.k_cache[il], at, m * kvd * 4)?;
            self.be.copy(&s.v, 0, &self.v_cache[il], at, m * kvd * 4)?;
            let ap = AttentionParams {
                rows: m,
                n_heads: c.n_head,
                n_kv_heads: c.n_head_kv,
                head_dim: c.head_dim,
                capacity: self.capacity,
                scale: c.attn_scale,
                window: lc.window,
            };
            self.be.attention(
                &q,
                &self.k_cache[il],
                &self.v_cache[il],
                &s.pos,
                &s.att,
                &ap,
            )?;
            self.linear(&lw.o, s.att, s.h, m)?;
            if let Some(n) = lw.attn_post_norm {
                self.norm(&n, s.h, s.t, m)?;
                self.be.add(&s.x, &s.t, &s.x, m * e)?;
            } else {
                self.be.add(&s.x, &s.h, &s.x, m * e)?;
            }
            // Feed-forward block.
            self.norm(&lw.ffn_norm, s.x, s.h, m)?;
            match lw.gate {
                Some(g) => {
                    self.linear(&g, s.h, s.gate, m)?;
                    self.linear(&lw.up, s.h, s.up, m)?;
                    self.be
                        .glu(c.act, &s.gate, Some(&s.up), &s.act, m * c.n_ff)?;
                }
                None => {
                    self.linear(&lw.up, s.h, s.up, m)?;
                    self.be.glu(c.act, &s.up, None, &s.act, m * c.n_ff)?;
                }
            }
            self.linear(&lw.down, s.act, s.h, m)?;
            if let Some(n) = lw.ffn_post_norm {
                self.norm(&n, s.h, s.t, m)?;
                self.be.add(&s.x, &s.t, &s.x, m * e)?;
            } else {
                self.be.add(&s.x, &s.h, &s.x, m * e)?;
            }
        }
        let output_norm = self.w.output_norm;
        let output = self.w.output;
        if want == Want::AllLogits {
            self.norm(&output_norm, s.x, s.h, m)?;
            self.be.matmul(&output, None, &s.h, &logits, m)?;
        } else if read {
            // Only the last row's logits are needed.
            self.be.copy(&s.x, (m - 1) * e * 4, &s.last, 0, e * 4)?;
            self.norm(&output_norm, s.last, s.h, 1)?;
            self.be.matmul(&output, None, &s.h, &logits, 1)?;
            if want == Want::Argmax {
                self.be.argmax(&logits, &s.token, 1, c.vocab)?;
            }
        }
        Ok(())
    }

    /// One pass over `ids` (at most `max_batch` rows).
    fn pass(&mut self, ids: &[u32], want: Want, read: bool) -> Result<Option<Output>> {
        let m = ids.len();
        let c = self.cfg.clone();
        let s = self.s;
        let positions: Vec<u32> = (self.n_past..self.n_past + m).map(|p| p as u32).collect();
        let logit_rows = if want == Want::AllLogits { m } else { 1 };
        if logit_rows > self.logits_rows {
            self.be.free(self.s.logits);
            self.s.logits = f32_buf(self.be.as_mut(), logit_rows * c.vocab)?;
            self.logits_rows = logit_rows;
        }
        let logits = self.s.logits;
        self.be.begin_pass()?;
        let recorded = self.record(ids, &positions, want, read, logits);
        if recorded.is_err() {
            // Close the pass so the model stays usable; the first error wins.
            let _ = self.be.end_pass();
            recorded?;
        }
        self.be.end_pass()?;
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
                    .download(&logits, 0, bytemuck::cast_slice_mut(&mut v))?;
                Output::Logits(v)
            }
        }))
    }
}
