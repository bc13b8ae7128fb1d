//! How many of the team's helpers the machine has room for, followed while
//! the team works. On a machine another process keeps busy (a compiler, a
//! browser), more runnable threads than cores means a helper the OS sets
//! aside holds its task and the caller waits out its time slice: two
//! threads beside one spinning one decoded up to 12% slower than one
//! thread alone (README, "On a busy machine").
//!
//! Every [`INTERVAL`] the team's threads' time spent runnable but not
//! running (Linux's per-thread `schedstat`) says whether they wait for a
//! core: past [`WAIT_MAX`] of the time in two looks running (one could be
//! a VM's pause), one helper is parked. Cores left idle by every process
//! (`/proc/stat`) say there is room again: past [`IDLE_MIN`] of a core,
//! one helper comes back. A return that is soon undone waits twice as
//! long before the next (a quota or an affinity that idles cores the team
//! cannot use would otherwise flap). The first look, which spans the
//! model's load, sets the width at once: the cores other processes kept
//! busy meanwhile are not the team's (a one-shot run would otherwise
//! prefill on too many threads before the second look). Elsewhere than
//! Linux the team keeps every helper.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Time between looks.
const INTERVAL: Duration = Duration::from_millis(50);
/// Fraction of the interval the team's threads may wait for a core.
const WAIT_MAX: f64 = 0.15;
/// Idle cores (summed over the machine) that bring a helper back.
const IDLE_MIN: f64 = 0.75;
/// Wait after a park before a helper may come back, at first and at most.
const HOLD: Duration = Duration::from_millis(100);
const HOLD_MAX: Duration = Duration::from_secs(5);

/// What the team's threads and the machine did since the last look.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Look {
    /// Nanoseconds the active threads (caller and unparked helpers) spent
    /// runnable but not running, summed.
    pub waited_ns: u64,
    /// Active threads.
    pub threads: usize,
    /// Idle core-seconds over the whole machine.
    pub idle_s: f64,
    /// Core-seconds other processes ran (busy time less this process's).
    pub others_s: f64,
    /// The machine's cores.
    pub cores: usize,
    pub elapsed: Duration,
}

/// The width policy: helpers to keep given what a look saw.
#[derive(Debug)]
pub(crate) struct Policy {
    /// Before this, no helper comes back.
    hold_until: Option<Instant>,
    hold: Duration,
    /// When the last helper came back (a park soon after doubles `hold`).
    returned_at: Option<Instant>,
    /// The last look saw the threads wait past `WAIT_MAX`.
    waited_last: bool,
    /// No look yet.
    first: bool,
}

impl Policy {
    pub fn new() -> Policy {
        Policy {
            hold_until: None,
            hold: HOLD,
            returned_at: None,
            waited_last: false,
            first: true,
        }
    }

    /// Helpers to keep (of at most `max`) after `look`, `width` now.
    pub fn next(&mut self, width: usize, max: usize, look: Look, now: Instant) -> usize {
        let span = look.elapsed.as_secs_f64().max(1e-9);
        if std::mem::take(&mut self.first) {
            let free = look.cores as f64 - look.others_s / span;
            return (free.round().max(1.0) as usize - 1).min(max);
        }
        let waited = look.waited_ns as f64 * 1e-9 / (span * look.threads.max(1) as f64);
        let twice = waited > WAIT_MAX && self.waited_last;
        self.waited_last = waited > WAIT_MAX;
        if twice && width > 0 {
            let soon = self.returned_at.is_some_and(|t| now - t < 2 * self.hold);
            self.hold = if soon {
                (2 * self.hold).min(HOLD_MAX)
            } else {
                HOLD
            };
            self.hold_until = Some(now + self.hold);
            return width - 1;
        }
        let held = self.hold_until.is_some_and(|t| now < t);
        if look.idle_s / span > IDLE_MIN && width < max && !held {
            self.returned_at = Some(now);
            return width + 1;
        }
        width
    }
}

/// The looks themselves: `schedstat` of the team's threads, `/proc/stat`.
pub(crate) struct Room {
    policy: Policy,
    at: Instant,
    /// Per thread (caller first, then helpers by index) the wait last
    /// read, while it was active.
    waits: Vec<Option<u64>>,
    ticks: Ticks,
    /// This process's CPU time at the last look, seconds.
    ours_s: f64,
    ticks_per_s: f64,
}

impl Room {
    /// `None` where the counters are missing (not Linux, or no schedstat).
    pub fn new(helpers: usize) -> Option<Room> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: sysconf reads a constant of the system.
            let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
            let ticks = Ticks::read()?;
            wait_ns("thread-self")?;
            Some(Room {
                policy: Policy::new(),
                at: Instant::now(),
                waits: vec![None; helpers + 1],
                ticks,
                ours_s: cpu_time_s(),
                ticks_per_s: if hz > 0 { hz as f64 } else { 100.0 },
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = helpers;
            None
        }
    }

    /// Called before each job by the thread that runs it: a new width
    /// when a look is due and calls for one. `tids` are the helpers'
    /// thread ids (0 until known), `width` how many are active.
    pub fn poll(&mut self, width: usize, tids: &[AtomicI32]) -> Option<usize> {
        let now = Instant::now();
        let elapsed = now - self.at;
        if elapsed < INTERVAL {
            return None;
        }
        self.at = now;
        let (ticks, ours_s) = (Ticks::read()?, cpu_time_s());
        let idle_s = ticks.idle.saturating_sub(self.ticks.idle) as f64 / self.ticks_per_s;
        let busy = ticks.busy.saturating_sub(self.ticks.busy) as f64 / self.ticks_per_s;
        let others_s = (busy - (ours_s - self.ours_s)).max(0.0);
        (self.ticks, self.ours_s) = (ticks, ours_s);
        let (mut waited_ns, mut threads) = (0, 0);
        for (i, last) in self.waits.iter_mut().enumerate() {
            let tid = i.checked_sub(1).map(|h| tids[h].load(Ordering::Relaxed));
            let now_wait = match tid {
                None => wait_ns("thread-self"),
                Some(t) if i <= width && t > 0 => wait_ns(&format!("self/task/{t}")),
                _ => None,
            };
            if let (Some(w), Some(prev)) = (now_wait, *last) {
                waited_ns += w.saturating_sub(prev);
                threads += 1;
            }
            *last = now_wait;
        }
        let look = Look {
            waited_ns,
            threads,
            idle_s,
            others_s,
            cores: ticks.cores,
            elapsed,
        };
        let next = self.policy.next(width, tids.len(), look, now);
        (next != width).then_some(next)
    }
}

