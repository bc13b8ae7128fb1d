//! Uploads a model's tensors to a backend in the shape the runner wants:
//! fused projections split, norm weights as f32 (with Gemma's `1 + w`),
//! optional load-time quantization of float weights.

use crate::backend::{Buffer, ComputeBackend, Weight};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::{Arch, ModelConfig, NormKind};
use crate::model::source::{RawTensor, TensorSource};
use std::borrow::Cow;
use std::ops::Range;

/// A norm: weight and, for LayerNorm, bias (f32 vectors on the device).
#[derive(Clone, Copy, Debug)]
pub struct Norm {
    pub w: Buffer,
    pub b: Option<Buffer>,
}

/// A projection and its optional bias.
#[derive(Clone, Copy, Debug)]
pub struct Linear {
    pub w: Weight,
    pub b: Option<Buffer>,
    /// What the product is multiplied by: a per-tensor scale stored beside
    /// the weight (`{name}.scale`, llama.cpp's BitNet `wq_s`...), the
    /// weight then holding ternary values exactly.
    pub scale: Option<f32>,
}

/// The feed-forward block's input projections.
#[derive(Clone, Copy, Debug)]
pub enum FfnIn {
    /// Gate rows then up rows in one weight (same type, no biases), for
    /// `ComputeBackend::linear_glu`: one op instead of three.
    GateUp(Weight),
    /// Projections of their own (their types or biases differ), or up alone
    /// (no gate).
    Split { gate: Option<Linear>, up: Linear },
}

/// A mixture of experts (see `MoeConfig`): the router, and every expert's
/// gate, up and down projections stacked (expert `e`'s rows from `e *
/// rows`), with their optional biases (`[experts * rows]`).
#[derive(Clone, Copy, Debug)]
pub struct Experts {
    pub router: Linear,
    pub input: ExpertsIn,
    pub down: Linear,
}

/// The experts' gate and up projections.
#[derive(Clone, Copy, Debug)]
pub enum ExpertsIn {
    /// Each expert's gate rows then its up rows in one weight (same type),
    /// their biases likewise: one `matmul_experts` with a GLU instead of
    /// three ops.
    GateUp(Linear),
    Split {
        gate: Linear,
        up: Linear,
    },
}

/// A layer's feed-forward block.
#[derive(Clone, Copy, Debug)]
pub enum Ffn {
    Dense { ffn_in: FfnIn, down: Linear },
    Experts(Experts),
}

#[derive(Clone, Copy, Debug)]
pub struct LayerWeights {
    pub attn_norm: Norm,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    /// BitNet's norm of the attention output before `o` (`[q_dim]`).
    pub attn_sub_norm: Option<Norm>,
    pub attn_post_norm: Option<Norm>,
    /// gpt-oss's per-head softmax sinks (`[n_head]` f32).
    pub sinks: Option<Buffer>,
    pub ffn_norm: Norm,
    pub ffn: Ffn,
    /// BitNet's norm of the FFN's activations before `down` (`[n_ff]`).
    pub ffn_sub_norm: Option<Norm>,
    pub ffn_post_norm: Option<Norm>,
}

/// The token (and learned position) embeddings: the first stage's.
#[derive(Clone, Copy, Debug)]
pub struct Embeddings {
    pub tok: Weight,
    pub pos: Option<Weight>,
}

/// The output norm and LM head: the last stage's.
#[derive(Clone, Copy, Debug)]
pub struct Head {
    pub norm: Norm,
    /// The LM head; the token embedding itself when tied (a copy of it when
    /// the embeddings are on another backend).
    pub output: Weight,
}

/// The weights one backend holds: a range of layers, with the embeddings
/// when the range starts at layer 0 and the head when it ends at the last.
#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub embed: Option<Embeddings>,
    pub layers: Vec<LayerWeights>,
    pub head: Option<Head>,
    /// Total bytes of every uploaded weight (for roofline figures).
    pub bytes: usize,
    /// Of `bytes`, those of the experts' matrices: a token reads only its
    /// chosen experts' share.
    pub expert_bytes: usize,
}

