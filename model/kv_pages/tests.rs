use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::store::{chain_key, ROOT_KEY};
use super::*;
use crate::error::ErrorKind;

/// What the device's page slots hold, written only as a runner would: each
/// appended token at its position through the page table, after the copy the
/// append reported. A write into a page that another sequence still reads
/// shows up as that sequence's data changing.
struct Device {
    page_len: usize,
    slots: Vec<Vec<Option<u32>>>,
}

impl Device {
    fn new(pages: usize, page_len: usize) -> Self {
        Device {
            page_len,
            slots: vec![vec![None; page_len]; pages],
        }
    }

    fn append(
        &mut self,
        pool: &mut PagePool,
        seq: SeqId,
        tokens: &[u32],
    ) -> Result<Option<PageCopy>> {
        let start = pool.get(seq).map_or(0, Sequence::positions);
        let copy = pool.append(seq, tokens)?;
        if let Some(c) = copy {
            for i in 0..c.positions {
                self.slots[c.dst as usize][i] = self.slots[c.src as usize][i];
            }
        }
        let pages = pool.get(seq).unwrap().pages().to_vec();
        for (k, &t) in tokens.iter().enumerate() {
            let p = start + k;
            self.slots[pages[p / self.page_len] as usize][p % self.page_len] = Some(t);
        }
        Ok(copy)
    }

    fn read(&self, s: &Sequence) -> Vec<u32> {
        (0..s.positions())
            .map(|p| {
                self.slots[s.pages()[p / self.page_len] as usize][p % self.page_len]
                    .expect("an unwritten slot")
            })
            .collect()
    }
}

fn pool_and_device(pages: usize, page_len: usize) -> (PagePool, Device) {
    (
        PagePool::new(pages, page_len).unwrap(),
        Device::new(pages, page_len),
    )
}

/// A sequence holding `tokens`, appended after whatever prefix was reused.
fn sequence(pool: &mut PagePool, dev: &mut Device, tokens: &[u32]) -> SeqId {
    let (seq, reused) = pool.add(tokens);
    dev.append(pool, seq, &tokens[reused..]).unwrap();
    pool.check_invariants();
    seq
}

fn pages(pool: &PagePool, seq: SeqId) -> Vec<PageId> {
    pool.get(seq).unwrap().pages().to_vec()
}

#[test]
fn reserved_pages_are_the_next_appends_and_truncate_returns_them() {
    let (mut pool, mut dev) = pool_and_device(8, 4);
    let seq = sequence(&mut pool, &mut dev, &[1, 2, 3]);
    pool.reserve(seq, 11).unwrap();
    pool.check_invariants();
    let table: Vec<PageId> = pool.get(seq).unwrap().table().collect();
    assert_eq!(table, vec![0, 1, 2]);
    assert_eq!(pool.available(), 5);
    dev.append(&mut pool, seq, &[4, 5, 6, 7, 8]).unwrap();
    pool.check_invariants();
    assert_eq!(pages(&pool, seq), vec![0, 1]);
    assert_eq!(pool.get(seq).unwrap().table().collect::<Vec<_>>(), table);
    pool.truncate(seq, 6).unwrap();
    pool.check_invariants();
    assert_eq!(pool.get(seq).unwrap().table().count(), 2);
    assert_eq!(pool.available(), 6);
    pool.free(seq).unwrap();
    assert_eq!(pool.available(), 8);
}

#[test]
fn private_sequences_stay_out_of_the_prefix_cache_and_take_the_first_pages() {
    let (mut pool, mut dev) = pool_and_device(8, 4);
    let tokens: Vec<u32> = (0..10).collect();
    let solo = pool.add_private();
    dev.append(&mut pool, solo, &tokens).unwrap();
    pool.check_invariants();
    assert_eq!(pages(&pool, solo), vec![0, 1, 2]);
    // Nothing of it is cached: an equal prompt reuses nothing.
    let (other, reused) = pool.add(&tokens);
    assert_eq!(reused, 0);
    pool.free(other).unwrap();
    pool.truncate(solo, 0).unwrap();
    pool.check_invariants();
    assert_eq!(pool.available(), 8);
    // Empty again, its pages are the first handed out, in order.
    dev.append(&mut pool, solo, &tokens[..9]).unwrap();
    pool.check_invariants();
    assert_eq!(pages(&pool, solo), vec![0, 1, 2]);
}

