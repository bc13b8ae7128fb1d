//! Structured output: a JSON schema, "any JSON object", a Lark grammar or a
//! regular expression enforced while sampling, through `llguidance` (the
//! library llama.cpp and vLLM use). Each step the grammar's mask sets the
//! logits of the tokens it forbids to minus infinity before the sampler
//! sees them; once the grammar is complete only the stop ids remain, so
//! generation ends with a stop token.
//!
//! [`GrammarVocab`] is the tokenizer as llguidance sees it (every id's
//! bytes in a trie), built once per tokenizer and cached in it;
//! [`Constraint`] is a checked grammar, cheap to clone into options;
//! [`GrammarMatcher`] is one generation's parser state.

use crate::error::{Error, Result};
use crate::model::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A value valid against this JSON schema (draft 2020-12; llguidance's
    /// supported subset: types, properties/required, items, enum/const,
    /// anyOf/oneOf/allOf, $ref, numeric ranges, string lengths, pattern,
    /// format).
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark-like syntax (`start: ...`; see
    /// llguidance's docs/syntax.md). Not GBNF.
    Lark(String),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
}

/// Whitespace JSON may hold between tokens: one space, or a newline and
/// up to 20 spaces or tabs of indentation (llama.cpp's JSON grammars allow
/// the same). llguidance's default, any run of whitespace, lets a model
/// write whitespace until `max_tokens`, even after the value is complete.
const JSON_WHITESPACE: &str = r"[\x20]|[\n][\x20\x09]{0,20}";

impl GrammarSpec {
    /// The constraint an API call's options ask for (the Python package's
    /// and the C API's): at most one of `json_schema` (JSON text),
    /// `json_object`, `grammar` (Lark) and `regex`; `None` for none.
    pub fn from_options(
        json_schema: Option<&str>,
        json_object: bool,
        grammar: Option<&str>,
        regex: Option<&str>,
    ) -> Result<Option<GrammarSpec>> {
        let given = [
            json_schema.is_some(),
            json_object,
            grammar.is_some(),
            regex.is_some(),
        ];
        if given.iter().filter(|&&g| g).count() > 1 {
            return Err(Error::Invalid(
                "give at most one of json_schema, json_object, grammar and regex".into(),
            ));
        }
        Ok(if let Some(text) = json_schema {
            let schema = serde_json::from_str(text)
                .map_err(|e| Error::Invalid(format!("json_schema is not JSON: {e}")))?;
            Some(GrammarSpec::JsonSchema(schema))
        } else if json_object {
            Some(GrammarSpec::JsonObject)
        } else if let Some(g) = grammar {
            Some(GrammarSpec::Lark(g.to_string()))
        } else {
            regex.map(|r| GrammarSpec::Regex(r.to_string()))
        })
    }

    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(with_whitespace(
                serde_json::json!({"type": "object"}),
            )),
            GrammarSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(with_whitespace(schema.clone()))
            }
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonObject | GrammarSpec::JsonSchema(_) => "JSON schema",
            GrammarSpec::Lark(_) => "Lark grammar",
            GrammarSpec::Regex(_) => "regular expression",
        }
    }
}

/// `schema` with [`JSON_WHITESPACE`] as its whitespace, unless it sets
/// llguidance's own options (an `x-guidance` object: separators,
/// `whitespace_flexible`, `whitespace_pattern`, ...).
fn with_whitespace(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    schema
}

/// A tokenizer's vocabulary as llguidance's token trie, with the parser
/// factory over it (shared by every grammar compiled for this tokenizer).
pub struct GrammarVocab {
    factory: Arc<ParserFactory>,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for GrammarVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocab")
            .field("stop_ids", &self.stop_ids)
            .finish_non_exhaustive()
    }
}

impl GrammarVocab {
    /// The vocabulary of `tok`, built on first use and cached in it (the
    /// trie of a 128K vocabulary takes tens of milliseconds).
    pub fn of(tok: &Tokenizer) -> Result<Arc<GrammarVocab>> {
        if let Some(v) = tok.grammar_vocab_cache().get() {
            return Ok(v.clone());
        }
        let built = Arc::new(GrammarVocab::build(tok)?);
        // Another thread may have won the race; either copy is the same.
        Ok(tok.grammar_vocab_cache().get_or_init(|| built).clone())
    }

    fn build(tok: &Tokenizer) -> Result<GrammarVocab> {
        let stop_ids = tok.stop_ids().to_vec();
        let Some(&eos) = stop_ids.first() else {
            return Err(Error::Invalid(
                "the model has no end-of-sequence token, so a grammar could never end".into(),
            ));
        };
        let n = tok.vocab_size();
        let vocab_size = u32::try_from(n)
            .map_err(|_| Error::Invalid(format!("a vocabulary of {n} tokens is too large")))?;
        let special: std::collections::HashSet<u32> = tok.special_ids().into_iter().collect();
        // Special tokens are marked with 0xFF (never valid UTF-8), as
        // llguidance expects: a grammar's text can then never produce
        // `<|im_end|>` as characters.
        let words: Vec<Vec<u8>> = (0..vocab_size)
            .map(|id| {
                let bytes = tok.token_bytes(id).unwrap_or_default();
                if special.contains(&id) {
                    let mut w = Vec::with_capacity(bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend(tok.id_to_piece(id).unwrap_or_default().into_bytes());
                    w
                } else {
                    bytes
                }
            })
            .collect();
        let info = TokRxInfo {
            tok_bos: tok.bos_id(),
            ..TokRxInfo::new(vocab_size, eos)
        };
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&stop_ids);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Invalid(format!("cannot prepare the grammar vocabulary: {e}")))?;
        factory.quiet();
        Ok(GrammarVocab {
            factory: Arc::new(factory),
            stop_ids,
        })
    }
}

