//! CPU backend: SIMD kernels (AVX-512 / AVX2+FMA chosen at run time, NEON on
//! aarch64, scalar elsewhere) on a fork-join team (team.rs). Ops run as soon as they
//! are recorded; `begin_pass`/`end_pass` only keep the bookkeeping honest.
//!
//! One file per op, named as its Vulkan encoder in vk/ops/ (matmul/ also
//! holds the kernels of linear, linear_each and linear_glu: decode's in
//! matmul/gemv.rs); simd/ holds the instruction-set kernels, quant/ the
//! GGUF block formats.

pub mod act;
mod add;
mod append_token;
mod argmax;
mod attention;
mod buffers;
mod copy;
mod denormals;
mod embedding;
mod glu;
mod layer_norm;
mod matmul;
mod matmul_experts;
mod options;
mod par;
mod repack;
mod rms_norm;
mod room;
mod rope;
mod rope_store;
mod round_i8;
mod route_experts;
mod scale;
pub mod simd;
mod spread;
mod store_rows;
mod sum_experts;
mod team;

pub use options::CpuKernelOptions;
pub use simd::Isa;

use crate::backend::{
    check, linear_apart, with_normed, Activation, AttentionParams, Buffer, ComputeBackend,
    ExpertsParams, KvPages, LinearOpts, Projection, RopeParams, RouteParams, Weight,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::profile::{ProfileEvent, Track};
use buffers::{CpuWeight, HostBytes, Slot, Store};
use par::Ctx;
use smallvec::SmallVec;
use std::time::Instant;
use team::Team;

/// The outputs an op writes, writable: on the stack (every op has one or
/// three), since each op would otherwise allocate for them.
type Outs<'a> = SmallVec<[&'a mut [f32]; 3]>;

/// What matmuls of Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K
/// weights do with the f32 activations: decode (up to 4 activation rows)
/// everywhere, prefill on AVX2 and AVX-512 (elsewhere prefill is f32). The
/// other weight types and every other op always work in f32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationPrecision {
    /// f32 against weights dequantized in registers: exact up to f32 rounding.
    F32,
    /// Rounded per 32-value block to 16-bit integers (relative error at most
    /// 2⁻¹⁶ of the block's largest value), exact integer dots.
    #[default]
    Q16,
    /// Rounded per block to 8 bits (2⁻⁸), integer dots, as llama.cpp does:
    /// fastest, but far enough from f32 to change near-tied greedy tokens.
    Q8,
}

impl ActivationPrecision {
    pub fn name(self) -> &'static str {
        match self {
            ActivationPrecision::F32 => "f32",
            ActivationPrecision::Q16 => "q16",
            ActivationPrecision::Q8 => "q8",
        }
    }
}

pub struct CpuBackend {
    team: Team,
    threads: usize,
    isa: Isa,
    acts: ActivationPrecision,
    /// Repack the weights of `repack::packs` types at upload.
    repack: bool,
    store: Store,
    in_pass: bool,
    /// While profiling: when it began, and the ops timed since.
    profile: Option<(Instant, Vec<ProfileEvent>)>,
    /// Intermediates given back (`free_temp`), reused: fresh ones cost a
    /// page fault per 4 KiB on first write, ~20% of a 1B prefill pass.
    temps: Vec<Buffer>,
    /// Team or inline for each op and size, by their times.
    spread: spread::Spread,
}

/// CPU features relevant to the kernels, space-separated (e.g. "avx512f avx2 fma").
pub fn features() -> String {
    let mut f: Vec<&str> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($name:tt),*) => {$(if is_x86_feature_detected!($name) { f.push($name); })*};
        }
        probe!(
            "avx512f",
            "avx512bw",
            "avx512vl",
            "avx512vnni",
            "avx512bf16",
            "avxvnni",
            "avx2",
            "fma",
            "f16c"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            f.push("neon");
        }
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            f.push("dotprod");
        }
    }
    f.join(" ")
}

impl CpuBackend {
    /// A backend on `threads` threads (`None`: every core) with the default
    /// [`CpuKernelOptions`]: the best instruction set this CPU has.
    pub fn new(threads: Option<usize>) -> CpuBackend {
        CpuBackend::build(threads, Isa::detect(), CpuKernelOptions::default())
    }

