//! The model thread's loop: continuous batching over the jobs. New jobs
//! are taken without waiting whenever sequences run (a request joins the
//! batch at the next step; the engine admits in arrival order, so with
//! `--parallel 1` requests run one at a time, first come first served),
//! the engine steps, and each token becomes text for its job, with stop
//! strings, as `model::generate` does for one sequence. A job whose client
//! has gone (its receiver dropped) is cancelled before the next step, and
//! its KV pages return to the pool.

use crate::error::{Error, ErrorKind, Result};
use crate::model::engine::{self, Engine, Request, RequestId};
use crate::model::generate::StopReason;
use crate::model::logprobs::TokenLogprobs;
use crate::model::stop::StopMatcher;
use crate::model::tokenizer::{StreamDecoder, Tokenizer};
use crate::server::logprobs::Scored;
use crate::server::slots::Slots;
use crate::server::worker::{Event, Job};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::Receiver;
use tokio::sync::mpsc::UnboundedSender;

/// What a panic inside a step tells its requests.
const INTERNAL: &str = "internal error while generating";

/// A job the engine holds, and its text so far.
struct Active<'t> {
    events: UnboundedSender<Event>,
    tok: &'t Tokenizer,
    /// The prompt's first token, which its scores leave out.
    first: u32,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    stop_ids: &'t [u32],
    ignore_eos: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
}

impl<'t> Active<'t> {
    /// The text token `id` releases, its scores (when asked), and whether
    /// it reached a stop string (the text then ends just before it).
    fn token(&mut self, id: u32, scores: Option<TokenLogprobs>) -> (String, Vec<Scored>, bool) {
        self.completion_tokens += 1;
        // A stop token's own text, and so its scores, are left out.
        if !self.ignore_eos && self.stop_ids.contains(&id) {
            let (text, hit) = self.stops.push("");
            return (text, Vec::new(), hit);
        }
        let piece = self.decoder.push(id);
        let (text, hit) = self.stops.push(&piece);
        let scored = scores.iter().map(|s| Scored::of(self.tok, s)).collect();
        (text, scored, hit)
    }

    /// The prompt's tokens and scores, from the engine's (which start at
    /// its second token).
    fn prompt(&self, scores: &[TokenLogprobs]) -> Event {
        let first = Scored::first(self.tok, self.first);
        let rest = scores.iter().map(|s| Scored::of(self.tok, s));
        Event::Prompt(std::iter::once(first).chain(rest).collect())
    }

    /// What was held back (a partial character, a possible stop string's
    /// start), once generation has ended.
    fn tail(&mut self) -> String {
        let (mut text, hit) = self.stops.push(&self.decoder.finish());
        if !hit {
            text.push_str(&self.stops.finish());
        }
        text
    }

    fn done(&self, stop: StopReason) -> Event {
        Event::Done {
            stop,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
        }
    }
}

/// Last events, sent once `/health` counts the step that ended their jobs.
type Finals = Vec<(UnboundedSender<Event>, Event)>;

/// Serves jobs until every sender is dropped and nothing is left running.
/// `reload` loads the model afresh after a panic left it unusable.
pub fn run(
    mut engine: Engine,
    tok: &Tokenizer,
    jobs: &Receiver<Job>,
    slots: &Slots,
    reload: &dyn Fn() -> Result<Engine>,
) {
    let mut active: HashMap<RequestId, Active> = HashMap::new();
    loop {
        if active.is_empty() {
            // Idle: wait for work.
            match jobs.recv() {
                Ok(job) => take(&mut engine, tok, job, &mut active, slots),
                Err(_) => return,
            }
        }
        // Empty or disconnected: the running jobs go on either way.
        while let Ok(job) = jobs.try_recv() {
            take(&mut engine, tok, job, &mut active, slots);
        }
        let mut finals = Finals::new();
        let run = catch_unwind(AssertUnwindSafe(|| {
            cancel_gone(&mut engine, &mut active)?;
            let events = if active.is_empty() {
                Vec::new()
            } else {
                engine.step()?
            };
            // Before any text goes out: a client that has a token finds
            // itself counted.
            publish(slots, &engine);
            route(&mut engine, events, &mut active, &mut finals)
        }));
        // After a panic nothing about the model is known (a pass may be
        // half recorded): it is loaded afresh. After an error the engine
        // is as before the step, so its requests are cancelled.
        let (failure, mut in_doubt) = match run {
            Ok(Ok(())) => (None, false),
            Ok(Err(e)) => (Some((e.kind(), e.to_string())), false),
            Err(_) => (Some((ErrorKind::Device, INTERNAL.to_string())), true),
        };
        if let Some((kind, message)) = failure {
            for (id, a) in active.drain() {
                let message = message.clone();
                finals.push((a.events, Event::Failed { kind, message }));
                if !in_doubt {
                    let cancel = catch_unwind(AssertUnwindSafe(|| engine.cancel(id)));
                    in_doubt = !matches!(cancel, Ok(Ok(_)));
                }
            }
        }
        if in_doubt {
            // The old model's memory is released before the new one loads.
            drop(engine);
            engine = match reload() {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("error: the model could not be loaded again: {e}");
                    send(finals);
                    return;
                }
            };
        }
        publish(slots, &engine);
        send(finals);
    }
}

