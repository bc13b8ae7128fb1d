//! Synthetic GGUF models: a real model's shape with random, well-scaled
//! weights (matrices ≈ N(0, 0.02), norm weights ≈ 1), quantized with
//! llama.cpp's type recipe, so kernels see real shapes, strides and block
//! layouts without downloading weights.
//!
//! The file is streamed: header and tensor infos first, then each tensor
//! generated and quantized in row blocks on the rayon pool and written in
//! order, so memory stays at a few blocks whatever the model size. Values are
//! a function of (seed, tensor, block) only: the same seed writes the same
//! file on any number of threads.
//!
//! The storage type of each tensor follows llama.cpp's recipe for the mix
//! ([`recipe`]). Types vkllm cannot quantize to (the IQ2 / IQ3 grids) are
//! written as random valid blocks ([`blocks`]), and so is every quantized
//! type with [`Values::Random`] (`synth --fast`): a 30B-parameter Q4_K file
//! takes minutes of quantizer search, its random blocks seconds.

mod blocks;
mod recipe;

// Public for benches/gemm.rs: weights of the types vkllm cannot quantize to.
pub use blocks::{fill_random, random_blocks};
pub use recipe::{tensor_type, Quant, Role};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::byte_vocab::{byte_tokenizer, fit_vocab};
use crate::model::config::Arch;
use crate::model::gguf::{GgufFile, GgufValue, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::model::gguf_write::{encode_str, encode_value};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::io::{BufWriter, Write};
use std::path::Path;

/// The dimensions of a model family member.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub name: &'static str,
    pub arch: Arch,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub rope_base: f32,
    /// Output projection shares the token embeddings.
    pub tied: bool,
    pub context: usize,
    pub norm_eps: f32,
    /// A mixture of experts in every layer instead of the dense FFN.
    pub experts: Option<ShapeExperts>,
}

/// The experts of a [`Shape`] with a mixture of experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeExperts {
    pub count: usize,
    /// Experts each token uses.
    pub used: usize,
    /// Each expert's feed-forward width.
    pub ffn: usize,
}

#[allow(clippy::too_many_arguments)]
const fn llama(
    name: &'static str,
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    ffn: usize,
    vocab: usize,
    rope_base: f32,
    tied: bool,
    context: usize,
) -> Shape {
    Shape {
        name,
        arch: Arch::Llama,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        ffn,
        vocab,
        rope_base,
        tied,
        context,
        norm_eps: 1e-5,
        experts: None,
    }
}

