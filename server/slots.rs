//! What `/health` tells of the model thread's work: sequences generating,
//! requests waiting, KV pages free. The model thread publishes the numbers
//! after each step; request handlers count the jobs on their way to it.

use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counters shared by the model thread and the request handlers.
#[derive(Debug, Default)]
pub struct Slots {
    /// Sequences that can generate at once (`--parallel`).
    total: usize,
    /// KV pages of the pool.
    pages: usize,
    busy: AtomicUsize,
    /// Requests the engine holds but has not admitted.
    waiting: AtomicUsize,
    /// Jobs sent to the model thread and not yet taken by it.
    incoming: AtomicUsize,
    free_pages: AtomicUsize,
}

impl Slots {
    pub fn new(total: usize, pages: usize) -> Self {
        Slots {
            total,
            pages,
            free_pages: AtomicUsize::new(pages),
            ..Slots::default()
        }
    }

    /// Sequences that can generate at once.
    pub fn total(&self) -> usize {
        self.total
    }

    /// A job is on its way to the model thread.
    pub fn sent(&self) {
        self.incoming.fetch_add(1, Ordering::Relaxed);
    }

    /// The model thread took a job (or it was never sent).
    pub fn taken(&self) {
        // Saturating: a count never goes below zero, whatever the order.
        let _ = self
            .incoming
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// The engine's numbers after a step.
    pub fn publish(&self, busy: usize, waiting: usize, free_pages: usize) {
        self.busy.store(busy, Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Relaxed);
        self.free_pages.store(free_pages, Ordering::Relaxed);
    }

    /// `/health`'s `slots` and `kv_pages` objects.
    pub fn to_json(&self) -> (Value, Value) {
        let queued = self.waiting.load(Ordering::Relaxed) + self.incoming.load(Ordering::Relaxed);
        (
            json!({
                "total": self.total,
                "busy": self.busy.load(Ordering::Relaxed),
                "queued": queued,
            }),
            json!({
                "total": self.pages,
                "free": self.free_pages.load(Ordering::Relaxed),
            }),
        )
    }
}
