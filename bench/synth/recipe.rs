//! Which type each tensor of a synthetic model is stored in: llama.cpp's
//! `llama_tensor_get_type` (src/llama-quant.cpp) for every mix
//! `llama-quantize` offers with a type vkllm reads, rule for rule for the
//! shapes `synth` has:
//!
//! - 1-D tensors (norms), the MoE router and biases are F32; `f16` / `bf16`
//!   make every matrix F16 / BF16 (llama.cpp applies no recipe to float
//!   types), `mxfp4` every matrix MXFP4 (`llama-quantize --pure` to
//!   MXFP4_MOE: without `--pure`, a dense model's matrices are all Q8_0);
//! - the output matrix, and the token embeddings when they are tied to it:
//!   Q8_0 for mxfp4_moe and where the rows are not whole blocks of the mix's
//!   type, Q5_K for the IQ2 mixes and iq3_xxs, else Q6_K (Q8_0 stays Q8_0);
//! - untied token embeddings: Q2_K (iq2_xxs, iq2_xs), IQ3_S (iq2_s, iq2_m,
//!   iq3_xxs), Q4_K (tq1_0, tq2_0), else the mix's type;
//! - attn_v, attn_k, attn_q, attn_output, ffn_down, ffn_gate and ffn_up get
//!   the per-mix promotions of [`promote`], with `use_more_bits` layers (the
//!   first and last eighth, every third between), the GQA factor, the
//!   8-expert (Mixtral) and the 70B cases;
//! - a type whose block does not divide the rows falls back as in llama.cpp
//!   ([`fallback`]), to F16 where the fallback does not divide them either.
//!
//! Importance matrix: llama.cpp refuses to write the IQ2 mixes, iq3_xxs,
//! iq3_xs and q2_k_s without one (`tensor_requires_imatrix`), so those are
//! the files it writes with one (iq3_xxs's attn_v and ffn_down are what
//! the matrix changes); the other mixes are written as without (one would
//! change q4_0 / q5_0 / iq4_nl / iq4_xs's first ffn_down layers). Types
//! vkllm has no quantizer for (the IQ2 / IQ3 grids) get random valid
//! blocks ([`super::blocks`]).
//!
//! Left out: Falcon's cases (no Falcon shape) and llama.cpp's tensor order
//! (tensors are written in layer order; loaders look them up by name).
//! `scripts/llamacpp-mixes.py` compares every tensor's type with what
//! llama.cpp's own quantizer picks; `tests/bench.rs` checks the plans
//! against its stored choices (`tests/data/llamacpp_mix_types.json`).

use super::Shape;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::Arch;

/// A quantization mix, named as llama.cpp's `llama-quantize` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2K,
    Q2KS,
    Q3KS,
    Q3KM,
    Q3KL,
    Q4KS,
    Q4KM,
    Q5KS,
    Q5KM,
    Q6K,
    IQ2XXS,
    IQ2XS,
    IQ2S,
    IQ2M,
    IQ3XXS,
    IQ3XS,
    IQ3S,
    IQ3M,
    IQ4NL,
    IQ4XS,
    TQ1_0,
    TQ2_0,
    /// llama.cpp's MXFP4_MOE (gpt-oss's published files): the experts in
    /// MXFP4, every other matrix in Q8_0 (a dense model: all Q8_0).
    Mxfp4Moe,
    /// `llama-quantize --pure` to MXFP4_MOE: every matrix MXFP4.
    Mxfp4,
}

/// One mix's facts: `llama-quantize`'s name, its `llama_ftype`, the type
/// of the matrices no rule singles out (`llama_ftype_get_default_type`),
/// and whether llama.cpp writes it only with an importance matrix.
struct Mix {
    quant: Quant,
    name: &'static str,
    file_type: u32,
    default: DType,
    imatrix: bool,
}

