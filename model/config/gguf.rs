//! A model's configuration from GGUF metadata (`{arch}.*` keys, llama.cpp's names).

use super::{layer_count, Arch, FileFacts, LayerConfig, ModelConfig, MoeConfig};
use crate::backend::RopeStyle;
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
        // llama.cpp renormalises the chosen experts' weights for every
        // architecture here (Mixtral, Qwen3-MoE; gpt-oss's softmax over the
        // chosen logits is the same).
        let moe = match g.get_u64(&key("expert_count"))? {
            Some(experts) if experts > 0 => Some(MoeConfig {
                experts: experts as usize,
                k: need("expert_used_count")?,
                n_ff: g
                    .get_u64(&key("expert_feed_forward_length"))?
                    .map_or(n_ff, |v| v as usize),
                renorm: true,
            }),
            _ => None,
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
            act: None,
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
            moe,
        }
        .into_config()
    }
}

/// Which Gemma 3 layers use the sliding window: `{arch}.attention.sliding_window_pattern`
/// as a period (every n-th layer global) or a per-layer bool array; llama.cpp's
/// default period is 6.
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
