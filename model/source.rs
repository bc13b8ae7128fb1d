//! Where weights come from. Every loader presents tensors under llama.cpp's
//! GGUF names (`blk.0.attn_q.weight`, ...) as `[rows, cols]` matrices in their
//! storage dtype, so one weight builder serves GGUF files and HF checkpoints.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::gguf::GgufFile;
use std::borrow::Cow;

/// One tensor as a row-major `[rows, cols]` matrix (vectors have one row).
pub struct RawTensor<'a> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: Cow<'a, [u8]>,
}

impl RawTensor<'_> {
    /// The tensor as f32 values (norm weights and biases are kept in f32).
    pub fn to_f32(&self, name: &str) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.rows * self.cols];
        let row_bytes = self.dtype.row_bytes(self.cols)?;
        for (r, dst) in out.chunks_mut(self.cols.max(1)).enumerate() {
            let src = self
                .data
                .get(r * row_bytes..(r + 1) * row_bytes)
                .ok_or_else(|| Error::Tensor {
                    name: name.to_string(),
                    msg: "data shorter than its shape".into(),
                })?;
            crate::quants::dequantize_row(self.dtype, src, dst)?;
        }
        Ok(out)
    }
}

/// A set of named tensors (a GGUF file or a safetensors checkpoint).
pub trait TensorSource {
    /// The tensor called `name` (GGUF naming), or `None` when absent.
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>>;
    /// Every tensor name, for "unused tensor" and listing purposes.
    fn names(&self) -> Vec<String>;
    /// File or directory the tensors come from, for messages.
    fn origin(&self) -> String;
}

impl TensorSource for GgufFile {
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>> {
        let Some(t) = GgufFile::tensor(self, name) else {
            return Ok(None);
        };
        Ok(Some(RawTensor {
            dtype: t.dtype,
            rows: t.rows(),
            cols: t.cols(),
            data: Cow::Borrowed(self.tensor_data(t)),
        }))
    }
    fn names(&self) -> Vec<String> {
        self.tensors().iter().map(|t| t.name.clone()).collect()
    }
    fn origin(&self) -> String {
        self.path().display().to_string()
    }
}
