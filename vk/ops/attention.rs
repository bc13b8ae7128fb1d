//! `attention`. Decode (up to four rows, head_dim a multiple of 8 up to
//! 256, on a device with subgroup shuffles): glsl/attention_decode.comp, one
//! workgroup per (kv head, tile of its query heads, row, key split), the span
//! split so a long context still fills the GPU, then
//! glsl/attention_combine.comp merges the splits. Prefill (more rows):
//! glsl/attention_prefill.comp, tiles of query rows of one GQA group against
//! key tiles in shared memory, so the cache is read once per tile of rows
//! instead of once per (row, head). Shapes neither takes fall back to
//! glsl/attention.comp (one workgroup per (head, row)).
//!
//! Paged caches (`AttentionParams::pages`, glsl/kv_pages.glsl) run the same
//! kernels with their PAGED bit, the same plans. Per-row tables (`stride >
//! 0`, rows of different sequences) run only row-independent kernels: the
//! decode kernel for any number of rows, else attention.comp, never the
//! prefill tiles, whose rows share each K tile. Every page length from 16
//! up works in every kernel: the tile kernels load a tile a key row at a
//! time, each row through the table, so a tile may straddle pages; the
//! decode kernel stages the page ids of whole rounds of keys a chunk at a
//! time, which needs pages of at least 16 (DECODE_MIN_PAGE_LOG2; shorter
//! pages take attention.comp instead, as do the fused rope and append).
//!
//! Attention sinks (`AttentionParams::sinks`) are every kernel's SINKS bit
//! and one more binding (absent: q stands in, never read): a head's sink
//! joins its denominator where its output is made final, in the kernel
//! with one split, else once in the merge of the splits.

use super::kv_pages::{paged, table_binding, PagePush};
use super::Encoder;
use super::{atomic, plain, read, read_or_write, u32_of, write};
use crate::backend::{check, AttentionParams, Buffer};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::vk::caps::{MatmulKernel, PrefillAttention};
use bytemuck::{Pod, Zeroable};

/// The shader keeps 8 output dims per invocation of a 64-wide workgroup.
const MAX_HEAD_DIM: usize = 512;
/// Rows up to which attention_decode.comp runs (keys split across workgroups).
const SPLIT_MAX_ROWS: usize = 4;
/// Shortest pages (log2) attention_decode.comp takes: its PAGE_SLOTS page
/// ids cover a round's keys (up to 2048) only in pages of 16 or more.
const DECODE_MIN_PAGE_LOG2: u32 = 4;
/// attention_decode.comp: invocations, most query heads per workgroup (its
/// registers hold 16 R floats per head), most head_dim, most 8-value units
/// per lane (R). More heads per workgroup ran no faster and wider split
/// workgroups far slower (benches/README.md, decode attention).
const DECODE_WG: usize = 128;
const DECODE_MAX_HEADS: usize = 4;
const DECODE_MAX_HEAD_DIM: usize = 256;
const DECODE_MAX_UNITS: usize = 8;
/// Unsplit decode attention (one dispatch, no merge of splits; see
/// `Encoder::decode_plan`) up to this many keys x head_dim (twice that where
/// the split kernel's workgroups would take several heads), one query head
/// per workgroup of UNSPLIT_WG invocations (or fewer where shared memory is
/// short).
const UNSPLIT_KEY_DIMS: usize = 32 << 10;
const UNSPLIT_WG: usize = 512;
/// Keys per split at least (SPLIT_MIN in attention_split.glsl).
const SPLIT_MIN: usize = 32;
/// The most splits (attention_combine.comp's MAX_SPLITS).
const MAX_SPLITS: usize = 256;
/// Output dims per attention_combine.comp workgroup (its DS), and with q8
/// output (one block of 32).
const COMBINE_DIMS: u32 = 16;
const COMBINE_DIMS_Q8: u32 = 32;
/// (kv head, head tile) pairs a decode attention aims for: a model with few
/// kv heads gives each workgroup fewer query heads (reading a kv head's
/// keys once per tile, mostly from L2) so the splits need not be many
/// short ones. More pairs helped some shapes at short spans but slowed
/// others at depth (benches/README.md, decode attention).
const DECODE_MIN_HEAD_GROUPS: usize = 8;
/// Workgroups a decode attention aims for (kv heads x head tiles x rows x
/// splits), about four per SM of a 132-SM H100/H200: 256 or 1024 ran slower
/// at depth, and fewer splits (so that the last could merge four heads)
/// far slower (benches/README.md, decode attention).
const DECODE_TARGET_WGS: usize = 512;
/// Split spans up to this many keys x head_dim take one query head per
/// workgroup where the last split can then merge (see merges_last): the
/// merge dispatch and its barrier go, and the last split writes the o
/// projection's int8 digits. Longer spans of the 8B lost that way
/// (benches/README.md, decode attention).
const ONE_HEAD_KEY_DIMS: usize = 256 << 10;
/// Twice that where head_dim is at most 64 and a kv head has at most 8
/// query heads (so at most 8 workgroups read each cached key): such groups
/// gained from one-head tiles at span 8192, where the 8B lost
/// (benches/README.md, decode attention).
const ONE_HEAD_KEY_DIMS_SMALL_GROUPS: usize = 512 << 10;
const SMALL_GROUP: usize = 8;
const SMALL_GROUP_HEAD_DIM: usize = 64;
/// attention_prefill.comp: invocations, keys per tile, most head_dim (its
/// register tile holds BR * head_dim / 128 <= 32 floats per invocation).
const FLASH_WG: usize = 128;
const FLASH_BC: usize = 32;
const FLASH_MAX_HEAD_DIM: usize = 128;
/// attention_prefill_coopmat.comp: query vectors per workgroup (BR), and the
/// largest head_dim its fragments and shared memory (32 KiB at 128) cover.
const COOPMAT_BR: usize = 64;
const COOPMAT_MAX_HEAD_DIM: usize = 128;
/// The coopmat kernel splits its keys where its (query tile, kv head)
/// workgroups are fewer than this (SmolLM2's 512 rows: 72), into chunks of
/// at least PREFILL_SPLIT_MIN keys (sized from the positions): a smaller
/// grid leaves the GPU idle, while for a larger one the partial results and
/// the merge cost more than the wider grid gains (benches/README.md,
/// prefill attention).
const PREFILL_TARGET_WGS: usize = 256;
const PREFILL_SPLIT_MIN: usize = 512;

