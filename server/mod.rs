//! `vkllm serve`: an OpenAI-compatible HTTP server (axum on tokio).
//! `/v1/chat/completions` and `/v1/completions`, streamed over server-sent
//! events or not, `/v1/models`, `/health`, and a chat page at `/`. One model serves every client:
//! up to `--parallel` requests generate together, continuously batched
//! (a request joins at the next step); the rest wait in arrival order (see
//! `worker` and `engine_loop`).
//! API keys (`auth`) and bounds on what a client may ask (`limits`) are
//! the caller's to set.

pub mod api;
pub mod auth;
mod engine_loop;
pub mod limits;
pub mod logprobs;
pub mod sizing;
pub mod slots;
pub mod tools;
pub mod worker;

use crate::error::{ErrorKind, Result};
use api::{ApiError, Common};
use auth::ApiKeys;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use limits::{BoundedListener, Limits};
use logprobs::{Ask, Scored};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use worker::{Event, Job, Ready};

struct AppState {
    /// The FIFO queue to the model thread (`Sender` is `Sync`; the mutex
    /// keeps older toolchains' `!Sync` sender usable too).
    jobs: Mutex<mpsc::Sender<Job>>,
    ready: Ready,
    /// The name `/v1/models` lists and responses carry.
    model_name: String,
    next_id: AtomicU64,
    limits: Limits,
}

/// Who may use the server and how much one client may ask of it.
#[derive(Clone)]
pub struct ServerOptions {
    /// The model name `/v1/models` lists and responses carry.
    pub model_name: String,
    pub api_keys: ApiKeys,
    pub limits: Limits,
}

/// Serves the loaded model on `listener` until Ctrl-C or SIGTERM.
pub async fn serve(
    listener: tokio::net::TcpListener,
    jobs: mpsc::Sender<Job>,
    ready: Ready,
    opts: ServerOptions,
) -> Result<()> {
    let limits = opts.limits;
    let listener = BoundedListener::new(listener, limits.max_connections);
    let body_limit = DefaultBodyLimit::max(limits.max_body_bytes);
    let state = Arc::new(AppState {
        jobs: Mutex::new(jobs),
        ready,
        model_name: opts.model_name,
        next_id: AtomicU64::new(1),
        limits,
    });
    let mut api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/apply-template", post(apply_template))
        .fallback(not_found);
    if !opts.api_keys.is_empty() {
        // Unknown paths too: without a key, nothing is told of the API.
        let keys = Arc::new(opts.api_keys);
        api = api.layer(middleware::from_fn_with_state(keys, auth::require_key));
    }
    // The page is open even with API keys: a browser cannot send a bearer
    // token when it navigates, and the page holds nothing of the server's;
    // it asks for the key and sends it with every API call.
    let app = Router::new()
        .route("/", get(page))
        .route("/health", get(health))
        .merge(api)
        .layer(body_limit)
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| crate::Error::Invalid(format!("the server stopped: {e}")))
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Always open: load balancers read the slots to route requests.
async fn health(State(s): State<Arc<AppState>>) -> Json<Value> {
    let (slots, kv_pages) = s.ready.slots.to_json();
    Json(json!({"status": "ok", "slots": slots, "kv_pages": kv_pages}))
}

/// The chat page: one self-contained file, no external requests (the CSP
/// lets it reach only this server, and no one frame it).
async fn page() -> impl IntoResponse {
    use axum::http::header;
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
                 frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        include_str!("page.html"),
    )
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "vkllm",
    }]}))
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        ..ApiError::invalid("no such endpoint", None)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Chat or plain completion: the two endpoints' differing shapes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

/// The body, or why it could not be read (413 past `--max-body-bytes`).
fn read_body(
    s: &AppState,
    body: std::result::Result<Bytes, BytesRejection>,
) -> std::result::Result<Bytes, ApiError> {
    body.map_err(|e| {
        let message = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            format!(
                "the request body is larger than this server's limit of {} bytes",
                s.limits.max_body_bytes
            )
        } else {
            e.body_text()
        };
        ApiError {
            status: e.status(),
            ..ApiError::invalid(message, None)
        }
    })
}

async fn chat(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let run = || -> std::result::Result<Asked, ApiError> {
        let req: api::ChatRequest = api::parse(&read_body(&s, body)?)?;
        let ask = Ask::chat(&req)?;
        let tok = &s.ready.tokenizer;
        let (text, tools, tool_grammar) = tools::chat_prompt_text(tok, &req)?;
        let prompt = tok
            .encode(&text, false)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
        Ok(Asked {
            common: Common {
                tool_grammar,
                ..req.common
            },
            prompt,
            ask,
            prompt_text: String::new(),
            tools,
        })
    };
    match run() {
        Ok(asked) => respond(s, Kind::Chat, asked).await,
        Err(e) => e.into_response(),
    }
}