#[test]
fn new_checks_its_sizes() {
    for (pages, len) in [(0, 16), (4, 0), (u32::MAX as usize + 1, 16)] {
        let e = PagePool::new(pages, len).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    }
    let pool = PagePool::new(4, 16).unwrap();
    assert_eq!((pool.page_len(), pool.available()), (16, 4));
    pool.check_invariants();
}

#[test]
fn append_takes_pages_as_needed_and_free_returns_them() {
    let (mut pool, mut dev) = pool_and_device(4, 4);
    let (a, reused) = pool.add(&[]);
    assert_eq!(reused, 0);
    assert_eq!(dev.append(&mut pool, a, &[1, 2, 3, 4, 5]).unwrap(), None);
    pool.check_invariants();
    assert_eq!(
        (
            pool.get(a).unwrap().positions(),
            pages(&pool, a).len(),
            pool.available()
        ),
        (5, 2, 2)
    );
    dev.append(&mut pool, a, &[6, 7, 8]).unwrap();
    assert_eq!(pages(&pool, a).len(), 2);
    dev.append(&mut pool, a, &[9]).unwrap();
    dev.append(&mut pool, a, &[]).unwrap();
    pool.check_invariants();
    assert_eq!(dev.read(pool.get(a).unwrap()), (1..=9).collect::<Vec<_>>());
    assert_eq!(pages(&pool, a).len(), 3);
    pool.free(a).unwrap();
    pool.check_invariants();
    assert!(pool.get(a).is_none());
    assert_eq!(pool.available(), 4);
}

#[test]
fn a_full_pool_is_an_error_that_changes_nothing() {
    let (mut pool, mut dev) = pool_and_device(2, 4);
    let a = sequence(&mut pool, &mut dev, &[1, 2, 3, 4, 5, 6, 7, 8]);
    let before = pool.get(a).unwrap().clone();
    let e = dev.append(&mut pool, a, &[9]).unwrap_err();
    pool.check_invariants();
    assert_eq!(e.kind(), ErrorKind::OutOfDeviceMemory);
    assert_eq!(
        e.to_string(),
        "out of device memory while appending 1 positions to sequence 0: \
         the KV page pool needs 1 pages of 4 positions and has 0 free"
    );
    assert_eq!(pool.get(a), Some(&before));
    let (b, _) = pool.add(&[5, 5]);
    assert!(pool.append(b, &[5, 5]).is_err());
    pool.free(a).unwrap();
    dev.append(&mut pool, b, &[5, 5, 5, 5, 5]).unwrap();
    pool.check_invariants();
}

#[test]
fn fork_shares_pages_and_a_write_into_a_shared_partial_page_copies_it() {
    let (mut pool, mut dev) = pool_and_device(8, 4);
    let a = sequence(&mut pool, &mut dev, &[1, 2, 3, 4, 5, 6]);
    let b = pool.fork(a).unwrap();
    pool.check_invariants();
    assert_eq!(pages(&pool, a), pages(&pool, b));
    let copy = dev.append(&mut pool, b, &[7]).unwrap().unwrap();
    pool.check_invariants();
    let (pa, pb) = (pages(&pool, a), pages(&pool, b));
    assert_eq!(
        copy,
        PageCopy {
            src: pa[1],
            dst: pb[1],
            positions: 2
        }
    );
    assert_eq!((pa[0], pa[1] == pb[1]), (pb[0], false));
    // `a` is the page's only holder now: it writes in place.
    assert_eq!(dev.append(&mut pool, a, &[8]).unwrap(), None);
    pool.check_invariants();
    assert_eq!(dev.read(pool.get(a).unwrap()), [1, 2, 3, 4, 5, 6, 8]);
    assert_eq!(dev.read(pool.get(b).unwrap()), [1, 2, 3, 4, 5, 6, 7]);
    // Forked at a page boundary, appends go to new pages: nothing to copy.
    let c = sequence(&mut pool, &mut dev, &[9, 9, 9, 9]);
    let d = pool.fork(c).unwrap();
    assert_eq!(dev.append(&mut pool, d, &[1]).unwrap(), None);
    assert_eq!(dev.append(&mut pool, c, &[2]).unwrap(), None);
    pool.check_invariants();
}

