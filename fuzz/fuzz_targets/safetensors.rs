//! A Hugging Face checkpoint from a `config.json` text and one safetensors
//! image: the config, the header, and every tensor it maps read back.
#![no_main]

mod split;

use libfuzzer_sys::fuzz_target;
use vkllm::model::hf::HfCheckpoint;
use vkllm::model::source::TensorSource;

/// Larger tensors are only sliced, not converted, to keep runs fast.
const MAX_CONVERTED: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let Some((config, weights)) = split::split(data) else {
        return;
    };
    let Ok(ckpt) = HfCheckpoint::from_bytes(&config, vec![weights.to_vec()], "fuzz") else {
        return;
    };
    for name in ckpt.names() {
        if let Ok(Some(t)) = ckpt.tensor(&name) {
            if t.rows.saturating_mul(t.cols) <= MAX_CONVERTED {
                let _ = t.to_f32(&name);
            }
        }
    }
});
