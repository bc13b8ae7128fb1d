//! Hugging Face checkpoints: `config.json` + one or more `*.safetensors`
//! shards, memory-mapped, with tensor names mapped to GGUF names.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::{Arch, ModelConfig};
use crate::model::source::{RawTensor, TensorSource};
use memmap2::Mmap;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

mod experts;

/// A shard's bytes: mapped from its file, or held in memory (fuzzing and
/// tests build checkpoints from bytes).
enum ShardBytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for ShardBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ShardBytes::Mapped(m) => m,
            ShardBytes::Owned(v) => v,
        }
    }
}

struct Shard {
    path: PathBuf,
    map: ShardBytes,
    /// Start of the data section (8-byte length + JSON header).
    data_start: usize,
}

/// One safetensors tensor's place: its shard, element type, shape and byte
/// range in the shard's data section (the header parser checked that the
/// range holds exactly the shape's elements).
#[derive(Clone, Debug)]
struct Part {
    shard: usize,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    range: (usize, usize),
}

/// How a presented (GGUF-named) tensor is made from the checkpoint's.
enum Entry {
    /// One tensor as stored: `[rows, cols]`, a vector or a scalar.
    Plain {
        part: Part,
        dtype: DType,
        /// GPT-2 `Conv1D` stores `[in, out]`; matmul wants `[out, in]`.
        transpose: bool,
    },
    /// A mixture-of-experts tensor assembled from one or more stored ones.
    Experts(experts::Layout),
    /// A BitNet projection's weight as f32 `[rows, cols]` (see [`Ternary`]).
    Ternary { part: Part, how: Ternary },
    /// A BitNet projection's scale, one f32 (`{name}.scale`).
    Scale(f32),
}

/// How a BitNet checkpoint (transformers' `quantization_config`) stores a
/// projection, and what vkllm presents: the ternary weight and its scale.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ternary {
    /// `autobitlinear`, `online`: float weights, ternarized on every
    /// forward with their absmean; `inv` is `1 / absmean` as transformers'
    /// WeightQuant computes it (in f32), values `round(w · inv)` in [-1, 1].
    Online { inv: f32 },
    /// `bitlinear` (the released checkpoints): uint8 `[rows / 4, cols]`,
    /// 2 bits per value (transformers' pack_weights: row `r` of the weight
    /// is bits `2i` of packed row `r % (rows / 4)`, `i = r / (rows / 4)`,
    /// stored as value + 1); the product is divided by `weight_scale`.
    Packed,
    /// `autobitlinear`, `offline`: the weight as stored (float, or packed
    /// as above), the product multiplied by `weight_scale`.
    AsStored,
}

/// What a BitNet checkpoint's `quantization_config` says of its projections.
#[derive(Clone, Copy, Debug, PartialEq)]
enum BitnetLayout {
    Online,
    Packed,
    AsStored,
}
/// A Hugging Face model directory.
pub struct HfCheckpoint {
    dir: PathBuf,
    pub config: ModelConfig,
    shards: Vec<Shard>,
    tensors: HashMap<String, Entry>,
    /// Expert tensors gathered across shards until [`HfCheckpoint::finish`].
    experts: experts::Pending,
    /// A quantized BitNet checkpoint's layout, and its projections' weight
    /// and `weight_scale` parts by GGUF prefix (`blk.0.attn_q`) until
    /// [`HfCheckpoint::finish`].
    bitnet: Option<BitnetLayout>,
    bitnet_parts: HashMap<String, (Option<Part>, Option<Part>)>,
}

