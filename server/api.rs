//! OpenAI request bodies and their checks: what a request asks for becomes
//! a prompt and [`GenerateOptions`], or an [`ApiError`] naming the field.

use crate::model::chat::{render_chat_with, RenderOptions};
use crate::model::generate::GenerateOptions;
use crate::model::grammar::{Constraint, GrammarSpec};
use crate::model::sampling::SamplerConfig;
use crate::model::tokenizer::Tokenizer;
use crate::server::limits::Limits;
use crate::server::worker::Ready;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

/// An error as OpenAI returns it: a status and `{"error": {...}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param,
            code: None,
        }
    }

    /// The `error` object alone (also sent inside a broken stream).
    pub fn body(&self) -> serde_json::Value {
        let kind = if self.status.is_server_error() {
            "server_error"
        } else if self.status == StatusCode::NOT_FOUND {
            "not_found_error"
        } else {
            "invalid_request_error"
        };
        json!({"error": {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// A body parsed as `T`; serde's message says which field is wrong.
pub fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("the request body is not valid: {e}"), None))
}

/// `stop`: one string or a list of up to four.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Fields shared by both endpoints. Unknown fields are ignored, as clients
/// send many (`user`, `logit_bias`, ...) that change nothing here.
#[derive(Deserialize, Default)]
pub struct Common {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// llama.cpp's extensions, accepted by its server too.
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
    /// Structured output: `{"type": "text" | "json_object" | "json_schema"}`.
    pub response_format: Option<serde_json::Value>,
    /// Structured output: a grammar in llguidance's Lark syntax (not GBNF).
    pub grammar: Option<String>,
    /// The grammar a chat request's `tool_choice` ("required" or a named
    /// function) enforces (`tools::call_grammar`); never read from JSON.
    #[serde(skip)]
    pub tool_grammar: Option<GrammarSpec>,
}

#[derive(Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    /// OpenAI function tools and the choice among them (`tools.rs`).
    #[serde(default)]
    pub tools: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    pub tool_choice: Option<serde_json::Value>,
    #[serde(flatten)]
    pub common: Common,
}

#[derive(Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant's calls, fed back (`tools.rs`).
    #[serde(default)]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` message's answer to a call.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// Message content: a string, or parts of which only text is understood.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    /// Alternatives per token (0 to 20): each token's log-probability too.
    pub logprobs: Option<u64>,
    /// The prompt before the completion (scored when `logprobs` is set).
    pub echo: Option<bool>,
    #[serde(flatten)]
    pub common: Common,
}

/// `prompt`: a string, token ids, or a list holding one of those.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// The chat template over `messages`, tokenized (the template writes its
/// own special tokens, so no BOS is added).
pub fn chat_prompt(tok: &Tokenizer, messages: &[Message]) -> Result<Vec<u32>, ApiError> {
    let text = chat_text(tok, messages, None)?;
    tok.encode(&text, false)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))
}

/// The chat template over `messages` (and `tools`, when given), as text.
pub fn chat_text(
    tok: &Tokenizer,
    messages: &[Message],
    tools: Option<&[serde_json::Value]>,
) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let msgs = crate::server::tools::template_messages(messages)?;
    let template = tok.chat_template().ok_or_else(|| {
        ApiError::invalid("the model has no chat template; use /v1/completions", None)
    })?;
    let piece = |id: Option<u32>| id.and_then(|i| tok.id_to_piece(i)).unwrap_or_default();
    let (bos, eos) = (piece(tok.bos_id()), piece(tok.eos_id()));
    let opts = RenderOptions {
        add_generation_prompt: true,
        bos_token: &bos,
        eos_token: &eos,
        tools,
    };
    render_chat_with(template, &msgs, &opts)
        .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))
}

/// The ids of a completion prompt (BOS added when the model expects it).
pub fn completion_prompt(tok: &Tokenizer, prompt: &PromptField) -> Result<Vec<u32>, ApiError> {
    let text = |t: &str| {
        tok.encode(t, tok.add_bos_by_default())
            .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))
    };
    let one = || ApiError::invalid("only one prompt per request is supported", Some("prompt"));
    match prompt {
        PromptField::Text(t) => text(t),
        PromptField::Ids(ids) => Ok(ids.clone()),
        PromptField::Texts(v) if v.len() == 1 => text(&v[0]),
        PromptField::IdLists(v) if v.len() == 1 => Ok(v[0].clone()),
        _ => Err(one()),
    }
}

