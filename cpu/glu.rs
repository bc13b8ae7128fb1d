//! `out = act(gate) * up` (or `act(gate)`), f32.

use crate::backend::Activation;
use rayon::prelude::*;

#[inline]
fn activate(act: Activation, x: f32) -> f32 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => {
            // sqrt(2 / pi)
            const C: f32 = 0.797_884_6;
            0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
        }
    }
}

pub(crate) fn run(act: Activation, gate: &[f32], up: Option<&[f32]>, out: &mut [f32]) {
    const CHUNK: usize = 4096;
    match up {
        Some(up) => out
            .par_chunks_mut(CHUNK)
            .zip(gate.par_chunks(CHUNK).zip(up.par_chunks(CHUNK)))
            .for_each(|(o, (g, u))| {
                for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                    *o = activate(act, *g) * u;
                }
            }),
        None => out
            .par_chunks_mut(CHUNK)
            .zip(gate.par_chunks(CHUNK))
            .for_each(|(o, g)| {
                for (o, g) in o.iter_mut().zip(g) {
                    *o = activate(act, *g);
                }
            }),
    }
}
