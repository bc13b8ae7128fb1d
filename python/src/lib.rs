//! `vkllm._vkllm`: the Python module (pyo3, abi3). A [`Model`] holds the
//! engine's model and tokenizer behind a mutex; every call that runs the
//! engine releases the GIL while it works, and a streaming call runs the
//! engine on a thread of its own, handing text pieces to a [`TextStream`]
//! through a channel.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use vkllm::model::chat::{render_chat, ChatMessage};
use vkllm::model::generate::{check_prompt, generate, GenerateOptions};
use vkllm::model::grammar::{Constraint, GrammarSpec};
use vkllm::model::sampling::{Sampler, SamplerConfig};
use vkllm::model::tokenizer::Tokenizer;
use vkllm::model::{LoadOptions, Output, SeqId, Want};
use vkllm::open::{BackendChoice, CpuOptions};
use vkllm::DType;

create_exception!(
    vkllm,
    VkllmError,
    PyException,
    "An engine failure: a bad file, prompt or option, or a device error. The message is the engine's own sentence."
);

/// The engine's error as a Python exception.
fn py_err(e: impl std::fmt::Display) -> PyErr {
    VkllmError::new_err(e.to_string())
}

/// What the mutex guards: everything a call needs to run the engine.
struct Engine {
    model: vkllm::model::Model,
    /// The tokenizer, or why there is none (the tiny test models are
    /// driven by token ids).
    tokenizer: Result<Tokenizer, String>,
}

impl Engine {
    fn tokenizer(&self) -> Result<&Tokenizer, String> {
        self.tokenizer
            .as_ref()
            .map_err(|why| format!("the model has no tokenizer: {why}"))
    }

