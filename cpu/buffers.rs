//! The CPU backend's buffer store: handles map to word-aligned allocations
//! (so f32/u32 views need no copies); ids are never reused, so a freed or
//! foreign handle is always reported instead of aliasing a newer buffer.

use crate::backend::Buffer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use std::collections::HashMap;

/// `n` zeroed words, or `None` when the allocator refuses: `vec![0; n]`
/// would abort the process instead, and a host app must survive a request
/// too large for the machine. Zeroed pages come from the OS untouched
/// (calloc), so a large KV cache costs no time until it is written.
pub(crate) fn zeroed_words(n: usize) -> Option<Vec<u32>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u32>(n).ok()?;
    // SAFETY: `layout` has a nonzero size (n > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of
    // `[u32; n]`, all bytes are zero (a valid u32), and length = capacity = n.
    Some(unsafe { Vec::from_raw_parts(ptr.cast::<u32>(), n, n) })
}

/// Zeroed bytes in an anonymous mapping of their own. Weights are large
/// and live as long as the model: unmapped on drop, they go straight back
/// to the OS, where freed heap blocks stayed resident in a malloc arena
/// (a load failing halfway kept ~40 MiB, `tests/faults.rs`).
pub(crate) struct HostBytes {
    map: memmap2::MmapMut,
    len: usize,
}

impl HostBytes {
    /// `len` zeroed bytes, or `None` when the OS refuses the mapping.
    pub fn zeroed(len: usize) -> Option<HostBytes> {
        // A mapping cannot be empty.
        let map = memmap2::MmapMut::map_anon(len.max(1)).ok()?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Some(HostBytes { map, len })
    }
}

impl std::ops::Deref for HostBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

impl std::ops::DerefMut for HostBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map[..self.len]
    }
}

/// Host memory the OS can still give (`MemAvailable` in /proc/meminfo), or
/// `None` where that is unknown.
pub fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// A weight as uploaded (GGUF block bytes, row-major), or repacked.
pub(crate) struct CpuWeight {
    pub data: HostBytes,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// Whole groups of `repack::R` rows are interleaved for the decode
    /// kernels (`cpu::repack`); read rows through [`CpuWeight::rows_at`].
    pub packed: bool,
}

impl CpuWeight {
    /// GGUF rows `r0..r1` (`r0 <= r1 <= rows`): borrowed from `data`, or
    /// rebuilt into `scratch` when the weight is repacked.
    pub fn rows_at<'a>(&'a self, r0: usize, r1: usize, scratch: &'a mut Vec<u8>) -> &'a [u8] {
        self.all().rows_at(r0, r1, scratch)
    }

    /// The whole weight, as the matmul kernels read it.
    pub fn all(&self) -> WeightRows<'_> {
        WeightRows {
            data: &self.data,
            dtype: self.dtype,
            rows: self.rows,
            cols: self.cols,
            row_bytes: self.row_bytes,
            packed: self.packed,
        }
    }

    /// Rows `r0..r0 + n` as a weight of their own (one expert's matrix),
    /// where the repacked groups allow it (`r0` and `n` whole groups, or no
    /// repacking); `None` otherwise.
    pub fn rows_view(&self, r0: usize, n: usize) -> Option<WeightRows<'_>> {
        let r1 = r0.checked_add(n).filter(|&r1| r1 <= self.rows)?;
        let group = super::repack::R;
        if self.packed && (!r0.is_multiple_of(group) || !n.is_multiple_of(group)) {
            return None;
        }
        Some(WeightRows {
            data: &self.data[r0 * self.row_bytes..r1 * self.row_bytes],
            rows: n,
            ..self.all()
        })
    }
}

/// Consecutive rows of a [`CpuWeight`] (all of them, or one expert's).
#[derive(Clone, Copy)]
pub(crate) struct WeightRows<'a> {
    pub data: &'a [u8],
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// Whole groups of `repack::R` rows are interleaved (see [`CpuWeight`]).
    pub packed: bool,
}

