//! The transformer forward pass (the ops themselves are in `stage.rs`):
//! one pass per call, prefill batching every prompt row, decode running
//! one row; the only readback is the sampled token id or the logits asked
//! for (and, split over several backends, the residual stream at each
//! boundary).

use crate::backend::{ComputeBackend, DeviceMemoryUse, PassStats};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::kv_pages::{PageCopy, PagePool, SeqId, Sequence};
use crate::model::layer_split;
use crate::model::source::TensorSource;
use crate::model::stage::{KvSpec, PassPlan, Stage};
use crate::model::weights::WeightOptions;
use std::ops::Range;

/// How a model is put on its backends.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Positions one sequence may hold; `None` = the model's context,
    /// capped at 8192.
    pub context: Option<usize>,
    /// Most sequences decoding together ([`Model::decode_rows`]); `None` = 1.
    pub sequences: Option<usize>,
    /// Positions of the KV page pool all sequences share; `None` = a full
    /// context per sequence.
    pub kv_positions: Option<usize>,
    /// Most prompt rows per pass; longer prompts run in several passes.
    /// `None` = the backend's [`ComputeBackend::default_max_batch`].
    pub max_batch: Option<usize>,
    pub weights: WeightOptions,
    /// KV-cache element type (`F32` or `F16`); `None` = the backend's
    /// [`ComputeBackend::default_kv_dtype`] (f16 on Vulkan, f32 on the CPU).
    pub kv_cache: Option<DType>,
    /// Each backend's share of the layers, one number per backend (see
    /// [`crate::model::layer_split::layer_ranges`]); `None` = in proportion to
    /// each backend's free memory, or all of them on a single backend.
    pub shares: Option<Vec<f64>>,
}

/// What a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The argmax of the last row's logits (greedy decoding: 4 bytes read back).
    Argmax,
    /// The last row's logits.
    LastLogits,
    /// Logits for every row fed (for parity checks).
    AllLogits,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    Token(u32),
    /// `rows * vocab` values.
    Logits(Vec<f32>),
}

/// Keys under which a backend may keep the decode passes for replay.
const DECODE_GREEDY: u32 = 0;
const DECODE_LOGITS: u32 = 1;
/// A split model's greedy step: the token read back by the host.
const DECODE_TOKEN: u32 = 2;
/// A decode step of several sequences: every row's argmax, or logits.
pub(crate) const BATCH_ARGMAX: u32 = 3;
pub(crate) const BATCH_LOGITS: u32 = 4;
/// The argmax among the ids a grammar allows, a pass of its own.
const PICK_ALLOWED: u32 = 5;

/// What the host gets from a pass: nothing (a prompt chunk that only fills
/// the cache), nothing yet (the output stays on the device for a later
/// pass), or the output read back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    Nothing,
    OnDevice,
    Host,
}

impl Read {
    fn host(yes: bool) -> Read {
        if yes {
            Read::Host
        } else {
            Read::Nothing
        }
    }
}

/// Positions per KV page, as a power of two: 64 keeps a page table of an
/// 8192-position context at 128 entries and a cached prefix within 63
/// tokens of what it could be.
const PAGE_LOG2: u32 = 6;

/// The token of positions [`Model::set_n_past`] pretends are cached: no
/// id, so no prompt's prefix lookup finds them.
const UNKNOWN_TOKEN: u32 = u32::MAX;

/// Decode passes are planned for the span their rows attend (attention's key
/// splits follow it) and kept per span class: powers of two from this many
/// positions, capped at the cache. A context that grows past its class
/// records the next one once.
const MIN_SPAN_CLASS: usize = 128;

/// The span a decode pass whose last row sits at `end - 1` is planned for
/// (its attention's key splits follow it; benches time decode at it).
pub fn decode_span(end: usize, capacity: usize) -> usize {
    SpanClass::of(end, capacity).span
}

/// The span class of a pass whose last row sits at `end - 1`.
#[derive(Clone, Copy)]
pub(crate) struct SpanClass {
    /// Positions the pass is planned for.
    pub(crate) span: usize,
    log2: u32,
}

