//! Tool calls in `/v1/chat/completions`: OpenAI's `tools`, `tool_choice`,
//! assistant `tool_calls` and `role: "tool"` messages turned into what a
//! chat template reads (as transformers' `apply_chat_template(tools=...)`
//! passes them), and the model's output parsed back into OpenAI
//! `tool_calls` in the format its template teaches: Hermes / Qwen
//! `<tool_call>{json}</tool_call>`, Llama 3.x's bare JSON object, or
//! gpt-oss's harmony `to=functions.NAME ... <|message|>{args}<|call|>`.
//!
//! `tool_choice` "required" or a named function is rendered like "auto"
//! and enforced with a grammar ([`call_grammar`]): sampling is constrained
//! so the reply is one or more calls (Hermes) or one call (Llama 3.x) in
//! the template's format, naming one of the offered tools (or the named
//! one) with arguments valid against its `parameters` schema. Harmony
//! replies are not enforced (the header and channel structure around the
//! call is left to the model).

use crate::model::grammar::GrammarSpec;
use crate::model::tokenizer::Tokenizer;
use crate::server::api::{ApiError, Content, Message};
use serde_json::{json, Map, Value};

/// How a template's model writes a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
    /// (Qwen 2.5 / 3, Hermes and the many templates copied from them).
    Hermes,
    /// The whole reply one JSON object, `{"name": ..., "parameters": {...}}`
    /// (Llama 3.1 / 3.2 / 3.3), optionally after `<|python_tag|>`.
    Llama3Json,
    /// gpt-oss's harmony messages: a header naming `to=functions.NAME`,
    /// then `<|message|>` and the arguments, ended by `<|call|>`.
    Harmony,
}

impl ToolFormat {
    /// The format `template` teaches, read from its text; `None` when it
    /// never mentions `tools` (it would drop them unseen). A template that
    /// reads tools in none of the known ways gets Hermes, the most common.
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if !template.contains("tools") {
            return None;
        }
        Some(
            if template.contains("<|channel|>") && template.contains("functions") {
                ToolFormat::Harmony
            } else if template.contains("<tool_call>") {
                ToolFormat::Hermes
            } else if template.contains("<|start_header_id|>")
                && template.contains("\"parameters\"")
            {
                ToolFormat::Llama3Json
            } else {
                ToolFormat::Hermes
            },
        )
    }
}

/// A call as OpenAI returns it; `arguments` is JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    fn new(name: &str, arguments: &Value) -> ToolCall {
        ToolCall {
            id: format!("call_{:016x}", rand::random::<u64>()),
            name: name.to_string(),
            // An object's text; a string argument is taken as that text.
            arguments: match arguments {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        }
    }

    /// The `tool_calls` entry of a message (`index` added when streamed).
    pub fn to_json(&self, index: Option<usize>) -> Value {
        let mut v = json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        });
        if let Some(i) = index {
            v["index"] = json!(i);
        }
        v
    }
}

/// A reply split into text and calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Parsed {
    /// What is not a call (a malformed call stays here, as written).
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// `text` parsed in `format`.
pub fn parse(format: ToolFormat, text: &str) -> Parsed {
    match format {
        ToolFormat::Hermes => parse_hermes(text),
        ToolFormat::Llama3Json => parse_llama3(text),
        ToolFormat::Harmony => parse_harmony(text),
    }
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";

/// `{"name": "...", "arguments"|"parameters": {...}}` as a call.
fn call_from_object(v: &Value) -> Option<ToolCall> {
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let args = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None => Value::Object(Map::new()),
        Some(a @ Value::Object(_)) => a.clone(),
        // Some models write the arguments as JSON text, as OpenAI sends them.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(a @ Value::Object(_)) => a,
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ToolCall::new(name, &args))
}