async fn completions(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let run = || -> std::result::Result<Asked, ApiError> {
        let req: api::CompletionRequest = api::parse(&read_body(&s, body)?)?;
        let ask = Ask::completion(&req)?;
        let tok = &s.ready.tokenizer;
        let prompt = api::completion_prompt(tok, &req.prompt)?;
        // Echoed, and where the completion's text offsets start.
        let prompt_text = match (&req.prompt, ask.echo || ask.logprobs.is_some()) {
            (_, false) => String::new(),
            (api::PromptField::Text(t), true) => t.clone(),
            (api::PromptField::Texts(v), true) if v.len() == 1 => v[0].clone(),
            (_, true) => tok
                .decode(&prompt)
                .map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")))?,
        };
        Ok(Asked {
            common: req.common,
            prompt,
            ask,
            prompt_text,
            tools: None,
        })
    };
    match run() {
        Ok(asked) => respond(s, Kind::Text, asked).await,
        Err(e) => e.into_response(),
    }
}

/// A request as read: its fields, prompt, and what it asks of log-probabilities.
struct Asked {
    common: Common,
    prompt: Vec<u32>,
    ask: Ask,
    /// A completion's prompt as text, when it echoes or scores it.
    prompt_text: String,
    /// How tool calls in the reply are parsed; `None` without tools.
    tools: Option<tools::ToolFormat>,
}