impl SpanClass {
    pub(crate) fn of(end: usize, capacity: usize) -> SpanClass {
        let class = end.max(MIN_SPAN_CLASS).next_power_of_two();
        SpanClass {
            span: class.min(capacity),
            log2: class.trailing_zeros(),
        }
    }

    /// The replay key of decode pass kind `base` in this class, for a
    /// batch of `1 << bucket_log2` rows, reading the cache `paged` or not.
    pub(crate) fn key(self, base: u32, bucket_log2: u32, paged: bool) -> u32 {
        base | self.log2 << 3 | bucket_log2 << 9 | u32::from(paged) << 14
    }
}

/// Rows of the longest prompt pass [`Model::prepare_kernels`] records: more
/// rows take the same kernels (on an H200 a 200-token prompt made none on
/// first use after it) and only need larger scratch buffers.
const PREPARED_PROMPT: usize = 64;

/// Most greedy decode steps submitted back to back by [`Model::decode_greedy`].
pub const MAX_DECODE_STEPS: usize = 64;

/// One backend of a model, as [`Model::stages`] reports it.
#[derive(Clone, Debug)]
pub struct StageInfo {
    /// The backend's name, e.g. `vulkan (NVIDIA H100)`.
    pub device: String,
    /// The model's layers it runs.
    pub layers: Range<usize>,
    /// Bytes of weights it holds.
    pub weight_bytes: usize,
    /// Device memory it holds, where the backend can tell.
    pub memory: Option<DeviceMemoryUse>,
}

/// A model on one backend, or split by layer over several (stages run in
/// order, the residual stream handed from one to the next through the
/// host once per boundary per pass), with its KV cache: feed token ids,
/// get tokens or logits.
pub struct Model {
    pub(crate) stages: Vec<Stage>,
    pub(crate) cfg: ModelConfig,
    pub(crate) kv: KvSpec,
    /// Every sequence's KV pages.
    pub(crate) pool: PagePool,
    /// The sequence of the single-sequence API ([`Model::forward`], ...).
    pub(crate) solo: SeqId,
    /// Most rows of a decode step of several sequences.
    pub(crate) max_sequences: usize,
    /// Decode passes are kept and replayed (see [`Model::set_replay`]).
    pub(crate) replay: bool,
    /// Host copy of the residual stream at a stage boundary.
    pub(crate) boundary: Vec<u8>,
}

impl Model {
    /// Puts the model `cfg` describes, its tensors read from `src`, on
    /// `bes`: split by layer when several. The last step of `open::load`,
    /// the one way in.
    pub(crate) fn new(
        bes: Vec<Box<dyn ComputeBackend>>,
        cfg: ModelConfig,
        src: &dyn TensorSource,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        let ranges = match (bes.len(), opts.shares.as_deref()) {
            (0, _) => return Err(Error::Invalid("no backend to load the model on".into())),
            (1, None) => std::iter::once(0..cfg.n_layer).collect(),
            (n, Some(sh)) => {
                layer_split::check_shares(sh, n)?;
                layer_split::layer_ranges(cfg.n_layer, sh)?
            }
            (_, None) => {
                layer_split::layer_ranges(cfg.n_layer, &layer_split::default_shares(&bes))?
            }
        };
        let max_batch = match opts.max_batch {
            Some(b) => b,
            None => bes.iter().map(|b| b.default_max_batch()).min().unwrap_or(1),
        };
        if max_batch == 0 {
            return Err(Error::Invalid("max_batch must be at least 1".into()));
        }
        let capacity = opts.context.unwrap_or(cfg.n_ctx.min(8192)).max(1);
        // Backends that disagree on the default cache type share f32,
        // which every backend holds.
        let kv_dtype = opts.kv_cache.unwrap_or_else(|| {
            let first = bes[0].default_kv_dtype();
            if bes.iter().all(|b| b.default_kv_dtype() == first) {
                first
            } else {
                DType::F32
            }
        });
        let sequences = opts.sequences.unwrap_or(1);
        if sequences == 0 {
            return Err(Error::Invalid("sequences must be at least 1".into()));
        }
        let page_len = 1usize << PAGE_LOG2;
        let per_sequence = capacity.div_ceil(page_len);
        let pool_pages = match opts.kv_positions {
            Some(n) => n.div_ceil(page_len).max(per_sequence),
            None => per_sequence.checked_mul(sequences).ok_or_else(|| {
                Error::Invalid(format!(
                    "{sequences} sequences of {capacity} positions overflow"
                ))
            })?,
        };
        let kv = KvSpec {
            dtype: kv_dtype,
            capacity,
            page_log2: PAGE_LOG2,
            pages: pool_pages + 1,
        };
        // A decode step of several sequences pads its rows up to a power of two.
        let rows = max_batch.min(capacity).max(sequences.next_power_of_two());
        let mut stages = Vec::with_capacity(bes.len());
        for (be, layers) in bes.into_iter().zip(ranges) {
            stages.push(Stage::load(
                be,
                &cfg,
                src,
                opts.weights,
                layers,
                kv,
                rows,
                progress,
            )?);
        }
        // After the stages: their device checks refuse a pool too large
        // before its host bookkeeping is allocated.
        let mut pool = PagePool::new(pool_pages, page_len)?;
        let solo = pool.add_private();
        let mut model = Model {
            stages,
            cfg,
            kv,
            pool,
            solo,
            max_sequences: sequences,
            replay: true,
            boundary: Vec::new(),
        };
        model.prepare_kernels()?;
        Ok(model)
    }

