//! Loading, evaluation, sampling and generation through the C API.

use super::{guard, handle, put, slice_arg, str_arg, Fail, VkllmModel, VkllmStatus};
use crate::model::generate::{GenerateOptions, StopReason};
use crate::model::grammar::{Constraint, GrammarSpec};
use crate::model::sampling::{Sampler, SamplerConfig};
use crate::model::session::Session;
use crate::model::{LoadOptions, Output, Want};
use crate::open::{BackendChoice, CpuOptions};
use std::ffi::{c_char, c_void};
use std::ops::ControlFlow;
use std::path::Path;

/// How to load a model; start from `vkllm_default_load_options()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VkllmLoadOptions {
    /// "auto", "cpu", "vulkan" or "vulkan:DEVICE"; NULL means "auto".
    pub backend: *const c_char,
    /// KV-cache positions; 0: the model's context, at most 8192.
    pub context: u32,
    /// CPU threads; 0: every core.
    pub threads: u32,
    /// Most sequences of one `vkllm_seq_decode` step; 0: 1. The KV cache
    /// holds a full context for each.
    pub sequences: u32,
}

/// Sampling settings; start from `vkllm_default_sampling()`. A temperature
/// of 0 is greedy.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VkllmSampling {
    pub temperature: f32,
    /// 0: off.
    pub top_k: u32,
    /// 1: off.
    pub top_p: f32,
    /// 0: off.
    pub min_p: f32,
    /// 1: off.
    pub repeat_penalty: f32,
    pub repeat_last_n: u32,
    pub seed: u64,
}

/// What `vkllm_generate` does; start from `vkllm_default_generate_options()`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct VkllmGenerateOptions {
    pub max_tokens: u32,
    pub sampling: VkllmSampling,
    /// Keep generating through end-of-sequence (stop tokens barred).
    pub ignore_eos: bool,
    /// `n_stop` stop strings (UTF-8, NUL-terminated); NULL when `n_stop` is 0.
    pub stop: *const *const c_char,
    pub n_stop: usize,
    /// Structured output, at most one (NULL / false for none), masked while
    /// sampling: a JSON schema (JSON text) the output is valid against...
    pub json_schema: *const c_char,
    /// ... any JSON object ...
    pub json_object: bool,
    /// ... a grammar in llguidance's Lark syntax (`start: ...`) ...
    pub grammar: *const c_char,
    /// ... or a regular expression the whole output matches.
    pub regex: *const c_char,
}

/// Why `vkllm_generate` ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VkllmStop {
    /// A stop token (end of sequence, end of turn).
    Token = 0,
    MaxTokens = 1,
    ContextFull = 2,
    StopString = 3,
    /// The callback returned false.
    Cancelled = 4,
}

/// Called with each generated id and the text it completes (`len` bytes of
/// UTF-8, NUL-terminated; may be empty). Return false to stop.
pub type VkllmTokenCallback =
    Option<extern "C" fn(token: u32, text: *const c_char, len: usize, user: *mut c_void) -> bool>;

#[no_mangle]
pub extern "C" fn vkllm_default_load_options() -> VkllmLoadOptions {
    VkllmLoadOptions {
        backend: std::ptr::null(),
        context: 0,
        threads: 0,
        sequences: 0,
    }
}

#[no_mangle]
pub extern "C" fn vkllm_default_sampling() -> VkllmSampling {
    let d = SamplerConfig::default();
    VkllmSampling {
        temperature: d.temperature,
        top_k: d.top_k as u32,
        top_p: d.top_p,
        min_p: d.min_p,
        repeat_penalty: d.repeat_penalty,
        repeat_last_n: d.repeat_last_n as u32,
        seed: d.seed,
    }
}

#[no_mangle]
pub extern "C" fn vkllm_default_generate_options() -> VkllmGenerateOptions {
    VkllmGenerateOptions {
        max_tokens: 128,
        sampling: vkllm_default_sampling(),
        ignore_eos: false,
        stop: std::ptr::null(),
        n_stop: 0,
        json_schema: std::ptr::null(),
        json_object: false,
        grammar: std::ptr::null(),
        regex: std::ptr::null(),
    }
}

