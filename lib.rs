//! vkllm: LLM inference with a Vulkan-native compute backend.
//!
//! - [`backend::ComputeBackend`]: the device seam; [`cpu::CpuBackend`] and
//!   [`vk::VulkanBackend`] implement it.
//! - [`model`]: GGUF / safetensors loading, tokenizers, chat templates,
//!   sampling and the transformer runner.
//! - [`reference`]: plain scalar versions of every op, the yardstick for tests.

pub mod backend;
pub mod bench;
pub mod capi;
pub mod cpu;
pub mod dtype;
pub mod error;
pub mod model;
pub mod open;
pub mod profile;
pub mod quants;
pub mod random;
pub mod reference;
pub mod selftest;
#[cfg(feature = "server")]
pub mod server;
mod settings;
pub mod vk;

pub use backend::{ComputeBackend, Weight};
pub use dtype::DType;
pub use error::{Error, ErrorKind, Result};