    /// Token ids of `prompt`, as `vkllm generate` makes them.
    fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, String> {
        match prompt {
            Prompt::Ids(ids) => Ok(ids.clone()),
            Prompt::Text(text) => {
                let tok = self.tokenizer()?;
                tok.encode(text, tok.add_bos_by_default())
                    .map_err(|e| e.to_string())
            }
            Prompt::Chat(messages) => {
                let text = self.render(messages, true)?;
                // The template writes its own special tokens.
                self.tokenizer()?
                    .encode(&text, false)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// The chat template over `messages`.
    fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let tok = self.tokenizer()?;
        let template = tok
            .chat_template()
            .ok_or_else(|| "the model has no chat template".to_string())?;
        let piece = |id: Option<u32>| id.and_then(|i| tok.id_to_piece(i)).unwrap_or_default();
        render_chat(
            template,
            messages,
            add_generation_prompt,
            &piece(tok.bos_id()),
            &piece(tok.eos_id()),
        )
        .map_err(|e| e.to_string())
    }

    /// Generates after `prompt` from an empty cache, under `spec` when
    /// given; `on_piece` gets each non-empty piece of text and returns false
    /// to stop.
    fn generate(
        &mut self,
        prompt: &Prompt,
        opts: &GenerateOptions,
        spec: Option<&GrammarSpec>,
        on_piece: &mut dyn FnMut(&str) -> bool,
    ) -> Result<String, String> {
        let ids = self.prompt_ids(prompt)?;
        let tok = self
            .tokenizer
            .as_ref()
            .map_err(|why| format!("the model has no tokenizer: {why}"))?;
        let constrained;
        let opts = match spec {
            Some(spec) => {
                constrained = GenerateOptions {
                    constraint: Some(
                        Constraint::new(tok, spec.clone()).map_err(|e| e.to_string())?,
                    ),
                    ..opts.clone()
                };
                &constrained
            }
            None => opts,
        };
        let mut on_token = |_: u32, text: &str| {
            if text.is_empty() || on_piece(text) {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        };
        generate(&mut self.model, tok, &ids, opts, &mut on_token)
            .map(|r| r.text)
            .map_err(|e| e.to_string())
    }

    /// Token ids after `prompt` (no tokenizer needed): greedy on the device
    /// or sampled from the last logits, ending at `max_tokens`, a full
    /// context, or the tokenizer's stop ids when there is a tokenizer.
    fn generate_tokens(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        sampler: SamplerConfig,
    ) -> Result<Vec<u32>, String> {
        check_prompt(&self.model, prompt).map_err(|e| e.to_string())?;
        sampler.validate().map_err(|e| e.to_string())?;
        let mut sampler = Sampler::new(sampler);
        let want = if sampler.is_plain_argmax() {
            Want::Argmax
        } else {
            Want::LastLogits
        };
        let stop_ids: Vec<u32> = self
            .tokenizer
            .as_ref()
            .map(|t| t.stop_ids().to_vec())
            .unwrap_or_default();
        self.model.reset();
        let mut history = prompt.to_vec();
        let mut out = Vec::new();
        let mut input = prompt.to_vec();
        while out.len() < max_tokens {
            let id = match self
                .model
                .forward(&input, want)
                .map_err(|e| e.to_string())?
            {
                Output::Token(t) => t,
                Output::Logits(l) => sampler.sample(&l, &history),
            };
            out.push(id);
            history.push(id);
            if stop_ids.contains(&id) || self.model.n_past() >= self.model.capacity() {
                break;
            }
            input = vec![id];
        }
        Ok(out)
    }
}

impl Engine {
    /// Greedy ids after each of `prompts`, decoded together: groups of at
    /// most `sequences` (the load option) sequences, one pass a step for
    /// each group; each ends as [`Engine::generate_tokens`]'s does.
    fn generate_batch(
        &mut self,
        prompts: &[Vec<u32>],
        max_tokens: usize,
        sampler: SamplerConfig,
    ) -> Result<Vec<Vec<u32>>, String> {
        for p in prompts {
            check_prompt(&self.model, p).map_err(|e| e.to_string())?;
        }
        sampler.validate().map_err(|e| e.to_string())?;
        let stop_ids: Vec<u32> = self
            .tokenizer
            .as_ref()
            .map(|t| t.stop_ids().to_vec())
            .unwrap_or_default();
        let group = self.model.max_sequences().max(1);
        let mut outs = Vec::with_capacity(prompts.len());
        for (g, chunk) in prompts.chunks(group).enumerate() {
            // Prompt i draws with seed + i, as `generate_tokens` would alone.
            let samplers = (0..chunk.len())
                .map(|i| {
                    Sampler::new(SamplerConfig {
                        seed: sampler.seed.wrapping_add((g * group + i) as u64),
                        ..sampler.clone()
                    })
                })
                .collect();
            let mut seqs = Vec::with_capacity(chunk.len());
            let res = self.batch_group(chunk, max_tokens, samplers, &stop_ids, &mut seqs);
            // The sequences end whatever happened, so the pool stays usable.
            for seq in seqs {
                let _ = self.model.free_sequence(seq);
            }
            outs.extend(res.map_err(|e| e.to_string())?);
        }
        Ok(outs)
    }

    fn batch_group(
        &mut self,
        prompts: &[Vec<u32>],
        max_tokens: usize,
        mut samplers: Vec<Sampler>,
        stop_ids: &[u32],
        seqs: &mut Vec<SeqId>,
    ) -> vkllm::Result<Vec<Vec<u32>>> {
        let mut outs = vec![Vec::new(); prompts.len()];
        if max_tokens == 0 {
            return Ok(outs);
        }
        // Greedy picks on the device; otherwise each row's logits come back
        // for its own sampler, which sees its prompt and output so far.
        let device = samplers.iter().all(Sampler::is_plain_argmax);
        let want = if device {
            Want::Argmax
        } else {
            Want::LastLogits
        };
        let mut pick = |i: usize, out: Output, outs: &[Vec<u32>]| match out {
            Output::Token(t) => t,
            Output::Logits(l) => {
                let history: Vec<u32> = prompts[i].iter().chain(&outs[i]).copied().collect();
                samplers[i].sample(&l, &history)
            }
        };
        let capacity = self.model.capacity();
        // (prompt index, its sequence, its last token) of the unfinished.
        let mut live = Vec::with_capacity(prompts.len());
        for (i, p) in prompts.iter().enumerate() {
            let (seq, reused) = self.model.add_sequence(p)?;
            seqs.push(seq);
            // add_sequence leaves at least the last prompt id to evaluate.
            let rest = p.get(reused..).filter(|r| !r.is_empty()).ok_or_else(|| {
                vkllm::Error::Invalid(format!(
                    "{reused} reused positions leave nothing of a {}-token prompt to evaluate",
                    p.len()
                ))
            })?;
            let t = pick(i, self.model.prefill(seq, rest, want)?, &outs);
            outs[i].push(t);
            if outs[i].len() < max_tokens
                && !stop_ids.contains(&t)
                && self.model.sequence_len(seq)? < capacity
            {
                live.push((i, seq, t));
            }
        }
        while !live.is_empty() {
            let rows: Vec<(SeqId, u32)> = live.iter().map(|&(_, s, t)| (s, t)).collect();
            let next = self.model.decode_rows(&rows, want)?;
            let mut still = Vec::with_capacity(live.len());
            for (&(i, seq, _), out) in live.iter().zip(next) {
                let t = pick(i, out, &outs);
                outs[i].push(t);
                if outs[i].len() < max_tokens
                    && !stop_ids.contains(&t)
                    && self.model.sequence_len(seq)? < capacity
                {
                    still.push((i, seq, t));
                }
            }
            live = still;
        }
        Ok(outs)
    }
}

/// What to generate after.
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Chat(Vec<ChatMessage>),
}

#[derive(FromPyObject)]
enum PromptArg {
    Text(String),
    Ids(Vec<u32>),
}

impl From<PromptArg> for Prompt {
    fn from(p: PromptArg) -> Self {
        match p {
            PromptArg::Text(t) => Prompt::Text(t),
            PromptArg::Ids(i) => Prompt::Ids(i),
        }
    }
}

/// `[{"role": ..., "content": ...}, ...]` as chat messages.
fn chat_messages(messages: &Bound<'_, PyAny>) -> PyResult<Vec<ChatMessage>> {
    let mut out = Vec::new();
    for (i, msg) in messages.try_iter()?.enumerate() {
        let msg = msg?;
        let field = |name: &str| -> PyResult<String> {
            msg.get_item(name)
                .and_then(|v| v.extract::<String>())
                .map_err(|_| {
                    py_err(format!(
                        "message {i} needs a string '{name}' (messages are dicts with 'role' and 'content')"
                    ))
                })
        };
        out.push(ChatMessage::new(field("role")?, field("content")?));
    }
    Ok(out)
}

/// A model loaded onto a backend, with its tokenizer.
#[pyclass(module = "vkllm", frozen)]
struct Model {
    engine: Arc<Mutex<Engine>>,
    backend: String,
    n_vocab: usize,
    n_ctx: usize,
}

/// The structured output a call asks for: at most one of `json_schema` (a
/// dict, or JSON text), `json_object`, `grammar` (llguidance's Lark syntax)
/// and `regex`.
fn grammar_spec(
    json_schema: Option<&Bound<'_, PyAny>>,
    json_object: bool,
    grammar: Option<String>,
    regex: Option<String>,
) -> PyResult<Option<GrammarSpec>> {
    let schema: Option<String> = match json_schema {
        None => None,
        Some(s) => Some(match s.extract::<String>() {
            Ok(text) => text,
            Err(_) => s
                .py()
                .import("json")?
                .call_method1("dumps", (s,))
                .map_err(|e| py_err(format!("json_schema is not JSON: {e}")))?
                .extract()?,
        }),
    };
    GrammarSpec::from_options(
        schema.as_deref(),
        json_object,
        grammar.as_deref(),
        regex.as_deref(),
    )
    .map_err(py_err)
}

/// Locks the engine; a panic in an earlier call leaves it unusable.
fn lock(engine: &Mutex<Engine>) -> Result<MutexGuard<'_, Engine>, String> {
    engine
        .lock()
        .map_err(|_| "the model is unusable: an earlier call failed inside vkllm".to_string())
}

#[allow(clippy::too_many_arguments)]
fn generate_options(
    max_tokens: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    repeat_penalty: f32,
    repeat_last_n: usize,
    seed: Option<u64>,
    stop: Option<Vec<String>>,
    ignore_eos: bool,
) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampler: sampler_config(
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            seed,
        ),
        ignore_eos,
        stop: stop.unwrap_or_default(),
        ..GenerateOptions::default()
    }
}

