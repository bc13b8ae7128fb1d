//! One backend's share of a model: a range of layers with their weights and
//! KV cache, the activations of a pass, and the ops that run its layers
//! (the embeddings too on the first stage, the head on the last).

use crate::backend::{
    check, AttentionParams, Buffer, ComputeBackend, ExpertsParams, KvPages, LinearOpts, NextWeight,
    Projection, RopeParams, RopeScaling, RopeStyle, RouteParams,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::{ModelConfig, NormKind};
use crate::model::kv_pages::PageCopy;
use crate::model::runner::{Want, MAX_DECODE_STEPS};
use crate::model::source::TensorSource;
use crate::model::weights::{
    Experts, ExpertsIn, Ffn, FfnIn, LayerWeights, Linear, ModelWeights, Norm, WeightOptions,
};
use std::ops::Range;

/// The KV cache every stage holds for its layers: one pool of pages per
/// layer, shared by the model's sequences (model/kv_pages).
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvSpec {
    pub dtype: DType,
    /// Positions one sequence may hold.
    pub capacity: usize,
    /// Positions per page, as a power of two.
    pub page_log2: u32,
    /// Pages in each layer's cache: the pool's, and one spare that the
    /// padding rows of a batch write into.
    pub pages: usize,
}

impl KvSpec {
    /// Entries of one sequence's page table.
    pub fn table_len(&self) -> usize {
        self.capacity.div_ceil(1 << self.page_log2)
    }
    /// The page that padding rows write, never a sequence's.
    pub fn spare_page(&self) -> u32 {
        (self.pages - 1) as u32
    }
    /// Rows of each layer's cache buffers.
    pub fn cache_rows(&self) -> Option<usize> {
        self.pages.checked_mul(1 << self.page_log2)
    }
}

/// Per-pass activations, sized for `rows` rows.
#[derive(Clone, Copy)]
pub(crate) struct Scratch {
    pub rows: usize,
    pub ids: Buffer,
    pub pos: Buffer,
    /// Page tables: one shared by every row (a prompt chunk), or one per
    /// row (a decode step of several sequences), `KvSpec::table_len` apart.
    pub tables: Buffer,
    /// The residual stream: what crosses to the next stage.
    pub x: Buffer,
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
    /// Mixture of experts: router logits, each row's experts and their
    /// weights, and the chosen experts' gate, up, activation and output
    /// (a row per token and expert).
    router: Buffer,
    expert_ids: Buffer,
    expert_weights: Buffer,
    expert_gate: Buffer,
    expert_up: Buffer,
    expert_act: Buffer,
    expert_out: Buffer,
    last: Buffer,
    pub logits: Buffer,
    /// A grammar's mask over the vocabulary, a bit per id, written by the
    /// host (see `Model::pick_allowed`).
    pub allowed: Buffer,
    pub token: Buffer,
    /// Greedy decode steps: [count, tokens...] (see `append_token`).
    pub history: Buffer,
}

pub(crate) fn f32_buf(be: &mut dyn ComputeBackend, n: usize) -> Result<Buffer> {
    be.alloc(n.max(1) * 4)
}

impl Scratch {
    fn new(
        b: &mut dyn ComputeBackend,
        cfg: &ModelConfig,
        rows: usize,
        kv: KvSpec,
    ) -> Result<Scratch> {
        let tables = rows
            .checked_mul(kv.table_len())
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| Error::Invalid("the page tables of a batch overflow".into()))?;
        let moe = cfg.moe.map_or((0, 0, 0), |e| (e.experts, e.used, e.n_ff));
        // A model with experts has no dense feed-forward block.
        let dense_ff = if cfg.moe.is_some() { 0 } else { cfg.n_ff };
        let slots = rows
            .checked_mul(moe.1)
            .ok_or_else(|| Error::Invalid("the experts of a batch overflow".into()))?;
        let slot_values = |n: usize| {
            slots
                .checked_mul(n)
                .ok_or_else(|| Error::Invalid("the experts of a batch overflow".into()))
        };
        // Per-token values and the chosen token are written and read by the
        // host in place: a decode step is one submit with no copies.
        Ok(Scratch {
            rows,
            ids: b.alloc_mapped(rows * 4)?,
            pos: b.alloc_mapped(rows * 4)?,
            tables: b.alloc_mapped(tables)?,
            x: f32_buf(b, rows * cfg.n_embd)?,
            h: f32_buf(b, rows * cfg.n_embd)?,
            t: f32_buf(b, rows * cfg.n_embd)?,
            q: f32_buf(b, rows * cfg.q_dim())?,
            k: f32_buf(b, rows * cfg.kv_dim())?,
            v: f32_buf(b, rows * cfg.kv_dim())?,
            qn: f32_buf(b, rows * cfg.q_dim())?,
            kn: f32_buf(b, rows * cfg.kv_dim())?,
            att: f32_buf(b, rows * cfg.q_dim())?,
            gate: f32_buf(b, rows * dense_ff)?,
            up: f32_buf(b, rows * dense_ff)?,
            act: f32_buf(b, rows * dense_ff)?,
            router: f32_buf(b, rows * moe.0)?,
            expert_ids: f32_buf(b, slots)?,
            expert_weights: f32_buf(b, slots)?,
            expert_gate: f32_buf(b, slot_values(moe.2)?)?,
            expert_up: f32_buf(b, slot_values(moe.2)?)?,
            expert_act: f32_buf(b, slot_values(moe.2)?)?,
            expert_out: f32_buf(b, slot_values(cfg.n_embd)?)?,
            last: f32_buf(b, cfg.n_embd)?,
            logits: f32_buf(b, cfg.vocab)?,
            allowed: b.alloc_mapped(cfg.vocab.div_ceil(32) * 4)?,
            token: b.alloc_mapped(rows * 4)?,
            history: b.alloc_mapped((1 + MAX_DECODE_STEPS) * 4)?,
        })
    }
}