fn parse_hermes(text: &str) -> Parsed {
    let mut out = Parsed::default();
    let mut rest = text;
    while let Some(at) = rest.find(HERMES_OPEN) {
        out.content.push_str(&rest[..at]);
        let body_from = at + HERMES_OPEN.len();
        // An unclosed call (the reply ran out) is read to the end.
        let (body, next, raw_end) = match rest[body_from..].find(HERMES_CLOSE) {
            Some(end) => (
                &rest[body_from..body_from + end],
                body_from + end + HERMES_CLOSE.len(),
                body_from + end + HERMES_CLOSE.len(),
            ),
            None => (&rest[body_from..], rest.len(), rest.len()),
        };
        match serde_json::from_str::<Value>(body.trim())
            .ok()
            .as_ref()
            .and_then(call_from_object)
        {
            Some(call) => out.calls.push(call),
            None => out.content.push_str(&rest[at..raw_end]),
        }
        rest = &rest[next..];
    }
    out.content.push_str(rest);
    if !out.calls.is_empty() {
        out.content = out.content.trim().to_string();
    }
    out
}

const PYTHON_TAG: &str = "<|python_tag|>";

fn parse_llama3(text: &str) -> Parsed {
    let body = text.trim();
    let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim();
    let not_a_call = || Parsed {
        content: text.to_string(),
        calls: Vec::new(),
    };
    if !body.starts_with('{') {
        return not_a_call();
    }
    // One object, or several separated by `;` (Llama 3.2 does this).
    let mut calls = Vec::new();
    for v in serde_json::Deserializer::from_str(body).into_iter::<Value>() {
        match v.ok().as_ref().and_then(call_from_object) {
            Some(c) => calls.push(c),
            None => return not_a_call(),
        }
    }
    if calls.is_empty() {
        return not_a_call();
    }
    Parsed {
        content: String::new(),
        calls,
    }
}

const HARMONY_START: &str = "<|start|>";
const HARMONY_MESSAGE: &str = "<|message|>";
const HARMONY_ENDS: [&str; 3] = ["<|call|>", "<|end|>", "<|return|>"];

/// Harmony messages, each `[<|start|>]HEADER<|message|>BODY<end>`; the
/// reply's first lacks `<|start|>` (the prompt ends `<|start|>assistant`).
/// Messages whose header says `to=functions.NAME` are calls; the others
/// stay content as written.
fn parse_harmony(text: &str) -> Parsed {
    let mut out = Parsed::default();
    let mut rest = text;
    while !rest.is_empty() {
        let begin = rest.strip_prefix(HARMONY_START).unwrap_or(rest);
        let Some(m) = begin.find(HARMONY_MESSAGE) else {
            out.content.push_str(rest);
            break;
        };
        let header = &begin[..m];
        let body_from = m + HARMONY_MESSAGE.len();
        let (body_len, end_len) = HARMONY_ENDS
            .iter()
            .filter_map(|e| begin[body_from..].find(e).map(|at| (at, e.len())))
            .min()
            .unwrap_or((begin.len() - body_from, 0));
        // A later `<|start|>` before any end closes this message too.
        let (body_len, end_len) = match begin[body_from..body_from + body_len].find(HARMONY_START) {
            Some(at) => (at, 0),
            None => (body_len, end_len),
        };
        let body = &begin[body_from..body_from + body_len];
        let consumed = (rest.len() - begin.len()) + body_from + body_len + end_len;
        let call = harmony_recipient(header).and_then(|name| {
            let args = serde_json::from_str::<Value>(body.trim()).ok()?;
            args.is_object().then(|| ToolCall::new(name, &args))
        });
        match call {
            Some(c) => out.calls.push(c),
            None => out.content.push_str(&rest[..consumed]),
        }
        rest = &rest[consumed..];
    }
    out
}

/// NAME of `to=functions.NAME` in a harmony header.
fn harmony_recipient(header: &str) -> Option<&str> {
    let at = header.find("to=functions.")? + "to=functions.".len();
    let name = header[at..]
        .split(|c: char| c.is_whitespace() || c == '<')
        .next()?;
    (!name.is_empty()).then_some(name)
}

const HARMONY_OPENERS: [&str; 2] = ["to=functions.", "<|channel|>commentary"];

/// Where `text` may start a call: the first whole opener (`true`), else
/// the start of an opener that the next piece may complete (`false`),
/// else its end.
fn opener_at(text: &str, openers: &[&str]) -> (usize, bool) {
    if let Some(at) = openers.iter().filter_map(|o| text.find(o)).min() {
        return (at, true);
    }
    let partial = openers
        .iter()
        .filter_map(|o| {
            (1..o.len())
                .rev()
                .find(|&k| text.ends_with(&o[..k]))
                .map(|k| text.len() - k)
        })
        .min();
    (partial.unwrap_or(text.len()), false)
}