/// Nanoseconds the thread at `/proc/{path}` spent runnable, not running.
fn wait_ns(path: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{path}/schedstat")).ok()?;
    s.split_whitespace().nth(1)?.parse().ok()
}

/// `/proc/stat`'s counts over all cores.
#[derive(Clone, Copy)]
struct Ticks {
    /// Idle (idle + iowait) and busy (the rest, steal included) ticks.
    idle: u64,
    busy: u64,
    cores: usize,
}

impl Ticks {
    fn read() -> Option<Ticks> {
        let s = std::fs::read_to_string("/proc/stat").ok()?;
        let mut lines = s.lines();
        // user nice system idle iowait irq softirq steal (guest time is in
        // user already).
        let f: Vec<u64> = lines
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8)
            .map_while(|v| v.parse().ok())
            .collect();
        let idle = f.get(3)? + f.get(4).unwrap_or(&0);
        let cores = lines
            .filter(|l| {
                l.strip_prefix("cpu")
                    .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
            })
            .count();
        Some(Ticks {
            idle,
            busy: f.iter().sum::<u64>() - idle,
            cores: cores.max(1),
        })
    }
}

/// This process's CPU time (user and system), seconds.
fn cpu_time_s() -> f64 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getrusage writes one `rusage` it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
            return 0.0;
        }
        let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        s(u.ru_utime) + s(u.ru_stime)
    }
    #[cfg(not(target_os = "linux"))]
    0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(waited: f64, threads: usize, idle_cores: f64) -> Look {
        let elapsed = Duration::from_millis(50);
        Look {
            waited_ns: (waited * threads as f64 * 50e6) as u64,
            threads,
            idle_s: idle_cores * 0.05,
            others_s: 0.0,
            cores: 2,
            elapsed,
        }
    }

    #[test]
    fn helpers_park_when_threads_wait_and_return_when_cores_idle() {
        let mut p = Policy::new();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        p.next(1, 1, look(0.0, 1, 1.0), ms(0));
        // A quiet machine: every helper stays; one look of waiting (a VM's
        // pause) parks none.
        assert_eq!(p.next(1, 1, look(0.01, 2, 0.0), ms(0)), 1);
        assert_eq!(p.next(1, 1, look(0.5, 2, 0.0), ms(50)), 1);
        assert_eq!(p.next(1, 1, look(0.01, 2, 0.0), ms(100)), 1);
        // Waiting a third of the time for a core, twice running: one
        // helper parks, and no further than none.
        assert_eq!(p.next(1, 1, look(0.33, 2, 0.0), ms(150)), 1);
        assert_eq!(p.next(1, 1, look(0.33, 2, 0.0), ms(200)), 0);
        assert_eq!(p.next(0, 1, look(0.33, 1, 0.0), ms(250)), 0);
        // A core idle: back, once the hold is over.
        assert_eq!(p.next(0, 1, look(0.0, 1, 1.0), ms(250)), 0);
        assert_eq!(p.next(0, 1, look(0.0, 1, 1.0), ms(300)), 1);
        // Parked again soon after: the next return waits twice as long.
        assert_eq!(p.next(1, 1, look(0.3, 2, 0.0), ms(350)), 1);
        assert_eq!(p.next(1, 1, look(0.3, 2, 0.0), ms(400)), 0);
        assert_eq!(p.next(0, 1, look(0.0, 1, 1.0), ms(550)), 0);
        assert_eq!(p.next(0, 1, look(0.0, 1, 1.0), ms(600)), 1);
        // Idle cores never add helpers past the team.
        assert_eq!(p.next(1, 1, look(0.0, 2, 1.5), ms(5000)), 1);
    }

    /// The first look sets the width from the cores other processes left.
    #[test]
    fn the_first_look_leaves_the_cores_others_use() {
        let first = |others_cores: f64, cores: usize, max: usize| {
            let mut l = look(0.0, 1, 0.0);
            (l.others_s, l.cores) = (others_cores * 0.05, cores);
            Policy::new().next(max, max, l, Instant::now())
        };
        assert_eq!(first(0.05, 16, 15), 15);
        assert_eq!(first(4.0, 16, 15), 11);
        assert_eq!(first(0.1, 2, 1), 1);
        assert_eq!(first(1.0, 2, 1), 0);
        assert_eq!(first(2.0, 2, 1), 0);
        // A team smaller than the machine keeps its size on a quiet one.
        assert_eq!(first(0.0, 16, 3), 3);
    }

    /// Where Linux has the counters (schedstat can be configured out),
    /// they parse.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_counters_parse_where_linux_has_them() {
        if std::path::Path::new("/proc/thread-self/schedstat").exists() {
            assert!(wait_ns("thread-self").is_some());
        }
        if std::path::Path::new("/proc/stat").exists() {
            let t = Ticks::read().expect("/proc/stat parses");
            assert!(t.cores > 0 && t.busy + t.idle > 0);
        }
    }
}
