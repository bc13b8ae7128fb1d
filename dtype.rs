//! Weight element types. Their facts (ggml id and name, block layout, codec,
//! GPU layout) live in one table, [`crate::quants::FORMATS`]; the methods
//! here read it.

use crate::error::{Error, Result};
pub use crate::quants::QK_K;
use crate::quants::{Format, COUNT, FORMATS};

/// A weight (or activation) element type. Quantized types store `block_elems()`
/// values in `block_bytes()` bytes; f32/f16/bf16 are "blocks" of one element.
/// Variants are in [`FORMATS`] order.
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
    Q2K,
    Q3K,
    IQ4NL,
    IQ4XS,
    TQ1_0,
    TQ2_0,
    MXFP4,
    IQ2XXS,
    IQ2XS,
    IQ2S,
    IQ3XXS,
    IQ3S,
}

impl DType {
    /// Every type, in table order.
    pub const ALL: [DType; COUNT] = {
        let mut all = [DType::F32; COUNT];
        let mut i = 0;
        while i < COUNT {
            all[i] = FORMATS[i].dtype;
            // The table's row i must describe variant i (`format` indexes it).
            assert!(all[i] as usize == i, "FORMATS is not in DType order");
            i += 1;
        }
        all
    };

    /// This type's row of the format table.
    pub fn format(self) -> &'static Format {
        &FORMATS[self as usize]
    }

    /// The ggml type id used in GGUF tensor infos.
    pub fn ggml_type_id(self) -> u32 {
        self.format().ggml_id
    }

    /// Inverse of [`DType::ggml_type_id`]; `None` for types vkllm does not support.
    pub fn from_ggml_type_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_type_id() == id)
    }

    /// Lower-case ggml name (`q4_k`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        self.format().name
    }

    pub fn from_name(name: &str) -> Option<DType> {
        let lower = name.to_ascii_lowercase();
        DType::ALL.into_iter().find(|t| t.name() == lower)
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        self.format().block_elems
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.format().block_bytes
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
