//! The KV cache as pages, for many sequences at once: the host-side
//! bookkeeping of continuous batching (issue 57). No device code lives here.
//!
//! How the runner uses it: every layer's K and V are one device array of
//! `pages × page_len` positions, and a [`PageId`] names the same page in
//! every layer, so one [`PagePool`] serves the whole model. Each step the
//! runner writes the page tables of the batch's sequences
//! ([`Sequence::pages`]) into a device buffer; attention reads a row's K/V
//! through its sequence's table and the KV append writes position `p` at
//! page `pages[p / page_len]`, slot `p % page_len`.
//!
//! A sequence's life: [`PagePool::add`] with its prompt reuses the cached
//! pages of an equal prompt prefix and says how many positions need no
//! evaluation; before each pass the runner calls [`PagePool::append`] with
//! the token ids whose K/V the pass writes, and first performs the page copy
//! it may return (copy-on-write of a shared partial page); [`PagePool::fork`]
//! shares a sequence (beams, parallel samples), [`PagePool::truncate`] drops
//! its tail, [`PagePool::free`] ends it. A full page is cached as soon as it
//! is appended, so a pass must write every row's K/V of a layer before that
//! layer's attention reads (as a single pass does anyway), or sequences must
//! be added between passes.
//!
//! Design after vLLM's block pool (chained block hashes, LRU eviction of
//! free cached blocks, at least one prompt token left to evaluate) and
//! llama.cpp's unified cache (one pool, sequences sharing cells).

#[cfg(test)]
mod check;
mod store;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;

use crate::error::{Error, Result};
use store::{PageStore, ROOT_KEY};

/// Index of a page in every layer's K/V page arrays (`u32` as in the device
/// page tables).
pub type PageId = u32;

/// A sequence of a [`PagePool`]; ids are never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(u64);

impl SeqId {
    /// The id as a number (the C API's handle of a sequence).
    pub fn to_raw(self) -> u64 {
        self.0
    }
    /// The id a number names; a number that names no live sequence is an
    /// unknown sequence to every call that takes it.
    pub fn from_raw(raw: u64) -> SeqId {
        SeqId(raw)
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A sequence's page table: position `p` lives in `pages()[p / page_len]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sequence {
    pages: Vec<PageId>,
    positions: usize,
    /// Empty pages taken ahead by [`PagePool::reserve`], the next appends'.
    reserved: Vec<PageId>,
    /// Its pages never enter the prefix cache ([`PagePool::add_private`]).
    private: bool,
}

impl Sequence {
    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    /// The device's page table: the pages, then the reserved ones (where
    /// steps whose tokens the device chooses write).
    pub fn table(&self) -> impl Iterator<Item = PageId> + '_ {
        self.pages.iter().chain(self.reserved.iter().rev()).copied()
    }

    /// Positions whose K/V the sequence holds.
    pub fn positions(&self) -> usize {
        self.positions
    }
}

/// A device copy the backend must do before the pass that follows: the first
/// `positions` slots of page `src` into page `dst`, K and V of every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageCopy {
    pub src: PageId,
    pub dst: PageId,
    pub positions: usize,
}

/// Fixed-size KV pages shared by sequences, with a prefix cache.
#[derive(Debug)]
pub struct PagePool {
    page_len: usize,
    store: PageStore,
    seqs: HashMap<SeqId, Sequence>,
    next_seq: u64,
}

impl PagePool {
    /// A pool of `pages` pages of `page_len` positions each.
    pub fn new(pages: usize, page_len: usize) -> Result<Self> {
        let count = u32::try_from(pages).ok().filter(|&n| n > 0);
        let Some(count) = count.filter(|_| page_len > 0) else {
            return Err(Error::Invalid(format!(
                "a KV page pool needs 1 to {} pages of at least 1 position, not {pages} of {page_len}",
                u32::MAX
            )));
        };
        let store = PageStore::new(count).ok_or_else(|| {
            Error::out_of_host_memory(format!(
                "keeping the books of a KV page pool of {pages} pages"
            ))
        })?;
        Ok(PagePool {
            page_len,
            store,
            seqs: HashMap::new(),
            next_seq: 0,
        })
    }

