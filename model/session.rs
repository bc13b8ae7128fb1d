//! One sequence kept in the KV cache across generations: a conversation's
//! next turn re-renders the whole history, and only what differs from the
//! cached ids (usually just the new turn) is evaluated.

use crate::error::Result;
use crate::model::generate::{generate_cached, GenerateOptions, GenerateResult};
use crate::model::runner::Model;
use crate::model::tokenizer::Tokenizer;
use std::ops::ControlFlow;

/// The ids whose keys and values the model's cache holds, in order.
#[derive(Clone, Debug, Default)]
pub struct Session {
    cached: Vec<u32>,
}

impl Session {
    pub fn new() -> Self {
        Session::default()
    }

    /// Ids in the cache.
    pub fn cached(&self) -> &[u32] {
        &self.cached
    }

    /// Forget the cache's contents (call after using the model directly).
    pub fn reset(&mut self) {
        self.cached.clear();
    }

    /// Generates after `prompt` (the whole conversation so far), reusing the
    /// longest cached prefix of it; see [`crate::model::generate::generate`].
    pub fn generate(
        &mut self,
        model: &mut Model,
        tok: &Tokenizer,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32, &str) -> ControlFlow<()>,
    ) -> Result<GenerateResult> {
        let common = self
            .cached
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(model.n_past());
        // At least the prompt's last id is evaluated: its logits are needed.
        let reuse = common.min(prompt.len().saturating_sub(1));
        self.cached.clear();
        let res = generate_cached(model, tok, prompt, reuse, opts, on_token)?;
        let mut seq = prompt.to_vec();
        seq.extend_from_slice(&res.tokens);
        seq.truncate(model.n_past());
        self.cached = seq;
        Ok(res)
    }
}
