//! Building a tokenizer from a GGUF file's `tokenizer.ggml.*` metadata, the
//! way llama.cpp reads it: `gpt2` (byte-level BPE with merges and a
//! pre-tokenizer regex named by `tokenizer.ggml.pre`) and `llama`
//! (SentencePiece BPE over scores, with `<0xNN>` byte fallback).

use super::{PieceBytes, SpecialIds, Tokenizer};
use crate::error::{Error, Result};
use crate::model::gguf::{GgufFile, GgufValue};
use std::collections::HashMap;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_attr` order).
const TYPE_NORMAL: u64 = 1;
const TYPE_CONTROL: u64 = 3;
const TYPE_USER_DEFINED: u64 = 4;

/// Llama 3's split regex (tokenizer.json of Meta-Llama-3).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with every digit split on its own.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's o200k split (gpt-oss), as llama.cpp writes it
/// (LLAMA_VOCAB_PRE_TYPE_GPT4O): tokenizer.json's regex with its
/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]` / `[\p{Ll}\p{Lm}\p{Lo}\p{M}]` classes
/// rewritten as "a letter but not a-z" / "a letter but not A-Z". The two
/// differ only on combining marks (`\p{M}`), which this one leaves out of words.
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How the text is cut into words before byte-level BPE (llama.cpp's
/// `LLAMA_VOCAB_PRE_TYPE_*` groups).
enum PreSplit {
    /// GPT-2's regex alone.
    Gpt2,
    /// Each digit isolated, then GPT-2's regex (SmolLM, StarCoder, ...).
    DigitsThenGpt2,
    /// One regex, then byte-level mapping without GPT-2's regex.
    Regex(&'static str),
}

fn pre_split(pre: &str) -> Result<PreSplit> {
    Ok(match pre {
        "default" | "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" => PreSplit::Gpt2,
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            PreSplit::DigitsThenGpt2
        }
        "llama-bpe" | "llama3" | "llama-v3" | "dbrx" | "smaug-bpe" | "falcon3" => {
            PreSplit::Regex(LLAMA3_REGEX)
        }
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "hunyuan" => PreSplit::Regex(QWEN2_REGEX),
        "gpt-4o" | "minimax-m2" => PreSplit::Regex(GPT4O_REGEX),
        other => {
            return Err(Error::Unsupported(format!(
                "GGUF pre-tokenizer type '{other}' (tokenizer.ggml.pre)"
            )))
        }
    })
}

fn tok_err(msg: impl Into<String>) -> Error {
    Error::Tokenizer(msg.into())
}

fn lib_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(format!("{what}: {e}"))
}

/// A GGUF string array, or an error naming the key.
fn strings<'a>(g: &'a GgufFile, key: &str) -> Result<Option<Vec<&'a str>>> {
    let Some(arr) = g.get_array(key)? else {
        return Ok(None);
    };
    arr.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .ok_or_else(|| tok_err(format!("{key}[{i}] is not a string")))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn numbers<T>(
    g: &GgufFile,
    key: &str,
    conv: impl Fn(&GgufValue) -> Option<T>,
) -> Result<Option<Vec<T>>> {
    let Some(arr) = g.get_array(key)? else {
        return Ok(None);
    };
    arr.iter()
        .enumerate()
        .map(|(i, v)| conv(v).ok_or_else(|| tok_err(format!("{key}[{i}] is not a number"))))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// A special token id, which must name one of the `vocab` tokens: an id
/// outside the vocabulary would be fed to the model (BOS) or never match (EOS).
fn token_id(g: &GgufFile, key: &str, vocab: usize) -> Result<Option<u32>> {
    match g.get_u64(key)? {
        None => Ok(None),
        Some(v) => match u32::try_from(v) {
            Ok(id) if (id as usize) < vocab => Ok(Some(id)),
            _ => Err(tok_err(format!(
                "{key} {v} is outside the vocabulary of {vocab} tokens"
            ))),
        },
    }
}

/// Token → id. A piece listed twice keeps its first id; the later id then
/// decodes to nothing (converters never write duplicates, but a bad file
/// must not break loading).
fn vocab_map(tokens: &[&str]) -> Vocab {
    let mut vocab = Vocab::default();
    for (id, t) in tokens.iter().enumerate() {
        vocab.entry((*t).to_string()).or_insert(id as u32);
    }
    vocab
}

impl Tokenizer {
    /// The tokenizer stored in a GGUF file's metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Tokenizer> {
        let model = g
            .get_str("tokenizer.ggml.model")?
            .ok_or_else(|| tok_err("the GGUF file has no tokenizer (tokenizer.ggml.model)"))?;
        let tokens = strings(g, "tokenizer.ggml.tokens")?
            .ok_or_else(|| tok_err("the GGUF file has no tokenizer.ggml.tokens"))?;
        let types = numbers(g, "tokenizer.ggml.token_type", GgufValue::as_u64)?
            .unwrap_or_else(|| vec![TYPE_NORMAL; tokens.len()]);
        if types.len() != tokens.len() {
            return Err(tok_err(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let add_bos_key = g.get_bool("tokenizer.ggml.add_bos_token")?;
        let (mut inner, pieces, add_bos_default) = match model {
            "gpt2" => {
                let pre = g.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
                let merges = strings(g, "tokenizer.ggml.merges")?
                    .ok_or_else(|| tok_err("a gpt2 GGUF tokenizer needs tokenizer.ggml.merges"))?;
                let inner = byte_level_bpe(&tokens, &merges, pre_split(pre)?)?;
                (inner, PieceBytes::ByteLevel, pre_split_adds_bos(pre))
            }
            "llama" => {
                let scores = numbers(g, "tokenizer.ggml.scores", GgufValue::as_f64)?
                    .ok_or_else(|| tok_err("a llama GGUF tokenizer needs tokenizer.ggml.scores"))?;
                if scores.len() != tokens.len() {
                    return Err(tok_err(format!(
                        "tokenizer.ggml.scores has {} entries for {} tokens",
                        scores.len(),
                        tokens.len()
                    )));
                }
                let space_prefix = g
                    .get_bool("tokenizer.ggml.add_space_prefix")?
                    .unwrap_or(true);
                let unk = token_id(g, "tokenizer.ggml.unknown_token_id", tokens.len())?
                    .and_then(|id| tokens.get(id as usize).copied());
                let inner = sentencepiece_bpe(&tokens, &scores, &types, unk, space_prefix)?;
                let pieces = PieceBytes::SentencePiece {
                    strip_first_space: space_prefix,
                };
                (inner, pieces, true)
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "GGUF tokenizer model '{other}' (tokenizer.ggml.model)"
                )))
            }
        };
        add_special_tokens(&mut inner, &tokens, &types);
        let eot = token_id(g, "tokenizer.ggml.eot_token_id", tokens.len())?;
        let ids = SpecialIds {
            bos: token_id(g, "tokenizer.ggml.bos_token_id", tokens.len())?,
            eos: token_id(g, "tokenizer.ggml.eos_token_id", tokens.len())?,
            extra_stops: eot.into_iter().collect(),
            add_bos: add_bos_key.unwrap_or(add_bos_default),
            chat_template: g.get_str("tokenizer.chat_template")?.map(str::to_string),
        };
        Ok(Tokenizer::assemble(inner, pieces, ids))
    }
}

