//! One way in: a backend opened by kind, and a model file or directory
//! opened once for its config, tokenizer and tensors. The CLI, the server,
//! the C API, examples, benches and tests all start here.

use crate::backend::ComputeBackend;
use crate::cpu::{ActivationPrecision, CpuBackend, CpuKernelOptions};
use crate::error::{Error, Result};
use crate::model::source::ModelSource;
use crate::model::tokenizer::Tokenizer;
use crate::model::{LoadOptions, Model};
use std::path::Path;
use std::str::FromStr;

/// Which backend to open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// Vulkan on a discrete or integrated GPU (or the device `VKLLM_DEVICE`
    /// names), the CPU otherwise.
    #[default]
    Auto,
    Cpu,
    /// Vulkan on its preferred device, lavapipe included.
    Vulkan,
    /// Vulkan on the device with this index or name substring (`vulkan:0`).
    Device(String),
}

impl FromStr for BackendChoice {
    type Err = Error;
    /// `auto`, `cpu`, `vulkan`, or `vulkan:DEVICE` (an index or a name
    /// substring; the prefix keeps a typo from being taken for a device).
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if let Some(device) = s.strip_prefix("vulkan:").filter(|d| !d.is_empty()) {
            return Ok(BackendChoice::Device(device.to_string()));
        }
        Ok(match s {
            "auto" => BackendChoice::Auto,
            "cpu" => BackendChoice::Cpu,
            "vulkan" => BackendChoice::Vulkan,
            _ => {
                return Err(Error::Invalid(format!(
                    "unknown backend '{s}': expected auto, cpu, vulkan or vulkan:DEVICE (an index or a name)"
                )))
            }
        })
    }
}

/// CPU backend settings (ignored when Vulkan is opened).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuOptions {
    /// `None`: every core.
    pub threads: Option<usize>,
    pub activations: ActivationPrecision,
}

/// Opens the backend `choice` names, with the `VKLLM_*` settings of the
/// environment. The text says what was opened and, for `auto`, why:
/// `vulkan (NVIDIA H200)`, `cpu (no Vulkan device)`.
pub fn open_backend(
    choice: &BackendChoice,
    cpu: CpuOptions,
) -> Result<(Box<dyn ComputeBackend>, String)> {
    let open_cpu = || -> Result<Box<dyn ComputeBackend>> {
        let be = CpuBackend::with_options(cpu.threads, CpuKernelOptions::from_env()?)?;
        Ok(Box::new(be.with_activations(cpu.activations)))
    };
    // Vulkan's settings are read only where Vulkan is opened, so `cpu`
    // ignores a bad one.
    let vk_options = crate::vk::Options::from_env;
    let open_vulkan = |opts: crate::vk::Options| -> Result<(Box<dyn ComputeBackend>, String)> {
        let be = crate::vk::open(&opts)?;
        let name = be.name();
        Ok((be, name))
    };
    match choice {
        BackendChoice::Cpu => {
            let be = open_cpu()?;
            let name = be.name();
            Ok((be, name))
        }
        BackendChoice::Vulkan => open_vulkan(vk_options()?),
        BackendChoice::Device(d) => open_vulkan(crate::vk::Options {
            device: Some(d.clone()),
            ..vk_options()?
        }),
        BackendChoice::Auto => {
            let opts = vk_options()?;
            match crate::vk::auto_device(&opts) {
                Ok(name) => Ok((crate::vk::open(&opts)?, format!("vulkan ({name})"))),
                Err(why) => Ok((open_cpu()?, format!("cpu ({why})"))),
            }
        }
    }
}

/// Opens every device of `devices` (each as [`open_backend`] opens it) for
/// a model split by layer, or `choice` alone when `devices` is empty; the
/// text names what was opened, ` + ` between devices.
pub fn open_backends(
    choice: &BackendChoice,
    devices: &[BackendChoice],
    cpu: CpuOptions,
) -> Result<(Vec<Box<dyn ComputeBackend>>, String)> {
    if devices.is_empty() {
        let (be, name) = open_backend(choice, cpu)?;
        return Ok((vec![be], name));
    }
    let mut bes = Vec::with_capacity(devices.len());
    let mut names = Vec::with_capacity(devices.len());
    for d in devices {
        let (be, name) = open_backend(d, cpu)?;
        bes.push(be);
        names.push(name);
    }
    Ok((bes, names.join(" + ")))
}

/// A model loaded from one opening of its file or directory, and its
/// tokenizer or why it has none (the tiny test models carry none: they are
/// driven by token ids).
pub struct Loaded {
    pub model: Model,
    pub tokenizer: Result<Tokenizer>,
}

/// Loads `path` (a GGUF file or a Hugging Face directory) onto `bes`, split
/// by layer when several (`opts.shares`). `progress(done, total)` is called
/// as the weights go up: embeddings 1, layer `i` `i + 2`, the head `total`.
pub fn load(
    bes: Vec<Box<dyn ComputeBackend>>,
    path: &Path,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Loaded> {
    let src = ModelSource::open(path)?;
    let tokenizer = src.tokenizer();
    let model = load_source(bes, &src, opts, progress)?;
    Ok(Loaded { model, tokenizer })
}

/// [`load`] from a source already opened: the CLI reads the tokenizer
/// first, so a bad prompt fails before any device is opened.
pub fn load_source(
    bes: Vec<Box<dyn ComputeBackend>>,
    src: &ModelSource,
    opts: &LoadOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Model> {
    Model::new(bes, src.config()?, src.tensors(), opts, progress)
}