fn sampler_config(
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    repeat_penalty: f32,
    repeat_last_n: usize,
    seed: Option<u64>,
) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        repeat_penalty,
        repeat_last_n,
        seed: seed.unwrap_or(SamplerConfig::default().seed),
    }
}

impl Model {
    /// Runs generation: the whole text, or a [`TextStream`] fed by a thread.
    fn run(
        &self,
        py: Python<'_>,
        prompt: Prompt,
        opts: GenerateOptions,
        spec: Option<GrammarSpec>,
        stream: bool,
    ) -> PyResult<PyObject> {
        if !stream {
            let engine = Arc::clone(&self.engine);
            let text = py
                .allow_threads(move || {
                    lock(&engine)?.generate(&prompt, &opts, spec.as_ref(), &mut |_| true)
                })
                .map_err(py_err)?;
            return Ok(text.into_pyobject(py)?.into_any().unbind());
        }
        // Unbounded, so the engine never waits on a reader: a stream left
        // unread cannot block the next call, which waits for the lock.
        let (tx, rx) = mpsc::channel::<Result<String, String>>();
        let engine = Arc::clone(&self.engine);
        std::thread::Builder::new()
            .name("vkllm-generate".into())
            .spawn(move || {
                let run = std::panic::AssertUnwindSafe(|| {
                    lock(&engine).and_then(|mut e| {
                        // A dropped stream ends generation.
                        e.generate(&prompt, &opts, spec.as_ref(), &mut |piece| {
                            tx.send(Ok(piece.to_string())).is_ok()
                        })
                    })
                });
                // A panic must reach the reader as an error, not as the
                // stream's quiet end.
                let res = std::panic::catch_unwind(run).unwrap_or_else(|_| {
                    Err("internal error (a bug in vkllm) while generating".to_string())
                });
                if let Err(why) = res {
                    let _ = tx.send(Err(why));
                }
            })
            .map_err(|e| py_err(format!("cannot start the generation thread: {e}")))?;
        let s = TextStream {
            rx: Mutex::new(Some(rx)),
        };
        Ok(Bound::new(py, s)?.into_any().unbind())
    }
}

