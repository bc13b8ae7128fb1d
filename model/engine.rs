//! Continuous batching: many sequences generating at once on one model.
//!
//! A loop of [`Engine::add`], [`Engine::cancel`] and [`Engine::step`]. Each
//! step admits waiting requests while the KV pool has pages for their
//! prompts, evaluates one prompt chunk of at most `prefill_chunk` tokens
//! (so a long prompt holds the others back one chunk per step at most),
//! and runs one decode pass over every sequence that is generating, each
//! row sampled by its own request's sampler. Finished sequences leave at
//! once and their pages return to the pool. When the pool runs dry mid
//! generation the newest sequence is preempted: its pages are freed and it
//! waits to be evaluated again (its prompt and tokens so far), its output
//! unchanged.
//!
//! The engine works in token ids; text (detokenizing, stop strings) is the
//! client's, which cancels a sequence when its text says stop.

use std::collections::VecDeque;

use crate::error::{Error, ErrorKind, Result};
use crate::model::generate::{beside, StopReason};
use crate::model::grammar::{Constraint, GrammarMatcher};
use crate::model::kv_pages::SeqId;
use crate::model::logprobs::{TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::model::runner::{Model, Output, Want};
use crate::model::sampling::{Sampler, SamplerConfig};

/// What one sequence asks for.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    /// Most tokens to generate (a stop token counts as one).
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Ids that end the sequence (usually the tokenizer's stop ids).
    pub stop_ids: Vec<u32>,
    /// Generate through the stop ids: they are never picked.
    pub ignore_eos: bool,
    /// `Some(k)`: each token comes with its log-probability and the `k`
    /// most likely alternatives (`k` at most [`MAX_TOP_LOGPROBS`]).
    pub logprobs: Option<usize>,
    /// Score the prompt too: an [`Event::PromptLogprobs`] comes before the
    /// first token, with `logprobs`' alternatives (none when it is `None`).
    /// With `max_tokens` 0 the request ends there, having generated nothing.
    pub echo_logprobs: bool,
    /// Structured output: every token is sampled on the host from logits
    /// the grammar has masked (see [`crate::model::grammar`]).
    pub constraint: Option<Constraint>,
}

/// Names a request for its whole life (a preempted sequence gets a new
/// [`SeqId`] in the model, never a new request id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a step did for one request.
#[derive(Debug)]
pub enum Event {
    /// The request's next token, with its log-probabilities when the
    /// request asks for them.
    Token(RequestId, u32, Option<TokenLogprobs>),
    /// The log-probabilities of the prompt's tokens but the first (which has
    /// no context to be predicted from), before the request's first token.
    PromptLogprobs(RequestId, Vec<TokenLogprobs>),
    /// The request is done (after its last `Token`, if any).
    Finished(RequestId, StopReason),
    /// The request cannot be served; it is gone.
    Failed(RequestId, Error),
}

/// How the engine schedules.
#[derive(Clone, Copy, Debug)]
pub struct EngineOptions {
    /// Most prompt tokens evaluated per step.
    pub prefill_chunk: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { prefill_chunk: 512 }
    }
}

/// A request in the engine.
struct Entry {
    id: RequestId,
    req: Request,
    sampler: Sampler,
    /// The request's grammar state (kept across a preemption, which
    /// re-evaluates tokens already accepted).
    grammar: Option<GrammarMatcher>,
    /// Tokens generated so far.
    out: Vec<u32>,
    /// The model's sequence, once admitted.
    seq: Option<SeqId>,
    /// Prompt (and, after a preemption, generated) tokens in the cache.
    evaluated: usize,
    /// With `echo_logprobs`, the prompt's scores so far: entry `j` is
    /// prompt token `j + 1`'s, from the logits of row `j`.
    prompt_scores: Vec<TokenLogprobs>,
    /// Steps its next device-chained decode runs when it is alone (see
    /// `Engine::decode_alone`).
    chunk: usize,
}

impl Entry {
    /// What the cache must hold before the next token is chosen: the
    /// prompt, and after a preemption the tokens generated but the last.
    fn context(&self) -> Vec<u32> {
        let mut c = self.req.prompt.clone();
        c.extend(self.out.iter().take(self.out.len().saturating_sub(1)));
        c
    }

    fn context_len(&self) -> usize {
        self.req.prompt.len() + self.out.len().saturating_sub(1)
    }

    /// Whether the prompt is still to be scored (every row's logits read).
    fn scoring(&self) -> bool {
        self.req.echo_logprobs && self.out.is_empty()
    }

