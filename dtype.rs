//! Weight element types and their GGUF block layouts.
//!
//! Block sizes and byte sizes follow ggml exactly so GGUF tensor data can be
//! used as-is by every backend.

use crate::error::{Error, Result};

/// A weight (or activation) element type. Quantized types store `block_elems()`
/// values in `block_bytes()` bytes; f32/f16/bf16 are "blocks" of one element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
}

/// Elements in one k-quant super-block.
pub const QK_K: usize = 256;

impl DType {
    pub const ALL: [DType; 11] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];

    /// The ggml type id used in GGUF tensor infos.
    pub fn ggml_type_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q4K => 12,
            DType::Q5K => 13,
            DType::Q6K => 14,
            DType::BF16 => 30,
        }
    }

    /// Inverse of [`DType::ggml_type_id`]; `None` for types vkllm does not support.
    pub fn from_ggml_type_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_type_id() == id)
    }

    /// Lower-case ggml name (`q4_k`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        let lower = name.to_ascii_lowercase();
        DType::ALL.into_iter().find(|t| t.name() == lower)
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => 32,
            DType::Q4K | DType::Q5K | DType::Q6K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes needed for a row of `n` elements; an error when `n` is not a
    /// whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        let be = self.block_elems();
        if !n.is_multiple_of(be) {
            return Err(Error::Shape(format!(
                "a {} row needs a multiple of {be} elements, got {n}",
                self.name()
            )));
        }
        (n / be)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| Error::Shape(format!("{n} {} elements overflow usize", self.name())))
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
