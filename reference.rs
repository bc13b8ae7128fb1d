//! Plain scalar versions of every `ComputeBackend` op, written for obviousness
//! rather than speed: the yardstick that tests (and benches) compare backends
//! against. Sums are accumulated in f64 so the reference is more accurate than
//! any f32 backend; weights are dequantized with ggml's exact formulas
//! ([`crate::quants::dequantize_row`]).

use crate::backend::{
    Activation, AttentionParams, ExpertsParams, RopeParams, RopeScaling, RopeStyle, RouteParams,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::quants::dequantize_row;

fn need(op: &'static str, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::op(
            op,
            format!("{what} has {got} values, expected {want}"),
        ));
    }
    Ok(())
}

/// A `[rows, cols]` `dtype` matrix as f32, row-major.
pub fn dequantize(dtype: DType, data: &[u8], rows: usize, cols: usize) -> Result<Vec<f32>> {
    let rb = dtype.row_bytes(cols)?;
    need("dequantize", "weight bytes", data.len(), rows * rb)?;
    let mut out = vec![0f32; rows * cols];
    if cols > 0 {
        for (src, dst) in data.chunks_exact(rb).zip(out.chunks_exact_mut(cols)) {
            dequantize_row(dtype, src, dst)?;
        }
    }
    Ok(out)
}

/// `y[m, rows] = x[m, cols] · Wᵀ + bias` with `W` a `[rows, cols]` `dtype` matrix.
pub fn matmul(
    dtype: DType,
    w: &[u8],
    rows: usize,
    cols: usize,
    bias: Option<&[f32]>,
    x: &[f32],
    m: usize,
) -> Result<Vec<f32>> {
    let wf = dequantize(dtype, w, rows, cols)?;
    need("matmul", "x", x.len(), m * cols)?;
    if let Some(b) = bias {
        need("matmul", "bias", b.len(), rows)?;
    }
    let mut y = vec![0f32; m * rows];
    for i in 0..m {
        let xi = &x[i * cols..(i + 1) * cols];
        for r in 0..rows {
            let wr = &wf[r * cols..(r + 1) * cols];
            let dot: f64 = wr.iter().zip(xi).map(|(a, b)| *a as f64 * *b as f64).sum();
            let b = bias.map_or(0.0, |b| b[r] as f64);
            y[i * rows + r] = (dot + b) as f32;
        }
    }
    Ok(y)
}

/// Rows `ids` of the `[rows, cols]` `dtype` table, dequantized.
pub fn embedding(
    dtype: DType,
    table: &[u8],
    rows: usize,
    cols: usize,
    ids: &[u32],
) -> Result<Vec<f32>> {
    let all = dequantize(dtype, table, rows, cols)?;
    let mut out = Vec::with_capacity(ids.len() * cols);
    for &id in ids {
        let id = id as usize;
        if id >= rows {
            return Err(Error::op(
                "embedding",
                format!("token id {id} >= {rows} table rows"),
            ));
        }
        out.extend_from_slice(&all[id * cols..(id + 1) * cols]);
    }
    Ok(out)
}

fn rows_of(op: &'static str, x: &[f32], dim: usize) -> Result<usize> {
    if dim == 0 || !x.len().is_multiple_of(dim) {
        return Err(Error::op(
            op,
            format!("{} values are not whole rows of {dim}", x.len()),
        ));
    }
    Ok(x.len() / dim)
}

/// Per row of `dim`: `x / sqrt(mean(x²) + eps) * w`.
pub fn rms_norm(x: &[f32], w: &[f32], dim: usize, eps: f32) -> Result<Vec<f32>> {
    rows_of("rms_norm", x, dim)?;
    need("rms_norm", "w", w.len(), dim)?;
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(dim) {
        let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        out.extend(
            row.iter()
                .zip(w)
                .map(|(v, g)| (*v as f64 * inv * *g as f64) as f32),
        );
    }
    Ok(out)
}

/// Per row of `dim`: `(x - mean) / sqrt(var + eps) * w + b` (population variance).
pub fn layer_norm(x: &[f32], w: &[f32], b: &[f32], dim: usize, eps: f32) -> Result<Vec<f32>> {
    rows_of("layer_norm", x, dim)?;
    need("layer_norm", "w", w.len(), dim)?;
    need("layer_norm", "b", b.len(), dim)?;
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(dim) {
        let mean = row.iter().map(|v| *v as f64).sum::<f64>() / dim as f64;
        let var = row.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        out.extend(
            row.iter()
                .zip(w.iter().zip(b))
                .map(|(v, (g, bb))| ((*v as f64 - mean) * inv * *g as f64 + *bb as f64) as f32),
        );
    }
    Ok(out)
}