    fn history(&self) -> Vec<u32> {
        let mut h = self.req.prompt.clone();
        h.extend(&self.out);
        h
    }

    /// Device argmax stands in for the sampler only when nothing would
    /// change or read the logits first (barred stop ids, log-probabilities).
    fn argmax_on_device(&self) -> bool {
        self.sampler.is_plain_argmax()
            && !self.req.ignore_eos
            && self.req.logprobs.is_none()
            && !self.req.echo_logprobs
    }

    /// Greedy with no grammar: the device's argmax picks.
    fn device_greedy(&self) -> bool {
        self.argmax_on_device() && self.grammar.is_none()
    }

    /// Greedy under a grammar: the device picks among the allowed ids (see
    /// [`Engine::decode_allowed`]).
    fn device_pick(&self) -> bool {
        self.argmax_on_device() && self.grammar.is_some()
    }

    /// The next token from `logits`, and its log-probabilities (from the
    /// logits as they come, before the stop ids are masked) when asked.
    fn pick(&mut self, logits: &mut [f32]) -> Result<(u32, Option<TokenLogprobs>)> {
        let raw = self.req.logprobs.map(|_| logits.to_vec());
        if self.req.ignore_eos {
            for &id in &self.req.stop_ids {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        if let Some(g) = self.grammar.as_mut() {
            g.mask(logits)?;
        }
        let history = self.history();
        let token = self.sampler.sample(logits, &history);
        if let Some(g) = self.grammar.as_mut() {
            g.accept(token)?;
        }
        let scores = raw
            .zip(self.req.logprobs)
            .map(|(l, k)| TokenLogprobs::of(&l, token, k));
        Ok((token, scores))
    }

    /// Scores prompt tokens `from + 1 ..` from the rows of `logits` fed at
    /// positions `from ..` (the row after the last prompt token predicts
    /// the first generated one and is left out).
    fn score_prompt(&mut self, from: usize, logits: &[f32], vocab: usize) {
        let k = self.req.logprobs.unwrap_or(0);
        // Evaluated again after a preemption: the rows recomputed replace
        // what was kept.
        self.prompt_scores.truncate(from);
        let prompt = &self.req.prompt;
        for (j, row) in (from..).zip(logits.chunks_exact(vocab)) {
            let Some(&next) = prompt.get(j + 1) else {
                break;
            };
            self.prompt_scores.push(TokenLogprobs::of(row, next, k));
        }
    }
}

/// Many requests generating at once on one model (see the module docs).
pub struct Engine {
    model: Model,
    opts: EngineOptions,
    next_id: u64,
    /// Not yet admitted, or preempted; first in, first admitted.
    waiting: VecDeque<Entry>,
    /// Admitted, in admission order: evaluating their context, or generating.
    running: Vec<Entry>,
    preemptions: u64,
}

impl Engine {
    pub fn new(model: Model, opts: EngineOptions) -> Result<Self> {
        if opts.prefill_chunk == 0 {
            return Err(Error::Invalid("prefill_chunk must be at least 1".into()));
        }
        Ok(Engine {
            model,
            opts,
            next_id: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    pub fn into_model(self) -> Model {
        self.model
    }

    /// Requests admitted (evaluating or generating).
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting for a place.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests preempted so far (pages ran out; evaluated again later).
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Whether nothing is left to do.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Queues a request; it joins the batch at a coming step. A request the
    /// model can never serve (empty prompt, ids outside the vocabulary, a
    /// prompt longer than the context) is refused here.
    pub fn add(&mut self, req: Request) -> Result<RequestId> {
        req.sampler.validate()?;
        if let Some(k) = req.logprobs.filter(|&k| k > MAX_TOP_LOGPROBS) {
            return Err(Error::Invalid(format!(
                "{k} top log-probabilities asked for; at most {MAX_TOP_LOGPROBS}"
            )));
        }
        if req.max_tokens == 0 && !req.echo_logprobs {
            return Err(Error::Invalid(
                "max_tokens 0 generates nothing; it is only for scoring a prompt".into(),
            ));
        }
        if req.constraint.is_some() && req.ignore_eos {
            return Err(Error::Invalid(
                "ignore_eos cannot be combined with a grammar, which ends generation with a stop token"
                    .into(),
            ));
        }
        let grammar = req
            .constraint
            .as_ref()
            .map(Constraint::matcher)
            .transpose()?;
        let m = &self.model;
        if req.prompt.is_empty() {
            return Err(Error::Invalid("the prompt is empty".into()));
        }
        m.check_ids(&req.prompt)?;
        if req.prompt.len() > m.capacity() {
            return Err(Error::Invalid(format!(
                "the prompt has {} tokens but the context holds only {}",
                req.prompt.len(),
                m.capacity()
            )));
        }
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.waiting.push_back(Entry {
            id,
            sampler: Sampler::new(req.sampler.clone()),
            grammar,
            req,
            out: Vec::new(),
            seq: None,
            evaluated: 0,
            prompt_scores: Vec::new(),
            chunk: 1,
        });
        Ok(id)
    }

    /// Ends a request now, wherever it is; its pages return to the pool.
    /// `false` when it is not in the engine (finished already, or unknown).
    pub fn cancel(&mut self, id: RequestId) -> Result<bool> {
        if let Some(i) = self.waiting.iter().position(|e| e.id == id) {
            self.waiting.remove(i);
            return Ok(true);
        }
        let Some(i) = self.running.iter().position(|e| e.id == id) else {
            return Ok(false);
        };
        let e = self.running.remove(i);
        self.release(&e)?;
        Ok(true)
    }

    /// Ends running request `i` with `err`; its pages return to the pool.
    fn fail(&mut self, i: usize, err: Error, events: &mut Vec<Event>) -> Result<()> {
        let e = self.running.remove(i);
        self.release(&e)?;
        events.push(Event::Failed(e.id, err));
        Ok(())
    }

    fn release(&mut self, e: &Entry) -> Result<()> {
        match e.seq {
            Some(seq) => self.model.free_sequence(seq),
            None => Ok(()),
        }
    }

    /// One step: admissions, a prompt chunk, a decode pass over every
    /// generating sequence. Returns what happened to each request.
    pub fn step(&mut self) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        self.admit(&mut events)?;
        self.prefill_chunk(&mut events)?;
        self.decode(&mut events)?;
        Ok(events)
    }

    /// Admits waiting requests, oldest first, while the batch has room and
    /// the pool has the pages their contexts need beyond what the running
    /// requests still need for theirs and their next step.
    fn admit(&mut self, events: &mut Vec<Event>) -> Result<()> {
        let page = self.model.page_len();
        let pages_for = |positions: usize| positions.div_ceil(page);
        let mut committed: usize = self
            .running
            .iter()
            .map(|e| pages_for(e.context_len() + 1 - e.evaluated.min(e.context_len())))
            .sum();
        while self.running.len() < self.model.max_sequences() {
            let Some(e) = self.waiting.front() else {
                break;
            };
            let spare = self.model.free_pages().saturating_sub(committed);
            let need = pages_for(e.context_len() + 1);
            if need > spare {
                if self.running.is_empty() {
                    let e = self.waiting.pop_front().ok_or_else(lost)?;
                    let msg = format!(
                        "a context of {} tokens needs {need} KV pages and the pool has {spare}",
                        e.context_len()
                    );
                    events.push(Event::Failed(e.id, Error::out_of_device_memory(msg)));
                    continue;
                }
                break;
            }
            let mut e = self.waiting.pop_front().ok_or_else(lost)?;
            let (seq, reused) = if e.scoring() {
                // Every prompt row's logits are needed: nothing is reused.
                (self.model.add_sequence_unshared(&e.context())?, 0)
            } else {
                self.model.add_sequence(&e.context())?
            };
            e.seq = Some(seq);
            e.evaluated = reused;
            committed += need;
            self.running.push(e);
        }
        Ok(())
    }

    /// Evaluates the next chunk of the oldest admitted request still
    /// evaluating its context; its last chunk yields its next token.
    fn prefill_chunk(&mut self, events: &mut Vec<Event>) -> Result<()> {
        let Some(i) = self
            .running
            .iter()
            .position(|e| e.evaluated < e.context_len())
        else {
            return Ok(());
        };
        let context = self.running[i].context();
        let from = self.running[i].evaluated;
        let to = context.len().min(from + self.opts.prefill_chunk);
        let last = to == context.len();
        let Some(seq) = self.running[i].seq else {
            return Err(lost());
        };
        // After a preemption the last generated token is fed by the next
        // decode step, as it would have been.
        let resumed = !self.running[i].out.is_empty();
        let scoring = self.running[i].scoring();
        let want = match () {
            _ if scoring => Want::AllLogits,
            _ if !last || resumed => Want::LastLogits,
            _ if self.running[i].device_greedy() => Want::Argmax,
            _ => Want::LastLogits,
        };
        match self.model.prefill(seq, &context[from..to], want) {
            Ok(out) => {
                let vocab = self.model.config().vocab;
                let e = &mut self.running[i];
                e.evaluated = to;
                if let (true, Output::Logits(l)) = (scoring, &out) {
                    e.score_prompt(from, l, vocab);
                }
                if last && !resumed {
                    if scoring {
                        let scores = std::mem::take(&mut e.prompt_scores);
                        events.push(Event::PromptLogprobs(e.id, scores));
                        if e.req.max_tokens == 0 {
                            return self.finish(i, StopReason::MaxTokens, events);
                        }
                    }
                    let picked = match out {
                        Output::Token(t) => Ok((t, None)),
                        Output::Logits(mut l) => {
                            let at = l.len().saturating_sub(vocab);
                            e.pick(&mut l[at..])
                        }
                    };
                    match picked {
                        Ok((token, scores)) => self.emit(i, token, scores, events)?,
                        Err(err) => self.fail(i, err, events)?,
                    }
                }
                Ok(())
            }
            Err(err) if err.kind() == ErrorKind::OutOfDeviceMemory && self.running.len() > 1 => {
                self.preempt_newest()
            }
            Err(err) => self.fail(i, err, events),
        }
    }

    /// One decode pass over every generating sequence.
    fn decode(&mut self, events: &mut Vec<Event>) -> Result<()> {
        loop {
            let rows: Vec<usize> = (0..self.running.len())
                .filter(|&i| {
                    let e = &self.running[i];
                    !e.out.is_empty() && e.evaluated == e.context_len()
                })
                .collect();
            if rows.is_empty() {
                return Ok(());
            }
            if let [i] = rows[..] {
                let lone = self.running.len() == 1 && self.waiting.is_empty();
                if lone && self.running[i].device_greedy() {
                    return self.decode_alone(events);
                }
                if lone && self.running[i].device_pick() {
                    return self.decode_allowed(events);
                }
            }
            let feed: Vec<(SeqId, u32)> = rows
                .iter()
                .filter_map(|&i| {
                    let e = &self.running[i];
                    Some((e.seq?, *e.out.last()?))
                })
                .collect();
            let greedy = rows.iter().all(|&i| self.running[i].device_greedy());
            let want = if greedy {
                Want::Argmax
            } else {
                Want::LastLogits
            };
            match decode_beside(&mut self.model, &mut self.running, &rows, &feed, want) {
                Ok(outs) => {
                    // Backwards: emitting may remove a finished row.
                    for (&i, out) in rows.iter().zip(outs).rev() {
                        let e = &mut self.running[i];
                        e.evaluated += 1;
                        let picked = match out {
                            Output::Token(t) => Ok((t, None)),
                            Output::Logits(mut l) => e.pick(&mut l),
                        };
                        match picked {
                            Ok((token, scores)) => self.emit(i, token, scores, events)?,
                            Err(err) => self.fail(i, err, events)?,
                        }
                    }
                    return Ok(());
                }
                Err(err)
                    if err.kind() == ErrorKind::OutOfDeviceMemory && self.running.len() > 1 =>
                {
                    self.preempt_newest()?;
                }
                Err(err) if err.kind() == ErrorKind::OutOfDeviceMemory => {
                    // Alone and still out of pages: it cannot go on.
                    return self.fail(rows[0], err, events);
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// The one running request, greedy and alone: several steps chained on
    /// the device (each step's argmax feeds the next) and read back once, as
    /// `generate` decodes, the chunk growing from 1 to [`ALONE_MAX_STEPS`]
    /// so the first tokens stream at once. Steps past a stop are dropped
    /// with the sequence; a request that arrives meanwhile joins after the
    /// chunk.
    fn decode_alone(&mut self, events: &mut Vec<Event>) -> Result<()> {
        let capacity = self.model.capacity();
        let e = &self.running[0];
        let (Some(seq), Some(&last)) = (e.seq, e.out.last()) else {
            return Err(lost());
        };
        let steps = e
            .chunk
            .min(e.req.max_tokens.saturating_sub(e.out.len()))
            .min(capacity.saturating_sub(e.evaluated))
            .max(1);
        let id = e.id;
        match self.model.decode_greedy_seq(seq, last, steps) {
            Ok(tokens) => {
                let e = &mut self.running[0];
                e.chunk = (e.chunk * 2).min(ALONE_MAX_STEPS);
                for token in tokens {
                    match self.running.first_mut() {
                        Some(e) if e.id == id => e.evaluated += 1,
                        _ => break,
                    }
                    self.emit(0, token, None, events)?;
                }
                Ok(())
            }
            Err(err) if err.kind() == ErrorKind::OutOfDeviceMemory => self.fail(0, err, events),
            Err(err) => Err(err),
        }
    }

    /// The one running request, greedy under a grammar and alone: the mask
    /// goes to the device and one id comes back, the mask computed beside
    /// the layers (as `generate` does).
    fn decode_allowed(&mut self, events: &mut Vec<Event>) -> Result<()> {
        let vocab = self.model.config().vocab;
        let Some(e) = self.running.first_mut() else {
            return Err(lost());
        };
        let (Some(seq), Some(&last), Some(g)) = (e.seq, e.out.last(), e.grammar.as_mut()) else {
            return Err(lost());
        };
        let model = &mut self.model;
        let (ran, words) = beside(
            || model.decode_kept_seq(seq, last),
            || g.allowed_words(vocab),
        );
        if let Err(err) = ran {
            return match err.kind() {
                ErrorKind::OutOfDeviceMemory => self.fail(0, err, events),
                _ => Err(err),
            };
        }
        // The grammar's failures end the request; the device's the engine.
        let words = match words {
            Ok(w) => w,
            Err(err) => return self.fail(0, err, events),
        };
        let token = match self.model.pick_allowed(&words) {
            Ok(t) => t,
            Err(err) if err.kind() == ErrorKind::InvalidInput => return self.fail(0, err, events),
            Err(err) => return Err(err),
        };
        let e = &mut self.running[0];
        e.evaluated += 1;
        // Taken now, as `Entry::pick` does: the grammar is always past the
        // last token out.
        let accepted = match e.grammar.as_mut() {
            Some(g) => g.accept(token),
            None => Err(lost()),
        };
        match accepted {
            Ok(()) => self.emit(0, token, None, events),
            Err(err) => self.fail(0, err, events),
        }
    }

    /// Gives running request `i` its next token and retires it when that
    /// ends it.
    fn emit(
        &mut self,
        i: usize,
        token: u32,
        scores: Option<TokenLogprobs>,
        events: &mut Vec<Event>,
    ) -> Result<()> {
        let capacity = self.model.capacity();
        let e = &mut self.running[i];
        e.out.push(token);
        events.push(Event::Token(e.id, token, scores));
        let reason = if !e.req.ignore_eos && e.req.stop_ids.contains(&token) {
            Some(StopReason::StopToken)
        } else if e.out.len() >= e.req.max_tokens {
            Some(StopReason::MaxTokens)
        } else if e.req.prompt.len() + e.out.len() > capacity {
            // The next step would feed a token past the context.
            Some(StopReason::ContextFull)
        } else {
            None
        };
        match reason {
            Some(r) => self.finish(i, r, events),
            None => Ok(()),
        }
    }

    /// Retires running request `i`: its pages return to the pool.
    fn finish(&mut self, i: usize, reason: StopReason, events: &mut Vec<Event>) -> Result<()> {
        let e = self.running.remove(i);
        self.release(&e)?;
        events.push(Event::Finished(e.id, reason));
        Ok(())
    }

    /// Frees the newest running request's pages and puts it first in line,
    /// to be evaluated again (prompt and tokens so far) when pages free up.
    fn preempt_newest(&mut self) -> Result<()> {
        let mut e = self.running.pop().ok_or_else(lost)?;
        self.release(&e)?;
        e.seq = None;
        e.evaluated = 0;
        self.waiting.push_front(e);
        self.preemptions += 1;
        Ok(())
    }
}

/// `model.decode_rows`, with the next masks of the rows' grammars
/// computed on another thread meanwhile (they depend only on the tokens
/// accepted so far), so their host time hides behind the pass. A mask that
/// fails here is computed again, and its error reported, when it is used.
fn decode_beside(
    model: &mut Model,
    running: &mut [Entry],
    rows: &[usize],
    feed: &[(SeqId, u32)],
    want: Want,
) -> Result<Vec<Output>> {
    let constrained: Vec<&mut GrammarMatcher> = running
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| rows.contains(i))
        .filter_map(|(_, e)| e.grammar.as_mut())
        .collect();
    if constrained.is_empty() {
        return model.decode_rows(feed, want);
    }
    // A mask that fails here fails again, with its message, when applied.
    let (decoded, _) = beside(
        || model.decode_rows(feed, want),
        move || {
            for g in constrained {
                let _ = g.prepare();
            }
            Ok(())
        },
    );
    decoded
}

/// Most steps [`Engine::decode_alone`] chains (`generate`'s default chunk).
const ALONE_MAX_STEPS: usize = crate::model::generate::DEFAULT_DECODE_CHUNK;

fn lost() -> Error {
    Error::Invalid("the engine lost track of a request".into())
}