/// Every shape `synth` knows; the `tiny*` ones are for tests.
pub const SHAPES: &[Shape] = &[
    llama(
        "smollm2-135m",
        576,
        30,
        9,
        3,
        1536,
        49152,
        100_000.0,
        true,
        8192,
    ),
    llama(
        "tinyllama-1.1b",
        2048,
        22,
        32,
        4,
        5632,
        32000,
        10_000.0,
        false,
        2048,
    ),
    llama(
        "llama3.2-1b",
        2048,
        16,
        32,
        8,
        8192,
        128_256,
        500_000.0,
        true,
        131_072,
    ),
    llama(
        "llama3.2-3b",
        3072,
        28,
        24,
        8,
        8192,
        128_256,
        500_000.0,
        true,
        131_072,
    ),
    llama(
        "llama3.1-8b",
        4096,
        32,
        32,
        8,
        14336,
        128_256,
        500_000.0,
        false,
        131_072,
    ),
    Shape {
        name: "qwen3-0.6b",
        arch: Arch::Qwen3,
        hidden: 1024,
        layers: 28,
        heads: 16,
        kv_heads: 8,
        head_dim: 128,
        ffn: 3072,
        vocab: 151_936,
        rope_base: 1_000_000.0,
        tied: true,
        context: 40960,
        norm_eps: 1e-6,
        experts: None,
    },
    Shape {
        name: "qwen3-30b-a3b",
        arch: Arch::Qwen3Moe,
        hidden: 2048,
        layers: 48,
        heads: 32,
        kv_heads: 4,
        head_dim: 128,
        ffn: 6144,
        vocab: 151_936,
        rope_base: 1_000_000.0,
        tied: false,
        context: 40960,
        norm_eps: 1e-6,
        experts: Some(ShapeExperts {
            count: 128,
            used: 8,
            ffn: 768,
        }),
    },
    Shape {
        experts: Some(ShapeExperts {
            count: 8,
            used: 2,
            ffn: 14336,
        }),
        ..llama(
            "mixtral-8x7b",
            4096,
            32,
            32,
            8,
            14336,
            32000,
            1_000_000.0,
            false,
            32768,
        )
    },
    llama("tiny", 256, 2, 4, 2, 512, 1024, 10_000.0, false, 512),
    Shape {
        name: "tiny-qwen3",
        arch: Arch::Qwen3,
        hidden: 256,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 128,
        ffn: 512,
        vocab: 1024,
        rope_base: 1_000_000.0,
        tied: true,
        context: 512,
        norm_eps: 1e-6,
        experts: None,
    },
    Shape {
        name: "gpt-oss-20b",
        arch: Arch::GptOss,
        hidden: 2880,
        layers: 24,
        heads: 64,
        kv_heads: 8,
        head_dim: 64,
        ffn: 2880,
        vocab: 201_088,
        rope_base: 150_000.0,
        tied: false,
        context: 131_072,
        norm_eps: 1e-5,
        experts: Some(ShapeExperts {
            count: 32,
            used: 4,
            ffn: 2880,
        }),
    },
    Shape {
        name: "tiny-gpt-oss",
        arch: Arch::GptOss,
        hidden: 256,
        layers: 2,
        heads: 8,
        kv_heads: 2,
        head_dim: 64,
        ffn: 256,
        vocab: 1024,
        rope_base: 150_000.0,
        tied: false,
        context: 4096,
        norm_eps: 1e-5,
        experts: Some(ShapeExperts {
            count: 8,
            used: 2,
            ffn: 256,
        }),
    },
    Shape {
        name: "bitnet-2b",
        arch: Arch::Bitnet,
        hidden: 2560,
        layers: 30,
        heads: 20,
        kv_heads: 5,
        head_dim: 128,
        ffn: 6912,
        vocab: 128_256,
        rope_base: 500_000.0,
        tied: true,
        context: 4096,
        norm_eps: 1e-5,
        experts: None,
    },
    Shape {
        name: "tiny-bitnet",
        arch: Arch::Bitnet,
        hidden: 256,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        ffn: 512,
        vocab: 1024,
        rope_base: 500_000.0,
        tied: true,
        context: 512,
        norm_eps: 1e-5,
        experts: None,
    },
    Shape {
        name: "tiny-qwen3moe",
        arch: Arch::Qwen3Moe,
        hidden: 256,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        ffn: 512,
        vocab: 1024,
        rope_base: 1_000_000.0,
        tied: false,
        context: 512,
        norm_eps: 1e-6,
        experts: Some(ShapeExperts {
            count: 16,
            used: 4,
            ffn: 128,
        }),
    },
];

/// The shape called `name`.
pub fn shape(name: &str) -> Result<&'static Shape> {
    SHAPES.iter().find(|s| s.name == name).ok_or_else(|| {
        let known: Vec<&str> = SHAPES.iter().map(|s| s.name).collect();
        Error::Invalid(format!(
            "unknown shape '{name}' (known: {})",
            known.join(", ")
        ))
    })
}

/// One tensor of a synthetic model: `rows` rows of `cols` values (`cols`
/// innermost, ggml dims `[cols, rows]`; vectors have one row).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorPlan {
    pub name: String,
    pub role: Role,
    /// Rows in all: `experts` matrices of `rows / experts` rows for an
    /// experts' tensor (ggml dims `[cols, rows / experts, experts]`).
    pub rows: usize,
    pub cols: usize,
    pub dtype: DType,
    pub experts: usize,
}

impl TensorPlan {
    /// ggml dims, innermost first.
    pub fn dims(&self) -> Vec<u64> {
        match self.role {
            Role::Norm => vec![self.cols as u64],
            Role::Bias if self.rows == 1 => vec![self.cols as u64],
            _ if self.experts > 1 => vec![
                self.cols as u64,
                (self.rows / self.experts) as u64,
                self.experts as u64,
            ],
            _ => vec![self.cols as u64, self.rows as u64],
        }
    }
    pub fn bytes(&self) -> Result<usize> {
        Ok(self.dtype.row_bytes(self.cols)? * self.rows)
    }
}

