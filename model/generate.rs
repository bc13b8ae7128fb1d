//! Text generation on top of [`Model`]: turning a prompt (plain text, a chat
//! turn, or ids) into token ids, and the decode loop with sampling, stop
//! tokens, streaming text and timings. The CLI is a thin shell over this.

use crate::error::{Error, Result};
use crate::model::chat::{render_chat, ChatMessage};
use crate::model::grammar::{Constraint, GrammarMatcher};
use crate::model::runner::{Model, Output, Want, MAX_DECODE_STEPS};
use crate::model::sampling::{Sampler, SamplerConfig};
use crate::model::stop::StopMatcher;
use crate::model::tokenizer::Tokenizer;
use std::ops::ControlFlow;
use std::time::Instant;

/// What to generate from.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    /// Plain text; BOS is added when the tokenizer says the model expects it.
    Text(&'a str),
    /// One user turn rendered with the model's chat template (optionally after
    /// a system message); the template writes its own special tokens, so no
    /// BOS is added (as transformers' `apply_chat_template` does).
    Chat {
        system: Option<&'a str>,
        user: &'a str,
    },
    /// Token ids, used verbatim.
    Ids(&'a [u32]),
}

/// Token ids written as `1,2,3` (the `--prompt-ids` flag): blanks around an
/// id and empty items are ignored, anything else that is not a `u32` is refused.
pub fn parse_token_ids(s: &str) -> Result<Vec<u32>> {
    let ids = s
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>().map_err(|_| {
                Error::Invalid(format!(
                    "'{t}' is not a token id (expected numbers like 1,2,3)"
                ))
            })
        })
        .collect::<Result<Vec<u32>>>()?;
    if ids.is_empty() {
        return Err(Error::Invalid("no token ids given".into()));
    }
    Ok(ids)
}

/// Token ids for `prompt`.
pub fn prompt_ids(tok: &Tokenizer, prompt: &Prompt) -> Result<Vec<u32>> {
    match *prompt {
        Prompt::Text(text) => tok.encode(text, tok.add_bos_by_default()),
        Prompt::Chat { system, user } => {
            let text = render_chat_prompt(tok, system, user)?;
            tok.encode(&text, false)
        }
        Prompt::Ids(ids) => Ok(ids.to_vec()),
    }
}

/// The chat template applied to an optional system message and one user
/// message, ending with the assistant's generation prompt.
pub fn render_chat_prompt(tok: &Tokenizer, system: Option<&str>, user: &str) -> Result<String> {
    let template = tok
        .chat_template()
        .ok_or_else(|| Error::Template("the model has no chat template".into()))?;
    let mut messages = Vec::with_capacity(2);
    if let Some(s) = system {
        messages.push(ChatMessage::new("system", s));
    }
    messages.push(ChatMessage::new("user", user));
    let piece = |id: Option<u32>| id.and_then(|i| tok.id_to_piece(i)).unwrap_or_default();
    render_chat(
        template,
        &messages,
        true,
        &piece(tok.bos_id()),
        &piece(tok.eos_id()),
    )
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate (a stop token counts as one).
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Greedy decoding: most steps run back to back on the device before
    /// their tokens are read (1 = a readback per token). Chunks grow from 1
    /// up to this, so the first tokens stream at once.
    pub decode_chunk: usize,
    /// Keep generating through end-of-sequence: the tokenizer's stop ids
    /// are barred (their logits set to minus infinity), as llama.cpp's
    /// `--ignore-eos` does.
    pub ignore_eos: bool,
    /// Generation ends when the text reaches one of these; the text ends
    /// just before it.
    pub stop: Vec<String>,
    /// Structured output: tokens the grammar forbids are masked out of
    /// every step's logits (the host samples each token, never the
    /// device's argmax), and generation ends with a stop token once the
    /// grammar is complete. Reaching `max_tokens` first leaves the output
    /// incomplete ([`StopReason::MaxTokens`]).
    pub constraint: Option<Constraint>,
}

