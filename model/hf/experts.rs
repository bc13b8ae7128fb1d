//! Mixture-of-experts tensors of Hugging Face checkpoints, presented as
//! llama.cpp's stacked ones: `blk.N.ffn_{gate,up}_exps.weight`
//! `[experts·ff, hidden]` and `blk.N.ffn_down_exps.weight` `[experts·hidden,
//! ff]` (expert e's rows at `e·rows`), their biases `[experts, rows]`.
//!
//! Stored layouts:
//! - one 2-D `[rows, cols]` matrix per expert: Qwen3-MoE
//!   `mlp.experts.E.{gate,up,down}_proj.weight`, Mixtral
//!   `block_sparse_moe.experts.E.{w1,w3,w2}.weight` (gate, up, down);
//! - gpt-oss, stacked and applied as `x @ W`: `mlp.experts.gate_up_proj`
//!   `[experts, hidden, 2·ff]` with gate at columns 0::2 and up at 1::2,
//!   `down_proj` `[experts, ff, hidden]`, biases `gate_up_proj_bias`
//!   `[experts, 2·ff]` (interleaved alike) and `down_proj_bias`;
//! - gpt-oss's MXFP4 form of those matrices: `*_blocks` `[experts, rows,
//!   cols/32, 16]` u8 (rows are output rows: no transpose) and `*_scales`
//!   `[experts, rows, cols/32]` u8, converted to ggml's MXFP4 blocks.

use super::Part;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::Arch;
use crate::model::source::RawTensor;
use safetensors::Dtype;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The three stacked matrices of an expert FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Proj {
    Gate,
    Up,
    Down,
}

impl Proj {
    fn gguf(self, layer: usize, suffix: &str) -> String {
        let p = match self {
            Proj::Gate => "gate",
            Proj::Up => "up",
            Proj::Down => "down",
        };
        format!("blk.{layer}.ffn_{p}_exps.{suffix}")
    }
}

/// gpt-oss's stacked tensors (float or MXFP4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Stack {
    GateUp,
    GateUpBias,
    Down,
    DownBias,
}

/// A stored tensor's share of a presented one.
#[derive(Clone, Copy, Debug)]
pub(super) enum Piece {
    /// Expert `expert`'s 2-D matrix of `proj`.
    PerExpert {
        layer: usize,
        proj: Proj,
        expert: usize,
    },
    /// A gpt-oss float stack.
    Stacked { layer: usize, stack: Stack },
    /// Half of a gpt-oss MXFP4 matrix (`GateUp` or `Down`): blocks or scales.
    Mxfp4 {
        layer: usize,
        stack: Stack,
        scales: bool,
    },
}

/// The piece `hf` names, if it is an expert tensor.
pub(super) fn piece(arch: Arch, hf: &str) -> Option<Piece> {
    let hf = hf.strip_prefix("language_model.").unwrap_or(hf);
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let per_expert = |leaf: &str, prefix: &str, names: [&str; 3]| -> Option<Piece> {
        let (expert, name) = leaf.strip_prefix(prefix)?.split_once('.')?;
        let expert: usize = expert.parse().ok()?;
        let proj = match name.strip_suffix(".weight")? {
            n if n == names[0] => Proj::Gate,
            n if n == names[1] => Proj::Up,
            n if n == names[2] => Proj::Down,
            _ => return None,
        };
        Some(Piece::PerExpert {
            layer,
            proj,
            expert,
        })
    };
    if let Some(p) = per_expert(leaf, "mlp.experts.", ["gate_proj", "up_proj", "down_proj"]) {
        return Some(p);
    }
    if let Some(p) = per_expert(leaf, "block_sparse_moe.experts.", ["w1", "w3", "w2"]) {
        return Some(p);
    }
    // The stacked names mean gpt-oss's layout only; transformers' in-memory
    // Qwen3-MoE/Mixtral stacks (never saved: save_pretrained writes one
    // matrix per expert) are laid out otherwise.
    if arch != Arch::GptOss {
        return None;
    }
    let stacked = |stack| Some(Piece::Stacked { layer, stack });
    let mxfp4 = |stack, scales| {
        Some(Piece::Mxfp4 {
            layer,
            stack,
            scales,
        })
    };
    match leaf.strip_prefix("mlp.experts.")? {
        "gate_up_proj" => stacked(Stack::GateUp),
        "gate_up_proj_bias" => stacked(Stack::GateUpBias),
        "down_proj" => stacked(Stack::Down),
        "down_proj_bias" => stacked(Stack::DownBias),
        "gate_up_proj_blocks" => mxfp4(Stack::GateUp, false),
        "gate_up_proj_scales" => mxfp4(Stack::GateUp, true),
        "down_proj_blocks" => mxfp4(Stack::Down, false),
        "down_proj_scales" => mxfp4(Stack::Down, true),
        _ => None,
    }
}

