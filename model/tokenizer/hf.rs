//! Loading a Hugging Face model directory's tokenizer: `tokenizer.json`, plus
//! `tokenizer_config.json` (BOS/EOS, chat template, add_bos_token) and
//! `generation_config.json` (extra EOS ids) when present.

use super::{PieceBytes, SpecialIds, Tokenizer};
use crate::error::{Error, Result};
use serde_json::Value;
use std::path::Path;
use tokenizers::pre_tokenizers::metaspace::PrependScheme;
use tokenizers::DecoderWrapper;

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Tokenizer(format!("{} is not valid JSON: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// A token given either as a string or as `{"content": "..."}`.
fn token_content(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which the
/// one named `default` is the chat template.
fn chat_template(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// Which per-token byte mapping matches the tokenizer's decoder.
fn piece_bytes(decoder: Option<&DecoderWrapper>) -> PieceBytes {
    fn parts(d: &DecoderWrapper) -> Vec<&DecoderWrapper> {
        match d {
            DecoderWrapper::Sequence(seq) => seq.get_decoders().iter().collect(),
            other => vec![other],
        }
    }
    let Some(d) = decoder else {
        return PieceBytes::Decoded;
    };
    let parts = parts(d);
    let has = |f: fn(&DecoderWrapper) -> bool| parts.iter().any(|p| f(p));
    let metaspace = parts.iter().find_map(|p| match p {
        DecoderWrapper::Metaspace(m) => Some(m),
        _ => None,
    });
    if has(|p| matches!(p, DecoderWrapper::ByteLevel(_))) {
        PieceBytes::ByteLevel
    } else if has(|p| matches!(p, DecoderWrapper::ByteFallback(_))) {
        PieceBytes::SentencePiece {
            strip_first_space: has(|p| matches!(p, DecoderWrapper::Strip(_))),
        }
    } else if let Some(m) = metaspace {
        // Metaspace drops the first token's ▁ unless it never prepends one.
        PieceBytes::SentencePiece {
            strip_first_space: m.get_prepend_scheme() != PrependScheme::Never,
        }
    } else {
        PieceBytes::Decoded
    }
}

impl Tokenizer {
    /// The tokenizer of a Hugging Face model directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
        let file = dir.join("tokenizer.json");
        if !file.exists() {
            return Err(Error::Tokenizer(format!("{} is missing", file.display())));
        }
        let json = std::fs::read(&file).map_err(|e| Error::io(&file, e))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
        Self::from_hf_json(&json, &config, &generation, &file.display().to_string())
    }

    /// The tokenizer of a `tokenizer.json` text, with the parsed
    /// `tokenizer_config.json` and `generation_config.json` (`Value::Null`
    /// when absent); `origin` names the file in messages.
    pub fn from_hf_json(
        tokenizer_json: &[u8],
        config: &Value,
        generation: &Value,
        origin: &str,
    ) -> Result<Tokenizer> {
        // tokenizers 0.21 panics (`expect("Helper")`) on a syntax error
        // inside the `decoder` object instead of returning it; parsing the
        // text first makes every malformed one an error (found by fuzzing;
        // skipping with IgnoredAny would not check UTF-8 or escapes).
        serde_json::from_slice::<Value>(tokenizer_json)
            .map_err(|e| Error::Tokenizer(format!("{origin} is not valid JSON: {e}")))?;
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| Error::Tokenizer(format!("cannot load {origin}: {e}")))?;
        let id_of = |key: &str| token_content(config.get(key)).and_then(|t| inner.token_to_id(t));
        let bos = id_of("bos_token").or_else(|| {
            generation
                .get("bos_token_id")
                .and_then(Value::as_u64)
                .and_then(|v| u32::try_from(v).ok())
        });
        let generation_eos: Vec<u32> = match generation.get("eos_token_id") {
            Some(Value::Array(ids)) => ids.iter().filter_map(Value::as_u64).collect(),
            Some(v) => v.as_u64().into_iter().collect(),
            None => Vec::new(),
        }
        .into_iter()
        .filter_map(|v| u32::try_from(v).ok())
        .collect();
        let eos = id_of("eos_token").or_else(|| generation_eos.first().copied());
        // Without an explicit flag, trust the post-processor: if it puts BOS in
        // front of an empty text, the model was trained with BOS.
        let add_bos = match config.get("add_bos_token").and_then(Value::as_bool) {
            Some(flag) => flag,
            None => bos.is_some_and(|b| {
                inner
                    .encode("", true)
                    .is_ok_and(|enc| enc.get_ids().first() == Some(&b))
            }),
        };
        let pieces = piece_bytes(inner.get_decoder());
        let ids = SpecialIds {
            bos,
            eos,
            extra_stops: generation_eos,
            add_bos,
            chat_template: chat_template(config),
        };
        Ok(Tokenizer::assemble(inner, pieces, ids))
    }
}
