//! Several sequences in one model: adding them (reusing cached prompt
//! prefixes), freeing them, and the decode step of many at once, one row
//! per sequence, each row reading its own sequence's KV pages. The
//! scheduler that drives them is `engine.rs`.

use crate::error::{Error, Result};
use crate::model::kv_pages::SeqId;
use crate::model::runner::{
    run_stages, Model, Output, SpanClass, Want, BATCH_ARGMAX, BATCH_LOGITS,
};
use crate::model::stage::PassPlan;

impl Model {
    /// A new sequence for `prompt`, holding the cached KV pages of the
    /// longest prefix of whole pages another sequence evaluated before;
    /// returns it and how many positions those pages hold (at least the
    /// last prompt token is left to evaluate, with [`Model::prefill`]).
    pub fn add_sequence(&mut self, prompt: &[u32]) -> Result<(SeqId, usize)> {
        self.check_ids(prompt)?;
        Ok(self.pool.add(prompt))
    }

    /// A new sequence for `prompt` that reuses no cached prefix: all of it is
    /// left to evaluate (to read the logits of every prompt row).
    pub fn add_sequence_unshared(&mut self, prompt: &[u32]) -> Result<SeqId> {
        let (seq, _) = self.add_sequence(prompt)?;
        self.pool.truncate(seq, 0)?;
        Ok(seq)
    }

    /// Ends `seq`: its pages return to the pool (full ones stay cached for
    /// later prompts that share them).
    pub fn free_sequence(&mut self, seq: SeqId) -> Result<()> {
        self.added(seq)?;
        self.pool.free(seq)
    }

    /// `seq` must be one [`Model::add_sequence`] made, not the sequence of
    /// the single-sequence API.
    fn added(&self, seq: SeqId) -> Result<()> {
        if seq == self.solo {
            return Err(Error::Invalid(format!(
                "sequence {seq} is the model's own (the single-sequence API's), not one added"
            )));
        }
        Ok(())
    }

    /// Positions sequence `seq` holds.
    pub fn sequence_len(&self, seq: SeqId) -> Result<usize> {
        self.positions(seq)
    }

    /// Appends `ids` to sequence `seq` (a prompt, or its rest after a
    /// reused prefix) and returns what `want` asks for after the last.
    pub fn prefill(&mut self, seq: SeqId, ids: &[u32], want: Want) -> Result<Output> {
        self.added(seq)?;
        self.forward_seq(seq, ids, want)
    }

    /// KV pages that sequences can still get (cached prefixes included,
    /// which are evicted when needed).
    pub fn free_pages(&self) -> usize {
        self.pool.available()
    }

    /// Positions per KV page.
    pub fn page_len(&self) -> usize {
        self.pool.page_len()
    }

    /// Most rows of [`Model::decode_rows`] (`LoadOptions::sequences`).
    pub fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    /// One decode step of several sequences in one pass: row `i` appends
    /// token `rows[i].1` to sequence `rows[i].0` and returns, as `want`
    /// says, the greedy next token (`Want::Argmax`) or the logits after it
    /// (`LastLogits`; `AllLogits` is the same here). Each sequence appears at
    /// most once. On an error every sequence is as before.
    pub fn decode_rows(&mut self, rows: &[(SeqId, u32)], want: Want) -> Result<Vec<Output>> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        if rows.len() > self.max_sequences {
            return Err(Error::Invalid(format!(
                "{} sequences in one step; the model was loaded for at most {}",
                rows.len(),
                self.max_sequences
            )));
        }
        let mut starts = Vec::with_capacity(rows.len());
        for (i, &(seq, token)) in rows.iter().enumerate() {
            if rows[..i].iter().any(|&(s, _)| s == seq) {
                return Err(Error::Invalid(format!(
                    "sequence {seq} appears twice in one decode step"
                )));
            }
            self.added(seq)?;
            self.check_ids(&[token])?;
            let at = self.positions(seq)?;
            if at >= self.kv.capacity {
                return Err(Error::Invalid(format!(
                    "sequence {seq} holds {at} positions: its context of {} is full",
                    self.kv.capacity
                )));
            }
            starts.push(at);
        }
        let mut appended = 0;
        let mut run = Ok(());
        for &(seq, token) in rows {
            run = self
                .pool
                .append(seq, &[token])
                .and_then(|copy| copy.map_or(Ok(()), |c| self.copy_page(c)));
            if run.is_err() {
                break;
            }
            appended += 1;
        }
        let out = run.and_then(|()| self.run_rows(rows, &starts, want));
        if out.is_err() {
            for (&(seq, _), &at) in rows.iter().zip(&starts).take(appended) {
                self.pool.truncate(seq, at)?;
            }
        }
        out
    }

    /// The device side of [`Model::decode_rows`]: the rows padded to a
    /// power of two (padding rows write the spare page, their results
    /// unread), so one kept pass per size replays.
    fn run_rows(
        &mut self,
        rows: &[(SeqId, u32)],
        starts: &[usize],
        want: Want,
    ) -> Result<Vec<Output>> {
        let bucket = rows.len().next_power_of_two();
        let table_len = self.kv.table_len();
        let mut ids = vec![0u32; bucket];
        let mut pos = vec![0u32; bucket];
        let mut tables = vec![self.kv.spare_page(); bucket * table_len];
        for (i, (&(seq, token), &at)) in rows.iter().zip(starts).enumerate() {
            ids[i] = token;
            pos[i] = at as u32;
            let t = self.table_words(seq)?;
            tables[i * table_len..(i + 1) * table_len].copy_from_slice(&t);
        }
        let end = starts.iter().max().map_or(1, |&p| p + 1);
        let class = SpanClass::of(end, self.kv.capacity);
        let (kind, greedy) = match want {
            Want::Argmax => (BATCH_ARGMAX, true),
            Want::LastLogits | Want::AllLogits => (BATCH_LOGITS, false),
        };
        let key = class.key(kind, bucket.trailing_zeros(), true);
        let vocab = self.cfg.vocab;
        let n = self.stages.len();
        self.stages[n - 1].reserve_logits(bucket, vocab)?;
        self.upload_inputs(&ids, &pos, &tables)?;
        let rec = PassPlan {
            cfg: &self.cfg,
            kv: self.kv,
            m: bucket,
            span: class.span,
            want: if greedy {
                Want::Argmax
            } else {
                Want::AllLogits
            },
            read: true,
            feedback: false,
            each_row: true,
            paged: true,
        };
        let key = Some(key).filter(|_| self.replay);
        run_stages(&mut self.stages, &mut self.boundary, key, &rec)?;
        let last = &mut self.stages[n - 1];
        let s = last.s;
        if greedy {
            let mut t = vec![0u32; rows.len()];
            last.be
                .download(&s.token, 0, bytemuck::cast_slice_mut(&mut t))?;
            return Ok(t.into_iter().map(Output::Token).collect());
        }
        let mut v = vec![0f32; rows.len() * vocab];
        last.be
            .download(&s.logits, 0, bytemuck::cast_slice_mut(&mut v))?;
        Ok(v.chunks_exact(vocab)
            .map(|l| Output::Logits(l.to_vec()))
            .collect())
    }
}
