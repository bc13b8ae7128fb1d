//! The thread that owns the model: it loads it for `--parallel` sequences
//! and runs the engine loop (`engine_loop`), which takes jobs as they
//! arrive and streams each one's text back on its own channel.

use crate::error::{Error, ErrorKind, Result};
use crate::model::engine::{Engine, EngineOptions};
use crate::model::generate::{GenerateOptions, StopReason};
use crate::model::source::ModelSource;
use crate::model::tokenizer::Tokenizer;
use crate::model::LoadOptions;
use crate::open::{open_backends, BackendChoice, CpuOptions};
use crate::server::logprobs::{Ask, Scored};
use crate::server::slots::Slots;
use crate::server::{engine_loop, sizing};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use tokio::sync::mpsc::UnboundedSender;

/// What a job sends back: the echoed prompt's scores (when asked), text
/// pieces, then one `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// The prompt's tokens and scores (the first token's none), when the
    /// job echoes its prompt.
    Prompt(Vec<Scored>),
    /// A piece of text, and the scores of the tokens that released it
    /// (when the job asks for them).
    Text(String, Vec<Scored>),
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
    pub ask: Ask,
    pub events: UnboundedSender<Event>,
}

/// What the server needs to know about the loaded model.
pub struct Ready {
    pub tokenizer: Arc<Tokenizer>,
    pub capacity: usize,
    pub vocab: usize,
    pub backend: String,
    /// The engine's load, for `/health`.
    pub slots: Arc<Slots>,
}

/// Where and how to load the model.
pub struct ModelSpec {
    pub path: PathBuf,
    pub backend: BackendChoice,
    /// Devices to split the model over by layer (empty: `backend` alone).
    pub devices: Vec<BackendChoice>,
    pub cpu: CpuOptions,
    pub load: LoadOptions,
    /// Sequences generating at once; `None`: [`sizing::default_parallel`].
    pub parallel: Option<usize>,
}

/// Starts the model thread; returns once the model is loaded (or failed to
/// load). The thread ends when every job sender is dropped.
pub fn start(spec: ModelSpec) -> Result<(mpsc::Sender<Job>, Ready)> {
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Ready>>();
    std::thread::Builder::new()
        .name("vkllm-model".into())
        .spawn(move || match open(&spec) {
            Ok((engine, tok, ready, load)) => {
                let slots = ready.slots.clone();
                if ready_tx.send(Ok(ready)).is_ok() {
                    let reload = || reload(&spec, &load);
                    engine_loop::run(engine, &tok, &job_rx, &slots, &reload);
                }
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|e| Error::Invalid(format!("cannot start the model thread: {e}")))?;
    let ready = ready_rx
        .recv()
        .map_err(|_| Error::Invalid("the model thread ended while loading".into()))??;
    Ok((job_tx, ready))
}

/// The engine, the tokenizer, what the server needs to know, and the load
/// options a reload repeats.
fn open(spec: &ModelSpec) -> Result<(Engine, Arc<Tokenizer>, Ready, LoadOptions)> {
    let src = ModelSource::open(&spec.path)?;
    // Before the weights load: a model without a tokenizer fails at once.
    let tok = Arc::new(src.tokenizer()?);
    let (bes, backend) = open_backends(&spec.backend, &spec.devices, spec.cpu)?;
    let parallel = match spec.parallel {
        Some(n) => n,
        None => sizing::default_parallel(&bes, &src.config()?, &spec.path, &spec.load),
    };
    let load = LoadOptions {
        sequences: Some(parallel),
        ..spec.load.clone()
    };
    let model = crate::open::load_source(bes, &src, &load, &mut |_, _| {})?;
    let ready = Ready {
        tokenizer: tok.clone(),
        capacity: model.capacity(),
        vocab: model.config().vocab,
        backend,
        slots: Arc::new(Slots::new(parallel, model.free_pages())),
    };
    let engine = Engine::new(model, EngineOptions::default())?;
    Ok((engine, tok, ready, load))
}

/// The model loaded afresh, as [`open`] loaded it (after a panic left the
/// old one in an unknown state).
fn reload(spec: &ModelSpec, load: &LoadOptions) -> Result<Engine> {
    let (bes, _) = open_backends(&spec.backend, &spec.devices, spec.cpu)?;
    let model = crate::open::load(bes, &spec.path, load, &mut |_, _| {})?.model;
    Engine::new(model, EngineOptions::default())
}
