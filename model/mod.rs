//! Model files, tokenizers, chat templates, sampling and the transformer runner.

pub mod gguf;
pub mod gguf_write;
