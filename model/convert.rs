//! Hugging Face checkpoint → GGUF, in llama.cpp's conventions (metadata keys,
//! tensor names, llama's q/k row permutation for interleaved rope, Gemma's
//! `1 + w` norms), so files we write load in llama.cpp and through our own
//! GGUF path.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::byte_vocab::{byte_tokenizer, TOKEN_CONTROL};
use crate::model::config::{Arch, ModelConfig};
use crate::model::gguf::GgufValue;
use crate::model::gguf_write::GgufWriter;
use crate::model::hf::HfCheckpoint;
use crate::model::source::TensorSource;
use std::path::Path;

/// Convert the model directory `dir` to a GGUF file at `out`. Float matrices
/// are quantized to `quantize` when given (and their width allows).
pub fn hf_to_gguf(dir: &Path, out: &Path, quantize: Option<DType>) -> Result<()> {
    gguf_from_hf(dir, quantize)?.write(out)
}

/// The GGUF writer for `dir`, ready to write.
pub fn gguf_from_hf(dir: &Path, quantize: Option<DType>) -> Result<GgufWriter> {
    let hf = HfCheckpoint::open(dir)?;
    let c = &hf.config;
    let mut w = GgufWriter::new();
    // general.name is a model's name, not a path (llama.cpp matches on it).
    let name = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dir.display().to_string());
    metadata(&mut w, c, &name);
    // llama.cpp refuses a file without a vocabulary, and ids past it. With no
    // tokenizer in the directory (the tiny test models), a placeholder
    // byte-level vocabulary of the model's size lets llama.cpp load the file
    // and run ids; tokenizer.json is not converted (yet), so a real model's
    // GGUF gets no tokenizer keys rather than wrong ones.
    if !dir.join("tokenizer.json").exists() && c.vocab >= 261 {
        for (k, mut v) in byte_tokenizer(c.vocab)? {
            // llama.cpp sets attributes on `<unk>`, `<s>`, `</s>` by name
            // for models named like Phi-3 and fails when they are absent: the
            // last three fillers take those names.
            if let ("tokenizer.ggml.tokens" | "tokenizer.ggml.token_type", GgufValue::Array(a)) =
                (k.as_str(), &mut v)
            {
                let n = a.len();
                for (i, name) in ["<unk>", "<s>", "</s>"].into_iter().enumerate() {
                    a[n - 3 + i] = if k == "tokenizer.ggml.tokens" {
                        GgufValue::String(name.into())
                    } else {
                        GgufValue::I32(TOKEN_CONTROL)
                    };
                }
            }
            w.add(&k, v);
        }
    }
    let names = hf.names();
    let scaled: std::collections::HashSet<&str> = names
        .iter()
        .filter_map(|n| n.strip_suffix(".scale"))
        .collect();
    for name in &names {
        let name = name.clone();
        let t = hf.tensor(&name)?.ok_or_else(|| Error::Tensor {
            name: name.clone(),
            msg: "vanished".into(),
        })?;
        let is_norm = name.contains("norm");
        let mut data = t.data.to_vec();
        let mut dtype = t.dtype;
        if is_norm && c.norm_weight_offset != 0.0 && name.ends_with(".weight") {
            let v: Vec<f32> = t
                .to_f32(&name)?
                .iter()
                .map(|x| x + c.norm_weight_offset)
                .collect();
            data = bytemuck::cast_slice(&v).to_vec();
            dtype = DType::F32;
        }
        if c.arch == Arch::Llama && t.rows > 1 {
            if name.ends_with("attn_q.weight") {
                data = permute_rows(&data, t.rows, c.n_head)?;
            } else if name.ends_with("attn_k.weight") {
                data = permute_rows(&data, t.rows, c.n_head_kv)?;
            }
        }
        if let Some(q) = quantize {
            // llama.cpp keeps routers in f32 (llama-quantize skips them too).
            // A ternary type holds only BitNet's projections (the
            // matrices with a `.scale`): their values are exactly -1, 0, 1,
            // so each block's scale is 1 and nothing is lost; any other
            // matrix (the embeddings) would be destroyed, so it stays.
            let ternary_ok = !matches!(q, DType::TQ1_0 | DType::TQ2_0)
                || name
                    .strip_suffix(".weight")
                    .is_some_and(|p| scaled.contains(p));
            let matrix = t.rows > 1
                && !is_norm
                && ternary_ok
                && !name.starts_with("position_embd")
                && !name.contains("ffn_gate_inp");
            if matrix && !dtype.is_quantized() && t.cols % q.block_elems() == 0 {
                let src = crate::model::source::RawTensor {
                    dtype,
                    rows: t.rows,
                    cols: t.cols,
                    data: data.into(),
                };
                let vals = src.to_f32(&name)?;
                let rb = q.row_bytes(t.cols)?;
                let mut qd = vec![0u8; rb * t.rows];
                for (s, d) in vals.chunks(t.cols).zip(qd.chunks_mut(rb)) {
                    crate::quants::quantize_row(q, s, d)?;
                }
                data = qd;
                dtype = q;
            }
        }
        let dims: Vec<u64> = if name.ends_with("_exps.weight") {
            // One matrix per expert, stacked: ne = [cols, rows, experts].
            let experts = c.moe.map_or(0, |m| m.experts);
            if experts == 0 || !t.rows.is_multiple_of(experts) {
                return Err(Error::Shape(format!(
                    "{name}: {} rows do not split into {experts} experts",
                    t.rows
                )));
            }
            vec![t.cols as u64, (t.rows / experts) as u64, experts as u64]
        } else if t.rows == 1 {
            vec![t.cols as u64]
        } else {
            vec![t.cols as u64, t.rows as u64]
        };
        w.add_tensor(&name, &dims, dtype, data)?;
    }
    Ok(w)
}