impl HfCheckpoint {
    /// The checkpoint's directory (its tokenizer files live there too).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn open(dir: &Path) -> Result<HfCheckpoint> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
        let origin = cfg_path.display().to_string();
        let config = ModelConfig::from_hf_json(&text, &origin)?;
        let bitnet = bitnet_layout(&config, &text, &origin)?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(Error::Safetensors {
                path: dir.to_path_buf(),
                msg: "no *.safetensors files in the directory".into(),
            });
        }
        let mut checkpoint = HfCheckpoint {
            dir: dir.to_path_buf(),
            config,
            shards: Vec::new(),
            tensors: HashMap::new(),
            experts: experts::Pending::default(),
            bitnet,
            bitnet_parts: HashMap::new(),
        };
        for path in files {
            let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
            // SAFETY: the map is read-only; a file truncated underneath us is the
            // same hazard every mmap-based loader accepts.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
            checkpoint.add_shard(path, ShardBytes::Mapped(map))?;
        }
        checkpoint.finish()
    }

    /// A checkpoint from a `config.json` text and safetensors images held in
    /// memory; `name` stands in for the directory in messages (and is where
    /// its tokenizer would be looked for).
    pub fn from_bytes(config_json: &str, shards: Vec<Vec<u8>>, name: &str) -> Result<HfCheckpoint> {
        let dir = PathBuf::from(name);
        let origin = dir.join("config.json").display().to_string();
        let config = ModelConfig::from_hf_json(config_json, &origin)?;
        let bitnet = bitnet_layout(&config, config_json, &origin)?;
        let mut checkpoint = HfCheckpoint {
            dir,
            config,
            shards: Vec::new(),
            tensors: HashMap::new(),
            experts: experts::Pending::default(),
            bitnet,
            bitnet_parts: HashMap::new(),
        };
        for (i, bytes) in shards.into_iter().enumerate() {
            let path = checkpoint.dir.join(format!("model-{i}.safetensors"));
            checkpoint.add_shard(path, ShardBytes::Owned(bytes))?;
        }
        checkpoint.finish()
    }

    /// Reads one shard's header and records the tensors vkllm uses from it.
    fn add_shard(&mut self, path: PathBuf, map: ShardBytes) -> Result<()> {
        let bad = |msg: String| Error::Safetensors {
            path: path.clone(),
            msg,
        };
        let (header_len, meta) =
            safetensors::SafeTensors::read_metadata(&map).map_err(|e| bad(header_error(e)))?;
        let data_start = 8 + header_len;
        let shard = self.shards.len();
        for (name, info) in meta.tensors() {
            let part = Part {
                shard,
                dtype: info.dtype,
                shape: info.shape.clone(),
                range: info.data_offsets,
            };
            if self.bitnet.is_some() {
                if let Some((prefix, is_scale)) = bitnet_projection(self.config.arch, &name) {
                    let slot = self.bitnet_parts.entry(prefix).or_default();
                    if is_scale {
                        slot.1 = Some(part);
                    } else {
                        slot.0 = Some(part);
                    }
                    continue;
                }
            }
            let Some(target) = map_name(self.config.arch, &name) else {
                continue;
            };
            match target {
                Target::Plain {
                    name: gguf_name,
                    transpose,
                } => {
                    let dtype = float_dtype(part.dtype).ok_or_else(|| {
                        bad(format!(
                            "tensor '{name}' has unsupported dtype {:?}",
                            part.dtype
                        ))
                    })?;
                    if part.shape.len() > 2 || (transpose && part.shape.len() != 2) {
                        return Err(bad(format!(
                            "tensor '{name}' has unexpected shape {:?}",
                            part.shape
                        )));
                    }
                    self.tensors.insert(
                        gguf_name,
                        Entry::Plain {
                            part,
                            dtype,
                            transpose,
                        },
                    );
                }
                Target::Experts(piece) => {
                    self.experts
                        .add(piece, part)
                        .map_err(|m| bad(format!("tensor '{name}' {m}")))?;
                }
            }
        }
        self.shards.push(Shard {
            path,
            map,
            data_start,
        });
        Ok(())
    }

    /// After the last shard: every expert tensor complete and consistent,
    /// every BitNet projection's weight and scale resolved.
    fn finish(mut self) -> Result<HfCheckpoint> {
        self.finish_bitnet()?;
        let pending = std::mem::take(&mut self.experts);
        for (name, layout) in pending
            .finish(self.config.moe.map(|m| m.experts))
            .map_err(|msg| Error::Safetensors {
                path: self.dir.clone(),
                msg,
            })?
        {
            self.tensors.insert(name, Entry::Experts(layout));
        }
        Ok(self)
    }

    /// The bytes of `part`, or an error naming the tensor presented as `name`.
    fn bytes(&self, part: &Part, name: &str) -> Result<&[u8]> {
        let shard = &self.shards[part.shard];
        shard
            .map
            .get(shard.data_start + part.range.0..shard.data_start + part.range.1)
            .ok_or_else(|| Error::Safetensors {
                path: shard.path.clone(),
                msg: format!("tensor for '{name}' lies outside the file"),
            })
    }
}