pub(crate) struct Stage {
    pub be: Box<dyn ComputeBackend>,
    /// The model's layers this stage runs.
    pub layers: Range<usize>,
    pub w: ModelWeights,
    k_cache: Vec<Buffer>,
    v_cache: Vec<Buffer>,
    pub s: Scratch,
    /// Rows `s.logits` holds.
    pub logits_rows: usize,
}

impl Stage {
    /// Put `layers` of the model in `src` on `be`, with their KV cache and
    /// activations for `rows` rows.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        mut be: Box<dyn ComputeBackend>,
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        weights: WeightOptions,
        layers: Range<usize>,
        kv: KvSpec,
        rows: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Stage> {
        let kv_size = check::kv_value_bytes("kv cache", kv.dtype)?;
        let too_big = || {
            Error::Invalid(format!(
                "a {} KV cache of {} pages of {} positions x {} values is not possible",
                kv.dtype.name(),
                kv.pages,
                1usize << kv.page_log2,
                cfg.kv_dim()
            ))
        };
        let capacity = kv.cache_rows().ok_or_else(too_big)?;
        let kv_bytes = capacity
            .checked_mul(cfg.kv_dim())
            .and_then(|n| n.checked_mul(kv_size))
            .ok_or_else(too_big)?;
        let kv_total = (kv_bytes as u64)
            .checked_mul(2 * layers.len() as u64)
            .ok_or_else(too_big)?;
        // One sequence's pool (and the spare page) reads as its context.
        let kv_what = if kv.pages <= kv.table_len() + 1 {
            format!(
                "the {} KV cache of {} positions",
                kv.dtype.name(),
                kv.capacity
            )
        } else {
            format!(
                "the {} KV cache of {capacity} positions ({} per sequence)",
                kv.dtype.name(),
                kv.capacity
            )
        };
        // Checked before the weights load (a context too large fails in
        // a moment, not after the whole file is read) and again after, when
        // the weights hold their share of the memory.
        be.check_fits(&kv_what, kv_total)?;
        let w =
            ModelWeights::load_layers(cfg, src, be.as_mut(), weights, layers.clone(), progress)?;
        be.check_fits(&kv_what, kv_total)?;
        let mut k_cache = Vec::with_capacity(layers.len());
        let mut v_cache = Vec::with_capacity(layers.len());
        for _ in layers.clone() {
            k_cache.push(be.alloc(kv_bytes.max(4))?);
            v_cache.push(be.alloc(kv_bytes.max(4))?);
        }
        let s = Scratch::new(be.as_mut(), cfg, rows, kv)?;
        Ok(Stage {
            be,
            layers,
            w,
            k_cache,
            v_cache,
            s,
            logits_rows: 1,
        })
    }

