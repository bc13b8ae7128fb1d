//! Made-up tokenizer keys for GGUF files written without a real tokenizer:
//! a byte-level gpt2 vocabulary of any size (synthetic models, and
//! converted checkpoints that carry no `tokenizer.json`).

use crate::error::{Error, Result};
use crate::model::gguf::GgufValue;

/// llama.cpp's token types (`LLAMA_TOKEN_TYPE_*`).
pub(crate) const TOKEN_NORMAL: i32 = 1;
pub(crate) const TOKEN_CONTROL: i32 = 3;
/// Fillers are "unused": as user-defined tokens, a donor padded from 49K to
/// 128K entries gave the tokenizer 79K added tokens, whose insertion
/// (quadratic in the `tokenizers` crate) took 24 s on every load.
pub(crate) const TOKEN_UNUSED: i32 = 5;

/// Pad `tokens`/`types` with filler tokens up to `vocab`, or cut them.
pub(crate) fn fit_vocab(tokens: &mut Vec<GgufValue>, types: &mut Vec<GgufValue>, vocab: usize) {
    tokens.truncate(vocab);
    types.truncate(vocab);
    while tokens.len() < vocab {
        tokens.push(GgufValue::String(format!("<|filler_{}|>", tokens.len())));
    }
    types.resize(vocab, GgufValue::I32(TOKEN_UNUSED));
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the
/// rest map to code points from 256 up, so every byte is one visible char.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// A minimal byte-level gpt2 vocabulary: `<|endoftext|>` (bos = eos), the
/// 256 byte tokens, one merge ("Ġ t"), then fillers up to `vocab`.
pub(crate) fn byte_tokenizer(vocab: usize) -> Result<Vec<(String, GgufValue)>> {
    let fixed = 258;
    if vocab < fixed {
        return Err(Error::Invalid(format!(
            "a byte-level vocabulary needs at least {fixed} tokens, the shape has {vocab}"
        )));
    }
    let space = byte_char(b' ');
    let mut tokens = vec![GgufValue::String("<|endoftext|>".into())];
    let mut types = vec![GgufValue::I32(TOKEN_CONTROL)];
    for b in 0..=255u8 {
        tokens.push(GgufValue::String(byte_char(b).to_string()));
        types.push(GgufValue::I32(TOKEN_NORMAL));
    }
    tokens.push(GgufValue::String(format!("{space}t")));
    types.push(GgufValue::I32(TOKEN_NORMAL));
    fit_vocab(&mut tokens, &mut types, vocab);
    let s = |v: &str| GgufValue::String(v.to_owned());
    Ok(vec![
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("default")),
        ("tokenizer.ggml.tokens".into(), GgufValue::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), GgufValue::Array(types)),
        (
            "tokenizer.ggml.merges".into(),
            GgufValue::Array(vec![s(&format!("{space} t"))]),
        ),
        ("tokenizer.ggml.bos_token_id".into(), GgufValue::U32(0)),
        ("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(0)),
        (
            "tokenizer.ggml.add_bos_token".into(),
            GgufValue::Bool(false),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_are_distinct() {
        let set: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(set.len(), 256);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
    }

    /// Fillers are unused tokens, not user-defined ones the tokenizer would
    /// have to match in text.
    #[test]
    fn fillers_are_unused_tokens() {
        let mut tokens = vec![GgufValue::String("a".into())];
        let mut types = vec![GgufValue::I32(TOKEN_NORMAL)];
        fit_vocab(&mut tokens, &mut types, 4);
        assert_eq!(tokens.len(), 4);
        assert_eq!(tokens[3].as_str(), Some("<|filler_3|>"));
        assert!(types[1..]
            .iter()
            .all(|t| matches!(t, GgufValue::I32(TOKEN_UNUSED))));
    }
}