impl HfCheckpoint {
    /// Presents each BitNet projection as `{prefix}.weight` (f32 values of
    /// the ternary weight) and `{prefix}.scale` (what the product is
    /// multiplied by), from the layout the config declares.
    fn finish_bitnet(&mut self) -> Result<()> {
        let Some(layout) = self.bitnet else {
            return Ok(());
        };
        // In name order, so a broken checkpoint names the same tensor each time.
        let mut parts: Vec<_> = std::mem::take(&mut self.bitnet_parts).into_iter().collect();
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        for (prefix, (weight, scale)) in parts {
            let bad = |msg: String| Error::Tensor {
                name: format!("{prefix}.weight"),
                msg,
            };
            let weight = weight.ok_or_else(|| bad("has a weight_scale but no weight".into()))?;
            if weight.shape.len() != 2 {
                return Err(bad(format!(
                    "has the shape {:?}, not a matrix",
                    weight.shape
                )));
            }
            let packed = weight.dtype == safetensors::Dtype::U8;
            let stored_scale = match &scale {
                Some(p) => Some(self.scalar(p, &format!("{prefix}.weight_scale"))?),
                None => None,
            };
            let (how, value) = match (layout, packed, stored_scale) {
                (BitnetLayout::Online, false, _) => {
                    let w = self.float_values(&weight, &prefix)?;
                    // transformers: 1 / mean(|w|).clamp(min=1e-5), in f32.
                    let mean = (w.iter().map(|v| v.abs() as f64).sum::<f64>()
                        / w.len().max(1) as f64) as f32;
                    let inv = 1.0 / mean.max(1e-5);
                    (Ternary::Online { inv }, 1.0 / inv)
                }
                (BitnetLayout::Packed, true, Some(s)) if s != 0.0 => (Ternary::Packed, 1.0 / s),
                (BitnetLayout::AsStored, _, Some(s)) => (Ternary::AsStored, s),
                (BitnetLayout::AsStored, _, None) => (Ternary::AsStored, 1.0),
                _ => {
                    return Err(bad(format!(
                        "is stored as {:?}{}, which the config's BitNet layout ({layout:?}) does not hold",
                        weight.dtype,
                        if stored_scale.is_some() { " with a weight_scale" } else { " without a weight_scale" }
                    )))
                }
            };
            if !value.is_finite() {
                return Err(bad(format!("has the non-finite scale {value}")));
            }
            if packed && weight.shape[0].checked_mul(4).is_none() {
                return Err(bad("has too many rows".into()));
            }
            if !packed && float_dtype(weight.dtype).is_none() {
                return Err(bad(format!("has unsupported dtype {:?}", weight.dtype)));
            }
            self.tensors.insert(
                format!("{prefix}.weight"),
                Entry::Ternary { part: weight, how },
            );
            self.tensors
                .insert(format!("{prefix}.scale"), Entry::Scale(value));
        }
        Ok(())
    }