const fn mix(quant: Quant, name: &'static str, file_type: u32, default: DType) -> Mix {
    Mix {
        quant,
        name,
        file_type,
        default,
        imatrix: false,
    }
}

const fn with_imatrix(m: Mix) -> Mix {
    Mix { imatrix: true, ..m }
}

/// Every mix, in [`Quant::ALL`]'s order.
const MIXES: [Mix; 31] = [
    mix(Quant::F16, "f16", 1, DType::F16),
    mix(Quant::BF16, "bf16", 32, DType::BF16),
    mix(Quant::Q8_0, "q8_0", 7, DType::Q8_0),
    mix(Quant::Q4_0, "q4_0", 2, DType::Q4_0),
    mix(Quant::Q4_1, "q4_1", 3, DType::Q4_1),
    mix(Quant::Q5_0, "q5_0", 8, DType::Q5_0),
    mix(Quant::Q5_1, "q5_1", 9, DType::Q5_1),
    mix(Quant::Q2K, "q2_k", 10, DType::Q2K),
    with_imatrix(mix(Quant::Q2KS, "q2_k_s", 21, DType::Q2K)),
    mix(Quant::Q3KS, "q3_k_s", 11, DType::Q3K),
    mix(Quant::Q3KM, "q3_k_m", 12, DType::Q3K),
    mix(Quant::Q3KL, "q3_k_l", 13, DType::Q3K),
    mix(Quant::Q4KS, "q4_k_s", 14, DType::Q4K),
    mix(Quant::Q4KM, "q4_k_m", 15, DType::Q4K),
    mix(Quant::Q5KS, "q5_k_s", 16, DType::Q5K),
    mix(Quant::Q5KM, "q5_k_m", 17, DType::Q5K),
    mix(Quant::Q6K, "q6_k", 18, DType::Q6K),
    with_imatrix(mix(Quant::IQ2XXS, "iq2_xxs", 19, DType::IQ2XXS)),
    with_imatrix(mix(Quant::IQ2XS, "iq2_xs", 20, DType::IQ2XS)),
    // IQ2_S's matrices are IQ2_XS and IQ2_M's IQ2_S, as llama.cpp has it.
    with_imatrix(mix(Quant::IQ2S, "iq2_s", 28, DType::IQ2XS)),
    with_imatrix(mix(Quant::IQ2M, "iq2_m", 29, DType::IQ2S)),
    with_imatrix(mix(Quant::IQ3XXS, "iq3_xxs", 23, DType::IQ3XXS)),
    with_imatrix(mix(Quant::IQ3XS, "iq3_xs", 22, DType::IQ3S)),
    mix(Quant::IQ3S, "iq3_s", 26, DType::IQ3S),
    mix(Quant::IQ3M, "iq3_m", 27, DType::IQ3S),
    mix(Quant::IQ4NL, "iq4_nl", 25, DType::IQ4NL),
    mix(Quant::IQ4XS, "iq4_xs", 30, DType::IQ4XS),
    mix(Quant::TQ1_0, "tq1_0", 36, DType::TQ1_0),
    mix(Quant::TQ2_0, "tq2_0", 37, DType::TQ2_0),
    mix(Quant::Mxfp4Moe, "mxfp4_moe", 38, DType::MXFP4),
    mix(Quant::Mxfp4, "mxfp4", 38, DType::MXFP4),
];

// MIXES has one row per variant, in declaration order: `Quant::mix` indexes it.
const _: () = {
    assert!(Quant::Mxfp4 as usize + 1 == MIXES.len());
    let mut i = 0;
    while i < MIXES.len() {
        assert!(MIXES[i].quant as usize == i);
        i += 1;
    }
};

impl Quant {
    pub const ALL: [Quant; 31] = {
        let mut all = [Quant::F16; 31];
        let mut i = 0;
        while i < MIXES.len() {
            all[i] = MIXES[i].quant;
            i += 1;
        }
        all
    };