/// Rotation angle of pair `i` at `pos`: `pos * base^(-2i/rot_dim)`, with the
/// frequency rounded to f32 and the product taken in f32, as Hugging Face's
/// float32 rotary embedding does (so large positions round the same way).
/// With YaRN `scaling` the frequency is first mixed (in f64) from the
/// extrapolated one and the interpolated `freq_scale` times it:
/// `θ_interp · (1 - ramp) + θ_extrap · ramp` is `pos` times that mix.
pub fn rope_angle(
    pos: u32,
    i: usize,
    rot_dim: usize,
    base: f32,
    scaling: Option<&RopeScaling>,
) -> f32 {
    let extrap = (base as f64).powf(-2.0 * i as f64 / rot_dim as f64);
    let inv_freq = match scaling {
        None => extrap,
        Some(s) => {
            let y = (i as f64 - s.low as f64) / (s.high as f64 - s.low as f64).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            let interp = s.freq_scale as f64 * extrap;
            interp * (1.0 - ramp) + extrap * ramp
        }
    };
    pos as f32 * inv_freq as f32
}

/// Rotary embedding in place (see [`RopeParams`]).
pub fn rope(x: &mut [f32], positions: &[u32], p: &RopeParams) -> Result<()> {
    need("rope", "x", x.len(), p.rows * p.n_heads * p.head_dim)?;
    need("rope", "positions", positions.len(), p.rows)?;
    if p.rot_dim > p.head_dim || !p.rot_dim.is_multiple_of(2) {
        return Err(Error::op(
            "rope",
            format!("rot_dim {} with head_dim {}", p.rot_dim, p.head_dim),
        ));
    }
    let half = p.rot_dim / 2;
    // YaRN scales cos and sin alike.
    let mscale = p.scaling.map_or(1.0, |s| s.mscale as f64);
    for (r, &pos) in positions.iter().enumerate() {
        for h in 0..p.n_heads {
            let base = (r * p.n_heads + h) * p.head_dim;
            let v = &mut x[base..base + p.head_dim];
            for i in 0..half {
                let theta = rope_angle(pos, i, p.rot_dim, p.base, p.scaling.as_ref()) as f64;
                let (cos, sin) = (theta.cos() * mscale, theta.sin() * mscale);
                let (a, b) = match p.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (v[a] as f64, v[b] as f64);
                v[a] = (x0 * cos - x1 * sin) as f32;
                v[b] = (x0 * sin + x1 * cos) as f32;
            }
        }
    }
    Ok(())
}

/// Causal (optionally sliding-window) GQA attention with a plain softmax
/// (see [`AttentionParams`]); returns `[rows, n_heads * head_dim]`. `p`
/// must name no sinks buffer: [`attention_with_sinks`] takes their values.
pub fn attention(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    positions: &[u32],
    p: &AttentionParams,
) -> Result<Vec<f32>> {
    if p.sinks.is_some() {
        return Err(Error::op(
            "attention",
            "the reference reads sinks as values: call attention_with_sinks",
        ));
    }
    attention_with_sinks(q, k_cache, v_cache, positions, p, None)
}

