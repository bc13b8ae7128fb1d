//! Architecture as data: one `ModelConfig` describes every supported family.
//! `gguf.rs` and `hf.rs` read what a file says ([`FileFacts`]); the rules an
//! architecture always follows ([`ArchRules`]) are applied here, once. The
//! runner never asks "which architecture?", only "which feature?".

mod gguf;
mod hf;

use crate::backend::{Activation, RopeStyle};
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Phi3,
    Gpt2,
    /// Qwen3-MoE (Qwen3-30B-A3B); Mixtral is `Llama` with experts.
    Qwen3Moe,
    /// OpenAI's gpt-oss.
    GptOss,
    /// BitNet b1.58: llama with RMS norms before the attention output and
    /// the FFN's down projections, ternary weights, int8 activations.
    Bitnet,
}

impl Arch {
    /// The GGUF `general.architecture` string (also the metadata key prefix).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Gpt2 => "gpt2",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::GptOss => "gpt-oss",
            Arch::Bitnet => "bitnet",
        }
    }

    pub fn from_gguf_name(name: &str) -> Result<Arch> {
        Ok(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            "gpt2" => Arch::Gpt2,
            "qwen3moe" => Arch::Qwen3Moe,
            "gpt-oss" => Arch::GptOss,
            "bitnet" => Arch::Bitnet,
            other => {
                return Err(Error::Unsupported(format!(
                    "architecture '{other}' (supported: llama, qwen2, qwen3, gemma3, phi3, gpt2, qwen3moe, gpt-oss, bitnet)"
                )))
            }
        })
    }

    pub(super) fn from_hf_model_type(t: &str) -> Result<Arch> {
        Ok(match t {
            "llama" | "mistral" | "mixtral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3_text" | "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            "gpt2" => Arch::Gpt2,
            "qwen3_moe" => Arch::Qwen3Moe,
            "gpt_oss" => Arch::GptOss,
            "bitnet" => Arch::Bitnet,
            other => {
                return Err(Error::Unsupported(format!(
                    "Hugging Face model_type '{other}' (supported: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma3_text, phi3, gpt2, gpt_oss, bitnet)"
                )))
            }
        })
    }
}

/// What an architecture always has, whichever file (GGUF or Hugging Face
/// config) describes the model.
struct ArchRules {
    norm: NormKind,
    /// The activation when the file names none (GGUF never does).
    act: Activation,
    gated_ffn: bool,
    /// Embeddings multiplied by sqrt(n_embd).
    scaled_embeddings: bool,
    qk_norm: bool,
    post_norms: bool,
    /// Learned absolute positions instead of a rotary embedding.
    learned_pos: bool,
    /// A learned softmax sink per attention head.
    attn_sinks: bool,
    /// RMS norms on the attention output and the FFN's down input.
    sub_norms: bool,
}

impl Arch {
    fn rules(self) -> ArchRules {
        ArchRules {
            norm: if self == Arch::Gpt2 {
                NormKind::Layer
            } else {
                NormKind::Rms
            },
            act: match self {
                Arch::Gemma3 | Arch::Gpt2 => Activation::GeluTanh,
                Arch::GptOss => Activation::SwigluOai,
                _ => Activation::Silu,
            },
            gated_ffn: self != Arch::Gpt2,
            scaled_embeddings: self == Arch::Gemma3,
            qk_norm: matches!(self, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3),
            post_norms: self == Arch::Gemma3,
            learned_pos: self == Arch::Gpt2,
            attn_sinks: self == Arch::GptOss,
            sub_norms: self == Arch::Bitnet,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    Rms,
    /// LayerNorm with bias.
    Layer,
}

/// Rotary embedding shape shared by all layers (the base may differ per layer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub style: RopeStyle,
    /// Leading dimensions of each head that rotate (`head_dim` unless partial).
    pub rot_dim: usize,
}

/// A mixture-of-experts FFN in every layer (Mixtral, Qwen3-MoE, gpt-oss).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub experts: usize,
    /// Experts each token is routed to (the top k).
    pub used: usize,
    /// Each expert's FFN width.
    pub n_ff: usize,
    /// The chosen experts' weights are the softmax over the k chosen
    /// ([`crate::backend::RouteParams::renorm`]).
    pub renorm: bool,
}

