//! A fork-join team for the ops' parallel loops: the calling thread takes
//! part, and the helpers spin between jobs before they sleep. Decode runs
//! a few hundred short ops per token; handing each to a sleeping pool (a
//! futex wake-up there and another back) cost more than many of them take.
//!
//! A job waits only for the helpers that joined it. Tasks go to whoever
//! asks first, so when the OS has descheduled a helper (another process
//! busy on the cores) the others, the caller included, take its share and
//! the job ends without it; it joins a later job once it runs again. When
//! every job waited for every helper, each of a token's hundreds of ops
//! cost a scheduler time slice on a busy machine: 2 threads decoded
//! SmolLM2 at 1.5-4.4 tok/s beside two spinning processes on 2 cores, one
//! thread at 29-38.
//!
//! Where the OS keeps the team's threads waiting for a core, helpers park
//! (and come back when cores idle): `room.rs` decides how many work.

use super::room::Room;
use std::cell::{Cell, UnsafeCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spin rounds (`spin_loop` hints, about 1 ms in all) a helper waits for
/// the next job before it sleeps.
const SPINS: u32 = 1 << 15;

/// Spin rounds between offers of the core to the OS while waiting.
const YIELD_EVERY: u32 = 256;

/// The job being run: `f(i)` for every task index `i < n`.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
}

struct Shared {
    /// Bumped when a job is published (or the team stops).
    epoch: AtomicU64,
    /// Written by the publisher only while no helper is inside a job and
    /// before the epoch that announces it (Release); read by helpers that
    /// joined that epoch while it is open (see `helper`). No lock: with
    /// one, 15 helpers queued on it at every op.
    job: UnsafeCell<Option<Job>>,
    /// The epoch of the job helpers may still join; 0 once it is closed.
    open: AtomicU64,
    /// Helpers inside a job (joined and not yet left).
    joined: AtomicUsize,
    /// Next task index to take.
    next: AtomicUsize,
    /// A task of the current job panicked on a helper.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Helpers asleep (or about to sleep) wait here for a new epoch.
    sleep: Mutex<()>,
    /// Helpers past their spinning: the publisher wakes them only then
    /// (a `notify_all` is a system call).
    sleepers: AtomicUsize,
    wake: Condvar,
    /// Helpers that work (those of index `1..=width`); the rest are parked
    /// on `resume` (with `sleep`'s lock), out of every job.
    width: AtomicUsize,
    resume: Condvar,
    /// Each helper's thread id (Linux; 0 until it has started).
    tids: Vec<AtomicI32>,
}

// SAFETY: `Job::f` points at a `Sync` closure that `Team::run` keeps alive
// until no helper is inside the job (`joined` reaches 0 after it closed).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

pub(crate) struct Team {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    /// Looks at how busy the machine is (`None`: every helper works).
    room: Mutex<Option<Room>>,
}

thread_local! {
    /// Set while this thread runs a job's tasks: nested loops run inline.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

impl Team {
    /// A team of `threads` workers: the caller and `threads - 1` helpers
    /// (fewer if the OS refuses threads). With `adapt`, helpers park while
    /// the machine has no room for them (`room.rs`).
    pub fn new(threads: usize, adapt: bool) -> Team {
        let max = threads.max(1) - 1;
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            open: AtomicU64::new(0),
            joined: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleep: Mutex::new(()),
            sleepers: AtomicUsize::new(0),
            wake: Condvar::new(),
            width: AtomicUsize::new(max),
            resume: Condvar::new(),
            tids: (0..max).map(|_| AtomicI32::new(0)).collect(),
        });
        let helpers: Vec<_> = (1..=max)
            .map_while(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("vkllm-cpu-{i}"))
                    .spawn(move || helper(&s, i))
                    .ok()
            })
            .collect();
        // Helpers the OS refused never work.
        shared.width.store(helpers.len(), Ordering::SeqCst);
        let room = Mutex::new(if adapt && !helpers.is_empty() {
            Room::new(helpers.len())
        } else {
            None
        });
        Team {
            shared,
            helpers,
            room,
        }
    }

    /// Workers the team has, the caller included.
    pub fn size(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Workers now (helpers parked for lack of room left out).
    pub fn threads(&self) -> usize {
        self.shared.width.load(Ordering::Relaxed) + 1
    }

    /// Unparks or parks helpers so that `width` of them work.
    fn set_width(&self, width: usize) {
        let s = &*self.shared;
        let old = s
            .width
            .swap(width.min(self.helpers.len()), Ordering::SeqCst);
        if width > old {
            drop(lock(&s.sleep));
            s.resume.notify_all();
        }
    }

    /// `f(i)` for every `i < n`, spread over the team; returns when all
    /// are done. A panic in `f` is raised again here.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if IN_JOB.with(|j| j.get()) {
            (0..n).for_each(f);
            return;
        }
        if let Ok(mut room) = self.room.try_lock() {
            let width = self.shared.width.load(Ordering::Relaxed);
            if let Some(w) = room.as_mut().and_then(|r| r.poll(width, &self.shared.tids)) {
                self.set_width(w);
            }
        }
        if self.threads() == 1 || n <= 1 {
            (0..n).for_each(f);
            return;
        }
        let s = &*self.shared;
        // SAFETY (lifetime erasure): helpers only call `f` inside the job
        // (between joining it while it is open and leaving), and this
        // function closes it and waits for `joined == 0` before it returns
        // or unwinds.
        let f_static: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        // SAFETY: no helper is inside a job (the last one ended with
        // `joined == 0`), and helpers read the slot only after seeing the
        // epoch stored below.
        unsafe { *s.job.get() = Some(Job { f: f_static, n }) };
        s.next.store(0, Ordering::Relaxed);
        s.panicked.store(false, Ordering::Relaxed);
        let e = s.epoch.load(Ordering::Relaxed) + 1;
        s.open.store(e, Ordering::SeqCst);
        s.epoch.store(e, Ordering::SeqCst);
        // A helper counts itself a sleeper before it checks the epoch under
        // the lock: either it sees `e` there, or this load sees it counted.
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            drop(lock(&s.sleep));
            s.wake.notify_all();
        }
        let mine = panic::catch_unwind(AssertUnwindSafe(|| take_tasks(s, f, n)));
        // Every task is taken: helpers not in yet stay out, and those in
        // finish the tasks they hold. (Sequentially consistent with the
        // helpers' join-then-check: a helper this load misses sees closed.)
        s.open.store(0, Ordering::SeqCst);
        let mut spins = 0u32;
        while s.joined.load(Ordering::SeqCst) != 0 {
            spin_or_yield(&mut spins);
        }
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
        s.resume.notify_all();
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