/// Which rows of each expert's matrix a presented tensor takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pick {
    All,
    /// Rows 0, 2, 4, ... (gpt-oss's gate).
    Even,
    /// Rows 1, 3, 5, ... (gpt-oss's up).
    Odd,
}

impl Pick {
    /// The `i`-th picked row of `n`.
    fn row(self, i: usize) -> usize {
        match self {
            Pick::All => i,
            Pick::Even => 2 * i,
            Pick::Odd => 2 * i + 1,
        }
    }

    /// How many of `n` rows are picked; `None` when `n` cannot be split.
    fn count(self, n: usize) -> Option<usize> {
        match self {
            Pick::All => Some(n),
            _ if n.is_multiple_of(2) => Some(n / 2),
            _ => None,
        }
    }
}

/// How a presented expert tensor is assembled. Shapes were checked by
/// [`Pending::finish`], and byte ranges against them by the safetensors
/// header parser.
pub(super) enum Layout {
    /// Per-expert `[rows, cols]` matrices stacked along rows.
    Rows {
        parts: Vec<Part>,
        dtype: DType,
        rows: usize,
        cols: usize,
    },
    /// A stored `[experts, a, b]` tensor (a 2-D `[experts, a]` one as
    /// `[experts, a, 1]`): each expert's matrix, transposed to `[b, a]` when
    /// `transpose`, then its rows picked. Presented as `out`.
    Sliced {
        part: Part,
        dtype: DType,
        dims: [usize; 3],
        transpose: bool,
        pick: Pick,
        out: (usize, usize),
    },
    /// MXFP4 blocks `[experts, rows, groups, 16]` and scales `[experts, rows,
    /// groups]`, rows picked.
    Mxfp4 {
        blocks: Part,
        scales: Part,
        dims: [usize; 3],
        pick: Pick,
    },
}

/// ggml's MXFP4 block: a scale byte and 16 bytes of nibbles.
const MXFP4_BLOCK: usize = 17;

impl Layout {
    /// The presented tensor; `bytes` reads a stored part.
    pub(super) fn tensor<'a>(
        &self,
        name: &str,
        bytes: impl Fn(&Part) -> Result<&'a [u8]>,
    ) -> Result<RawTensor<'a>> {
        let too_big = || Error::Tensor {
            name: name.to_string(),
            msg: "its size overflows".into(),
        };
        match self {
            Layout::Rows {
                parts,
                dtype,
                rows,
                cols,
            } => {
                let total_rows = rows.checked_mul(parts.len()).ok_or_else(too_big)?;
                let data = match contiguous(parts) {
                    Some(span) => Cow::Borrowed(bytes(&span)?),
                    None => {
                        let mut out = Vec::new();
                        for p in parts {
                            out.extend_from_slice(bytes(p)?);
                        }
                        Cow::Owned(out)
                    }
                };
                Ok(RawTensor {
                    dtype: *dtype,
                    rows: total_rows,
                    cols: *cols,
                    data,
                })
            }
            Layout::Sliced {
                part,
                dtype,
                dims,
                transpose,
                pick,
                out,
            } => {
                let src = bytes(part)?;
                let [experts, a, b] = *dims;
                if !*transpose && *pick == Pick::All {
                    return Ok(raw(*dtype, *out, Cow::Borrowed(src)));
                }
                let es = dtype.block_bytes();
                let (rows, cols) = if *transpose { (b, a) } else { (a, b) };
                let picked = pick.count(rows).ok_or_else(too_big)?;
                let n = experts
                    .checked_mul(picked)
                    .and_then(|v| v.checked_mul(cols))
                    .and_then(|v| v.checked_mul(es))
                    .ok_or_else(too_big)?;
                let mut data = Vec::with_capacity(n);
                for e in 0..experts {
                    let m = &src[e * a * b * es..(e + 1) * a * b * es];
                    for i in 0..picked {
                        let r = pick.row(i);
                        if *transpose {
                            // Row r of Mᵀ is column r of M.
                            for c in 0..cols {
                                let at = (c * b + r) * es;
                                data.extend_from_slice(&m[at..at + es]);
                            }
                        } else {
                            data.extend_from_slice(&m[r * b * es..(r + 1) * b * es]);
                        }
                    }
                }
                Ok(raw(*dtype, *out, Cow::Owned(data)))
            }
            Layout::Mxfp4 {
                blocks,
                scales,
                dims,
                pick,
            } => {
                let (qs, sc) = (bytes(blocks)?, bytes(scales)?);
                let [experts, rows, groups] = *dims;
                let picked = pick.count(rows).ok_or_else(too_big)?;
                let total_rows = experts.checked_mul(picked).ok_or_else(too_big)?;
                let cols = groups.checked_mul(32).ok_or_else(too_big)?;
                let n = total_rows
                    .checked_mul(groups)
                    .and_then(|v| v.checked_mul(MXFP4_BLOCK))
                    .ok_or_else(too_big)?;
                let mut data = Vec::with_capacity(n);
                for e in 0..experts {
                    for i in 0..picked {
                        let row = e * rows + pick.row(i);
                        for g in 0..groups {
                            let k = row * groups + g;
                            data.push(sc[k]);
                            data.extend_from_slice(&mxfp4_nibbles(&qs[k * 16..(k + 1) * 16]));
                        }
                    }
                }
                Ok(RawTensor {
                    dtype: DType::MXFP4,
                    rows: total_rows,
                    cols,
                    data: Cow::Owned(data),
                })
            }
        }
    }
}

