//! A fork-join team for the ops' parallel loops: the calling thread takes
//! part, and the helpers spin between jobs before they sleep. Decode runs
//! a few hundred short ops per token; handing each to a sleeping pool (a
//! futex wake-up there and another back) cost more than many of them take.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spin rounds (`spin_loop` hints, about 1 ms in all) a helper waits for
/// the next job before it sleeps.
const SPINS: u32 = 1 << 15;

/// The job being run: `f(i)` for every task index `i < n`.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
}

struct Shared {
    /// Bumped when a job is published (or the team stops).
    epoch: AtomicU64,
    job: Mutex<Option<Job>>,
    /// Next task index to take.
    next: AtomicUsize,
    /// Helpers not yet done with the current job.
    pending: AtomicUsize,
    /// A task of the current job panicked on a helper.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Helpers asleep wait here for a new epoch.
    sleep: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `Job::f` points at a `Sync` closure that `Team::run` keeps alive
// until every helper has finished with it (`pending` reaches 0).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

pub(crate) struct Team {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
}

thread_local! {
    /// Set while this thread runs a job's tasks: nested loops run inline.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

impl Team {
    /// A team of `threads` workers: the caller and `threads - 1` helpers
    /// (fewer if the OS refuses threads).
    pub fn new(threads: usize) -> Team {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            next: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        let helpers = (1..threads.max(1))
            .map_while(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("vkllm-cpu-{i}"))
                    .spawn(move || helper(&s))
                    .ok()
            })
            .collect();
        Team { shared, helpers }
    }

    /// Workers, the caller included.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// `f(i)` for every `i < n`, spread over the team; returns when all
    /// are done. A panic in `f` is raised again here.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.helpers.is_empty() || n <= 1 || IN_JOB.with(|j| j.get()) {
            (0..n).for_each(f);
            return;
        }
        let s = &*self.shared;
        // SAFETY (lifetime erasure): helpers only call `f` before they
        // decrement `pending`, and this function waits for `pending == 0`
        // before it returns or unwinds.
        let f_static: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        *lock(&s.job) = Some(Job { f: f_static, n });
        s.next.store(0, Ordering::Relaxed);
        s.panicked.store(false, Ordering::Relaxed);
        s.pending.store(self.helpers.len(), Ordering::Relaxed);
        {
            let _g = lock(&s.sleep);
            s.epoch.fetch_add(1, Ordering::Release);
        }
        s.wake.notify_all();
        let mine = panic::catch_unwind(AssertUnwindSafe(|| take_tasks(s, f, n)));
        while s.pending.load(Ordering::Acquire) != 0 {
            std::hint::spin_loop();
        }
        *lock(&s.job) = None;
        if let Err(p) = mine {
            panic::resume_unwind(p);
        }
        if s.panicked.load(Ordering::Relaxed) {
            panic!("a CPU worker thread panicked");
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, Ordering::Relaxed);
        {
            let _g = lock(&s.sleep);
            s.epoch.fetch_add(1, Ordering::Release);
        }
        s.wake.notify_all();
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

/// A lock that survives a panic elsewhere (the data is plain values).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn take_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync), n: usize) {
    IN_JOB.with(|j| j.set(true));
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        f(i);
    }
    IN_JOB.with(|j| j.set(false));
}

fn helper(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            let g = lock(&s.sleep);
            if s.epoch.load(Ordering::Acquire) == seen {
                drop(s.wake.wait(g).unwrap_or_else(|e| e.into_inner()));
            }
        }
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        let job = *lock(&s.job);
        if let Some(Job { f, n }) = job {
            // SAFETY: the publisher keeps `f` alive until `pending` is 0.
            let f = unsafe { &*f };
            if panic::catch_unwind(AssertUnwindSafe(|| take_tasks(s, f, n))).is_err() {
                IN_JOB.with(|j| j.set(false));
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_and_panics_come_back() {
        let team = Team::new(3);
        for n in [0, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            team.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n={n}");
        }
        let r = panic::catch_unwind(AssertUnwindSafe(|| team.run(64, &|i| assert!(i != 40))));
        assert!(r.is_err());
        // Still usable afterwards.
        let sum = AtomicUsize::new(0);
        team.run(100, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }
}