/// Default [`GenerateOptions::decode_chunk`].
pub const DEFAULT_DECODE_CHUNK: usize = 16;

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 128,
            sampler: SamplerConfig::greedy(),
            decode_chunk: DEFAULT_DECODE_CHUNK,
            ignore_eos: false,
            stop: Vec::new(),
            constraint: None,
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced one of the tokenizer's stop ids.
    StopToken,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The KV cache is full.
    ContextFull,
    /// The text reached one of the stop strings (left out of the text).
    StopString,
    /// The callback asked to stop.
    Cancelled,
}

impl StopReason {
    /// The name `--json` output uses.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::StopToken => "stop_token",
            StopReason::MaxTokens => "max_tokens",
            StopReason::ContextFull => "context_full",
            StopReason::StopString => "stop_string",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// Wall-clock time of the prompt pass and of the one-token decode passes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens evaluated (the pass that also yields the first new token).
    pub prefill_tokens: usize,
    pub prefill_s: f64,
    /// One-token passes after the prompt (each yields one more token).
    pub decode_tokens: usize,
    pub decode_s: f64,
}

fn rate(tokens: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        tokens as f64 / secs
    } else {
        0.0
    }
}

impl Timings {
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_s)
    }
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decode_tokens, self.decode_s)
    }
}

#[derive(Clone, Debug)]
pub struct GenerateResult {
    /// Every generated id, the stop token included when there was one.
    pub tokens: Vec<u32>,
    /// The generated text (a stop token's own text left out).
    pub text: String,
    pub stop: StopReason,
    pub timings: Timings,
}

/// Generate after `prompt` from an empty cache (the model is reset first).
///
/// `on_token(id, text)` runs once per generated id with the text that id
/// completes (empty while a multi-byte character is still partial, or while
/// the text could still be the start of a stop string; for the last token,
/// whatever was still pending); returning `ControlFlow::Break` ends
/// generation after that token.
pub fn generate(
    model: &mut Model,
    tok: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32, &str) -> ControlFlow<()>,
) -> Result<GenerateResult> {
    model.reset();
    generate_cached(model, tok, prompt, 0, opts, on_token)
}