fn publish(slots: &Slots, engine: &Engine) {
    let free = engine.model().free_pages();
    slots.publish(engine.running(), engine.waiting(), free);
}

fn send(finals: Finals) {
    for (to, event) in finals {
        let _ = to.send(event);
    }
}

/// Queues `job` in the engine (or answers it, when the engine refuses it).
fn take<'t>(
    engine: &mut Engine,
    tok: &'t Tokenizer,
    job: Job,
    active: &mut HashMap<RequestId, Active<'t>>,
    slots: &Slots,
) {
    slots.taken();
    if job.events.is_closed() {
        return;
    }
    let prompt_tokens = job.prompt.len();
    let first = job.prompt.first().copied().unwrap_or_default();
    let req = Request {
        prompt: job.prompt,
        max_tokens: job.opts.max_tokens,
        sampler: job.opts.sampler,
        stop_ids: tok.stop_ids().to_vec(),
        ignore_eos: job.opts.ignore_eos,
        logprobs: job.ask.logprobs,
        echo_logprobs: job.ask.echo,
        constraint: job.opts.constraint,
    };
    match engine.add(req) {
        Ok(id) => {
            active.insert(
                id,
                Active {
                    events: job.events,
                    tok,
                    first,
                    decoder: tok.stream_decoder(),
                    stops: StopMatcher::new(&job.opts.stop),
                    stop_ids: tok.stop_ids(),
                    ignore_eos: job.opts.ignore_eos,
                    prompt_tokens,
                    completion_tokens: 0,
                },
            );
        }
        Err(e) => {
            let _ = job.events.send(failed(&e));
        }
    }
}

fn failed(e: &Error) -> Event {
    Event::Failed {
        kind: e.kind(),
        message: e.to_string(),
    }
}

/// Cancels the jobs whose clients have gone.
fn cancel_gone(engine: &mut Engine, active: &mut HashMap<RequestId, Active>) -> Result<()> {
    let gone: Vec<RequestId> = active
        .iter()
        .filter(|(_, a)| a.events.is_closed())
        .map(|(&id, _)| id)
        .collect();
    for id in gone {
        // Cancelled first: on an error the job is still there to fail.
        engine.cancel(id)?;
        active.remove(&id);
    }
    Ok(())
}

/// Turns a step's events into each job's text and end.
fn route(
    engine: &mut Engine,
    events: Vec<engine::Event>,
    active: &mut HashMap<RequestId, Active>,
    finals: &mut Finals,
) -> Result<()> {
    for event in events {
        match event {
            engine::Event::PromptLogprobs(id, scores) => {
                if let Some(a) = active.get(&id) {
                    // A client gone is noticed before the next step.
                    let _ = a.events.send(a.prompt(&scores));
                }
            }
            engine::Event::Token(id, token, scores) => {
                // Absent: ended earlier in this step (a stop string).
                let Some(a) = active.get_mut(&id) else {
                    continue;
                };
                let (text, scored, hit) = a.token(token, scores);
                let quiet = text.is_empty() && scored.is_empty();
                let sent = quiet || a.events.send(Event::Text(text, scored)).is_ok();
                if hit || !sent {
                    engine.cancel(id)?;
                    if let Some(a) = active.remove(&id).filter(|_| hit) {
                        let done = a.done(StopReason::StopString);
                        finals.push((a.events, done));
                    }
                }
            }
            engine::Event::Finished(id, stop) => {
                if let Some(mut a) = active.remove(&id) {
                    let tail = a.tail();
                    if !tail.is_empty() {
                        let _ = a.events.send(Event::Text(tail, Vec::new()));
                    }
                    let done = a.done(stop);
                    finals.push((a.events, done));
                }
            }
            engine::Event::Failed(id, e) => {
                if let Some(a) = active.remove(&id) {
                    finals.push((a.events, failed(&e)));
                }
            }
        }
    }
    Ok(())
}