    fn mix(self) -> &'static Mix {
        // MIXES holds the variants in declaration order (checked below, at
        // compile time).
        &MIXES[self as usize]
    }

    pub fn name(self) -> &'static str {
        self.mix().name
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
        self.mix().file_type
    }

    /// Whether llama.cpp writes this mix only with an importance matrix
    /// (and so picks its types as with one).
    pub fn needs_imatrix(self) -> bool {
        self.mix().imatrix
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
    let default = quant.mix().default;
    if !default.is_quantized() {
        return default;
    }
    let chosen = if quant == Quant::Mxfp4 {
        default
    } else {
        promote(quant, role, layer, shape, cols)
    };
    fallback(chosen, cols)
}

/// llama.cpp's `llama_tensor_get_type_impl` for the roles synth writes.
fn promote(quant: Quant, role: Role, layer: usize, shape: &Shape, cols: usize) -> DType {
    use {DType as T, Quant as Q, Role as R};
    let mix = quant.mix();
    let (t, i, n) = (mix.default, layer, shape.layers);
    let n_expert = shape.experts.map_or(0, |e| e.count);
    let gqa = shape.heads / shape.kv_heads.max(1);
    let more = use_more_bits(i, n);
    // llama.cpp's LLM_TYPE_70B: 80 Llama layers with grouped KV heads.
    let is_70b = shape.arch == Arch::Llama && n == 80 && shape.heads != shape.kv_heads;
    let expert = matches!(role, R::ExpertGate | R::ExpertUp | R::ExpertDown);
    let role = match role {
        R::ExpertGate => R::FfnGate,
        R::ExpertUp => R::FfnUp,
        R::ExpertDown => R::FfnDown,
        r => r,
    };
    let iq2 = matches!(quant, Q::IQ2XXS | Q::IQ2XS | Q::IQ2S | Q::IQ2M);
    let iq2_sm = matches!(quant, Q::IQ2S | Q::IQ2M);
    if role == R::Output || (shape.tied && role == R::TokenEmbd) {
        return if quant == Q::Mxfp4Moe || !cols.is_multiple_of(t.block_elems()) {
            T::Q8_0
        } else if iq2 || quant == Q::IQ3XXS {
            T::Q5K
        } else if t != T::Q8_0 {
            T::Q6K
        } else {
            t
        };
    }
    if quant == Q::Mxfp4Moe {
        return if expert { T::MXFP4 } else { T::Q8_0 };
    }
    if role == R::TokenEmbd {
        return match quant {
            Q::IQ2XXS | Q::IQ2XS => T::Q2K,
            Q::IQ2S | Q::IQ2M | Q::IQ3XXS => T::IQ3S,
            Q::TQ1_0 | Q::TQ2_0 => T::Q4K,
            _ => t,
        };
    }
    if iq2 {
        let iq2_more = if iq2_sm { T::IQ3S } else { T::Q2K };
        return match role {
            R::AttnV if gqa >= 4 || n_expert >= 4 => T::Q4K,
            R::AttnV => iq2_more,
            R::AttnK if n_expert == 8 => T::Q4K,
            R::FfnDown if i < n / 8 => iq2_more,
            R::AttnOutput if n_expert == 8 => T::Q5K,
            R::AttnOutput if iq2_sm => T::IQ3S,
            _ => t,
        };
    }
    match role {
        R::AttnV => {
            let v = match quant {
                Q::Q2K if gqa >= 4 => T::Q4K,
                Q::Q2K => T::Q3K,
                Q::Q2KS if gqa >= 4 => T::Q4K,
                Q::IQ3XXS if gqa >= 4 => T::Q4K,
                Q::IQ3XXS if !mix.imatrix => T::IQ3S,
                Q::IQ3XXS => T::IQ3XXS,
                Q::IQ3XS | Q::IQ3S if gqa >= 4 => T::Q4K,
                Q::IQ3M => T::Q4K,
                Q::Q3KM if i < 2 => T::Q5K,
                Q::Q3KM => T::Q4K,
                Q::Q3KL => T::Q5K,
                Q::IQ4NL | Q::IQ4XS if gqa >= 4 => T::Q5K,
                Q::Q4KM | Q::Q5KM if more => T::Q6K,
                Q::Q4KS if i < 4 => T::Q5K,
                _ => t,
            };
            if n_expert == 8 {
                T::Q8_0
            } else if is_70b && matches!(v, T::Q3K | T::Q4K) {
                T::Q5K
            } else {
                v
            }
        }
        R::AttnK if n_expert == 8 => T::Q8_0,
        R::AttnK | R::AttnQ => match quant {
            Q::IQ3XS => T::IQ3XXS,
            Q::IQ3XXS => T::IQ2S,
            _ => t,
        },
        R::FfnDown => match quant {
            Q::Q2K => T::Q3K,
            Q::Q2KS if i < n / 8 => T::Q4K,
            Q::IQ3XXS if !mix.imatrix && i < n / 8 => T::Q4K,
            Q::IQ3XXS if !mix.imatrix => T::Q3K,
            Q::Q3KM if i < n / 16 => T::Q5K,
            Q::Q3KM => T::Q4K,
            Q::IQ3M if i < n / 8 || (n_expert == 8 && more) => T::Q4K,
            Q::Q3KL => T::Q5K,
            Q::Q4KM if more => T::Q6K,
            Q::IQ4NL | Q::IQ4XS if i < n / 8 && !mix.imatrix => T::Q5K,
            Q::Q5KM if more => T::Q6K,
            Q::Q4KS if i < n / 8 => T::Q5K,
            Q::Q4_0 if mix.imatrix && i < n / 8 => T::Q4_1,
            Q::Q5_0 if mix.imatrix && i < n / 8 => T::Q5_1,
            _ => t,
        },
        R::AttnOutput if n_expert == 8 => match quant {
            Q::Q2K
            | Q::IQ3XS
            | Q::IQ3XXS
            | Q::Q3KS
            | Q::Q3KM
            | Q::IQ4NL
            | Q::Q4KS
            | Q::Q4KM
            | Q::IQ3S
            | Q::IQ3M
            | Q::IQ4XS => T::Q5K,
            _ => t,
        },
        R::AttnOutput => match quant {
            Q::Q2K => T::Q3K,
            Q::IQ3XXS => T::IQ3S,
            Q::Q3KM | Q::IQ3M => T::Q4K,
            Q::Q3KL => T::Q5K,
            _ => t,
        },
        R::FfnGate | R::FfnUp if quant == Q::IQ3XS && i >= n / 8 && i < 7 * n / 8 => T::IQ3XXS,
        _ => t,
    }
}