/// Every tensor of `shape` under `quant`, in file order.
pub fn plan(shape: &Shape, quant: Quant) -> Vec<TensorPlan> {
    let s = shape;
    let (q_dim, kv_dim) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut out = Vec::new();
    let experts = s.experts.map_or(1, |e| e.count);
    let mut add = |name: String, role: Role, layer: usize, rows: usize, cols: usize| {
        let dtype = tensor_type(quant, role, layer, s, cols);
        // The experts' tensors stack `experts` matrices.
        let stacked = if name.ends_with("_exps.weight") {
            experts
        } else {
            1
        };
        out.push(TensorPlan {
            name,
            role,
            rows: rows * stacked,
            cols,
            dtype,
            experts: stacked,
        });
    };
    add(
        "token_embd.weight".into(),
        Role::TokenEmbd,
        0,
        s.vocab,
        s.hidden,
    );
    for i in 0..s.layers {
        let n = |t: &str| format!("blk.{i}.{t}.weight");
        add(n("attn_norm"), Role::Norm, i, 1, s.hidden);
        add(n("attn_q"), Role::AttnQ, i, q_dim, s.hidden);
        add(n("attn_k"), Role::AttnK, i, kv_dim, s.hidden);
        add(n("attn_v"), Role::AttnV, i, kv_dim, s.hidden);
        if matches!(s.arch, Arch::Qwen3 | Arch::Qwen3Moe) {
            add(n("attn_q_norm"), Role::Norm, i, 1, s.head_dim);
            add(n("attn_k_norm"), Role::Norm, i, 1, s.head_dim);
        }
        if s.arch == Arch::Bitnet {
            add(n("attn_sub_norm"), Role::Norm, i, 1, q_dim);
        }
        add(n("attn_output"), Role::AttnOutput, i, s.hidden, q_dim);
        let oss = s.arch == Arch::GptOss;
        if oss {
            let b = |t: &str| format!("blk.{i}.{t}.bias");
            add(b("attn_q"), Role::Bias, i, 1, q_dim);
            add(b("attn_k"), Role::Bias, i, 1, kv_dim);
            add(b("attn_v"), Role::Bias, i, 1, kv_dim);
            add(b("attn_output"), Role::Bias, i, 1, s.hidden);
            add(n("attn_sinks"), Role::Bias, i, 1, s.heads);
            add(n("post_attention_norm"), Role::Norm, i, 1, s.hidden);
        } else {
            add(n("ffn_norm"), Role::Norm, i, 1, s.hidden);
        }
        match s.experts {
            Some(e) => {
                add(n("ffn_gate_inp"), Role::Router, i, e.count, s.hidden);
                add(n("ffn_gate_exps"), Role::ExpertGate, i, e.ffn, s.hidden);
                add(n("ffn_up_exps"), Role::ExpertUp, i, e.ffn, s.hidden);
                add(n("ffn_down_exps"), Role::ExpertDown, i, s.hidden, e.ffn);
                if oss {
                    let b = |t: &str| format!("blk.{i}.{t}.bias");
                    add(b("ffn_gate_inp"), Role::Bias, i, 1, e.count);
                    add(b("ffn_gate_exps"), Role::Bias, i, e.count, e.ffn);
                    add(b("ffn_up_exps"), Role::Bias, i, e.count, e.ffn);
                    add(b("ffn_down_exps"), Role::Bias, i, e.count, s.hidden);
                }
            }
            None => {
                add(n("ffn_gate"), Role::FfnGate, i, s.ffn, s.hidden);
                add(n("ffn_up"), Role::FfnUp, i, s.ffn, s.hidden);
                if s.arch == Arch::Bitnet {
                    add(n("ffn_sub_norm"), Role::Norm, i, 1, s.ffn);
                }
                add(n("ffn_down"), Role::FfnDown, i, s.hidden, s.ffn);
            }
        }
    }
    add("output_norm.weight".into(), Role::Norm, 0, 1, s.hidden);
    if !s.tied {
        add("output.weight".into(), Role::Output, 0, s.vocab, s.hidden);
    }
    out
}

/// What [`write`] produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Summary {
    pub tensors: usize,
    pub params: u64,
    /// Bytes of tensor data (without header and padding).
    pub weight_bytes: u64,
    pub file_bytes: u64,
}