/// The structured output `o` asks for.
///
/// # Safety
/// Its string pointers are null or NUL-terminated strings.
unsafe fn grammar_spec(o: &VkllmGenerateOptions) -> Result<Option<GrammarSpec>, Fail> {
    // SAFETY: null or NUL-terminated, per the contract.
    let text = |p: *const c_char, what: &str| -> Result<Option<&str>, Fail> {
        if p.is_null() {
            return Ok(None);
        }
        unsafe { str_arg(p, what) }.map(Some)
    };
    GrammarSpec::from_options(
        text(o.json_schema, "json_schema")?,
        o.json_object,
        text(o.grammar, "grammar")?,
        text(o.regex, "regex")?,
    )
    .map_err(|e| Fail::Arg(e.to_string()))
}

fn sampler_config(s: &VkllmSampling) -> SamplerConfig {
    SamplerConfig {
        temperature: s.temperature,
        top_k: s.top_k as usize,
        top_p: s.top_p,
        min_p: s.min_p,
        repeat_penalty: s.repeat_penalty,
        repeat_last_n: s.repeat_last_n as usize,
        seed: s.seed,
    }
}

/// Loads a GGUF file or Hugging Face directory into `*out` (NULL on failure).
/// `opts` may be NULL (the defaults). Free the handle with `vkllm_model_free`.
///
/// # Safety
/// `path` is a NUL-terminated string, `opts` is null or valid, `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vkllm_model_load(
    path: *const c_char,
    opts: *const VkllmLoadOptions,
    out: *mut *mut VkllmModel,
) -> VkllmStatus {
    guard(|| {
        if out.is_null() {
            return Err(Fail::Arg("out is null".into()));
        }
        // SAFETY: `out` is writable.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: per this function's contract.
        let path = unsafe { str_arg(path, "path") }?;
        // SAFETY: null or valid, per the contract.
        let o = unsafe { opts.as_ref() }
            .copied()
            .unwrap_or_else(|| vkllm_default_load_options());
        let choice = if o.backend.is_null() {
            BackendChoice::Auto
        } else {
            // SAFETY: a NUL-terminated string, per the contract.
            unsafe { str_arg(o.backend, "backend") }?.parse()?
        };
        let cpu = CpuOptions {
            threads: (o.threads > 0).then_some(o.threads as usize),
            ..CpuOptions::default()
        };
        let (be, _) = crate::open::open_backend(&choice, cpu)?;
        let load = LoadOptions {
            context: (o.context > 0).then_some(o.context as usize),
            sequences: (o.sequences > 0).then_some(o.sequences as usize),
            ..LoadOptions::default()
        };
        let loaded = crate::open::load(vec![be], Path::new(path), &load, &mut |_, _| {})?;
        let (tokenizer, tokenizer_error) = match loaded.tokenizer {
            Ok(t) => (Some(t), String::new()),
            Err(e) => (None, e.to_string()),
        };
        let m = Box::new(VkllmModel {
            model: loaded.model,
            tokenizer,
            tokenizer_error,
            session: Session::new(),
            history: Vec::new(),
            logits: Vec::new(),
            sampler: None,
        });
        // SAFETY: `out` is writable.
        unsafe { out.write(Box::into_raw(m)) };
        Ok(())
    })
}

/// Frees a handle (NULL is ignored).
///
/// # Safety
/// `m` is null or a handle from `vkllm_model_load`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn vkllm_model_free(m: *mut VkllmModel) {
    if !m.is_null() {
        // Dropping can run device code; a panic there must not reach C.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: a handle from `Box::into_raw`, freed once.
            drop(unsafe { Box::from_raw(m) })
        }));
    }
}

