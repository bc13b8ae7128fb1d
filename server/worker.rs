//! The thread that owns the model: jobs are taken one at a time in the
//! order they arrived (a FIFO queue, so no client waits behind a later one),
//! and each streams its text back on its own channel. A job whose client
//! has gone (its receiver dropped) is skipped, or cancelled at the next token.

use crate::error::{Error, ErrorKind, Result};
use crate::model::generate::{GenerateOptions, StopReason};
use crate::model::session::Session;
use crate::model::tokenizer::Tokenizer;
use crate::model::{LoadOptions, Model};
use crate::open::{BackendChoice, CpuOptions};
use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use tokio::sync::mpsc::UnboundedSender;

/// What a job sends back: text pieces, then one `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    Text(String),
    Done {
        stop: StopReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    Failed {
        kind: ErrorKind,
        message: String,
    },
}

pub struct Job {
    pub prompt: Vec<u32>,
    pub opts: GenerateOptions,
    pub events: UnboundedSender<Event>,
}

/// What the server needs to know about the loaded model.
pub struct Ready {
    pub tokenizer: Arc<Tokenizer>,
    pub capacity: usize,
    pub vocab: usize,
    pub backend: String,
}

/// Where and how to load the model.
pub struct ModelSpec {
    pub path: PathBuf,
    pub backend: BackendChoice,
    /// Devices to split the model over by layer (empty: `backend` alone).
    pub devices: Vec<BackendChoice>,
    pub cpu: CpuOptions,
    pub load: LoadOptions,
}

/// Starts the model thread; returns once the model is loaded (or failed to
/// load). The thread ends when every job sender is dropped.
pub fn start(spec: ModelSpec) -> Result<(mpsc::Sender<Job>, Ready)> {
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Ready>>();
    std::thread::Builder::new()
        .name("vkllm-model".into())
        .spawn(move || {
            // The model lives on this thread, which serves its jobs in order.
            let loaded = load(&spec);
            match loaded {
                Ok((model, tok, ready)) => {
                    if ready_tx.send(Ok(ready)).is_ok() {
                        serve(model, &tok, job_rx);
                    }
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| Error::Invalid(format!("cannot start the model thread: {e}")))?;
    let ready = ready_rx
        .recv()
        .map_err(|_| Error::Invalid("the model thread ended while loading".into()))??;
    Ok((job_tx, ready))
}

fn load(spec: &ModelSpec) -> Result<(Model, Arc<Tokenizer>, Ready)> {
    let (bes, backend) = crate::open::open_backends(&spec.backend, &spec.devices, spec.cpu)?;
    let loaded = crate::open::load(bes, &spec.path, &spec.load, &mut |_, _| {})?;
    let tok = Arc::new(loaded.tokenizer?);
    let model = loaded.model;
    let ready = Ready {
        tokenizer: tok.clone(),
        capacity: model.capacity(),
        vocab: model.config().vocab,
        backend,
    };
    Ok((model, tok, ready))
}

fn serve(mut model: Model, tok: &Tokenizer, jobs: mpsc::Receiver<Job>) {
    // Consecutive requests of one conversation share their prefix.
    let mut session = Session::new();
    for job in jobs {
        if job.events.is_closed() {
            continue;
        }
        let events = &job.events;
        let mut on_token = |_: u32, text: &str| {
            if text.is_empty() || events.send(Event::Text(text.to_string())).is_ok() {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        };
        // A bug must not take the server down: the job fails, the cache is
        // forgotten, and the next job starts afresh.
        let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
            session.generate(&mut model, tok, &job.prompt, &job.opts, &mut on_token)
        }));
        let event = match run {
            Ok(Ok(res)) => Event::Done {
                stop: res.stop,
                prompt_tokens: job.prompt.len(),
                completion_tokens: res.tokens.len(),
            },
            Ok(Err(e)) => Event::Failed {
                kind: e.kind(),
                message: e.to_string(),
            },
            Err(_) => {
                session.reset();
                Event::Failed {
                    kind: ErrorKind::Device,
                    message: "internal error while generating".into(),
                }
            }
        };
        let _ = job.events.send(event);
    }
}