    /// Make the kernels a first prompt and its decode steps use, on each
    /// backend that compiles them, before a pass needs them: all at once and
    /// in parallel where the device allows, where otherwise the first prompt
    /// would wait while the driver compiles each as it comes. They are
    /// learned from passes recorded but never run: a greedy and a sampled
    /// decode step in the smallest and the largest span class (whose
    /// attention plans differ most), and prompts of 2 and of up to
    /// [`PREPARED_PROMPT`] rows. Other shapes make theirs on first use.
    /// Returns how many kernels were made.
    pub fn prepare_kernels(&mut self) -> Result<usize> {
        let (capacity, rows) = (self.kv.capacity, self.stages[0].s.rows);
        // Device feedback of the greedy token exists on an unsplit model only.
        let feedback = self.stages.len() == 1;
        let mut plans = Vec::new();
        for end in [1, capacity] {
            plans.push((1, end, Want::Argmax, feedback));
            plans.push((1, end, Want::LastLogits, false));
        }
        for m in [2, PREPARED_PROMPT] {
            let m = m.min(rows);
            plans.push((m, m, Want::LastLogits, false));
        }
        plans.dedup();
        let n = self.stages.len();
        self.stages[n - 1].reserve_logits(1, self.cfg.vocab)?;
        let mut made = 0;
        for st in &mut self.stages {
            if !st.be.begin_kernel_survey()? {
                continue;
            }
            let recorded = plans.iter().try_for_each(|&(m, end, want, feedback)| {
                let rec = PassPlan {
                    cfg: &self.cfg,
                    kv: self.kv,
                    m,
                    span: SpanClass::of(end, capacity).span,
                    want,
                    read: true,
                    feedback,
                    each_row: false,
                    paged: false,
                };
                st.be.begin_pass()?;
                st.record_closed(&rec)
            });
            let ended = st.be.end_kernel_survey();
            recorded?;
            made += ended?;
        }
        Ok(made)
    }

    fn first(&mut self) -> &mut Stage {
        &mut self.stages[0]
    }