/// A grammar checked against a vocabulary, ready to start matchers.
#[derive(Clone)]
pub struct Constraint {
    spec: GrammarSpec,
    vocab: Arc<GrammarVocab>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// `spec` compiled once for `tok`'s vocabulary, so a bad schema or
    /// grammar is refused here with llguidance's message.
    pub fn new(tok: &Tokenizer, spec: GrammarSpec) -> Result<Constraint> {
        let c = Constraint {
            spec,
            vocab: GrammarVocab::of(tok)?,
        };
        c.matcher()?;
        Ok(c)
    }

    pub fn spec(&self) -> &GrammarSpec {
        &self.spec
    }

    /// A fresh parser at the start of the output.
    pub fn matcher(&self) -> Result<GrammarMatcher> {
        let kind = self.spec.kind();
        let parser = guarded(kind, || {
            self.vocab.factory.create_parser(self.spec.top_level())
        })
        .map_err(|e| Error::Invalid(format!("invalid {kind}: {e}")))?;
        Ok(GrammarMatcher {
            inner: Matcher::new(Ok(parser)),
            vocab: self.vocab.clone(),
            ready: None,
        })
    }
}

/// One output's position in its grammar.
pub struct GrammarMatcher {
    inner: Matcher,
    vocab: Arc<GrammarVocab>,
    /// The next step's mask, computed ahead by [`GrammarMatcher::prepare`].
    ready: Option<SimpleVob>,
}

impl GrammarMatcher {
    /// Sets the logits of the tokens the grammar forbids next to minus
    /// infinity (ids past the tokenizer's vocabulary, padding rows of the
    /// output matrix, are always forbidden). Once the grammar is complete
    /// only the stop ids are left.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let mask = match self.ready.take() {
            Some(m) => m,
            None => self.compute()?,
        };
        // 32 ids a mask word; most words are all forbidden or all allowed.
        let n = mask.len();
        let words = mask.as_slice();
        let mut any = false;
        for (w, run) in logits.chunks_mut(32).enumerate() {
            let first = w * 32;
            let mut bits = words.get(w).copied().unwrap_or(0);
            if first + 32 > n {
                bits &= 1u32
                    .checked_shl(n.saturating_sub(first) as u32)
                    .unwrap_or(0)
                    .wrapping_sub(1);
            }
            match bits {
                0 => run.fill(f32::NEG_INFINITY),
                u32::MAX => any |= run.iter().any(|&l| l != f32::NEG_INFINITY),
                _ => {
                    for (j, l) in run.iter_mut().enumerate() {
                        if bits >> j & 1 == 1 {
                            any |= *l != f32::NEG_INFINITY;
                        } else {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        if !any {
            return Err(Error::Invalid(
                "the grammar allows no token the model can produce here".into(),
            ));
        }
        Ok(())
    }

    /// The next step's mask as `vocab.div_ceil(32)` words, a bit per id of
    /// a model with `vocab` output rows (ids past the tokenizer's vocabulary
    /// forbidden), for an argmax on the device (`ComputeBackend::argmax`).
    pub fn allowed_words(&mut self, vocab: usize) -> Result<Vec<u32>> {
        let mask = match self.ready.take() {
            Some(m) => m,
            None => self.compute()?,
        };
        let n = mask.len().min(vocab);
        let mut words: Vec<u32> = mask
            .as_slice()
            .iter()
            .take(n.div_ceil(32))
            .copied()
            .collect();
        if n % 32 != 0 {
            if let Some(last) = words.last_mut() {
                *last &= (1u32 << (n % 32)) - 1;
            }
        }
        words.resize(vocab.div_ceil(32), 0);
        if words.iter().all(|&w| w == 0) {
            return Err(Error::Invalid(
                "the grammar allows no token the model can produce here".into(),
            ));
        }
        Ok(words)
    }

    /// Computes the next step's mask now, so a caller can overlap it with
    /// the forward pass that makes the next logits (it depends only on the
    /// tokens accepted so far).
    pub fn prepare(&mut self) -> Result<()> {
        if self.ready.is_none() {
            self.ready = Some(self.compute()?);
        }
        Ok(())
    }

    fn compute(&mut self) -> Result<SimpleVob> {
        let inner = &mut self.inner;
        guarded("grammar", || inner.compute_mask_or_eos())
            .map_err(|e| Error::Invalid(format!("the grammar cannot go on: {e}")))
    }

    /// Advances past `token` (which the last mask allowed).
    pub fn accept(&mut self, token: u32) -> Result<()> {
        // A stop id ends the output; the parser has nothing left to check.
        if self.vocab.stop_ids.contains(&token) {
            return Ok(());
        }
        self.ready = None;
        let inner = &mut self.inner;
        guarded("grammar", || inner.consume_token(token))
            .map_err(|e| Error::Invalid(format!("the grammar refused token {token}: {e}")))
    }

    /// Whether the grammar is complete and allows nothing but a stop id.
    pub fn is_stopped(&self) -> bool {
        self.inner.is_stopped()
    }

    /// Whether the output so far is a complete match (a stop id allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.inner.is_accepting().unwrap_or(false)
    }
}

/// `f`, with a panic inside llguidance (a schema it mishandles) turned into
/// an error for this request instead of unwinding through the engine.
fn guarded<T, E: std::fmt::Display>(
    what: &str,
    f: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("llguidance failed internally on this {what}")),
    }
}