/// A lock that survives a panic elsewhere (the data is plain values).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One round of a wait: a `spin_loop` hint, and every [`YIELD_EVERY`]th
/// round the core offered to the OS, so a waiting thread does not hold a
/// core the thread it waits for (descheduled on a busy machine) needs.
fn spin_or_yield(spins: &mut u32) {
    *spins += 1;
    if spins.is_multiple_of(YIELD_EVERY) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
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

/// Helper `i` (from 1): joins jobs while `i <= width`, else parked.
fn helper(s: &Shared, i: usize) {
    // For the thread's life: it only runs the backend's tasks.
    let _flush = super::denormals::FlushDenormals::new();
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no preconditions.
    s.tids[i - 1].store(unsafe { libc::gettid() }, Ordering::Relaxed);
    let mut seen = 0u64;
    loop {
        if i > s.width.load(Ordering::SeqCst) {
            let mut g = lock(&s.sleep);
            while i > s.width.load(Ordering::SeqCst) && !s.stop.load(Ordering::Relaxed) {
                g = s.resume.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            drop(g);
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            // Jobs published while parked are not this helper's.
            seen = s.epoch.load(Ordering::Acquire);
        }
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            if i > s.width.load(Ordering::Relaxed) {
                break;
            }
            if spins < SPINS {
                spin_or_yield(&mut spins);
                continue;
            }
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            let g = lock(&s.sleep);
            if s.epoch.load(Ordering::SeqCst) == seen {
                drop(s.wake.wait(g).unwrap_or_else(|e| e.into_inner()));
            } else {
                drop(g);
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        if i > s.width.load(Ordering::SeqCst) {
            continue;
        }
        s.joined.fetch_add(1, Ordering::SeqCst);
        // A job already closed (its tasks all taken while this helper was
        // not running) or a later one than the epoch seen is not joined.
        let job = if s.open.load(Ordering::SeqCst) == seen {
            // SAFETY: the job of epoch `seen` is open and this helper has
            // joined it, so the publisher neither rewrites the slot (it
            // waits for `joined == 0` first) nor has yet to write it (it
            // wrote it before storing the epoch this helper saw).
            unsafe { *s.job.get() }
        } else {
            None
        };
        if let Some(Job { f, n }) = job {
            // SAFETY: the publisher keeps `f` alive until it has closed the
            // job and `joined` is 0.
            let f = unsafe { &*f };
            if panic::catch_unwind(AssertUnwindSafe(|| take_tasks(s, f, n))).is_err() {
                IN_JOB.with(|j| j.set(false));
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        s.joined.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_and_panics_come_back() {
        let team = Team::new(3, false);
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

    /// Parked helpers take no task, and come back when the width grows.
    #[test]
    fn parked_helpers_stay_out_of_jobs() {
        let team = Team::new(4, false);
        let names = |team: &Team| {
            let seen = Mutex::new(std::collections::HashSet::new());
            for _ in 0..200 {
                team.run(64, &|_| {
                    let name = std::thread::current().name().map(str::to_owned);
                    lock(&seen).insert(name.unwrap_or_default());
                    std::hint::black_box((0..2000).sum::<u64>());
                });
            }
            seen.into_inner().unwrap_or_else(|e| e.into_inner())
        };
        team.set_width(1);
        assert_eq!(team.threads(), 2);
        let some = names(&team);
        assert!(
            !some.contains("vkllm-cpu-2") && !some.contains("vkllm-cpu-3"),
            "{some:?}"
        );
        team.set_width(0);
        let none = names(&team);
        assert!(none.iter().all(|n| !n.starts_with("vkllm-cpu")), "{none:?}");
        team.set_width(3);
        assert_eq!(team.threads(), 4);
        let sum = AtomicUsize::new(0);
        team.run(100, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }
}