    /// Every backend the model is on, in layer order.
    pub fn stages(&self) -> Vec<StageInfo> {
        self.stages
            .iter()
            .map(|st| StageInfo {
                device: st.be.name(),
                layers: st.layers.clone(),
                weight_bytes: st.w.bytes,
                memory: st.be.device_memory(),
            })
            .collect()
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    /// The backend's name; a split model's names joined by ` + `.
    pub fn backend_name(&self) -> String {
        let names: Vec<String> = self.stages.iter().map(|st| st.be.name()).collect();
        names.join(" + ")
    }
    /// The device cost of the last pass (one decode step after
    /// generation), summed over a split model's backends.
    pub fn last_pass_stats(&self) -> Option<PassStats> {
        self.stages
            .iter()
            .filter_map(|st| st.be.last_pass_stats())
            .reduce(|a, b| PassStats {
                submits: a.submits + b.submits,
                barriers: a.barriers + b.barriers,
                descriptor_sets: a.descriptor_sets + b.descriptor_sets,
                dispatches: a.dispatches + b.dispatches,
                copies: a.copies + b.copies,
                kernels_made: a.kernels_made + b.kernels_made,
            })
    }
    /// See [`ComputeBackend::device_wait_ns`]; summed over a split model's backends.
    pub fn device_wait_ns(&self) -> Option<u64> {
        self.stages
            .iter()
            .filter_map(|st| st.be.device_wait_ns())
            .reduce(|a, b| a + b)
    }
    /// See [`ComputeBackend::set_profiling`].
    pub fn set_profiling(&mut self, on: bool) -> Result<()> {
        self.stages
            .iter_mut()
            .try_for_each(|st| st.be.set_profiling(on))
    }
    /// See [`ComputeBackend::take_profile`].
    pub fn take_profile(&mut self) -> Vec<crate::profile::ProfileEvent> {
        self.stages
            .iter_mut()
            .flat_map(|st| st.be.take_profile())
            .collect()
    }
    /// The backend (of a split model, the first one's).
    pub fn backend(&mut self) -> &mut dyn ComputeBackend {
        self.first().be.as_mut()
    }
    /// Bytes of weights on the device (on every device of a split model).
    pub fn weight_bytes(&self) -> usize {
        self.stages.iter().map(|st| st.w.bytes).sum()
    }

    /// Weight bytes one decoded token reads: all but the experts', and of
    /// those only the chosen experts' share.
    pub fn active_weight_bytes(&self) -> usize {
        let experts: usize = self.stages.iter().map(|st| st.w.expert_bytes).sum();
        let share = self.cfg.moe.map_or(experts, |m| {
            (experts as u128 * m.used as u128 / m.experts as u128) as usize
        });
        self.weight_bytes() - experts + share
    }
    /// Positions already in the KV cache.
    pub fn n_past(&self) -> usize {
        self.pool.get(self.solo).map_or(0, |s| s.positions())
    }
    /// KV-cache element type.
    pub fn kv_dtype(&self) -> DType {
        self.kv.dtype
    }
    /// KV-cache capacity in positions.
    pub fn capacity(&self) -> usize {
        self.kv.capacity
    }
    /// Keep decode passes and replay them (the default), or record every
    /// pass afresh: the two give the same results, so this is for tests and
    /// A/B timing.
    pub fn set_replay(&mut self, on: bool) {
        self.replay = on;
    }
    /// Forget the sequence (the cache is overwritten, not cleared).
    pub fn reset(&mut self) {
        // The solo sequence always exists: truncating it cannot fail.
        let _ = self.pool.truncate(self.solo, 0);
    }
    /// Keep the first `n` cached positions, or pretend `n` positions are
    /// cached (benchmarks at depth; contents are whatever is there).
    pub fn set_n_past(&mut self, n: usize) -> Result<()> {
        if n > self.kv.capacity {
            return Err(Error::Invalid(format!(
                "depth {n} exceeds the context of {} positions",
                self.kv.capacity
            )));
        }
        let have = self.n_past();
        if n <= have {
            return self.pool.truncate(self.solo, n);
        }
        // Positions of no token: never found by a prefix lookup.
        self.pool
            .append(self.solo, &vec![UNKNOWN_TOKEN; n - have])
            .map(drop)
    }

    /// Append `ids` to the sequence and return what `want` asks for, after the last id.
    pub fn forward(&mut self, ids: &[u32], want: Want) -> Result<Output> {
        if let ([id], Want::Argmax) = (ids, want) {
            self.check_ids(ids)?;
            return Ok(Output::Token(self.decode_greedy(*id, 1)?[0]));
        }
        self.forward_seq(self.solo, ids, want)
    }

    /// [`Model::forward`] for sequence `seq`: its prompt (or any ids), in
    /// passes of at most `max_batch` rows.
    pub(crate) fn forward_seq(&mut self, seq: SeqId, ids: &[u32], want: Want) -> Result<Output> {
        if ids.is_empty() {
            return Err(Error::Invalid("no tokens to evaluate".into()));
        }
        let n_past = self.positions(seq)?;
        if n_past + ids.len() > self.kv.capacity {
            return Err(Error::Invalid(format!(
                "{} cached + {} new tokens exceed the context of {} positions",
                n_past,
                ids.len(),
                self.kv.capacity
            )));
        }
        self.check_ids(ids)?;
        let mut all = Vec::new();
        let mut out = None;
        let rows = self.stages[0].s.rows;
        let chunks: Vec<&[u32]> = ids.chunks(rows).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            let step_want = match want {
                Want::AllLogits => Want::AllLogits,
                _ if last => want,
                _ => Want::LastLogits, // intermediate chunks only fill the cache
            };
            let read = Read::host(last || want == Want::AllLogits);
            let o = self.pass(seq, chunk, step_want, read)?;
            match (o, want) {
                (Some(Output::Logits(l)), Want::AllLogits) => all.extend(l),
                (o, _) if last => out = o,
                _ => {}
            }
        }
        Ok(match want {
            Want::AllLogits => Output::Logits(all),
            _ => out.ok_or_else(|| Error::Invalid("no output".into()))?,
        })
    }