/// llama.cpp's default for `add_bos_token` when the key is absent: Llama 3
/// style vocabularies want BOS, other byte-level ones do not.
fn pre_split_adds_bos(pre: &str) -> bool {
    matches!(
        pre,
        "llama-bpe" | "llama3" | "llama-v3" | "dbrx" | "smaug-bpe" | "falcon3"
    )
}

/// Control and user-defined tokens become added tokens so they are matched
/// as wholes in text (`<|im_start|>` is one id, never `<`, `|`, ...).
fn add_special_tokens(inner: &mut tokenizers::Tokenizer, tokens: &[&str], types: &[u64]) {
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(t, ty)| matches!(**ty, TYPE_CONTROL | TYPE_USER_DEFINED) && !t.is_empty())
        .map(|(t, ty)| AddedToken::from(*t, *ty == TYPE_CONTROL).normalized(false))
        .collect();
    inner.add_special_tokens(&added);
}

fn byte_level_bpe(
    tokens: &[&str],
    merges: &[&str],
    split: PreSplit,
) -> Result<tokenizers::Tokenizer> {
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| tok_err(format!("tokenizer.ggml.merges[{i}] '{m}' is not 'a b'")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map(tokens), merges)
        .build()
        .map_err(|e| lib_err("bad GGUF BPE vocabulary", e))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let byte_level = ByteLevel::new(false, false, true);
    let pre: PreTokenizerWrapper = match split {
        PreSplit::Gpt2 => byte_level.into(),
        PreSplit::DigitsThenGpt2 => {
            PreSequence::new(vec![isolate(r"\p{N}")?, byte_level.into()]).into()
        }
        PreSplit::Regex(re) => {
            PreSequence::new(vec![isolate(re)?, byte_level.use_regex(false).into()]).into()
        }
    };
    inner.with_pre_tokenizer(Some(pre));
    inner.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    Ok(inner)
}

/// A pre-tokenizer that cuts out each match of `re` as its own word.
fn isolate(re: &str) -> Result<PreTokenizerWrapper> {
    Split::new(
        SplitPattern::Regex(re.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map(PreTokenizerWrapper::Split)
    .map_err(|e| lib_err("bad pre-tokenizer regex", e))
}

/// SentencePiece BPE as a `tokenizers` BPE: a merge `(l, r)` exists for every
/// normal token that splits into two normal tokens, ranked by the merged
/// token's score (SentencePiece merges the best-scoring adjacent pair first).
fn sentencepiece_bpe(
    tokens: &[&str],
    scores: &[f64],
    types: &[u64],
    unk: Option<&str>,
    space_prefix: bool,
) -> Result<tokenizers::Tokenizer> {
    let normal: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| types[*i] == TYPE_NORMAL)
        .map(|(i, t)| (*t, i))
        .collect();
    let mut ranked: Vec<(f64, usize, usize, usize)> = Vec::new();
    for (&piece, &id) in &normal {
        for (split, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(split);
            if let (Some(&li), Some(&ri)) = (normal.get(l), normal.get(r)) {
                ranked.push((scores[id], id, li, ri));
            }
        }
    }
    // Best score first; ties by merged id, then by the pieces' ids, so the
    // order never depends on hash iteration.
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    let merges = ranked
        .into_iter()
        .map(|(_, _, l, r)| (tokens[l].to_string(), tokens[r].to_string()))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab_map(tokens), merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk.to_string());
    }
    let bpe = builder
        .build()
        .map_err(|e| lib_err("bad GGUF SentencePiece vocabulary", e))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let to_meta = Replace::new(" ", "\u{2581}").map_err(|e| lib_err("normalizer", e))?;
    let normalizer: NormalizerWrapper = if space_prefix {
        // Like llama.cpp, every stretch of text (also after a special token)
        // gets the space prefix.
        tokenizers::normalizers::Sequence::new(vec![
            Prepend::new("\u{2581}".to_string()).into(),
            to_meta.into(),
        ])
        .into()
    } else {
        to_meta.into()
    };
    inner.with_normalizer(Some(normalizer));
    let from_meta = Replace::new("\u{2581}", " ").map_err(|e| lib_err("decoder", e))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        from_meta.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}