fn raw(dtype: DType, (rows, cols): (usize, usize), data: Cow<'_, [u8]>) -> RawTensor<'_> {
    RawTensor {
        dtype,
        rows,
        cols,
        data,
    }
}

/// The parts as one span when they follow each other in one shard.
fn contiguous(parts: &[Part]) -> Option<Part> {
    let first = parts.first()?;
    let mut end = first.range.1;
    for p in &parts[1..] {
        if p.shard != first.shard || p.range.0 != end {
            return None;
        }
        end = p.range.1;
    }
    Some(Part {
        range: (first.range.0, end),
        ..first.clone()
    })
}

/// One MXFP4 block's 32 nibbles from the checkpoints' order (element `2j` in
/// byte j's low nibble, `2j+1` in its high one) to ggml's (element `j` low,
/// `j+16` high). Equal to llama.cpp's `transform_nibble_layout`.
pub(crate) fn mxfp4_nibbles(hf: &[u8]) -> [u8; 16] {
    let element = |i: usize| (hf[i / 2] >> ((i % 2) * 4)) & 0xF;
    std::array::from_fn(|j| element(j) | (element(j + 16) << 4))
}

/// Expert pieces gathered over every shard.
#[derive(Default)]
pub(super) struct Pending {
    per_expert: BTreeMap<(usize, Proj), BTreeMap<usize, Part>>,
    stacked: BTreeMap<(usize, Stack), Part>,
    /// (blocks, scales)
    mxfp4: BTreeMap<(usize, Stack), (Option<Part>, Option<Part>)>,
}

impl Pending {
    /// Record `part` as `piece`; the message completes "tensor 'NAME' ...".
    pub(super) fn add(&mut self, piece: Piece, part: Part) -> std::result::Result<(), String> {
        let twice = || "appears twice".to_string();
        match piece {
            Piece::PerExpert {
                layer,
                proj,
                expert,
            } => {
                let slot = self.per_expert.entry((layer, proj)).or_default();
                if slot.insert(expert, part).is_some() {
                    return Err(twice());
                }
            }
            Piece::Stacked { layer, stack } => {
                if self.stacked.insert((layer, stack), part).is_some() {
                    return Err(twice());
                }
            }
            Piece::Mxfp4 {
                layer,
                stack,
                scales,
            } => {
                let slot = self.mxfp4.entry((layer, stack)).or_default();
                let half = if scales { &mut slot.1 } else { &mut slot.0 };
                if half.replace(part).is_some() {
                    return Err(twice());
                }
            }
        }
        Ok(())
    }

    /// The presented tensors, each checked complete and consistent;
    /// `experts` is the count the config declares, when it declares one.
    pub(super) fn finish(
        self,
        experts: Option<usize>,
    ) -> std::result::Result<Vec<(String, Layout)>, String> {
        let mut out = Vec::new();
        let count_ok = |n: usize, what: &str| match experts {
            Some(want) if want != n => Err(format!(
                "{what} holds {n} experts; config.json declares {want}"
            )),
            _ => Ok(()),
        };
        for ((layer, proj), parts) in self.per_expert {
            let name = proj.gguf(layer, "weight");
            // BTreeMap keys are sorted, so 0..n in order means none missing.
            if let Some((i, _)) = parts.keys().enumerate().find(|(i, e)| *i != **e) {
                return Err(format!("{name}: expert {i} has no tensor"));
            }
            count_ok(parts.len(), &name)?;
            let parts: Vec<Part> = parts.into_values().collect();
            let first = &parts[0];
            let (dtype, [rows, cols]) = match (float_type(first.dtype), first.shape.as_slice()) {
                (Some(d), &[r, c]) => (d, [r, c]),
                _ => {
                    return Err(format!(
                        "{name}: expert matrices must be 2-D floats, got {:?} {:?}",
                        first.dtype, first.shape
                    ))
                }
            };
            if let Some(p) = parts
                .iter()
                .find(|p| p.dtype != first.dtype || p.shape != first.shape)
            {
                return Err(format!(
                    "{name}: experts differ in shape or type ({:?} {:?} and {:?} {:?})",
                    first.dtype, first.shape, p.dtype, p.shape
                ));
            }
            out.push((
                name,
                Layout::Rows {
                    parts,
                    dtype,
                    rows,
                    cols,
                },
            ));
        }
        for ((layer, stack), part) in self.stacked {
            let dtype = float_type(part.dtype).ok_or_else(|| {
                format!(
                    "layer {layer}: gpt-oss expert tensor {stack:?} has type {:?}, not a float",
                    part.dtype
                )
            })?;
            let bias = matches!(stack, Stack::GateUpBias | Stack::DownBias);
            let dims = match (bias, part.shape.as_slice()) {
                (false, &[e, a, b]) => [e, a, b],
                (true, &[e, a]) => [e, a, 1],
                _ => {
                    return Err(format!(
                        "layer {layer}: gpt-oss expert tensor {stack:?} has shape {:?}",
                        part.shape
                    ))
                }
            };
            count_ok(dims[0], &format!("layer {layer} {stack:?}"))?;
            // Matrices are stored [in, out] per expert (x @ W): transposed to
            // [out, in]; gate and up interleave along out.
            let (transpose, picks): (bool, &[(Proj, Pick)]) = match stack {
                Stack::GateUp | Stack::GateUpBias => {
                    (!bias, &[(Proj::Gate, Pick::Even), (Proj::Up, Pick::Odd)])
                }
                Stack::Down | Stack::DownBias => (!bias, &[(Proj::Down, Pick::All)]),
            };
            let [e, a, b] = dims;
            let rows = if transpose { b } else { a };
            let cols = if transpose { a } else { b };
            for &(proj, pick) in picks {
                let picked = pick.count(rows).ok_or_else(|| {
                    format!("layer {layer}: gpt-oss gate/up has an odd width {rows}")
                })?;
                let (out_shape, suffix) = if bias {
                    ((e, picked), "bias")
                } else {
                    let r = e
                        .checked_mul(picked)
                        .ok_or_else(|| format!("layer {layer}: {stack:?} is too large"))?;
                    ((r, cols), "weight")
                };
                out.push((
                    proj.gguf(layer, suffix),
                    Layout::Sliced {
                        part: part.clone(),
                        dtype,
                        dims,
                        transpose,
                        pick,
                        out: out_shape,
                    },
                ));
            }
        }
        for ((layer, stack), halves) in self.mxfp4 {
            let (Some(blocks), Some(scales)) = halves else {
                return Err(format!(
                    "layer {layer}: MXFP4 {stack:?} needs both its _blocks and _scales tensors"
                ));
            };
            let dims = match (blocks.shape.as_slice(), scales.shape.as_slice()) {
                (&[e, r, g, 16], &[e2, r2, g2])
                    if (e, r, g) == (e2, r2, g2)
                        && blocks.dtype == Dtype::U8
                        && scales.dtype == Dtype::U8 =>
                {
                    [e, r, g]
                }
                _ => {
                    return Err(format!(
                        "layer {layer}: MXFP4 {stack:?} blocks {:?} {:?} and scales {:?} {:?} do not match ([experts, rows, groups, 16] and [experts, rows, groups] u8)",
                        blocks.dtype, blocks.shape, scales.dtype, scales.shape
                    ))
                }
            };
            count_ok(dims[0], &format!("layer {layer} MXFP4 {stack:?}"))?;
            let picks: &[(Proj, Pick)] = match stack {
                Stack::GateUp => &[(Proj::Gate, Pick::Even), (Proj::Up, Pick::Odd)],
                _ => &[(Proj::Down, Pick::All)],
            };
            for &(proj, pick) in picks {
                if pick.count(dims[1]).is_none() {
                    return Err(format!(
                        "layer {layer}: MXFP4 gate/up has an odd row count {}",
                        dims[1]
                    ));
                }
                out.push((
                    proj.gguf(layer, "weight"),
                    Layout::Mxfp4 {
                        blocks: blocks.clone(),
                        scales: scales.clone(),
                        dims,
                        pick,
                    },
                ));
            }
        }
        let mut names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("{} is stored in two forms", w[0]));
        }
        Ok(out)
    }
}

fn float_type(d: Dtype) -> Option<DType> {
    super::float_dtype(d)
}