    /// Positions per page.
    pub fn page_len(&self) -> usize {
        self.page_len
    }

    /// Pages that appends can still get: empty ones and those holding only a
    /// cached prefix (evicted when needed).
    pub fn available(&self) -> usize {
        self.store.available()
    }

    pub fn get(&self, seq: SeqId) -> Option<&Sequence> {
        self.seqs.get(&seq)
    }

    /// A new sequence for `prompt`, holding the cached pages of its longest
    /// cached prefix of whole pages; returns it and how many positions those
    /// pages hold. At least the last prompt token is left out (its logits are
    /// needed), so the caller appends and evaluates `prompt[reused..]`.
    pub fn add(&mut self, prompt: &[u32]) -> (SeqId, usize) {
        let max_pages = prompt.len().saturating_sub(1) / self.page_len;
        let mut seq = Sequence::default();
        let mut parent = ROOT_KEY;
        for chunk in prompt.chunks_exact(self.page_len).take(max_pages) {
            let Some((page, key)) = self.store.lookup(parent, chunk) else {
                break;
            };
            self.store.hold(page);
            seq.pages.push(page);
            parent = key;
        }
        seq.positions = seq.pages.len() * self.page_len;
        let reused = seq.positions;
        (self.insert(seq), reused)
    }

    /// A new empty sequence whose pages never enter the prefix cache: freed,
    /// they are empty again and go back to the free list, so a lone private
    /// sequence always holds the pool's first pages in order.
    pub fn add_private(&mut self) -> SeqId {
        self.insert(Sequence {
            private: true,
            ..Sequence::default()
        })
    }