/// Load options that change what ends up on the device.
#[derive(Clone, Copy, Debug, Default)]
pub struct WeightOptions {
    /// Quantize float matrices (F32/F16/BF16) to this type at load.
    pub quantize: Option<DType>,
}

struct Loader<'a> {
    src: &'a dyn TensorSource,
    be: &'a mut dyn ComputeBackend,
    cfg: &'a ModelConfig,
    opts: WeightOptions,
    bytes: usize,
    expert_bytes: usize,
}

impl<'a> Loader<'a> {
    fn missing(&self, name: &str) -> Error {
        Error::Tensor {
            name: name.to_string(),
            msg: format!(
                "missing from {} (needed by {:?})",
                self.src.origin(),
                self.cfg.arch
            ),
        }
    }

    fn raw(&self, name: &str) -> Result<Option<RawTensor<'a>>> {
        self.src.tensor(name)
    }

    fn expect_shape(name: &str, t: &RawTensor, rows: usize, cols: usize) -> Result<()> {
        if t.rows != rows || t.cols != cols {
            return Err(Error::Tensor {
                name: name.to_string(),
                msg: format!("shape [{}, {}], expected [{rows}, {cols}]", t.rows, t.cols),
            });
        }
        Ok(())
    }

    fn upload_vec(&mut self, v: &[f32]) -> Result<Buffer> {
        let buf = self.be.alloc(v.len() * 4)?;
        self.be.upload(&buf, 0, bytemuck::cast_slice(v))?;
        self.bytes += v.len() * 4;
        Ok(buf)
    }

    /// An f32 vector of `n` values; `offset` is added (Gemma's `1 + w`).
    fn vector(&mut self, name: &str, n: usize, offset: f32) -> Result<Option<Buffer>> {
        let Some(t) = self.raw(name)? else {
            return Ok(None);
        };
        if t.rows * t.cols != n {
            return Err(Error::Tensor {
                name: name.into(),
                msg: format!("{} values, expected {n}", t.rows * t.cols),
            });
        }
        let mut v = t.to_f32(name)?;
        all_finite(name, &v)?;
        v.iter_mut().for_each(|x| *x += offset);
        self.upload_vec(&v).map(Some)
    }

    fn norm(&mut self, prefix: &str, n: usize) -> Result<Option<Norm>> {
        let offset = self.cfg.norm_weight_offset;
        let Some(w) = self.vector(&format!("{prefix}.weight"), n, offset)? else {
            return Ok(None);
        };
        let b = match self.cfg.norm {
            NormKind::Layer => Some(
                self.vector(&format!("{prefix}.bias"), n, 0.0)?
                    .ok_or_else(|| self.missing(&format!("{prefix}.bias")))?,
            ),
            NormKind::Rms => None,
        };
        Ok(Some(Norm { w, b }))
    }

    fn need_norm(&mut self, prefix: &str, n: usize) -> Result<Norm> {
        self.norm(prefix, n)?
            .ok_or_else(|| self.missing(&format!("{prefix}.weight")))
    }

    fn matrix(&mut self, name: &str, t: RawTensor) -> Result<Weight> {
        // A ternary type holds only BitNet's projections (exact with their
        // `.scale`); any other matrix would be destroyed, so it stays.
        let ternary_ok = |q: DType| {
            !matches!(q, DType::TQ1_0 | DType::TQ2_0)
                || name
                    .strip_suffix(".weight")
                    .is_some_and(|p| self.raw(&format!("{p}.scale")).is_ok_and(|s| s.is_some()))
        };
        let (dtype, data): (DType, Cow<[u8]>) = match self.opts.quantize {
            Some(q)
                if !t.dtype.is_quantized()
                    && t.cols.is_multiple_of(q.block_elems())
                    && ternary_ok(q) =>
            {
                let vals = t.to_f32(name)?;
                let row_bytes = q.row_bytes(t.cols)?;
                let mut out = vec![0u8; row_bytes * t.rows];
                for (src, dst) in vals.chunks(t.cols).zip(out.chunks_mut(row_bytes)) {
                    crate::quants::quantize_row(q, src, dst)?;
                }
                (q, Cow::Owned(out))
            }
            _ => (t.dtype, t.data),
        };
        self.bytes += data.len();
        self.be
            .upload_weight(dtype, t.rows, t.cols, &data)
            .map_err(|e| upload_error(name, e))
    }

    fn linear(&mut self, prefix: &str, rows: usize, cols: usize) -> Result<Option<Linear>> {
        let wname = format!("{prefix}.weight");
        let Some(t) = self.raw(&wname)? else {
            return Ok(None);
        };
        Self::expect_shape(&wname, &t, rows, cols)?;
        let w = self.matrix(&wname, t)?;
        let b = self.vector(&format!("{prefix}.bias"), rows, 0.0)?;
        let scale = self.scale(prefix)?;
        if scale.is_some() && b.is_some() {
            return Err(Error::Unsupported(format!(
                "{prefix}: a projection with both a scale and a bias"
            )));
        }
        Ok(Some(Linear { w, b, scale }))
    }

    /// The one value of `{prefix}.scale`, if the file has it.
    fn scale(&self, prefix: &str) -> Result<Option<f32>> {
        let name = format!("{prefix}.scale");
        let Some(t) = self.raw(&name)? else {
            return Ok(None);
        };
        let v = t.to_f32(&name)?;
        match v.as_slice() {
            [s] if s.is_finite() => Ok(Some(*s)),
            _ => Err(Error::Tensor {
                name,
                msg: format!("{} values, expected one finite value", v.len()),
            }),
        }
    }

    fn need_linear(&mut self, prefix: &str, rows: usize, cols: usize) -> Result<Linear> {
        self.linear(prefix, rows, cols)?
            .ok_or_else(|| self.missing(&format!("{prefix}.weight")))
    }

    /// Split a fused `[sum(parts), cols]` projection (Phi-3 qkv / gate_up, GPT-2
    /// c_attn) into consecutive row blocks; row bytes are contiguous for every dtype.
    fn split(&mut self, prefix: &str, parts: &[usize], cols: usize) -> Result<Option<Vec<Linear>>> {
        let wname = format!("{prefix}.weight");
        let Some(t) = self.raw(&wname)? else {
            return Ok(None);
        };
        let total: usize = parts.iter().sum();
        Self::expect_shape(&wname, &t, total, cols)?;
        let bias = match self.raw(&format!("{prefix}.bias"))? {
            Some(b) => Some(b.to_f32(&format!("{prefix}.bias"))?),
            None => None,
        };
        if bias.as_ref().is_some_and(|b| b.len() != total) {
            return Err(Error::Tensor {
                name: format!("{prefix}.bias"),
                msg: format!("expected {total} values"),
            });
        }
        let row_bytes = t.dtype.row_bytes(cols)?;
        let mut out = Vec::new();
        let mut start = 0;
        for &rows in parts {
            let part = RawTensor {
                dtype: t.dtype,
                rows,
                cols,
                data: Cow::Owned(t.data[start * row_bytes..(start + rows) * row_bytes].to_vec()),
            };
            let w = self.matrix(&wname, part)?;
            let b = match &bias {
                Some(b) => Some(self.upload_vec(&b[start..start + rows])?),
                None => None,
            };
            out.push(Linear {
                w,
                b,
                scale: self.scale(prefix)?,
            });
            start += rows;
        }
        Ok(Some(out))
    }

    /// The gate and up projections `[ff, e]` as one weight when they can be
    /// (same type, no biases; Phi-3's fused `ffn_up` already is one), else
    /// separately.
    fn gate_up(&mut self, gate: &str, up: &str, ff: usize, e: usize) -> Result<FfnIn> {
        let (gname, uname) = (format!("{gate}.weight"), format!("{up}.weight"));
        // Scaled projections (BitNet) stay apart: each has its own scale.
        let biased = self.raw(&format!("{gate}.bias"))?.is_some()
            || self.raw(&format!("{up}.bias"))?.is_some()
            || self.raw(&format!("{gate}.scale"))?.is_some()
            || self.raw(&format!("{up}.scale"))?.is_some();
        let Some(g) = self.raw(&gname)? else {
            // Fused: `ffn_up` holds the gate rows, then the up rows.
            let t = self.raw(&uname)?.ok_or_else(|| self.missing(&gname))?;
            Self::expect_shape(&uname, &t, 2 * ff, e)?;
            if !biased {
                return Ok(FfnIn::GateUp(self.matrix(&uname, t)?));
            }
            let gu = self
                .split(up, &[ff, ff], e)?
                .ok_or_else(|| self.missing(&uname))?;
            return Ok(FfnIn::Split {
                gate: Some(gu[0]),
                up: gu[1],
            });
        };
        Self::expect_shape(&gname, &g, ff, e)?;
        let u = self.raw(&uname)?.ok_or_else(|| self.missing(&uname))?;
        Self::expect_shape(&uname, &u, ff, e)?;
        if g.dtype == u.dtype && !biased {
            let mut data = Vec::with_capacity(g.data.len() + u.data.len());
            data.extend_from_slice(&g.data);
            data.extend_from_slice(&u.data);
            let both = RawTensor {
                dtype: g.dtype,
                rows: 2 * ff,
                cols: e,
                data: Cow::Owned(data),
            };
            return Ok(FfnIn::GateUp(self.matrix(&gname, both)?));
        }
        Ok(FfnIn::Split {
            gate: Some(self.need_linear(gate, ff, e)?),
            up: self.need_linear(up, ff, e)?,
        })
    }

    /// The experts' gate and up projections (`experts` matrices of `[ff,
    /// e]` each): interleaved per expert into one weight (and their biases
    /// into one vector) when they can be (same type, both biased or
    /// neither), else apart.
    fn experts_in(
        &mut self,
        gate: &str,
        up: &str,
        experts: usize,
        ff: usize,
        e: usize,
    ) -> Result<ExpertsIn> {
        let rows = experts
            .checked_mul(ff)
            .ok_or_else(|| Error::Config(format!("{experts} experts of {ff} rows overflow")))?;
        let (gname, uname) = (format!("{gate}.weight"), format!("{up}.weight"));
        let (gb, ub) = (format!("{gate}.bias"), format!("{up}.bias"));
        let biases = match (self.raw(&gb)?, self.raw(&ub)?) {
            (None, None) => Some(None),
            (Some(g), Some(u)) if g.rows * g.cols == rows && u.rows * u.cols == rows => {
                Some(Some((g.to_f32(&gb)?, u.to_f32(&ub)?)))
            }
            _ => None,
        };
        let g = self.raw(&gname)?.ok_or_else(|| self.missing(&gname))?;
        Self::expect_shape(&gname, &g, rows, e)?;
        let u = self.raw(&uname)?.ok_or_else(|| self.missing(&uname))?;
        Self::expect_shape(&uname, &u, rows, e)?;
        let Some(biases) = biases.filter(|_| g.dtype == u.dtype && self.opts.quantize.is_none())
        else {
            return Ok(ExpertsIn::Split {
                gate: self.need_linear(gate, rows, e)?,
                up: self.need_linear(up, rows, e)?,
            });
        };
        let part = g.dtype.row_bytes(e)? * ff;
        let both = RawTensor {
            dtype: g.dtype,
            rows: 2 * rows,
            cols: e,
            data: Cow::Owned(interleave(&g.data, &u.data, part)),
        };
        let w = self.matrix(&gname, both)?;
        let b = match biases {
            Some((gv, uv)) => {
                all_finite(&gb, &gv)?;
                all_finite(&ub, &uv)?;
                Some(self.upload_vec(&interleave(&gv, &uv, ff))?)
            }
            None => None,
        };
        Ok(ExpertsIn::GateUp(Linear { w, b, scale: None }))
    }

    /// The token embedding table, in its stored type (the gather
    /// dequantizes rows; a tied head reads it as it is).
    fn token_embd(&mut self) -> Result<Weight> {
        let embd = self
            .raw("token_embd.weight")?
            .ok_or_else(|| self.missing("token_embd.weight"))?;
        Self::expect_shape("token_embd.weight", &embd, self.cfg.vocab, self.cfg.n_embd)?;
        self.bytes += embd.data.len();
        self.be
            .upload_weight(embd.dtype, embd.rows, embd.cols, &embd.data)
    }

    fn embeddings(&mut self) -> Result<Embeddings> {
        let tok = self.token_embd()?;
        let pos = match self.raw("position_embd.weight")? {
            Some(t) if self.cfg.learned_pos => {
                if t.cols != self.cfg.n_embd {
                    return Err(Error::Tensor {
                        name: "position_embd.weight".into(),
                        msg: format!("{} columns, expected {}", t.cols, self.cfg.n_embd),
                    });
                }
                self.bytes += t.data.len();
                Some(self.be.upload_weight(t.dtype, t.rows, t.cols, &t.data)?)
            }
            None if self.cfg.learned_pos => return Err(self.missing("position_embd.weight")),
            _ => None,
        };
        Ok(Embeddings { tok, pos })
    }

    fn layer(&mut self, i: usize) -> Result<LayerWeights> {
        let c = self.cfg;
        let p = |s: &str| format!("blk.{i}.{s}");
        let (e, qd, kvd, ff) = (c.n_embd, c.q_dim(), c.kv_dim(), c.n_ff);
        let attn_norm = self.need_norm(&p("attn_norm"), e)?;
        let (q, k, v) = match self.split(&p("attn_qkv"), &[qd, kvd, kvd], e)? {
            Some(qkv) => (qkv[0], qkv[1], qkv[2]),
            None => (
                self.need_linear(&p("attn_q"), qd, e)?,
                self.need_linear(&p("attn_k"), kvd, e)?,
                self.need_linear(&p("attn_v"), kvd, e)?,
            ),
        };
        let o = self.need_linear(&p("attn_output"), e, qd)?;
        let (q_norm, k_norm) = if c.qk_norm {
            (
                Some(self.need_norm(&p("attn_q_norm"), c.head_dim)?),
                Some(self.need_norm(&p("attn_k_norm"), c.head_dim)?),
            )
        } else {
            (None, None)
        };
        let (attn_sub_norm, ffn_sub_norm) = if c.sub_norms {
            (
                Some(self.need_norm(&p("attn_sub_norm"), qd)?),
                Some(self.need_norm(&p("ffn_sub_norm"), ff)?),
            )
        } else {
            (None, None)
        };
        let attn_post_norm = if c.post_norms {
            Some(self.need_norm(&p("post_attention_norm"), e)?)
        } else {
            None
        };
        let sinks = if c.attn_sinks {
            let name = p("attn_sinks.weight");
            Some(
                self.vector(&name, c.n_head, 0.0)?
                    .ok_or_else(|| self.missing(&name))?,
            )
        } else {
            None
        };
        // llama.cpp names gpt-oss's FFN norm after its Hugging Face name
        // (post_attention_layernorm).
        let ffn_norm = match self.norm(&p("ffn_norm"), e)? {
            Some(n) => n,
            None if c.arch == Arch::GptOss => self.need_norm(&p("post_attention_norm"), e)?,
            None => return Err(self.missing(&p("ffn_norm.weight"))),
        };
        let ffn = match c.moe {
            Some(moe) => {
                let (n, ff) = (moe.experts, moe.n_ff);
                let stacked = |rows: usize| {
                    n.checked_mul(rows).ok_or_else(|| {
                        Error::Config(format!("{n} experts of {rows} rows overflow"))
                    })
                };
                let router = self.need_linear(&p("ffn_gate_inp"), n, e)?;
                let before = self.bytes;
                let ex = Experts {
                    router,
                    input: self.experts_in(&p("ffn_gate_exps"), &p("ffn_up_exps"), n, ff, e)?,
                    down: self.need_linear(&p("ffn_down_exps"), stacked(e)?, ff)?,
                };
                self.expert_bytes += self.bytes - before;
                Ffn::Experts(ex)
            }
            None => Ffn::Dense {
                ffn_in: if c.gated_ffn {
                    self.gate_up(&p("ffn_gate"), &p("ffn_up"), ff, e)?
                } else {
                    FfnIn::Split {
                        gate: None,
                        up: self.need_linear(&p("ffn_up"), ff, e)?,
                    }
                },
                down: self.need_linear(&p("ffn_down"), e, ff)?,
            },
        };
        let ffn_post_norm = if c.post_norms {
            Some(self.need_norm(&p("post_ffw_norm"), e)?)
        } else {
            None
        };
        Ok(LayerWeights {
            attn_norm,
            q,
            k,
            v,
            o,
            q_norm,
            k_norm,
            attn_sub_norm,
            attn_post_norm,
            sinks,
            ffn_norm,
            ffn,
            ffn_sub_norm,
            ffn_post_norm,
        })
    }
}

