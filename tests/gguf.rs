//! GGUF reader and writer: the real SmolLM2 file, writer round trips, and a
//! corpus of corrupt files that must each fail with a clear error.

mod common;

use common::smollm2;
use std::path::Path;

use vkllm::model::gguf::{GgufFile, GgufValue};
use vkllm::model::gguf_write::GgufWriter;
use vkllm::DType;

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

/// Every metadata value type, including empty and nested arrays.
fn all_values() -> Vec<(String, GgufValue)> {
    use GgufValue::*;
    let v = vec![
        ("general.architecture", String("llama".into())),
        ("t.u8", U8(200)),
        ("t.i8", I8(-5)),
        ("t.u16", U16(60000)),
        ("t.i16", I16(-30000)),
        ("t.u32", U32(4_000_000_000)),
        ("t.i32", I32(-2_000_000_000)),
        ("t.u64", U64(u64::MAX)),
        ("t.i64", I64(i64::MIN)),
        ("t.f32", F32(1.5)),
        ("t.f64", F64(-2.25e300)),
        ("t.true", Bool(true)),
        ("t.false", Bool(false)),
        ("t.string", String("héllo, 世界".into())),
        ("t.empty_string", String(std::string::String::new())),
        ("t.empty_array", Array(vec![])),
        ("t.u8s", Array(vec![U8(1), U8(2), U8(255)])),
        ("t.i64s", Array(vec![I64(-1), I64(i64::MAX)])),
        ("t.f64s", Array(vec![F64(0.5), F64(-1e-300)])),
        ("t.bools", Array(vec![Bool(true), Bool(false)])),
        (
            "t.strings",
            Array(vec![
                String("a".into()),
                String("".into()),
                String("Ġ t".into()),
            ]),
        ),
        (
            "t.nested",
            Array(vec![
                Array(vec![I32(1), I32(-2)]),
                Array(vec![]),
                Array(vec![String("x".into())]),
                Array(vec![Array(vec![F32(3.25)])]),
            ]),
        ),
    ];
    v.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn round_trips_every_value_type_v2_and_v3() {
    for version in [2, 3] {
        let mut w = GgufWriter::new();
        w.version(version);
        for (k, v) in all_values() {
            w.add(&k, v);
        }
        let norm = f32_bytes(&[1.0, -2.0, 0.5]);
        let quant = pattern(34 * 6, 7);
        let k4 = pattern(144 * 2, 3);
        w.add_tensor("norm", &[3], DType::F32, norm.clone())
            .unwrap();
        w.add_tensor("quant", &[64, 3], DType::Q8_0, quant.clone())
            .unwrap();
        w.add_tensor("k4", &[256, 1, 2, 1], DType::Q4K, k4.clone())
            .unwrap();
        let bytes = w.to_bytes().unwrap();
        let f = GgufFile::from_bytes(bytes, "roundtrip.gguf").unwrap();

        assert_eq!(f.version(), version);
        assert_eq!(f.alignment(), 32);
        assert_eq!(f.metadata(), all_values().as_slice());
        assert_eq!(f.get("t.nested"), Some(&all_values()[21].1));
        assert_eq!(f.get_u64("t.u64").unwrap(), Some(u64::MAX));
        assert_eq!(f.get_u64("t.u8").unwrap(), Some(200));
        assert!(f.get_u64("t.i8").is_err(), "a negative value is not a u64");
        assert_eq!(f.get_f32("t.i16").unwrap(), Some(-30000.0));
        assert_eq!(f.get_bool("t.true").unwrap(), Some(true));
        assert_eq!(f.get_str("t.empty_string").unwrap(), Some(""));
        assert_eq!(f.get_array("t.empty_array").unwrap(), Some(&[][..]));
        assert_eq!(f.architecture().unwrap(), "llama");

        assert_eq!(f.data_offset() % 32, 0);
        let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["norm", "quant", "k4"]);
        for (name, dims, dtype, data) in [
            ("norm", &[3u64][..], DType::F32, &norm),
            ("quant", &[64, 3][..], DType::Q8_0, &quant),
            ("k4", &[256, 1, 2, 1][..], DType::Q4K, &k4),
        ] {
            let t = f.tensor(name).unwrap();
            assert_eq!(
                (t.dims.as_slice(), t.dtype, t.size),
                (dims, dtype, data.len())
            );
            assert_eq!(t.offset % 32, 0, "{name} offset is aligned");
            assert_eq!(f.tensor_data(t), data.as_slice(), "{name} data");
        }
        let k4 = f.tensor("k4").unwrap();
        assert_eq!((k4.cols(), k4.rows(), k4.n_elements()), (256, 2, 512));
    }
}

