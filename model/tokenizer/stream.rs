//! Incremental detokenization for streaming output: bytes of each token are
//! buffered until they form complete UTF-8 characters, and SentencePiece
//! byte-fallback runs until they end.

use super::{PieceBytes, Tokenizer};
use std::sync::OnceLock;

/// Turns ids pushed one at a time into text chunks that are always complete,
/// valid UTF-8; a character split over several tokens comes out once its
/// last byte arrives. Concatenating every chunk (and [`StreamDecoder::finish`])
/// gives the same text as [`Tokenizer::decode`] of all ids.
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    /// Bytes of a character not complete yet (byte-level and decoded pieces).
    pending: Vec<u8>,
    /// SentencePiece: the bytes of the `<0xNN>` tokens since the last other
    /// token.
    byte_run: Vec<u8>,
    /// Nothing emitted yet: the SentencePiece first-space strip is still due.
    at_start: bool,
}

impl<'t> StreamDecoder<'t> {
    pub(super) fn new(tok: &'t Tokenizer) -> Self {
        StreamDecoder {
            tok,
            pending: Vec::new(),
            byte_run: Vec::new(),
            at_start: true,
        }
    }

    /// Adds one id; returns the text it completes (possibly empty). Unknown
    /// ids contribute nothing.
    pub fn push(&mut self, id: u32) -> String {
        if let PieceBytes::SentencePiece { .. } = self.tok.piece_bytes() {
            return self.push_sentencepiece(id);
        }
        let Some(bytes) = self.tok.token_bytes(id) else {
            return String::new();
        };
        self.pending.extend_from_slice(&bytes);
        self.drain_valid()
    }

    /// Flushes what is held back: bytes that never completed a character
    /// become U+FFFD (what a lossy decode of the whole sequence shows), a
    /// byte-fallback run its text.
    pub fn finish(&mut self) -> String {
        if let PieceBytes::SentencePiece { .. } = self.tok.piece_bytes() {
            let text = self.end_byte_run();
            return self.strip_first_space(text);
        }
        let mut out = self.drain_valid();
        if !self.pending.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
        out
    }

    /// A SentencePiece token, decoded as the `tokenizers` decoder chain
    /// (▁ → space, ByteFallback, Fuse, Strip) decodes the whole sequence.
    fn push_sentencepiece(&mut self, id: u32) -> String {
        let Some(piece) = self.tok.id_to_piece(id) else {
            return String::new();
        };
        if let Some(byte) = fallback_byte(&piece) {
            self.byte_run.push(byte);
            return String::new();
        }
        let mut text = self.end_byte_run();
        text.push_str(&piece.replace('\u{2581}', " "));
        self.strip_first_space(text)
    }

    /// The text of a byte-fallback run that has ended, as ByteFallback gives
    /// it: the bytes when they are UTF-8 as a whole, else one U+FFFD per
    /// byte. A bad byte late in a run so replaces all of it, which is why a
    /// run is held back until a token of another kind (or the end) arrives.
    fn end_byte_run(&mut self) -> String {
        let run = std::mem::take(&mut self.byte_run);
        String::from_utf8(run).unwrap_or_else(|e| "\u{FFFD}".repeat(e.as_bytes().len()))
    }

    /// Drops the space the SentencePiece normalizer prefixed to the text:
    /// the first character of the whole output, when it is one.
    fn strip_first_space(&mut self, text: String) -> String {
        if !self.at_start || text.is_empty() {
            return text;
        }
        self.at_start = false;
        let strip = matches!(
            self.tok.piece_bytes(),
            PieceBytes::SentencePiece {
                strip_first_space: true
            }
        );
        match text.strip_prefix(' ') {
            Some(rest) if strip => rest.to_string(),
            _ => text,
        }
    }

    /// Takes every complete character off the front of `pending`; byte
    /// sequences that can never become valid turn into U+FFFD right away so
    /// one bad byte cannot stall the stream.
    fn drain_valid(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // The prefix was just validated by from_utf8.
                    out.push_str(&String::from_utf8_lossy(&self.pending[start..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            start = valid + bad;
                        }
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

/// GPT-2's byte ↔ char table: printable bytes map to themselves, the rest to
/// code points from U+0100 up, so every byte has a visible char.
fn byte_level_table() -> &'static std::collections::HashMap<char, u8> {
    static TABLE: OnceLock<std::collections::HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 0u32;
        (0..=255u8)
            .map(|b| {
                let c = if printable(b) {
                    char::from(b)
                } else {
                    next += 1;
                    char::from_u32(255 + next).unwrap_or(char::REPLACEMENT_CHARACTER)
                };
                (c, b)
            })
            .collect()
    })
}

/// Bytes of a byte-level piece; chars outside the table (added tokens with
/// unusual text) stand for their own UTF-8, as the `tokenizers` decoder does.
pub(super) fn byte_level_bytes(piece: &str) -> Vec<u8> {
    let table = byte_level_table();
    let mut out = Vec::with_capacity(piece.len());
    for c in piece.chars() {
        match table.get(&c) {
            Some(&b) => out.push(b),
            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out
}

/// Bytes of a SentencePiece piece: `<0xNN>` is that byte, `▁` a space.
pub(super) fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    match fallback_byte(piece) {
        Some(b) => vec![b],
        None => piece.replace('\u{2581}', " ").into_bytes(),
    }
}

/// The byte a byte-fallback piece `<0xNN>` stands for.
fn fallback_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