/// Shared memory attention_prefill.comp declares for `br` query vectors per
/// tile (mirrors its declarations; `paged`: the tile's cache rows too).
fn flash_shared_bytes(br: usize, head_dim: usize, paged: bool) -> usize {
    let qs = head_dim / 4 + 1;
    let rows = if paged { FLASH_BC * 4 } else { 0 };
    (br + FLASH_BC) * qs * 16 + br * (FLASH_BC + 1) * 4 + 5 * br * 4 + rows
}

/// Partial outputs of one head an invocation of attention_decode_merge
/// merges at most (MERGE_LOADS in the shader).
const MERGE_LOADS: usize = 32;

/// Whether a split decode pass lets its last split merge the others
/// (attention_decode_merge) instead of a dispatch of attention_combine.comp:
/// where each invocation's share of the merge, over the tile's heads, is
/// at most MERGE_LOADS partials (head_dim and the splits within one
/// workgroup). Every split then pays a memory barrier and an atomic, and
/// the last one's merge waits on them, so this saves only part of the
/// merge dispatch's cost; tiles of several heads would make one workgroup
/// merge them all, which lost (benches/README.md, decode attention).
fn merges_last(plan: &DecodePlan, head_dim: usize) -> bool {
    let groups = plan.wg / head_dim.max(1);
    plan.n_split > 1
        && head_dim <= plan.wg
        && plan.n_split <= plan.wg
        && groups > 0
        && plan.tiles.heads * plan.n_split.div_ceil(groups) <= MERGE_LOADS
}

/// Shared memory attention_decode.comp declares for `heads` query heads,
/// clusters of `lanes` and workgroups of `wg` (mirrors its declarations: qs,
/// red, red_m, red_l, kf, vf, outs, bscale, dsum; `paged`: kpage).
fn decode_shared_bytes(
    heads: usize,
    lanes: usize,
    head_dim: usize,
    wg: usize,
    paged: bool,
) -> usize {
    let clusters = wg / lanes;
    let q8 = head_dim + head_dim / 32 + 1 + head_dim / 4;
    let pages = if paged {
        page_slots(wg, lanes, heads)
    } else {
        0
    };
    (heads * head_dim + clusters * (head_dim + 2) + 2 * head_dim + q8 + pages) * 4
}

/// attention_decode.comp's PAGE_SLOTS: page ids it stages per chunk of
/// keys, enough for a round's keys (U per cluster) in pages of 16, and 64
/// at least.
fn page_slots(wg: usize, lanes: usize, heads: usize) -> usize {
    let round = wg / lanes.max(1) * if heads == 1 { 4 } else { 2 };
    (round / 16 + 2).max(64)
}

/// Rows `p`'s cache buffers must hold ([`check::kv_rows`]). A paged pass
/// needs a page in its pool: its kernels read page 0 in place of one past
/// the pool (and fail the pass).
pub(super) fn cache_rows(op: &'static str, p: &AttentionParams) -> Result<usize> {
    let rows = check::kv_rows(op, p.pages.as_ref(), p.rows, p.capacity)?;
    if p.rows > 0 && p.pages.is_some_and(|pg| pg.pages == 0) {
        return Err(Error::op(op, "a paged cache needs at least one page"));
    }
    Ok(rows)
}