    /// Positions sequence `seq` holds.
    pub(crate) fn positions(&self, seq: SeqId) -> Result<usize> {
        self.sequence(seq).map(|s| s.positions())
    }

    fn sequence(&self, seq: SeqId) -> Result<&Sequence> {
        self.pool.get(seq).ok_or_else(|| {
            Error::Invalid(format!(
                "sequence {seq} is not in the model (never added, or freed)"
            ))
        })
    }

    /// `steps` greedy tokens after `first`, chosen on the device: each step's
    /// argmax feeds the next step's embedding, and the steps run back to back
    /// (one submit on backends that replay passes), read back once. The cache
    /// then holds `first` and every returned token but the last.
    ///
    /// A split model runs one pass per step instead, each token read back
    /// by the host: the next step embeds it on the first backend, another
    /// device (each backend still replays its share of the step).
    pub fn decode_greedy(&mut self, first: u32, steps: usize) -> Result<Vec<u32>> {
        self.decode_greedy_seq(self.solo, first, steps)
    }

    /// [`Model::decode_greedy`] for sequence `seq`.
    pub(crate) fn decode_greedy_seq(
        &mut self,
        seq: SeqId,
        first: u32,
        steps: usize,
    ) -> Result<Vec<u32>> {
        if steps == 0 {
            return Ok(Vec::new());
        }
        if steps > MAX_DECODE_STEPS {
            return Err(Error::Invalid(format!(
                "{steps} decode steps at once; at most {MAX_DECODE_STEPS}"
            )));
        }
        let n_past = self.positions(seq)?;
        if n_past + steps > self.kv.capacity {
            return Err(Error::Invalid(format!(
                "{} cached + {steps} new tokens exceed the context of {} positions",
                n_past, self.kv.capacity
            )));
        }
        self.check_ids(&[first])?;
        if self.stages.len() > 1 {
            return self.decode_split(seq, first, steps);
        }
        // The steps' pages are taken before their tokens are known.
        self.pool.reserve(seq, n_past + steps)?;
        let run = self.run_greedy(seq, first, n_past, steps);
        match run {
            Ok(tokens) => {
                let mut fed = vec![first];
                fed.extend(&tokens[..steps - 1]);
                // Reserved above: the append takes no page and copies none.
                self.pool.append(seq, &fed)?;
                Ok(tokens)
            }
            Err(e) => {
                self.pool.truncate(seq, n_past)?;
                Err(e)
            }
        }
    }