/// llama.cpp's `permute` for llama q/k: within each head, rows of the two rope
/// halves are interleaved so rotary pairs become adjacent.
fn permute_rows(data: &[u8], rows: usize, n_head: usize) -> Result<Vec<u8>> {
    if n_head == 0 || !rows.is_multiple_of(2 * n_head) {
        return Err(Error::Shape(format!(
            "cannot permute {rows} rows into {n_head} rope heads"
        )));
    }
    let rb = data.len() / rows;
    let hd = rows / n_head;
    let mut out = vec![0u8; data.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = h * hd + i * 2 + j;
                let src = h * hd + j * (hd / 2) + i;
                out[dst * rb..(dst + 1) * rb].copy_from_slice(&data[src * rb..(src + 1) * rb]);
            }
        }
    }
    Ok(out)
}

fn metadata(w: &mut GgufWriter, c: &ModelConfig, origin: &str) {
    let a = c.arch.gguf_name();
    let u = |v: usize| GgufValue::U32(v as u32);
    w.add("general.architecture", GgufValue::String(a.into()));
    w.add("general.name", GgufValue::String(origin.into()));
    w.add(&format!("{a}.block_count"), u(c.n_layer));
    w.add(&format!("{a}.context_length"), u(c.n_ctx));
    w.add(&format!("{a}.embedding_length"), u(c.n_embd));
    w.add(&format!("{a}.feed_forward_length"), u(c.n_ff));
    w.add(&format!("{a}.attention.head_count"), u(c.n_head));
    w.add(&format!("{a}.attention.head_count_kv"), u(c.n_head_kv));
    w.add(&format!("{a}.attention.key_length"), u(c.head_dim));
    w.add(&format!("{a}.attention.value_length"), u(c.head_dim));
    w.add(&format!("{a}.vocab_size"), u(c.vocab));
    let eps_key = match c.norm {
        crate::model::config::NormKind::Layer => "attention.layer_norm_epsilon",
        crate::model::config::NormKind::Rms => "attention.layer_norm_rms_epsilon",
    };
    w.add(&format!("{a}.{eps_key}"), GgufValue::F32(c.norm_eps));
    if let Some(r) = c.rope {
        w.add(&format!("{a}.rope.dimension_count"), u(r.rot_dim));
        let global = c
            .layers
            .iter()
            .find(|l| l.window == 0)
            .unwrap_or(&c.layers[0]);
        w.add(
            &format!("{a}.rope.freq_base"),
            GgufValue::F32(global.rope_base),
        );
    }
    if let Some(m) = c.moe {
        w.add(&format!("{a}.expert_count"), u(m.experts));
        w.add(&format!("{a}.expert_used_count"), u(m.used));
        // llama.cpp's Mixtral has none: its FFN width is the experts'.
        if c.arch != Arch::Llama {
            w.add(&format!("{a}.expert_feed_forward_length"), u(m.n_ff));
        }
    }
    if let Some(y) = c.yarn {
        w.add(
            &format!("{a}.rope.scaling.type"),
            GgufValue::String("yarn".into()),
        );
        w.add(
            &format!("{a}.rope.scaling.factor"),
            GgufValue::F32(y.factor),
        );
        w.add(
            &format!("{a}.rope.scaling.original_context_length"),
            u(y.original_ctx),
        );
        w.add(
            &format!("{a}.rope.scaling.yarn_beta_fast"),
            GgufValue::F32(y.beta_fast),
        );
        w.add(
            &format!("{a}.rope.scaling.yarn_beta_slow"),
            GgufValue::F32(y.beta_slow),
        );
    }
    if c.arch == Arch::Bitnet {
        // llama.cpp reads this key for BitNet and runs SiLU without it (and
        // for a name it does not know, relu2 among them: README, BitNet).
        let act = match c.act {
            crate::backend::Activation::Relu2 => "relu2",
            _ => "silu",
        };
        w.add(
            &format!("{a}.hidden_activation"),
            GgufValue::String(act.into()),
        );
    }
    if c.arch == Arch::GptOss {
        // The pattern is fixed in llama.cpp (sliding, full, ...): only the window.
        let window = c.layers.iter().map(|l| l.window).max().unwrap_or(0);
        w.add(&format!("{a}.attention.sliding_window"), u(window));
    }
    if c.arch == Arch::Gemma3 {
        let window = c.layers.iter().map(|l| l.window).max().unwrap_or(0);
        w.add(&format!("{a}.attention.sliding_window"), u(window));
        let pattern = c
            .layers
            .iter()
            .map(|l| GgufValue::Bool(l.window > 0))
            .collect();
        w.add(
            &format!("{a}.attention.sliding_window_pattern"),
            GgufValue::Array(pattern),
        );
        if let Some(local) = c.layers.iter().find(|l| l.window > 0) {
            w.add(
                &format!("{a}.rope.freq_base_swa"),
                GgufValue::F32(local.rope_base),
            );
        }
        w.add(
            &format!("{a}.attention.scale"),
            GgufValue::F32(c.attn_scale),
        );
    }
}