impl<'a> WeightRows<'a> {
    /// GGUF rows `r0..r1` (`r0 <= r1 <= rows`): borrowed from `data`, or
    /// rebuilt into `scratch` when the weight is repacked.
    pub fn rows_at(&self, r0: usize, r1: usize, scratch: &'a mut Vec<u8>) -> &'a [u8] {
        let rb = self.row_bytes;
        if !self.packed {
            return &self.data[r0 * rb..r1 * rb];
        }
        scratch.resize((r1 - r0) * rb, 0);
        super::repack::unpack_rows(self.dtype, self.data, self.rows, rb, r0, r1, scratch);
        scratch
    }
}

pub(crate) enum Slot {
    /// `bytes` bytes in `ceil(bytes / 4)` words.
    Data {
        words: Vec<u32>,
        bytes: usize,
    },
    Weight(CpuWeight),
}

#[derive(Default)]
pub(crate) struct Store {
    slots: HashMap<u32, Slot>,
    next: u32,
    /// Quantized decode activations of one buffer, forgotten whenever that
    /// buffer is handed out for writing.
    pub acts: super::matmul::ActsMemo,
}

impl Store {
    pub fn insert(&mut self, slot: Slot, bytes: usize) -> Result<Buffer> {
        let id = self.next;
        self.next = self
            .next
            .checked_add(1)
            .ok_or_else(|| Error::Invalid("the CPU backend ran out of buffer ids".into()))?;
        self.slots.insert(id, slot);
        Ok(Buffer::new(id, bytes))
    }

    pub fn remove(&mut self, buf: &Buffer) -> Option<Slot> {
        self.acts.forget(buf.id());
        self.slots.remove(&buf.id())
    }

    pub fn restore(&mut self, buf: &Buffer, slot: Slot) {
        self.slots.insert(buf.id(), slot);
    }

    fn slot(&self, op: &'static str, what: &str, buf: &Buffer) -> Result<&Slot> {
        self.slots.get(&buf.id()).ok_or_else(|| {
            Error::op(
                op,
                format!("{what}: buffer {} is freed or unknown", buf.id()),
            )
        })
    }

    pub fn bytes(&self, op: &'static str, what: &str, buf: &Buffer) -> Result<&[u8]> {
        match self.slot(op, what, buf)? {
            Slot::Data { words, bytes } => Ok(&bytemuck::cast_slice(words)[..*bytes]),
            Slot::Weight(w) if !w.packed => Ok(&w.data),
            // Its bytes are no longer GGUF rows.
            Slot::Weight(_) => Err(Error::op(
                op,
                format!("{what}: buffer {} is a repacked weight", buf.id()),
            )),
        }
    }

    /// `out.len()` bytes of `buf` from byte `offset`: a repacked weight
    /// reads as the GGUF rows it was uploaded as.
    pub fn read(
        &self,
        op: &'static str,
        buf: &Buffer,
        offset: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let (src, packed): (&[u8], _) = match self.slot(op, "source", buf)? {
            Slot::Data { words, bytes } => (&bytemuck::cast_slice(words)[..*bytes], None),
            Slot::Weight(w) => (&w.data, w.packed.then_some(w)),
        };
        let len = src.len();
        let end = offset
            .checked_add(out.len())
            .filter(|e| *e <= len)
            .ok_or_else(|| {
                Error::op(
                    op,
                    format!(
                        "{} bytes at {offset} overrun a {len}-byte buffer",
                        out.len()
                    ),
                )
            })?;
        match packed {
            Some(w) if end > offset => {
                let rb = w.row_bytes;
                let r0 = offset / rb;
                let mut scratch = Vec::new();
                let rows = w.rows_at(r0, end.div_ceil(rb), &mut scratch);
                out.copy_from_slice(&rows[offset - r0 * rb..end - r0 * rb]);
            }
            Some(_) => {}
            None => out.copy_from_slice(&src[offset..end]),
        }
        Ok(())
    }

    pub fn bytes_mut(&mut self, op: &'static str, what: &str, buf: &Buffer) -> Result<&mut [u8]> {
        self.acts.forget(buf.id());
        match self.slots.get_mut(&buf.id()) {
            Some(Slot::Data { words, bytes }) => Ok(&mut bytemuck::cast_slice_mut(words)[..*bytes]),
            Some(Slot::Weight(_)) => Err(Error::op(
                op,
                format!("{what}: buffer {} is a weight", buf.id()),
            )),
            None => Err(Error::op(
                op,
                format!("{what}: buffer {} is freed or unknown", buf.id()),
            )),
        }
    }

    /// Every whole 4-byte value of `buf`, writable.
    pub fn words_mut(&mut self, op: &'static str, what: &str, buf: &Buffer) -> Result<&mut [u32]> {
        self.acts.forget(buf.id());
        match self.slots.get_mut(&buf.id()) {
            Some(Slot::Data { words, bytes }) => Ok(&mut words[..*bytes / 4]),
            Some(Slot::Weight(_)) => Err(Error::op(
                op,
                format!("{what}: buffer {} is a weight", buf.id()),
            )),
            None => Err(Error::op(
                op,
                format!("{what}: buffer {} is freed or unknown", buf.id()),
            )),
        }
    }

