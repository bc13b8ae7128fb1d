//! Architecture as data: one `ModelConfig` describes every supported family,
//! read from GGUF metadata or a Hugging Face `config.json`. The runner never
//! asks "which architecture?", only "which feature?".

use crate::backend::{Activation, RopeStyle};
use crate::error::{Error, Result};
use crate::model::gguf::GgufFile;
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Phi3,
    Gpt2,
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
            other => {
                return Err(Error::Unsupported(format!(
                    "architecture '{other}' (supported: llama, qwen2, qwen3, gemma3, phi3, gpt2)"
                )))
            }
        })
    }

    fn from_hf_model_type(t: &str) -> Result<Arch> {
        Ok(match t {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3_text" | "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            "gpt2" => Arch::Gpt2,
            other => {
                return Err(Error::Unsupported(format!(
                    "Hugging Face model_type '{other}' (supported: llama, mistral, qwen2, qwen3, gemma3_text, phi3, gpt2)"
                )))
            }
        })
    }
}

/// What an architecture always has, whichever file (GGUF or Hugging Face
/// config) describes the model: derived here, once.
struct ArchFeatures {
    gated_ffn: bool,
    /// Embeddings multiplied by sqrt(n_embd).
    scaled_embeddings: bool,
    qk_norm: bool,
    post_norms: bool,
    learned_pos: bool,
}