    /// The device side of [`Model::decode_greedy`] on one stage.
    fn run_greedy(
        &mut self,
        seq: SeqId,
        first: u32,
        n_past: usize,
        steps: usize,
    ) -> Result<Vec<u32>> {
        let class = SpanClass::of(n_past + steps, self.kv.capacity);
        let table = self.table_words(seq)?;
        let paged = !self.in_order(&table, n_past + steps);
        let key = class.key(DECODE_GREEDY, 0, paged);
        let rec = PassPlan {
            cfg: &self.cfg,
            kv: self.kv,
            m: 1,
            span: class.span,
            want: Want::Argmax,
            read: true,
            feedback: true,
            each_row: false,
            paged,
        };
        let st = &mut self.stages[0];
        let s = st.s;
        st.be.upload(&s.tables, 0, bytemuck::cast_slice(&table))?;
        st.be.upload(&s.ids, 0, &first.to_le_bytes())?;
        st.be.upload(&s.pos, 0, &(n_past as u32).to_le_bytes())?;
        st.be.upload(&s.history, 0, &0u32.to_le_bytes())?;
        let mut done = 0;
        while done < steps {
            if self.replay && st.be.replay(key, steps - done)? {
                break;
            }
            begin(st, self.replay.then_some(key))?;
            st.record_closed(&rec)?;
            done += 1;
        }
        let mut words = vec![0u32; 1 + steps];
        st.be
            .download(&s.history, 0, bytemuck::cast_slice_mut(&mut words))?;
        if words[0] as usize != steps {
            return Err(Error::Invalid(format!(
                "the device ran {} decode steps, {steps} were submitted",
                words[0]
            )));
        }
        Ok(words[1..].to_vec())
    }

    /// Sequence `seq`'s page table as the device reads it: `table_len`
    /// entries, the unused ones naming the spare page.
    pub(crate) fn table_words(&self, seq: SeqId) -> Result<Vec<u32>> {
        let s = self.sequence(seq)?;
        let mut t: Vec<u32> = s.table().take(self.kv.table_len()).collect();
        t.resize(self.kv.table_len(), self.kv.spare_page());
        Ok(t)
    }

    /// Whether the first `positions` positions of a table are the cache's
    /// first rows in order, so a pass may read the cache unpaged: on an
    /// H200 the paged decode attention took 22% longer (benches/README.md,
    /// paged KV cache), and a lone single-sequence user's pages are always
    /// in order (`PagePool::add_private`).
    fn in_order(&self, table: &[u32], positions: usize) -> bool {
        let used = positions.div_ceil(self.pool.page_len());
        table
            .iter()
            .take(used)
            .enumerate()
            .all(|(i, &p)| p as usize == i)
    }

    /// A pass's per-row inputs: token ids into the first stage, positions
    /// and page tables into every stage.
    pub(crate) fn upload_inputs(&mut self, ids: &[u32], pos: &[u32], tables: &[u32]) -> Result<()> {
        let first = &mut self.stages[0];
        first
            .be
            .upload(&first.s.ids, 0, bytemuck::cast_slice(ids))?;
        for st in &mut self.stages {
            st.be.upload(&st.s.pos, 0, bytemuck::cast_slice(pos))?;
            st.be
                .upload(&st.s.tables, 0, bytemuck::cast_slice(tables))?;
        }
        Ok(())
    }

    /// Copies the first positions of a page into another in every layer
    /// (copy-on-write of a shared page), in a pass of its own.
    pub(crate) fn copy_page(&mut self, c: PageCopy) -> Result<()> {
        let (kv, kv_dim) = (self.kv, self.cfg.kv_dim());
        for st in &mut self.stages {
            st.be.begin_pass()?;
            let copied = st.copy_page(c, kv, kv_dim);
            let ended = st.be.end_pass();
            copied.and(ended)?;
        }
        Ok(())
    }