    /// Like [`CpuBackend::new`] with `opts`' kernels; an error if this CPU
    /// lacks the instruction set they name.
    pub fn with_options(threads: Option<usize>, opts: CpuKernelOptions) -> Result<CpuBackend> {
        let isa = match opts.isa {
            Some(isa) if !isa.available() => {
                return Err(Error::Unsupported(format!(
                    "this CPU cannot run {} kernels",
                    isa.name()
                )))
            }
            Some(isa) => isa,
            None => Isa::detect(),
        };
        Ok(CpuBackend::build(threads, isa, opts))
    }

    /// Like [`CpuBackend::new`] but with a chosen instruction set (tests and
    /// benches use it to cover every kernel); an error if this CPU lacks it.
    pub fn with_isa(threads: Option<usize>, isa: Isa) -> Result<CpuBackend> {
        CpuBackend::with_options(
            threads,
            CpuKernelOptions {
                isa: Some(isa),
                ..CpuKernelOptions::default()
            },
        )
    }

    /// `isa` must be available (the kernels behind it assume so).
    fn build(threads: Option<usize>, isa: Isa, opts: CpuKernelOptions) -> CpuBackend {
        let team = Team::new(
            threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            opts.room,
        );
        CpuBackend {
            threads: team.size(),
            team,
            isa,
            acts: ActivationPrecision::default(),
            repack: opts.repack,
            store: Store::default(),
            in_pass: false,
            profile: None,
            temps: Vec::new(),
            spread: spread::Spread::default(),
        }
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Whether weights uploaded from now on are repacked for the decode
    /// kernels where they have them (default: yes, see
    /// [`CpuKernelOptions::repack`]).
    pub fn with_repack(mut self, repack: bool) -> CpuBackend {
        self.repack = repack;
        self
    }

    /// How matmuls of integer-dot weight types treat the activations; see
    /// [`ActivationPrecision`].
    pub fn with_activations(mut self, acts: ActivationPrecision) -> CpuBackend {
        self.acts = acts;
        self
    }

    fn in_pass(&self, op: &'static str) -> Result<()> {
        if !self.in_pass {
            return Err(Error::op(op, "recorded outside begin_pass/end_pass"));
        }
        Ok(())
    }

    /// Run `f` with the first `n` f32 values of `out` writable and the rest of
    /// the store readable: on the pool when `work` (about one unit per value
    /// or multiply-add) is worth a thread wake-up, else inline. `inputs` must
    /// not alias `out`.
    fn with_out<R: Send>(
        &mut self,
        op: &'static str,
        out: &Buffer,
        n: usize,
        work: usize,
        inputs: &[&Buffer],
        f: impl FnOnce(&Store, &mut [f32], Ctx) -> Result<R> + Send,
    ) -> Result<R> {
        self.with_outs(op, &[(out, n)], work, inputs, |s, mut dsts, ctx| {
            f(s, dsts.swap_remove(0), ctx)
        })
    }

    /// [`CpuBackend::with_out`] for several outputs: the first `n` values
    /// of each `(out, n)`, in order. No output may alias another or an input.
    fn with_outs<R: Send>(
        &mut self,
        op: &'static str,
        outs: &[(&Buffer, usize)],
        work: usize,
        inputs: &[&Buffer],
        f: impl FnOnce(&Store, Outs<'_>, Ctx) -> Result<R> + Send,
    ) -> Result<R> {
        let bytes = inputs
            .iter()
            .chain(outs.iter().map(|(b, _)| b))
            .map(|b| b.bytes as u64)
            .sum();
        self.timed(op, bytes, |be| {
            be.in_pass(op)?;
            for (i, &(out, n)) in outs.iter().enumerate() {
                let earlier = outs[..i].iter().map(|(b, _)| b);
                if inputs.iter().chain(earlier).any(|b| b.id() == out.id()) {
                    return Err(Error::op(op, "the output buffer aliases an input"));
                }
                check::fits(op, "out", out, n)?;
            }
            let mut slots = SmallVec::<[Slot; 3]>::new();
            for &(out, _) in outs {
                match be.store.remove(out) {
                    Some(s) => slots.push(s),
                    None => {
                        for (s, (b, _)) in slots.into_iter().zip(outs) {
                            be.store.restore(b, s);
                        }
                        return Err(Error::op(
                            op,
                            format!("out: buffer {} is freed or unknown", out.id()),
                        ));
                    }
                }
            }
            let flush = denormals::FlushDenormals::new();
            let mut dsts = Outs::new();
            let mut bad = None;
            for (slot, &(_, n)) in slots.iter_mut().zip(outs) {
                match slot {
                    Slot::Data { words, bytes } if *bytes >= n * 4 => {
                        dsts.push(bytemuck::cast_slice_mut::<u32, f32>(&mut words[..n]))
                    }
                    Slot::Data { bytes, .. } => {
                        bad = Some(format!("out holds {bytes} bytes, {n} values needed"));
                        break;
                    }
                    Slot::Weight(_) => {
                        bad = Some("the output buffer is a weight".to_string());
                        break;
                    }
                }
            }
            let result = match bad {
                Some(why) => {
                    drop(dsts);
                    Err(Error::op(op, why))
                }
                None => {
                    // Worth a team at all; then team or inline by their times.
                    let eligible = be.threads > 1 && work >= par::PAR_MIN_WORK;
                    let par = eligible && be.spread.team(op, work);
                    let start = eligible.then(Instant::now);
                    let (store, ctx) = (
                        &be.store,
                        Ctx {
                            isa: be.isa,
                            par,
                            acts: be.acts,
                        },
                    );
                    let r = if par {
                        par::with_team(&be.team, || f(store, dsts, ctx))
                    } else {
                        f(store, dsts, ctx)
                    };
                    if let Some(start) = start {
                        be.spread.took(op, work, par, start.elapsed());
                    }
                    r
                }
            };
            drop(flush);
            for (s, (b, _)) in slots.into_iter().zip(outs) {
                be.store.restore(b, s);
            }
            result
        })
    }

    /// Every projection of `outs` from `x` (`m` decode rows, one column
    /// count) in one team job.
    fn matmul_each(&mut self, x: &Buffer, m: usize, outs: &[Projection]) -> Result<()> {
        let mut sizes = Vec::with_capacity(outs.len());
        let mut inputs = vec![x];
        let mut work = 0usize;
        for p in outs {
            let n = m
                .checked_mul(p.w.rows)
                .ok_or_else(|| Error::op("matmul", "m * rows overflows"))?;
            sizes.push((p.y, n));
            inputs.push(&p.w.buf);
            inputs.extend(p.bias);
            work = work.saturating_add(n.saturating_mul(p.w.cols));
        }
        let xn = m
            .checked_mul(outs.first().map_or(0, |p| p.w.cols))
            .ok_or_else(|| Error::op("matmul", "m * cols overflows"))?;
        self.with_outs("matmul_each", &sizes, work, &inputs, |s, dsts, ctx| {
            let xs = s.f32s("matmul", "x", x, xn)?;
            let mut parts = Vec::with_capacity(outs.len());
            for (p, y) in outs.iter().zip(dsts) {
                let bias = p
                    .bias
                    .map(|b| s.f32s("matmul", "bias", b, p.w.rows))
                    .transpose()?;
                let w = s.weight("matmul", p.w)?.all();
                parts.push(matmul::Part { w, bias, y });
            }
            matmul::gemv_each(ctx, &mut parts, xs, m, Some((&s.acts, x.id())));
            Ok(())
        })
    }

    /// `out = act(x · Gᵀ) ⊙ (x · Uᵀ)` (`m` decode rows) in one team job.
    fn matmul_glu(
        &mut self,
        act: Activation,
        gate_up: &Weight,
        x: &Buffer,
        out: &Buffer,
        m: usize,
    ) -> Result<()> {
        let n = m
            .checked_mul(gate_up.rows / 2)
            .ok_or_else(|| Error::op("matmul", "m * rows overflows"))?;
        let xn = m
            .checked_mul(gate_up.cols)
            .ok_or_else(|| Error::op("matmul", "m * cols overflows"))?;
        let work = n.saturating_mul(2 * gate_up.cols);
        let inputs = [&gate_up.buf, x];
        self.with_out("matmul_glu", out, n, work, &inputs, |s, dst, ctx| {
            let w = s.weight("matmul", gate_up)?.all();
            let xs = s.f32s("matmul", "x", x, xn)?;
            matmul::gemv_glu(ctx, act, w, xs, dst, m, Some((&s.acts, x.id())));
            Ok(())
        })
    }

    /// `f`, recorded as one event of `op` (binding `bytes`) while profiling.
    fn timed<R>(
        &mut self,
        op: &'static str,
        bytes: u64,
        f: impl FnOnce(&mut Self) -> Result<R>,
    ) -> Result<R> {
        if self.profile.is_none() {
            return f(self);
        }
        let start = Instant::now();
        let r = f(self);
        if let Some((origin, events)) = &mut self.profile {
            events.push(ProfileEvent {
                name: op,
                track: Track::Gpu,
                start_us: start.duration_since(*origin).as_secs_f64() * 1e6,
                dur_us: start.elapsed().as_secs_f64() * 1e6,
                bytes,
            });
        }
        r
    }
}

impl ComputeBackend for CpuBackend {
    fn name(&self) -> String {
        let (isa, t, acts) = (self.isa.name(), self.threads, self.acts.name());
        format!("cpu ({isa}, {t} threads, {acts} activations)")
    }

    fn check_fits(&self, what: &str, bytes: u64) -> Result<()> {
        match buffers::host_available() {
            Some(available) if bytes > available => Err(Error::OutOfHostMemory {
                what: format!("allocating {what}"),
                needed: Some(bytes),
                available: Some(available),
            }),
            _ => Ok(()),
        }
    }

    fn alloc(&mut self, bytes: usize) -> Result<Buffer> {
        let words =
            buffers::zeroed_words(bytes.div_ceil(4)).ok_or_else(|| Error::OutOfHostMemory {
                what: format!("allocating a CPU buffer of {bytes} bytes"),
                needed: Some(bytes as u64),
                available: buffers::host_available(),
            })?;
        self.store.insert(Slot::Data { words, bytes }, bytes)
    }

    fn upload(&mut self, buf: &Buffer, offset: usize, data: &[u8]) -> Result<()> {
        if self.in_pass
            && (data.len() > crate::backend::PASS_UPLOAD_MAX
                || !offset.is_multiple_of(4)
                || !data.len().is_multiple_of(4))
        {
            return Err(Error::op(
                "upload",
                "inside a pass an upload must be at most 64 KiB, 4-byte aligned",
            ));
        }
        let dst = self.store.bytes_mut("upload", "destination", buf)?;
        let end = offset
            .checked_add(data.len())
            .filter(|e| *e <= dst.len())
            .ok_or_else(|| {
                Error::op(
                    "upload",
                    format!(
                        "{} bytes at {offset} overrun a {}-byte buffer",
                        data.len(),
                        dst.len()
                    ),
                )
            })?;
        dst[offset..end].copy_from_slice(data);
        Ok(())
    }

    fn download(&mut self, buf: &Buffer, offset: usize, out: &mut [u8]) -> Result<()> {
        if self.in_pass {
            return Err(Error::op("download", "not allowed inside a pass"));
        }
        self.store.read("download", buf, offset, out)
    }

    fn free(&mut self, buf: Buffer) {
        self.store.remove(&buf);
    }

    fn alloc_temp(&mut self, bytes: usize) -> Result<Buffer> {
        let fits = (self.temps.iter().enumerate())
            .filter(|(_, t)| t.bytes >= bytes)
            .min_by_key(|(_, t)| t.bytes);
        match fits {
            Some((i, _)) => Ok(self.temps.swap_remove(i)),
            None => self.alloc(bytes),
        }
    }

    fn free_temp(&mut self, buf: Buffer) {
        self.temps.push(buf);
    }

    fn upload_weight(
        &mut self,
        dtype: DType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<Weight> {
        let row_bytes = dtype.row_bytes(cols)?;
        let need = row_bytes.checked_mul(rows).ok_or_else(|| {
            Error::Shape(format!("weight [{rows}, {cols}] {dtype} overflows usize"))
        })?;
        if data.len() != need {
            return Err(Error::Shape(format!(
                "weight [{rows}, {cols}] {dtype} needs {need} bytes, got {}",
                data.len()
            )));
        }
        // Repacked where the decode kernels read groups of rows (integer
        // dots on x86); f32 activations never meet them.
        let packed = self.repack
            && self.isa.int_dots()
            && self.acts != ActivationPrecision::F32
            && repack::packs(dtype)
            && !simd::rows_beat_repacked(self.isa, dtype, self.acts, cols)
            && rows >= repack::R;
        let mut bytes = HostBytes::zeroed(need).ok_or_else(|| Error::OutOfHostMemory {
            what: format!("allocating a CPU weight of {need} bytes"),
            needed: Some(need as u64),
            available: buffers::host_available(),
        })?;
        if packed {
            par::with_team(&self.team, || {
                repack::pack(dtype, data, rows, row_bytes, &mut bytes)
            });
        } else {
            bytes.copy_from_slice(data);
        }
        let w = CpuWeight {
            data: bytes,
            dtype,
            rows,
            cols,
            row_bytes,
            packed,
        };
        let buf = self.store.insert(Slot::Weight(w), need)?;
        Ok(Weight {
            buf,
            dtype,
            rows,
            cols,
        })
    }

    fn set_profiling(&mut self, on: bool) -> Result<()> {
        if self.in_pass {
            return Err(Error::Invalid("set_profiling inside a pass".into()));
        }
        self.profile = on.then(|| (Instant::now(), Vec::new()));
        Ok(())
    }

    fn take_profile(&mut self) -> Vec<ProfileEvent> {
        self.profile
            .as_mut()
            .map(|(_, events)| std::mem::take(events))
            .unwrap_or_default()
    }

    fn begin_pass(&mut self) -> Result<()> {
        if self.in_pass {
            return Err(Error::Invalid("begin_pass inside a pass".into()));
        }
        self.in_pass = true;
        Ok(())
    }

    fn end_pass(&mut self) -> Result<()> {
        if !self.in_pass {
            return Err(Error::Invalid("end_pass without begin_pass".into()));
        }
        self.in_pass = false;
        Ok(())
    }

    fn embedding(&mut self, table: &Weight, ids: &Buffer, out: &Buffer, rows: usize) -> Result<()> {
        let n = rows
            .checked_mul(table.cols)
            .ok_or_else(|| Error::op("embedding", "rows * cols overflows"))?;
        self.with_out("embedding", out, n, n, &[&table.buf, ids], |s, dst, ctx| {
            let w = s.weight("embedding", table)?;
            let ids = s.u32s("embedding", "ids", ids, rows)?;
            embedding::run(ctx, w, ids, dst)
        })
    }

    fn matmul(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        y: &Buffer,
        m: usize,
    ) -> Result<()> {
        let n = m
            .checked_mul(w.rows)
            .ok_or_else(|| Error::op("matmul", "m * rows overflows"))?;
        let mut inputs = vec![&w.buf, x];
        inputs.extend(bias);
        let xn = m
            .checked_mul(w.cols)
            .ok_or_else(|| Error::op("matmul", "m * cols overflows"))?;
        let work = n.saturating_mul(w.cols);
        self.with_out("matmul", y, n, work, &inputs, |s, dst, ctx| {
            let cw = s.weight("matmul", w)?;
            let xs = s.f32s("matmul", "x", x, xn)?;
            let b = bias
                .map(|b| s.f32s("matmul", "bias", b, w.rows))
                .transpose()?;
            matmul::run(ctx, cw.all(), b, xs, dst, m, Some((&s.acts, x.id())));
            Ok(())
        })
    }

    fn rms_norm(
        &mut self,
        x: &Buffer,
        w: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let n = rows
            .checked_mul(dim)
            .ok_or_else(|| Error::op("rms_norm", "rows * dim overflows"))?;
        self.with_out("rms_norm", out, n, n, &[x, w], |s, dst, ctx| {
            let xs = s.f32s("rms_norm", "x", x, n)?;
            let ws = s.f32s("rms_norm", "w", w, dim)?;
            rms_norm::run(ctx.par, xs, ws, dst, dim, eps);
            Ok(())
        })
    }

    fn layer_norm(
        &mut self,
        x: &Buffer,
        w: &Buffer,
        b: &Buffer,
        out: &Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let n = rows
            .checked_mul(dim)
            .ok_or_else(|| Error::op("layer_norm", "rows * dim overflows"))?;
        self.with_out("layer_norm", out, n, n, &[x, w, b], |s, dst, ctx| {
            let xs = s.f32s("layer_norm", "x", x, n)?;
            let ws = s.f32s("layer_norm", "w", w, dim)?;
            let bs = s.f32s("layer_norm", "b", b, dim)?;
            layer_norm::run(ctx.par, xs, ws, bs, dst, dim, eps);
            Ok(())
        })
    }

    fn rope(&mut self, x: &Buffer, positions: &Buffer, p: &RopeParams) -> Result<()> {
        let n = rope::check(p)?;
        let p = *p;
        self.with_out("rope", x, n, n * 4, &[positions], |s, dst, ctx| {
            let pos = s.u32s("rope", "positions", positions, p.rows)?;
            rope::run(ctx.par, dst, pos, &p);
            Ok(())
        })
    }

    fn attention(
        &mut self,
        q: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        positions: &Buffer,
        out: &Buffer,
        p: &AttentionParams,
    ) -> Result<()> {
        f32_cache("attention", p.kv_dtype)?;
        let (nq, nkv) = attention::check(p)?;
        let p = *p;
        // About rows * heads * head_dim * (2 * kv length); positions are only
        // known inside, so assume half the cache.
        let work = nq.saturating_mul(p.capacity);
        let table = p.pages.map(|pg| pg.table);
        let mut inputs = vec![q, k_cache, v_cache, positions];
        inputs.extend(table.as_ref());
        inputs.extend(p.sinks.as_ref());
        self.with_out("attention", out, nq, work, &inputs, |s, dst, ctx| {
            let qs = s.f32s("attention", "q", q, nq)?;
            let ks = s.f32s("attention", "k_cache", k_cache, nkv)?;
            let vs = s.f32s("attention", "v_cache", v_cache, nkv)?;
            let pos = s.u32s("attention", "positions", positions, p.rows)?;
            let words = match &table {
                Some(t) => Some(s.u32s("attention", "page table", t, t.bytes / 4)?),
                None => None,
            };
            let sinks = match &p.sinks {
                Some(b) => Some(s.f32s("attention", "sinks", b, p.n_heads)?),
                None => None,
            };
            let cache = attention::CacheRows::new(words, p.pages.as_ref());
            attention::run(ctx, qs, ks, vs, pos, cache, sinks, dst, &p)
        })
    }

    fn glu(
        &mut self,
        act: Activation,
        gate: &Buffer,
        up: Option<&Buffer>,
        out: &Buffer,
        n: usize,
    ) -> Result<()> {
        if act == Activation::SwigluOai && up.is_none() {
            return Err(Error::op("glu", "the gpt-oss SwiGLU needs an up input"));
        }
        let mut inputs = vec![gate];
        inputs.extend(up);
        self.with_out("glu", out, n, n * 16, &inputs, |s, dst, ctx| {
            let g = s.f32s("glu", "gate", gate, n)?;
            let u = up.map(|u| s.f32s("glu", "up", u, n)).transpose()?;
            glu::run(ctx.par, act, g, u, dst);
            Ok(())
        })
    }

    fn linear_each(
        &mut self,
        x: &Buffer,
        m: usize,
        norm: Option<(&Buffer, f32)>,
        outs: &[Projection],
    ) -> Result<()> {
        let cols = outs.first().map_or(0, |p| p.w.cols);
        let one_job = m <= matmul::GEMV_MAX_M
            && outs.len() > 1
            && cols > 0
            && outs.iter().all(|p| p.w.cols == cols);
        if !one_job {
            return linear_apart(self, x, m, norm, outs);
        }
        with_normed(self, x, m, cols, norm, |be, x| be.matmul_each(x, m, outs))
    }

    fn linear_glu(
        &mut self,
        act: Activation,
        gate_up: &Weight,
        x: &Buffer,
        out: &Buffer,
        m: usize,
        norm: Option<(&Buffer, f32)>,
    ) -> Result<()> {
        let n = gate_up.rows / 2;
        let one_job = m <= matmul::GEMV_MAX_M
            && gate_up.cols > 0
            && match self.store.weight("matmul", gate_up) {
                Ok(w) => matmul::glu_fits(w.all()),
                Err(_) => false,
            };
        if one_job {
            return with_normed(self, x, m, gate_up.cols, norm, |be, x| {
                be.matmul_glu(act, gate_up, x, out, m)
            });
        }
        let total = m
            .checked_mul(gate_up.rows)
            .ok_or_else(|| Error::op("matmul", "m * rows overflows"))?;
        let t = self.alloc_temp(total.saturating_mul(4))?;
        let opts = LinearOpts {
            norm,
            ..LinearOpts::default()
        };
        let result = self.linear(gate_up, x, &t, m, &opts).and_then(|()| {
            self.with_out("glu", out, m * n, m * n * 16, &[&t], |s, dst, ctx| {
                let gu = s.f32s("glu", "gate_up", &t, total)?;
                let row = |i: usize| gu[i * 2 * n..(i + 1) * 2 * n].split_at(n);
                if m == 1 {
                    let (g, u) = row(0);
                    glu::run(ctx.par, act, g, Some(u), dst);
                } else {
                    // A task a row: a job per row kept 14 of 16 threads
                    // idle through a 1B prefill's GLU (5 ms a layer).
                    par::chunks(ctx.par, dst, n, |i, o| {
                        let (g, u) = row(i);
                        glu::run(false, act, g, Some(u), o);
                    });
                }
                Ok(())
            })
        });
        self.free_temp(t);
        result
    }

    fn add(&mut self, a: &Buffer, b: &Buffer, out: &Buffer, n: usize) -> Result<()> {
        // `out` may alias `a` (the residual add) or `b`: read the aliased
        // operand from `out` itself.
        let (a_is_out, b_is_out) = (a.id() == out.id(), b.id() == out.id());
        let inputs: Vec<&Buffer> = [(a, a_is_out), (b, b_is_out)]
            .into_iter()
            .filter(|(_, aliased)| !aliased)
            .map(|(buf, _)| buf)
            .collect();
        self.with_out("add", out, n, n, &inputs, |s, dst, ctx| {
            let (first, other) = match (a_is_out, b_is_out) {
                (true, true) => (None, None),
                (true, false) => (None, Some(s.f32s("add", "b", b, n)?)),
                (false, true) => (None, Some(s.f32s("add", "a", a, n)?)),
                (false, false) => (
                    Some(s.f32s("add", "a", a, n)?),
                    Some(s.f32s("add", "b", b, n)?),
                ),
            };
            add::run(ctx.par, dst, first, other);
            Ok(())
        })
    }

    fn round_i8(&mut self, x: &Buffer, out: &Buffer, rows: usize, dim: usize) -> Result<()> {
        if dim == 0 {
            return Err(Error::op("round_i8", "dim must be positive"));
        }
        let n = rows
            .checked_mul(dim)
            .ok_or_else(|| Error::op("round_i8", "rows * dim overflows"))?;
        let aliased = x.id() == out.id();
        let inputs: Vec<&Buffer> = if aliased { vec![] } else { vec![x] };
        self.with_out("round_i8", out, n, n * 2, &inputs, |st, dst, ctx| {
            if !aliased {
                dst.copy_from_slice(st.f32s("round_i8", "x", x, n)?);
            }
            round_i8::run(ctx.par, dst, dim);
            Ok(())
        })
    }

    fn scale(&mut self, x: &Buffer, s: f32, out: &Buffer, n: usize) -> Result<()> {
        let aliased = x.id() == out.id();
        let inputs: Vec<&Buffer> = if aliased { vec![] } else { vec![x] };
        self.with_out("scale", out, n, 0, &inputs, |st, dst, _| {
            if !aliased {
                dst.copy_from_slice(st.f32s("scale", "x", x, n)?);
            }
            scale::scale_in_place(dst, s);
            Ok(())
        })
    }

    fn copy(
        &mut self,
        src: &Buffer,
        src_offset: usize,
        dst: &Buffer,
        dst_offset: usize,
        bytes: usize,
    ) -> Result<()> {
        self.in_pass("copy")?;
        self.timed("copy", 2 * bytes as u64, |b| {
            copy::copy(&mut b.store, src, src_offset, dst, dst_offset, bytes)
        })
    }

    fn argmax(
        &mut self,
        x: &Buffer,
        allowed: Option<&Buffer>,
        out: &Buffer,
        rows: usize,
        n: usize,
    ) -> Result<()> {
        const OP: &str = "argmax";
        let total = rows
            .checked_mul(n)
            .ok_or_else(|| Error::op(OP, "rows * n overflows"))?;
        let words = rows
            .checked_mul(n.div_ceil(32))
            .ok_or_else(|| Error::op(OP, "rows * n overflows"))?;
        let inputs: Vec<&Buffer> = std::iter::once(x).chain(allowed).collect();
        self.with_out(OP, out, rows, 0, &inputs, |s, dst, _| {
            let xs = s.f32s(OP, "x", x, total)?;
            let mask = allowed
                .map(|a| s.u32s(OP, "allowed", a, words))
                .transpose()?;
            argmax::run(xs, mask, n, bytemuck::cast_slice_mut(dst));
            Ok(())
        })
    }

    fn store_rows(
        &mut self,
        src: &Buffer,
        dst: &Buffer,
        positions: &Buffer,
        rows: usize,
        row_len: usize,
        dst_dtype: DType,
        pages: Option<&KvPages>,
    ) -> Result<()> {
        self.in_pass("store_rows")?;
        f32_cache("store_rows", dst_dtype)?;
        let bytes = (src.bytes + dst.bytes) as u64;
        self.timed("store_rows", bytes, |b| {
            store_rows::run(&mut b.store, src, dst, positions, rows, row_len, pages)
        })
    }

    fn route_experts(
        &mut self,
        logits: &Buffer,
        ids: &Buffer,
        weights: &Buffer,
        p: &RouteParams,
    ) -> Result<()> {
        const OP: &str = "route_experts";
        let (n, nk) = check::route(OP, p)?;
        check::fits(OP, "ids", ids, nk)?;
        let bytes = (logits.bytes + ids.bytes + weights.bytes) as u64;
        self.timed(OP, bytes, |be| {
            be.in_pass(OP)?;
            let l = be.store.f32s(OP, "logits", logits, n)?;
            let (mut chosen, mut ws) = (vec![0u32; nk], vec![0f32; nk]);
            route_experts::run(l, p, &mut chosen, &mut ws);
            be.store.words_mut(OP, "ids", ids)?[..nk].copy_from_slice(&chosen);
            let out = be.store.words_mut(OP, "weights", weights)?;
            let out = out
                .get_mut(..nk)
                .ok_or_else(|| Error::op(OP, format!("weights hold fewer than {nk} values")))?;
            for (o, w) in out.iter_mut().zip(ws) {
                *o = w.to_bits();
            }
            Ok(())
        })
    }

    fn matmul_experts(
        &mut self,
        w: &Weight,
        bias: Option<&Buffer>,
        x: &Buffer,
        ids: &Buffer,
        y: &Buffer,
        p: &ExpertsParams,
    ) -> Result<()> {
        const OP: &str = "matmul_experts";
        let check::Experts { slots, xn, yn, .. } = check::experts(OP, w, p)?;
        let mut inputs = vec![&w.buf, x, ids];
        inputs.extend(bias);
        let work = yn.saturating_mul(w.cols);
        self.with_out(OP, y, yn, work, &inputs, |s, dst, ctx| {
            let cw = s.weight(OP, w)?;
            let xs = s.f32s(OP, "x", x, xn)?;
            let chosen = s.u32s(OP, "ids", ids, slots)?;
            let b = bias.map(|b| s.f32s(OP, "bias", b, w.rows)).transpose()?;
            matmul_experts::run(ctx, cw, b, xs, chosen, dst, p)
        })
    }

    fn sum_experts(
        &mut self,
        y: &Buffer,
        weights: &Buffer,
        out: &Buffer,
        rows: usize,
        k: usize,
        n: usize,
        add: bool,
    ) -> Result<()> {
        const OP: &str = "sum_experts";
        let (on, yn) = check::sum_experts(OP, rows, k, n)?;
        self.with_out(OP, out, on, yn, &[y, weights], |s, dst, _| {
            let ys = s.f32s(OP, "y", y, yn)?;
            let ws = s.f32s(OP, "weights", weights, rows * k)?;
            sum_experts::run(ys, ws, k, n, add, dst);
            Ok(())
        })
    }

    fn append_token(&mut self, ids: &Buffer, positions: &Buffer, history: &Buffer) -> Result<()> {
        self.in_pass("append_token")?;
        self.timed("append_token", 0, |b| {
            append_token::run(&mut b.store, ids, positions, history)
        })
    }

    fn rope_store(
        &mut self,
        q: &Buffer,
        k: &Buffer,
        v: &Buffer,
        positions: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        p: &RopeParams,
        n_kv_heads: usize,
        kv_dtype: DType,
        pages: Option<&KvPages>,
    ) -> Result<()> {
        f32_cache("rope_store", kv_dtype)?;
        self.rope(q, positions, p)?;
        self.timed("rope_store", (k.bytes + v.bytes) as u64, |b| {
            // Prefill's rows roped on the team (decode's one row inline).
            let (store, team, par) = (&mut b.store, &b.team, b.threads > 1);
            par::with_team(team, || {
                rope_store::store_kv(
                    store, par, k, v, positions, k_cache, v_cache, p, n_kv_heads, pages,
                )
            })
        })
    }
}

/// The CPU backend keeps its KV caches in f32: its attention kernels
/// (cpu/attention.rs, the SIMD dot products) read f32 rows directly, host
/// memory is not what limits CPU decode at these context lengths, and an f16
/// cache would add a conversion to every key and value read on every token.
fn f32_cache(op: &'static str, dtype: DType) -> Result<()> {
    if dtype == DType::F32 {
        return Ok(());
    }
    Err(Error::Unsupported(format!(
        "{op}: the CPU backend keeps KV caches in f32, not {} (use --kv-cache f32)",
        dtype.name()
    )))
}