/// A tensor of each type is stored under ggml's type id and read back as
/// that type; the 2- and 3-bit i-quants' ids as ggml numbers them.
#[test]
fn every_type_round_trips_under_its_ggml_id() {
    let ids = [
        (DType::IQ2XXS, 16),
        (DType::IQ2XS, 17),
        (DType::IQ3XXS, 18),
        (DType::IQ3S, 21),
        (DType::IQ2S, 22),
    ];
    for (dtype, id) in ids {
        assert_eq!(dtype.ggml_type_id(), id, "{dtype}");
    }
    for dtype in DType::ALL {
        let cols = 2 * dtype.block_elems() as u64;
        let data = pattern(3 * dtype.row_bytes(cols as usize).unwrap(), 5);
        let mut w = GgufWriter::new();
        w.add_tensor("tensor.t", &[cols, 3], dtype, data.clone())
            .unwrap();
        let bytes = w.to_bytes().unwrap();
        let ty = tensor_fields(&bytes, "tensor.t", 2).2;
        let stored = u32::from_le_bytes([bytes[ty], bytes[ty + 1], bytes[ty + 2], bytes[ty + 3]]);
        assert_eq!(stored, dtype.ggml_type_id(), "{dtype}");
        let f = GgufFile::from_bytes(bytes, "types.gguf").unwrap();
        let t = f.tensor("tensor.t").unwrap();
        assert_eq!((t.dtype, t.cols(), t.rows()), (dtype, cols as usize, 3));
        assert_eq!(f.tensor_data(t), data.as_slice(), "{dtype}");
    }
}

#[test]
fn custom_alignment_64_written_to_disk() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", GgufValue::String("llama".into()));
    w.alignment(64);
    w.add_tensor("a", &[5], DType::F32, f32_bytes(&[1.0; 5]))
        .unwrap();
    w.add_tensor("b", &[32, 2], DType::Q4_0, pattern(36, 1))
        .unwrap();
    w.add_tensor("c", &[3], DType::F16, pattern(6, 2)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("aligned.gguf");
    w.write(&path).unwrap();
    let bytes = w.to_bytes().unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "write() and to_bytes() agree"
    );
    assert_eq!(bytes.len() % 64, 0, "the last tensor is padded too");

    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.path(), path);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.get_u64("general.alignment").unwrap(), Some(64));
    assert_eq!(f.data_offset() % 64, 0);
    let offsets: Vec<u64> = f
        .tensors()
        .iter()
        .map(|t| t.offset - f.data_offset())
        .collect();
    assert_eq!(offsets, [0, 64, 128]);
    assert_eq!(f.tensor_data(f.tensor("b").unwrap()), pattern(36, 1));
    assert_eq!(f.tensor_data(f.tensor("c").unwrap()), pattern(6, 2));
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    let e = w
        .add_tensor("t", &[32, 2], DType::Q8_0, vec![0; 67])
        .unwrap_err();
    assert!(e.to_string().contains("need 68 bytes, got 67"), "{e}");
    let e = w
        .add_tensor("t", &[16], DType::Q8_0, vec![0; 17])
        .unwrap_err();
    assert!(e.to_string().contains("not a multiple"), "{e}");
    let e = w
        .add_tensor("t", &[1, 1, 1, 1, 1], DType::F32, vec![0; 4])
        .unwrap_err();
    assert!(e.to_string().contains("5 dimensions"), "{e}");
    let e = w
        .add_tensor("t", &[u64::MAX, 2], DType::F32, vec![])
        .unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    w.add_tensor("t", &[1], DType::F32, vec![0; 4]).unwrap();
    let e = w.add_tensor("t", &[1], DType::F32, vec![0; 4]).unwrap_err();
    assert!(e.to_string().contains("already added"), "{e}");
    w.to_bytes().unwrap();

    let fails = |w: &GgufWriter, what: &str| {
        let e = w.to_bytes().unwrap_err().to_string();
        assert!(e.contains(what), "expected '{what}' in: {e}");
    };
    fails(GgufWriter::new().version(1), "version 1");
    fails(GgufWriter::new().alignment(3), "power of two");
    fails(GgufWriter::new().alignment(0), "power of two");
    fails(
        GgufWriter::new()
            .add("k", GgufValue::U8(1))
            .add("k", GgufValue::U8(2)),
        "duplicate metadata key 'k'",
    );
    fails(
        GgufWriter::new().add(
            "k",
            GgufValue::Array(vec![GgufValue::U8(1), GgufValue::I8(1)]),
        ),
        "mixes u8 and i8",
    );
}