    /// [`Model::decode_greedy`] on a split model: a pass per step.
    fn decode_split(&mut self, seq: SeqId, first: u32, steps: usize) -> Result<Vec<u32>> {
        let mut tokens = Vec::with_capacity(steps);
        let mut t = first;
        for _ in 0..steps {
            t = match self.pass(seq, &[t], Want::Argmax, Read::Host)? {
                Some(Output::Token(t)) => t,
                _ => return Err(Error::Invalid("expected a token".into())),
            };
            tokens.push(t);
        }
        Ok(tokens)
    }

    /// The decode step of `prev` (the token chosen last), its logits left
    /// on the device for [`Model::pick_allowed`]: a constrained greedy step
    /// runs the layers while the host computes the grammar's mask.
    pub fn decode_kept(&mut self, prev: u32) -> Result<()> {
        self.decode_kept_seq(self.solo, prev)
    }

    /// [`Model::decode_kept`] for sequence `seq`.
    pub(crate) fn decode_kept_seq(&mut self, seq: SeqId, prev: u32) -> Result<()> {
        let n_past = self.positions(seq)?;
        if n_past >= self.kv.capacity {
            return Err(Error::Invalid(format!(
                "{n_past} cached + 1 new tokens exceed the context of {} positions",
                self.kv.capacity
            )));
        }
        self.check_ids(&[prev])?;
        self.pass(seq, &[prev], Want::LastLogits, Read::OnDevice)
            .map(|_| ())
    }

    /// The largest of the logits [`Model::decode_kept`] left among the ids
    /// `allowed` marks (`vocab.div_ceil(32)` words, a bit per id), in a
    /// small pass of its own: the host reads 4 bytes, not the vocabulary.
    pub fn pick_allowed(&mut self, allowed: &[u32]) -> Result<u32> {
        let vocab = self.cfg.vocab;
        let words = vocab.div_ceil(32);
        if allowed.len() != words {
            return Err(Error::Invalid(format!(
                "a mask of {} words for a vocabulary of {vocab} ids ({words} words)",
                allowed.len()
            )));
        }
        let replay = self.replay;
        let Some(st) = self.stages.last_mut() else {
            return Err(Error::Invalid("the model has no stages".into()));
        };
        let s = st.s;
        st.be.upload(&s.allowed, 0, bytemuck::cast_slice(allowed))?;
        if !(replay && st.be.replay(PICK_ALLOWED, 1)?) {
            begin(st, replay.then_some(PICK_ALLOWED))?;
            let picked = st
                .be
                .argmax(&s.logits, Some(&s.allowed), &s.token, 1, vocab);
            let ended = st.be.end_pass();
            picked.and(ended)?;
        }
        let mut t = [0u8; 4];
        st.be.download(&s.token, 0, &mut t)?;
        let id = u32::from_le_bytes(t);
        // Only allowed ids whose logits are NaN leave the argmax with none.
        let bit = allowed
            .get(id as usize / 32)
            .map_or(0, |w| w >> (id % 32) & 1);
        if bit == 0 {
            return Err(Error::Invalid(
                "the grammar allows no token the model can produce here".into(),
            ));
        }
        Ok(id)
    }

    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.cfg.vocab
            )));
        }
        Ok(())
    }

    /// Greedy next token after `ids`.
    pub fn next_token(&mut self, ids: &[u32]) -> Result<u32> {
        match self.forward(ids, Want::Argmax)? {
            Output::Token(t) => Ok(t),
            Output::Logits(_) => Err(Error::Invalid("expected a token".into())),
        }
    }

    /// Logits after the last of `ids`.
    pub fn logits(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        match self.forward(ids, Want::LastLogits)? {
            Output::Logits(l) => Ok(l),
            Output::Token(_) => Err(Error::Invalid("expected logits".into())),
        }
    }

    /// One pass of sequence `seq` over `ids` (at most `max_batch` rows)
    /// through every stage; on an error the sequence is as before.
    fn pass(&mut self, seq: SeqId, ids: &[u32], want: Want, read: Read) -> Result<Option<Output>> {
        let n_past = self.positions(seq)?;
        let copy = self.pool.append(seq, ids)?;
        let run = match copy {
            Some(c) => self.copy_page(c),
            None => Ok(()),
        }
        .and_then(|()| self.run_pass(seq, n_past, ids, want, read));
        if run.is_err() {
            self.pool.truncate(seq, n_past)?;
        }
        run
    }

    /// The device side of [`Model::pass`]: `ids` at positions from `n_past`.
    fn run_pass(
        &mut self,
        seq: SeqId,
        n_past: usize,
        ids: &[u32],
        want: Want,
        read: Read,
    ) -> Result<Option<Output>> {
        let m = ids.len();
        let vocab = self.cfg.vocab;
        let positions: Vec<u32> = (n_past..n_past + m).map(|p| p as u32).collect();
        let logit_rows = if want == Want::AllLogits { m } else { 1 };
        let n = self.stages.len();
        self.stages[n - 1].reserve_logits(logit_rows, vocab)?;
        let table = self.table_words(seq)?;
        self.upload_inputs(ids, &positions, &table)?;
        let end = n_past + m;
        let paged = !self.in_order(&table, end);
        let kind = match want {
            Want::LastLogits if m == 1 && read != Read::Nothing => Some(DECODE_LOGITS),
            Want::Argmax if m == 1 && read != Read::Nothing => Some(DECODE_TOKEN),
            _ => None,
        };
        // Kept or not, a pass is planned for its span class, so a replayed
        // pass runs the plan of a freshly recorded one.
        let class = SpanClass::of(end, self.kv.capacity);
        let key = kind.map(|k| class.key(k, 0, paged));
        let rec = PassPlan {
            cfg: &self.cfg,
            kv: self.kv,
            m,
            span: class.span,
            want,
            read: read != Read::Nothing,
            feedback: false,
            each_row: false,
            paged,
        };
        let key = key.filter(|_| self.replay);
        run_stages(&mut self.stages, &mut self.boundary, key, &rec)?;
        if read != Read::Host {
            return Ok(None);
        }
        let last = &mut self.stages[n - 1];
        let s = last.s;
        Ok(Some(match want {
            Want::Argmax => {
                let mut t = [0u8; 4];
                last.be.download(&s.token, 0, &mut t)?;
                Output::Token(u32::from_le_bytes(t))
            }
            _ => {
                let mut v = vec![0f32; logit_rows * vocab];
                last.be
                    .download(&s.logits, 0, bytemuck::cast_slice_mut(&mut v))?;
                Output::Logits(v)
            }
        }))
    }
}