    fn words(&self, op: &'static str, what: &str, buf: &Buffer, n: usize) -> Result<&[u32]> {
        match self.slot(op, what, buf)? {
            Slot::Data { words, bytes } => {
                if n.checked_mul(4).is_none_or(|need| need > *bytes) {
                    return Err(Error::op(
                        op,
                        format!("{what} holds {bytes} bytes but {n} values are needed"),
                    ));
                }
                Ok(&words[..n])
            }
            Slot::Weight(_) => Err(Error::op(
                op,
                format!("{what}: buffer {} is a weight", buf.id()),
            )),
        }
    }

    /// The first `n` values of `buf` as f32.
    pub fn f32s(&self, op: &'static str, what: &str, buf: &Buffer, n: usize) -> Result<&[f32]> {
        Ok(bytemuck::cast_slice(self.words(op, what, buf, n)?))
    }

    pub fn u32s(&self, op: &'static str, what: &str, buf: &Buffer, n: usize) -> Result<&[u32]> {
        self.words(op, what, buf, n)
    }

    pub fn weight(&self, op: &'static str, w: &crate::backend::Weight) -> Result<&CpuWeight> {
        match self.slot(op, "weight", &w.buf)? {
            Slot::Weight(cw) if cw.dtype == w.dtype && cw.rows == w.rows && cw.cols == w.cols => {
                Ok(cw)
            }
            Slot::Weight(cw) => Err(Error::op(
                op,
                format!(
                    "weight handle says {} [{}, {}] but the buffer holds {} [{}, {}]",
                    w.dtype, w.rows, w.cols, cw.dtype, cw.rows, cw.cols
                ),
            )),
            Slot::Data { .. } => Err(Error::op(
                op,
                format!("buffer {} is not a weight", w.buf.id()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::backend::ComputeBackend;
    use crate::error::{Error, ErrorKind};

    /// A request the machine cannot hold is an error a host app can match,
    /// not an abort (`vec![0; n]` would abort).
    #[test]
    fn impossible_allocations_are_out_of_host_memory() {
        let mut b = crate::cpu::CpuBackend::new(Some(1));
        for bytes in [1usize << 50, usize::MAX - 8] {
            match b.alloc(bytes) {
                Err(e @ Error::OutOfHostMemory { .. }) => {
                    assert_eq!(e.kind(), ErrorKind::OutOfHostMemory);
                    assert!(e.to_string().contains(&bytes.to_string()), "{e}");
                }
                other => panic!("{bytes} bytes: expected out of host memory, got {other:?}"),
            }
        }
        assert!(b.alloc(0).is_ok() && b.alloc(12).is_ok());
    }

    /// Intermediates come back for reuse: the smallest one that fits, else
    /// a new buffer.
    #[test]
    fn temps_are_reused_smallest_fit_first() {
        let mut b = crate::cpu::CpuBackend::new(Some(1));
        let (big, small) = (b.alloc_temp(4096).unwrap(), b.alloc_temp(64).unwrap());
        assert_ne!(big.id(), small.id());
        b.free_temp(big);
        b.free_temp(small);
        assert_eq!(b.alloc_temp(32).unwrap().id(), small.id());
        assert_eq!(b.alloc_temp(100).unwrap().id(), big.id());
        let fresh = b.alloc_temp(100).unwrap();
        assert!(fresh.id() != big.id() && fresh.id() != small.id());
        assert!(fresh.bytes >= 100);
    }

    /// A repacked weight downloads as the GGUF rows uploaded, whole or any
    /// byte range of it.
    #[test]
    fn repacked_weights_download_as_uploaded() {
        use crate::dtype::DType;
        let mut b = crate::cpu::CpuBackend::new(Some(2)).with_repack(true);
        for dtype in DType::ALL
            .into_iter()
            .filter(|&d| crate::cpu::repack::packs(d))
        {
            let (rows, cols) = (37, 512);
            let rb = dtype.row_bytes(cols).unwrap();
            let data: Vec<u8> = (0..rows * rb).map(|i| (i * 131 + i / 977) as u8).collect();
            let w = b.upload_weight(dtype, rows, cols, &data).unwrap();
            let mut all = vec![0u8; data.len()];
            b.download(&w.buf, 0, &mut all).unwrap();
            assert!(all == data, "{dtype}");
            for (at, n) in [
                (3, 1),
                (rb - 5, 17),
                (16 * rb + 7, 3 * rb),
                (data.len() - 9, 9),
            ] {
                let mut part = vec![0u8; n];
                b.download(&w.buf, at, &mut part).unwrap();
                assert!(part == data[at..at + n], "{dtype} {at}+{n}");
            }
            let mut over = vec![0u8; 2];
            assert!(b.download(&w.buf, data.len() - 1, &mut over).is_err());
        }
    }
}
