//! Measured copy bandwidth, the ceiling a decode step is compared against:
//! one step reads every weight once, so weight bytes × tok/s over this figure
//! says how close decoding runs to memory speed. Bytes read and written both
//! count, as in the anchors' device-to-device figure.

use crate::backend::{Buffer, ComputeBackend};
use crate::error::{Error, ErrorKind, Result};
use rayon::prelude::*;
use std::time::Instant;

/// Timed runs after the warm-up; the best one is reported (the attainable peak).
const TIMED_RUNS: usize = 5;

/// Host memory: `bytes` copied between two buffers by `threads` threads
/// (`None`: all cores), in GB/s of bytes read + written.
pub fn host_copy_gbs(bytes: usize, threads: Option<usize>) -> Result<f64> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .map_err(|e| {
            Error::Invalid(format!(
                "cannot start a thread pool for the copy benchmark: {e}"
            ))
        })?;
    let (src, mut dst) = host_pair(bytes)?;
    let bytes = src.len();
    // Slices of a few MiB keep every thread busy without splitting pages finely.
    let chunk = (4 << 20).min(bytes.max(1));
    let once = |dst: &mut [u8]| {
        pool.install(|| {
            dst.par_chunks_mut(chunk)
                .zip(src.par_chunks(chunk))
                .for_each(|(d, s)| d.copy_from_slice(s))
        })
    };
    once(&mut dst);
    let mut best = f64::INFINITY;
    for _ in 0..TIMED_RUNS {
        let start = Instant::now();
        once(&mut dst);
        best = best.min(start.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    Ok(2.0 * bytes as f64 / best.max(1e-9) / 1e9)
}

/// Two host buffers of `bytes` (source filled, destination zeroed), halved
/// while the allocation fails, down to [`MIN_PROBE_BYTES`], as the device's
/// are ([`alloc_pair`]).
fn host_pair(bytes: usize) -> Result<(Vec<u8>, Vec<u8>)> {
    let filled = |n: usize, v: u8| -> Option<Vec<u8>> {
        let mut b = Vec::new();
        b.try_reserve_exact(n).ok()?;
        b.resize(n, v);
        Some(b)
    };
    let mut bytes = bytes;
    loop {
        if let Some(pair) = filled(bytes, 1).and_then(|s| Some((s, filled(bytes, 0)?))) {
            return Ok(pair);
        }
        if bytes / 2 < MIN_PROBE_BYTES {
            return Err(Error::OutOfHostMemory {
                what: format!("allocating the copy benchmark's two {bytes}-byte buffers"),
                needed: Some((bytes as u64).saturating_mul(2)),
                available: None,
            });
        }
        bytes /= 2;
    }
}

/// Copies per pass of a device probe: long enough that per-pass costs are
/// small next to the transfer, since short passes read low right after a
/// process writes gigabytes of fresh host memory, as loading a model does
/// (benches/memory.rs; benches/README.md, dispatch, memory and the probes).
pub const DEVICE_COPIES: usize = 64;

/// The smallest buffers a probe falls back to when memory is short.
const MIN_PROBE_BYTES: usize = 64 << 20;

/// A device's streaming bandwidth: `copies` back-to-back transfers of `bytes`
/// (at most what one op may take on the device) between two device buffers
/// in one pass, timed wall-clock around
/// `begin_pass`/`end_pass`, in GB/s of bytes read + written. Both the `copy`
/// op (a transfer command, which some drivers run on a slower copy engine)
/// and `scale` by 1 (a compute kernel streaming the same bytes) are timed;
/// the higher figure is the ceiling kernels can reach.
pub fn backend_copy_gbs(be: &mut dyn ComputeBackend, bytes: usize, copies: usize) -> Result<f64> {
    let limit = be
        .max_op_buffer_bytes()
        .map_or(usize::MAX, |b| usize::try_from(b).unwrap_or(usize::MAX));
    let bytes = bytes.min(limit) / 4 * 4;
    if bytes == 0 || copies == 0 {
        return Err(Error::Invalid(
            "the copy benchmark needs a nonzero size and count".into(),
        ));
    }
    let (a, b, bytes) = alloc_pair(be, bytes)?;
    let copy = time_passes(be, &a, &b, copies, |be, src, dst| {
        be.copy(src, 0, dst, 0, bytes)
    });
    let stream = time_passes(be, &a, &b, copies, |be, src, dst| {
        be.scale(src, 1.0, dst, bytes / 4)
    });
    be.free(a);
    be.free(b);
    let best = copy?.min(stream?);
    Ok(2.0 * (bytes * copies) as f64 / best.max(1e-9) / 1e9)
}

/// Two device buffers of `bytes`, halved while the device lacks the memory
/// (down to [`MIN_PROBE_BYTES`]): the probe is sized for a large GPU, and
/// a smaller one holding a model still gets a figure.
fn alloc_pair(be: &mut dyn ComputeBackend, bytes: usize) -> Result<(Buffer, Buffer, usize)> {
    let mut bytes = bytes;
    loop {
        let pair = be.alloc(bytes).and_then(|a| match be.alloc(bytes) {
            Ok(b) => Ok((a, b)),
            Err(e) => {
                be.free(a);
                Err(e)
            }
        });
        match pair {
            Ok((a, b)) => return Ok((a, b, bytes)),
            Err(e) if e.kind() == ErrorKind::OutOfDeviceMemory && bytes / 2 >= MIN_PROBE_BYTES => {
                bytes = bytes / 2 / 4 * 4;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Best wall-clock seconds of one pass of `copies` transfers by `op`, after
/// a warm-up pass.
fn time_passes(
    be: &mut dyn ComputeBackend,
    a: &Buffer,
    b: &Buffer,
    copies: usize,
    op: impl Fn(&mut dyn ComputeBackend, &Buffer, &Buffer) -> Result<()>,
) -> Result<f64> {
    let mut best = f64::INFINITY;
    for run in 0..=TIMED_RUNS {
        let start = Instant::now();
        be.begin_pass()?;
        for i in 0..copies {
            // Alternate directions so each copy depends on the one before.
            let (src, dst) = if i % 2 == 0 { (a, b) } else { (b, a) };
            op(be, src, dst)?;
        }
        be.end_pass()?;
        if run > 0 {
            best = best.min(start.elapsed().as_secs_f64());
        }
    }
    Ok(best)
}