    /// Copies the first `c.positions` positions of page `c.src` into page
    /// `c.dst`, K and V of every layer, inside a pass begun by the caller.
    pub fn copy_page(&mut self, c: PageCopy, kv: KvSpec, kv_dim: usize) -> Result<()> {
        let row = kv_dim * check::kv_value_bytes("kv cache", kv.dtype)?;
        let page = row << kv.page_log2;
        let (src, dst) = (c.src as usize * page, c.dst as usize * page);
        for cache in self.k_cache.iter().chain(&self.v_cache) {
            self.be.copy(cache, src, cache, dst, c.positions * row)?;
        }
        Ok(())
    }

    /// Grow `s.logits` to `rows` rows of `vocab` values.
    pub fn reserve_logits(&mut self, rows: usize, vocab: usize) -> Result<()> {
        if rows > self.logits_rows {
            self.be.free(self.s.logits);
            self.s.logits = f32_buf(self.be.as_mut(), rows * vocab)?;
            self.logits_rows = rows;
        }
        Ok(())
    }

    /// Record the ops of a pass begun by the caller and end it, closing it
    /// on an error too so the model stays usable (the first error wins).
    pub fn record_closed(&mut self, r: &PassPlan) -> Result<()> {
        let recorded = self.record(r);
        let ended = self.be.end_pass();
        recorded.and(ended)
    }

    fn norm(
        &mut self,
        c: &ModelConfig,
        n: &Norm,
        x: Buffer,
        out: Buffer,
        rows: usize,
    ) -> Result<()> {
        let (d, eps) = (c.n_embd, c.norm_eps);
        match (c.norm, n.b) {
            (NormKind::Layer, Some(b)) => self.be.layer_norm(&x, &n.w, &b, &out, rows, d, eps),
            _ => self.be.rms_norm(&x, &n.w, &out, rows, d, eps),
        }
    }

    /// Norm `n` ahead of projections: an RMS norm is folded into them
    /// (returned as their norm weights); a layer norm runs into `out`.
    fn pre_norm(
        &mut self,
        c: &ModelConfig,
        n: &Norm,
        x: Buffer,
        out: Buffer,
        rows: usize,
    ) -> Result<(Buffer, Option<Buffer>)> {
        match (c.norm, n.b) {
            (NormKind::Layer, Some(_)) => {
                self.norm(c, n, x, out, rows)?;
                Ok((out, None))
            }
            _ => Ok((x, Some(n.w))),
        }
    }

