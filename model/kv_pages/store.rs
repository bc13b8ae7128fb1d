//! Page bookkeeping under [`super::PagePool`]: holders per page, the free
//! list, the least-recently-used list of free pages that still hold a cached
//! prefix, and the prefix map from chain keys to pages.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

use super::PageId;

/// The parent key of a sequence's first page.
pub(super) const ROOT_KEY: u64 = 0;

/// Chain key of a full page: its token ids and, through `parent` (the key
/// of the page before it), every token before them. SipHash from std: keyed
/// the same in every process, which is all an in-memory cache needs.
pub(super) fn chain_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// Where a full page sits in the prefix chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Chain {
    pub key: u64,
    pub parent: u64,
}

#[derive(Debug, Default)]
pub(super) struct Page {
    /// Sequences whose page table lists this page.
    pub refs: u32,
    /// Token ids whose K/V the page holds, position by position. A holder may
    /// use fewer (it truncated); the rest is dropped when it next writes.
    pub tokens: Vec<u32>,
    /// Set when the page is full; cleared when it is written again.
    pub chain: Option<Chain>,
    /// The prefix map lists this page under `chain.key`.
    pub cached: bool,
    /// Its place in `lru` while it is free and cached.
    pub tick: u64,
}

#[derive(Debug)]
pub(super) struct PageStore {
    pub pages: Vec<Page>,
    /// Free pages with nothing worth keeping: handed out first, lowest id
    /// first (a lone sequence's pages then follow each other, which lets
    /// the runner read its cache unpaged).
    pub free: BinaryHeap<Reverse<PageId>>,
    /// Free pages that still hold a cached prefix, oldest release first.
    pub lru: BTreeMap<u64, PageId>,
    pub prefix: HashMap<u64, PageId>,
    clock: u64,
}

impl PageStore {
    /// `count` fits a [`PageId`] (the pool checks it).
    /// None where the host cannot hold the bookkeeping of `count` pages.
    pub fn new(count: u32) -> Option<Self> {
        let n = count as usize;
        let mut pages = Vec::new();
        pages.try_reserve_exact(n).ok()?;
        pages.extend((0..count).map(|_| Page::default()));
        let mut free = Vec::new();
        free.try_reserve_exact(n).ok()?;
        free.extend((0..count).map(Reverse));
        Some(PageStore {
            pages,
            free: BinaryHeap::from(free),
            lru: BTreeMap::new(),
            prefix: HashMap::new(),
            clock: 0,
        })
    }

    pub fn page(&self, id: PageId) -> &Page {
        &self.pages[id as usize]
    }

    pub fn page_mut(&mut self, id: PageId) -> &mut Page {
        &mut self.pages[id as usize]
    }

    /// Pages that [`PageStore::take`] can hand out.
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// A page for one new holder to write: an empty one if any, else the
    /// least recently used cached one, whose prefix is dropped.
    pub fn take(&mut self) -> Option<PageId> {
        let id = match self.free.pop() {
            Some(Reverse(id)) => id,
            None => self.lru.pop_first()?.1,
        };
        self.forget(id);
        let page = self.page_mut(id);
        page.tokens.clear();
        page.refs = 1;
        Some(id)
    }

    /// One more holder of a page that is held or cached.
    pub fn hold(&mut self, id: PageId) {
        let page = &self.pages[id as usize];
        if page.refs == 0 {
            let tick = page.tick;
            self.lru.remove(&tick);
        }
        self.page_mut(id).refs += 1;
    }

    /// One holder fewer; the last one leaves the page cached (at the young
    /// end of the LRU list) or empty on the free list.
    pub fn release(&mut self, id: PageId) {
        let tick = self.clock;
        let page = self.page_mut(id);
        debug_assert!(page.refs > 0, "page {id} released with no holder");
        page.refs = page.refs.saturating_sub(1);
        if page.refs > 0 {
            return;
        }
        if page.cached {
            page.tick = tick;
            self.lru.insert(tick, id);
            self.clock += 1;
        } else {
            page.tokens.clear();
            page.chain = None;
            self.free.push(Reverse(id));
        }
    }

    /// Marks a page that just became full and lists it in the prefix map,
    /// unless another page holds the same prefix already (holders keep
    /// their pages: page tables only grow at the end).
    pub fn register(&mut self, id: PageId, parent: u64) {
        let key = chain_key(parent, &self.page(id).tokens);
        let page = self.page_mut(id);
        page.chain = Some(Chain { key, parent });
        if let std::collections::hash_map::Entry::Vacant(e) = self.prefix.entry(key) {
            e.insert(id);
            self.pages[id as usize].cached = true;
        }
    }

    /// Takes a page out of the prefix map before it is written again.
    pub fn forget(&mut self, id: PageId) {
        let page = self.page_mut(id);
        let chain = page.chain.take();
        if std::mem::take(&mut page.cached) {
            if let Some(c) = chain {
                self.prefix.remove(&c.key);
            }
        }
    }

    /// The cached page after `parent` holding `tokens`, with its key. The
    /// tokens and the parent key are compared, so a hash collision costs a
    /// miss, never a wrong page (two whole prefixes hashing alike in 64 bits
    /// is the one case left).
    pub fn lookup(&self, parent: u64, tokens: &[u32]) -> Option<(PageId, u64)> {
        let key = chain_key(parent, tokens);
        let id = *self.prefix.get(&key)?;
        let page = self.page(id);
        let same = page.tokens == tokens && page.chain == Some(Chain { key, parent });
        same.then_some((id, key))
    }
}
