//! Profiling: GPU timestamps around every command of a pass and the host's
//! recording and waiting spans, placed on one timeline as [`ProfileEvent`]s.

use super::VulkanBackend;
use crate::error::{Error, Result};
use crate::profile::{ProfileEvent, Track};
use std::time::Instant;

/// Profiling state: the timeline origin, the tick conversion and the
/// events not yet taken.
pub(super) struct Profiler {
    epoch: Instant,
    /// Nanoseconds per timestamp tick (`timestampPeriod`).
    period_ns: f64,
    /// The queue's `timestampValidBits` as a mask.
    valid_mask: u64,
    /// When the pass being recorded began.
    pub pass_begun: Instant,
    pub events: Vec<ProfileEvent>,
}

impl Profiler {
    fn us_since_epoch(&self, t: Instant) -> f64 {
        t.duration_since(self.epoch).as_secs_f64() * 1e6
    }
}

impl VulkanBackend {
    /// A mask of the compute queue's valid timestamp bits, or why there are none.
    fn timestamp_mask(&self) -> Result<u64> {
        // SAFETY: the physical device belongs to this instance.
        let families = unsafe {
            self.inst
                .instance
                .get_physical_device_queue_family_properties(self.dev.physical)
        };
        let bits = families
            .get(self.dev.queue_family as usize)
            .map_or(0, |f| f.timestamp_valid_bits);
        match bits {
            0 => Err(Error::Unsupported(format!(
                "profiling needs timestamp queries, which the compute queue of {} does not support (timestampValidBits = 0)",
                self.dev.info.name
            ))),
            64.. => Ok(u64::MAX),
            b => Ok((1u64 << b) - 1),
        }
    }

    /// Submit the pass, recording its host spans and GPU timestamps.
    pub(super) fn finish_profiled_pass(&mut self) -> Result<()> {
        let submitted = Instant::now();
        self.finish_recording()?;
        let done = Instant::now();
        let timed = self.rec.read_timestamps()?;
        let Some(p) = &mut self.profile else {
            return Ok(());
        };
        let (begun_us, submit_us) = (p.us_since_epoch(p.pass_begun), p.us_since_epoch(submitted));
        let host = |name, start_us: f64, end_us: f64| ProfileEvent {
            name,
            track: Track::Host,
            start_us,
            dur_us: end_us - start_us,
            bytes: 0,
        };
        p.events.push(host("record", begun_us, submit_us));
        p.events
            .push(host("submit+wait", submit_us, p.us_since_epoch(done)));
        // GPU ticks have their own origin: the pass's first command starts
        // at its submit time on the host timeline.
        let mask = p.valid_mask;
        let t0 = timed.iter().map(|t| t.1 & mask).min().unwrap_or(0);
        let us = |ticks: u64| ticks as f64 * p.period_ns / 1e3;
        let gpu: Vec<ProfileEvent> = timed
            .iter()
            .map(|&(t, start, end)| {
                let (start, end) = (start & mask, end & mask);
                ProfileEvent {
                    name: t.name,
                    track: Track::Gpu,
                    start_us: submit_us + us(start.saturating_sub(t0)),
                    dur_us: us(end.saturating_sub(start)),
                    bytes: t.bytes,
                }
            })
            .collect();
        p.events.extend(gpu);
        Ok(())
    }

    /// [`crate::backend::ComputeBackend::set_profiling`]: timestamps on every pass command
    /// from the next pass, and the state to place them on one timeline.
    pub(super) fn switch_profiling(&mut self, on: bool) -> Result<()> {
        if self.in_pass {
            return Err(Error::Vulkan("set_profiling called inside a pass".into()));
        }
        // Kept passes were recorded with or without timestamps.
        self.rec.invalidate_pass();
        if !on {
            self.profile = None;
            self.rec.set_timestamps(false);
            return Ok(());
        }
        if self.profile.is_none() {
            let valid_mask = self.timestamp_mask()?;
            // SAFETY: the physical device belongs to this instance.
            let limits = unsafe {
                self.inst
                    .instance
                    .get_physical_device_properties(self.dev.physical)
            }
            .limits;
            let now = Instant::now();
            self.profile = Some(Profiler {
                epoch: now,
                period_ns: f64::from(limits.timestamp_period),
                valid_mask,
                pass_begun: now,
                events: Vec::new(),
            });
            self.rec.set_timestamps(true);
        }
        Ok(())
    }
}
