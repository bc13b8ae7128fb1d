//! Which type each tensor of a synthetic model is stored in: llama.cpp's
//! `llama_tensor_get_type` for the mixes `synth` writes, simplified.
//!
//! - 1-D tensors (norms) are F32; `f16` makes every matrix F16 (llama.cpp
//!   applies no recipe to float types);
//! - the output matrix, and the token embeddings when they are tied to it,
//!   become Q6_K, or Q8_0 when its rows are not a multiple of 256 or the
//!   mix is q8_0;
//! - q4_k_m: Q4_K everywhere else, except attn_v and ffn_down in the layers
//!   `use_more_bits` picks (the first and last eighth, and every third
//!   between), which get Q6_K;
//! - q3_k_m: Q3_K, except attn_v (Q5_K in the first two layers, else Q4_K),
//!   ffn_down (Q5_K in the first sixteenth of the layers, else Q4_K) and
//!   attn_output (Q4_K);
//! - q2_k: Q2_K, except attn_v (Q4_K when 4 or more query heads share a KV
//!   head, else Q3_K), ffn_down and attn_output (Q3_K);
//! - iq4_xs: IQ4_XS, except attn_v (Q5_K when 4 or more query heads share a
//!   KV head) and ffn_down in the first eighth of the layers (Q5_K; no
//!   importance matrix);
//! - a type whose block does not divide the rows falls back as in
//!   llama.cpp: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K / Q3_K → Q4_0,
//!   IQ4_XS → IQ4_NL.
//!
//! Left out: the rules for other mixes, MoE, 70B and Falcon special cases,
//! imatrix-dependent choices, and llama.cpp's tensor order (tensors are
//! written in layer order; loaders look them up by name).

use super::Shape;
use crate::dtype::{DType, QK_K};
use crate::error::{Error, Result};

/// A quantization mix, named as llama.cpp's `llama-quantize` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    F16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q4KM,
    Q3KM,
    Q2K,
    IQ4XS,
    /// llama.cpp's MXFP4_MOE (gpt-oss's published files): the experts in
    /// MXFP4, every other matrix in Q8_0.
    Mxfp4Moe,
    /// Ternary (BitNet b1.58): every layer matrix in TQ1_0 / TQ2_0; an
    /// untied token embedding Q4_K, as llama.cpp's recipe has it.
    TQ1_0,
    TQ2_0,
}

impl Quant {
    pub const ALL: [Quant; 11] = [
        Quant::F16,
        Quant::Q8_0,
        Quant::Q4_0,
        Quant::Q4_1,
        Quant::Q4KM,
        Quant::Q3KM,
        Quant::Q2K,
        Quant::IQ4XS,
        Quant::Mxfp4Moe,
        Quant::TQ1_0,
        Quant::TQ2_0,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Quant::F16 => "f16",
            Quant::Q8_0 => "q8_0",
            Quant::Q4_0 => "q4_0",
            Quant::Q4_1 => "q4_1",
            Quant::Q4KM => "q4_k_m",
            Quant::Q3KM => "q3_k_m",
            Quant::Q2K => "q2_k",
            Quant::IQ4XS => "iq4_xs",
            Quant::Mxfp4Moe => "mxfp4_moe",
            Quant::TQ1_0 => "tq1_0",
            Quant::TQ2_0 => "tq2_0",
        }
    }

    pub fn from_name(name: &str) -> Result<Quant> {
        let lower = name.to_ascii_lowercase();
        Quant::ALL
            .into_iter()
            .find(|q| q.name() == lower)
            .ok_or_else(|| {
                let known: Vec<&str> = Quant::ALL.iter().map(|q| q.name()).collect();
                Error::Invalid(format!(
                    "unknown quantization '{name}' (known: {})",
                    known.join(", ")
                ))
            })
    }

    /// llama.cpp's `general.file_type` (`llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            Quant::F16 => 1,
            Quant::Q4_0 => 2,
            Quant::Q4_1 => 3,
            Quant::Q8_0 => 7,
            Quant::Q2K => 10,
            Quant::Q3KM => 12,
            Quant::Q4KM => 15,
            Quant::IQ4XS => 30,
            Quant::Mxfp4Moe => 38,
            Quant::TQ1_0 => 36,
            Quant::TQ2_0 => 37,
        }
    }

    /// The type of matrices no rule singles out.
    fn base(self) -> DType {
        match self {
            Quant::F16 => DType::F16,
            Quant::Q8_0 => DType::Q8_0,
            Quant::Q4_0 => DType::Q4_0,
            Quant::Q4_1 => DType::Q4_1,
            Quant::Q4KM => DType::Q4K,
            Quant::Q3KM => DType::Q3K,
            Quant::Q2K => DType::Q2K,
            Quant::IQ4XS => DType::IQ4XS,
            Quant::Mxfp4Moe => DType::Q8_0,
            Quant::TQ1_0 => DType::TQ1_0,
            Quant::TQ2_0 => DType::TQ2_0,
        }
    }
}

