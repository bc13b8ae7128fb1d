//! Text ↔ token ids. One [`Tokenizer`] type wraps a Hugging Face `tokenizers`
//! pipeline built either from a GGUF file's vocabulary ([`Tokenizer::from_gguf`])
//! or from a Hugging Face model directory ([`Tokenizer::from_hf_dir`]), plus
//! the model-level facts generation needs: BOS/EOS, stop tokens, chat template.

mod gguf;
mod hf;
mod stream;

pub use stream::StreamDecoder;

use crate::error::{Error, Result};

/// How one token's piece maps back to bytes; lets [`StreamDecoder`] work on
/// bytes without re-decoding the whole sequence each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PieceBytes {
    /// GPT-2 byte-level BPE: each char of a piece stands for one byte.
    ByteLevel,
    /// SentencePiece: `▁` is a space, `<0xNN>` is one raw byte; the first
    /// token's leading space (the added space prefix) is dropped when
    /// `strip_first_space`.
    SentencePiece { strip_first_space: bool },
    /// Anything else: a piece's bytes are its own decoding.
    Decoded,
}

/// Token strings that end a turn in the chat formats we know about.
const STOP_TOKEN_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|end_of_text|>",
];

/// Gemma's chat format (the text part of Gemma 3's Hugging Face template):
/// a system message is folded into the first user turn, the assistant is
/// called `model`.
const GEMMA_TEMPLATE: &str = "{{ bos_token }}\
{% if messages[0]['role'] == 'system' %}\
{% set first_user_prefix = messages[0]['content'] + '\n\n' %}\
{% set loop_messages = messages[1:] %}\
{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}\
{% for message in loop_messages %}\
{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}\
{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// The chat template of a model whose file names none, recognized by its
/// turn tokens. llama.cpp's converter leaves `tokenizer.chat_template` out of
/// some real files (Gemma 3 270M's GGUF among them), and a wrong format makes
/// a small model ramble instead of answering.
fn builtin_template(has: impl Fn(&str) -> bool) -> Option<String> {
    (has("<start_of_turn>") && has("<end_of_turn>")).then(|| GEMMA_TEMPLATE.to_string())
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pieces: PieceBytes,
    bos: Option<u32>,
    eos: Option<u32>,
    stop: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    /// Cached: `tokenizers` rebuilds its whole vocabulary map to count it.
    vocab_size: usize,
    /// The vocabulary's token trie for grammars, built on first use.
    grammar_vocab: std::sync::OnceLock<std::sync::Arc<crate::model::grammar::GrammarVocab>>,
}

/// What the loaders found beside the vocabulary itself.
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// Extra end-of-turn ids (GGUF `eot_token_id`, generation_config eos lists).
    pub extra_stops: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

impl Tokenizer {
    pub(crate) fn assemble(
        inner: tokenizers::Tokenizer,
        pieces: PieceBytes,
        ids: SpecialIds,
    ) -> Tokenizer {
        let vocab = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&max| max as usize + 1);
        let mut stop: Vec<u32> = ids.eos.into_iter().chain(ids.extra_stops).collect();
        stop.extend(
            STOP_TOKEN_TEXTS
                .iter()
                .filter_map(|text| inner.token_to_id(text)),
        );
        // Ids outside the vocabulary come from a broken config; keeping them
        // would only make `stop_ids` lie.
        stop.retain(|&id| (id as usize) < vocab);
        let mut seen = std::collections::HashSet::new();
        stop.retain(|id| seen.insert(*id));
        let in_vocab = |id: Option<u32>| id.filter(|&i| (i as usize) < vocab);
        Tokenizer {
            pieces,
            bos: in_vocab(ids.bos),
            eos: in_vocab(ids.eos),
            stop,
            add_bos: ids.add_bos && in_vocab(ids.bos).is_some(),
            chat_template: ids
                .chat_template
                .or_else(|| builtin_template(|t| inner.token_to_id(t).is_some())),
            vocab_size: vocab,
            grammar_vocab: std::sync::OnceLock::new(),
            inner,
        }
    }

    /// Token ids of `text`. Special tokens written in the text (such as
    /// `<|im_start|>`) become their single ids. `add_bos` prepends the BOS id
    /// when the model has one.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(format!("cannot encode text: {e}")))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Text of `ids`, special tokens included (Hugging Face's
    /// `decode(ids, skip_special_tokens=False)`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab_size()) {
            return Err(Error::Tokenizer(format!(
                "cannot decode id {bad}: the vocabulary has {} tokens",
                self.vocab_size()
            )));
        }
        self.inner
            .decode(ids, false)
            .map_err(|e| Error::Tokenizer(format!("cannot decode ids: {e}")))
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Ids that end generation: EOS, EOT and the end-of-turn tokens of the
    /// common chat formats present in this vocabulary.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop
    }

    /// Whether the model expects a BOS token in front of a prompt.
    pub fn add_bos_by_default(&self) -> bool {
        self.add_bos
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Number of ids (one past the largest), added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The raw vocabulary entry of `id` (`ĠParis`, `▁Paris`, `<|im_end|>`).
    pub fn id_to_piece(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a vocabulary entry, given as its raw piece.
    pub fn piece_to_id(&self, piece: &str) -> Option<u32> {
        self.inner.token_to_id(piece)
    }

    /// The text one token decodes to on its own (` Paris`), lossy where the
    /// token is only part of a UTF-8 character.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.token_bytes(id)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// A decoder that turns ids, pushed one at a time, into complete UTF-8 text.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    /// The bytes `id` contributes to a decoded text (ignoring the
    /// first-token space strip, which [`StreamDecoder`] applies itself).
    pub(crate) fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let piece = self.inner.id_to_token(id)?;
        Some(match self.pieces {
            PieceBytes::ByteLevel => stream::byte_level_bytes(&piece),
            PieceBytes::SentencePiece { .. } => stream::sentencepiece_bytes(&piece),
            PieceBytes::Decoded => self.inner.decode(&[id], false).ok()?.into_bytes(),
        })
    }

    /// Ids of the special (control) tokens, which are never plain text.
    pub(crate) fn special_ids(&self) -> Vec<u32> {
        self.inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect()
    }

    pub(crate) fn grammar_vocab_cache(
        &self,
    ) -> &std::sync::OnceLock<std::sync::Arc<crate::model::grammar::GrammarVocab>> {
        &self.grammar_vocab
    }

    pub(crate) fn piece_bytes(&self) -> PieceBytes {
        self.pieces
    }
}