/// A streamed reply's text as it comes: what may be sent at once, and the
/// rest held back from where a call may begin. A Hermes call is released
/// as soon as it closes ([`ToolStream::take_calls`]); the other formats'
/// held text waits for the end of the reply and is parsed whole.
pub struct ToolStream {
    format: ToolFormat,
    /// Text not yet sent.
    held: String,
    /// A call has begun: text waits until it closes (Hermes) or the end.
    holding: bool,
    /// A Llama 3 reply that began as text: it holds no call.
    plain: bool,
    /// Calls closed and not yet taken.
    closed: Vec<ToolCall>,
    /// Calls released so far (taken or not): the next one's index.
    count: usize,
}

impl ToolStream {
    pub fn new(format: ToolFormat) -> ToolStream {
        ToolStream {
            format,
            held: String::new(),
            holding: false,
            plain: false,
            closed: Vec::new(),
            count: 0,
        }
    }

    /// Adds `piece`; returns the text that can be sent now.
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        let mut ready = String::new();
        loop {
            if self.holding {
                if self.format != ToolFormat::Hermes {
                    return ready;
                }
                // `held` starts with `<tool_call>`: release it once closed.
                let Some(end) = self.held.find(HERMES_CLOSE) else {
                    return ready;
                };
                let end = end + HERMES_CLOSE.len();
                let block: String = self.held.drain(..end).collect();
                let parsed = parse_hermes(&block);
                match parsed.calls.is_empty() {
                    true => ready.push_str(&block),
                    false => {
                        self.count += parsed.calls.len();
                        self.closed.extend(parsed.calls);
                    }
                }
                self.holding = false;
            }
            // Blank text after a call waits: it may separate two calls.
            if self.count > 0 && self.held.trim().is_empty() {
                return ready;
            }
            let (at, sure) = match self.format {
                _ if self.plain => (self.held.len(), false),
                ToolFormat::Llama3Json => {
                    let t = self.held.trim_start();
                    if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                        (0, true)
                    } else if t.is_empty() || PYTHON_TAG.starts_with(t) {
                        (0, false)
                    } else {
                        self.plain = true;
                        (self.held.len(), false)
                    }
                }
                ToolFormat::Hermes => opener_at(&self.held, &[HERMES_OPEN]),
                ToolFormat::Harmony => opener_at(&self.held, &HARMONY_OPENERS),
            };
            let before: String = self.held.drain(..at).collect();
            // Blank text between calls is not content.
            if !(self.count > 0 && sure && before.trim().is_empty()) {
                ready.push_str(&before);
            }
            self.holding = sure;
            if !sure {
                return ready;
            }
        }
    }

    /// The calls closed since the last take, each with its index in the
    /// reply.
    pub fn take_calls(&mut self) -> Vec<(usize, ToolCall)> {
        let first = self.count - self.closed.len();
        self.closed
            .drain(..)
            .enumerate()
            .map(|(i, c)| (first + i, c))
            .collect()
    }

    /// The reply has ended: what was held, parsed, its calls indexed after
    /// those released before (calls not taken included).
    pub fn finish(mut self) -> (Vec<(usize, ToolCall)>, String) {
        let mut calls = self.take_calls();
        if self.held.trim().is_empty() && self.count > 0 {
            return (calls, String::new());
        }
        let parsed = parse(self.format, &self.held);
        let first = self.count;
        calls.extend(
            parsed
                .calls
                .into_iter()
                .enumerate()
                .map(|(i, c)| (first + i, c)),
        );
        (calls, parsed.content)
    }
}

/// The checked `tools` of a request, as templates read them.
pub fn check_tools(tools: &[Value]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let bad = |what: &str| ApiError::invalid(format!("tools[{i}] {what}"), Some("tools"));
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("must have type \"function\""));
        }
        let name = t
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str);
        if name.is_none_or(str::is_empty) {
            return Err(bad("must have a function.name"));
        }
    }
    Ok(())
}

/// What `tool_choice` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