/// What a tensor is, for the type recipe and its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    TokenEmbd,
    Output,
    Norm,
    /// A mixture of experts' router (`ffn_gate_inp`): kept in F32, as
    /// llama.cpp keeps it.
    Router,
    /// A bias or gpt-oss's attention sinks: F32 vectors near 0.
    Bias,
    /// The experts' stacked matrices (`ffn_*_exps`), as their FFN role
    /// otherwise.
    ExpertGate,
    ExpertUp,
    ExpertDown,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    FfnGate,
    FfnUp,
    FfnDown,
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third one between.
fn use_more_bits(layer: usize, n_layers: usize) -> bool {
    let eighth = n_layers / 8;
    layer < eighth || layer >= 7 * n_layers / 8 || (layer - eighth) % 3 == 2
}

/// The storage type of a tensor of `shape` under `quant` (see the module docs).
pub fn tensor_type(quant: Quant, role: Role, layer: usize, shape: &Shape, cols: usize) -> DType {
    if matches!(role, Role::Norm | Role::Router | Role::Bias) {
        return DType::F32;
    }
    let role = match role {
        Role::ExpertGate | Role::ExpertUp | Role::ExpertDown if quant == Quant::Mxfp4Moe => {
            return DType::MXFP4
        }
        Role::ExpertGate => Role::FfnGate,
        Role::ExpertUp => Role::FfnUp,
        Role::ExpertDown => Role::FfnDown,
        r => r,
    };
    if quant == Quant::F16 {
        return DType::F16;
    }
    let (base, n) = (quant.base(), shape.layers);
    let gqa = shape.heads / shape.kv_heads.max(1);
    let is_output = role == Role::Output || (shape.tied && role == Role::TokenEmbd);
    let dtype = if is_output {
        if !cols.is_multiple_of(QK_K) || base == DType::Q8_0 {
            DType::Q8_0
        } else {
            DType::Q6K
        }
    } else {
        use {DType::*, Role::*};
        match (quant, role) {
            (Quant::Q4KM, AttnV | FfnDown) if use_more_bits(layer, n) => Q6K,
            (Quant::Q3KM, AttnV) if layer < 2 => Q5K,
            (Quant::Q3KM, FfnDown) if layer < n / 16 => Q5K,
            (Quant::Q3KM, AttnV | FfnDown | AttnOutput) => Q4K,
            (Quant::Q2K, AttnV) if gqa >= 4 => Q4K,
            (Quant::Q2K, AttnV | FfnDown | AttnOutput) => Q3K,
            (Quant::IQ4XS, AttnV) if gqa >= 4 => Q5K,
            (Quant::IQ4XS, FfnDown) if layer < n / 8 => Q5K,
            (Quant::TQ1_0 | Quant::TQ2_0, TokenEmbd) => Q4K,
            _ => base,
        }
    };
    if cols.is_multiple_of(dtype.block_elems()) {
        return dtype;
    }
    match dtype {
        DType::Q4K => DType::Q5_0,
        DType::Q5K => DType::Q5_1,
        DType::Q6K => DType::Q8_0,
        DType::Q2K | DType::Q3K => DType::Q4_0,
        DType::IQ4XS => DType::IQ4NL,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{plan, shape};
    use super::*;

    /// `(tensor name suffix, type)` → how many tensors of a plan match.
    fn counter(p: &[super::super::TensorPlan]) -> impl Fn(&str, DType) -> usize + '_ {
        |suffix, t| {
            p.iter()
                .filter(|x| x.name.ends_with(suffix) && x.dtype == t)
                .count()
        }
    }

    #[test]
    fn q4_k_m_gives_half_of_attn_v_and_ffn_down_more_bits() {
        let s = shape("llama3.1-8b").unwrap();
        let p = plan(s, Quant::Q4KM);
        let count = counter(&p);
        assert_eq!(count("attn_v.weight", DType::Q6K), 16);
        assert_eq!(count("ffn_down.weight", DType::Q6K), 16);
        assert_eq!(count("attn_q.weight", DType::Q4K), 32);
        let get = |n: &str| p.iter().find(|x| x.name == n).unwrap().dtype;
        assert_eq!(get("output.weight"), DType::Q6K);
        assert_eq!(get("token_embd.weight"), DType::Q4K);
        assert_eq!(get("blk.0.attn_v.weight"), DType::Q6K);
        assert_eq!(get("blk.4.attn_v.weight"), DType::Q4K);
        assert_eq!(get("blk.6.ffn_down.weight"), DType::Q6K);
        assert_eq!(get("blk.0.attn_norm.weight"), DType::F32);
    }

    #[test]
    fn low_bit_mixes_follow_llama_cpp_on_llama_3_2_1b() {
        // 16 layers, 32 query heads on 8 KV heads (GQA 4), tied output.
        let s = shape("llama3.2-1b").unwrap();
        let p = plan(s, Quant::Q3KM);
        let count = counter(&p);
        assert_eq!(count("attn_v.weight", DType::Q5K), 2);
        assert_eq!(count("attn_v.weight", DType::Q4K), 14);
        assert_eq!(count("ffn_down.weight", DType::Q5K), 1);
        assert_eq!(count("ffn_down.weight", DType::Q4K), 15);
        assert_eq!(count("attn_output.weight", DType::Q4K), 16);
        assert_eq!(count("attn_q.weight", DType::Q3K), 16);
        assert_eq!(count("ffn_up.weight", DType::Q3K), 16);
        assert_eq!(count("token_embd.weight", DType::Q6K), 1);

        let p = plan(s, Quant::Q2K);
        let count = counter(&p);
        assert_eq!(count("attn_v.weight", DType::Q4K), 16);
        assert_eq!(count("ffn_down.weight", DType::Q3K), 16);
        assert_eq!(count("attn_output.weight", DType::Q3K), 16);
        assert_eq!(count("ffn_gate.weight", DType::Q2K), 16);
        assert_eq!(count("attn_k.weight", DType::Q2K), 16);

        let p = plan(s, Quant::IQ4XS);
        let count = counter(&p);
        assert_eq!(count("attn_v.weight", DType::Q5K), 16);
        assert_eq!(count("ffn_down.weight", DType::Q5K), 2);
        assert_eq!(count("ffn_down.weight", DType::IQ4XS), 14);
        assert_eq!(count("attn_q.weight", DType::IQ4XS), 16);
        assert_eq!(count("token_embd.weight", DType::Q6K), 1);
    }

    #[test]
    fn rows_off_the_block_fall_back_like_llama_cpp() {
        // SmolLM2's 576-wide rows are not whole 256-value blocks.
        let s = shape("smollm2-135m").unwrap();
        let p = plan(s, Quant::Q4KM);
        let get = |n: &str| p.iter().find(|x| x.name == n).unwrap().dtype;
        assert_eq!(get("token_embd.weight"), DType::Q8_0);
        assert_eq!(get("blk.0.attn_v.weight"), DType::Q8_0);
        assert_eq!(get("blk.4.attn_v.weight"), DType::Q5_0);
        assert_eq!(get("blk.4.ffn_down.weight"), DType::Q4K);
        assert_eq!(get("blk.0.ffn_down.weight"), DType::Q6K);
        assert!(p.iter().all(|t| t.name != "output.weight"));
        let get = |q, n| tensor_type(q, Role::AttnQ, n, s, 576);
        assert_eq!(get(Quant::Q2K, 3), DType::Q4_0);
        assert_eq!(get(Quant::Q3KM, 3), DType::Q4_0);
        assert_eq!(get(Quant::IQ4XS, 3), DType::IQ4NL);
    }
}
