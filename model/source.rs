//! Where weights come from. Every loader presents tensors under llama.cpp's
//! GGUF names (`blk.0.attn_q.weight`, ...) as `[rows, cols]` matrices in their
//! storage dtype, so one weight builder serves GGUF files and HF checkpoints.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::gguf::GgufFile;
use crate::model::hf::HfCheckpoint;
use crate::model::tokenizer::Tokenizer;
use std::borrow::Cow;
use std::path::Path;

/// A model file or directory opened once: its config, tokenizer and tensors
/// all come from this one parse. The only place that decides "GGUF file or
/// Hugging Face directory?".
pub enum ModelSource {
    Gguf(GgufFile),
    Hf(HfCheckpoint),
}

impl ModelSource {
    pub fn open(path: &Path) -> Result<ModelSource> {
        Ok(if path.is_dir() {
            ModelSource::Hf(HfCheckpoint::open(path)?)
        } else {
            ModelSource::Gguf(GgufFile::open(path)?)
        })
    }

    pub fn config(&self) -> Result<ModelConfig> {
        match self {
            ModelSource::Gguf(g) => ModelConfig::from_gguf(g, None),
            ModelSource::Hf(h) => Ok(h.config.clone()),
        }
    }

    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            ModelSource::Gguf(g) => Tokenizer::from_gguf(g),
            ModelSource::Hf(h) => Tokenizer::from_hf_dir(h.dir()),
        }
    }

    pub fn tensors(&self) -> &dyn TensorSource {
        match self {
            ModelSource::Gguf(g) => g,
            ModelSource::Hf(h) => h,
        }
    }
}

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