/// Norm weights and biases are few values read once, so a corrupt one is
/// refused here; in a matrix (or a block scale) the same corruption is
/// accepted: finding it would cost a pass over every weight at load, and
/// it gives wrong text, never a crash.
fn all_finite(name: &str, v: &[f32]) -> Result<()> {
    match v.iter().find(|x| !x.is_finite()) {
        Some(x) => Err(Error::Tensor {
            name: name.into(),
            msg: format!("holds the non-finite value {x}"),
        }),
        None => Ok(()),
    }
}

/// `a`'s and `b`'s chunks of `part` values in turn (each expert's gate
/// rows, then its up rows).
fn interleave<T: Copy>(a: &[T], b: &[T], part: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    for (x, y) in a.chunks(part).zip(b.chunks(part)) {
        out.extend_from_slice(x);
        out.extend_from_slice(y);
    }
    out
}

/// A failed upload of tensor `name`. Memory and device failures keep their
/// variant, so a host app can still tell them apart (`Error::kind`), with
/// the tensor added to what was being done; the rest become tensor errors.
fn upload_error(name: &str, e: Error) -> Error {
    match e {
        Error::OutOfDeviceMemory {
            what,
            needed,
            available,
        } => Error::OutOfDeviceMemory {
            what: format!("{what} for tensor {name}"),
            needed,
            available,
        },
        Error::OutOfHostMemory {
            what,
            needed,
            available,
        } => Error::OutOfHostMemory {
            what: format!("{what} for tensor {name}"),
            needed,
            available,
        },
        Error::DeviceLost(what) => Error::DeviceLost(format!("{what} for tensor {name}")),
        e @ (Error::Vulkan(_) | Error::Io { .. }) => e,
        e => Error::Tensor {
            name: name.to_string(),
            msg: format!("upload failed: {e}"),
        },
    }
}

