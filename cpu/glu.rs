//! `out = act(gate) * up` (or `act(gate)`), f32; gpt-oss's SwiGLU
//! `act(gate) * (clamp(up, -7, 7) + 1)`.

use super::par;
use crate::backend::Activation;

#[inline]
fn activate(act: Activation, x: f32) -> f32 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => {
            // sqrt(2 / pi)
            const C: f32 = 0.797_884_6;
            0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::SwigluOai => {
            let g = x.min(Activation::OAI_LIMIT);
            g / (1.0 + (-Activation::OAI_ALPHA * g).exp())
        }
        Activation::Relu2 => {
            let r = x.max(0.0);
            r * r
        }
    }
}

pub(crate) fn run(par: bool, act: Activation, gate: &[f32], up: Option<&[f32]>, out: &mut [f32]) {
    const CHUNK: usize = 4096;
    par::chunks(par, out, CHUNK, |c, o| {
        let g = &gate[c * CHUNK..c * CHUNK + o.len()];
        match up {
            Some(up) if act == Activation::SwigluOai => {
                let u = &up[c * CHUNK..c * CHUNK + o.len()];
                let limit = Activation::OAI_LIMIT;
                for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                    *o = activate(act, *g) * (u.clamp(-limit, limit) + 1.0);
                }
            }
            Some(up) => {
                let u = &up[c * CHUNK..c * CHUNK + o.len()];
                for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                    *o = activate(act, *g) * u;
                }
            }
            None => {
                for (o, g) in o.iter_mut().zip(g) {
                    *o = activate(act, *g);
                }
            }
        }
    });
}