#[test]
fn truncate_releases_pages_and_leaves_shared_data_alone() {
    let (mut pool, mut dev) = pool_and_device(8, 4);
    let a = sequence(&mut pool, &mut dev, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let b = pool.fork(a).unwrap();
    pool.truncate(b, 5).unwrap();
    pool.check_invariants();
    assert_eq!(pages(&pool, b), pages(&pool, a)[..2]);
    let copy = dev.append(&mut pool, b, &[99]).unwrap().unwrap();
    assert_eq!((copy.src, copy.positions), (pages(&pool, a)[1], 1));
    pool.check_invariants();
    assert_eq!(dev.read(pool.get(a).unwrap()), (1..=10).collect::<Vec<_>>());
    assert_eq!(dev.read(pool.get(b).unwrap()), [1, 2, 3, 4, 5, 99]);
    let e = pool.truncate(a, 11).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot truncate sequence 0 to 11 positions: it holds 10"
    );
    let available = pool.available();
    pool.truncate(a, 8).unwrap();
    pool.check_invariants();
    assert_eq!(pool.available(), available + 1);
}

#[test]
fn a_truncated_page_stays_cached_until_it_is_written() {
    let (mut pool, mut dev) = pool_and_device(8, 4);
    let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    let a = sequence(&mut pool, &mut dev, &prompt[..8]);
    pool.truncate(a, 6).unwrap();
    // Both full pages are still cached: a new sequence shares them.
    let (b, reused) = pool.add(&prompt);
    assert_eq!(reused, 8);
    pool.check_invariants();
    // So `a` writing there copies its 2 positions first.
    let copy = dev.append(&mut pool, a, &[60]).unwrap().unwrap();
    assert_eq!((copy.src, copy.positions), (pages(&pool, b)[1], 2));
    pool.free(b).unwrap();
    // A private truncated page is rewritten in place and leaves the cache.
    let c = sequence(&mut pool, &mut dev, &[7, 7, 7, 7, 7, 7, 7, 7]);
    pool.truncate(c, 6).unwrap();
    assert_eq!(dev.append(&mut pool, c, &[0]).unwrap(), None);
    pool.check_invariants();
    assert_eq!(pool.add(&[7, 7, 7, 7, 7, 7, 7, 7, 7]).1, 4);
    assert_eq!(dev.read(pool.get(a).unwrap()), [1, 2, 3, 4, 5, 6, 60]);
}

#[test]
fn a_new_sequence_reuses_cached_prefix_pages_but_evaluates_the_last_token() {
    let (mut pool, mut dev) = pool_and_device(16, 4);
    let prompt: Vec<u32> = (0..10).collect();
    let a = sequence(&mut pool, &mut dev, &prompt);
    let (b, reused) = pool.add(&prompt);
    assert_eq!(reused, 8);
    assert_eq!(pages(&pool, b), pages(&pool, a)[..2]);
    dev.append(&mut pool, b, &prompt[8..]).unwrap();
    pool.check_invariants();
    assert_eq!(dev.read(pool.get(b).unwrap()), prompt);
    // A prompt of whole pages keeps its last one to evaluate.
    assert_eq!(pool.add(&prompt[..8]).1, 4);
    assert_eq!(pool.add(&prompt[..1]).1, 0);
    let mut other = prompt.clone();
    other[5] = 77;
    assert_eq!(pool.add(&other).1, 4);
    other[0] = 77;
    assert_eq!(pool.add(&other).1, 0);
    // Freed sequences leave their full pages cached.
    for s in [a, b] {
        pool.free(s).unwrap();
    }
    let (c, reused) = pool.add(&prompt);
    assert_eq!(reused, 8);
    pool.check_invariants();
    dev.append(&mut pool, c, &prompt[8..]).unwrap();
    assert_eq!(dev.read(pool.get(c).unwrap()), prompt);
}

