//! Peak resident memory while a GGUF loads onto Vulkan: the file is
//! memory-mapped and its tensors reach the device through one staging
//! buffer of at most 64 MiB, so the host never holds a whole copy. On a GPU
//! the peak stays within 1.1x the file, plus the KV cache and the staging
//! buffer; on a CPU device (lavapipe) device memory is host memory, so what
//! the device holds is allowed on top.
//!
//! Alone in its own test binary: `VmHWM` is this process's peak.
//! `VKLLM_RSS_MODEL=path.gguf` measures another model (default SmolLM2).

mod common;

use common::process::process;
use vkllm::model::LoadOptions;
use vkllm::vk::STAGING_CAP;

const MIB: f64 = (1 << 20) as f64;

#[test]
fn loading_onto_vulkan_peaks_within_the_file_size_plus_kv_cache() {
    let Some(be) = common::vulkan_backend() else {
        return;
    };
    let on_cpu = be.device_info().kind == "CPU";
    let device = be.device_info().name.clone();
    let path = std::env::var_os("VKLLM_RSS_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(common::smollm2);
    let file = std::fs::metadata(&path).unwrap().len() as f64;
    let opts = LoadOptions {
        context: Some(4096),
        ..LoadOptions::default()
    };
    let before = process();
    let mut m = common::load_model(Box::new(be), &path, &opts);
    let after = process();
    let c = m.config();
    let kv = (2 * c.n_layer * m.capacity() * c.kv_dim() * m.kv_dtype().block_bytes()) as f64;
    let device_bytes = m.backend().device_memory().unwrap().reserved_bytes as f64;
    // The load's peak above where this process stood before it.
    let peak = after.hwm_kb.saturating_sub(before.rss_kb) as f64 * 1024.0;
    let mut limit = 1.1 * file + kv + STAGING_CAP as f64;
    if on_cpu {
        limit += device_bytes;
    }
    eprintln!(
        "{} on {device}: file {:.1} MiB, KV cache {:.1} MiB, device memory {:.1} MiB; \
         peak RSS rose {:.1} MiB ({:.2}x the file), limit {:.1} MiB",
        path.display(),
        file / MIB,
        kv / MIB,
        device_bytes / MIB,
        peak / MIB,
        peak / file,
        limit / MIB
    );
    assert!(peak <= limit, "peak RSS rose {:.1} MiB", peak / MIB);
}
