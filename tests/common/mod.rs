//! Shared test helpers: the backends every op test runs on, and the real
//! default model (fetched on first use).
#![allow(dead_code)]

pub mod process;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once};
use vkllm::backend::ComputeBackend;
use vkllm::vk::{GemvKernel, MatmulKernel, Options, PrefillAttention, VulkanBackend};

/// The checkout: cargo's run-time `CARGO_MANIFEST_DIR` (so test binaries
/// copied to another machine can be pointed at a copy), else the build's.
pub fn root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Every architecture, by its tiny model under `tests/data/reference/tiny`.
pub const TINY_ARCHS: [&str; 11] = [
    "llama",
    "qwen2",
    "qwen3",
    "gemma3",
    "phi3",
    "gpt2",
    "qwen3moe",
    "mixtral",
    "gpt_oss",
    "gpt_oss_mxfp4",
    "bitnet",
];

/// The tiny mixture-of-experts models under `tests/data/reference/tiny`
/// (scripts/make_tiny_moe.py), each with its llama.cpp architecture.
pub const TINY_MOE_ARCHS: [(&str, &str); 4] = [
    ("qwen3moe", "qwen3moe"),
    ("mixtral", "llama"),
    ("gpt_oss", "gpt-oss"),
    ("gpt_oss_mxfp4", "gpt-oss"),
];

/// The transformers references (`tests/data/reference/README.md`).
pub fn reference_dir() -> PathBuf {
    root().join("tests").join("data").join("reference")
}

/// Path of SmolLM2-135M-Instruct Q4_1, fetched with scripts/fetch-model.sh if absent.
pub fn smollm2() -> PathBuf {
    static FETCH: Once = Once::new();
    let path = root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    FETCH.call_once(|| {
        if !path.exists() {
            let status = std::process::Command::new("bash")
                .arg(root().join("scripts/fetch-model.sh"))
                .status()
                .expect("run scripts/fetch-model.sh");
            assert!(status.success(), "scripts/fetch-model.sh failed");
        }
    });
    assert!(
        Path::new(&path).exists(),
        "default model missing after fetch"
    );
    path
}

/// `path` loaded onto one backend with `opts`, for tests that expect it to load.
pub fn load_model(
    be: Box<dyn ComputeBackend>,
    path: &Path,
    opts: &vkllm::model::LoadOptions,
) -> vkllm::model::Model {
    vkllm::open::load(vec![be], path, opts, &mut |_, _| {})
        .unwrap()
        .model
}

/// The CPU backend with the environment's kernel settings (`VKLLM_CPU_ISA`,
/// `VKLLM_CPU_REPACK`).
pub fn cpu() -> Box<dyn ComputeBackend> {
    let opts = vkllm::cpu::CpuKernelOptions::from_env().unwrap();
    Box::new(vkllm::cpu::CpuBackend::with_options(None, opts).unwrap())
}

/// Makes the calling test the only one in this process using Vulkan until
/// its thread ends (libtest runs each test on its own thread; taking it again
/// on the same thread is a no-op).
///
/// Why: the validation layer (Debian's 1.3.239) keeps per-instance state in
/// an unsynchronized global map, so creating an instance while another thread
/// uses its own device crashes inside the layer (SIGSEGV in
/// vkCreateShaderModule, seen on lavapipe about once per 20 runs of the op
/// tests).
pub fn hold_vulkan_lock() {
    static LOCK: Mutex<()> = Mutex::new(());
    thread_local! {
        static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
    }
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        if held.is_none() {
            *held = Some(LOCK.lock().unwrap_or_else(|p| p.into_inner()));
        }
    });
}

/// The Vulkan backend as its concrete type, or `None` (with the reason
/// printed) only when the machine has no Vulkan device at all. With
/// `VKLLM_REQUIRE_VULKAN=1` (set by CI) a missing device is a failure instead.
pub fn vulkan_backend() -> Option<VulkanBackend> {
    vulkan_with(&Options::from_env().unwrap())
}

/// [`vulkan_backend`] with explicit options.
pub fn vulkan_with(opts: &Options) -> Option<VulkanBackend> {
    hold_vulkan_lock();
    match VulkanBackend::new(opts) {
        Ok(b) => Some(b),
        Err(e) => {
            if vkllm::vk::vulkan_required() {
                panic!("VKLLM_REQUIRE_VULKAN=1 but the Vulkan backend failed: {e}");
            }
            eprintln!("skipping Vulkan: {e}");
            None
        }
    }
}

/// [`vulkan_backend`], boxed.
pub fn vulkan() -> Option<Box<dyn ComputeBackend>> {
    vulkan_backend().map(|b| Box::new(b) as Box<dyn ComputeBackend>)
}

/// [`vulkan_backend`] with an exact f32 GEMM: by default a device with
/// cooperative matrices rounds prefill matmul inputs to f16, and the parity
/// tests against transformers use this one (tests of the default use
/// [`vulkan`]). Its f32 tiles there; a CPU device's own default (the
/// lanes, lavapipe) is f32 already.
pub fn vulkan_exact() -> Option<Box<dyn ComputeBackend>> {
    vulkan_exact_backend().map(|b| Box::new(b) as Box<dyn ComputeBackend>)
}