impl Arch {
    fn features(self) -> ArchFeatures {
        ArchFeatures {
            gated_ffn: self != Arch::Gpt2,
            scaled_embeddings: self == Arch::Gemma3,
            qk_norm: matches!(self, Arch::Qwen3 | Arch::Gemma3),
            post_norms: self == Arch::Gemma3,
            learned_pos: self == Arch::Gpt2,
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
        if self.layers.len() != self.n_layer {
            return bad(format!(
                "{} layer configs for {} layers",
                self.layers.len(),
                self.n_layer
            ));
        }
        Ok(self)
    }

    /// Read the configuration from GGUF metadata (`{arch}.*` keys, llama.cpp names).
    pub fn from_gguf(g: &GgufFile, vocab_hint: Option<usize>) -> Result<ModelConfig> {
        let arch = Arch::from_gguf_name(g.architecture()?)?;
        let p = arch.gguf_name();
        let key = |k: &str| format!("{p}.{k}");
        let need = |k: &str| -> Result<usize> {
            let full = key(k);
            g.get_u64(&full)?.map(|v| v as usize).ok_or_else(|| {
                Error::Config(format!(
                    "{} lacks metadata key '{full}'",
                    g.path().display()
                ))
            })
        };
        let n_layer = layer_count(need("block_count")?, &g.path().display().to_string())?;
        let n_embd = need("embedding_length")?;
        let n_head = need("attention.head_count")?;
        let n_head_kv = g
            .get_u64(&key("attention.head_count_kv"))?
            .map_or(n_head, |v| v as usize);
        let head_dim = match g.get_u64(&key("attention.key_length"))? {
            Some(v) => v as usize,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        let n_ff = need("feed_forward_length")?;
        let n_ctx = need("context_length")?;
        let vocab = match (g.get_u64(&key("vocab_size"))?, vocab_hint) {
            (Some(v), _) => v as usize,
            (None, Some(v)) => v,
            (None, None) => g
                .get_array("tokenizer.ggml.tokens")?
                .map(|a| a.len())
                .ok_or_else(|| {
                    Error::Config(format!("{}: vocabulary size unknown", g.path().display()))
                })?,
        };
        let f32_key = |k: &str| g.get_f32(&key(k));
        let (norm, norm_eps) = match arch {
            Arch::Gpt2 => (
                NormKind::Layer,
                f32_key("attention.layer_norm_epsilon")?.unwrap_or(1e-5),
            ),
            _ => (
                NormKind::Rms,
                f32_key("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
            ),
        };
        let rope_base = f32_key("rope.freq_base")?.unwrap_or(10_000.0);
        let rope = match arch {
            Arch::Gpt2 => None,
            _ => Some(RopeConfig {
                // llama.cpp permutes llama q/k at conversion so pairs are interleaved.
                style: if arch == Arch::Llama {
                    RopeStyle::Interleaved
                } else {
                    RopeStyle::Neox
                },
                rot_dim: g
                    .get_u64(&key("rope.dimension_count"))?
                    .map_or(head_dim, |v| v as usize),
            }),
        };
        let layers = match arch {
            Arch::Gemma3 => {
                let window = g.get_u64(&key("attention.sliding_window"))?.unwrap_or(0) as usize;
                let local_base = f32_key("rope.freq_base_swa")?.unwrap_or(10_000.0);
                let pattern =
                    gemma_swa_pattern(g, &key("attention.sliding_window_pattern"), n_layer)?;
                pattern
                    .into_iter()
                    .map(|local| {
                        if local {
                            LayerConfig {
                                window,
                                rope_base: local_base,
                            }
                        } else {
                            LayerConfig {
                                window: 0,
                                rope_base,
                            }
                        }
                    })
                    .collect()
            }
            _ => vec![
                LayerConfig {
                    window: 0,
                    rope_base
                };
                n_layer
            ],
        };
        let attn_scale = match f32_key("attention.scale")? {
            Some(s) => s,
            None => 1.0 / (head_dim as f32).sqrt(),
        };
        let f = arch.features();
        ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            vocab,
            n_ctx,
            norm,
            norm_eps,
            act: if matches!(arch, Arch::Gemma3 | Arch::Gpt2) {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            gated_ffn: f.gated_ffn,
            rope,
            layers,
            embed_scale: f.scaled_embeddings.then(|| (n_embd as f32).sqrt()),
            attn_scale,
            qk_norm: f.qk_norm,
            post_norms: f.post_norms,
            learned_pos: f.learned_pos,
            norm_weight_offset: 0.0,
        }
        .validate()
    }

    /// Read a Hugging Face `config.json` (transformers 4 and 5 styles).
    pub fn from_hf_json(text: &str, origin: &str) -> Result<ModelConfig> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| Error::Config(format!("{origin}: invalid JSON: {e}")))?;
        // Multimodal Gemma 3 nests the language model under text_config.
        let c = root.get("text_config").unwrap_or(&root);
        let model_type = c
            .get("model_type")
            .or_else(|| root.get("model_type"))
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Config(format!("{origin}: no model_type")))?;
        let arch = Arch::from_hf_model_type(model_type)?;
        let uint = |k: &str| c.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let float = |k: &str| c.get(k).and_then(Value::as_f64).map(|v| v as f32);
        let need = |k: &str| {
            uint(k).ok_or_else(|| Error::Config(format!("{origin}: missing or non-integer '{k}'")))
        };
        let (n_layer, n_embd, n_head, n_ctx) = if arch == Arch::Gpt2 {
            (
                need("n_layer")?,
                need("n_embd")?,
                need("n_head")?,
                need("n_positions")?,
            )
        } else {
            (
                need("num_hidden_layers")?,
                need("hidden_size")?,
                need("num_attention_heads")?,
                need("max_position_embeddings")?,
            )
        };
        let n_layer = layer_count(n_layer, origin)?;
        let n_head_kv = uint("num_key_value_heads").unwrap_or(n_head);
        let head_dim = uint("head_dim").unwrap_or(n_embd.checked_div(n_head).unwrap_or(0));
        let n_ff = match arch {
            Arch::Gpt2 => uint("n_inner").unwrap_or(4 * n_embd),
            _ => need("intermediate_size")?,
        };
        let vocab = need("vocab_size")?;
        let rope_params = c.get("rope_parameters");
        // transformers 5 moved rope_theta into rope_parameters (per layer type for Gemma 3).
        let theta_of = |layer_type: Option<&str>, default: f32| -> f32 {
            let from_params = rope_params.and_then(|rp| {
                let rp = layer_type.and_then(|t| rp.get(t)).unwrap_or(rp);
                rp.get("rope_theta").and_then(Value::as_f64)
            });
            from_params
                .map(|v| v as f32)
                .or_else(|| float("rope_theta"))
                .unwrap_or(default)
        };
        if let Some(kind) = rope_params
            .and_then(|rp| rp.get("rope_type"))
            .or_else(|| {
                c.get("rope_scaling")
                    .and_then(|s| s.get("rope_type").or_else(|| s.get("type")))
            })
            .and_then(Value::as_str)
        {
            if kind != "default" {
                return Err(Error::Unsupported(format!(
                    "{origin}: rope scaling type '{kind}'"
                )));
            }
        }
        let partial = rope_params
            .and_then(|rp| rp.get("partial_rotary_factor"))
            .and_then(Value::as_f64)
            .or_else(|| c.get("partial_rotary_factor").and_then(Value::as_f64))
            .unwrap_or(1.0);
        let rope = (arch != Arch::Gpt2).then(|| RopeConfig {
            style: RopeStyle::Neox,
            rot_dim: ((head_dim as f64) * partial).round() as usize,
        });
        let layers = match arch {
            Arch::Gemma3 => {
                let window = uint("sliding_window").unwrap_or(0);
                let types: Vec<String> = match c.get("layer_types").and_then(Value::as_array) {
                    Some(t) => t
                        .iter()
                        .map(|v| v.as_str().unwrap_or("").to_string())
                        .collect(),
                    None => {
                        let period = uint("sliding_window_pattern")
                            .or(uint("_sliding_window_pattern"))
                            .unwrap_or(6);
                        (0..n_layer)
                            .map(|i| {
                                if period > 0 && (i + 1) % period == 0 {
                                    "full_attention"
                                } else {
                                    "sliding_attention"
                                }
                                .to_string()
                            })
                            .collect()
                    }
                };
                if types.len() != n_layer {
                    return Err(Error::Config(format!(
                        "{origin}: {} layer_types for {n_layer} layers",
                        types.len()
                    )));
                }
                let local_default = float("rope_local_base_freq").unwrap_or(10_000.0);
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "sliding_attention" => Ok(LayerConfig {
                            window,
                            rope_base: theta_of(Some(t), local_default),
                        }),
                        "full_attention" => Ok(LayerConfig {
                            window: 0,
                            rope_base: theta_of(Some(t), 1_000_000.0),
                        }),
                        other => Err(Error::Unsupported(format!(
                            "{origin}: layer type '{other}'"
                        ))),
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            _ => {
                let window = match (arch, c.get("use_sliding_window").and_then(Value::as_bool)) {
                    (Arch::Qwen2 | Arch::Qwen3, Some(false) | None) => 0,
                    _ => uint("sliding_window").unwrap_or(0),
                };
                vec![
                    LayerConfig {
                        window,
                        rope_base: theta_of(None, 10_000.0)
                    };
                    n_layer
                ]
            }
        };
        let act_name = c
            .get("hidden_act")
            .or_else(|| c.get("hidden_activation"))
            .or_else(|| c.get("activation_function"))
            .and_then(Value::as_str)
            .unwrap_or("silu");
        let act = match act_name {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => Activation::GeluTanh,
            other => {
                return Err(Error::Unsupported(format!(
                    "{origin}: activation '{other}'"
                )))
            }
        };
        let (norm, norm_eps) = match arch {
            Arch::Gpt2 => (NormKind::Layer, float("layer_norm_epsilon").unwrap_or(1e-5)),
            _ => (NormKind::Rms, float("rms_norm_eps").unwrap_or(1e-6)),
        };
        let attn_scale = match arch {
            Arch::Gemma3 => {
                1.0 / float("query_pre_attn_scalar")
                    .unwrap_or(head_dim as f32)
                    .sqrt()
            }
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let f = arch.features();
        ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            vocab,
            n_ctx,
            norm,
            norm_eps,
            act,
            gated_ffn: f.gated_ffn,
            rope,
            layers,
            embed_scale: f.scaled_embeddings.then(|| (n_embd as f32).sqrt()),
            attn_scale,
            qk_norm: f.qk_norm,
            post_norms: f.post_norms,
            learned_pos: f.learned_pos,
            norm_weight_offset: if arch == Arch::Gemma3 { 1.0 } else { 0.0 },
        }
        .validate()
    }
}

/// Which Gemma 3 layers use the sliding window: `{arch}.attention.sliding_window_pattern`
/// as a period (every n-th layer global) or a per-layer bool array; llama.cpp's
/// default period is 6.
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

fn gemma_swa_pattern(g: &GgufFile, key: &str, n_layer: usize) -> Result<Vec<bool>> {
    if let Some(a) = g.get_array(key).ok().flatten() {
        let v: Option<Vec<bool>> = a.iter().map(|x| x.as_bool()).collect();
        return match v {
            Some(v) if v.len() == n_layer => Ok(v),
            _ => Err(Error::Config(format!(
                "{}: '{key}' must hold {n_layer} bools",
                g.path().display()
            ))),
        };
    }
    let period = g.get_u64(key)?.unwrap_or(6) as usize;
    Ok((0..n_layer)
        .map(|i| period == 0 || (i + 1) % period != 0)
        .collect())
}
