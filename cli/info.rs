//! `vkllm info`: what this machine offers and, given a model, what it holds.

use super::SplitArgs;
use clap::Args;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use vkllm::model::source::{ModelSource, TensorSource};
use vkllm::model::{LoadOptions, ModelConfig};
use vkllm::open::{BackendChoice, CpuOptions};
use vkllm::{DType, Result};

#[derive(Args)]
pub struct InfoArgs {
    /// GGUF file or Hugging Face model directory to describe
    #[arg(short = 'm', long, value_name = "PATH")]
    model: Option<PathBuf>,
    /// With --model: load it split over --devices and show each device's
    /// layers and memory
    #[command(flatten)]
    split: SplitArgs,
}

impl InfoArgs {
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if !self.split.devices.is_empty() && self.model.is_none() {
            return Err("--devices needs --model: it shows how the model splits".into());
        }
        self.split.check()
    }
}

pub fn run(a: InfoArgs) -> Result<()> {
    let mut out = String::new();
    devices(&mut out);
    if let Some(path) = &a.model {
        let path = super::model_path(&super::ModelArg {
            model: Some(path.clone()),
        })?;
        model(&mut out, &path)?;
        if !a.split.devices.is_empty() {
            split(&mut out, &path, &a.split)?;
        }
    }
    super::print_flush(&out)
}

/// The model loaded over `--devices`: each device's layers and memory.
fn split(out: &mut String, path: &Path, s: &SplitArgs) -> Result<()> {
    let (bes, _) =
        vkllm::open::open_backends(&BackendChoice::Auto, &s.devices, CpuOptions::default())?;
    let opts = LoadOptions {
        shares: s.shares().map(<[f64]>::to_vec),
        ..LoadOptions::default()
    };
    let model = vkllm::open::load(bes, path, &opts, &mut |_, _| {})?.model;
    let _ = writeln!(
        out,
        "  split over {} devices (context {}):",
        s.devices.len(),
        model.capacity()
    );
    out.push_str(&super::describe_stages(&model));
    Ok(())
}

fn devices(out: &mut String) {
    out.push_str("Vulkan devices:\n");
    match vkllm::vk::list_devices() {
        Ok(list) if list.is_empty() => {
            out.push_str("  none: the Vulkan loader reports no devices\n")
        }
        Ok(list) => {
            let forced = vkllm::vk::Options::from_env().map(|o| o.kernels);
            for d in &list {
                let kernels = match &forced {
                    Ok(k) => d.kernels_line(k),
                    Err(e) => format!("kernels: {e}"),
                };
                let _ = writeln!(out, "  {d}\n      {kernels}");
                if !d.caps.coopmat_shapes.is_empty() {
                    let shapes: Vec<String> = d
                        .caps
                        .coopmat_shapes
                        .iter()
                        .map(|s| s.to_string())
                        .collect();
                    let _ = writeln!(
                        out,
                        "      cooperative matrix shapes: {}",
                        shapes.join(", ")
                    );
                }
            }
        }
        Err(e) => {
            let _ = writeln!(out, "  none: {e}");
        }
    }
    let _ = writeln!(out, "CPU: {}", vkllm::cpu::features());
}

/// Bytes as a short human figure.
fn size(bytes: usize) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if bytes as f64 >= 1024.0 * MIB {
        format!("{:.2} GiB", bytes as f64 / (1024.0 * MIB))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

fn model(out: &mut String, path: &Path) -> Result<()> {
    // dtype -> (tensor count, bytes)
    let mut types: BTreeMap<&'static str, (usize, usize)> = BTreeMap::new();
    let mut add = |dtype: DType, bytes: usize| {
        let e = types.entry(dtype.name()).or_default();
        e.0 += 1;
        e.1 += bytes;
    };
    let src = ModelSource::open(path)?;
    match &src {
        ModelSource::Hf(hf) => {
            for name in hf.names() {
                if let Some(t) = hf.tensor(&name)? {
                    add(t.dtype, t.data.len());
                }
            }
        }
        ModelSource::Gguf(g) => {
            for t in g.tensors() {
                add(t.dtype, t.size);
            }
        }
    }
    let cfg = src.config()?;
    let _ = writeln!(out, "Model: {}", path.display());
    config(out, &cfg);
    out.push_str("  tensors:\n");
    let mut total = 0;
    for (name, (count, bytes)) in &types {
        let _ = writeln!(
            out,
            "    {name:<6} {count:>5} tensors  {:>10}",
            size(*bytes)
        );
        total += bytes;
    }
    let _ = writeln!(out, "  total: {} ({total} bytes)", size(total));
    Ok(())
}

fn config(out: &mut String, c: &ModelConfig) {
    let _ = writeln!(out, "  arch: {}", c.arch.gguf_name());
    let _ = writeln!(
        out,
        "  layers: {}, hidden: {}, ffn: {}, heads: {} (kv {}), head dim: {}",
        c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_head_kv, c.head_dim
    );
    if let Some(e) = c.moe {
        let _ = writeln!(
            out,
            "  experts: {}, {} per token, ffn {} each{}",
            e.experts,
            e.used,
            e.n_ff,
            if e.renorm {
                ""
            } else {
                ", weights not renormalised"
            }
        );
    }
    let _ = writeln!(out, "  context: {}, vocab: {}", c.n_ctx, c.vocab);
}