/// [`vulkan_exact`], unboxed.
pub fn vulkan_exact_backend() -> Option<VulkanBackend> {
    vulkan_backend().map(|mut b| {
        if b.kernels().matmul.is_coopmat() {
            b.set_matmul(MatmulKernel::Tiles).unwrap();
        }
        b
    })
}

/// [`vulkan_exact_backend`] with a GPU's kernel plans where the device picks
/// a CPU device's own (lavapipe, `Kernels` in `vkllm info`): decode matmuls
/// on the GEMVs instead of the lanes GEMM, decode attention split over many
/// workgroups with their merges instead of one per head tile, prefill
/// attention on the flash tiles instead of the decode kernel. So the tests
/// that take it run those paths in whole passes there too. None where the
/// device already runs them (a GPU) or has no Vulkan.
pub fn vulkan_gpu_plans_backend() -> Option<VulkanBackend> {
    gpu_plans(vulkan_exact_backend()?)
}

/// `b` switched to a GPU's kernel plans where it runs a CPU device's (see
/// [`vulkan_gpu_plans_backend`]); None where it runs them already.
pub fn gpu_plans(mut b: VulkanBackend) -> Option<VulkanBackend> {
    let k = b.kernels();
    let cpu_plans =
        !k.decode_splits || k.attention == PrefillAttention::Decode || k.gemv == GemvKernel::Gemm;
    if !cpu_plans {
        return None;
    }
    b.set_decode_splits(true);
    if k.attention == PrefillAttention::Decode {
        b.set_attention(PrefillAttention::Flash).unwrap();
    }
    if k.gemv == GemvKernel::Gemm {
        b.set_gemv(GemvKernel::Auto);
    }
    Some(b)
}

/// Every backend available here: the CPU always, Vulkan (exact, see
/// [`vulkan_exact`]) when a device exists.
pub fn backends() -> Vec<(&'static str, Box<dyn ComputeBackend>)> {
    let mut v: Vec<(&'static str, Box<dyn ComputeBackend>)> = vec![("cpu", cpu())];
    if let Some(vk) = vulkan_exact() {
        v.push(("vulkan", vk));
    }
    v
}

/// candle's `test_device!`: one test body, one `#[test]` per kind of device.
/// `test_device!(body, body_cpu, body_vulkan)` defines `body_cpu`, which
/// calls `body(device)` for each of `cpu_backends()`, and `body_vulkan`, for
/// each of `vulkan_backends()` (empty without a Vulkan device, unless
/// VKLLM_REQUIRE_VULKAN=1 makes that a failure); both lists are the calling
/// module's. `test_device!(body, body_cpu: cpus, body_vulkan: vulkans)` takes
/// other lists.
#[macro_export]
macro_rules! test_device {
    ($body:ident, $cpu:ident, $vulkan:ident) => {
        $crate::test_device!($body, $cpu: cpu_backends, $vulkan: vulkan_backends);
    };
    ($body:ident, $cpu:ident: $cpus:path, $vulkan:ident: $vulkans:path) => {
        #[test]
        fn $cpu() {
            for device in $cpus() {
                $body(device);
            }
        }

        #[test]
        fn $vulkan() {
            for device in $vulkans() {
                $body(device);
            }
        }
    };
}

/// Runs `f` inside one pass.
pub fn pass<B: ComputeBackend + ?Sized>(b: &mut B, f: impl FnOnce(&mut B)) {
    b.begin_pass().unwrap();
    f(b);
    b.end_pass().unwrap();
}

/// Deterministic pseudo-random f32s in [-1, 1).
pub fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
    vkllm::random::uniform_f32(n, seed)
}

/// Attention sink logits for `n_heads` heads (`AttentionParams::sinks`), for
/// queries and keys in [-4, 4] (or [-2, 2]): most in [-5, 25], where the
/// largest scores lie, so they take a visible share of each softmax; head 0
/// far above every score (200: its exp(sink - max) overflows f32, and its
/// output is ~0) and head 1 far below (-100: no effect at all).
pub fn attention_sinks(n_heads: usize, seed: u64) -> Vec<f32> {
    let mut s: Vec<f32> = rand_f32(n_heads, seed)
        .iter()
        .map(|v| v * 15.0 + 10.0)
        .collect();
    if let Some(first) = s.first_mut() {
        *first = 200.0;
    }
    if let Some(second) = s.get_mut(1) {
        *second = -100.0;
    }
    s
}

