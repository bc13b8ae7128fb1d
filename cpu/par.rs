//! Parallel-or-inline loops on the backend's [`Team`]. Ops below
//! [`PAR_MIN_WORK`] run inline on the calling thread with the same code.

use super::simd::Isa;
use super::team::Team;
use super::ActivationPrecision;
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Work (roughly multiply-adds or values touched) below which an op runs
/// inline: a team job costs a few µs of hand-off and cache traffic.
pub(crate) const PAR_MIN_WORK: usize = 1 << 17;

/// What an op kernel needs to know about where it runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub isa: Isa,
    /// Run on the team (true) or inline on the calling thread.
    pub par: bool,
    /// What decode matmuls of legacy and K-quant weights do with activations.
    pub acts: ActivationPrecision,
}

thread_local! {
    /// The team of the op running on this thread ([`with_team`]).
    static TEAM: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with `team` serving this thread's parallel loops.
pub(crate) fn with_team<R>(team: &Team, f: impl FnOnce() -> R) -> R {
    struct Restore(*const Team);
    impl Drop for Restore {
        fn drop(&mut self) {
            TEAM.with(|t| t.set(self.0));
        }
    }
    let _restore = Restore(TEAM.with(|t| t.replace(team)));
    f()
}

/// The current team, if any.
fn team() -> Option<&'static Team> {
    let p = TEAM.with(|t| t.get());
    // SAFETY: `with_team` keeps the team borrowed (alive) while the pointer
    // is set, and resets it before returning; only this thread reads it.
    unsafe { p.as_ref() }
}

/// Workers the parallel loops of this thread use (1 outside a team).
pub(crate) fn threads() -> usize {
    team().map_or(1, Team::threads)
}

/// Raw base pointer of a slice that tasks split into disjoint chunks.
struct Base<T>(*mut T);
// SAFETY: every task touches a disjoint chunk of one live slice.
unsafe impl<T: Send> Send for Base<T> {}
unsafe impl<T: Send> Sync for Base<T> {}

/// `f(i, chunk)` for each `chunk`-sized piece of `out` (the last may be shorter).
pub(crate) fn chunks<T: Send>(
    par: bool,
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if chunk == 0 {
        return;
    }
    let (len, n) = (out.len(), out.len().div_ceil(chunk));
    let base = Base(out.as_mut_ptr());
    range_init(
        par,
        n,
        || (),
        |_, i| {
            let start = i * chunk;
            let base = &base;
            // SAFETY: chunk i covers start..min(start + chunk, len) of `out`,
            // disjoint from every other chunk, and `out` outlives the loop.
            let c = unsafe {
                std::slice::from_raw_parts_mut(base.0.add(start), chunk.min(len - start))
            };
            f(i, c)
        },
    );
}

/// `f(&mut state, i)` for `i in 0..n`, with one `init()` state per worker.
pub(crate) fn range_init<S>(
    par: bool,
    n: usize,
    init: impl Fn() -> S + Sync + Send,
    f: impl Fn(&mut S, usize) + Sync + Send,
) {
    match team() {
        // Through `run` even while every helper is parked: it looks at
        // the machine's room there.
        Some(team) if par && n > 1 && team.size() > 1 => {
            // One loop per worker over a shared counter: balanced, and each
            // worker makes its state once.
            let next = AtomicUsize::new(0);
            team.run(team.threads(), &|_| {
                let mut s = init();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    f(&mut s, i);
                }
            });
        }
        _ => {
            let mut s = init();
            (0..n).for_each(|i| f(&mut s, i));
        }
    }
}
