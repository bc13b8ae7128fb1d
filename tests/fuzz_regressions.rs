//! Inputs the fuzz targets (fuzz/) found crashing vkllm, each reduced to a
//! test: the call the target made now returns an error naming the problem.

use serde_json::Value;
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