    /// A float tensor's values as f32.
    fn float_values(&self, part: &Part, name: &str) -> Result<Vec<f32>> {
        let dtype = float_dtype(part.dtype).ok_or_else(|| Error::Tensor {
            name: name.to_string(),
            msg: format!("has unsupported dtype {:?}", part.dtype),
        })?;
        let bytes = self.bytes(part, name)?;
        let n = bytes.len() / dtype.block_bytes();
        let raw = RawTensor {
            dtype,
            rows: 1,
            cols: n,
            data: Cow::Borrowed(bytes),
        };
        raw.to_f32(name)
    }

    /// The one value of a float tensor of one element.
    fn scalar(&self, part: &Part, name: &str) -> Result<f32> {
        match self.float_values(part, name)?.as_slice() {
            [v] => Ok(*v),
            v => Err(Error::Tensor {
                name: name.to_string(),
                msg: format!("has {} values, expected one", v.len()),
            }),
        }
    }

    /// A BitNet projection's weight as f32 `[rows, cols]` values.
    fn ternary(&self, part: &Part, how: Ternary, name: &str) -> Result<RawTensor<'_>> {
        let (rows, cols) = (part.shape[0], part.shape[1]);
        if part.dtype != safetensors::Dtype::U8 {
            let mut v = self.float_values(part, name)?;
            if let Ternary::Online { inv } = how {
                v.iter_mut()
                    .for_each(|x| *x = (*x * inv).round_ties_even().clamp(-1.0, 1.0));
            }
            return Ok(f32_tensor(rows, cols, v));
        }
        // Packed: 4 weight rows per stored row (see `Ternary::Packed`).
        let too_big = || Error::Tensor {
            name: name.to_string(),
            msg: format!("{rows} packed rows of {cols} values overflow"),
        };
        let out_rows = rows.checked_mul(4).ok_or_else(too_big)?;
        let n = out_rows.checked_mul(cols).ok_or_else(too_big)?;
        let bytes = self.bytes(part, name)?;
        let mut v = vec![0f32; n];
        for (r, dst) in v.chunks_exact_mut(cols.max(1)).enumerate() {
            let (shift, src) = (2 * (r / rows), r % rows);
            let row = bytes
                .get(src * cols..(src + 1) * cols)
                .ok_or_else(|| Error::Tensor {
                    name: name.to_string(),
                    msg: "data shorter than its shape".into(),
                })?;
            for (d, b) in dst.iter_mut().zip(row) {
                *d = ((b >> shift) & 3) as f32 - 1.0;
            }
        }
        Ok(f32_tensor(out_rows, cols, v))
    }
}

fn f32_tensor(rows: usize, cols: usize, v: Vec<f32>) -> RawTensor<'static> {
    RawTensor {
        dtype: DType::F32,
        rows,
        cols,
        data: Cow::Owned(bytemuck::cast_slice(&v).to_vec()),
    }
}

/// The layout of a BitNet checkpoint quantized by transformers' BitNet
/// integration (`quantization_config.quant_method` "bitnet"), `None`
/// otherwise (a float checkpoint runs as plain linears, as in transformers).
fn bitnet_layout(cfg: &ModelConfig, text: &str, origin: &str) -> Result<Option<BitnetLayout>> {
    if cfg.arch != Arch::Bitnet || !cfg.round_acts {
        return Ok(None);
    }
    let root: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Error::Config(format!("{origin}: invalid JSON: {e}")))?;
    let q = &root["quantization_config"];
    let class = q
        .get("linear_class")
        .and_then(|v| v.as_str())
        .unwrap_or("bitlinear");
    let mode = q
        .get("quantization_mode")
        .and_then(|v| v.as_str())
        .unwrap_or("offline");
    Ok(Some(match (class, mode) {
        ("autobitlinear", "online") => BitnetLayout::Online,
        ("autobitlinear", "offline") => BitnetLayout::AsStored,
        ("bitlinear", _) => BitnetLayout::Packed,
        _ => {
            return Err(Error::Unsupported(format!(
                "{origin}: BitNet linear_class '{class}' with quantization_mode '{mode}'"
            )))
        }
    }))
}