#[pymethods]
impl Model {
    /// Loads a GGUF file or a Hugging Face directory.
    #[new]
    #[pyo3(signature = (path, backend = "auto", context = None, threads = None, kv_cache = None, sequences = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        backend: &str,
        context: Option<usize>,
        threads: Option<usize>,
        kv_cache: Option<&str>,
        sequences: Option<usize>,
    ) -> PyResult<Self> {
        let choice: BackendChoice = backend.parse().map_err(py_err)?;
        let kv_cache = match kv_cache {
            None => None,
            Some("f16") => Some(DType::F16),
            Some("f32") => Some(DType::F32),
            Some(other) => {
                return Err(py_err(format!(
                    "unknown kv_cache '{other}': expected f16 or f32"
                )))
            }
        };
        let (engine, backend) = py
            .allow_threads(move || -> vkllm::Result<_> {
                let cpu = CpuOptions {
                    threads: threads.filter(|&t| t > 0),
                    ..CpuOptions::default()
                };
                let (be, name) = vkllm::open::open_backend(&choice, cpu)?;
                let opts = LoadOptions {
                    context: context.filter(|&c| c > 0),
                    kv_cache,
                    sequences: sequences.filter(|&n| n > 0),
                    ..LoadOptions::default()
                };
                let loaded = vkllm::open::load(vec![be], &path, &opts, &mut |_, _| {})?;
                let engine = Engine {
                    model: loaded.model,
                    tokenizer: loaded.tokenizer.map_err(|e| e.to_string()),
                };
                Ok((engine, name))
            })
            .map_err(py_err)?;
        Ok(Model {
            n_vocab: engine.model.config().vocab,
            n_ctx: engine.model.capacity(),
            engine: Arc::new(Mutex::new(engine)),
            backend,
        })
    }

    /// The backend in use, e.g. `cpu (avx2+fma, 2 threads)`.
    #[getter]
    fn backend(&self) -> &str {
        &self.backend
    }

    /// Vocabulary size (the length of a row of logits).
    #[getter]
    fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Positions the KV cache holds.
    #[getter]
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// The model's chat template, or None.
    #[getter]
    fn chat_template(&self) -> PyResult<Option<String>> {
        let e = lock(&self.engine).map_err(py_err)?;
        Ok(e.tokenizer
            .as_ref()
            .ok()
            .and_then(|t| t.chat_template().map(str::to_string)))
    }

    /// Token ids of `text`; BOS first when `add_bos` and the model's
    /// tokenizer asks for one.
    #[pyo3(signature = (text, add_bos = true))]
    fn tokenize(&self, py: Python<'_>, text: &str, add_bos: bool) -> PyResult<Vec<u32>> {
        let engine = Arc::clone(&self.engine);
        let text = text.to_string();
        py.allow_threads(move || {
            let e = lock(&engine)?;
            let tok = e.tokenizer()?;
            tok.encode(&text, add_bos && tok.add_bos_by_default())
                .map_err(|e| e.to_string())
        })
        .map_err(py_err)
    }

    /// The text of `tokens`.
    fn detokenize(&self, py: Python<'_>, tokens: Vec<u32>) -> PyResult<String> {
        let engine = Arc::clone(&self.engine);
        py.allow_threads(move || {
            let e = lock(&engine)?;
            e.tokenizer()?.decode(&tokens).map_err(|e| e.to_string())
        })
        .map_err(py_err)
    }

    /// The chat template rendered over `messages`, ending with the
    /// assistant's turn when `add_generation_prompt`.
    #[pyo3(signature = (messages, add_generation_prompt = true))]
    fn apply_chat_template(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        add_generation_prompt: bool,
    ) -> PyResult<String> {
        let messages = chat_messages(messages)?;
        let engine = Arc::clone(&self.engine);
        py.allow_threads(move || lock(&engine)?.render(&messages, add_generation_prompt))
            .map_err(py_err)
    }

    /// Logits of every position of `tokens` (from an empty cache): a
    /// `Logits` of shape `(len(tokens), n_vocab)` that `numpy.asarray`
    /// views without copying.
    fn logits(&self, py: Python<'_>, tokens: Vec<u32>) -> PyResult<Logits> {
        let engine = Arc::clone(&self.engine);
        let vocab = self.n_vocab;
        let data = py
            .allow_threads(move || -> Result<Vec<f32>, String> {
                let mut e = lock(&engine)?;
                check_prompt(&e.model, &tokens).map_err(|e| e.to_string())?;
                e.model.reset();
                match e.model.forward(&tokens, Want::AllLogits) {
                    Ok(Output::Logits(l)) => Ok(l),
                    Ok(Output::Token(_)) => Err("the model returned a token, not logits".into()),
                    Err(err) => Err(err.to_string()),
                }
            })
            .map_err(py_err)?;
        let rows = data.len().checked_div(vocab).unwrap_or(0);
        if rows.checked_mul(vocab) != Some(data.len()) {
            return Err(py_err(format!(
                "the model returned {} logits, not a multiple of its vocabulary of {vocab}",
                data.len()
            )));
        }
        Ok(Logits {
            data: data.into_boxed_slice(),
            rows,
            vocab,
        })
    }

    /// Text generated after `prompt` (text, or token ids used verbatim):
    /// the whole text, or with `stream=True` an iterator of its pieces.
    /// A temperature of 0 is greedy; the defaults are `vkllm generate`'s.
    /// Structured output (at most one, masked while sampling): `json_schema`
    /// (a dict or JSON text), `json_object`, `grammar` (llguidance's Lark
    /// syntax, `start: ...`) or `regex` (the whole output matches).
    #[pyo3(signature = (prompt, max_tokens = 128, temperature = 0.8, top_k = 40, top_p = 0.95, min_p = 0.05, repeat_penalty = 1.0, repeat_last_n = 64, seed = None, stop = None, ignore_eos = false, stream = false, *, json_schema = None, json_object = false, grammar = None, regex = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: PromptArg,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repeat_penalty: f32,
        repeat_last_n: usize,
        seed: Option<u64>,
        stop: Option<Vec<String>>,
        ignore_eos: bool,
        stream: bool,
        json_schema: Option<&Bound<'_, PyAny>>,
        json_object: bool,
        grammar: Option<String>,
        regex: Option<String>,
    ) -> PyResult<PyObject> {
        let spec = grammar_spec(json_schema, json_object, grammar, regex)?;
        let opts = generate_options(
            max_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            seed,
            stop,
            ignore_eos,
        );
        self.run(py, prompt.into(), opts, spec, stream)
    }

    /// The assistant's reply to `messages` (dicts with "role" and
    /// "content"), through the model's chat template; streaming as
    /// `generate`.
    #[pyo3(signature = (messages, max_tokens = 128, temperature = 0.8, top_k = 40, top_p = 0.95, min_p = 0.05, repeat_penalty = 1.0, repeat_last_n = 64, seed = None, stop = None, ignore_eos = false, stream = false, *, json_schema = None, json_object = false, grammar = None, regex = None))]
    #[allow(clippy::too_many_arguments)]
    fn chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repeat_penalty: f32,
        repeat_last_n: usize,
        seed: Option<u64>,
        stop: Option<Vec<String>>,
        ignore_eos: bool,
        stream: bool,
        json_schema: Option<&Bound<'_, PyAny>>,
        json_object: bool,
        grammar: Option<String>,
        regex: Option<String>,
    ) -> PyResult<PyObject> {
        let spec = grammar_spec(json_schema, json_object, grammar, regex)?;
        let messages = chat_messages(messages)?;
        let opts = generate_options(
            max_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            seed,
            stop,
            ignore_eos,
        );
        self.run(py, Prompt::Chat(messages), opts, spec, stream)
    }

    /// Token ids generated after `tokens` (no tokenizer needed): ends at
    /// `max_tokens`, a full context, or a stop id of the tokenizer.
    #[pyo3(signature = (tokens, max_tokens = 128, temperature = 0.8, top_k = 40, top_p = 0.95, min_p = 0.05, repeat_penalty = 1.0, repeat_last_n = 64, seed = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate_tokens(
        &self,
        py: Python<'_>,
        tokens: Vec<u32>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repeat_penalty: f32,
        repeat_last_n: usize,
        seed: Option<u64>,
    ) -> PyResult<Vec<u32>> {
        let cfg = sampler_config(
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            seed,
        );
        let engine = Arc::clone(&self.engine);
        py.allow_threads(move || lock(&engine)?.generate_tokens(&tokens, max_tokens, cfg))
            .map_err(py_err)
    }

    /// Token ids after each of `prompts`, the sequences decoded together
    /// (one pass a step for up to `sequences` of them, the load option);
    /// each ends at `max_tokens`, a full context or a stop id. Greedy by
    /// default; with a temperature, prompt `i` is sampled with `seed + i`
    /// (what `generate_tokens` gives it alone with that seed).
    #[pyo3(signature = (prompts, max_tokens = 128, temperature = 0.0, top_k = 40, top_p = 0.95, min_p = 0.05, repeat_penalty = 1.0, repeat_last_n = 64, seed = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate_batch(
        &self,
        py: Python<'_>,
        prompts: Vec<Vec<u32>>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repeat_penalty: f32,
        repeat_last_n: usize,
        seed: Option<u64>,
    ) -> PyResult<Vec<Vec<u32>>> {
        let cfg = sampler_config(
            temperature,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            repeat_last_n,
            seed,
        );
        let engine = Arc::clone(&self.engine);
        py.allow_threads(move || lock(&engine)?.generate_batch(&prompts, max_tokens, cfg))
            .map_err(py_err)
    }

    fn __repr__(&self) -> String {
        format!(
            "<vkllm.Model backend={:?} n_vocab={}>",
            self.backend, self.n_vocab
        )
    }
}

