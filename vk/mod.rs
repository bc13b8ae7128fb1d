//! Vulkan backend (placeholder until the Vulkan issue lands).

use crate::backend::ComputeBackend;
use crate::error::{Error, Result};

/// How to open the Vulkan backend.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `VKLLM_DEVICE`: device index or name substring.
    pub device: Option<String>,
    /// `VKLLM_VALIDATE=1`: Khronos validation layer + debug messenger.
    pub validate: bool,
}

impl Options {
    pub fn from_env() -> Self {
        Options {
            device: std::env::var("VKLLM_DEVICE").ok().filter(|s| !s.is_empty()),
            validate: std::env::var("VKLLM_VALIDATE").as_deref() == Ok("1"),
        }
    }
}

/// Open the Vulkan backend as a trait object.
pub fn open(_opts: &Options) -> Result<Box<dyn ComputeBackend>> {
    Err(Error::Vulkan("the Vulkan backend is not built yet".into()))
}