#[test]
fn free_cached_pages_go_after_empty_ones_least_recently_used_first() {
    let (mut pool, mut dev) = pool_and_device(4, 2);
    let a = sequence(&mut pool, &mut dev, &[1, 2, 3, 4]);
    pool.free(a).unwrap();
    assert_eq!(pool.available(), 4);
    // Empty pages are taken before cached ones.
    let b = sequence(&mut pool, &mut dev, &[5, 6]);
    let (probe, reused) = pool.add(&[1, 2, 3, 4, 0]);
    assert_eq!(reused, 4);
    for s in [probe, b] {
        pool.free(s).unwrap();
    }
    // A hit takes a free cached page off the LRU list.
    let (h, reused) = pool.add(&[1, 2, 0]);
    assert_eq!((reused, pool.available()), (2, 3));
    pool.free(h).unwrap();
    pool.check_invariants();
    // [3, 4] is the oldest release now ([5, 6] and [1, 2] came later; a
    // prefix releases its tail first): it goes when the empty page is gone.
    let d = sequence(&mut pool, &mut dev, &[7, 8, 9, 10]);
    assert_eq!(pool.add(&[1, 2, 3, 4, 0]).1, 2);
    assert_eq!(pool.add(&[5, 6, 0]).1, 2);
    pool.check_invariants();
    assert_eq!(dev.read(pool.get(d).unwrap()), [7, 8, 9, 10]);
}

#[test]
fn a_hash_collision_is_a_miss() {
    let (mut pool, mut dev) = pool_and_device(4, 2);
    let a = sequence(&mut pool, &mut dev, &[1, 2, 3]);
    // Pretend [7, 7] hashes like [1, 2]: its key now names [1, 2]'s page.
    let page = pages(&pool, a)[0];
    pool.store.prefix.insert(chain_key(ROOT_KEY, &[7, 7]), page);
    assert_eq!(pool.add(&[7, 7, 7]).1, 0);
    assert_eq!(pool.add(&[1, 2, 7]).1, 2);
}

#[test]
fn unknown_sequences_are_errors() {
    let mut pool = PagePool::new(4, 4).unwrap();
    let (a, _) = pool.add(&[1]);
    pool.free(a).unwrap();
    let e = pool.fork(a).unwrap_err();
    assert_eq!(
        e.to_string(),
        "sequence 0 is not in the KV page pool (never added, or freed)"
    );
    assert!(pool.append(a, &[1]).is_err());
    assert!(pool.truncate(a, 0).is_err());
    assert!(pool.free(a).is_err());
    pool.check_invariants();
}

