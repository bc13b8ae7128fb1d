// The element types vkllm knows: one row each, the only place a type is
// declared. quants/table.rs expands the rows into `DType` (its variants in
// this order) and `FORMATS`; build.rs includes this file too, with a macro of
// its own that keeps only `name` and the `gemv` column (which shaders each
// type gets), so the rows name nothing but their codecs, which build.rs
// never expands. Adding a type: its row here, its codec (quants/), its GLSL
// decode (glsl/dequant.glsl), its fixture (tests/data/quants).
//
// Columns (quants/table.rs documents each field):
// - name, ggml_id: the type's ggml name and GGUF id; block_elems /
//   block_bytes: its block; decode / encode: its codec;
// - gpu: its block layout on the GPU (`None`: as GGUF stores it);
// - gemv: how mul_mat_vec.comp takes it: weight rows a workgroup shares
//   (Q4_0 and Q4_1 2, for twice the workgroups on their small decode shapes:
//   benches/README.md, decode GEMV rows), slices per block of its block-by-block decode
//   (`None`: 4 values at a time through dequant.glsl) and of its integer-dot
//   kernels (`None`: it has none);
// - cpu: which CPU fast paths it has (register decoder, integer dots
//   against quantized activations, 16-row repack).
quant_types! {
    F32 {
        name: "f32", ggml_id: 0, block_elems: 1, block_bytes: 4,
        decode: float::dec_f32, encode: Some(float::enc_f32), gpu: None,
        gemv: GpuGemv { rows: 4, lanes: None, int_dot_lanes: None },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    F16 {
        name: "f16", ggml_id: 1, block_elems: 1, block_bytes: 2,
        decode: float::dec_f16, encode: Some(float::enc_f16), gpu: None,
        gemv: GpuGemv { rows: 4, lanes: None, int_dot_lanes: None },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    BF16 {
        name: "bf16", ggml_id: 30, block_elems: 1, block_bytes: 2,
        decode: float::dec_bf16, encode: Some(float::enc_bf16), gpu: None,
        gemv: GpuGemv { rows: 4, lanes: None, int_dot_lanes: None },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    Q8_0 {
        name: "q8_0", ggml_id: 8, block_elems: 32, block_bytes: 34,
        decode: legacy::dequant_q8_0, encode: Some(legacy::quant_q8_0), gpu: repack(2, 2, 36),
        gemv: GpuGemv { rows: 4, lanes: Some(4), int_dot_lanes: Some(1) },
        cpu: CpuKernels { simd: true, int_dot: true, repack: false, packed_dots_max_m: 0 },
    },
    Q4_0 {
        name: "q4_0", ggml_id: 2, block_elems: 32, block_bytes: 18,
        decode: legacy::dequant_q4_0, encode: Some(legacy::quant_q4_0), gpu: repack(2, 2, 20),
        gemv: GpuGemv { rows: 2, lanes: Some(2), int_dot_lanes: Some(1) },
        cpu: CpuKernels { simd: true, int_dot: true, repack: true, packed_dots_max_m: 0 },
    },
    Q4_1 {
        name: "q4_1", ggml_id: 3, block_elems: 32, block_bytes: 20,
        decode: legacy::dequant_q4_1, encode: Some(legacy::quant_q4_1), gpu: None,
        gemv: GpuGemv { rows: 2, lanes: Some(2), int_dot_lanes: Some(1) },
        cpu: CpuKernels { simd: true, int_dot: true, repack: true, packed_dots_max_m: 0 },
    },
    Q5_0 {
        name: "q5_0", ggml_id: 6, block_elems: 32, block_bytes: 22,
        decode: legacy::dequant_q5_0, encode: Some(legacy::quant_q5_0), gpu: repack(2, 2, 24),
        gemv: GpuGemv { rows: 4, lanes: Some(2), int_dot_lanes: Some(1) },
        cpu: CpuKernels { simd: true, int_dot: true, repack: false, packed_dots_max_m: 0 },
    },
    Q5_1 {
        name: "q5_1", ggml_id: 7, block_elems: 32, block_bytes: 24,
        decode: legacy::dequant_q5_1, encode: Some(legacy::quant_q5_1), gpu: None,
        gemv: GpuGemv { rows: 4, lanes: Some(2), int_dot_lanes: Some(1) },
        cpu: CpuKernels { simd: true, int_dot: true, repack: false, packed_dots_max_m: 0 },
    },
    Q4K {
        name: "q4_k", ggml_id: 12, block_elems: QK_K, block_bytes: 144,
        decode: kquants::dequant_q4_k, encode: Some(kquants::quant_q4_k), gpu: None,
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(4) },
        cpu: CpuKernels { simd: true, int_dot: true, repack: true, packed_dots_max_m: 0 },
    },
    Q5K {
        name: "q5_k", ggml_id: 13, block_elems: QK_K, block_bytes: 176,
        decode: kquants::dequant_q5_k, encode: Some(kquants::quant_q5_k), gpu: None,
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(4) },
        cpu: CpuKernels { simd: true, int_dot: true, repack: false, packed_dots_max_m: 0 },
    },
    Q6K {
        name: "q6_k", ggml_id: 14, block_elems: QK_K, block_bytes: 210,
        decode: kquants::dequant_q6_k, encode: Some(kquants::quant_q6_k), gpu: repack(210, 0, 212),
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(4) },
        cpu: CpuKernels { simd: true, int_dot: true, repack: true, packed_dots_max_m: 0 },
    },
    Q2K {
        name: "q2_k", ggml_id: 10, block_elems: QK_K, block_bytes: 84,
        decode: kquants_low::dequant_q2_k, encode: Some(kquants_low::quant_q2_k), gpu: None,
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(4) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    Q3K {
        name: "q3_k", ggml_id: 11, block_elems: QK_K, block_bytes: 110,
        decode: kquants_low::dequant_q3_k, encode: Some(kquants_low::quant_q3_k),
        gpu: repack(110, 0, 112),
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(4) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    IQ4NL {
        name: "iq4_nl", ggml_id: 20, block_elems: 32, block_bytes: 18,
        decode: iq4::dequant_iq4_nl, encode: Some(iq4::quant_iq4_nl), gpu: repack(2, 2, 20),
        gemv: GpuGemv { rows: 4, lanes: Some(4), int_dot_lanes: Some(1) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    IQ4XS {
        name: "iq4_xs", ggml_id: 23, block_elems: QK_K, block_bytes: 136,
        decode: iq4::dequant_iq4_xs, encode: Some(iq4::quant_iq4_xs), gpu: None,
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(8) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    TQ1_0 {
        name: "tq1_0", ggml_id: 34, block_elems: QK_K, block_bytes: 54,
        decode: ternary::dequant_tq1_0, encode: Some(ternary::quant_tq1_0), gpu: repack(54, 0, 56),
        gemv: GpuGemv { rows: 4, lanes: Some(4), int_dot_lanes: Some(4) },
        cpu: CpuKernels { simd: false, int_dot: true, repack: true, packed_dots_max_m: 32 },
    },
    TQ2_0 {
        name: "tq2_0", ggml_id: 35, block_elems: QK_K, block_bytes: 66,
        decode: ternary::dequant_tq2_0, encode: Some(ternary::quant_tq2_0), gpu: repack(66, 0, 68),
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(4) },
        cpu: CpuKernels { simd: true, int_dot: true, repack: true, packed_dots_max_m: 64 },
    },
    MXFP4 {
        name: "mxfp4", ggml_id: 39, block_elems: 32, block_bytes: 17,
        decode: mxfp4::dequant_mxfp4, encode: Some(mxfp4::quant_mxfp4), gpu: repack(1, 3, 20),
        gemv: GpuGemv { rows: 4, lanes: Some(4), int_dot_lanes: Some(1) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    IQ2XXS {
        name: "iq2_xxs", ggml_id: 16, block_elems: QK_K, block_bytes: 66,
        decode: iq23::dequant_iq2_xxs, encode: None,
        gpu: grid_repack(68, &iq_grids::IQ2XXS_BYTES),
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(8) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    IQ2XS {
        name: "iq2_xs", ggml_id: 17, block_elems: QK_K, block_bytes: 74,
        decode: iq23::dequant_iq2_xs, encode: None,
        gpu: grid_repack(76, &iq_grids::IQ2XS_BYTES),
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(8) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    IQ2S {
        name: "iq2_s", ggml_id: 22, block_elems: QK_K, block_bytes: 82,
        decode: iq23::dequant_iq2_s, encode: None,
        gpu: grid_repack(84, &iq_grids::IQ2S_BYTES),
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(8) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    IQ3XXS {
        name: "iq3_xxs", ggml_id: 18, block_elems: QK_K, block_bytes: 98,
        decode: iq23::dequant_iq3_xxs, encode: None,
        gpu: grid_repack(100, &iq_grids::IQ3XXS_BYTES),
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(8) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
    IQ3S {
        name: "iq3_s", ggml_id: 21, block_elems: QK_K, block_bytes: 110,
        decode: iq23::dequant_iq3_s, encode: None,
        gpu: grid_repack(112, &iq_grids::IQ3S_BYTES),
        gemv: GpuGemv { rows: 4, lanes: Some(8), int_dot_lanes: Some(8) },
        cpu: CpuKernels { simd: true, int_dot: false, repack: false, packed_dots_max_m: 0 },
    },
}