/// Vocabulary size (0 for a null handle).
///
/// # Safety
/// `m` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vkllm_n_vocab(m: *const VkllmModel) -> u32 {
    // SAFETY: null or live, per the contract.
    unsafe { m.as_ref() }.map_or(0, |m| m.model.config().vocab as u32)
}

/// KV-cache capacity in positions (0 for a null handle).
///
/// # Safety
/// `m` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vkllm_n_ctx(m: *const VkllmModel) -> u32 {
    // SAFETY: null or live, per the contract.
    unsafe { m.as_ref() }.map_or(0, |m| m.model.capacity() as u32)
}

/// Whether `token` ends a turn (EOS, EOT, `<|im_end|>`, ...).
///
/// # Safety
/// `m` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vkllm_is_stop(m: *const VkllmModel, token: u32) -> bool {
    // SAFETY: null or live, per the contract.
    unsafe { m.as_ref() }
        .and_then(|m| m.tokenizer.as_ref())
        .is_some_and(|t| t.stop_ids().contains(&token))
}

/// Empties the KV cache: the next `vkllm_eval` starts a new sequence.
///
/// # Safety
/// `m` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vkllm_reset(m: *mut VkllmModel) -> VkllmStatus {
    guard(|| {
        // SAFETY: null or live, per the contract.
        let m = unsafe { handle(m) }?;
        m.model.reset();
        m.session.reset();
        m.history.clear();
        m.logits.clear();
        Ok(())
    })
}

/// Appends `n` ids to the sequence; their last position's logits are kept
/// for `vkllm_logits`, `vkllm_greedy` and `vkllm_sample`.
///
/// # Safety
/// `m` is a live handle, `ids` points to `n` values.
#[no_mangle]
pub unsafe extern "C" fn vkllm_eval(m: *mut VkllmModel, ids: *const u32, n: usize) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let (m, ids) = unsafe { (handle(m)?, slice_arg(ids, n, "ids")?) };
        // The cache is now the caller's sequence, not a generated one.
        m.session.reset();
        let Output::Logits(l) = m.model.forward(ids, Want::LastLogits)? else {
            return Err(Fail::Arg("no logits came back".into()));
        };
        m.logits = l;
        m.history.extend_from_slice(ids);
        Ok(())
    })
}

/// The logits after the last evaluated id: `*n` values at `*out`, valid
/// until the next call on this handle.
///
/// # Safety
/// `m` is a live handle; `out` and `n` are writable.
#[no_mangle]
pub unsafe extern "C" fn vkllm_logits(
    m: *mut VkllmModel,
    out: *mut *const f32,
    n: *mut usize,
) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { handle(m) }?;
        if m.logits.is_empty() {
            return Err(Fail::Arg("nothing evaluated yet; call vkllm_eval".into()));
        }
        // SAFETY: writable, per the contract.
        unsafe {
            put(out, m.logits.as_ptr());
            put(n, m.logits.len());
        }
        Ok(())
    })
}

/// The most likely next id (the first of ties).
///
/// # Safety
/// `m` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vkllm_greedy(m: *mut VkllmModel, out: *mut u32) -> VkllmStatus {
    let greedy = SamplerConfig::greedy();
    // SAFETY: forwarded.
    unsafe { sample_with(m, &greedy, out) }
}

/// A next id drawn from the logits with `params` (NULL: the defaults). The
/// random stream continues across calls while `params` stay the same.
///
/// # Safety
/// `m` is a live handle; `params` is null or valid; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn vkllm_sample(
    m: *mut VkllmModel,
    params: *const VkllmSampling,
    out: *mut u32,
) -> VkllmStatus {
    // SAFETY: null or valid, per the contract.
    let p = unsafe { params.as_ref() }
        .copied()
        .unwrap_or_else(|| vkllm_default_sampling());
    // SAFETY: forwarded.
    unsafe { sample_with(m, &sampler_config(&p), out) }
}

