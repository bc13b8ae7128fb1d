//! Prefill GEMM throughput on the Vulkan device: for every weight type and a
//! model's matmul shapes, the TFLOP/s `matmul` reaches with `m` input rows
//! (a prompt's tokens), timed by the GPU's timestamps around each dispatch,
//! beside the device's peak. The kernel is the one the backend chose
//! (`VKLLM_MATMUL` forces one), so running it once per kernel compares them
//! on the same device.
//!
//! The peak is measured first: f16 weights on a square problem (n = k =
//! 4096 at m = 2048) with the backend's default kernel, its best; with
//! `VKLLM_MATMUL` set the probe opens a second backend without it, so that
//! every kernel's run reads against the same peak. The header prints it,
//! and each cell of the table is `TFLOP/s (% of peak)`: one row per weight
//! type and `n x k` shape, one column per `m`.
//!
//! `cargo bench --bench gemm` prints the table; the first three variables
//! take comma-separated lists, and each gives all (or its default) unset:
//! - `VKLLM_GEMM_M=64,512`: the row counts (512);
//! - `VKLLM_GEMM_TYPES=q4_k,f16`: the weight types, by their ggml names;
//! - `VKLLM_GEMM_SHAPES=4096x4096,14336x4096`: the shapes, among the
//!   Llama-3.2-1B and Llama-3.1-8B ones below;
//! - `VKLLM_GEMM_PEAK=NxM`: the peak probe's shape, n = k = N at m = M rows
//!   (4096x2048); `0` skips it (no percentages), for a slow device such as
//!   lavapipe.
//!
//! Every type the backend takes as a weight is timed. The types vkllm has no
//! quantizer for (the IQ2 / IQ3 grids) get random valid blocks
//! ([`vkllm::bench::synth::fill_random`]): the GEMM's speed does not depend
//! on the values. A type the backend refuses prints its error in its row.

mod common;

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use vkllm::backend::{Buffer, ComputeBackend, Weight};
use vkllm::quants::quantize_row;
use vkllm::{DType, Result};

/// Matmuls per timed pass, and passes (the first is a warm-up).
const PER_PASS: usize = 8;
const PASSES: usize = 4;

/// The peak probe's n (= k) and m when `VKLLM_GEMM_PEAK` is unset: large
/// enough to fill an H200 with the GEMM's largest tiles.
const PEAK_SHAPE: (usize, usize) = (4096, 2048);

/// Width of a table cell: `TFLOP/s (pct%)`, or the TFLOP/s alone (up to
/// `0.000123`, [`fmt_tflops`]).
const CELL: usize = 15;
const CELL_BARE: usize = 8;

/// Best TFLOP/s over the passes: 2·m·n·k per matmul over the GPU time of
/// its dispatches (the GEMM's own, without norm or add).
fn gemm_tflops(
    b: &mut dyn ComputeBackend,
    w: &Weight,
    x: &Buffer,
    y: &Buffer,
    m: usize,
) -> Result<f64> {
    // One matmul first, so that a type the kernel cannot take reads as an
    // error in its row instead of a panic in the timed passes.
    b.begin_pass()?;
    let first = b.matmul(w, None, x, y, m);
    b.end_pass()?;
    first?;
    common::settle(b, |b| {
        for _ in 0..PER_PASS {
            b.matmul(w, None, x, y, m).unwrap();
        }
    });
    let mut best = f64::INFINITY;
    for pass in 0..PASSES {
        let secs = common::gpu_pass_seconds(b, |b| {
            for _ in 0..PER_PASS {
                b.matmul(w, None, x, y, m).unwrap();
            }
        });
        if pass > 0 {
            best = best.min(secs);
        }
    }
    Ok(2.0 * (m * w.rows * w.cols * PER_PASS) as f64 / best / 1e12)
}

/// [`gemm_tflops`] on `m` random input rows, its buffers freed whatever
/// happens.
fn tflops_at(b: &mut dyn ComputeBackend, w: &Weight, m: usize) -> Result<f64> {
    let x = b.alloc(m * w.cols * 4)?;
    let y = match b.alloc(m * w.rows * 4) {
        Ok(y) => y,
        Err(e) => {
            b.free(x);
            return Err(e);
        }
    };
    let r = b
        .upload(&x, 0, bytemuck::cast_slice(&common::rand(m * w.cols, 99)))
        .and_then(|()| gemm_tflops(b, w, &x, &y, m));
    b.free(x);
    b.free(y);
    r
}

/// One `cols`-wide weight row of `dtype`, which the bench repeats for every
/// row: quantized from random values, or random valid blocks (at the
/// weights' spread, as `vkllm synth` writes them) where vkllm has no
/// quantizer for the type.
fn weight_row(dtype: DType, cols: usize) -> Result<Vec<u8>> {
    use vkllm::bench::synth::{fill_random, random_blocks, WEIGHT_STD};
    let mut row = vec![0u8; dtype.row_bytes(cols)?];
    if random_blocks(dtype, false) {
        fill_random(
            dtype,
            &mut ChaCha8Rng::seed_from_u64(1),
            WEIGHT_STD,
            &mut row,
        )?;
    } else {
        quantize_row(dtype, &common::rand(cols, 1), &mut row)?;
    }
    Ok(row)
}

/// `dtype`'s `rows x cols` weight on the device.
fn upload(b: &mut dyn ComputeBackend, dtype: DType, rows: usize, cols: usize) -> Result<Weight> {
    let row = weight_row(dtype, cols)?;
    b.upload_weight(dtype, rows, cols, &row.repeat(rows))
}

/// The device's peak: f16 weights, `n x n`, at `m` rows.
fn peak(b: &mut dyn ComputeBackend, n: usize, m: usize) -> Result<f64> {
    let w = upload(b, DType::F16, n, n)?;
    let r = tflops_at(b, &w, m);
    b.free_weight(w);
    r
}