/// Thousands of random adds (with prompts sharing prefixes), appends, forks,
/// truncations and frees: after each, the accounting holds and every live
/// sequence reads back exactly its tokens through its page table.
#[test]
fn random_operations_keep_the_accounting_and_every_sequence_s_data() {
    for seed in 0..6u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let page_len = [1, 2, 3, 4, 8, 16][seed as usize];
        // 100 to 400 positions: room for a few prompts, so pages run out.
        let total = rng.gen_range(100..400) / page_len + 2;
        let (mut pool, mut dev) = pool_and_device(total, page_len);
        let systems: Vec<Vec<u32>> = (0..3)
            .map(|_| (0..64).map(|_| rng.gen_range(0..4)).collect())
            .collect();
        let mut live: Vec<(SeqId, Vec<u32>)> = Vec::new();
        let (mut hits, mut copies, mut full) = (0, 0, 0);
        for _ in 0..5000 {
            let full_before = full;
            let pick = rng.gen_range(0..live.len().max(1));
            match rng.gen_range(0..11) {
                0..=2 => {
                    let system = &systems[rng.gen_range(0..systems.len())];
                    let mut prompt = system[..rng.gen_range(0..system.len())].to_vec();
                    prompt.extend((0..rng.gen_range(0..6)).map(|_| rng.gen_range(0..4)));
                    let (seq, reused) = if rng.gen_range(0..5) == 0 {
                        (pool.add_private(), 0)
                    } else {
                        pool.add(&prompt)
                    };
                    assert!(reused % page_len == 0 && (reused < prompt.len() || reused == 0));
                    assert_eq!(dev.read(pool.get(seq).unwrap()), prompt[..reused]);
                    hits += usize::from(reused > 0);
                    match dev.append(&mut pool, seq, &prompt[reused..]) {
                        Ok(copy) => {
                            assert_eq!(copy, None, "a new sequence writes only its own pages");
                            live.push((seq, prompt));
                        }
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::OutOfDeviceMemory);
                            full += 1;
                            pool.free(seq).unwrap();
                        }
                    }
                }
                3..=5 if !live.is_empty() => {
                    let (seq, tokens) = &mut live[pick];
                    let more: Vec<u32> = (0..rng.gen_range(1..6))
                        .map(|_| rng.gen_range(0..4))
                        .collect();
                    let before = pool.get(*seq).unwrap().clone();
                    match dev.append(&mut pool, *seq, &more) {
                        Ok(copy) => {
                            copies += usize::from(copy.is_some());
                            tokens.extend(more);
                        }
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::OutOfDeviceMemory);
                            assert_eq!(pool.get(*seq), Some(&before));
                            full += 1;
                        }
                    }
                }
                6 if !live.is_empty() => {
                    let forked = pool.fork(live[pick].0).unwrap();
                    live.push((forked, live[pick].1.clone()));
                }
                7 if !live.is_empty() => {
                    let (seq, tokens) = &mut live[pick];
                    let keep = rng.gen_range(0..=tokens.len());
                    pool.truncate(*seq, keep).unwrap();
                    tokens.truncate(keep);
                }
                8 | 9 if !live.is_empty() => {
                    pool.free(live.swap_remove(pick).0).unwrap();
                }
                10 if !live.is_empty() => {
                    let (seq, tokens) = &live[pick];
                    let before = pool.get(*seq).unwrap().clone();
                    let end = tokens.len() + rng.gen_range(1..20);
                    match pool.reserve(*seq, end) {
                        Ok(()) => {
                            let s = pool.get(*seq).unwrap();
                            assert!(s.table().count() >= end.div_ceil(page_len));
                            assert!(s
                                .table()
                                .take(s.pages().len())
                                .eq(s.pages().iter().copied()));
                        }
                        Err(e) => {
                            assert_eq!(e.kind(), ErrorKind::OutOfDeviceMemory);
                            assert_eq!(pool.get(*seq), Some(&before));
                            full += 1;
                        }
                    }
                }
                _ => {}
            }
            // Out of pages, a scheduler preempts a sequence.
            if full > full_before && !live.is_empty() {
                let victim = rng.gen_range(0..live.len());
                pool.free(live.swap_remove(victim).0).unwrap();
            }
            pool.check_invariants();
            for (seq, tokens) in &live {
                assert_eq!(
                    &dev.read(pool.get(*seq).unwrap()),
                    tokens,
                    "seed {seed}, sequence {seq}"
                );
            }
        }
        // Pages of one position are never partial: nothing to copy.
        let copied = copies > 0 || page_len == 1;
        assert!(
            hits > 0 && copied && full > 0,
            "seed {seed}: {hits} hits, {copies} copies, {full} full"
        );
        for (seq, _) in live.drain(..) {
            pool.free(seq).unwrap();
        }
        pool.check_invariants();
        assert_eq!(pool.available(), total, "seed {seed}: pages leaked");
    }
}
