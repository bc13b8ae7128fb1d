//! Incremental detokenization for streaming output: bytes of each token are
//! buffered until they form complete UTF-8 characters.

use super::{PieceBytes, Tokenizer};
use std::sync::OnceLock;

/// Turns ids pushed one at a time into text chunks that are always complete,
/// valid UTF-8; a character split over several tokens comes out once its
/// last byte arrives. Concatenating every chunk (and [`StreamDecoder::finish`])
/// gives the same text as [`Tokenizer::decode`] of all ids.
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    pending: Vec<u8>,
    first: bool,
}

impl<'t> StreamDecoder<'t> {
    pub(super) fn new(tok: &'t Tokenizer) -> Self {
        StreamDecoder {
            tok,
            pending: Vec::new(),
            first: true,
        }
    }

    /// Adds one id; returns the text it completes (possibly empty). Unknown
    /// ids contribute nothing.
    pub fn push(&mut self, id: u32) -> String {
        let Some(mut bytes) = self.tok.token_bytes(id) else {
            return String::new();
        };
        if self.first {
            self.first = false;
            let strip = matches!(
                self.tok.piece_bytes(),
                PieceBytes::SentencePiece {
                    strip_first_space: true
                }
            );
            if strip && bytes.first() == Some(&b' ') {
                bytes.remove(0);
            }
        }
        self.pending.extend_from_slice(&bytes);
        self.drain_valid()
    }

    /// Flushes bytes that never completed a character, as U+FFFD (what a
    /// lossy decode of the whole sequence shows for them).
    pub fn finish(&mut self) -> String {
        let mut out = self.drain_valid();
        if !self.pending.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
        out
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
    if let Some(hex) = piece
        .strip_prefix("<0x")
        .and_then(|rest| rest.strip_suffix('>'))
    {
        if hex.len() == 2 {
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                return vec![b];
            }
        }
    }
    piece.replace('\u{2581}', " ").into_bytes()
}
