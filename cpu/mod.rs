//! CPU backend: SIMD kernels (AVX-512 / AVX2+FMA detected at run time, NEON on
//! aarch64, scalar elsewhere) run on a private rayon pool.

pub mod quant;
