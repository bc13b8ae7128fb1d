//! Inputs the fuzz targets (fuzz/) found crashing vkllm, each reduced to a
//! test: the call the target made now returns an error naming the problem.

use serde_json::Value;
use vkllm::model::chat::{render_chat, ChatMessage};
use vkllm::model::tokenizer::Tokenizer;
use vkllm::ErrorKind;

/// A `tokenizer.json` whose `decoder` object is cut by a syntax error.
fn tokenizer_json_with_decoder(decoder: &[u8]) -> Vec<u8> {
    let mut json = br#"{"version": "1.0", "added_tokens": [], "normalizer": null,
        "pre_tokenizer": null, "post_processor": null, "decoder": "#
        .to_vec();
    json.extend_from_slice(decoder);
    json.extend_from_slice(
        br#", "model": {"type": "WordLevel", "unk_token": "[UNK]", "vocab": {"[UNK]": 0}}}"#,
    );
    json
}

#[test]
fn tokenizer_json_with_a_syntax_error_in_its_decoder_is_an_error() {
    // tokenizers 0.21 panicked with `Helper: Error(...)` on each of these
    // (fuzz/tokenizer_json, 2026-11-25): invalid UTF-8 in a key, a lone
    // surrogate escape, a missing value.
    for decoder in [
        &b"{\"type\": \"ByteLevel\", \"add_prefix_spac\xe5\": true}"[..],
        br#"{"type": "ByteLevel", "add_prefix_space": "\udc00"}"#,
        br#"{"type": "ByteLevel", "add_prefix_space": }"#,
    ] {
        let json = tokenizer_json_with_decoder(decoder);
        let e = Tokenizer::from_hf_json(&json, &Value::Null, &Value::Null, "tokenizer.json")
            .err()
            .expect("a malformed tokenizer.json loaded");
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(
            e.to_string()
                .starts_with("tokenizer: tokenizer.json is not valid JSON: "),
            "{e}"
        );
    }
    // The same file with a well-formed decoder loads: the test above fails
    // for the syntax error, not for something else in the file.
    let json = tokenizer_json_with_decoder(
        br###"{"type": "WordPiece", "prefix": "##", "cleanup": true}"###,
    );
    Tokenizer::from_hf_json(&json, &Value::Null, &Value::Null, "tokenizer.json").unwrap();
}

#[test]
fn a_model_declaring_absurdly_many_layers_is_refused_before_allocating() {
    // A header with block_count = 16,449,554 made the GGUF config reader
    // allocate 263 MB of per-layer settings (fuzz/gguf, 2026-11-25: 12 s
    // for one input); 2^40 layers aborts the process.
    for layers in [16_449_554u64, 1 << 40] {
        let mut w = vkllm::model::gguf_write::GgufWriter::new();
        let s = |v: &str| vkllm::model::gguf::GgufValue::String(v.into());
        let n = vkllm::model::gguf::GgufValue::U64;
        w.add("general.architecture", s("llama"))
            .add("llama.block_count", n(layers))
            .add("llama.embedding_length", n(64))
            .add("llama.attention.head_count", n(4))
            .add("llama.feed_forward_length", n(128))
            .add("llama.context_length", n(256));
        let g =
            vkllm::model::gguf::GgufFile::from_bytes(w.to_bytes().unwrap(), "layers.gguf").unwrap();
        let e = vkllm::model::ModelConfig::from_gguf(&g, Some(512)).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("bad model configuration: layers.gguf declares {layers} layers; at most 4096 are supported")
        );
        let json = format!(
            r#"{{"model_type": "llama", "num_hidden_layers": {layers}, "hidden_size": 64,
                "num_attention_heads": 4, "intermediate_size": 128,
                "max_position_embeddings": 256, "vocab_size": 512}}"#
        );
        let e = vkllm::model::ModelConfig::from_hf_json(&json, "config.json").unwrap_err();
        assert!(
            e.to_string().contains(&format!("declares {layers} layers")),
            "{e}"
        );
    }
}

/// Renders `template` over one user turn on a thread of its own, failing
/// the test instead of hanging it when the render does not end in time.
fn render_within_seconds(template: &str, seconds: u64) -> vkllm::Result<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = template.to_owned();
    std::thread::spawn(move || {
        let messages = [ChatMessage::new("user", "Hi")];
        let _ = tx.send(render_chat(&owned, &messages, true, "<s>", "</s>"));
    });
    rx.recv_timeout(std::time::Duration::from_secs(seconds))
        .unwrap_or_else(|_| panic!("rendering {template:?} hung"))
}

#[test]
fn a_chat_template_repeating_a_sequence_without_bound_is_an_error() {
    // `{{31111111E11*()}}` hung rendering (fuzz/chat_template,
    // 2026-11-25): minijinja iterated 3.1e18 repeats of the empty tuple.
    // An empty sequence repeated is empty, as in Python.
    assert_eq!(
        render_within_seconds("{{31111111E11*()}}", 20).unwrap(),
        "[]"
    );
    assert_eq!(
        render_within_seconds("{{ ([] * 10**18)|length }}", 20).unwrap(),
        "0"
    );
    // A non-empty one may not grow past 100,000 items.
    for template in ["{{ (1,) * 10**18 }}", "{{ ([1, 2] * 50001)|length }}"] {
        let e = render_within_seconds(template, 20).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(
            e.to_string().contains("repeated sequence is too large"),
            "{e}"
        );
    }
    assert_eq!(
        render_within_seconds("{{ ([1, 2] * 50000)|length }}", 20).unwrap(),
        "100000"
    );
}

#[test]
fn a_chat_template_looping_or_printing_without_end_is_an_error() {
    // 10^10 loop iterations: the render runs out of fuel.
    let e = render_within_seconds(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        60,
    )
    .unwrap_err();
    assert!(e.to_string().contains("ran out of fuel"), "{e}");
    // 100 MB of output: refused at 64 MiB.
    let e = render_within_seconds(
        "{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
        60,
    )
    .unwrap_err();
    assert!(e.to_string().contains("exceed 64 MiB"), "{e}");
}

#[test]
fn streamed_decoding_equals_whole_decoding_on_the_fuzzed_vocabularies() {
    // fuzz/gguf_vocab (finding 4, 2026-11-25): on these SentencePiece
    // vocabularies the stream let the valid bytes of a byte-fallback run
    // out, where the whole decode (Hugging Face's ByteFallback) replaces
    // every byte of a run that is not UTF-8 as a whole.
    let fffd = |n: usize| "\u{FFFD}".repeat(n);
    for (name, text) in [
        ("1", "<bos>  leadingspaces\n".to_string() + &fffd(9)),
        ("2", fffd(14) + "<unk>\n\ttabsand<unk>"),
    ] {
        let path = format!(
            "{}/fuzz/findings/gguf_vocab-stream-decode-{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let data = std::fs::read(&path).unwrap();
        // The target's input: a u16 length, the text, the GGUF image.
        let (len, rest) = data.split_first_chunk::<2>().unwrap();
        let (input, gguf) = rest.split_at(usize::from(u16::from_le_bytes(*len)));
        let g = vkllm::model::gguf::GgufFile::from_bytes(gguf.to_vec(), &path).unwrap();
        let tok = Tokenizer::from_gguf(&g).unwrap();
        let ids = tok.encode(&String::from_utf8_lossy(input), true).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text, "{path}");
        let mut stream = tok.stream_decoder();
        let mut streamed: String = ids.iter().map(|&id| stream.push(id)).collect();
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, text, "{path}");
    }
}