/// llama.cpp's `/apply-template`: a chat request's prompt as the template
/// renders it (tools included), without generating.
async fn apply_template(
    State(s): State<Arc<AppState>>,
    body: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    let run = || -> std::result::Result<Value, ApiError> {
        let req: api::ChatRequest = api::parse(&read_body(&s, body)?)?;
        let (text, _, _) = tools::chat_prompt_text(&s.ready.tokenizer, &req)?;
        Ok(json!({"prompt": text}))
    };
    match run() {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Queues the job and answers with one JSON object or an event stream.
async fn respond(s: Arc<AppState>, kind: Kind, asked: Asked) -> Response {
    let Asked {
        common,
        prompt,
        ask,
        prompt_text,
        tools,
    } = asked;
    let opts = match api::options(&common, &prompt, &s.ready, &s.limits, ask.echo) {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        prompt,
        opts,
        ask,
        events: tx,
    };
    // Counted before it is sent, so `/health` never misses it on its way.
    s.ready.slots.sent();
    let queued = s
        .jobs
        .lock()
        .map_err(|_| ())
        .and_then(|q| q.send(job).map_err(|_| ()));
    if queued.is_err() {
        s.ready.slots.taken();
        return failed(ErrorKind::Device, "the model thread has stopped".into()).into_response();
    }
    let n = s.next_id.fetch_add(1, Ordering::Relaxed);
    let meta = Meta {
        id: match kind {
            Kind::Chat => format!("chatcmpl-{n}"),
            Kind::Text => format!("cmpl-{n}"),
        },
        created: now(),
        model: s.model_name.clone(),
        kind,
        ask,
        prompt_text,
        tools,
    };
    if common.stream.unwrap_or(false) {
        let usage = common.stream_options.is_some_and(|o| o.include_usage);
        stream(meta, rx, usage).into_response()
    } else {
        collect(meta, rx).await
    }
}

/// What every response object of one request repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    ask: Ask,
    prompt_text: String,
    tools: Option<tools::ToolFormat>,
}

impl Meta {
    fn object(&self, streaming: bool) -> &'static str {
        match (self.kind, streaming) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    /// A response object around `choice` (its `index` is added).
    fn wrap(&self, streaming: bool, mut choice: Value, usage: Option<Value>) -> Value {
        choice["index"] = json!(0);
        let mut v = json!({
            "id": self.id,
            "object": self.object(streaming),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    fn text_choice(&self, text: &str, logprobs: Value, finish: Option<&str>) -> Value {
        json!({"text": text, "logprobs": logprobs, "finish_reason": finish})
    }

    /// Chat's `logprobs` over `scores`: null unless asked.
    fn chat_logprobs(&self, scores: &[Scored]) -> Value {
        match self.ask.logprobs {
            Some(_) => logprobs::chat_json(scores),
            None => Value::Null,
        }
    }

    /// The legacy `logprobs` over `scores` from text offset `offset`
    /// (null unless asked), and the offset past them.
    fn text_logprobs(&self, scores: &[Scored], offset: usize) -> (Value, usize) {
        match self.ask.logprobs {
            Some(_) => logprobs::legacy_json(scores, offset),
            None => (Value::Null, offset),
        }
    }

    /// Where the completion's text offsets start: after the prompt, which
    /// an echo sends first.
    fn first_offset(&self) -> usize {
        match self.ask.echo {
            true => 0,
            false => self.prompt_text.chars().count(),
        }
    }
}

fn finish_reason(stop: crate::model::generate::StopReason) -> &'static str {
    use crate::model::generate::StopReason;
    match stop {
        StopReason::MaxTokens | StopReason::ContextFull => "length",
        StopReason::StopToken | StopReason::StopString | StopReason::Cancelled => "stop",
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// A generation failure as an HTTP error: bad input is the client's fault
/// (400), everything else the server's (500).
fn failed(kind: ErrorKind, message: String) -> ApiError {
    let status = if kind == ErrorKind::InvalidInput {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    ApiError {
        status,
        ..ApiError::invalid(message, None)
    }
}

async fn collect(meta: Meta, mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Response {
    let mut text = String::new();
    let mut scores = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Prompt(p) => {
                text.insert_str(0, &meta.prompt_text);
                scores.splice(0..0, p);
            }
            Event::Text(t, s) => {
                text.push_str(&t);
                scores.extend(s);
            }
            Event::Done {
                stop,
                prompt_tokens,
                completion_tokens,
            } => {
                let finish = finish_reason(stop);
                let choice = match meta.kind {
                    Kind::Chat => {
                        let (message, finish) = tools::chat_message(meta.tools, &text, finish);
                        json!({
                            "message": message,
                            "logprobs": meta.chat_logprobs(&scores),
                            "finish_reason": finish,
                        })
                    }
                    Kind::Text => {
                        let (lp, _) = meta.text_logprobs(&scores, meta.first_offset());
                        meta.text_choice(&text, lp, Some(finish))
                    }
                };
                let u = usage(prompt_tokens, completion_tokens);
                return Json(meta.wrap(false, choice, Some(u))).into_response();
            }
            Event::Failed { kind, message } => return failed(kind, message).into_response(),
        }
    }
    failed(ErrorKind::Device, "the model thread has stopped".into()).into_response()
}

/// Server-sent events: a chunk per piece of text, a last chunk with the
/// finish reason, then `[DONE]`. A client that goes away drops the stream,
/// and with it the receiver: the model thread sees that and stops the job.
fn stream(
    meta: Meta,
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    include_usage: bool,
) -> Sse<impl tokio_stream::Stream<Item = std::result::Result<SseEvent, Infallible>>> {
    let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
    let first = match meta.kind {
        Kind::Chat => Some(data(meta.wrap(
            true,
            json!({"delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}),
            None,
        ))),
        Kind::Text => None,
    };
    let mut offset = meta.first_offset();
    // With tools, text from where a call may begin waits for the end (and
    // its log-probabilities with it).
    let mut calls = meta.tools.map(tools::ToolStream::new);
    let mut held_scores: Vec<Scored> = Vec::new();
    let mut called = false;
    let chunk = move |ev: Event| -> Option<std::result::Result<SseEvent, Infallible>> {
        Some(match ev {
            // Only completions echo.
            Event::Prompt(p) => {
                let (lp, next) = meta.text_logprobs(&p, offset);
                offset = next;
                data(meta.wrap(true, meta.text_choice(&meta.prompt_text, lp, None), None))
            }
            Event::Text(t, s) => data(match meta.kind {
                Kind::Chat => {
                    let mut delta = json!({"content": t});
                    let mut s = s;
                    if let Some(c) = calls.as_mut() {
                        held_scores.extend(s);
                        let shown = c.push(&t);
                        let closed = c.take_calls();
                        if shown.is_empty() && closed.is_empty() {
                            return None;
                        }
                        called |= !closed.is_empty();
                        delta = match closed.is_empty() {
                            true => json!({}),
                            false => tools::calls_delta(&closed),
                        };
                        if !shown.is_empty() {
                            delta["content"] = json!(shown);
                        }
                        s = std::mem::take(&mut held_scores);
                    }
                    meta.wrap(
                        true,
                        json!({"delta": delta, "logprobs": meta.chat_logprobs(&s), "finish_reason": null}),
                        None,
                    )
                }
                Kind::Text => {
                    let (lp, next) = meta.text_logprobs(&s, offset);
                    offset = next;
                    meta.wrap(true, meta.text_choice(&t, lp, None), None)
                }
            }),
            Event::Done {
                stop,
                prompt_tokens,
                completion_tokens,
            } => {
                let finish = finish_reason(stop);
                let u = include_usage.then(|| usage(prompt_tokens, completion_tokens));
                data(match meta.kind {
                    Kind::Chat => {
                        // What was held to the end, in the last chunk:
                        // its calls, then any text.
                        let (rest, text) = calls
                            .take()
                            .map(tools::ToolStream::finish)
                            .unwrap_or_default();
                        let mut delta = match rest.is_empty() {
                            true => json!({}),
                            false => tools::calls_delta(&rest),
                        };
                        if !text.is_empty() {
                            delta["content"] = json!(text);
                        }
                        let finish = match called || !rest.is_empty() {
                            true => "tool_calls",
                            false => finish,
                        };
                        let lp = match held_scores.is_empty() {
                            true => Value::Null,
                            false => meta.chat_logprobs(&held_scores),
                        };
                        meta.wrap(
                            true,
                            json!({"delta": delta, "logprobs": lp, "finish_reason": finish}),
                            u,
                        )
                    }
                    Kind::Text => {
                        meta.wrap(true, meta.text_choice("", Value::Null, Some(finish)), u)
                    }
                })
            }
            Event::Failed { kind, message } => data(failed(kind, message).body()),
        })
    };
    let done = tokio_stream::once(Ok(SseEvent::default().data("[DONE]")));
    let events = tokio_stream::iter(first)
        .chain(UnboundedReceiverStream::new(rx).filter_map(chunk))
        .chain(done);
    Sse::new(events).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    //! The chat response path with tools, fed scripted model output (a
    //! random test model never calls a tool): one JSON object and the
    //! event stream, as a client reads them.
    use super::*;
    use crate::model::generate::StopReason;

    fn meta() -> Meta {
        Meta {
            id: "chatcmpl-1".into(),
            created: 0,
            model: "m".into(),
            kind: Kind::Chat,
            ask: Ask {
                logprobs: None,
                echo: false,
            },
            prompt_text: String::new(),
            tools: Some(tools::ToolFormat::Hermes),
        }
    }

    /// `pieces` as the model thread would send them, then `Done`.
    fn scripted(pieces: &[&str]) -> tokio::sync::mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for p in pieces {
            tx.send(Event::Text(p.to_string(), Vec::new())).unwrap();
        }
        tx.send(Event::Done {
            stop: StopReason::StopToken,
            prompt_tokens: 10,
            completion_tokens: pieces.len(),
        })
        .unwrap();
        rx
    }

    async fn body(r: Response) -> String {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    const REPLY: [&str; 5] = [
        "I will check.",
        "\n<tool",
        "_call>\n{\"name\": \"get_weather\", ",
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
    ];

    #[test]
    fn tool_calls_come_back_in_openai_shapes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let v: Value =
                serde_json::from_str(&body(collect(meta(), scripted(&REPLY)).await).await).unwrap();
            let choice = &v["choices"][0];
            assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
            assert_eq!(choice["message"]["content"], "I will check.", "{v}");
            let calls = choice["message"]["tool_calls"].as_array().unwrap();
            assert_eq!(calls.len(), 2, "{v}");
            assert_eq!(calls[0]["function"]["name"], "get_weather");
            assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
            assert_eq!(calls[1]["function"]["arguments"], "{}");

            let sse = body(stream(meta(), scripted(&REPLY), true).into_response()).await;
            let chunks: Vec<Value> = sse
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .take_while(|d| *d != "[DONE]")
                .map(|d| serde_json::from_str(d).unwrap())
                .collect();
            assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
            let text: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            // The text before the first opener as it came, each call in
            // the chunk of the piece that closed it, the blank between
            // them left out.
            assert_eq!(text, "I will check.\n", "{sse}");
            let called: Vec<(u64, &str)> = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
                .flatten()
                .map(|c| {
                    assert_eq!(c["type"], "function");
                    assert!(c["id"].as_str().unwrap().starts_with("call_"));
                    (
                        c["index"].as_u64().unwrap(),
                        c["function"]["name"].as_str().unwrap(),
                    )
                })
                .collect();
            assert_eq!(called, vec![(0, "get_weather"), (1, "get_time")], "{sse}");
            let last = chunks.last().unwrap();
            assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{sse}");
            assert_eq!(last["usage"]["prompt_tokens"], 10, "{sse}");
            // Role, text, a chunk per call, the finish; none for the
            // pieces held back.
            assert_eq!(chunks.len(), 1 + 2 + 2 + 1, "{sse}");
        });
    }

    #[test]
    fn replies_without_calls_are_plain_text_with_tools_offered() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let pieces = ["Sunny, ", "<tool", "> 21 degrees"];
            let v: Value =
                serde_json::from_str(&body(collect(meta(), scripted(&pieces)).await).await)
                    .unwrap();
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
            assert_eq!(
                v["choices"][0]["message"],
                json!({"role": "assistant", "content": "Sunny, <tool> 21 degrees"})
            );
            let sse = body(stream(meta(), scripted(&pieces), false).into_response()).await;
            let text: String = sse
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .filter_map(|d| {
                    let c: Value = serde_json::from_str(d).unwrap();
                    c["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(String::from)
                })
                .collect();
            assert_eq!(text, "Sunny, <tool> 21 degrees", "{sse}");
        });
    }
}