/// How attention_decode.comp runs one pass: its tiling, workgroup size and
/// key splits (merged by attention_combine.comp when more than one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::vk) struct DecodePlan {
    pub tiles: DecodeTiles,
    pub wg: usize,
    pub n_split: usize,
}

/// How attention_decode.comp tiles one shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::vk) struct DecodeTiles {
    /// Workgroups per kv head, and query heads per workgroup.
    pub tiles: usize,
    pub heads: usize,
    /// Subgroup lanes per key (C).
    pub lanes: usize,
}

/// attention_decode.comp's tiling for `n_kv_heads` GQA groups of `group`
/// heads in workgroups of `wg`, or None where the kernel cannot take the
/// shape: head_dim a multiple of 8 up to 256; C lanes per key, the largest
/// power of two that divides head_dim / 8 and fits the subgroup (and 32),
/// each lane on head_dim / 8C units of 8 values (at most 8); tiles of at
/// most 4 heads, as even as possible, and enough of them for `min_groups`
/// (kv head, tile) pairs where the group allows, all within the device's
/// shared memory (with a paged cache's page ids where `paged`).
#[allow(clippy::too_many_arguments)]
pub(in crate::vk) fn decode_tiles(
    n_kv_heads: usize,
    group: usize,
    head_dim: usize,
    subgroup_size: u32,
    max_shared: u32,
    wg: usize,
    min_groups: usize,
    paged: bool,
) -> Option<DecodeTiles> {
    if head_dim == 0 || !head_dim.is_multiple_of(8) || head_dim > DECODE_MAX_HEAD_DIM || group == 0
    {
        return None;
    }
    let units = head_dim / 8;
    let fit = (subgroup_size as usize).min(32);
    if fit == 0 {
        return None;
    }
    let lanes = (1usize << units.trailing_zeros()).min(1 << fit.ilog2());
    if units / lanes > DECODE_MAX_UNITS {
        return None;
    }
    let wanted = min_groups.div_ceil(n_kv_heads.max(1)).min(group);
    let mut tiles = group.div_ceil(DECODE_MAX_HEADS).max(wanted);
    loop {
        let heads = group.div_ceil(tiles);
        if decode_shared_bytes(heads, lanes, head_dim, wg, paged) <= max_shared as usize {
            return Some(DecodeTiles {
                tiles,
                heads,
                lanes,
            });
        }
        if heads == 1 {
            return None;
        }
        tiles += 1;
    }
}