/// A `[rows, cols]` weight of `dtype` from deterministic random values:
/// quantized by ggml's reference quantizer where vkllm has one; otherwise
/// (the 2- and 3-bit i-quants, whose one f16 scale leads each block) random
/// bytes with every block's scale set to a random finite value (random bits
/// could be inf or NaN).
pub fn weight_bytes(dtype: vkllm::DType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let rb = dtype.row_bytes(cols).unwrap();
    let vals = rand_f32(rows * cols, seed);
    let mut out = vec![0u8; rows * rb];
    if dtype.format().encode.is_some() {
        for (src, dst) in vals.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
            vkllm::quants::quantize_row(dtype, src, dst).unwrap();
        }
        return out;
    }
    for (b, v) in out.iter_mut().zip(&vals) {
        *b = ((v + 1.0) * 128.0) as u8;
    }
    for (block, v) in out
        .chunks_exact_mut(dtype.block_bytes())
        .zip(vals.iter().rev())
    {
        block[..2].copy_from_slice(&half::f16::from_f32(v * 0.01).to_bits().to_le_bytes());
    }
    out
}

pub fn upload_f32(b: &mut dyn ComputeBackend, data: &[f32]) -> vkllm::backend::Buffer {
    let buf = b.alloc(data.len() * 4).unwrap();
    b.upload(&buf, 0, bytemuck::cast_slice(data)).unwrap();
    buf
}

pub fn upload_u32(b: &mut dyn ComputeBackend, data: &[u32]) -> vkllm::backend::Buffer {
    let buf = b.alloc(data.len() * 4).unwrap();
    b.upload(&buf, 0, bytemuck::cast_slice(data)).unwrap();
    buf
}

pub fn download_f32(
    b: &mut dyn ComputeBackend,
    buf: &vkllm::backend::Buffer,
    n: usize,
) -> Vec<f32> {
    let mut out = vec![0f32; n];
    b.download(buf, 0, bytemuck::cast_slice_mut(&mut out))
        .unwrap();
    out
}

pub fn download_u32(
    b: &mut dyn ComputeBackend,
    buf: &vkllm::backend::Buffer,
    n: usize,
) -> Vec<u32> {
    let mut out = vec![0u32; n];
    b.download(buf, 0, bytemuck::cast_slice_mut(&mut out))
        .unwrap();
    out
}

/// `got` within `tol * scale[i]` of `want`, element by element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], scale: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(
            (g - w).abs() <= tol * s.max(1e-30),
            "{what}[{i}]: got {g}, want {w} (allowed {})",
            tol * s
        );
    }
}

/// Elementwise results: a few f32 ulps of the magnitude.
pub fn assert_ulps(what: &str, got: &[f32], want: &[f32], rel: f32) {
    let scale: Vec<f32> = want.iter().map(|w| w.abs().max(1e-6)).collect();
    assert_close(what, got, want, &scale, rel);
}

/// Largest |a - b|, with a readable panic when lengths differ.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The real Gemma 3 270M Q4_K_M GGUF (llama.cpp's converter), or `None` with
/// a note when it has not been fetched: it is 250 MB, so tests do not fetch
/// it themselves; scripts/test.sh (CI) runs scripts/fetch-gemma3.sh first.
pub fn gemma3() -> Option<PathBuf> {
    let path = std::env::var_os("VKLLM_GEMMA3")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("models/gemma-3-270m-q4_k_m.gguf"));
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "skipping: {} is absent (run scripts/fetch-gemma3.sh)",
            path.display()
        );
        None
    }
}

/// A page table of `n` distinct page ids scattered over a pool of `pages`
/// (`n <= pages`, `pages` no multiple of 37): neighbouring positions land
/// in pages far apart, in no order. `salt` shifts the ids.
pub fn scrambled_pages(n: usize, pages: usize, salt: usize) -> Vec<u32> {
    assert!(
        n <= pages && !pages.is_multiple_of(37),
        "{n} of {pages} pages"
    );
    (0..n).map(|i| ((i * 37 + salt) % pages) as u32).collect()
}

/// The cache row a page table maps position `p` to, in pages of `1 << log2`.
pub fn paged_row(table: &[u32], log2: u32, p: usize) -> usize {
    ((table[p >> log2] as usize) << log2) | (p & ((1 << log2) - 1))
}

/// Positions `0..len` of a sequence whose page table is `table`, gathered
/// from a pool of rows of `width` values: the cache it would have unpaged.
pub fn gather_pages(pool: &[f32], table: &[u32], log2: u32, width: usize, len: usize) -> Vec<f32> {
    (0..len)
        .flat_map(|p| {
            let row = paged_row(table, log2, p);
            pool[row * width..(row + 1) * width].iter().copied()
        })
        .collect()
}

/// A tiny reference model's `reference.json` (tests/data/reference): its
/// prompt, transformers' logits of every position, its 16 greedy tokens.
pub struct TinyRef {
    pub prompt: Vec<u32>,
    pub logits: Vec<f32>,
    pub greedy: Vec<u32>,
}

/// A JSON array of token ids.
pub fn json_ids(x: &serde_json::Value) -> Vec<u32> {
    x.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

/// The reference of `tests/data/reference/tiny/NAME`.
pub fn tiny_reference(name: &str) -> TinyRef {
    use serde_json::Value;
    let path = reference_dir()
        .join("tiny")
        .join(name)
        .join("reference.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    TinyRef {
        prompt: json_ids(&v["prompt_ids"]),
        logits: v["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
            })
            .collect(),
        greedy: json_ids(&v["greedy_16"]),
    }
}

/// Index of the largest value, the first on ties.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}