/// `VKLLM_GEMM_PEAK`: the probe's (n, m), `None` for `0`, or the value it
/// could not read.
fn peak_shape() -> std::result::Result<Option<(usize, usize)>, String> {
    let Ok(v) = std::env::var("VKLLM_GEMM_PEAK") else {
        return Ok(Some(PEAK_SHAPE));
    };
    if v.trim() == "0" {
        return Ok(None);
    }
    v.trim()
        .split_once('x')
        .and_then(|(n, m)| Some((n.parse::<usize>().ok()?, m.parse::<usize>().ok()?)))
        .filter(|&(n, m)| n > 0 && m > 0)
        .map(Some)
        .ok_or(v)
}

/// TFLOP/s to three significant digits (one decimal at least), so that a
/// GPU's hundreds and lavapipe's thousandths both read.
fn fmt_tflops(t: f64) -> String {
    if !(t.is_finite() && t > 0.0) {
        return format!("{t}");
    }
    let decimals = (2 - t.log10().floor() as i32).clamp(1, 6) as usize;
    format!("{t:.decimals$}")
}

fn main() {
    let Some(mut b) = common::vulkan("gemm") else {
        return;
    };
    let peak_at = match peak_shape() {
        Ok(p) => p,
        Err(v) => {
            eprintln!("gemm bench: VKLLM_GEMM_PEAK={v}: want NxM (n = k = N, m = M rows) or 0");
            std::process::exit(2);
        }
    };
    let ms: Vec<usize> = std::env::var("VKLLM_GEMM_M")
        .unwrap_or_else(|_| "512".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    // Llama-3.2-1B's q/o, k/v, gate/up and down, then Llama-3.1-8B's.
    let shapes = [
        (2048usize, 2048usize),
        (512, 2048),
        (8192, 2048),
        (2048, 8192),
        (4096, 4096),
        (1024, 4096),
        (14336, 4096),
        (4096, 14336),
    ];
    let types = std::env::var("VKLLM_GEMM_TYPES")
        .unwrap_or_default()
        .to_ascii_lowercase();
    let only = std::env::var("VKLLM_GEMM_SHAPES").unwrap_or_default();
    let picked = |list: &str, name: &str| list.is_empty() || list.split(',').any(|t| t == name);
    // A misspelt filter would otherwise print an empty table.
    for t in types.split(',').filter(|t| !t.is_empty()) {
        if DType::from_name(t).is_none() {
            eprintln!("gemm bench: VKLLM_GEMM_TYPES: no type {t}");
        }
    }
    for s in only.split(',').filter(|s| !s.is_empty()) {
        if !shapes.iter().any(|(r, c)| format!("{r}x{c}") == s) {
            eprintln!("gemm bench: VKLLM_GEMM_SHAPES: {s} is none of the shapes");
        }
    }

    // The options only where they force a kernel: the peak then opens a
    // backend from them without it.
    let forcing = vkllm::vk::Options::from_env()
        .ok()
        .filter(|o| o.kernels.matmul.is_some());
    let forced = forcing.as_ref().and_then(|o| o.kernels.matmul);
    println!(
        "{}, VKLLM_MATMUL={}",
        b.name(),
        forced.map_or("", vkllm::vk::MatmulOverride::name)
    );
    let peak = peak_at.and_then(|(n, m)| {
        let kernel = forced.map_or("", |_| ", default kernel");
        let what = format!("peak (f16 {n}x{n}, m={m}{kernel})");
        // The default kernel's peak whatever VKLLM_MATMUL forces, so that
        // runs of different kernels share one yardstick.
        let r = match forcing.clone() {
            None => peak(b.as_mut(), n, m),
            Some(mut o) => {
                o.kernels.matmul = None;
                vkllm::vk::open(&o).and_then(|mut d| peak(d.as_mut(), n, m))
            }
        };
        match r {
            Ok(t) => {
                println!("{what}: {} TFLOP/s", fmt_tflops(t));
                Some(t).filter(|t| t.is_finite() && *t > 0.0)
            }
            Err(e) => {
                println!("{what}: failed ({e}); no percentages");
                None
            }
        }
    });
    if peak_at.is_none() {
        println!("peak: skipped (VKLLM_GEMM_PEAK=0)");
    }

    let cell = if peak.is_some() { CELL } else { CELL_BARE };
    print!("{:<8} {:>12}", "dtype", "n x k");
    for m in &ms {
        print!(" {:>cell$}", format!("m={m}"));
    }
    println!("  {}", peak.map_or("TFLOP/s", |_| "TFLOP/s (% of peak)"));
    for dtype in DType::ALL.into_iter().filter(|d| picked(&types, d.name())) {
        for &(rows, cols) in &shapes {
            let shape = format!("{rows}x{cols}");
            if !picked(&only, &shape) {
                continue;
            }
            print!("{:<8} {:>12}", dtype.name(), shape);
            let w = match upload(b.as_mut(), dtype, rows, cols) {
                Ok(w) => w,
                Err(e) => {
                    println!(" skipped: upload failed ({e})");
                    continue;
                }
            };
            let mut errors = Vec::new();
            for &m in &ms {
                let text = match tflops_at(b.as_mut(), &w, m) {
                    Ok(t) => match peak {
                        Some(p) => format!("{} ({:>3.0}%)", fmt_tflops(t), 100.0 * t / p),
                        None => fmt_tflops(t),
                    },
                    Err(e) => {
                        errors.push(format!("m={m}: {e}"));
                        "error".into()
                    }
                };
                print!(" {text:>cell$}");
            }
            println!();
            for e in errors {
                println!("    {e}");
            }
            b.free_weight(w);
        }
    }
}
