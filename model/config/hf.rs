//! A model's configuration from a Hugging Face `config.json` (transformers 4
//! and 5 styles).

use super::{layer_count, Arch, FileFacts, LayerConfig, ModelConfig, MoeConfig, YarnConfig};
use crate::backend::{Activation, RopeStyle};
use crate::error::{Error, Result};
use serde_json::Value;

impl ModelConfig {
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
        // transformers 5 keeps rope scaling in rope_parameters, 4 in rope_scaling.
        let scaling = rope_params
            .filter(|rp| rp.get("rope_type").is_some())
            .or_else(|| c.get("rope_scaling").filter(|s| !s.is_null()));
        let yarn = match scaling.and_then(|s| s.get("rope_type").or_else(|| s.get("type"))) {
            None => None,
            Some(kind) => match kind.as_str() {
                Some("default") => None,
                Some("yarn") => Some(yarn_facts(scaling, origin)?),
                other => {
                    return Err(Error::Unsupported(format!(
                        "{origin}: rope scaling type '{}'",
                        other.unwrap_or("(not a string)")
                    )))
                }
            },
        };
        let partial = rope_params
            .and_then(|rp| rp.get("partial_rotary_factor"))
            .and_then(Value::as_f64)
            .or_else(|| c.get("partial_rotary_factor").and_then(Value::as_f64))
            .unwrap_or(1.0);
        let rot_dim = ((head_dim as f64) * partial).round() as usize;
        let layers = match arch {
            Arch::Gemma3 | Arch::GptOss => {
                let window = uint("sliding_window").unwrap_or(0);
                let types: Vec<String> = match c.get("layer_types").and_then(Value::as_array) {
                    Some(t) => t
                        .iter()
                        .map(|v| v.as_str().unwrap_or("").to_string())
                        .collect(),
                    None => {
                        // gpt-oss alternates sliding and full from layer 0.
                        let default_period = if arch == Arch::GptOss { 2 } else { 6 };
                        let period = uint("sliding_window_pattern")
                            .or(uint("_sliding_window_pattern"))
                            .unwrap_or(default_period);
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
                    (Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe, Some(false) | None) => 0,
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
        let act = match c
            .get("hidden_act")
            .or_else(|| c.get("hidden_activation"))
            .or_else(|| c.get("activation_function"))
            .and_then(Value::as_str)
        {
            None => None,
            Some("silu" | "swish") => Some(Activation::Silu),
            Some("gelu_pytorch_tanh" | "gelu_new" | "gelu_fast") => Some(Activation::GeluTanh),
            Some("relu2") => Some(Activation::Relu2),
            Some(other) => {
                return Err(Error::Unsupported(format!(
                    "{origin}: activation '{other}'"
                )))
            }
        };
        let norm_eps = match arch {
            Arch::Gpt2 => float("layer_norm_epsilon").unwrap_or(1e-5),
            _ => float("rms_norm_eps").unwrap_or(1e-6),
        };
        let attn_scale = match arch {
            Arch::Gemma3 => {
                1.0 / float("query_pre_attn_scalar")
                    .unwrap_or(head_dim as f32)
                    .sqrt()
            }
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let moe = moe_facts(arch, c, n_ff, origin)?;
        let round_acts = bitnet_quantized(arch, &root, origin)?;
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
            act,
            rope_style: RopeStyle::Neox,
            rot_dim,
            layers,
            attn_scale,
            // transformers' Gemma norms compute `x * (1 + w)`.
            norm_weight_offset: if arch == Arch::Gemma3 { 1.0 } else { 0.0 },
            moe,
            yarn,
            round_acts,
        }
        .into_config()
    }
}

/// The experts a `config.json` declares: Mixtral's and gpt-oss's
/// `num_local_experts`, Qwen3-MoE's `num_experts` (transformers 5 writes
/// `num_local_experts` for it too). `None` for a dense model.
fn moe_facts(arch: Arch, c: &Value, n_ff: usize, origin: &str) -> Result<Option<MoeConfig>> {
    let uint = |k: &str| c.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let experts = uint("num_local_experts").or_else(|| uint("num_experts"));
    let experts = match (arch, experts) {
        (Arch::Qwen3Moe | Arch::GptOss, None) => {
            return Err(Error::Config(format!(
                "{origin}: missing or non-integer 'num_local_experts' / 'num_experts'"
            )))
        }
        (Arch::Llama | Arch::Qwen3Moe | Arch::GptOss, Some(n)) => n,
        _ => return Ok(None),
    };
    let used = uint("num_experts_per_tok")
        .or_else(|| uint("experts_per_token"))
        .ok_or_else(|| Error::Config(format!("{origin}: missing 'num_experts_per_tok'")))?;
    let (n_ff, renorm) = match arch {
        Arch::Qwen3Moe => {
            // Dense layers among the sparse ones are not supported (Qwen3-MoE
            // checkpoints have none).
            let dense = c
                .get("mlp_only_layers")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            if dense || uint("decoder_sparse_step").unwrap_or(1) != 1 {
                return Err(Error::Unsupported(format!(
                    "{origin}: dense FFN layers among the experts (mlp_only_layers, decoder_sparse_step)"
                )));
            }
            let ff = uint("moe_intermediate_size").ok_or_else(|| {
                Error::Config(format!("{origin}: missing 'moe_intermediate_size'"))
            })?;
            let renorm = c
                .get("norm_topk_prob")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            (ff, renorm)
        }
        // Mixtral and gpt-oss take the softmax over the chosen experts.
        _ => (n_ff, true),
    };
    Ok(Some(MoeConfig {
        experts,
        used,
        n_ff,
        renorm,
    }))
}

/// YaRN's parameters; transformers' defaults for the optional ones.
fn yarn_facts(scaling: Option<&Value>, origin: &str) -> Result<YarnConfig> {
    let s = scaling.unwrap_or(&Value::Null);
    let float = |k: &str| s.get(k).and_then(Value::as_f64).map(|v| v as f32);
    let factor = float("factor").ok_or_else(|| {
        Error::Config(format!(
            "{origin}: rope scaling type 'yarn' without a 'factor'"
        ))
    })?;
    let original_ctx = s
        .get("original_max_position_embeddings")
        .and_then(Value::as_u64)
        .ok_or_else(|| {
            Error::Config(format!(
                "{origin}: rope scaling type 'yarn' without 'original_max_position_embeddings'"
            ))
        })? as usize;
    Ok(YarnConfig {
        factor,
        original_ctx,
        beta_fast: float("beta_fast").unwrap_or(32.0),
        beta_slow: float("beta_slow").unwrap_or(1.0),
        truncate: s.get("truncate").and_then(Value::as_bool).unwrap_or(true),
    })
}

/// Whether a BitNet `config.json` says its projections are transformers'
/// BitNet linears (`quantization_config.quant_method` "bitnet"): their
/// inputs are then rounded per token to int8. Without it transformers runs
/// the checkpoint as plain float linears, and so does vkllm.
fn bitnet_quantized(arch: Arch, root: &Value, origin: &str) -> Result<bool> {
    let Some(q) = root.get("quantization_config") else {
        return Ok(false);
    };
    let method = q.get("quant_method").and_then(Value::as_str);
    match (arch, method) {
        (Arch::Bitnet, Some("bitnet")) => {}
        (Arch::Bitnet, other) => {
            return Err(Error::Unsupported(format!(
                "{origin}: BitNet quantization method '{}' (supported: bitnet)",
                other.unwrap_or("(none)")
            )))
        }
        _ => return Ok(false),
    }
    // transformers' use_rms_norm adds a norm inside every BitLinear; the
    // published checkpoints leave it off.
    if q.get("use_rms_norm").and_then(Value::as_bool) == Some(true) {
        return Err(Error::Unsupported(format!(
            "{origin}: BitNet quantization with use_rms_norm"
        )));
    }
    Ok(true)
}
