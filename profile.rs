//! Profiling: the events a backend (GPU or CPU) records with profiling on, the
//! Chrome trace writer (opens in Perfetto or chrome://tracing) and the
//! per-op summary table.

use crate::error::{Error, Result};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;

/// Which timeline an event belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    /// Device work: one event per dispatch or copy (GPU), per op (CPU).
    Gpu,
    /// Host work: recording and submitting passes.
    Host,
}

impl Track {
    /// The Chrome trace thread id of the track.
    pub fn tid(self) -> u32 {
        match self {
            Track::Gpu => 1,
            Track::Host => 2,
        }
    }
    fn label(self) -> &'static str {
        match self {
            Track::Gpu => "gpu",
            Track::Host => "host",
        }
    }
}

/// One timed span. Times are µs since profiling was switched on.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileEvent {
    /// Op name (`matmul`, `copy`, ...) or host span (`record`, `submit+wait`).
    pub name: &'static str,
    pub track: Track,
    pub start_us: f64,
    pub dur_us: f64,
    /// Bytes the span moves, where known (0 otherwise); see [`summary`].
    pub bytes: u64,
}

/// The Chrome trace process id of every event.
pub const TRACE_PID: u32 = 1;

/// The events as a Chrome trace object: `{"traceEvents": [...]}` with one
/// complete (`"ph": "X"`) event per span plus thread-name metadata.
pub fn chrome_trace(events: &[ProfileEvent]) -> serde_json::Value {
    let mut out: Vec<serde_json::Value> = [Track::Gpu, Track::Host]
        .iter()
        .map(|t| {
            json!({"name": "thread_name", "ph": "M", "pid": TRACE_PID, "tid": t.tid(),
                   "args": {"name": t.label()}})
        })
        .collect();
    out.extend(events.iter().map(|e| {
        json!({"name": e.name, "cat": e.track.label(), "ph": "X", "ts": e.start_us,
               "dur": e.dur_us, "pid": TRACE_PID, "tid": e.track.tid(),
               "args": {"bytes": e.bytes}})
    }));
    json!({ "traceEvents": out, "displayTimeUnit": "ms" })
}

/// Write [`chrome_trace`] to `path`.
pub fn write_chrome_trace(path: &Path, events: &[ProfileEvent]) -> Result<()> {
    let text = serde_json::to_string(&chrome_trace(events))
        .map_err(|e| Error::Invalid(format!("cannot encode the trace: {e}")))?;
    std::fs::write(path, text).map_err(|e| Error::io_write(path, e))
}

/// Totals of one op over the device events.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTotal {
    pub name: &'static str,
    pub count: usize,
    pub total_us: f64,
    pub bytes: u64,
}

/// Device time per op, most expensive first.
pub fn op_totals(events: &[ProfileEvent]) -> Vec<OpTotal> {
    let mut by_name: HashMap<&'static str, OpTotal> = HashMap::new();
    for e in events.iter().filter(|e| e.track == Track::Gpu) {
        let t = by_name.entry(e.name).or_insert(OpTotal {
            name: e.name,
            count: 0,
            total_us: 0.0,
            bytes: 0,
        });
        t.count += 1;
        t.total_us += e.dur_us;
        t.bytes += e.bytes;
    }
    let mut totals: Vec<OpTotal> = by_name.into_values().collect();
    totals.sort_by(|a, b| b.total_us.total_cmp(&a.total_us).then(a.name.cmp(b.name)));
    totals
}

/// The per-op table printed after a profiled run.
pub fn summary(events: &[ProfileEvent]) -> String {
    let totals = op_totals(events);
    let gpu_us: f64 = totals.iter().map(|t| t.total_us).sum();
    let mut s = String::from(
        "Device profile (GPU dispatches or CPU ops; bytes: sizes of the buffers each \
         op binds, so matmul = weight + activation buffers; copy = 2 x bytes copied)\n",
    );
    s += &format!(
        "{:<12} {:>7} {:>12} {:>7} {:>9}\n",
        "op", "count", "total us", "% dev", "GB/s"
    );
    for t in &totals {
        let pct = if gpu_us > 0.0 {
            100.0 * t.total_us / gpu_us
        } else {
            0.0
        };
        // bytes / µs / 1e3 = GB/s.
        let gbs = if t.bytes > 0 && t.total_us > 0.0 {
            format!("{:.2}", t.bytes as f64 / t.total_us / 1e3)
        } else {
            "-".into()
        };
        s += &format!(
            "{:<12} {:>7} {:>12.1} {:>7.1} {:>9}\n",
            t.name, t.count, t.total_us, pct, gbs
        );
    }
    s += &format!(
        "{:<12} {:>7} {:>12.1} {:>7.1}\n",
        "total",
        totals.iter().map(|t| t.count).sum::<usize>(),
        gpu_us,
        100.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: &'static str, track: Track, dur_us: f64, bytes: u64) -> ProfileEvent {
        ProfileEvent {
            name,
            track,
            start_us: 0.0,
            dur_us,
            bytes,
        }
    }

    #[test]
    fn totals_group_gpu_events_by_op() {
        let events = [
            ev("matmul", Track::Gpu, 30.0, 3000),
            ev("add", Track::Gpu, 10.0, 0),
            ev("matmul", Track::Gpu, 60.0, 3000),
            ev("record", Track::Host, 500.0, 0),
        ];
        let t = op_totals(&events);
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].name, t[0].count, t[0].total_us), ("matmul", 2, 90.0));
        assert_eq!((t[1].name, t[1].count), ("add", 1));
        let s = summary(&events);
        // 6000 bytes in 90 µs = 0.07 GB/s; 90 of 100 µs = 90 %.
        assert!(s.contains("90.0") && s.contains("0.07"), "{s}");
        assert!(!s.contains("record"), "{s}");
    }
}
