//! GGUF reader and writer: the real SmolLM2 file, writer round trips, and a
//! corpus of corrupt files that must each fail with a clear error.

use std::path::{Path, PathBuf};

use vkllm::model::gguf::GgufFile;
use vkllm::DType;

/// The default model. `tests/common` needs the CPU backend to compile, which
/// this branch does not have yet, so the path is resolved here.
fn smollm2() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !path.exists() {
        let status = std::process::Command::new("bash")
            .arg(root.join("scripts/fetch-model.sh"))
            .status()
            .expect("run scripts/fetch-model.sh");
        assert!(status.success(), "scripts/fetch-model.sh failed");
    }
    path
}

#[test]
fn reads_smollm2() {
    let f = GgufFile::open(&smollm2()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_u64("llama.block_count").unwrap(), Some(30));
    assert_eq!(f.get_u64("llama.embedding_length").unwrap(), Some(576));
    assert_eq!(f.get_u64("llama.attention.head_count_kv").unwrap(), Some(3));
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), Some(100000.0));
    assert_eq!(
        f.get_bool("tokenizer.ggml.add_bos_token").unwrap(),
        Some(false)
    );
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
    assert_eq!(f.get_u64("no.such.key").unwrap(), None);
    assert_eq!(f.metadata().len(), 33);
    assert_eq!(f.metadata()[0].0, "general.architecture");

    let tokens = f.get_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[0].as_str(), Some("<|endoftext|>"));
    let merges = f.get_array("tokenizer.ggml.merges").unwrap().unwrap();
    assert_eq!(merges.len(), 48900);
    assert_eq!(merges[0].as_str(), Some("Ġ t"));

    let ts = f.tensors();
    assert_eq!(ts.len(), 272);
    let count = |d: DType| ts.iter().filter(|t| t.dtype == d).count();
    assert_eq!(
        (count(DType::F32), count(DType::Q4_1), count(DType::Q8_0)),
        (61, 210, 1)
    );

    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dtype, DType::Q8_0);
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(
        (embd.cols(), embd.rows(), embd.n_elements()),
        (576, 49152, 576 * 49152)
    );
    assert_eq!(embd.offset, f.data_offset());
    assert_eq!(f.tensor_data(embd).len(), 576 / 32 * 34 * 49152);

    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.dtype, q.dims.as_slice()),
        (DType::Q4_1, &[576u64, 576][..])
    );
    assert_eq!(q.size, 576 / 32 * 20 * 576);
    let norm = f.tensor("blk.29.ffn_norm.weight").unwrap();
    assert_eq!((norm.dtype, norm.rows(), norm.cols()), (DType::F32, 1, 576));
    let w: Vec<f32> = f
        .tensor_data(norm)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert!(w.iter().all(|x| x.is_finite()) && w.iter().any(|&x| x != 0.0));

    let end = ts.iter().map(|t| t.offset + t.size as u64).max().unwrap();
    assert_eq!(end, std::fs::metadata(smollm2()).unwrap().len());
}

#[test]
fn wrong_metadata_type_names_key_file_and_type() {
    let f = GgufFile::open(&smollm2()).unwrap();
    let e = f.get_u64("general.architecture").unwrap_err().to_string();
    assert!(
        e.contains("general.architecture") && e.contains("string"),
        "{e}"
    );
    assert!(e.contains("SmolLM2-135M-Instruct.Q4_1.gguf"), "{e}");
    let e = f.get_str("llama.block_count").unwrap_err().to_string();
    assert!(e.contains("llama.block_count") && e.contains("u32"), "{e}");
    assert!(f.get_bool("tokenizer.ggml.tokens").is_err());
    assert!(f.get_array("llama.rope.freq_base").is_err());
    assert!(f.get_f32("tokenizer.ggml.model").is_err());
}

#[test]
fn missing_path_and_directory_are_io_errors() {
    let e = GgufFile::open(Path::new("/nonexistent/model.gguf")).unwrap_err();
    assert!(matches!(e, vkllm::Error::Io { .. }), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let e = GgufFile::open(dir.path()).unwrap_err();
    assert!(matches!(e, vkllm::Error::Io { .. }), "{e}");
}