/// Most experts a model may declare (the largest published routers have
/// about 384) and a token may use (published models use 2 to 10): the
/// routing kernels' bounds.
const MAX_EXPERTS: usize = 256;
const MAX_EXPERTS_USED: usize = 16;

/// YaRN rope scaling as the file states it (the rope kernels derive their
/// correction range and attention factor from it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnConfig {
    pub factor: f32,
    /// Context the model was trained for before scaling.
    pub original_ctx: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Round the correction range outward (llama.cpp always does;
    /// transformers does unless the config says `truncate: false`, as the
    /// gpt-oss checkpoints do).
    pub truncate: bool,
}

/// What differs between layers of one model (Gemma 3 interleaves local and global attention).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerConfig {
    /// Sliding-window size in positions; 0 = full causal attention.
    pub window: usize,
    pub rope_base: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub vocab: usize,
    /// Longest sequence the model was trained for.
    pub n_ctx: usize,
    pub norm: NormKind,
    pub norm_eps: f32,
    pub act: Activation,
    /// `down(act(gate(x)) * up(x))` when true, `down(act(up(x)))` otherwise.
    pub gated_ffn: bool,
    /// `None`: no rotary embedding (learned absolute positions instead).
    pub rope: Option<RopeConfig>,
    pub layers: Vec<LayerConfig>,
    /// Multiply token embeddings by this (Gemma: sqrt(n_embd)).
    pub embed_scale: Option<f32>,
    /// Attention score scale.
    pub attn_scale: f32,
    /// Per-head RMSNorm of q and k before rope (Qwen 3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm on the attention and FFN outputs before the residual add (Gemma 3).
    pub post_norms: bool,
    /// Learned absolute position embeddings (GPT-2).
    pub learned_pos: bool,
    /// HF Gemma norms compute `x * (1 + w)`; GGUF files store `1 + w` already.
    pub norm_weight_offset: f32,
    /// `Some`: the FFN is a mixture of experts.
    pub moe: Option<MoeConfig>,
    /// `Some`: YaRN-scaled rope (gpt-oss).
    pub yarn: Option<YarnConfig>,
    /// A learned softmax sink per attention head (gpt-oss's `attn_sinks`).
    pub attn_sinks: bool,
    /// BitNet: an RMS norm (`attn_sub_norm`) on the attention output before
    /// its projection, and one (`ffn_sub_norm`) on the FFN's activations
    /// before `down`.
    pub sub_norms: bool,
    /// BitNet's BitLinear: the input of every projection of the layers is
    /// rounded per token to int8 (absmax, [`crate::backend::ComputeBackend::round_i8`])
    /// as the model was trained; the head is not.
    pub round_acts: bool,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Checks that hold for every architecture; run after parsing either format.
    fn validate(self) -> Result<Self> {
        let bad = |m: String| Err(Error::Config(m));
        if self.n_layer == 0 || self.n_embd == 0 || self.n_head == 0 || self.head_dim == 0 {
            return bad(format!(
                "layers {}, hidden {}, heads {}, head_dim {} must all be nonzero",
                self.n_layer, self.n_embd, self.n_head, self.head_dim
            ));
        }
        // q_dim (and kv_dim, never larger) multiply these unchecked.
        if self.n_head.checked_mul(self.head_dim).is_none() {
            return bad(format!(
                "{} heads of {} values overflow",
                self.n_head, self.head_dim
            ));
        }
        if self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad(format!(
                "{} query heads cannot share {} kv heads evenly",
                self.n_head, self.n_head_kv
            ));
        }
        if let Some(r) = self.rope {
            if r.rot_dim == 0 || r.rot_dim > self.head_dim || r.rot_dim % 2 != 0 {
                return bad(format!(
                    "rotary dimension {} must be even and within head_dim {}",
                    r.rot_dim, self.head_dim
                ));
            }
        }
        if self.vocab == 0 || self.n_ff == 0 || self.n_ctx == 0 {
            return bad(format!(
                "vocab {}, ffn {}, context {} must be nonzero",
                self.vocab, self.n_ff, self.n_ctx
            ));
        }
        if let Some(m) = self.moe {
            if m.experts == 0 || m.used == 0 || m.used > m.experts || m.n_ff == 0 {
                return bad(format!(
                    "{} experts, {} used per token, expert width {}: need 1 <= used <= experts and a nonzero width",
                    m.experts, m.used, m.n_ff
                ));
            }
            if m.experts > MAX_EXPERTS || m.used > MAX_EXPERTS_USED {
                return bad(format!(
                    "{} experts, {} per token: at most {MAX_EXPERTS} experts and {MAX_EXPERTS_USED} per token are supported",
                    m.experts, m.used
                ));
            }
        }
        if let Some(y) = self.yarn {
            if y.factor.is_nan() || y.factor < 1.0 || y.original_ctx == 0 {
                return bad(format!(
                    "YaRN factor {} must be at least 1 and its original context {} nonzero",
                    y.factor, y.original_ctx
                ));
            }
        }
        if self.layers.len() != self.n_layer {
            return bad(format!(
                "{} layer configs for {} layers",
                self.layers.len(),
                self.n_layer
            ));
        }
        Ok(self)
    }
}

