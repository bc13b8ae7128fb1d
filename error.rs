//! One error type for the crate. Every variant renders as one sentence that
//! names what failed (file, tensor, op, shape) so the CLI can print it as is.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid GGUF file: {msg}")]
    Gguf { path: PathBuf, msg: String },
    #[error("{path} is not a valid safetensors model: {msg}")]
    Safetensors { path: PathBuf, msg: String },
    #[error("bad model configuration: {0}")]
    Config(String),
    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("shape error: {0}")]
    Shape(String),
    #[error("op {op}: {msg}")]
    Op { op: &'static str, msg: String },
    #[error("Vulkan: {0}")]
    Vulkan(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    pub fn op(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Op {
            op,
            msg: msg.into(),
        }
    }
}