/// [`attention`] with attention sinks: `sinks[h]` (one logit per query
/// head) joins head `h`'s softmax denominator (see
/// [`AttentionParams::sinks`]); `p.sinks` is not read.
pub fn attention_with_sinks(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    positions: &[u32],
    p: &AttentionParams,
    sinks: Option<&[f32]>,
) -> Result<Vec<f32>> {
    let (hd, nh, nkv) = (p.head_dim, p.n_heads, p.n_kv_heads);
    if let Some(s) = sinks {
        need("attention", "sinks", s.len(), nh)?;
    }
    if nkv == 0 || nh % nkv != 0 {
        return Err(Error::op(
            "attention",
            format!("{nh} heads over {nkv} kv heads"),
        ));
    }
    need("attention", "q", q.len(), p.rows * nh * hd)?;
    need("attention", "k_cache", k_cache.len(), p.capacity * nkv * hd)?;
    need("attention", "v_cache", v_cache.len(), p.capacity * nkv * hd)?;
    need("attention", "positions", positions.len(), p.rows)?;
    let group = nh / nkv;
    let kv_stride = nkv * hd;
    let mut out = vec![0f32; p.rows * nh * hd];
    for r in 0..p.rows {
        let pos = positions[r] as usize;
        if pos >= p.capacity {
            return Err(Error::op(
                "attention",
                format!("position {pos} >= capacity {}", p.capacity),
            ));
        }
        let first = if p.window > 0 {
            (pos + 1).saturating_sub(p.window)
        } else {
            0
        };
        for h in 0..nh {
            let kvh = h / group;
            let qv = &q[(r * nh + h) * hd..(r * nh + h + 1) * hd];
            let scores: Vec<f64> = (first..=pos)
                .map(|j| {
                    let k = &k_cache[j * kv_stride + kvh * hd..j * kv_stride + (kvh + 1) * hd];
                    let dot: f64 = qv.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                    dot * p.scale as f64
                })
                .collect();
            let sink = sinks.map(|s| s[h] as f64);
            let max = scores
                .iter()
                .chain(sink.as_ref())
                .cloned()
                .fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = exps.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
            let o = &mut out[(r * nh + h) * hd..(r * nh + h + 1) * hd];
            for (d, od) in o.iter_mut().enumerate() {
                let acc: f64 = (first..=pos)
                    .zip(&exps)
                    .map(|(j, e)| e * v_cache[j * kv_stride + kvh * hd + d] as f64)
                    .sum();
                *od = (acc / total) as f32;
            }
        }
    }
    Ok(out)
}

/// `dst` row `positions[r]` = `src` row `r` (rows of `row_len`); positions
/// past `dst` store nothing.
pub fn store_rows(src: &[f32], dst: &mut [f32], positions: &[u32], row_len: usize) {
    for (row, &p) in src.chunks_exact(row_len).zip(positions) {
        let at = p as usize * row_len;
        if at + row_len <= dst.len() {
            dst[at..at + row_len].copy_from_slice(row);
        }
    }
}

/// `act(x)` in f64; for [`Activation::SwigluOai`] the gate's factor `g' ·
/// sigmoid(1.702 g')`, `g' = min(g, 7)`, which [`glu`] multiplies by
/// `clamp(up, -7, 7) + 1`.
pub fn activate(act: Activation, x: f64) -> f64 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
        Activation::SwigluOai => {
            let g = x.min(Activation::OAI_LIMIT as f64);
            g / (1.0 + (-(Activation::OAI_ALPHA as f64) * g).exp())
        }
        Activation::Relu2 => x.max(0.0) * x.max(0.0),
    }
}

/// [`crate::backend::ComputeBackend::round_i8`]: each row of `dim` values
/// rounded to the int8 levels of its largest magnitude. The rounding itself
/// is the reference's f32 arithmetic (the scale and `x · s` as transformers
/// computes them in float32): in f64 a value at a tie would round elsewhere.
pub fn round_i8(x: &[f32], dim: usize) -> Result<Vec<f32>> {
    if dim == 0 || !x.len().is_multiple_of(dim) {
        return Err(Error::op(
            "round_i8",
            format!("{} values are not rows of {dim}", x.len()),
        ));
    }
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(dim) {
        let amax = row.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-5);
        let s = 127.0 / amax;
        out.extend(
            row.iter()
                .map(|v| (v * s).round_ties_even().clamp(-128.0, 127.0) / s),
        );
    }
    Ok(out)
}

/// `act(gate) * up`, or `act(gate)` without `up`; gpt-oss's
/// [`Activation::SwigluOai`] `act(gate) * (clamp(up, -7, 7) + 1)`, an error
/// without `up`.
pub fn glu(act: Activation, gate: &[f32], up: Option<&[f32]>) -> Result<Vec<f32>> {
    if let Some(u) = up {
        need("glu", "up", u.len(), gate.len())?;
    }
    let limit = Activation::OAI_LIMIT as f64;
    let up_of = |u: f32| match act {
        Activation::SwigluOai => (u as f64).clamp(-limit, limit) + 1.0,
        _ => u as f64,
    };
    if act == Activation::SwigluOai && up.is_none() {
        return Err(Error::op("glu", "the gpt-oss SwiGLU needs an up input"));
    }
    Ok(gate
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let a = activate(act, *g as f64);
            (a * up.map_or(1.0, |u| up_of(u[i]))) as f32
        })
        .collect())
}