#[test]
fn value_accessors() {
    use GgufValue::*;
    assert_eq!(I32(-1).as_u64(), None);
    assert_eq!(I64(7).as_u64(), Some(7));
    assert_eq!(U64(u64::MAX).as_i64(), None);
    assert_eq!(U16(9).as_i64(), Some(9));
    assert_eq!(U8(3).as_f64(), Some(3.0));
    assert_eq!(F32(0.5).as_f64(), Some(0.5));
    assert_eq!(Bool(true).as_u64(), None);
    assert_eq!(String("x".into()).as_f64(), None);
    assert_eq!(Bool(true).as_bool(), Some(true));
    assert_eq!(U8(1).as_bool(), None);
    assert_eq!(String("x".into()).as_str(), Some("x"));
    assert_eq!(Array(vec![U8(1)]).as_array(), Some(&[U8(1)][..]));
    assert_eq!(F64(1.0).type_name(), "f64");
    assert_eq!(Array(vec![]).type_name(), "array");
}

// ---- corrupt files ----

/// A small valid file with one of each thing the corpus corrupts. The last
/// tensor ends on the alignment, so every strict prefix is missing data.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.alignment(32)
        .add("general.architecture", GgufValue::String("llama".into()))
        .add("test.key_a", GgufValue::U32(7))
        .add("test.key_b", GgufValue::String("hello".into()))
        .add("test.flag", GgufValue::Bool(true))
        .add(
            "test.list",
            GgufValue::Array(vec![GgufValue::U32(1), GgufValue::U32(2)]),
        );
    w.add_tensor("tensor.aaaa", &[32, 1], DType::Q8_0, pattern(34, 1))
        .unwrap();
    w.add_tensor("tensor.bbbb", &[8, 4], DType::F32, pattern(128, 2))
        .unwrap();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone(), "valid.gguf").unwrap();
    let b = f.tensor("tensor.bbbb").unwrap();
    assert_eq!(b.offset as usize + b.size, bytes.len());
    bytes
}

