//! Whether an op runs on the team or inline on the calling thread, chosen
//! per op and size by timing both. A fork-join costs a hand-off on every
//! op and, on a busy machine, a time slice whenever a helper the OS set
//! aside holds a task; for a small op that can cost more than the helpers
//! save (bitnet-2b's 0.42 MB k and v matmuls took 28.6 µs on 2 threads
//! and 26.1 on one). Large ops always go to the team.

use std::collections::HashMap;
use std::time::Duration;

/// Ops whose fastest team run took this long are never tried inline: a
/// probe costs a multiple of what the team saves.
const PROBE_BELOW: Duration = Duration::from_micros(250);
/// Team runs of a size before its first inline probe.
const WARM: u32 = 8;
/// Calls between probes of the losing side, at first and at most.
const PROBE_EVERY: u32 = 16;
const PROBE_EVERY_MAX: u32 = 512;
/// Distinct (op, size) pairs followed; past it, the team as before.
const KEYS_MAX: usize = 4096;

#[derive(Default)]
struct Times {
    /// Smoothed call times, ns; 0 = not measured yet.
    team: f64,
    inline: f64,
    /// The fastest team run, ns: the op's size, where the smoothed time
    /// also holds what a busy machine added.
    team_min: f64,
    /// Calls so far (64 bits: a count that wrapped would stop the probes).
    calls: u64,
    team_runs: u32,
    /// The call count of the next probe of the side that lost.
    probe_at: u64,
    probe_every: u32,
}

impl Times {
    fn record(slot: &mut f64, ns: f64) {
        // Moves a quarter of the way, a sample counting at most four times
        // the smoothed time: a busy machine's repeated stalls lift it within
        // a few calls, one stall of a VM's (milliseconds) barely. Uncapped,
        // one such stall sent bitnet-2b's 13 µs k and v matmuls inline (65
        // µs) for 16 tokens at a time on 16 threads.
        *slot = if *slot == 0.0 {
            ns
        } else {
            *slot + (ns.min(4.0 * *slot) - *slot) / 4.0
        };
    }
}

/// Per (op, work) timings of the two ways to run an op.
#[derive(Default)]
pub(crate) struct Spread {
    times: HashMap<(&'static str, usize), Times>,
}

impl Spread {
    /// Run `(op, work)` on the team? (Only asked for ops worth a team.)
    pub fn team(&mut self, op: &'static str, work: usize) -> bool {
        if self.times.len() >= KEYS_MAX && !self.times.contains_key(&(op, work)) {
            return true;
        }
        let t = self.times.entry((op, work)).or_default();
        t.calls += 1;
        if t.team_runs < WARM || t.team_min >= PROBE_BELOW.as_nanos() as f64 {
            return true;
        }
        if t.inline == 0.0 {
            return false;
        }
        let team_wins = t.team <= t.inline;
        if t.calls < t.probe_at {
            return team_wins;
        }
        // A probe of the side that lost: more often while it loses narrowly.
        let ratio = t.team.max(t.inline) / t.team.min(t.inline);
        t.probe_every = if ratio > 1.5 {
            (t.probe_every * 2).clamp(PROBE_EVERY, PROBE_EVERY_MAX)
        } else {
            PROBE_EVERY
        };
        t.probe_at = t.calls + u64::from(t.probe_every);
        !team_wins
    }

    /// What a run of `(op, work)` took.
    pub fn took(&mut self, op: &'static str, work: usize, team: bool, took: Duration) {
        if let Some(t) = self.times.get_mut(&(op, work)) {
            let ns = took.as_nanos() as f64;
            if team {
                Times::record(&mut t.team, ns);
                t.team_min = if t.team_runs == 0 {
                    ns
                } else {
                    t.team_min.min(ns)
                };
                t.team_runs = t.team_runs.saturating_add(1);
            } else {
                Times::record(&mut t.inline, ns);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &mut Spread, team_us: u64, inline_us: u64, calls: usize) -> usize {
        let mut inline = 0;
        for _ in 0..calls {
            let team = s.team("matmul", 7);
            inline += usize::from(!team);
            let us = if team { team_us } else { inline_us };
            s.took("matmul", 7, team, Duration::from_micros(us));
        }
        inline
    }

    #[test]
    fn the_faster_side_wins_and_the_loser_is_still_probed() {
        let mut s = Spread::default();
        // Inline faster: after the warm-up nearly every call inline.
        let inline = run(&mut s, 30, 20, 1000);
        assert!(inline > 900, "{inline}");
        // The machine changes (helpers now win): the probes notice.
        let inline = run(&mut s, 10, 20, 1000);
        assert!(inline < 100, "{inline}");
        // A busy machine's stalls on the team (a helper set aside) push
        // its smoothed time past the large-op limit: still probed, inline.
        let mut busy = Spread::default();
        run(&mut busy, 30, 40, 20);
        assert!(run(&mut busy, 2000, 40, 500) > 400);
        // One long stall of a helper (a VM's time slice) does not hand a
        // small op to the slower inline side for long.
        let mut vm = Spread::default();
        run(&mut vm, 13, 65, 200);
        vm.took("matmul", 7, true, Duration::from_millis(4));
        assert!(run(&mut vm, 13, 65, 1000) < 60);
        // Large ops never run inline.
        let mut big = Spread::default();
        assert_eq!(run(&mut big, 400, 100, 500), 0);
    }
}