/// Checks the prompt fits the model and `limits`, and turns the sampling
/// fields into options. `scoring` (an echoed prompt) allows `max_tokens` 0.
pub fn options(
    c: &Common,
    prompt: &[u32],
    model: &Ready,
    limits: &Limits,
    scoring: bool,
) -> Result<GenerateOptions, ApiError> {
    let (capacity, vocab) = (model.capacity, model.vocab);
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty", Some("prompt")));
    }
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::invalid(
            format!("token id {bad} is outside the vocabulary of {vocab}"),
            Some("prompt"),
        ));
    }
    if prompt.len() >= capacity {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                format!(
                    "the prompt has {} tokens but the context holds {capacity}, with room for at least one more",
                    prompt.len()
                ),
                None,
            )
        });
    }
    // The same code as a full context: clients react to either by
    // shortening the prompt.
    if let Some(most) = limits.max_prompt_tokens.filter(|&m| prompt.len() > m) {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(
                format!(
                    "the prompt has {} tokens but this server takes at most {most}",
                    prompt.len()
                ),
                None,
            )
        });
    }
    if c.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("only n = 1 is supported", Some("n")));
    }
    let most = limits.max_completion_tokens;
    let max = match (c.max_completion_tokens, c.max_tokens) {
        (Some(n), _) | (None, Some(n)) if n == 0 && !scoring => {
            return Err(ApiError::invalid(
                "max_tokens must be at least 1",
                Some("max_tokens"),
            ))
        }
        (Some(n), _) | (None, Some(n)) if n > most as u64 => {
            let field = if c.max_completion_tokens.is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            return Err(ApiError::invalid(
                format!("{field} is {n} but this server allows at most {most}"),
                Some(field),
            ));
        }
        (Some(n), _) | (None, Some(n)) => usize::try_from(n).unwrap_or(most),
        // Until a stop, a full context or the server's bound.
        (None, None) => most,
    };
    let stop = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) if v.len() <= 4 => v.clone(),
        Some(Stop::Many(_)) => {
            return Err(ApiError::invalid("at most 4 stop sequences", Some("stop")))
        }
    };
    let d = SamplerConfig::default();
    let sampler = SamplerConfig {
        temperature: c.temperature.unwrap_or(d.temperature),
        top_k: c.top_k.unwrap_or(d.top_k),
        top_p: c.top_p.unwrap_or(d.top_p),
        min_p: c.min_p.unwrap_or(d.min_p),
        repeat_penalty: c.repeat_penalty.unwrap_or(d.repeat_penalty),
        repeat_last_n: d.repeat_last_n,
        // No seed: a different sample every time, as OpenAI does.
        seed: c.seed.unwrap_or_else(rand::random),
    };
    let bad = |field: &'static str, what: &str| {
        ApiError::invalid(format!("{field} must be {what}"), Some(field))
    };
    if !(sampler.temperature.is_finite() && sampler.temperature >= 0.0) {
        return Err(bad("temperature", "a number from 0"));
    }
    if !(0.0..=1.0).contains(&sampler.top_p) {
        return Err(bad("top_p", "from 0 to 1"));
    }
    if !(0.0..=1.0).contains(&sampler.min_p) {
        return Err(bad("min_p", "from 0 to 1"));
    }
    if !(sampler.repeat_penalty.is_finite() && sampler.repeat_penalty > 0.0) {
        return Err(bad("repeat_penalty", "above 0"));
    }
    sampler
        .validate()
        .map_err(|e| ApiError::invalid(e.to_string(), None))?;
    let ignore_eos = c.ignore_eos.unwrap_or(false);
    let constraint = constraint(c, &model.tokenizer)?;
    if constraint.is_some() && ignore_eos {
        return Err(ApiError::invalid(
            "ignore_eos cannot be combined with response_format, grammar or an enforced tool_choice",
            Some("ignore_eos"),
        ));
    }
    Ok(GenerateOptions {
        max_tokens: max,
        sampler,
        ignore_eos,
        stop,
        constraint,
        ..GenerateOptions::default()
    })
}

/// The grammar `response_format` or `grammar` asks for, compiled so a bad
/// schema is a 400 naming the field.
fn constraint(c: &Common, tok: &Tokenizer) -> Result<Option<Constraint>, ApiError> {
    let spec = match (&c.response_format, &c.grammar) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "give response_format or grammar, not both",
                Some("grammar"),
            ))
        }
        (None, Some(g)) => Some(("grammar", GrammarSpec::Lark(g.clone()))),
        (Some(f), None) => response_format(f)?.map(|s| ("response_format", s)),
        (None, None) => None,
    };
    let spec = match (spec, &c.tool_grammar) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "tool_choice \"required\" or a named function cannot be combined with response_format or grammar",
                Some("tool_choice"),
            ))
        }
        (None, Some(g)) => Some(("tools", g.clone())),
        (spec, None) => spec,
    };
    let Some((field, spec)) = spec else {
        return Ok(None);
    };
    Constraint::new(tok, spec)
        .map(Some)
        .map_err(|e| ApiError::invalid(e.to_string(), Some(field)))
}

/// OpenAI's `response_format` (and llama.cpp's `json_object` with a
/// `schema`); `text` is no constraint.
fn response_format(f: &serde_json::Value) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |m: &str| ApiError::invalid(m.to_string(), Some("response_format"));
    let kind = f
        .get("type")
        .and_then(|t| t.as_str())
        .ok_or_else(|| bad("response_format must be an object with a string type"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(match f.get("schema") {
            Some(schema) => GrammarSpec::JsonSchema(schema.clone()),
            None => GrammarSpec::JsonObject,
        })),
        "json_schema" => {
            let schema = f
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| bad("response_format json_schema needs json_schema.schema"))?;
            if !schema.is_object() && !schema.is_boolean() {
                return Err(bad(
                    "response_format json_schema.schema must be a JSON object",
                ));
            }
            Ok(Some(GrammarSpec::JsonSchema(schema.clone())))
        }
        other => Err(bad(&format!(
            "response_format type '{other}' is not one of text, json_object, json_schema"
        ))),
    }
}