/// A BitNet projection's weight or `weight_scale` tensor: its GGUF prefix
/// (`blk.0.attn_q`) and whether it is the scale.
fn bitnet_projection(arch: Arch, hf: &str) -> Option<(String, bool)> {
    let (base, is_scale) = match hf.strip_suffix("_scale") {
        Some(b) if b.ends_with(".weight") => (b.to_string(), true),
        _ => (hf.to_string(), false),
    };
    let (name, _) = gguf_name(arch, &base)?;
    let prefix = name.strip_suffix(".weight")?;
    let leaf = prefix.rsplit('.').next()?;
    matches!(
        leaf,
        "attn_q" | "attn_k" | "attn_v" | "attn_output" | "ffn_gate" | "ffn_up" | "ffn_down"
    )
    .then(|| (prefix.to_string(), is_scale))
}

/// The float element types a presented tensor may have.
fn float_dtype(d: safetensors::Dtype) -> Option<DType> {
    match d {
        safetensors::Dtype::F32 => Some(DType::F32),
        safetensors::Dtype::F16 => Some(DType::F16),
        safetensors::Dtype::BF16 => Some(DType::BF16),
        _ => None,
    }
}

impl TensorSource for HfCheckpoint {
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>> {
        let Some(entry) = self.tensors.get(name) else {
            return Ok(None);
        };
        let (part, dtype, transpose) = match entry {
            Entry::Plain {
                part,
                dtype,
                transpose,
            } => (part, *dtype, *transpose),
            Entry::Experts(layout) => {
                return layout.tensor(name, |p| self.bytes(p, name)).map(Some)
            }
            Entry::Ternary { part, how } => return self.ternary(part, *how, name).map(Some),
            Entry::Scale(v) => return Ok(Some(f32_tensor(1, 1, vec![*v]))),
        };
        let bytes = self.bytes(part, name)?;
        let (rows, cols) = match part.shape.as_slice() {
            [] => (1, 1),
            [n] => (1, *n),
            [r, c] => (*r, *c),
            _ => unreachable!("shapes were checked at open"),
        };
        if !transpose {
            return Ok(Some(RawTensor {
                dtype,
                rows,
                cols,
                data: Cow::Borrowed(bytes),
            }));
        }
        let es = dtype.block_bytes();
        let mut out = vec![0u8; bytes.len()];
        for r in 0..rows {
            for c in 0..cols {
                let src = (r * cols + c) * es;
                let dst = (c * rows + r) * es;
                out[dst..dst + es].copy_from_slice(&bytes[src..src + es]);
            }
        }
        Ok(Some(RawTensor {
            dtype,
            rows: cols,
            cols: rows,
            data: Cow::Owned(out),
        }))
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tensors.keys().cloned().collect();
        v.sort();
        v
    }

    fn origin(&self) -> String {
        self.dir.display().to_string()
    }
}

/// What a stored tensor becomes.
enum Target {
    /// The tensor under a GGUF name, transposed or not.
    Plain { name: String, transpose: bool },
    /// A piece of a mixture-of-experts tensor.
    Experts(experts::Piece),
}

fn map_name(arch: Arch, hf: &str) -> Option<Target> {
    if let Some(piece) = experts::piece(arch, hf) {
        return Some(Target::Experts(piece));
    }
    gguf_name(arch, hf).map(|(name, transpose)| Target::Plain { name, transpose })
}