    /// `y (+)= norm(x) · Wᵀ + b` (see [`ComputeBackend::linear`]).
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &mut self,
        c: &ModelConfig,
        l: &Linear,
        x: Buffer,
        norm: Option<Buffer>,
        y: Buffer,
        m: usize,
        add: bool,
    ) -> Result<()> {
        let opts = LinearOpts {
            bias: l.b.as_ref(),
            norm: norm.as_ref().map(|w| (w, c.norm_eps)),
            add,
        };
        let Some(sc) = l.scale else {
            return self.be.linear(&l.w, &x, &y, m, &opts);
        };
        let n = m
            .checked_mul(l.w.rows)
            .ok_or_else(|| Error::Invalid("a projection's output overflows".into()))?;
        if !add {
            self.be.linear(&l.w, &x, &y, m, &opts)?;
            return self.be.scale(&y, sc, &y, n);
        }
        // Scaled before the residual add: through `t` (the residual
        // projections' outputs are n_embd wide, as `t` is).
        let t = self.s.t;
        let plain = LinearOpts { add: false, ..opts };
        self.be.linear(&l.w, &x, &t, m, &plain)?;
        self.be.scale(&t, sc, &t, n)?;
        self.be.add(&y, &t, &y, n)
    }

    /// q, k and v from `h` (folding in the norm `nw`): one op where the
    /// backend can, unless a projection is scaled (BitNet's).
    fn qkv(
        &mut self,
        c: &ModelConfig,
        lw: &LayerWeights,
        h: Buffer,
        nw: Option<Buffer>,
        m: usize,
    ) -> Result<()> {
        let s = self.s;
        let qkv = [(&lw.q, s.q), (&lw.k, s.k), (&lw.v, s.v)];
        if qkv.iter().any(|(l, _)| l.scale.is_some()) {
            for (l, y) in qkv {
                self.linear(c, l, h, nw, y, m, false)?;
            }
            return Ok(());
        }
        let outs = qkv.each_ref().map(|(l, y)| Projection {
            w: &l.w,
            bias: l.b.as_ref(),
            y,
        });
        let norm = nw.as_ref().map(|w| (w, c.norm_eps));
        self.be.linear_each(&h, m, norm, &outs)
    }

    /// The input of projections from `x`: RMS-normed by `n` (`dim` values
    /// per row) unless `n` is `None`, and with [`ModelConfig::round_acts`]
    /// rounded to int8 per row into `out`. Returns the buffer the
    /// projections read and the norm weights they still fold in.
    #[allow(clippy::too_many_arguments)]
    fn proj_input(
        &mut self,
        c: &ModelConfig,
        n: Option<&Norm>,
        x: Buffer,
        out: Buffer,
        rows: usize,
        dim: usize,
    ) -> Result<(Buffer, Option<Buffer>)> {
        if !c.round_acts {
            return Ok((x, n.map(|n| n.w)));
        }
        let src = match n {
            Some(n) => {
                self.be.rms_norm(&x, &n.w, &out, rows, dim, c.norm_eps)?;
                out
            }
            None => x,
        };
        self.be.round_i8(&src, &out, rows, dim)?;
        Ok((out, None))
    }

    /// The residual stream after a block: `x += W·input`, or with a
    /// post-norm (Gemma) `x += norm(W·input)`.
    #[allow(clippy::too_many_arguments)]
    fn residual(
        &mut self,
        c: &ModelConfig,
        l: &Linear,
        post: Option<Norm>,
        input: Buffer,
        norm: Option<Buffer>,
        m: usize,
    ) -> Result<()> {
        let s = self.s;
        match post {
            Some(n) => {
                self.linear(c, l, input, norm, s.h, m, false)?;
                self.norm(c, &n, s.h, s.t, m)?;
                self.be.add(&s.x, &s.t, &s.x, m * c.n_embd)
            }
            None => self.linear(c, l, input, norm, s.x, m, true),
        }
    }

    /// `x += Σ_k w_k · down_k(act(gate_k(h)) ⊙ up_k(h))` over each row's `k`
    /// experts, `h` = `norm(x)`, the experts and weights `w_k` chosen by
    /// the router from `h`.
    fn experts(&mut self, c: &ModelConfig, ex: &Experts, norm: &Norm, m: usize) -> Result<()> {
        let s = self.s;
        let Some(moe) = c.moe else {
            return Err(Error::Invalid("expert weights without experts".into()));
        };
        self.norm(c, norm, s.x, s.h, m)?;
        self.linear(c, &ex.router, s.h, None, s.router, m, false)?;
        let route = RouteParams {
            rows: m,
            experts: moe.experts,
            k: moe.used,
            renorm: moe.renorm,
        };
        self.be
            .route_experts(&s.router, &s.expert_ids, &s.expert_weights, &route)?;
        let shared_x = ExpertsParams {
            rows: m,
            k: moe.used,
            experts: moe.experts,
            x_per_slot: false,
            glu: None,
        };
        let ids = s.expert_ids;
        match ex.input {
            ExpertsIn::GateUp(gu) => {
                let glu = ExpertsParams {
                    glu: Some(c.act),
                    ..shared_x
                };
                let (a, b) = (s.expert_act, gu.b);
                self.be
                    .matmul_experts(&gu.w, b.as_ref(), &s.h, &ids, &a, &glu)?;
            }
            ExpertsIn::Split { gate, up } => {
                let (g, u) = (s.expert_gate, s.expert_up);
                self.be
                    .matmul_experts(&gate.w, gate.b.as_ref(), &s.h, &ids, &g, &shared_x)?;
                self.be
                    .matmul_experts(&up.w, up.b.as_ref(), &s.h, &ids, &u, &shared_x)?;
                let values = shared_x.slots() * moe.n_ff;
                self.be.glu(c.act, &g, Some(&u), &s.expert_act, values)?;
            }
        }
        let per_slot = ExpertsParams {
            x_per_slot: true,
            ..shared_x
        };
        self.be.matmul_experts(
            &ex.down.w,
            ex.down.b.as_ref(),
            &s.expert_act,
            &ids,
            &s.expert_out,
            &per_slot,
        )?;
        self.be.sum_experts(
            &s.expert_out,
            &s.expert_weights,
            &s.x,
            m,
            moe.used,
            c.n_embd,
            true,
        )
    }

    /// Record the ops of one pass over the `m` ids and positions already in
    /// the scratch buffers (or, after the first stage, the residual stream
    /// already in `s.x`): embeddings, this stage's layers, the head. With
    /// `feedback` (a single-row greedy step) the token goes back into `ids`
    /// for the next step (`append_token`).
    fn record(&mut self, r: &PassPlan) -> Result<()> {
        let (c, kv, m) = (r.cfg, r.kv, r.m);
        let s = self.s;
        let e = c.n_embd;
        let pages = KvPages {
            table: s.tables,
            page_log2: kv.page_log2,
            stride: if r.each_row { kv.table_len() } else { 0 },
            pages: kv.pages,
        };
        if let Some(emb) = self.w.embed {
            self.be.embedding(&emb.tok, &s.ids, &s.x, m)?;
            if let Some(pe) = emb.pos {
                self.be.embedding(&pe, &s.pos, &s.t, m)?;
                self.be.add(&s.x, &s.t, &s.x, m * e)?;
            }
            if let Some(sc) = c.embed_scale {
                self.be.scale(&s.x, sc, &s.x, m * e)?;
            }
        }
        for (i, il) in self.layers.clone().enumerate() {
            let lw = self.w.layers[i];
            let lc = c.layers[il];
            // Attention block.
            let (h, nw) = if c.round_acts {
                self.proj_input(c, Some(&lw.attn_norm), s.x, s.h, m, e)?
            } else {
                self.pre_norm(c, &lw.attn_norm, s.x, s.h, m)?
            };
            self.qkv(c, &lw, h, nw, m)?;
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
                scaling: c.yarn.map(|y| {
                    RopeScaling::yarn(
                        y.factor,
                        y.original_ctx,
                        y.beta_fast,
                        y.beta_slow,
                        c.rope.map_or(c.head_dim, |r| r.rot_dim),
                        lc.rope_base,
                        y.truncate,
                    )
                }),
            };
            let ap = AttentionParams {
                rows: m,
                n_heads: c.n_head,
                n_kv_heads: c.n_head_kv,
                head_dim: c.head_dim,
                capacity: kv.capacity,
                span: r.span,
                scale: c.attn_scale,
                window: lc.window,
                kv_dtype: kv.dtype,
                pages: r.paged.then_some(pages),
                // The o projection reads the attention output itself only
                // without a sub-norm or rounding in between.
                next: (lw.attn_sub_norm.is_none() && !c.round_acts)
                    .then(|| NextWeight::of(&lw.o.w)),
                sinks: lw.sinks,
            };
            self.be.rope_store_attention(
                &q,
                &k,
                &s.v,
                &s.pos,
                &self.k_cache[i],
                &self.v_cache[i],
                &rope,
                &ap,
                &s.att,
            )?;
            let (o_in, o_norm) = if lw.attn_sub_norm.is_some() || c.round_acts {
                let qd = c.q_dim();
                self.proj_input(c, lw.attn_sub_norm.as_ref(), s.att, s.qn, m, qd)?
            } else {
                (s.att, None)
            };
            self.residual(c, &lw.o, lw.attn_post_norm, o_in, o_norm, m)?;
            // Feed-forward block.
            match lw.ffn {
                Ffn::Dense { ffn_in, down } => {
                    let (h, nw) = if c.round_acts {
                        self.proj_input(c, Some(&lw.ffn_norm), s.x, s.h, m, e)?
                    } else {
                        self.pre_norm(c, &lw.ffn_norm, s.x, s.h, m)?
                    };
                    match ffn_in {
                        FfnIn::GateUp(w) => {
                            let norm = nw.as_ref().map(|w| (w, c.norm_eps));
                            self.be.linear_glu(c.act, &w, &h, &s.act, m, norm)?;
                        }
                        FfnIn::Split { gate: Some(g), up } => {
                            self.linear(c, &g, h, nw, s.gate, m, false)?;
                            self.linear(c, &up, h, nw, s.up, m, false)?;
                            self.be
                                .glu(c.act, &s.gate, Some(&s.up), &s.act, m * c.n_ff)?;
                        }
                        FfnIn::Split { gate: None, up } => {
                            self.linear(c, &up, h, nw, s.up, m, false)?;
                            self.be.glu(c.act, &s.up, None, &s.act, m * c.n_ff)?;
                        }
                    }
                    let (d_in, d_norm) = if lw.ffn_sub_norm.is_some() || c.round_acts {
                        let sub = lw.ffn_sub_norm.as_ref();
                        self.proj_input(c, sub, s.act, s.gate, m, c.n_ff)?
                    } else {
                        (s.act, None)
                    };
                    self.residual(c, &down, lw.ffn_post_norm, d_in, d_norm, m)?;
                }
                Ffn::Experts(ex) => self.experts(c, &ex, &lw.ffn_norm, m)?,
            }
        }
        let Some(head) = self.w.head else {
            return Ok(());
        };
        let out = Linear {
            w: head.output,
            b: None,
            scale: None,
        };
        if r.want == Want::AllLogits || (r.each_row && r.read) {
            let (h, nw) = self.pre_norm(c, &head.norm, s.x, s.h, m)?;
            self.linear(c, &out, h, nw, s.logits, m, false)?;
            if r.want == Want::Argmax {
                self.be.argmax(&s.logits, None, &s.token, m, c.vocab)?;
            }
        } else if r.read {
            // Only the last row's logits are needed.
            let last = if m == 1 {
                s.x
            } else {
                self.be.copy(&s.x, (m - 1) * e * 4, &s.last, 0, e * 4)?;
                s.last
            };
            let (h, nw) = self.pre_norm(c, &head.norm, last, s.h, 1)?;
            self.linear(c, &out, h, nw, s.logits, 1, false)?;
            if r.want == Want::Argmax && r.feedback {
                self.be.argmax(&s.logits, None, &s.ids, 1, c.vocab)?;
                self.be.append_token(&s.ids, &s.pos, &s.history)?;
            } else if r.want == Want::Argmax {
                self.be.argmax(&s.logits, None, &s.token, 1, c.vocab)?;
            }
        }
        Ok(())
    }
}

/// What one pass records: `m` rows attending at most `span` positions, the
/// output asked for, whether it is read at all (an intermediate prefill
/// chunk only fills the cache), and whether a greedy step feeds its token
/// back on the device. `each_row`: the rows are several sequences' decode
/// steps, each with its own page table, and the output is every row's
/// (its argmax, or its logits); otherwise the rows are one sequence's.
/// `paged`: the cache is read through the page tables; otherwise position
/// `p` is cache row `p` (a sequence whose pages are the first, in order).
pub(crate) struct PassPlan<'a> {
    pub cfg: &'a ModelConfig,
    pub kv: KvSpec,
    pub m: usize,
    pub span: usize,
    pub want: Want,
    pub read: bool,
    pub feedback: bool,
    pub each_row: bool,
    pub paged: bool,
}