impl ModelWeights {
    /// Upload every weight `cfg` needs from `src`; `progress(done, total)` after each layer.
    pub fn load(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        be: &mut dyn ComputeBackend,
        opts: WeightOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<ModelWeights> {
        ModelWeights::load_layers(cfg, src, be, opts, 0..cfg.n_layer, progress)
    }

    /// Upload the weights of `layers` (plus the embeddings when they start
    /// at 0 and the head when they end at the last layer); `progress` counts
    /// over the whole model: embeddings 1, layer `i` `i + 2`, head last.
    pub fn load_layers(
        cfg: &ModelConfig,
        src: &dyn TensorSource,
        be: &mut dyn ComputeBackend,
        opts: WeightOptions,
        layers: Range<usize>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<ModelWeights> {
        if layers.start >= layers.end || layers.end > cfg.n_layer {
            return Err(Error::Invalid(format!(
                "layers {}..{} are not a part of the model's {}",
                layers.start, layers.end, cfg.n_layer
            )));
        }
        let mut l = Loader {
            src,
            be,
            cfg,
            opts,
            bytes: 0,
            expert_bytes: 0,
        };
        let total = cfg.n_layer + 2;
        let embed = if layers.start == 0 {
            let e = l.embeddings()?;
            progress(1, total);
            Some(e)
        } else {
            None
        };
        let mut held = Vec::with_capacity(layers.len());
        for i in layers.clone() {
            held.push(l.layer(i)?);
            progress(i + 2, total);
        }
        let head = if layers.end == cfg.n_layer {
            let norm = l.need_norm("output_norm", cfg.n_embd)?;
            let output = match (l.linear("output", cfg.vocab, cfg.n_embd)?, embed) {
                (Some(lin), _) => lin.w,
                (None, Some(e)) => e.tok,
                (None, None) => l.token_embd()?,
            };
            progress(total, total);
            Some(Head { norm, output })
        } else {
            None
        };
        Ok(ModelWeights {
            embed,
            layers: held,
            head,
            bytes: l.bytes,
            expert_bytes: l.expert_bytes,
        })
    }
}