/// Byte index just past the only occurrence of `needle` (a key or tensor name).
fn after(bytes: &[u8], needle: &str) -> usize {
    let n = needle.as_bytes();
    let hits: Vec<usize> = (0..=bytes.len() - n.len())
        .filter(|&i| &bytes[i..i + n.len()] == n)
        .collect();
    assert_eq!(hits.len(), 1, "{needle} occurs once");
    hits[0] + n.len()
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn patched(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = valid_file();
    f(&mut b);
    b
}

/// Where a tensor info's fields lie: (n_dims, dims[0], type after `n_dims` dims, offset).
fn tensor_fields(bytes: &[u8], name: &str, n_dims: usize) -> (usize, usize, usize, usize) {
    let nd = after(bytes, name);
    let ty = nd + 4 + 8 * n_dims;
    (nd, nd + 4, ty, ty + 4)
}

fn expect_gguf_err(name: &str, bytes: Vec<u8>, what: &[&str]) {
    match GgufFile::from_bytes(bytes, name) {
        Ok(_) => panic!("{name}: parsed, expected an error mentioning {what:?}"),
        Err(e) => {
            assert!(matches!(e, vkllm::Error::Gguf { .. }), "{name}: {e:?}");
            let msg = e.to_string();
            assert!(
                msg.contains(name),
                "{name}: error does not name the file: {msg}"
            );
            assert!(
                what.iter().any(|w| msg.contains(w)),
                "{name}: expected {what:?} in: {msg}"
            );
        }
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = valid_file();
    for len in 0..bytes.len() {
        let what = [
            "unexpected end of file",
            "runs past the end of the file",
            "remaining bytes hold at most",
        ];
        expect_gguf_err(
            &format!("truncated-at-{len}.gguf"),
            bytes[..len].to_vec(),
            &what,
        );
    }
}

#[test]
fn corrupt_file_corpus() {
    const HUGE: u64 = 1 << 60;
    // Field positions are found in a pristine copy and patched into fresh ones.
    let base = valid_file();
    let a = "tensor.aaaa";
    let b = "tensor.bbbb";
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "bad-magic",
            patched(|v| v[..4].copy_from_slice(b"GGUX")),
            "bad magic \"GGUX\"",
        ),
        (
            "version-1",
            patched(|v| put_u32(v, 4, 1)),
            "unsupported GGUF version 1",
        ),
        (
            "version-4",
            patched(|v| put_u32(v, 4, 4)),
            "unsupported GGUF version 4",
        ),
        (
            "version-max",
            patched(|v| put_u32(v, 4, u32::MAX)),
            "unsupported GGUF version 4294967295",
        ),
        (
            "version-big-endian",
            patched(|v| put_u32(v, 4, 3u32.swap_bytes())),
            "big-endian",
        ),
        (
            "tensor-count-huge",
            patched(|v| put_u64(v, 8, HUGE)),
            "tensor count 1152921504606846976 at byte 8 is impossible",
        ),
        (
            "kv-count-huge",
            patched(|v| put_u64(v, 16, HUGE)),
            "metadata count 1152921504606846976 at byte 16 is impossible",
        ),
        (
            "key-length-past-eof",
            patched(|v| put_u64(v, 24, 1 << 20)),
            "string length 1048576",
        ),
        (
            "string-value-length-past-eof",
            patched(|v| {
                let at = after(&base, "test.key_b") + 4;
                put_u64(v, at, 1 << 40)
            }),
            "string length 1099511627776",
        ),
        (
            "array-length-huge",
            patched(|v| {
                let at = after(&base, "test.list") + 8;
                put_u64(v, at, HUGE)
            }),
            "array length 1152921504606846976",
        ),
        (
            "array-unknown-element-type",
            patched(|v| {
                let at = after(&base, "test.list") + 4;
                put_u32(v, at, 13)
            }),
            "unknown value type 13",
        ),
        (
            "unknown-value-type",
            patched(|v| {
                let at = after(&base, "test.key_a");
                put_u32(v, at, 99)
            }),
            "unknown value type 99",
        ),
        (
            "bool-value-2",
            patched(|v| {
                let at = after(&base, "test.flag") + 4;
                v[at] = 2
            }),
            "bool at byte",
        ),
        (
            "n-dims-0",
            patched(|v| put_u32(v, tensor_fields(&base, a, 2).0, 0)),
            "has 0 dimensions",
        ),
        (
            "n-dims-5",
            patched(|v| put_u32(v, tensor_fields(&base, a, 2).0, 5)),
            "has 5 dimensions",
        ),
        (
            "dim-product-overflow",
            patched(|v| put_u64(v, tensor_fields(&base, a, 2).1 + 8, 1 << 62)),
            "overflows",
        ),
        (
            "dim-beyond-i64",
            patched(|v| put_u64(v, tensor_fields(&base, b, 2).1, u64::MAX)),
            "overflows",
        ),
        (
            "dim-zero",
            patched(|v| put_u64(v, tensor_fields(&base, b, 2).1 + 8, 0)),
            "zero dimension",
        ),
        (
            "data-past-eof",
            patched(|v| put_u64(v, tensor_fields(&base, b, 2).3, 1 << 20)),
            "'tensor.bbbb': data [",
        ),
        (
            "data-offset-overflow",
            patched(|v| put_u64(v, tensor_fields(&base, b, 2).3, u64::MAX - 31)),
            "overflows",
        ),
        (
            "overlapping-tensors",
            patched(|v| put_u64(v, tensor_fields(&base, b, 2).3, 0)),
            "overlap",
        ),
        (
            "misaligned-offset",
            patched(|v| put_u64(v, tensor_fields(&base, b, 2).3, 68)),
            "data offset 68 is not a multiple of the alignment 32",
        ),
        (
            "unknown-ggml-type",
            patched(|v| put_u32(v, tensor_fields(&base, a, 2).2, 1000)),
            "'tensor.aaaa': unknown ggml type id 1000",
        ),
        (
            "unsupported-ggml-type",
            patched(|v| put_u32(v, tensor_fields(&base, a, 2).2, 19)),
            "ggml type 19 (iq1_s) is not supported",
        ),
        (
            "row-not-whole-blocks",
            patched(|v| put_u64(v, tensor_fields(&base, a, 2).1, 16)),
            "row length 16 is not a multiple of the q8_0 block size 32",
        ),
        (
            "duplicate-tensor-name",
            patched(|v| {
                let at = after(&base, b) - b.len();
                v[at..at + b.len()].copy_from_slice(a.as_bytes())
            }),
            "duplicate tensor name 'tensor.aaaa'",
        ),
        (
            "duplicate-key",
            patched(|v| {
                let at = after(&base, "test.key_b") - 1;
                v[at] = b'a'
            }),
            "duplicate metadata key 'test.key_a'",
        ),
        (
            "alignment-0",
            patched(|v| put_u32(v, after(&base, "general.alignment") + 4, 0)),
            "general.alignment 0 is not a nonzero power of two",
        ),
        (
            "alignment-3",
            patched(|v| put_u32(v, after(&base, "general.alignment") + 4, 3)),
            "general.alignment 3 is not a nonzero power of two",
        ),
        (
            "alignment-wrong-type",
            patched(|v| put_u32(v, after(&base, "general.alignment"), 6)),
            "general.alignment has type f32",
        ),
        (
            "non-utf8-key",
            patched(|v| {
                let at = after(&base, "test.key_a") - 1;
                v[at] = 0xFF
            }),
            "not valid UTF-8",
        ),
        (
            "non-utf8-tensor-name",
            patched(|v| {
                let at = after(&base, a) - 1;
                v[at] = 0xC3
            }),
            "name of tensor info #0",
        ),
        ("empty", Vec::new(), "unexpected end of file"),
    ];
    assert!(cases.len() >= 20);
    for (name, bytes, what) in cases {
        expect_gguf_err(&format!("{name}.gguf"), bytes, &[what]);
    }
}

#[test]
fn byte_corruption_never_panics() {
    let bytes = valid_file();
    for i in 0..bytes.len() {
        for flip in [0x00, 0xFF, bytes[i] ^ 0x80, bytes[i].wrapping_add(1)] {
            let mut b = bytes.clone();
            b[i] = flip;
            if let Ok(f) = GgufFile::from_bytes(b, "flipped.gguf") {
                for t in f.tensors() {
                    assert_eq!(f.tensor_data(t).len(), t.size);
                }
            }
        }
    }
}

#[test]
fn deeply_nested_arrays_are_rejected() {
    let mut v = GgufValue::Array(vec![GgufValue::U8(1)]);
    for _ in 0..40 {
        v = GgufValue::Array(vec![v]);
    }
    let bytes = GgufWriter::new().add("deep", v).to_bytes().unwrap();
    expect_gguf_err("deep.gguf", bytes, &["nested deeper than 16"]);
}

#[test]
fn corrupt_file_on_disk_names_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken-on-disk.gguf");
    let bytes = valid_file();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let e = GgufFile::open(&path).unwrap_err().to_string();
    assert!(
        e.contains(&*path.to_string_lossy()) && e.contains("runs past the end"),
        "{e}"
    );
}