pub fn add(a: &[f32], b: &[f32]) -> Result<Vec<f32>> {
    need("add", "b", b.len(), a.len())?;
    Ok(a.iter().zip(b).map(|(x, y)| x + y).collect())
}

pub fn scale(x: &[f32], s: f32) -> Vec<f32> {
    x.iter().map(|v| v * s).collect()
}

/// Index of the largest value of each row of `n` (the first on ties, NaNs
/// never win).
pub fn argmax(x: &[f32], n: usize) -> Result<Vec<u32>> {
    argmax_allowed(x, n, &|_, _| true)
}

/// [`argmax`] among the values `allowed(row, index)` admits (a grammar's
/// mask); NaNs never win and a row without a candidate gives 0.
pub fn argmax_allowed(
    x: &[f32],
    n: usize,
    allowed: &dyn Fn(usize, usize) -> bool,
) -> Result<Vec<u32>> {
    rows_of("argmax", x, n)?;
    Ok(x.chunks_exact(n)
        .enumerate()
        .map(|(r, row)| {
            let mut best: Option<usize> = None;
            for (i, v) in row.iter().enumerate() {
                if allowed(r, i) && !v.is_nan() && best.is_none_or(|b| *v > row[b]) {
                    best = Some(i);
                }
            }
            best.unwrap_or(0) as u32
        })
        .collect())
}

/// Mixture-of-experts routing (see [`crate::backend::RouteParams`]): each
/// row's experts (the `k` largest logits, the lower index first on ties)
/// and their weights, in f64.
pub fn route_experts(logits: &[f32], p: &RouteParams) -> Result<(Vec<u32>, Vec<f32>)> {
    need("route_experts", "logits", logits.len(), p.rows * p.experts)?;
    let (mut ids, mut ws) = (Vec::new(), Vec::new());
    for row in logits.chunks_exact(p.experts) {
        let mut order: Vec<usize> = (0..p.experts).collect();
        // Stable: ties keep the lower index first.
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let max = row[order[0]] as f64;
        let e = |i: usize| (row[i] as f64 - max).exp();
        let denom: f64 = if p.renorm {
            order[..p.k].iter().map(|&i| e(i)).sum()
        } else {
            (0..p.experts).map(e).sum()
        };
        for &i in &order[..p.k] {
            ids.push(i as u32);
            ws.push((e(i) / denom) as f32);
        }
    }
    Ok((ids, ws))
}

/// `y[s] = x[s or s / k] · W_eᵀ + bias[e]`, `e = ids[s]`, for the stacked
/// `[experts * n, cols]` `dtype` matrix `w`, or with `p.glu` its gated
/// halves (see [`crate::backend::ExpertsParams`]).
pub fn matmul_experts(
    dtype: DType,
    w: &[u8],
    cols: usize,
    bias: Option<&[f32]>,
    x: &[f32],
    ids: &[u32],
    p: &ExpertsParams,
) -> Result<Vec<f32>> {
    let rb = dtype.row_bytes(cols)?;
    let n = w.len() / rb / p.experts;
    need("matmul_experts", "ids", ids.len(), p.slots())?;
    let mut y = Vec::with_capacity(p.slots() * n);
    for (s, &e) in ids.iter().enumerate() {
        let e = e as usize;
        let r = if p.x_per_slot { s } else { s / p.k };
        let we = &w[e * n * rb..(e + 1) * n * rb];
        let b = bias.map(|b| &b[e * n..(e + 1) * n]);
        let row = matmul(dtype, we, n, cols, b, &x[r * cols..(r + 1) * cols], 1)?;
        match p.glu {
            Some(act) => {
                let (gate, up) = row.split_at(n / 2);
                y.extend(glu(act, gate, Some(up))?);
            }
            None => y.extend(row),
        }
    }
    Ok(y)
}

/// `out[r] = Σ_j weights[r * k + j] · y[r * k + j]` over rows of `n`.
pub fn sum_experts(y: &[f32], weights: &[f32], k: usize, n: usize) -> Vec<f32> {
    y.chunks_exact(k * n)
        .zip(weights.chunks_exact(k))
        .flat_map(|(ys, ws)| {
            (0..n).map(move |i| {
                ys.chunks_exact(n)
                    .zip(ws)
                    .map(|(yj, &w)| w as f64 * yj[i] as f64)
                    .sum::<f64>() as f32
            })
        })
        .collect()
}