/// What one file (GGUF metadata or `config.json`) says of a model; the
/// architecture's rules complete it into a [`ModelConfig`].
struct FileFacts {
    arch: Arch,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_ff: usize,
    vocab: usize,
    n_ctx: usize,
    norm_eps: f32,
    /// `None`: the architecture's.
    act: Option<Activation>,
    /// How rotary pairs are laid out in this file's q/k weights.
    rope_style: RopeStyle,
    rot_dim: usize,
    layers: Vec<LayerConfig>,
    attn_scale: f32,
    norm_weight_offset: f32,
    moe: Option<MoeConfig>,
    yarn: Option<YarnConfig>,
    /// See [`ModelConfig::round_acts`].
    round_acts: bool,
}

impl FileFacts {
    fn into_config(self) -> Result<ModelConfig> {
        let r = self.arch.rules();
        ModelConfig {
            arch: self.arch,
            n_layer: self.n_layer,
            n_embd: self.n_embd,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            n_ff: self.n_ff,
            vocab: self.vocab,
            n_ctx: self.n_ctx,
            norm: r.norm,
            norm_eps: self.norm_eps,
            // gpt-oss's config says "silu" for its clamped SwiGLU.
            act: match self.arch {
                Arch::GptOss => r.act,
                _ => self.act.unwrap_or(r.act),
            },
            gated_ffn: r.gated_ffn,
            rope: (!r.learned_pos).then_some(RopeConfig {
                style: self.rope_style,
                rot_dim: self.rot_dim,
            }),
            layers: self.layers,
            embed_scale: r.scaled_embeddings.then(|| (self.n_embd as f32).sqrt()),
            attn_scale: self.attn_scale,
            qk_norm: r.qk_norm,
            post_norms: r.post_norms,
            learned_pos: r.learned_pos,
            norm_weight_offset: self.norm_weight_offset,
            moe: self.moe,
            yarn: self.yarn,
            attn_sinks: r.attn_sinks,
            sub_norms: r.sub_norms,
            round_acts: self.round_acts,
        }
        .validate()
    }
}

/// Most layers a model may declare. Per-layer settings are built from the
/// declared count before any tensor is read, so a file claiming 10^12
/// layers must be refused here, not by the allocator (found by fuzzing);
/// the deepest published models have about 130.
const MAX_LAYERS: usize = 1 << 12;

fn layer_count(n: usize, origin: &str) -> Result<usize> {
    if n > MAX_LAYERS {
        return Err(Error::Config(format!(
            "{origin} declares {n} layers; at most {MAX_LAYERS} are supported"
        )));
    }
    Ok(n)
}