/// One pass through every stage in order: each replays the pass kept
/// under `key` or records it afresh (kept under `key` when given), then
/// hands its residual stream of `rec.m` rows to the next.
pub(crate) fn run_stages(
    stages: &mut [Stage],
    boundary: &mut Vec<u8>,
    key: Option<u32>,
    rec: &PassPlan,
) -> Result<()> {
    let n = stages.len();
    for i in 0..n {
        let st = &mut stages[i];
        let kept = match key {
            Some(k) => st.be.replay(k, 1)?,
            None => false,
        };
        if !kept {
            begin(st, key)?;
            st.record_closed(rec)?;
        }
        if i + 1 < n {
            hand_over(&mut stages[i..=i + 1], boundary, rec.m * rec.cfg.n_embd)?;
        }
    }
    Ok(())
}

/// Begin a pass on `st`, kept under `key` for replay when given.
fn begin(st: &mut Stage, key: Option<u32>) -> Result<()> {
    match key {
        Some(k) => st.be.begin_replayable_pass(k),
        None => st.be.begin_pass(),
    }
}

/// Copy the first `values` of the residual stream from `pair[0]` into
/// `pair[1]` through the host.
pub(crate) fn hand_over(pair: &mut [Stage], host: &mut Vec<u8>, values: usize) -> Result<()> {
    let [from, to] = pair else {
        return Err(Error::Invalid("a boundary joins two stages".into()));
    };
    host.resize(values * 4, 0);
    from.be.download(&from.s.x, 0, host)?;
    to.be.upload(&to.s.x, 0, host)
}