/// [`generate`] when the cache already holds `prompt[..cached]` (a
/// conversation's earlier turns): only the rest of the prompt is evaluated.
/// Afterwards the cache holds the prompt and every generated id but the last.
pub fn generate_cached(
    model: &mut Model,
    tok: &Tokenizer,
    prompt: &[u32],
    cached: usize,
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32, &str) -> ControlFlow<()>,
) -> Result<GenerateResult> {
    check_prompt(model, prompt)?;
    opts.sampler.validate()?;
    if cached >= prompt.len() {
        return Err(Error::Invalid(format!(
            "{cached} cached tokens leave nothing of the {}-token prompt to evaluate",
            prompt.len()
        )));
    }
    if opts.constraint.is_some() && opts.ignore_eos {
        return Err(Error::Invalid(
            "ignore_eos cannot be combined with a grammar, which ends generation with a stop token"
                .into(),
        ));
    }
    let mut grammar = opts
        .constraint
        .as_ref()
        .map(Constraint::matcher)
        .transpose()?;
    model.set_n_past(cached)?;
    let fresh = &prompt[cached..];
    let mut sampler = Sampler::new(opts.sampler.clone());
    // A grammar's mask is applied to logits on the host.
    let want = if sampler.is_plain_argmax() && grammar.is_none() {
        Want::Argmax
    } else {
        Want::LastLogits
    };
    // With --ignore-eos the prompt pass reads logits so stop ids can be
    // barred; later device-argmax steps that pick one are redone (see below).
    // A greedy pick under a grammar is made on the device: the host sends
    // the mask and reads one id instead of the logits.
    let pick_on_device = sampler.is_plain_argmax() && grammar.is_some();
    // Whether the grammar has yet to take the last token picked on the
    // device (it does so beside the next step's layers).
    let mut unaccepted = false;
    let first_want = if opts.ignore_eos {
        Want::LastLogits
    } else {
        want
    };
    let stop_ids = tok.stop_ids();
    let mut pick =
        |logits: Vec<f32>, history: &[u32], grammar: &mut Option<GrammarMatcher>| -> Result<u32> {
            let mut l = logits;
            if opts.ignore_eos {
                bar(&mut l, stop_ids);
            }
            if let Some(g) = grammar.as_mut() {
                g.mask(&mut l)?;
            }
            let id = sampler.sample(&l, history);
            if let Some(g) = grammar.as_mut() {
                g.accept(id)?;
            }
            Ok(id)
        };
    let mut history = prompt.to_vec();
    let mut decoder = tok.stream_decoder();
    let mut stops = StopMatcher::new(&opts.stop);
    let mut result = GenerateResult {
        tokens: Vec::new(),
        text: String::new(),
        stop: StopReason::MaxTokens,
        timings: Timings::default(),
    };
    let max_chunk = opts.decode_chunk.clamp(1, MAX_DECODE_STEPS);
    let mut chunk_len = 1;
    'outer: while result.tokens.len() < opts.max_tokens {
        let start = Instant::now();
        let chunk: Vec<u32> = match result.tokens.last() {
            None => vec![
                match forward_beside(model, fresh, first_want, &mut grammar)? {
                    Output::Token(t) => t,
                    Output::Logits(l) => pick(l, &history, &mut grammar)?,
                },
            ],
            Some(&prev) if want == Want::Argmax => {
                let room = model.capacity() - model.n_past();
                let steps = chunk_len
                    .min(opts.max_tokens - result.tokens.len())
                    .min(room);
                if steps == 0 {
                    result.stop = StopReason::ContextFull;
                    break;
                }
                chunk_len = (chunk_len * 2).min(max_chunk);
                let mut chunk = model.decode_greedy(prev, steps)?;
                if opts.ignore_eos {
                    redo_barred(model, &mut chunk, prev, stop_ids)?;
                }
                chunk
            }
            Some(&prev) if pick_on_device => {
                let id = pick_beside(model, prev, unaccepted, &mut grammar)?;
                unaccepted = true;
                vec![id]
            }
            Some(&prev) => match forward_beside(model, &[prev], want, &mut grammar)? {
                Output::Token(t) => vec![t],
                Output::Logits(l) => vec![pick(l, &history, &mut grammar)?],
            },
        };
        let secs = start.elapsed().as_secs_f64();
        if result.tokens.is_empty() {
            result.timings.prefill_tokens = fresh.len();
            result.timings.prefill_s = secs;
        } else {
            result.timings.decode_tokens += chunk.len();
            result.timings.decode_s += secs;
        }
        // The cache position after the chunk's first token, for a rewind
        // when the chunk is cut short.
        let chunk_base = model.n_past() + 1 - chunk.len();
        for (i, &id) in chunk.iter().enumerate() {
            result.tokens.push(id);
            history.push(id);
            let is_stop = !opts.ignore_eos && stop_ids.contains(&id);
            let full = chunk_base + i >= model.capacity();
            let ends = is_stop || full || result.tokens.len() == opts.max_tokens;
            let piece = if is_stop {
                String::new()
            } else {
                decoder.push(id)
            };
            let (mut text, hit) = stops.push(&piece);
            if ends && !hit {
                let (tail, tail_hit) = stops.push(&decoder.finish());
                text.push_str(&tail);
                if !tail_hit {
                    text.push_str(&stops.finish());
                }
            }
            result.text.push_str(&text);
            let stop = if on_token(id, &text).is_break() {
                Some(StopReason::Cancelled)
            } else if is_stop {
                Some(StopReason::StopToken)
            } else if hit {
                Some(StopReason::StopString)
            } else if full {
                Some(StopReason::ContextFull)
            } else {
                None
            };
            if let Some(reason) = stop {
                result.stop = reason;
                if i + 1 < chunk.len() {
                    // Steps past this token ran on the device; forget them.
                    model.set_n_past(chunk_base + i)?;
                }
                break 'outer;
            }
        }
    }
    Ok(result)
}