impl ToolChoice {
    /// `tool_choice` checked against `tools` (absent: "auto" with tools,
    /// as OpenAI does).
    pub fn read(choice: Option<&Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
        let bad = |m: String| ApiError::invalid(m, Some("tool_choice"));
        let choice = match choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(bad(format!(
                        "tool_choice '{other}' is not one of none, auto, required or a function"
                    )))
                }
            },
            Some(v) => match v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str)
            {
                Some(name) => ToolChoice::Named(name.to_string()),
                None => {
                    return Err(bad(
                        "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}"
                            .into(),
                    ))
                }
            },
        };
        match &choice {
            ToolChoice::Required if tools.is_empty() => {
                Err(bad("tool_choice 'required' needs tools".into()))
            }
            ToolChoice::Named(n) => {
                let known = tools.iter().any(|t| {
                    t.get("function")
                        .and_then(|f| f.get("name"))
                        .and_then(Value::as_str)
                        == Some(n)
                });
                if known {
                    Ok(choice)
                } else {
                    Err(bad(format!(
                        "tool_choice names '{n}', which is not in tools"
                    )))
                }
            }
            _ => Ok(choice),
        }
    }
}

/// Messages as a template reads them: content as text, assistant
/// `tool_calls` with `function.arguments` parsed into an object (OpenAI
/// sends JSON text; templates write it with `tojson`), `tool_call_id` and
/// `name` kept.
pub fn template_messages(messages: &[Message]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let bad =
            |what: String| ApiError::invalid(format!("messages[{i}] {what}"), Some("messages"));
        let content = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        _ => {
                            return Err(bad(format!(
                                "has content parts of type '{}', which are not supported",
                                p.kind
                            )))
                        }
                    }
                }
                text
            }
        };
        let mut v = json!({"role": m.role, "content": content});
        if let Some(calls) = &m.tool_calls {
            let mut rendered = Vec::with_capacity(calls.len());
            for (j, c) in calls.iter().enumerate() {
                let f = c.get("function");
                let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
                let Some(name) = name else {
                    return Err(bad(format!("tool_calls[{j}] has no function.name")));
                };
                let args = match f.and_then(|f| f.get("arguments")) {
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
                    Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                        bad(format!(
                            "tool_calls[{j}].function.arguments is not JSON: {e}"
                        ))
                    })?,
                    Some(other) => other.clone(),
                };
                let mut call = json!({
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                });
                if let Some(id) = c.get("id") {
                    call["id"] = id.clone();
                }
                rendered.push(call);
            }
            v["tool_calls"] = Value::Array(rendered);
        }
        if let Some(id) = &m.tool_call_id {
            v["tool_call_id"] = json!(id);
        }
        if let Some(name) = &m.name {
            v["name"] = json!(name);
        }
        out.push(v);
    }
    Ok(out)
}

/// A finished reply's `message` and `finish_reason`: with tools, calls
/// found in `text` become `tool_calls` (content null when nothing else
/// was said) and the reason "tool_calls".
pub fn chat_message(format: Option<ToolFormat>, text: &str, finish: &str) -> (Value, String) {
    let parsed = match format {
        Some(f) => parse(f, text),
        None => Parsed {
            content: text.to_string(),
            calls: Vec::new(),
        },
    };
    if parsed.calls.is_empty() {
        return (
            json!({"role": "assistant", "content": text}),
            finish.to_string(),
        );
    }
    let content = match parsed.content.trim() {
        "" => Value::Null,
        _ => json!(parsed.content),
    };
    let calls: Vec<Value> = parsed.calls.iter().map(|c| c.to_json(None)).collect();
    (
        json!({"role": "assistant", "content": content, "tool_calls": calls}),
        "tool_calls".to_string(),
    )
}

/// The streamed `delta` of `calls`, each whole (as OpenAI's first chunk
/// of a call carries its id and name) with its index in the reply.
pub fn calls_delta(calls: &[(usize, ToolCall)]) -> Value {
    let calls: Vec<Value> = calls.iter().map(|(i, c)| c.to_json(Some(*i))).collect();
    json!({"tool_calls": calls})
}