/// Pieces of generated text, as the engine produces them.
#[pyclass(module = "vkllm")]
struct TextStream {
    /// `None` once the stream has ended.
    rx: Mutex<Option<mpsc::Receiver<Result<String, String>>>>,
}

#[pymethods]
impl TextStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        // The lock is taken with the GIL released: a reader of this stream
        // on another thread may hold it while it waits for the engine.
        py.allow_threads(|| {
            let mut guard = self
                .rx
                .lock()
                .map_err(|_| "the stream is unusable: an earlier read failed".to_string())?;
            let Some(rx) = guard.as_ref() else {
                return Ok(None);
            };
            match rx.recv() {
                Ok(Ok(piece)) => Ok(Some(piece)),
                Ok(Err(why)) => {
                    *guard = None;
                    Err(why)
                }
                // The engine's thread is done and every piece was read.
                Err(mpsc::RecvError) => {
                    *guard = None;
                    Ok(None)
                }
            }
        })
        .map_err(py_err)
    }

    /// Stops generation; pieces not yet read are dropped.
    fn close(&self) -> PyResult<()> {
        let mut guard = self
            .rx
            .lock()
            .map_err(|_| py_err("the stream is unusable: an earlier read failed"))?;
        *guard = None;
        Ok(())
    }
}

