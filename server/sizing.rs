//! How many sequences `vkllm serve` runs at once when `--parallel` is not
//! given: [`DEFAULT_PARALLEL`], fewer where that many full contexts of KV
//! cache would not fit beside the weights.

use crate::backend::ComputeBackend;
use crate::dtype::DType;
use crate::model::config::ModelConfig;
use crate::model::LoadOptions;
use std::path::Path;

/// Sequences a server runs at once by default: enough for a few clients
/// to share the model, few enough that each still decodes fast.
pub const DEFAULT_PARALLEL: usize = 4;

/// The most sequences, up to [`DEFAULT_PARALLEL`], whose full contexts of
/// KV cache fit each backend (its `check_fits`) with the weights, both
/// shared evenly over the backends. The weights are estimated by the size
/// of the model's files; at least 1 (the load then says what does not fit).
pub fn default_parallel(
    bes: &[Box<dyn ComputeBackend>],
    cfg: &ModelConfig,
    path: &Path,
    load: &LoadOptions,
) -> usize {
    let Some(per_sequence) = kv_bytes_per_sequence(bes, cfg, load) else {
        return DEFAULT_PARALLEL;
    };
    let weights = file_bytes(path);
    let share = bes.len().max(1) as u64;
    let fits = |n: usize| {
        let total = per_sequence
            .saturating_mul(n as u64)
            .saturating_add(weights);
        let what = format!("the weights and {n} full contexts of KV cache");
        bes.iter()
            .all(|be| be.check_fits(&what, total / share).is_ok())
    };
    (1..=DEFAULT_PARALLEL).rev().find(|&n| fits(n)).unwrap_or(1)
}

/// Bytes of one full context's K and V in every layer, as `Model::new`
/// sizes them: the context (`--ctx`, else the model's, at most 8192)
/// rounded up to whole 64-position pages, in the cache's element type.
fn kv_bytes_per_sequence(
    bes: &[Box<dyn ComputeBackend>],
    cfg: &ModelConfig,
    load: &LoadOptions,
) -> Option<u64> {
    let context = load.context.unwrap_or(cfg.n_ctx.min(8192)).max(1);
    let positions = context.div_ceil(64) * 64;
    let dtype = load.kv_cache.unwrap_or_else(|| {
        let first = bes.first().map_or(DType::F32, |b| b.default_kv_dtype());
        if bes.iter().all(|b| b.default_kv_dtype() == first) {
            first
        } else {
            DType::F32
        }
    });
    let row = dtype.row_bytes(cfg.kv_dim()).ok()?;
    (positions as u64)
        .checked_mul(row as u64)?
        .checked_mul(2 * cfg.n_layer as u64)
}

/// Bytes of a GGUF file, or of a Hugging Face directory's safetensors.
fn file_bytes(path: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    if !path.is_dir() {
        return size(path);
    }
    std::fs::read_dir(path).map_or(0, |dir| {
        dir.flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .map(|p| size(&p))
            .sum()
    })
}
