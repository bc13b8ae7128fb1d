//! A model's configuration from GGUF metadata (`{arch}.*` keys, llama.cpp's names).

use super::{layer_count, Arch, FileFacts, LayerConfig, ModelConfig, MoeConfig, YarnConfig};
use crate::backend::{Activation, RopeStyle};
use crate::error::{Error, Result};
use crate::model::gguf::GgufFile;

impl ModelConfig {
    /// Read the configuration from GGUF metadata.
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
        let norm_eps = match arch {
            Arch::Gpt2 => f32_key("attention.layer_norm_epsilon")?,
            _ => f32_key("attention.layer_norm_rms_epsilon")?,
        }
        .unwrap_or(1e-5);
        let rope_base = f32_key("rope.freq_base")?.unwrap_or(10_000.0);
        let rot_dim = match arch {
            Arch::Gpt2 => head_dim,
            _ => g
                .get_u64(&key("rope.dimension_count"))?
                .map_or(head_dim, |v| v as usize),
        };
        let layers = match arch {
            Arch::Gemma3 | Arch::GptOss => {
                let window = g.get_u64(&key("attention.sliding_window"))?.unwrap_or(0) as usize;
                let local_base = match arch {
                    Arch::Gemma3 => f32_key("rope.freq_base_swa")?.unwrap_or(10_000.0),
                    _ => rope_base,
                };
                // llama.cpp fixes gpt-oss's pattern: sliding and full from layer 0.
                let default_period = if arch == Arch::GptOss { 2 } else { 6 };
                let pattern = swa_pattern(
                    g,
                    &key("attention.sliding_window_pattern"),
                    n_layer,
                    default_period,
                )?;
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
        FileFacts {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            vocab,
            n_ctx,
            norm_eps,
            act: activation(g, arch)?,
            // llama.cpp permutes llama q/k at conversion so pairs are interleaved.
            rope_style: if arch == Arch::Llama {
                RopeStyle::Interleaved
            } else {
                RopeStyle::Neox
            },
            rot_dim,
            layers,
            attn_scale,
            // GGUF files store Gemma's `1 + w` norms already.
            norm_weight_offset: 0.0,
            moe: moe_facts(g, arch, n_ff)?,
            yarn: yarn_facts(g, arch)?,
            // A BitNet GGUF runs as the model was trained (llama.cpp does
            // not round activations per token; README, BitNet).
            round_acts: arch == Arch::Bitnet,
        }
        .into_config()
    }
}

/// `{arch}.expert_count` and the keys that go with it; `None` for a dense model.
fn moe_facts(g: &GgufFile, arch: Arch, n_ff: usize) -> Result<Option<MoeConfig>> {
    let key = |k: &str| format!("{}.{k}", arch.gguf_name());
    let Some(experts) = g.get_u64(&key("expert_count"))? else {
        return Ok(None);
    };
    let used = g.get_u64(&key("expert_used_count"))?.ok_or_else(|| {
        Error::Config(format!(
            "{} has '{}' but no '{}'",
            g.path().display(),
            key("expert_count"),
            key("expert_used_count")
        ))
    })?;
    // Mixtral's GGUF has no expert width of its own: its FFN is the experts'.
    let n_ff = g
        .get_u64(&key("expert_feed_forward_length"))?
        .map_or(n_ff, |v| v as usize);
    Ok(Some(MoeConfig {
        experts: experts as usize,
        used: used as usize,
        n_ff,
        // llama.cpp renormalises the chosen weights for all three families
        // unless the file says otherwise.
        renorm: g.get_bool(&key("expert_weights_norm"))?.unwrap_or(true),
    }))
}

/// `{arch}.rope.scaling.*` when the type is `yarn`. llama.cpp always rounds
/// the correction range (there is no key for it).
fn yarn_facts(g: &GgufFile, arch: Arch) -> Result<Option<YarnConfig>> {
    let key = |k: &str| format!("{}.rope.scaling.{k}", arch.gguf_name());
    if g.get_str(&key("type"))? != Some("yarn") {
        return Ok(None);
    }
    let factor = g.get_f32(&key("factor"))?;
    let original = g.get_u64(&key("original_context_length"))?;
    let (Some(factor), Some(original_ctx)) = (factor, original) else {
        return Err(Error::Config(format!(
            "{}: YaRN rope scaling needs '{}' and '{}'",
            g.path().display(),
            key("factor"),
            key("original_context_length")
        )));
    };
    Ok(Some(YarnConfig {
        factor,
        original_ctx: original_ctx as usize,
        beta_fast: g.get_f32(&key("yarn_beta_fast"))?.unwrap_or(32.0),
        beta_slow: g.get_f32(&key("yarn_beta_slow"))?.unwrap_or(1.0),
        truncate: true,
    }))
}

/// Which layers use the sliding window: `{arch}.attention.sliding_window_pattern`
/// as a period (every n-th layer global) or a per-layer bool array, else
/// `default_period` (llama.cpp's: 6 for Gemma 3, 2 for gpt-oss).
fn swa_pattern(
    g: &GgufFile,
    key: &str,
    n_layer: usize,
    default_period: usize,
) -> Result<Vec<bool>> {
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
    let period = g.get_u64(key)?.map_or(default_period, |v| v as usize);
    Ok((0..n_layer)
        .map(|i| period == 0 || (i + 1) % period != 0)
        .collect())
}

/// `{arch}.hidden_activation` (llama.cpp reads it for a few architectures,
/// BitNet among them; its absence means the architecture's default, SiLU
/// for BitNet as in llama.cpp).
fn activation(g: &GgufFile, arch: Arch) -> Result<Option<Activation>> {
    let key = format!("{}.hidden_activation", arch.gguf_name());
    Ok(match g.get_str(&key)? {
        None => None,
        Some("silu" | "swish" | "swiglu") => Some(Activation::Silu),
        Some("relu2") => Some(Activation::Relu2),
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "{}: '{key}' is '{other}' (supported: silu, relu2)",
                g.path().display()
            )))
        }
    })
}
