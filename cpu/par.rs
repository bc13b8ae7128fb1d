//! Parallel-or-inline loops. Handing an op to the pool costs a thread wake-up
//! (several µs), more than small ops take, so ops below
//! [`PAR_MIN_WORK`] run inline on the calling thread with the same code.

use super::simd::Isa;
use super::Activations;
use rayon::prelude::*;

/// Work (roughly multiply-adds or values touched) below which an op runs inline.
pub(crate) const PAR_MIN_WORK: usize = 1 << 21;

/// What an op kernel needs to know about where it runs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub isa: Isa,
    /// Run on the pool (true) or inline on the calling thread.
    pub par: bool,
    /// What decode matmuls of legacy and K-quant weights do with activations.
    pub acts: Activations,
}

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
    if par {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// `f(&mut state, i)` for `i in 0..n`, with one `init()` state per worker.
pub(crate) fn range_init<S>(
    par: bool,
    n: usize,
    init: impl Fn() -> S + Sync + Send,
    f: impl Fn(&mut S, usize) + Sync + Send,
) {
    if par {
        (0..n).into_par_iter().for_each_init(init, |s, i| f(s, i));
    } else {
        let mut s = init();
        (0..n).for_each(|i| f(&mut s, i));
    }
}