/// Rows of logits, `shape == (rows, n_vocab)`, float32. `numpy.asarray`
/// views them in place through `__array_interface__` (the buffer protocol
/// is not in the limited API before Python 3.11); the array keeps this
/// object alive and is read-only.
#[pyclass(module = "vkllm", frozen)]
struct Logits {
    data: Box<[f32]>,
    rows: usize,
    vocab: usize,
}

#[pymethods]
impl Logits {
    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.rows, self.vocab)
    }

    fn __len__(&self) -> usize {
        self.rows
    }

    /// One row as a list of floats.
    fn __getitem__(&self, row: isize) -> PyResult<Vec<f32>> {
        let r = if row < 0 {
            row + self.rows as isize
        } else {
            row
        };
        let r = usize::try_from(r)
            .ok()
            .filter(|&r| r < self.rows)
            .ok_or_else(|| {
                pyo3::exceptions::PyIndexError::new_err(format!(
                    "row {row} is outside the {} rows of logits",
                    self.rows
                ))
            })?;
        Ok(self.data[r * self.vocab..(r + 1) * self.vocab].to_vec())
    }

    /// numpy's array interface (version 3): the data's address, read-only.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", (self.rows, self.vocab))?;
        let typestr = if cfg!(target_endian = "little") {
            "<f4"
        } else {
            ">f4"
        };
        d.set_item("typestr", typestr)?;
        d.set_item("data", (self.data.as_ptr() as usize, true))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("<vkllm.Logits shape=({}, {})>", self.rows, self.vocab)
    }
}

#[pymodule]
fn _vkllm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Model>()?;
    m.add_class::<TextStream>()?;
    m.add_class::<Logits>()?;
    m.add("VkllmError", py.get_type::<VkllmError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
