//! Model files, tokenizers, chat templates, sampling and the transformer runner.

mod batch;
pub(crate) mod byte_vocab;
pub mod chat;
pub mod config;
pub mod convert;
pub mod engine;
pub mod generate;
pub mod gguf;
pub mod gguf_write;
pub mod grammar;
pub mod hf;
pub mod kv_pages;
pub mod layer_split;
pub mod logprobs;
pub mod runner;
pub mod sampling;
pub mod session;
pub mod source;
mod stage;
pub mod stop;
pub mod tokenizer;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use kv_pages::SeqId;
pub use runner::{LoadOptions, Model, Output, Want};