/// Map a Hugging Face tensor name to its GGUF name, and whether it must be
/// transposed. `None` for tensors vkllm does not use (rotary caches, ...)
/// and for expert tensors, which are assembled from several (see `experts`).
pub fn gguf_name(arch: Arch, hf: &str) -> Option<(String, bool)> {
    if arch == Arch::Gpt2 {
        // Conv1D weights (every 2-D layer weight except norms) are stored transposed.
        return gpt2_name(hf.strip_prefix("transformer.").unwrap_or(hf)).map(|n| {
            let conv1d = n.starts_with("blk.") && n.ends_with(".weight") && !n.contains("norm");
            (n, conv1d)
        });
    }
    let hf = hf.strip_prefix("language_model.").unwrap_or(hf);
    let simple = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(s) = simple {
        return Some((s.to_string(), false));
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    // Gemma 3 norms the attention output with it; gpt-oss's FFN norm has
    // this name in llama.cpp.
    let post_attention_norm = matches!(arch, Arch::Gemma3 | Arch::GptOss);
    let name = match leaf {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" if post_attention_norm => "post_attention_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.o_proj.bias" => "attn_output.bias",
        "self_attn.qkv_proj.weight" => "attn_qkv.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "self_attn.sinks" => "attn_sinks.weight",
        "self_attn.attn_sub_norm.weight" => "attn_sub_norm.weight",
        "mlp.ffn_sub_norm.weight" => "ffn_sub_norm.weight",
        // The router: Qwen3-MoE (and Mixtral inside transformers),
        // Mixtral's checkpoints, gpt-oss.
        "mlp.gate.weight" | "block_sparse_moe.gate.weight" | "mlp.router.weight" => {
            "ffn_gate_inp.weight"
        }
        "mlp.router.bias" => "ffn_gate_inp.bias",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.gate_up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        _ => return None,
    };
    Some((format!("blk.{layer}.{name}"), false))
}

fn gpt2_name(hf: &str) -> Option<String> {
    let simple = match hf {
        "wte.weight" => Some("token_embd.weight"),
        "wpe.weight" => Some("position_embd.weight"),
        "ln_f.weight" => Some("output_norm.weight"),
        "ln_f.bias" => Some("output_norm.bias"),
        _ => None,
    };
    if let Some(s) = simple {
        return Some(s.to_string());
    }
    let rest = hf.strip_prefix("h.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let name = match leaf {
        "ln_1.weight" => "attn_norm.weight",
        "ln_1.bias" => "attn_norm.bias",
        "attn.c_attn.weight" => "attn_qkv.weight",
        "attn.c_attn.bias" => "attn_qkv.bias",
        "attn.c_proj.weight" => "attn_output.weight",
        "attn.c_proj.bias" => "attn_output.bias",
        "ln_2.weight" => "ffn_norm.weight",
        "ln_2.bias" => "ffn_norm.bias",
        "mlp.c_fc.weight" => "ffn_up.weight",
        "mlp.c_fc.bias" => "ffn_up.bias",
        "mlp.c_proj.weight" => "ffn_down.weight",
        "mlp.c_proj.bias" => "ffn_down.bias",
        _ => return None,
    };
    Some(format!("blk.{layer}.{name}"))
}

/// The safetensors crate's header errors as phrases (its own Display is the
/// variant's debug name, e.g. `InvalidOffset("x")`).
fn header_error(e: safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::HeaderTooLarge | E::InvalidHeaderLength => {
            "the header length is larger than the file or the 100 MB limit".into()
        }
        E::HeaderTooSmall => "the file is too short for a header".into(),
        E::InvalidHeader | E::InvalidHeaderStart => "the header is not UTF-8 JSON".into(),
        E::InvalidHeaderDeserialization | E::JsonError(_) => {
            "the header is not a JSON map of tensors".into()
        }
        E::MetadataIncompleteBuffer => {
            "the tensor data is shorter than the header says (truncated file?)".into()
        }
        E::InvalidOffset(name) => format!(
            "tensor '{name}' has data offsets that leave gaps, overlap or run past the data"
        ),
        E::TensorInvalidInfo => "a tensor's shape and dtype do not match its byte range".into(),
        E::ValidationOverflow => "a tensor's size overflows".into(),
        other => format!("{other:?}"),
    }
}