/// A chat request's prompt text, the format its replies are parsed in
/// (`None`: no tools offered, or `tool_choice` "none", which renders none),
/// and the grammar that enforces a call when `tool_choice` asks for one.
pub fn chat_prompt_text(
    tok: &Tokenizer,
    req: &crate::server::api::ChatRequest,
) -> Result<(String, Option<ToolFormat>, Option<GrammarSpec>), ApiError> {
    let tools = req.tools.as_deref().unwrap_or_default();
    check_tools(tools)?;
    let choice = ToolChoice::read(req.tool_choice.as_ref(), tools)?;
    if tools.is_empty() || choice == ToolChoice::None {
        let text = crate::server::api::chat_text(tok, &req.messages, None)?;
        return Ok((text, None, None));
    }
    let format = tok
        .chat_template()
        .and_then(ToolFormat::detect)
        .ok_or_else(|| {
            ApiError::invalid(
                "the model's chat template does not take tools",
                Some("tools"),
            )
        })?;
    let grammar = call_grammar(tok, format, &choice, tools)?;
    let text = crate::server::api::chat_text(tok, &req.messages, Some(tools))?;
    Ok((text, Some(format), grammar))
}

/// The grammar a reply must match for `choice`: `None` for "auto" and
/// "none" (unconstrained) and for harmony (not enforced). Hermes: one or
/// more `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
/// blocks joined by a newline, as Qwen3's template writes an assistant's
/// calls; Llama 3.x: the one object `{"name": ..., "parameters": {...}}`.
/// The JSON uses the templates' separators (`", "`, `": "`, no other
/// whitespace), the name is one of the allowed tools' (`anyOf` over them),
/// and the arguments follow that tool's `parameters` schema.
/// Every local `$ref` in `v` (`#` or `#/...`) prefixed with the JSON
/// pointer `at`, the place its schema moved to.
fn rebase_refs(v: &mut Value, at: &str) {
    match v {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                match item {
                    Value::String(r) if key == "$ref" && r.starts_with('#') => {
                        *r = format!("#{at}{}", &r[1..]);
                    }
                    _ => rebase_refs(item, at),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rebase_refs(item, at)),
        _ => {}
    }
}

pub fn call_grammar(
    tok: &Tokenizer,
    format: ToolFormat,
    choice: &ToolChoice,
    tools: &[Value],
) -> Result<Option<GrammarSpec>, ApiError> {
    let wanted: Option<&str> = match choice {
        ToolChoice::None | ToolChoice::Auto => return Ok(None),
        ToolChoice::Required => None,
        ToolChoice::Named(n) => Some(n.as_str()),
    };
    let args_key = match format {
        ToolFormat::Hermes => "arguments",
        ToolFormat::Llama3Json => "parameters",
        ToolFormat::Harmony => return Ok(None),
    };
    let mut alternatives = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let Some(f) = t.get("function") else { continue };
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            continue;
        };
        if wanted.is_some_and(|w| w != name) {
            continue;
        }
        let params = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p @ (Value::Object(_) | Value::Bool(_))) => p.clone(),
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("tools[{i}] function.parameters must be a JSON schema object"),
                    Some("tools"),
                ))
            }
        };
        let mut params = params;
        // The schema now sits inside the wrapper: its local references
        // (`#/$defs/...`, as pydantic writes them, or `#` itself) point
        // from the wrapper's root to where it moved.
        let at = format!("/anyOf/{}/properties/{args_key}", alternatives.len());
        rebase_refs(&mut params, &at);
        alternatives.push(json!({
            "type": "object",
            "properties": {"name": {"const": name}, args_key: params},
            "required": ["name", args_key],
            "additionalProperties": false,
        }));
    }
    let schema = json!({
        "anyOf": alternatives,
        // The separators `tojson` writes in the templates' own calls.
        "x-guidance": {
            "item_separator": ", ",
            "key_separator": ": ",
            "whitespace_flexible": false,
        },
    });
    Ok(Some(match format {
        ToolFormat::Hermes => {
            // Where the vocabulary marks `<tool_call>` special, the grammar
            // names the token (text can never spell a special token).
            let special = |piece: &str| {
                tok.special_ids()
                    .into_iter()
                    .any(|id| tok.id_to_piece(id).as_deref() == Some(piece))
            };
            let mark = |piece: &str| match special(piece) {
                true => piece.to_string(),
                false => format!("{piece:?}"),
            };
            GrammarSpec::Lark(format!(
                "start: tool_call (\"\\n\" tool_call)*\n\
                 tool_call: {open} \"\\n\" call_json \"\\n\" {close}\n\
                 call_json: %json {schema}\n",
                open = mark(HERMES_OPEN),
                close = mark(HERMES_CLOSE),
            ))
        }
        _ => GrammarSpec::JsonSchema(schema),
    }))
}