/// Query vectors per attention_prefill.comp workgroup for `head_dim`, or
/// None where the kernel cannot take it: 32 when it fits the device's shared
/// memory (more K/V reuse), else 16.
pub(in crate::vk) fn flash_tile(head_dim: usize, max_shared: u32, paged: bool) -> Option<usize> {
    if head_dim == 0 || !head_dim.is_multiple_of(4) || head_dim > FLASH_MAX_HEAD_DIM {
        return None;
    }
    [32, 16].into_iter().find(|&br| {
        (br * FLASH_BC).is_multiple_of(FLASH_WG)
            && flash_shared_bytes(br, head_dim, paged) <= max_shared as usize
    })
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Push {
    rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    scale: f32,
    window: u32,
    n_split: u32,
    /// attention.comp: keys per split; the coopmat prefill kernel: keys per
    /// chunk at least (attention_split.glsl).
    split_len: u32,
    pages: PagePush,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct DecodePush {
    rows: u32,
    n_heads: u32,
    n_kv_heads: u32,
    capacity: u32,
    scale: f32,
    window: u32,
    n_split: u32,
    head_tiles: u32,
    /// With an [`Append`]: its rotation (else 0).
    rot_dim: u32,
    neox: u32,
    /// With int8 digits out of one split: words from one row to the next.
    q8_stride: u32,
    pages: PagePush,
}

/// A decode step's rope and cache append, done by attention_decode.comp
/// (its ROPE mode): the step's new k and v rows and the step's rotations
/// (`Encoder::step_rotations`; any buffer when `rot_dim` is 0).
pub(in crate::vk) struct Append<'a> {
    pub k: &'a Buffer,
    pub v: &'a Buffer,
    pub rotations: Buffer,
    pub rot_dim: u32,
    pub neox: bool,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct CombinePush {
    rows: u32,
    n_heads: u32,
    head_dim: u32,
    n_split: u32,
    capacity: u32,
    window: u32,
    /// 0: decode's splits (attention_split.glsl); else the prefill kernel's
    /// chunks, of at least this many keys.
    min_chunk: u32,
    /// Nonzero: the output also goes to the xq scratch as quantize_q8.comp
    /// writes it, rows this many words apart.
    q8_stride: u32,
}

/// Key chunks of the coopmat prefill kernel for `base` workgroups over a
/// cache of `capacity` (their length follows the positions on the device).
fn prefill_splits(base: usize, capacity: usize) -> usize {
    PREFILL_TARGET_WGS
        .div_ceil(base.max(1))
        .min(capacity / PREFILL_SPLIT_MIN)
        .clamp(1, MAX_SPLITS)
}

impl Encoder<'_> {
    pub(in crate::vk) fn encode_attention(
        &mut self,
        q: &Buffer,
        k_cache: &Buffer,
        v_cache: &Buffer,
        positions: &Buffer,
        out: &Buffer,
        p: &AttentionParams,
    ) -> Result<()> {
        const OP: &str = "attention";
        if p.n_heads == 0 || p.n_kv_heads == 0 || !p.n_heads.is_multiple_of(p.n_kv_heads) {
            return Err(Error::op(
                OP,
                format!(
                    "n_heads {} must be a positive multiple of n_kv_heads {}",
                    p.n_heads, p.n_kv_heads
                ),
            ));
        }
        if p.head_dim == 0 || p.head_dim > MAX_HEAD_DIM {
            return Err(Error::op(
                OP,
                format!("head_dim {} must be in 1..={MAX_HEAD_DIM}", p.head_dim),
            ));
        }
        let overflow = || Error::op(OP, "shape overflows");
        let q_elems = p
            .rows
            .checked_mul(p.n_heads * p.head_dim)
            .ok_or_else(overflow)?;
        let cache_rows = cache_rows(OP, p)?;
        let kv_elems = cache_rows
            .checked_mul(p.n_kv_heads * p.head_dim)
            .ok_or_else(overflow)?;
        check::fits(OP, "q", q, q_elems)?;
        check::fits(OP, "out", out, q_elems)?;
        check::fits_kv(OP, "k_cache", k_cache, kv_elems, p.kv_dtype)?;
        check::fits_kv(OP, "v_cache", v_cache, kv_elems, p.kv_dtype)?;
        let f16 = u32::from(p.kv_dtype == DType::F16);
        check::fits(OP, "positions", positions, p.rows)?;
        if let Some(s) = &p.sinks {
            check::fits(OP, "sinks", s, p.n_heads)?;
        }
        if p.rows == 0 {
            return Ok(());
        }
        let sinks = u32::from(p.sinks.is_some());
        let push = Push {
            rows: u32_of(OP, "rows", p.rows)?,
            n_heads: u32_of(OP, "n_heads", p.n_heads)?,
            n_kv_heads: u32_of(OP, "n_kv_heads", p.n_kv_heads)?,
            head_dim: u32_of(OP, "head_dim", p.head_dim)?,
            capacity: u32_of(OP, "capacity", p.capacity)?,
            scale: p.scale,
            window: u32_of(OP, "window", p.window)?,
            n_split: 1,
            split_len: u32_of(OP, "capacity", p.capacity)?,
            pages: PagePush::new(OP, p.pages.as_ref(), p.rows, cache_rows)?,
        };
        let pages = p.pages.as_ref();
        let per_row_tables = pages.is_some_and(|pg| pg.stride > 0);
        let max = self.caps().max_workgroup_count;
        if push.n_heads > max[0] || push.rows > max[1] {
            return Err(Error::op(
                OP,
                "rows or heads exceed the device's workgroup limits",
            ));
        }
        let status = self.status;
        let group = p.n_heads / p.n_kv_heads;
        if let Some(plan) = self.decode_plan(p) {
            return self.encode_attention_decode(
                [q, k_cache, v_cache, positions, out],
                p,
                plan,
                None,
            );
        }
        if p.rows > SPLIT_MAX_ROWS && !per_row_tables {
            if let Some((shader, spec, br)) = self.prefill_kernel(p, push.head_dim, f16, sinks) {
                let q_tiles = p.rows.checked_mul(group).ok_or_else(overflow)?.div_ceil(br);
                let n_split = if br == COOPMAT_BR {
                    prefill_splits(q_tiles.saturating_mul(p.n_kv_heads), p.capacity)
                } else {
                    1
                };
                let q_tiles = u32_of(OP, "query tiles", q_tiles)?;
                if q_tiles > max[0] || push.n_kv_heads > max[1] || n_split as u32 > max[2] {
                    return Err(Error::op(
                        OP,
                        "rows or heads exceed the device's workgroup limits",
                    ));
                }
                let push = Push {
                    n_split: n_split as u32,
                    split_len: PREFILL_SPLIT_MIN as u32,
                    ..push
                };
                // The flash kernel and an unsplit pass never touch `part`.
                let part_floats = if n_split > 1 {
                    q_elems / p.head_dim * n_split * (p.head_dim + 2)
                } else {
                    1
                };
                let part = self.scratch(|b| &mut b.attn_scratch, part_floats * 4)?;
                self.dispatch(
                    OP,
                    plain(shader).spec(spec),
                    &[
                        read(q),
                        read(k_cache),
                        read(v_cache),
                        read(positions),
                        write(out),
                        atomic(&status),
                        write(&part),
                        table_binding(pages, &status),
                        read(p.sinks.as_ref().unwrap_or(q)),
                    ],
                    bytemuck::bytes_of(&push),
                    [q_tiles, push.n_kv_heads, push.n_split],
                )?;
                return self.encode_combine(
                    &part,
                    out,
                    positions,
                    CombinePush {
                        rows: push.rows,
                        n_heads: push.n_heads,
                        head_dim: push.head_dim,
                        n_split: push.n_split,
                        capacity: push.capacity,
                        window: push.window,
                        min_chunk: push.split_len,
                        q8_stride: 0,
                    },
                    None,
                    p.sinks.as_ref(),
                );
            }
        }
        // One split: attention.comp writes `out` itself and never reads
        // `part`, bound only because the shader declares it.
        let part = self.scratch(|b| &mut b.attn_scratch, 4)?;
        self.dispatch(
            OP,
            plain("attention").spec(f16 | paged(pages) << 1 | sinks << 2),
            &[
                read(q),
                read(k_cache),
                read(v_cache),
                read(positions),
                write(out),
                atomic(&status),
                write(&part),
                table_binding(pages, &status),
                read(p.sinks.as_ref().unwrap_or(q)),
            ],
            bytemuck::bytes_of(&push),
            [push.n_heads, push.rows, 1],
        )
    }

    /// The query-tiled prefill kernel for `p` (`f16`: the cache holds f16)
    /// as (shader, specialization constant, query vectors per workgroup), or
    /// None where attention.comp's rows take it: the cooperative-matrix
    /// kernel where chosen and able, else the f32 flash tiles.
    fn prefill_kernel(
        &self,
        p: &AttentionParams,
        head_dim: u32,
        f16: u32,
        sinks: u32,
    ) -> Option<(&'static str, u32, usize)> {
        let coopmat = match (self.kernels.attention, self.kernels.matmul) {
            (PrefillAttention::Coopmat, MatmulKernel::CoopmatKhr) => {
                Some("attention_prefill_coopmat_khr")
            }
            (PrefillAttention::Coopmat, MatmulKernel::CoopmatNv) => {
                Some("attention_prefill_coopmat_nv")
            }
            _ => None,
        };
        let coopmat_fits =
            f16 == 1 && p.head_dim.is_multiple_of(16) && p.head_dim <= COOPMAT_MAX_HEAD_DIM;
        let paged = paged(p.pages.as_ref());
        if let Some(shader) = coopmat.filter(|_| coopmat_fits) {
            // Specialization constant 0: head_dim | PAGED << 16 | SINKS << 17.
            return Some((shader, head_dim | (paged << 16) | (sinks << 17), COOPMAT_BR));
        }
        if self.kernels.attention == PrefillAttention::Rows {
            return None;
        }
        let br = flash_tile(p.head_dim, self.caps().max_shared_memory, paged == 1)?;
        // Specialization constant 0: head_dim | BR << 16 | f16 << 24 |
        // PAGED << 25 | SINKS << 26 (see the shader).
        Some((
            "attention_prefill",
            head_dim | ((br as u32) << 16) | (f16 << 24) | (paged << 25) | (sinks << 26),
            br,
        ))
    }

    /// attention_decode.comp tiled as `t`, with `append` (a single row)
    /// roping q and appending the row's k and v too, then
    /// attention_combine.comp. Shapes are checked by the caller.
    pub(super) fn encode_attention_decode(
        &mut self,
        [q, k_cache, v_cache, positions, out]: [&Buffer; 5],
        p: &AttentionParams,
        plan: DecodePlan,
        append: Option<Append>,
    ) -> Result<()> {
        const OP: &str = "attention";
        let (t, n_split) = (plan.tiles, plan.n_split);
        // Where the next weight (the o projection) will read the output as
        // int8 digits (gemv_q8), they are written too (when head_dim is a
        // multiple of 32, one block per 32 dims): by this kernel when the
        // keys are not split, else by the merge, so the projection's
        // quantize dispatch goes. A weight that would read f32 must not get
        // digits: it ran slower on them (benches/README.md, decode
        // attention).
        let k = p.n_heads * p.head_dim;
        let q8 = (p.head_dim.is_multiple_of(32)
            && p.next.is_some_and(|w| self.takes_q8(w.dtype, w.bytes)))
        .then(|| self.q8_scratch(p.rows, k))
        .transpose()?;
        let q8_stride = q8.map_or(Ok(0), |(_, stride)| u32_of(OP, "stride", stride))?;
        // The last split to finish merges the rest where its share is
        // small (see merges_last); else attention_combine.comp does.
        let merges = merges_last(&plan, p.head_dim);
        let digits_here = q8.filter(|_| n_split == 1 || merges).map(|(xq, _)| xq);
        let push = DecodePush {
            rows: u32_of(OP, "rows", p.rows)?,
            n_heads: u32_of(OP, "n_heads", p.n_heads)?,
            n_kv_heads: u32_of(OP, "n_kv_heads", p.n_kv_heads)?,
            capacity: u32_of(OP, "capacity", p.capacity)?,
            scale: p.scale,
            window: u32_of(OP, "window", p.window)?,
            n_split: n_split as u32,
            head_tiles: t.tiles as u32,
            rot_dim: append.as_ref().map_or(0, |a| a.rot_dim),
            neox: append.as_ref().map_or(0, |a| u32::from(a.neox)),
            q8_stride,
            pages: PagePush::new(OP, p.pages.as_ref(), p.rows, cache_rows(OP, p)?)?,
        };
        let x = p
            .n_kv_heads
            .checked_mul(t.tiles)
            .ok_or_else(|| Error::op(OP, "shape overflows"))?;
        let x = u32_of(OP, "kv heads * head tiles", x)?;
        let max = self.caps().max_workgroup_count;
        if x > max[0] || push.rows > max[1] || push.n_split > max[2] || push.n_heads > max[0] {
            return Err(Error::op(
                OP,
                "rows or heads exceed the device's workgroup limits",
            ));
        }
        let part_floats = p.rows * p.n_heads * n_split * (p.head_dim + 2);
        let part = self.scratch(|b| &mut b.attn_scratch, part_floats * 4)?;
        let arrivals = if merges {
            let n = x as usize * p.rows;
            Some(self.zeroed_scratch(|b| &mut b.attn_arrivals, n * 4)?)
        } else {
            None
        };
        // Specialization constant 0: head_dim | heads per tile << 10 |
        // log2(lanes per key) << 14 | (f16 cache) << 24 | ROPE << 25 |
        // Q8 << 26 | PAGED << 27 | SINKS << 28.
        let spec = p.head_dim as u32
            | ((t.heads as u32) << 10)
            | (t.lanes.trailing_zeros() << 14)
            | (u32::from(p.kv_dtype == DType::F16) << 24)
            | (u32::from(append.is_some()) << 25)
            | (u32::from(digits_here.is_some()) << 26)
            | (paged(p.pages.as_ref()) << 27)
            | (u32::from(p.sinks.is_some()) << 28);
        // Bindings a mode leaves unused get the status words, which no
        // barrier tracking sees.
        let status = self.status;
        let unused = || atomic(&status);
        let appends = append.is_some();
        // Big workgroups merge their clusters by shuffles first.
        let kernel = if plan.wg > DECODE_WG {
            "attention_decode_unsplit"
        } else if arrivals.is_some() {
            "attention_decode_merge"
        } else {
            "attention_decode"
        };
        self.dispatch(
            OP,
            plain(kernel).specs([spec, u32_of(OP, "workgroup", plan.wg)?, 0]),
            &[
                read(q),
                read_or_write(k_cache, appends),
                read_or_write(v_cache, appends),
                read(positions),
                write(out),
                atomic(&status),
                write(&part),
                append.as_ref().map_or_else(unused, |a| read(a.k)),
                append.as_ref().map_or_else(unused, |a| read(a.v)),
                append.as_ref().map_or_else(unused, |a| read(&a.rotations)),
                // Statically written by the shader: unused, it gets `out`,
                // which this dispatch writes anyway (the status words would
                // be a write the validation layer sees unordered).
                write(digits_here.as_ref().unwrap_or(out)),
                arrivals.as_ref().map_or_else(unused, write),
                table_binding(p.pages.as_ref(), &status),
                read(p.sinks.as_ref().unwrap_or(q)),
            ],
            bytemuck::bytes_of(&push),
            [x, push.rows, push.n_split],
        )?;
        if arrivals.is_none() {
            self.encode_combine(
                &part,
                out,
                positions,
                CombinePush {
                    rows: push.rows,
                    n_heads: push.n_heads,
                    head_dim: p.head_dim as u32,
                    n_split: push.n_split,
                    capacity: push.capacity,
                    window: push.window,
                    min_chunk: 0,
                    q8_stride,
                },
                q8.as_ref().map(|(xq, _)| xq),
                p.sinks.as_ref(),
            )?;
        }
        if let Some((xq, _)) = q8 {
            self.mark_quantized(out, None, p.rows, k, &xq);
        }
        Ok(())
    }

    /// How attention_decode.comp runs `p` on this device, or None where it
    /// cannot (more than SPLIT_MAX_ROWS rows unless it is the prefill
    /// kernel too, `PrefillAttention::Decode`, or the rows have page tables
    /// of their own; no subgroup shuffles, a head shape it does not take,
    /// pages under DECODE_MIN_PAGE_LOG2). The split count follows the shape and
    /// `p.span`, never the positions, so a recorded pass stays valid for any
    /// position; the split length follows the span read on the device
    /// (attention_split.glsl).
    ///
    /// Up to a short span the keys are not split: workgroups of 512, one
    /// query head each, attend the whole span, and the merge dispatch and its
    /// barrier go; the kernel writes the o projection's int8 digits where the
    /// merge would. The unsplit workgroup pays per key and dim; the split
    /// pass pays its merge and, where its workgroups take several heads
    /// (TinyLlama, the 1B, the 8B), more per workgroup, so the budget
    /// doubles there (benches/README.md, decode attention). Past that
    /// budget, up to ONE_HEAD_KEY_DIMS (or ONE_HEAD_KEY_DIMS_SMALL_GROUPS),
    /// the split workgroups take one query head each where the last split
    /// can merge. Without `Kernels::decode_splits` (a CPU device) every
    /// span runs unsplit in workgroups of DECODE_WG, tiles of up to four
    /// heads.
    pub(super) fn decode_plan(&self, p: &AttentionParams) -> Option<DecodePlan> {
        let c = self.caps();
        let per_row_tables = p.pages.is_some_and(|pg| pg.stride > 0);
        let rows_fit = p.rows <= SPLIT_MAX_ROWS
            || per_row_tables
            || self.kernels.attention == PrefillAttention::Decode;
        let short_pages = p
            .pages
            .is_some_and(|pg| pg.page_log2 < DECODE_MIN_PAGE_LOG2);
        if !rows_fit || short_pages || !c.subgroup_shuffle || p.n_kv_heads == 0 {
            return None;
        }
        let group = p.n_heads / p.n_kv_heads;
        let tiles = |wg, min_groups| {
            decode_tiles(
                p.n_kv_heads,
                group,
                p.head_dim,
                c.subgroup_size,
                c.max_shared_memory,
                wg,
                min_groups,
                p.pages.is_some(),
            )
        };
        let mut span = p.span.min(p.capacity);
        if p.window > 0 {
            span = span.min(p.window);
        }
        if !self.kernels.decode_splits {
            // Fewest workgroups, each kv head's keys read once per tile.
            return Some(DecodePlan {
                tiles: tiles(DECODE_WG, 1)?,
                wg: DECODE_WG,
                n_split: 1,
            });
        }
        let t = tiles(DECODE_WG, DECODE_MIN_HEAD_GROUPS)?;
        let budget = UNSPLIT_KEY_DIMS * if t.heads > 1 { 2 } else { 1 };
        if span.saturating_mul(p.head_dim) <= budget {
            let mut wg = UNSPLIT_WG;
            while wg > DECODE_WG {
                // One query head per workgroup: as many tiles as the group.
                if let Some(t) = tiles(wg, p.n_heads).filter(|t| t.heads == 1) {
                    return Some(DecodePlan {
                        tiles: t,
                        wg,
                        n_split: 1,
                    });
                }
                wg /= 2;
            }
        }
        let split = |t: DecodeTiles| {
            let groups = p
                .n_kv_heads
                .saturating_mul(t.tiles)
                .saturating_mul(p.rows)
                .max(1);
            let n_split = DECODE_TARGET_WGS
                .div_ceil(groups)
                .min(span.div_ceil(SPLIT_MIN))
                .clamp(1, MAX_SPLITS);
            DecodePlan {
                tiles: t,
                wg: DECODE_WG,
                n_split,
            }
        };
        let one_head_key_dims = if group <= SMALL_GROUP && p.head_dim <= SMALL_GROUP_HEAD_DIM {
            ONE_HEAD_KEY_DIMS_SMALL_GROUPS
        } else {
            ONE_HEAD_KEY_DIMS
        };
        if span.saturating_mul(p.head_dim) <= one_head_key_dims {
            let one = tiles(DECODE_WG, p.n_heads)
                .filter(|t| t.heads == 1)
                .map(split);
            if let Some(plan) = one.filter(|plan| merges_last(plan, p.head_dim)) {
                return Some(plan);
            }
        }
        Some(split(t))
    }

    /// attention_combine.comp: merges the `c.n_split` partial results of
    /// each (row, head) in `part` into `out` (nothing to merge for one),
    /// with each head's sink in its denominator where given, and with `xq`
    /// quantizes `out` into it (`c.q8_stride`).
    fn encode_combine(
        &mut self,
        part: &Buffer,
        out: &Buffer,
        positions: &Buffer,
        c: CombinePush,
        xq: Option<&Buffer>,
        sinks: Option<&Buffer>,
    ) -> Result<()> {
        if c.n_split == 1 {
            return Ok(());
        }
        let dims = if xq.is_some() {
            COMBINE_DIMS_Q8
        } else {
            COMBINE_DIMS
        };
        let x = c.n_heads.saturating_mul(c.head_dim.div_ceil(dims));
        if x > self.caps().max_workgroup_count[0] {
            return Err(Error::op(
                "attention",
                "heads exceed the device's workgroup limits",
            ));
        }
        // Unused, binding 3 gets the status words (no barrier tracking sees
        // them); `out` is bound before xq (see `mark_quantized`). Without
        // sinks, positions stand in at binding 4 (never read).
        let status = self.status;
        self.dispatch(
            "attention",
            plain("attention_combine").specs([dims, u32::from(sinks.is_some()), 0]),
            &[
                read(part),
                write(out),
                read(positions),
                xq.map_or_else(|| atomic(&status), write),
                read(sinks.unwrap_or(positions)),
            ],
            bytemuck::bytes_of(&c),
            [x, c.rows, 1],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_tiles, DecodeTiles, DECODE_MIN_HEAD_GROUPS, DECODE_WG};

    /// The split kernel's tiling.
    fn tiles(kv: usize, group: usize, hd: usize, sg: u32, shared: u32) -> Option<DecodeTiles> {
        decode_tiles(
            kv,
            group,
            hd,
            sg,
            shared,
            DECODE_WG,
            DECODE_MIN_HEAD_GROUPS,
            false,
        )
    }

    #[test]
    fn decode_tiles_fit_subgroups_and_shared_memory() {
        let t = |tiles, heads, lanes| {
            Some(DecodeTiles {
                tiles,
                heads,
                lanes,
            })
        };
        const NV: u32 = 48 << 10;
        const LVP: u32 = 32 << 10;
        // (kv heads, group, head_dim, subgroup, shared memory)
        assert_eq!(tiles(3, 3, 64, 32, NV), t(3, 1, 8)); // SmolLM2
        assert_eq!(tiles(4, 8, 64, 32, NV), t(2, 4, 8)); // TinyLlama
        assert_eq!(tiles(8, 4, 64, 32, NV), t(1, 4, 8)); // Llama-3.2-1B
        assert_eq!(tiles(8, 4, 128, 32, NV), t(1, 4, 16)); // Llama-3.1-8B
        assert_eq!(tiles(8, 4, 128, 8, LVP), t(1, 4, 8)); // lavapipe: R = 2
        assert_eq!(tiles(8, 16, 64, 32, NV), t(4, 4, 8));
        assert_eq!(tiles(8, 9, 64, 32, NV), t(3, 3, 8));
        assert_eq!(tiles(1, 4, 256, 32, NV), t(4, 1, 32)); // Gemma 3 270M
        assert_eq!(tiles(8, 8, 256, 8, LVP), t(2, 4, 8));
        assert_eq!(tiles(4, 1, 80, 32, NV), t(1, 1, 2)); // 10 units: C = 2, R = 5
        assert_eq!(tiles(8, 1, 256, 64, NV), t(1, 1, 32)); // C stays within 32
                                                           // 9 KiB: tiles of 4, 3 or 2 heads of 256 dims would not fit, 1 does.
        assert_eq!(tiles(8, 8, 256, 32, 9 << 10), t(8, 1, 32));
        assert_eq!(tiles(8, 1, 6, 32, NV), None);
        assert_eq!(tiles(8, 1, 12, 32, NV), None); // not a multiple of 8
        assert_eq!(tiles(8, 1, 264, 32, NV), None);
        assert_eq!(tiles(8, 1, 128, 1, NV), None); // 16 units per lane
        assert_eq!(tiles(8, 1, 256, 8, 8 << 10), None);
    }

    #[test]
    fn unsplit_tiles_take_one_head_per_big_workgroup() {
        let one = |tiles, lanes| {
            Some(DecodeTiles {
                tiles,
                heads: 1,
                lanes,
            })
        };
        const NV: u32 = 48 << 10;
        const LVP: u32 = 32 << 10;
        // (kv heads, group, head_dim, subgroup, shared memory, workgroup, heads)
        assert_eq!(decode_tiles(3, 3, 64, 32, NV, 512, 9, false), one(3, 8)); // SmolLM2
        assert_eq!(decode_tiles(4, 8, 64, 32, NV, 512, 32, false), one(8, 8)); // TinyLlama
        assert_eq!(decode_tiles(8, 4, 64, 32, NV, 512, 32, false), one(4, 8)); // Llama-3.2-1B
        assert_eq!(decode_tiles(8, 4, 128, 32, NV, 512, 32, false), one(4, 16)); // Llama-3.1-8B
                                                                                 // lavapipe's 32 KiB: 64 clusters of 8 lanes over 128 dims do not fit, 32 do.
        assert_eq!(decode_tiles(8, 4, 128, 8, LVP, 512, 32, false), None);
        assert_eq!(decode_tiles(8, 4, 128, 8, LVP, 256, 32, false), one(4, 8));
    }
}