/// # Safety
/// As [`vkllm_sample`].
unsafe fn sample_with(m: *mut VkllmModel, cfg: &SamplerConfig, out: *mut u32) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let m = unsafe { handle(m) }?;
        if m.logits.is_empty() {
            return Err(Fail::Arg("nothing evaluated yet; call vkllm_eval".into()));
        }
        cfg.validate()?;
        if m.sampler.as_ref().is_none_or(|s| s.config() != cfg) {
            m.sampler = Some(Sampler::new(cfg.clone()));
        }
        let Some(s) = m.sampler.as_mut() else {
            return Err(Fail::Arg("no sampler".into()));
        };
        let id = s.sample(&m.logits, &m.history);
        // SAFETY: writable, per the contract.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Generates after `prompt` (`n` ids: the whole conversation so far), reusing
/// the longest prefix still in the cache from the last call; streams through
/// `cb` (may be NULL). `*n_tokens` and `*stop` (both may be NULL) say how
/// many ids were generated and why it ended.
///
/// # Safety
/// `m` is a live handle; `prompt` points to `n` ids; `opts` is null or valid
/// (its `stop` pointing to `n_stop` strings, its `json_schema`, `grammar` and
/// `regex` null or NUL-terminated); `n_tokens` and `stop` are null
/// or writable; `cb` may be called with `user`.
#[no_mangle]
pub unsafe extern "C" fn vkllm_generate(
    m: *mut VkllmModel,
    prompt: *const u32,
    n: usize,
    opts: *const VkllmGenerateOptions,
    cb: VkllmTokenCallback,
    user: *mut c_void,
    n_tokens: *mut usize,
    stop: *mut VkllmStop,
) -> VkllmStatus {
    guard(|| {
        // SAFETY: per the contract.
        let (m, prompt) = unsafe { (handle(m)?, slice_arg(prompt, n, "prompt")?) };
        // SAFETY: null or valid, per the contract.
        let o = unsafe { opts.as_ref() }
            .copied()
            .unwrap_or_else(|| vkllm_default_generate_options());
        // SAFETY: `n_stop` pointers, per the contract.
        let stops = unsafe { slice_arg(o.stop, o.n_stop, "stop") }?;
        let stop_strings = stops
            .iter()
            // SAFETY: each a NUL-terminated string, per the contract.
            .map(|&s| unsafe { str_arg(s, "a stop string") }.map(String::from))
            .collect::<Result<Vec<_>, Fail>>()?;
        // SAFETY: null or NUL-terminated strings, per the contract.
        let spec = unsafe { grammar_spec(&o) }?;
        let tok = m.tokenizer.as_ref().ok_or_else(|| {
            Fail::Arg(format!("the model has no tokenizer: {}", m.tokenizer_error))
        })?;
        let gopts = GenerateOptions {
            max_tokens: o.max_tokens as usize,
            sampler: sampler_config(&o.sampling),
            ignore_eos: o.ignore_eos,
            stop: stop_strings,
            constraint: spec.map(|s| Constraint::new(tok, s)).transpose()?,
            ..GenerateOptions::default()
        };
        let mut on_token = |id: u32, text: &str| {
            let Some(f) = cb else {
                return ControlFlow::Continue(());
            };
            // Text never holds NUL bytes from a tokenizer; one would end the
            // C string early but `len` still tells the truth.
            let mut bytes = text.as_bytes().to_vec();
            bytes.push(0);
            if f(id, bytes.as_ptr().cast(), text.len(), user) {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        };
        let res = m
            .session
            .generate(&mut m.model, tok, prompt, &gopts, &mut on_token)?;
        m.history = m.session.cached().to_vec();
        m.logits.clear();
        let why = match res.stop {
            StopReason::StopToken => VkllmStop::Token,
            StopReason::MaxTokens => VkllmStop::MaxTokens,
            StopReason::ContextFull => VkllmStop::ContextFull,
            StopReason::StopString => VkllmStop::StopString,
            StopReason::Cancelled => VkllmStop::Cancelled,
        };
        // SAFETY: null or writable, per the contract.
        unsafe {
            put(n_tokens, res.tokens.len());
            put(stop, why);
        }
        Ok(())
    })
}
