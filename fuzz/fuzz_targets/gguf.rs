//! The GGUF reader and what is read from a GGUF file before tensors reach
//! a device: the model configuration, each tensor's bytes and their
//! conversion to f32. (The tokenizer, much slower to build, is gguf_vocab's.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use vkllm::model::gguf::GgufFile;
use vkllm::model::source::TensorSource;
use vkllm::model::ModelConfig;

/// Larger tensors are only sliced, not converted, to keep runs fast.
const MAX_CONVERTED: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = GgufFile::from_bytes(data.to_vec(), "fuzz.gguf") else {
        return;
    };
    let _ = ModelConfig::from_gguf(&g, None);
    for name in TensorSource::names(&g) {
        if let Ok(Some(t)) = TensorSource::tensor(&g, &name) {
            if t.rows.saturating_mul(t.cols) <= MAX_CONVERTED {
                let _ = t.to_f32(&name);
            }
        }
    }
});
