//! The format table: quants/types.rs declares each element type once (one
//! row), and [`quant_types`] expands the rows into [`DType`] and
//! [`FORMATS`], so the enum and the table cannot disagree. The loaders, the
//! codecs, the GPU repack and the kernel choices (GPU and CPU) read a type's
//! facts here, never from lists of their own.

use super::{float, iq23, iq4, iq_grids, kquants, kquants_low, legacy, mxfp4, ternary, QK_K};
use crate::error::{Error, Result};

/// One block (`block_bytes` bytes) into `block_elems` values.
pub type Decode = fn(&[u8], &mut [f32]);
/// `block_elems` values into one block (`block_bytes` bytes).
pub type Encode = fn(&[f32], &mut [u8]);

/// Everything vkllm knows about one element type.
pub struct Format {
    /// Lower-case ggml name (`q4_k`, `bf16`, ...).
    pub name: &'static str,
    /// The ggml type id used in GGUF tensor infos.
    pub ggml_id: u32,
    /// Elements per block (1 for the float types).
    pub block_elems: usize,
    pub block_bytes: usize,
    pub decode: Decode,
    /// ggml's reference quantizer; `None` where vkllm has none.
    pub encode: Option<Encode>,
    /// How the Vulkan backend lays a block out (`None`: as GGUF stores it).
    pub gpu: Option<Repack>,
    pub gemv: GpuGemv,
    pub cpu: CpuKernels,
}

/// A block's GPU layout (vk/layout.rs, glsl/dequant.glsl): bytes `[0, split)`
/// stay, the bytes from `split` move `shift` bytes later, and the block grows
/// to `padded` bytes, so every block and its quants start on a 32-bit word.
/// `head` (a whole number of words) goes before the first block: the table
/// the shaders look values up in (the i-quant grids), else empty.
#[derive(Clone, Copy, Debug)]
pub struct Repack {
    pub split: usize,
    pub shift: usize,
    pub padded: usize,
    pub head: &'static [u8],
}

/// How the GPU GEMV (glsl/mul_mat_vec.comp, vk/ops/matmul.rs) takes a type;
/// build.rs builds its shader variants from the same row.
#[derive(Clone, Copy, Debug)]
pub struct GpuGemv {
    /// Weight rows a workgroup shares in the f32 kernel.
    pub rows: u32,
    /// Slices a block splits into where the f32 kernel goes block by block
    /// (the type's `GEMV_LANES` decode in mul_mat_vec.comp); `None`: 4
    /// values at a time through dequant.glsl.
    pub lanes: Option<u32>,
    /// Slices per block of the integer-dot kernels (mul_mat_vec_q8 and
    /// mul_mat_vec_q8in); `None`: the type has none.
    pub int_dot_lanes: Option<u32>,
}

/// The CPU fast paths a type has; without one, the portable path (the
/// scalar codec, then SIMD dots) takes it.
#[derive(Clone, Copy, Debug)]
pub struct CpuKernels {
    /// The x86 kernels decode its blocks in registers (cpu/simd/x86).
    pub simd: bool,
    /// Integer dots against quantized activations (cpu/act.rs,
    /// cpu/simd/x86/intdot.rs).
    pub int_dot: bool,
    /// Weights repacked at load into groups of 16 rows (cpu/repack.rs,
    /// cpu/simd/x86/packed.rs).
    pub repack: bool,
    /// Up to this many activation rows the repacked row dots serve prefill
    /// too (they decode a group once for four rows; the GEMM decodes a panel
    /// once for all rows, which wins on long prompts: benches/README.md,
    /// "Ternary prefill"); 0: decode only.
    pub packed_dots_max_m: usize,
}

const fn repack(split: usize, shift: usize, padded: usize) -> Option<Repack> {
    Some(Repack {
        split,
        shift,
        padded,
        head: &[],
    })
}

/// The i-quants' layout: the scale padded to a word, the grid first.
const fn grid_repack(padded: usize, grid: &'static [u8]) -> Option<Repack> {
    Some(Repack {
        split: 2,
        shift: 2,
        padded,
        head: grid,
    })
}

/// The rows of quants/types.rs as [`DType`] (one variant per row, in row
/// order) and [`FORMATS`] (row `i` describes variant `i`).
macro_rules! quant_types {
    ($(
        $variant:ident {
            name: $name:literal, ggml_id: $ggml_id:literal,
            block_elems: $block_elems:expr, block_bytes: $block_bytes:expr,
            decode: $decode:path, encode: $encode:expr, gpu: $gpu:expr,
            gemv: GpuGemv { rows: $rows:expr, lanes: $lanes:expr, int_dot_lanes: $int_dot:expr $(,)? },
            cpu: $cpu:expr $(,)?
        }
    ),* $(,)?) => {
        /// A weight (or activation) element type. Quantized types store
        /// `block_elems()` values in `block_bytes()` bytes; f32/f16/bf16 are
        /// "blocks" of one element. Declared in quants/types.rs.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum DType {
            $($variant,)*
        }

        /// Number of element types.
        pub const COUNT: usize = [$(stringify!($variant)),*].len();

        impl DType {
            /// Every type, in declaration order.
            pub const ALL: [DType; COUNT] = [$(DType::$variant),*];
        }

        /// One row per [`DType`], indexed by the variant.
        pub static FORMATS: [Format; COUNT] = [$(
            Format {
                name: $name,
                ggml_id: $ggml_id,
                block_elems: $block_elems,
                block_bytes: $block_bytes,
                decode: $decode,
                encode: $encode,
                gpu: $gpu,
                gemv: GpuGemv { rows: $rows, lanes: $lanes, int_dot_lanes: $int_dot },
                cpu: $cpu,
            },
        )*];
    };
}

include!("types.rs");

impl DType {
    /// This type's row of the format table.
    pub fn format(self) -> &'static Format {
        &FORMATS[self as usize]
    }

    /// The ggml type id used in GGUF tensor infos.
    pub fn ggml_type_id(self) -> u32 {
        self.format().ggml_id
    }

    /// Inverse of [`DType::ggml_type_id`]; `None` for types vkllm does not support.
    pub fn from_ggml_type_id(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_type_id() == id)
    }

    /// Lower-case ggml name (`q4_k`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        self.format().name
    }

    pub fn from_name(name: &str) -> Option<DType> {
        let lower = name.to_ascii_lowercase();
        DType::ALL.into_iter().find(|t| t.name() == lower)
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        self.format().block_elems
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.format().block_bytes
    }

    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes needed for a row of `n` elements; an error when `n` is not a
    /// whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        let be = self.block_elems();
        if !n.is_multiple_of(be) {
            return Err(Error::Shape(format!(
                "a {} row needs a multiple of {be} elements, got {n}",
                self.name()
            )));
        }
        (n / be)
            .checked_mul(self.block_bytes())
            .ok_or_else(|| Error::Shape(format!("{n} {} elements overflow usize", self.name())))
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