/// `model.forward`, with the grammar's mask for the logits it makes
/// computed on another thread meanwhile: the mask depends only on the
/// tokens accepted so far, so its host time hides behind the pass (on a
/// GPU, the host would otherwise wait for the device, then the device for
/// the mask).
fn forward_beside(
    model: &mut Model,
    ids: &[u32],
    want: Want,
    grammar: &mut Option<GrammarMatcher>,
) -> Result<Output> {
    let Some(g) = grammar.as_mut() else {
        return model.forward(ids, want);
    };
    let (out, prepared) = beside(|| model.forward(ids, want), || g.prepare());
    let out = out?;
    prepared?;
    Ok(out)
}

/// `pass` (the device's work) on this thread and `mask` (the grammar's, on
/// the host) on another meanwhile, so the host's time hides behind the
/// device's: both results.
pub(crate) fn beside<P, M: Send>(
    pass: impl FnOnce() -> P,
    mask: impl FnOnce() -> Result<M> + Send,
) -> (P, Result<M>) {
    std::thread::scope(|s| {
        let side = s.spawn(mask);
        let passed = pass();
        let masked = side.join().unwrap_or_else(|_| {
            Err(Error::Invalid(
                "the grammar's mask could not be computed".into(),
            ))
        });
        (passed, masked)
    })
}

/// A greedy step under a grammar: the layers run for `prev` while another
/// thread has the grammar take `prev` (when `unaccepted`) and computes the
/// mask; then the device picks the best allowed id.
fn pick_beside(
    model: &mut Model,
    prev: u32,
    unaccepted: bool,
    grammar: &mut Option<GrammarMatcher>,
) -> Result<u32> {
    let Some(g) = grammar.as_mut() else {
        return Err(Error::Invalid("a device pick needs a grammar".into()));
    };
    let vocab = model.config().vocab;
    let (ran, words) = beside(
        || model.decode_kept(prev),
        || {
            if unaccepted {
                g.accept(prev)?;
            }
            g.allowed_words(vocab)
        },
    );
    ran?;
    model.pick_allowed(&words?)
}

/// Sets the logits of `ids` to minus infinity, so they are never picked.
fn bar(logits: &mut [f32], ids: &[u32]) {
    for &id in ids {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// A device-argmax chunk (after `prev`) that picked a barred id: the step
/// that chose it is run again reading logits, the best allowed id replaces
/// it, and the steps after it (which followed the barred id) are dropped.
fn redo_barred(model: &mut Model, chunk: &mut Vec<u32>, prev: u32, barred: &[u32]) -> Result<()> {
    let Some(i) = chunk.iter().position(|t| barred.contains(t)) else {
        return Ok(());
    };
    let input = if i == 0 { prev } else { chunk[i - 1] };
    // The cache holds `prev` and the chunk's ids but the last, so `input`
    // sits `chunk.len() - i` positions from the end.
    let before_input = model.n_past() - (chunk.len() - i);
    model.set_n_past(before_input)?;
    let mut logits = model.logits(&[input])?;
    bar(&mut logits, barred);
    chunk.truncate(i);
    chunk.push(argmax(&logits));
    Ok(())
}

/// Index of the largest value (the first of ties, as the device's argmax).
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Clear errors for prompts `model` cannot take (empty, ids outside the
/// vocabulary, longer than the context), before any work is done.
pub fn check_prompt(model: &Model, prompt: &[u32]) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt is empty".into()));
    }
    let vocab = model.config().vocab;
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::Invalid(format!(
            "prompt token id {bad} is outside the model's vocabulary of {vocab} tokens"
        )));
    }
    if prompt.len() > model.capacity() {
        return Err(Error::Invalid(format!(
            "the prompt has {} tokens but the context holds only {}",
            prompt.len(),
            model.capacity()
        )));
    }
    Ok(())
}
