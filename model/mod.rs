//! Model files, tokenizers, chat templates, sampling and the transformer runner.

pub mod config;
pub mod convert;
pub mod generate;
pub mod hf;
pub mod runner;
pub mod source;
pub mod weights;

pub use config::{Arch, ModelConfig};
pub use runner::{LoadOptions, Model, Output, Want};