/// llama.cpp's `tensor_type_fallback`: a type whose block does not divide
/// `cols` gives way to one of 32-value blocks, F16 where even that does not
/// divide them (llama.cpp refuses the types it has no fallback for; synth's
/// shapes never need one).
fn fallback(t: DType, cols: usize) -> DType {
    use DType as T;
    if cols.is_multiple_of(t.block_elems()) {
        return t;
    }
    let to = match t {
        T::IQ2XXS | T::IQ2XS | T::IQ2S | T::IQ3XXS | T::IQ3S | T::IQ4XS => T::IQ4NL,
        T::Q2K | T::Q3K | T::TQ1_0 | T::TQ2_0 => T::Q4_0,
        T::Q4K => T::Q5_0,
        T::Q5K => T::Q5_1,
        T::Q6K => T::Q8_0,
        other => return other,
    };
    if cols.is_multiple_of(to.block_elems()) {
        to
    } else {
        T::F16
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

    /// The type of tensor `name` in `plan`.
    fn type_of(p: &[super::super::TensorPlan], name: &str) -> DType {
        p.iter().find(|x| x.name == name).unwrap().dtype
    }

    #[test]
    fn every_mix_is_listed_once_under_llama_cpp_names() {
        let names: std::collections::HashSet<&str> = Quant::ALL.iter().map(|q| q.name()).collect();
        assert_eq!(names.len(), Quant::ALL.len());
        for q in Quant::ALL {
            assert_eq!(Quant::from_name(&q.name().to_uppercase()).unwrap(), q);
            assert!(std::ptr::eq(
                q.mix(),
                MIXES.iter().find(|m| m.quant == q).unwrap()
            ));
        }
        assert_eq!(Quant::Q5KM.file_type(), 17);
        assert_eq!(Quant::IQ2M.file_type(), 29);
        assert_eq!(Quant::TQ2_0.file_type(), 37);
        assert_eq!(Quant::BF16.file_type(), 32);
        assert!(Quant::IQ2XXS.needs_imatrix() && !Quant::IQ3S.needs_imatrix());
    }

    #[test]
    fn k_and_legacy_mixes_follow_llama_cpp_on_llama_3_2_1b() {
        // 16 layers: use_more_bits picks 0, 1, 4, 7, 10, 13, 14, 15.
        let s = shape("llama3.2-1b").unwrap();
        let p = plan(s, Quant::Q5KM);
        let count = counter(&p);
        assert_eq!(count("attn_v.weight", DType::Q6K), 8);
        assert_eq!(count("ffn_down.weight", DType::Q6K), 8);
        assert_eq!(type_of(&p, "blk.4.ffn_down.weight"), DType::Q6K);
        assert_eq!(type_of(&p, "blk.5.ffn_down.weight"), DType::Q5K);
        assert_eq!(count("attn_q.weight", DType::Q5K), 16);
        assert_eq!(type_of(&p, "token_embd.weight"), DType::Q6K);
        for (q, t) in [
            (Quant::Q5KS, DType::Q5K),
            (Quant::Q6K, DType::Q6K),
            (Quant::Q5_0, DType::Q5_0),
            (Quant::Q5_1, DType::Q5_1),
            (Quant::Q3KS, DType::Q3K),
        ] {
            let p = plan(s, q);
            let count = counter(&p);
            for m in [
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_up",
                "ffn_down",
            ] {
                assert_eq!(count(&format!("{m}.weight"), t), 16, "{} {m}", q.name());
            }
            assert_eq!(type_of(&p, "token_embd.weight"), DType::Q6K, "{}", q.name());
        }
        let p = plan(s, Quant::Q4KS);
        let count = counter(&p);
        assert_eq!(count("attn_v.weight", DType::Q5K), 4);
        assert_eq!(count("ffn_down.weight", DType::Q5K), 2);
        let p = plan(s, Quant::Q3KL);
        let count = counter(&p);
        assert_eq!(count("attn_v.weight", DType::Q5K), 16);
        assert_eq!(count("ffn_down.weight", DType::Q5K), 16);
        assert_eq!(count("attn_output.weight", DType::Q5K), 16);
        let p = plan(s, Quant::Q2KS);
        let count = counter(&p);
        assert_eq!(count("attn_v.weight", DType::Q4K), 16);
        assert_eq!(count("ffn_down.weight", DType::Q4K), 2);
        assert_eq!(count("ffn_down.weight", DType::Q2K), 14);
        let p = plan(s, Quant::BF16);
        assert_eq!(type_of(&p, "blk.3.ffn_up.weight"), DType::BF16);
        assert_eq!(type_of(&p, "token_embd.weight"), DType::BF16);
        assert_eq!(type_of(&p, "blk.3.ffn_norm.weight"), DType::F32);
    }

    #[test]
    fn iq_and_ternary_mixes_follow_llama_cpp_on_llama_3_2_1b() {
        // GQA 4: the IQ2 / IQ3 mixes give every attn_v Q4_K.
        let s = shape("llama3.2-1b").unwrap();
        let check = |q: Quant, want: &[(&str, DType, usize)]| {
            let p = plan(s, q);
            let count = counter(&p);
            for &(suffix, t, n) in want {
                assert_eq!(count(suffix, t), n, "{} {suffix} {t}", q.name());
            }
        };
        use DType::*;
        check(
            Quant::IQ2XXS,
            &[
                ("token_embd.weight", Q5K, 1),
                ("attn_v.weight", Q4K, 16),
                ("ffn_down.weight", Q2K, 2),
                ("ffn_down.weight", IQ2XXS, 14),
                ("attn_output.weight", IQ2XXS, 16),
                ("ffn_gate.weight", IQ2XXS, 16),
            ],
        );
        check(
            Quant::IQ2XS,
            &[("attn_q.weight", IQ2XS, 16), ("ffn_down.weight", Q2K, 2)],
        );
        for (q, base) in [(Quant::IQ2S, IQ2XS), (Quant::IQ2M, IQ2S)] {
            check(
                q,
                &[
                    ("token_embd.weight", Q5K, 1),
                    ("attn_v.weight", Q4K, 16),
                    ("ffn_down.weight", IQ3S, 2),
                    ("ffn_down.weight", base, 14),
                    ("attn_output.weight", IQ3S, 16),
                    ("attn_q.weight", base, 16),
                ],
            );
        }
        check(
            Quant::IQ3XXS,
            &[
                ("token_embd.weight", Q5K, 1),
                ("attn_v.weight", Q4K, 16),
                ("attn_q.weight", IQ2S, 16),
                ("attn_k.weight", IQ2S, 16),
                ("attn_output.weight", IQ3S, 16),
                ("ffn_down.weight", IQ3XXS, 16),
                ("ffn_up.weight", IQ3XXS, 16),
            ],
        );
        check(
            Quant::IQ3XS,
            &[
                ("token_embd.weight", Q6K, 1),
                ("attn_v.weight", Q4K, 16),
                ("attn_k.weight", IQ3XXS, 16),
                ("ffn_up.weight", IQ3XXS, 12),
                ("ffn_gate.weight", IQ3S, 4),
                ("ffn_down.weight", IQ3S, 16),
            ],
        );
        check(
            Quant::IQ3S,
            &[("attn_v.weight", Q4K, 16), ("ffn_down.weight", IQ3S, 16)],
        );
        check(
            Quant::IQ3M,
            &[
                ("attn_v.weight", Q4K, 16),
                ("ffn_down.weight", Q4K, 2),
                ("attn_output.weight", Q4K, 16),
                ("attn_q.weight", IQ3S, 16),
            ],
        );
        check(
            Quant::IQ4NL,
            &[
                ("attn_v.weight", Q5K, 16),
                ("ffn_down.weight", Q5K, 2),
                ("ffn_down.weight", IQ4NL, 14),
                ("token_embd.weight", Q6K, 1),
            ],
        );
        for (q, t) in [(Quant::TQ1_0, TQ1_0), (Quant::TQ2_0, TQ2_0)] {
            check(
                q,
                &[
                    ("token_embd.weight", Q6K, 1),
                    ("attn_v.weight", t, 16),
                    ("ffn_down.weight", t, 16),
                ],
            );
        }
    }

    #[test]
    fn untied_embeddings_and_narrow_gqa_follow_llama_cpp() {
        // TinyLlama: untied output, GQA 8.
        let s = shape("tinyllama-1.1b").unwrap();
        let get = |q, n: &str| type_of(&plan(s, q), n);
        assert_eq!(get(Quant::TQ2_0, "token_embd.weight"), DType::Q4K);
        assert_eq!(get(Quant::TQ2_0, "output.weight"), DType::Q6K);
        assert_eq!(get(Quant::IQ2XXS, "token_embd.weight"), DType::Q2K);
        assert_eq!(get(Quant::IQ2XXS, "output.weight"), DType::Q5K);
        assert_eq!(get(Quant::IQ2M, "token_embd.weight"), DType::IQ3S);
        assert_eq!(get(Quant::IQ3XXS, "token_embd.weight"), DType::IQ3S);
        assert_eq!(get(Quant::Q5KM, "token_embd.weight"), DType::Q5K);
        // SmolLM2: GQA 3, 576-wide rows (not whole 256-value blocks).
        let s = shape("smollm2-135m").unwrap();
        let get = |q, n: &str| type_of(&plan(s, q), n);
        assert_eq!(get(Quant::IQ2XXS, "blk.5.attn_v.weight"), DType::Q4_0);
        assert_eq!(get(Quant::IQ2XXS, "blk.5.attn_q.weight"), DType::IQ4NL);
        assert_eq!(get(Quant::IQ2XXS, "blk.2.ffn_down.weight"), DType::Q2K);
        assert_eq!(get(Quant::IQ2XXS, "blk.3.ffn_down.weight"), DType::IQ2XXS);
        assert_eq!(get(Quant::IQ2XXS, "token_embd.weight"), DType::Q8_0);
        assert_eq!(get(Quant::IQ2S, "blk.5.attn_v.weight"), DType::IQ4NL);
        assert_eq!(get(Quant::IQ3XXS, "blk.5.attn_v.weight"), DType::IQ4NL);
        assert_eq!(get(Quant::TQ1_0, "blk.5.attn_q.weight"), DType::Q4_0);
        assert_eq!(get(Quant::IQ4NL, "blk.5.attn_v.weight"), DType::IQ4NL);
        assert_eq!(get(Quant::Q5KS, "blk.5.attn_v.weight"), DType::Q5_1);
    }

    #[test]
    fn eight_experts_get_mixtrals_rules() {
        let s = shape("mixtral-8x7b").unwrap();
        let get = |q, n: &str| type_of(&plan(s, q), n);
        assert_eq!(get(Quant::Q4KM, "blk.3.attn_v.weight"), DType::Q8_0);
        assert_eq!(get(Quant::Q4KM, "blk.3.attn_k.weight"), DType::Q8_0);
        assert_eq!(get(Quant::Q4KM, "blk.3.attn_output.weight"), DType::Q5K);
        assert_eq!(get(Quant::Q4KM, "blk.0.ffn_down_exps.weight"), DType::Q6K);
        assert_eq!(get(Quant::Q4KM, "blk.5.ffn_down_exps.weight"), DType::Q4K);
        assert_eq!(get(Quant::IQ2XXS, "blk.3.attn_k.weight"), DType::Q4K);
        assert_eq!(get(Quant::IQ2XXS, "blk.3.attn_output.weight"), DType::Q5K);
        assert_eq!(get(Quant::IQ3M, "blk.6.ffn_down_exps.weight"), DType::Q4K);
        assert_eq!(get(Quant::Q6K, "blk.3.attn_output.weight"), DType::Q6K);
    }

    #[test]
    fn mxfp4_is_pure_and_mxfp4_moe_keeps_dense_matrices_in_q8_0() {
        let s = shape("tiny").unwrap();
        let p = plan(s, Quant::Mxfp4);
        assert!(p.iter().all(|t| t.dtype
            == if t.role == Role::Norm {
                DType::F32
            } else {
                DType::MXFP4
            }));
        let p = plan(s, Quant::Mxfp4Moe);
        assert!(p.iter().all(|t| t.dtype
            == if t.role == Role::Norm {
                DType::F32
            } else {
                DType::Q8_0
            }));
        let p = plan(shape("tiny-qwen3moe").unwrap(), Quant::Mxfp4Moe);
        assert_eq!(type_of(&p, "blk.1.ffn_up_exps.weight"), DType::MXFP4);
        assert_eq!(type_of(&p, "blk.1.attn_q.weight"), DType::Q8_0);
        assert_eq!(type_of(&p, "output.weight"), DType::Q8_0);
    }
}