/// Values per generated block: large enough to amortize a task, small enough
/// that a batch of blocks in flight stays at tens of MiB.
const BLOCK_VALUES: usize = 1 << 20;
/// Blocks generated in parallel before they are written in order.
const BLOCKS_PER_BATCH: usize = 32;
/// Standard deviation of matrix weights (and of the noise on norm weights).
pub const WEIGHT_STD: f32 = 0.02;

/// How the quantized tensors' values are made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Values {
    /// Gaussian weights quantized with ggml's reference quantizers (random
    /// valid blocks for the types vkllm has no quantizer for).
    #[default]
    Quantized,
    /// Random valid blocks for every quantized type, scaled like the
    /// weights: the same file layout in seconds (float tensors stay
    /// Gaussian).
    Random,
}

/// Write `shape` under `quant` to `path`, quantizing the weights. The
/// tokenizer comes from `donor` (a GGUF whose `tokenizer.*` keys are copied,
/// the vocabulary cut or padded to the shape's size), or is a minimal
/// byte-level gpt2 vocabulary. `progress(done, total)` reports tensor-data
/// bytes written.
pub fn write(
    shape: &Shape,
    quant: Quant,
    path: &Path,
    seed: u64,
    donor: Option<&Path>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Summary> {
    write_values(shape, quant, Values::Quantized, path, seed, donor, progress)
}

/// [`write`], with the quantized tensors' values made as `values` says.
pub fn write_values(
    shape: &Shape,
    quant: Quant,
    values: Values,
    path: &Path,
    seed: u64,
    donor: Option<&Path>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Summary> {
    let tensors = plan(shape, quant);
    let mut metadata = model_metadata(shape, quant);
    metadata.extend(match donor {
        Some(d) => donor_tokenizer(d, shape.vocab)?,
        None => byte_tokenizer(shape.vocab)?,
    });
    let sizes = tensors
        .iter()
        .map(TensorPlan::bytes)
        .collect::<Result<Vec<usize>>>()?;
    let total: u64 = sizes.iter().map(|&b| b as u64).sum();
    let fast = values == Values::Random;
    let result = stream(
        path, seed, fast, &metadata, &tensors, &sizes, total, progress,
    );
    if result.is_err() {
        // A truncated model must not be left behind to be loaded later.
        let _ = std::fs::remove_file(path);
    }
    let file_bytes = result?;
    Ok(Summary {
        tensors: tensors.len(),
        params: tensors.iter().map(|t| (t.rows * t.cols) as u64).sum(),
        weight_bytes: total,
        file_bytes,
    })
}

/// Write the file; returns its size.
#[allow(clippy::too_many_arguments)]
fn stream(
    path: &Path,
    seed: u64,
    fast: bool,
    metadata: &[(String, GgufValue)],
    tensors: &[TensorPlan],
    sizes: &[usize],
    total: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    let file = std::fs::File::create(path).map_err(|e| Error::io_write(path, e))?;
    let mut out = Counted {
        inner: BufWriter::with_capacity(8 << 20, file),
        pos: 0,
    };
    let io = |e| Error::io_write(path, e);
    out.put(&header(metadata, tensors, sizes)).map_err(io)?;
    out.pad_to(out.pos.next_multiple_of(DEFAULT_ALIGNMENT as u64))
        .map_err(io)?;
    let mut done = 0u64;
    for (index, t) in tensors.iter().enumerate() {
        let rows_per_block = (BLOCK_VALUES / t.cols).max(1);
        let blocks = t.rows.div_ceil(rows_per_block);
        for first in (0..blocks).step_by(BLOCKS_PER_BATCH) {
            let batch: Vec<Vec<u8>> = (first..blocks.min(first + BLOCKS_PER_BATCH))
                .into_par_iter()
                .map(|b| {
                    let rows = b * rows_per_block..((b + 1) * rows_per_block).min(t.rows);
                    block_bytes(t, rows, block_seed(seed, index, b), fast)
                })
                .collect::<Result<_>>()?;
            for data in &batch {
                out.put(data).map_err(io)?;
                done += data.len() as u64;
            }
            progress(done, total);
        }
        out.pad_to(out.pos.next_multiple_of(DEFAULT_ALIGNMENT as u64))
            .map_err(io)?;
    }
    out.inner.flush().map_err(io)?;
    Ok(out.pos)
}

/// Independent stream per (seed, tensor, block), so threads cannot change the values.
fn block_seed(seed: u64, tensor: usize, block: usize) -> u64 {
    let mut x =
        seed ^ (tensor as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (block as u64).rotate_left(32);
    // splitmix64 finalizer: nearby inputs give unrelated seeds.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Rows `rows` of tensor `t`, generated and quantized (random blocks where
/// [`blocks::random_blocks`] says).
fn block_bytes(
    t: &TensorPlan,
    rows: std::ops::Range<usize>,
    seed: u64,
    fast: bool,
) -> Result<Vec<u8>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let row_bytes = t.dtype.row_bytes(t.cols)?;
    let mut out = vec![0u8; row_bytes * rows.len()];
    if blocks::random_blocks(t.dtype, fast) {
        blocks::fill_random(t.dtype, &mut rng, WEIGHT_STD, &mut out).map_err(|e| {
            Error::Tensor {
                name: t.name.clone(),
                msg: e.to_string(),
            }
        })?;
        return Ok(out);
    }
    let mut values = vec![0f32; t.cols];
    // Norm weights near 1; the rest near 0, biases and sinks too (a sink
    // well above the scores would swallow the attention).
    let offset = if t.role == Role::Norm { 1.0 } else { 0.0 };
    for dst in out.chunks_exact_mut(row_bytes) {
        for v in values.iter_mut() {
            *v = offset + WEIGHT_STD * gaussian(rng.next_u64());
        }
        crate::quants::quantize_row(t.dtype, &values, dst).map_err(|e| Error::Tensor {
            name: t.name.clone(),
            msg: format!("cannot quantize to {}: {e}", t.dtype),
        })?;
    }
    Ok(out)
}

/// An approximately standard normal value from 64 random bits: the sum of
/// four 16-bit uniforms (Irwin–Hall), centred and scaled to unit variance.
/// Cheap enough for billions of weights; tails stop at ±2√3, harmless here.
fn gaussian(bits: u64) -> f32 {
    let sum = (bits & 0xFFFF) + ((bits >> 16) & 0xFFFF) + ((bits >> 32) & 0xFFFF) + (bits >> 48);
    let uniform_sum = sum as f32 / 65536.0; // mean 2, variance 4/12
    (uniform_sum - 2.0) * 3f32.sqrt()
}

fn model_metadata(s: &Shape, quant: Quant) -> Vec<(String, GgufValue)> {
    let a = s.arch.gguf_name();
    let u32v = |v: usize| GgufValue::U32(v as u32);
    let mut m = vec![
        (
            "general.architecture".to_owned(),
            GgufValue::String(a.to_owned()),
        ),
        (
            "general.name".to_owned(),
            GgufValue::String(format!("synthetic-{}-{}", s.name, quant.name())),
        ),
        (
            "general.file_type".to_owned(),
            GgufValue::U32(quant.file_type()),
        ),
        ("general.quantization_version".to_owned(), GgufValue::U32(2)),
    ];
    let arch_keys = [
        ("block_count", u32v(s.layers)),
        ("context_length", u32v(s.context)),
        ("embedding_length", u32v(s.hidden)),
        ("feed_forward_length", u32v(s.ffn)),
        ("attention.head_count", u32v(s.heads)),
        ("attention.head_count_kv", u32v(s.kv_heads)),
        ("attention.key_length", u32v(s.head_dim)),
        ("attention.value_length", u32v(s.head_dim)),
        (
            "attention.layer_norm_rms_epsilon",
            GgufValue::F32(s.norm_eps),
        ),
        ("rope.freq_base", GgufValue::F32(s.rope_base)),
        ("rope.dimension_count", u32v(s.head_dim)),
        ("vocab_size", u32v(s.vocab)),
    ];
    m.extend(arch_keys.into_iter().map(|(k, v)| (format!("{a}.{k}"), v)));
    if s.arch == Arch::GptOss {
        // gpt-oss's published files: a 128-position window on the even
        // layers, YaRN from a 4096-position original context.
        let keys = [
            ("attention.sliding_window", u32v(128)),
            ("rope.scaling.type", GgufValue::String("yarn".into())),
            ("rope.scaling.factor", GgufValue::F32(32.0)),
            ("rope.scaling.original_context_length", u32v(4096)),
        ];
        m.extend(keys.into_iter().map(|(k, v)| (format!("{a}.{k}"), v)));
    }
    if s.arch == Arch::Bitnet {
        // bitnet-b1.58-2B-4T's squared ReLU (llama.cpp runs SiLU whatever
        // the key says: README, BitNet).
        m.push((
            format!("{a}.hidden_activation"),
            GgufValue::String("relu2".into()),
        ));
    }
    if let Some(e) = s.experts {
        let keys = [
            ("expert_count", u32v(e.count)),
            ("expert_used_count", u32v(e.used)),
            ("expert_feed_forward_length", u32v(e.ffn)),
        ];
        m.extend(keys.into_iter().map(|(k, v)| (format!("{a}.{k}"), v)));
    }
    m
}

/// The donor's `tokenizer.*` keys, its vocabulary fitted to `vocab`;
/// special-token ids outside the new vocabulary are dropped.
fn donor_tokenizer(donor: &Path, vocab: usize) -> Result<Vec<(String, GgufValue)>> {
    let g = GgufFile::open(donor)?;
    let bad = |msg: &str| Error::Gguf {
        path: donor.to_path_buf(),
        msg: msg.to_owned(),
    };
    let list = |key: &str| -> Result<Vec<GgufValue>> {
        g.get_array(key)?
            .map(<[GgufValue]>::to_vec)
            .ok_or_else(|| bad(&format!("a tokenizer donor needs '{key}'")))
    };
    let mut tokens = list("tokenizer.ggml.tokens")?;
    let mut types = list("tokenizer.ggml.token_type")?;
    if tokens.len() != types.len() {
        return Err(bad(
            "tokenizer.ggml.tokens and tokenizer.ggml.token_type differ in length",
        ));
    }
    fit_vocab(&mut tokens, &mut types, vocab);
    // A merge whose parts or result the cut vocabulary lacks would make the
    // BPE tokenizer refuse the file.
    let known: std::collections::HashSet<&str> = tokens.iter().filter_map(|t| t.as_str()).collect();
    let merge_known = |m: &GgufValue| {
        m.as_str()
            .and_then(|m| m.split_once(' '))
            .is_some_and(|(a, b)| {
                known.contains(a) && known.contains(b) && known.contains(format!("{a}{b}").as_str())
            })
    };
    let mut out = Vec::new();
    for (key, value) in g.metadata() {
        if !key.starts_with("tokenizer.") {
            continue;
        }
        let value = match key.as_str() {
            "tokenizer.ggml.tokens" => GgufValue::Array(tokens.clone()),
            "tokenizer.ggml.token_type" => GgufValue::Array(types.clone()),
            "tokenizer.ggml.merges" => match value {
                GgufValue::Array(merges) => {
                    GgufValue::Array(merges.iter().filter(|m| merge_known(m)).cloned().collect())
                }
                other => other.clone(),
            },
            k if k.ends_with("_token_id")
                && value.as_u64().is_some_and(|id| id >= vocab as u64) =>
            {
                continue
            }
            _ => value.clone(),
        };
        out.push((key.clone(), value));
    }
    Ok(out)
}

/// GGUF v3 header, metadata and tensor infos (offsets aligned to
/// [`DEFAULT_ALIGNMENT`]). Encoded here rather than by
/// [`crate::model::gguf_write::GgufWriter`], which holds tensor data in memory.
fn header(metadata: &[(String, GgufValue)], tensors: &[TensorPlan], sizes: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&GGUF_MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        encode_str(&mut out, key);
        out.extend_from_slice(&value.type_id().to_le_bytes());
        encode_value(&mut out, value);
    }
    let mut offset = 0u64;
    for (t, &size) in tensors.iter().zip(sizes) {
        encode_str(&mut out, &t.name);
        let dims = t.dims();
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.dtype.ggml_type_id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset = (offset + size as u64).next_multiple_of(DEFAULT_ALIGNMENT as u64);
    }
    out
}

/// A writer that knows its position, for alignment padding.
struct Counted<W: Write> {
    inner: W,
    pos: u64,
}

impl<W: Write> Counted<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.pos += bytes.len() as u64;
        self.inner.write_all(bytes)
    }

    fn pad_to(&mut self, target: u64) -> std::io::Result<()> {
        const ZEROS: [u8; 64] = [0; 64];
        while self.pos < target {
            let n = (target - self.pos).min(ZEROS.len() as u64) as usize;
            self.put(&ZEROS[..n])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussian_has_unit_variance() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let v: Vec<f32> = (0..100_000).map(|_| gaussian(rng.next_u64())).collect();
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.03, "variance {var}");
    }
}
