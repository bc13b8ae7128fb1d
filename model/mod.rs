//! Model files, tokenizers, chat templates, sampling and the transformer runner.

pub mod chat;
pub mod gguf;
pub mod gguf_write;
pub mod sampling;
pub mod tokenizer;
