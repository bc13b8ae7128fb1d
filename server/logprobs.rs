//! Log-probabilities in OpenAI's two shapes: chat's
//! `{content: [{token, logprob, bytes, top_logprobs}]}` and the legacy
//! completions' `{tokens, token_logprobs, top_logprobs, text_offset}`.
//! The numbers are the engine's (`model::logprobs`): log-softmax of the
//! raw logits, before penalties and temperature.

use crate::model::logprobs::{TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::model::tokenizer::Tokenizer;
use crate::server::api::{ApiError, ChatRequest, CompletionRequest};
use serde_json::{json, Map, Value};

/// What a request asks for: `Some(k)`, each token's log-probability and
/// `k` alternatives; `echo`, the prompt (and its scores) before the text.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ask {
    pub logprobs: Option<usize>,
    pub echo: bool,
}

impl Ask {
    /// Chat's `logprobs` (bool) and `top_logprobs` (0 to 20, only with
    /// `logprobs`), as OpenAI checks them.
    pub fn chat(r: &ChatRequest) -> Result<Self, ApiError> {
        let top = bounded(r.top_logprobs, "top_logprobs")?;
        let logprobs = match (r.logprobs.unwrap_or(false), top) {
            (true, k) => Some(k.unwrap_or(0)),
            (false, None) => None,
            (false, Some(_)) => {
                return Err(ApiError::invalid(
                    "top_logprobs needs logprobs set to true",
                    Some("top_logprobs"),
                ))
            }
        };
        Ok(Ask {
            logprobs,
            echo: false,
        })
    }

    /// Completions' `logprobs` (0 to 20 alternatives) and `echo`.
    pub fn completion(r: &CompletionRequest) -> Result<Self, ApiError> {
        Ok(Ask {
            logprobs: bounded(r.logprobs, "logprobs")?,
            echo: r.echo.unwrap_or(false),
        })
    }
}

fn bounded(k: Option<u64>, field: &'static str) -> Result<Option<usize>, ApiError> {
    match k {
        Some(k) if k > MAX_TOP_LOGPROBS as u64 => Err(ApiError::invalid(
            format!("{field} is {k} but must be from 0 to {MAX_TOP_LOGPROBS}"),
            Some(field),
        )),
        k => Ok(k.map(|k| k as usize)),
    }
}

/// One token's scores with their text, as the model thread sends them.
#[derive(Clone, Debug)]
pub struct Scored {
    pub token: Piece,
    /// `None` for the prompt's first token (nothing predicts it).
    pub logprob: Option<f32>,
    pub top: Vec<(Piece, f32)>,
}

/// A token's text (lossy where it is part of a UTF-8 character) and bytes.
#[derive(Clone, Debug)]
pub struct Piece {
    pub text: String,
    pub bytes: Vec<u8>,
}

impl Piece {
    pub fn of(tok: &Tokenizer, id: u32) -> Self {
        let bytes = tok.token_bytes(id).unwrap_or_default();
        Piece {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
        }
    }
}

impl Scored {
    pub fn of(tok: &Tokenizer, t: &TokenLogprobs) -> Self {
        Scored {
            token: Piece::of(tok, t.token),
            logprob: Some(t.logprob),
            top: t
                .top
                .iter()
                .map(|&(id, lp)| (Piece::of(tok, id), lp))
                .collect(),
        }
    }

    /// A token nothing predicts (the prompt's first).
    pub fn first(tok: &Tokenizer, id: u32) -> Self {
        Scored {
            token: Piece::of(tok, id),
            logprob: None,
            top: Vec::new(),
        }
    }
}

/// A log-probability as JSON: `-inf` (a masked token) has no JSON number,
/// so it is given as the lowest finite one, as llama.cpp's server does.
fn number(lp: f32) -> Value {
    json!(lp.max(f32::MIN))
}

/// Chat's `logprobs` object over `scores`.
pub fn chat_json(scores: &[Scored]) -> Value {
    let content: Vec<Value> = scores
        .iter()
        .map(|s| {
            let top: Vec<Value> = s
                .top
                .iter()
                .map(|(p, lp)| json!({"token": p.text, "logprob": number(*lp), "bytes": p.bytes}))
                .collect();
            json!({
                "token": s.token.text,
                "logprob": s.logprob.map_or(Value::Null, number),
                "bytes": s.token.bytes,
                "top_logprobs": top,
            })
        })
        .collect();
    json!({ "content": content })
}

/// The legacy `logprobs` object over `scores`, whose text starts at
/// character `offset` of the prompt and completion; returns it and the
/// offset past it (the next chunk's start, when streaming).
pub fn legacy_json(scores: &[Scored], mut offset: usize) -> (Value, usize) {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top_logprobs = Vec::new();
    let mut text_offset = Vec::new();
    for s in scores {
        tokens.push(json!(s.token.text));
        token_logprobs.push(s.logprob.map_or(Value::Null, number));
        // The first prompt token has no alternatives: null, as OpenAI.
        top_logprobs.push(match s.logprob {
            None => Value::Null,
            Some(_) => {
                let m: Map<String, Value> = s
                    .top
                    .iter()
                    .map(|(p, lp)| (p.text.clone(), number(*lp)))
                    .collect();
                Value::Object(m)
            }
        });
        text_offset.push(json!(offset));
        offset += s.token.text.chars().count();
    }
    let v = json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    });
    (v, offset)
}