    /// Appends the positions of `tokens` to `seq`, taking pages as needed
    /// (evicting cached prefixes least recently used first). When the last
    /// page is partial and shared, `seq` gets a private copy first and the
    /// copy is returned for the backend to do. A full pool is an error that
    /// changes nothing.
    pub fn append(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Option<PageCopy>> {
        let s = self.seqs.get(&seq).ok_or_else(|| unknown(seq))?;
        let (mut pages, mut positions) = (s.pages.clone(), s.positions);
        let mut reserved = s.reserved.clone();
        let private = s.private;
        let l = self.page_len;
        let end = positions.checked_add(tokens.len()).ok_or_else(|| {
            Error::Invalid(format!(
                "sequence {seq} cannot grow past {} positions",
                usize::MAX
            ))
        })?;
        let in_page = positions % l;
        let shared_tail = match pages.last() {
            Some(&p) if in_page > 0 && !tokens.is_empty() => {
                (self.store.page(p).refs > 1).then_some(p)
            }
            _ => None,
        };
        let need = (end.div_ceil(l) + usize::from(shared_tail.is_some()))
            .saturating_sub(pages.len() + reserved.len());
        let (count, available) = (tokens.len(), self.store.available());
        let full = || {
            Error::out_of_device_memory(format!(
                "appending {count} positions to sequence {seq}: the KV page pool needs {need} pages of {l} positions and has {available} free"
            ))
        };
        if need > available {
            return Err(full());
        }
        let mut copy = None;
        if let Some(src) = shared_tail {
            let dst = self.store.take().ok_or_else(full)?;
            let kept = self
                .store
                .page(src)
                .tokens
                .iter()
                .take(in_page)
                .copied()
                .collect();
            self.store.page_mut(dst).tokens = kept;
            self.store.release(src);
            let last = pages.len() - 1;
            pages[last] = dst;
            copy = Some(PageCopy {
                src,
                dst,
                positions: in_page,
            });
        } else if let Some(&p) = pages.last().filter(|_| in_page > 0 && !tokens.is_empty()) {
            // Private, but may hold positions past `positions` (truncated)
            // and a cached prefix that the write below would falsify.
            if self.store.page(p).tokens.len() > in_page {
                self.store.forget(p);
                self.store.page_mut(p).tokens.truncate(in_page);
            }
        }
        for &token in tokens {
            if positions % l == 0 {
                let page = match reserved.pop() {
                    Some(p) => p,
                    None => self.store.take().ok_or_else(full)?,
                };
                pages.push(page);
            }
            let at = pages.len() - 1;
            let page = self.store.page_mut(pages[at]);
            page.tokens.push(token);
            positions += 1;
            if page.tokens.len() == l && !private {
                let parent = match at {
                    0 => ROOT_KEY,
                    _ => self
                        .store
                        .page(pages[at - 1])
                        .chain
                        .map_or(ROOT_KEY, |c| c.key),
                };
                self.store.register(pages[at], parent);
            }
        }
        self.seqs.insert(
            seq,
            Sequence {
                pages,
                positions,
                reserved,
                private,
            },
        );
        Ok(copy)
    }

    /// Takes the pages `seq` needs to hold `positions` positions in all,
    /// before their tokens are known (steps whose tokens the device
    /// chooses): they join its [`Sequence::table`] now and its pages as
    /// [`PagePool::append`] fills them. A full pool is an error that changes
    /// nothing.
    pub fn reserve(&mut self, seq: SeqId, positions: usize) -> Result<()> {
        let l = self.page_len;
        let s = self.seqs.get(&seq).ok_or_else(|| unknown(seq))?;
        let need = positions
            .div_ceil(l)
            .saturating_sub(s.pages.len() + s.reserved.len());
        if need > self.store.available() {
            return Err(Error::out_of_device_memory(format!(
                "reserving {positions} positions for sequence {seq}: the KV page pool needs {need} more pages of {l} positions and has {} free",
                self.store.available()
            )));
        }
        let mut taken = Vec::with_capacity(need);
        for _ in 0..need {
            taken.extend(self.store.take());
        }
        if let Some(s) = self.seqs.get_mut(&seq) {
            // A stack popped from the end: pages needed later go in front.
            for p in taken {
                s.reserved.insert(0, p);
            }
        }
        Ok(())
    }

    /// A new sequence sharing every page of `seq`.
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId> {
        let mut s = self.seqs.get(&seq).ok_or_else(|| unknown(seq))?.clone();
        s.reserved.clear();
        for &p in &s.pages {
            self.store.hold(p);
        }
        Ok(self.insert(s))
    }

    /// Keeps the first `positions` positions of `seq`, releasing the pages
    /// past them (a page still partly used keeps its data until written).
    pub fn truncate(&mut self, seq: SeqId, positions: usize) -> Result<()> {
        let s = self.seqs.get_mut(&seq).ok_or_else(|| unknown(seq))?;
        if positions > s.positions {
            return Err(Error::Invalid(format!(
                "cannot truncate sequence {seq} to {positions} positions: it holds {}",
                s.positions
            )));
        }
        let dropped = s.pages.split_off(positions.div_ceil(self.page_len));
        s.positions = positions;
        let reserved = std::mem::take(&mut s.reserved);
        for p in reserved {
            self.store.release(p);
        }
        // Tail first: the LRU list then evicts a prefix from its end.
        for &p in dropped.iter().rev() {
            self.store.release(p);
        }
        Ok(())
    }

    /// Ends `seq`; its pages return to the pool, full ones staying cached.
    pub fn free(&mut self, seq: SeqId) -> Result<()> {
        self.truncate(seq, 0)?;
        self.seqs.remove(&seq);
        Ok(())
    }

    fn insert(&mut self, s: Sequence) -> SeqId {
        let id = SeqId(self.next_seq);
        self.next_seq += 1;
        self.seqs.insert(id, s);
        id
    }
}

fn unknown(seq: SeqId) -> Error {
    Error::Invalid(format!(
        "sequence {seq} is not in the KV page pool (never added, or freed)"
    ))
}
