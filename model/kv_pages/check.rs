//! The pool's accounting, checked from scratch (tests call it after every
//! operation).

use std::collections::HashSet;

use super::store::{chain_key, ROOT_KEY};
use super::{PageId, PagePool};

impl PagePool {
    /// Panics, naming the page or sequence, unless: every page is exactly
    /// one of free, cached-and-free (LRU) or held; a page's holder count is
    /// the number of page tables listing it; cached pages and the prefix map
    /// agree; page tables match their lengths and their pages' contents.
    pub(super) fn check_invariants(&self) {
        let (l, store) = (self.page_len, &self.store);
        let mut holders = vec![0u32; store.pages.len()];
        let mut private = vec![false; store.pages.len()];
        for (id, s) in &self.seqs {
            assert_eq!(
                s.pages.len(),
                s.positions.div_ceil(l),
                "sequence {id}: table length"
            );
            for &p in &s.reserved {
                holders[p as usize] += 1;
                let page = store.page(p);
                assert!(
                    page.tokens.is_empty() && page.refs == 1,
                    "sequence {id}: reserved page {p} is in use"
                );
            }
            let mut parent = ROOT_KEY;
            for (i, &p) in s.pages.iter().enumerate() {
                holders[p as usize] += 1;
                private[p as usize] |= s.private;
                let page = store.page(p);
                let used = (s.positions - i * l).min(l);
                assert!(
                    page.tokens.len() >= used,
                    "sequence {id}: page {p} holds too little"
                );
                if page.tokens.len() == l && !s.private {
                    let c = page
                        .chain
                        .unwrap_or_else(|| panic!("full page {p} has no key"));
                    assert_eq!(
                        c.parent, parent,
                        "sequence {id}: page {p} follows another prefix"
                    );
                    parent = c.key;
                }
            }
        }
        let free: HashSet<PageId> = store.free.iter().map(|r| r.0).collect();
        assert_eq!(
            free.len(),
            store.free.len(),
            "a page is twice on the free list"
        );
        for (tick, &p) in &store.lru {
            assert!(!free.contains(&p), "page {p} is both free and cached-free");
            assert_eq!(store.page(p).tick, *tick, "page {p}: LRU tick");
        }
        for (i, page) in store.pages.iter().enumerate() {
            let p = i as PageId;
            assert_eq!(page.refs, holders[i], "page {p}: holder count");
            let listed =
                usize::from(free.contains(&p)) + usize::from(store.lru.get(&page.tick) == Some(&p));
            assert_eq!(
                listed + usize::from(page.refs > 0),
                1,
                "page {p} is leaked or owned twice"
            );
            if free.contains(&p) {
                assert!(
                    page.tokens.is_empty() && page.chain.is_none() && !page.cached,
                    "free page {p} holds data"
                );
            }
            if page.refs == 0 && !free.contains(&p) {
                assert!(page.cached, "page {p} is on the LRU list uncached");
            }
            match page.chain {
                Some(c) => {
                    assert_eq!(page.tokens.len(), l, "page {p} has a key but is not full");
                    assert_eq!(
                        c.key,
                        chain_key(c.parent, &page.tokens),
                        "page {p}: stale key"
                    );
                }
                None => assert!(
                    page.tokens.len() < l || private[i],
                    "full page {p} has no key"
                ),
            }
            let in_map = page
                .chain
                .is_some_and(|c| store.prefix.get(&c.key) == Some(&p));
            assert_eq!(
                page.cached, in_map,
                "page {p}: cached flag and prefix map disagree"
            );
        }
        let cached = store.pages.iter().filter(|p| p.cached).count();
        assert_eq!(
            store.prefix.len(),
            cached,
            "the prefix map lists pages not cached"
        );
    }
}
