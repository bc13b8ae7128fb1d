//! What a physical device can do, as far as kernel choice is concerned, and
//! the device list behind `vkllm info`.

use super::instance::Instance;
use super::options::{KernelOverrides, MatmulOverride};
use super::vk_err;
use crate::dtype::DType;
use crate::error::{Error, Result};
use ash::vk;
use std::ffi::CStr;

/// Capabilities and limits of one physical device.
#[derive(Clone, Debug, Default)]
pub struct Caps {
    pub api_version: u32,
    pub subgroup_size: u32,
    /// Subgroup arithmetic (subgroupAdd/Max) in compute shaders: required.
    pub subgroup_arithmetic: bool,
    /// Subgroup shuffles (attention_decode.comp's sums over a few lanes).
    pub subgroup_shuffle: bool,
    /// subgroupBroadcast (mul_mat_lanes.comp).
    pub subgroup_ballot: bool,
    pub fp16: bool,
    pub int8: bool,
    pub storage16: bool,
    pub coopmat_khr: bool,
    /// VK_KHR_cooperative_matrix with its feature on and 16x16x16
    /// f16 x f16 -> f32 subgroup matrices listed (what mul_mat_coopmat needs).
    pub coopmat_khr_f16: bool,
    /// The same through VK_NV_cooperative_matrix.
    pub coopmat_nv_f16: bool,
    /// Every cooperative-matrix shape the device lists (`vkllm info`).
    pub coopmat_shapes: Vec<super::coopmat_shapes::CoopmatShape>,
    /// The Vulkan memory model (the cooperative-matrix SPIR-V declares it).
    pub vulkan_memory_model: bool,
    /// Device-scope atomics under that model (`atomicMax` on the status
    /// words): required wherever the model is enabled and a shader uses them.
    pub vulkan_memory_model_device_scope: bool,
    /// VK_KHR_shader_integer_dot_product listed with its feature on: the
    /// int8-activation GEMV (mul_mat_vec_q8) can run.
    pub integer_dot: bool,
    /// VK_KHR_pipeline_executable_properties listed with its feature on: the
    /// driver can report each pipeline's compiled statistics
    /// (`VKLLM_PIPELINE_STATS=1`).
    pub pipeline_stats: bool,
    pub max_storage_buffer_range: u64,
    pub max_workgroup_count: [u32; 3],
    /// Invocations of one workgroup at most (along x).
    pub max_workgroup_invocations: u32,
    pub max_shared_memory: u32,
    pub max_push_constants: u32,
    /// A CPU implementation (lavapipe): it runs a workgroup's subgroups as
    /// coroutines of one thread, switching between all of them at every
    /// barrier, so each barrier costs per subgroup (benches/README.md, on a
    /// CPU device).
    pub cpu_device: bool,
}

impl Caps {
    pub fn query(inst: &Instance, pd: vk::PhysicalDevice) -> Result<Caps> {
        let i = &inst.instance;
        let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
        let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut idp = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
        let mut feats2 = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut f11)
            .push_next(&mut f12)
            .push_next(&mut idp);
        // SAFETY: valid handles; the chained structs outlive the calls.
        let exts = unsafe {
            i.get_physical_device_properties2(pd, &mut props2);
            i.get_physical_device_features2(pd, &mut feats2);
            i.enumerate_device_extension_properties(pd)
        }
        .map_err(vk_err("listing device extensions"))?;
        let has_ext = |name: &CStr| exts.iter().any(|e| e.extension_name_as_c_str() == Ok(name));
        let coopmat_khr = has_ext(ash::khr::cooperative_matrix::NAME);
        let coopmat_nv = has_ext(ash::nv::cooperative_matrix::NAME);
        let coopmat = super::coopmat_shapes::query(inst, pd, coopmat_khr, coopmat_nv);
        let p = props2.properties;
        let limits = p.limits;
        let api = p.api_version;
        Ok(Caps {
            api_version: api,
            subgroup_size: subgroup.subgroup_size,
            subgroup_arithmetic: subgroup
                .supported_operations
                .contains(vk::SubgroupFeatureFlags::BASIC | vk::SubgroupFeatureFlags::ARITHMETIC)
                && subgroup
                    .supported_stages
                    .contains(vk::ShaderStageFlags::COMPUTE),
            subgroup_shuffle: subgroup
                .supported_operations
                .contains(vk::SubgroupFeatureFlags::SHUFFLE),
            subgroup_ballot: subgroup
                .supported_operations
                .contains(vk::SubgroupFeatureFlags::BALLOT),
            fp16: f12.shader_float16 == vk::TRUE,
            int8: f12.shader_int8 == vk::TRUE,
            storage16: f11.storage_buffer16_bit_access == vk::TRUE,
            coopmat_khr,
            coopmat_khr_f16: coopmat.khr_f16,
            coopmat_nv_f16: coopmat.nv_f16,
            coopmat_shapes: coopmat.shapes,
            vulkan_memory_model: f12.vulkan_memory_model == vk::TRUE,
            vulkan_memory_model_device_scope: f12.vulkan_memory_model_device_scope == vk::TRUE,
            integer_dot: has_ext(ash::khr::shader_integer_dot_product::NAME)
                && idp.shader_integer_dot_product == vk::TRUE,
            pipeline_stats: has_ext(ash::khr::pipeline_executable_properties::NAME)
                && pipeline_stats_feature(inst, pd),
            max_storage_buffer_range: u64::from(limits.max_storage_buffer_range),
            max_workgroup_count: limits.max_compute_work_group_count,
            max_workgroup_invocations: limits
                .max_compute_work_group_invocations
                .min(limits.max_compute_work_group_size[0]),
            max_shared_memory: limits.max_compute_shared_memory_size,
            max_push_constants: limits.max_push_constants_size,
            cpu_device: p.device_type == vk::PhysicalDeviceType::CPU,
        })
    }

    /// Invocations of a GEMV workgroup whose rows split into `slots` units:
    /// one per unit up to 128 (idle invocations cost occupancy), or up to
    /// 512 when the dispatch has too `few` workgroups to fill the GPU (then
    /// each is bound by its invocations' loads in turn), and at least a
    /// subgroup and 32. On a CPU device, one subgroup: there each barrier
    /// costs per subgroup (benches/README.md, on a CPU device).
    pub fn gemv_workgroup(&self, slots: usize, few: bool) -> u32 {
        if self.cpu_device {
            return self.subgroup_size.max(1);
        }
        let cap = if few { 512 } else { 128 };
        let want = slots.clamp(1, cap).next_power_of_two() as u32;
        want.max(self.subgroup_size.clamp(32, 128))
            .min(self.max_workgroup_invocations)
    }
}

/// Whether a device listing VK_KHR_pipeline_executable_properties turns
/// its feature on (queried apart: its struct belongs to that extension).
fn pipeline_stats_feature(inst: &Instance, pd: vk::PhysicalDevice) -> bool {
    let mut feat = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let mut feats2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut feat);
    // SAFETY: valid handles; the device lists the extension.
    unsafe { inst.instance.get_physical_device_features2(pd, &mut feats2) };
    feat.pipeline_executable_info == vk::TRUE
}

/// Which GEMM kernel matmuls of more than a few rows get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKernel {
    /// glsl/mul_mat.comp: f32 FMA tiles, every device.
    Tiles,
    /// glsl/mul_mat_lanes.comp: f32, weight rows per lane, no shared memory
    /// or barriers; CPU devices (lavapipe) by default.
    Lanes,
    /// glsl/mul_mat_coopmat.comp through VK_KHR_cooperative_matrix.
    CoopmatKhr,
    /// glsl/mul_mat_coopmat.comp through VK_NV_cooperative_matrix.
    CoopmatNv,
}

impl MatmulKernel {
    /// Whether it runs on cooperative matrices (f16 inputs).
    pub fn is_coopmat(self) -> bool {
        matches!(self, MatmulKernel::CoopmatKhr | MatmulKernel::CoopmatNv)
    }

    /// Whether this binary and `caps` can run it. The cooperative-matrix
    /// kernel also assumes subgroups of 32 (16 per 512-invocation workgroup)
    /// and needs f16 arithmetic, the Vulkan memory model and the shared
    /// memory its 128 x 128 tile declares (two 128 x 64 f16 slices, padded:
    /// 36 KiB).
    pub fn available(self, caps: &Caps) -> bool {
        const COOPMAT_SHARED: u32 = 2 * 128 * 18 * 8;
        const COOPMAT_INVOCATIONS: u32 = 512;
        let base = caps.fp16
            && caps.vulkan_memory_model
            && caps.vulkan_memory_model_device_scope
            && caps.subgroup_size == 32
            && caps.max_shared_memory >= COOPMAT_SHARED
            && caps.max_workgroup_invocations >= COOPMAT_INVOCATIONS;
        match self {
            MatmulKernel::Tiles => true,
            MatmulKernel::Lanes => caps.subgroup_ballot && caps.subgroup_size >= 8,
            MatmulKernel::CoopmatKhr => {
                base && caps.coopmat_khr_f16 && super::pipeline::GLSL_COOPMAT_KHR
            }
            MatmulKernel::CoopmatNv => {
                base && caps.coopmat_nv_f16 && super::pipeline::GLSL_COOPMAT_NV
            }
        }
    }

    /// The shader stem and output tile (n, m) for a `m x n` output: the
    /// cooperative-matrix kernel's 128 x 128 tile where that gives the GPU
    /// enough workgroups, its 64 x 64 tile below (see mul_mat_coopmat.comp).
    pub fn shader(self, n: usize, m: usize) -> (&'static str, usize, usize) {
        let big = n.div_ceil(128) * m.div_ceil(128) >= BIG_MIN_TILES;
        match (self, big) {
            (MatmulKernel::Tiles, _) => ("mul_mat", 64, 64),
            (MatmulKernel::Lanes, _) => ("mul_mat_lanes", 16, 16),
            (MatmulKernel::CoopmatKhr, true) => ("mul_mat_coopmat_khr", 128, 128),
            (MatmulKernel::CoopmatKhr, false) => ("mul_mat_coopmat_small_khr", 64, 64),
            (MatmulKernel::CoopmatNv, true) => ("mul_mat_coopmat_nv", 128, 128),
            (MatmulKernel::CoopmatNv, false) => ("mul_mat_coopmat_small_nv", 64, 64),
        }
    }

    /// [`MatmulKernel::shader`]'s mixture-of-experts build, the grouped GEMM
    /// (vk/ops/matmul_experts.rs), for `m` routed rows over `experts`
    /// matrices of `n` rows: the cooperative-matrix kernel's large tile only
    /// where the experts' rows fill its 128 on average (most of a tile past
    /// an expert's rows is work thrown away) and make enough tiles.
    pub fn experts_shader(
        self,
        n: usize,
        m: usize,
        experts: usize,
    ) -> (&'static str, usize, usize) {
        let per_expert = m.div_ceil(experts.max(1));
        let tiles = n
            .div_ceil(128)
            .saturating_mul(experts.saturating_mul(per_expert / 128));
        let big = per_expert >= 128 && tiles >= BIG_MIN_TILES;
        match (self, big) {
            (MatmulKernel::Tiles, _) => ("mul_mat_experts", 64, 64),
            (MatmulKernel::Lanes, _) => ("mul_mat_lanes_experts", 16, 16),
            (MatmulKernel::CoopmatKhr, true) => ("mul_mat_coopmat_khr_experts", 128, 128),
            (MatmulKernel::CoopmatKhr, false) => ("mul_mat_coopmat_small_khr_experts", 64, 64),
            (MatmulKernel::CoopmatNv, true) => ("mul_mat_coopmat_nv_experts", 128, 128),
            (MatmulKernel::CoopmatNv, false) => ("mul_mat_coopmat_small_nv_experts", 64, 64),
        }
    }
}

/// Fewest 128 x 128 GEMM tiles worth taking: fewer leave a 132-SM GPU too
/// few workgroups (benches/README.md, prefill GEMM).
const BIG_MIN_TILES: usize = 96;

/// Which attention kernel passes of many rows (prefill) get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillAttention {
    /// glsl/attention_prefill.comp: query-row tiles against shared-memory
    /// key tiles (head_dim a multiple of 4, at most 128; others use `Rows`).
    Flash,
    /// glsl/attention.comp: one workgroup per (row, head), each reading the
    /// whole cache it sees.
    Rows,
    /// glsl/attention_prefill_coopmat.comp: Q·Kᵀ and P·V on the matmul
    /// kernel's cooperative matrices, for an f16 KV cache and head_dim a
    /// multiple of 16 up to 128 (`Flash` elsewhere, and where the matmuls
    /// take the exact f32 tiles).
    Coopmat,
    /// glsl/attention_decode.comp for every row: a workgroup per (row, kv
    /// head, tile of heads), K and V read straight into registers (`Flash`
    /// for shapes it cannot take). A CPU device's default: lavapipe pays per
    /// lane and load, and the flash tiles load every key into shared memory
    /// and read it back per lane (benches/README.md, on a CPU device).
    Decode,
}

/// How glsl/mul_mat_vec.comp (decode matmuls) splits its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvKernel {
    /// A workgroup per 4 output rows, k split over all its invocations.
    Workgroup,
    /// Each subgroup on 2 rows of its own, k split over its lanes.
    Subgroup,
    /// Subgroup rows for the integer-dot kernel, workgroup rows for the f32
    /// one (each the faster on an H200 for the anchor models' decode
    /// shapes: benches/README.md, decode GEMV rows), except
    /// integer-dot weights with few rows for their length (`few_rows`,
    /// vk/ops/matmul.rs `shares_rows`), which share theirs too.
    Auto,
    /// No GEMV: decode rows take the matmul kernel, the RMS norm, residual
    /// add and GLU dispatches of their own. A CPU device's default with the
    /// lanes: `mul_mat_lanes.comp` loads each weight word once, where a
    /// GEMV's lanes each load their x too (benches/README.md, on a CPU
    /// device).
    Gemm,
}

impl GemvKernel {
    /// Whether the integer-dot (`q8`) or f32 kernel takes subgroup rows for
    /// a weight with (`few_rows`) or without few rows for its length.
    pub fn subgroup_rows(self, q8: bool, few_rows: bool) -> bool {
        match self {
            GemvKernel::Workgroup | GemvKernel::Gemm => false,
            GemvKernel::Subgroup => true,
            GemvKernel::Auto => q8 && !few_rows,
        }
    }
}

/// The kernels a device gets, chosen once when the backend opens (and shown
/// by `vkllm info`); [`KernelOverrides`] force them for A/B runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    pub matmul: MatmulKernel,
    pub attention: PrefillAttention,
    pub gemv: GemvKernel,
    /// Decode matmuls of large weights whose type has integer-dot lanes
    /// (quants/types.rs: every quantized type) take x as two int8 digits
    /// per value (quantize_q8.comp, as precise as 16-bit activations) and
    /// use packed integer dot products: the f32 kernel spends ~5
    /// instructions per 4-bit weight and is bound by them, not by memory.
    /// Small weights stay f32, where the extra dispatch costs more, unless
    /// their input is quantized already (K and V after Q).
    pub gemv_q8: bool,
    /// A decode step's rope and cache append run inside the decode
    /// attention kernel (one dependent dispatch fewer per layer);
    /// `VKLLM_DECODE_ATTENTION=split` runs rope_store before it.
    pub decode_rope: bool,
    /// Decode attention spreads long spans over many workgroups (key splits,
    /// one-head tiles: a GPU's plans, vk/ops/attention.rs `decode_plan`);
    /// off, each (kv head, tile of up to 4 heads) takes its whole span in one
    /// workgroup, as a CPU device runs fastest: lavapipe runs a few
    /// workgroups at a time, each paying its clusters' merge one lane at a
    /// time (benches/README.md, on a CPU device). `VKLLM_DECODE_SPLITS=on|off`.
    pub decode_splits: bool,
}

impl Kernels {
    /// The kernels for `caps` with `forced`'s overrides. By default: the
    /// GEMM on cooperative matrices where the device has them, KHR first,
    /// else lanes on a CPU device, else tiles; the prefill attention on
    /// cooperative matrices with those matmuls, else the decode kernel on a
    /// CPU device, else flash tiles; the GEMV `gemm` with the lanes on a CPU
    /// device, else `auto`; int8 activations where the device has integer
    /// dot products; rope fused into decode attention; decode splits except
    /// on a CPU device. A forced kernel the device cannot run is an error.
    pub fn choose(caps: &Caps, forced: &KernelOverrides) -> Result<Kernels> {
        let matmul = choose_matmul(caps, forced.matmul)?;
        let attention = match forced.attention {
            None if matmul.is_coopmat() => PrefillAttention::Coopmat,
            None if caps.cpu_device => PrefillAttention::Decode,
            None => PrefillAttention::Flash,
            Some(PrefillAttention::Coopmat) if !matmul.is_coopmat() => {
                return Err(Error::Unsupported(
                    "VKLLM_ATTENTION=coopmat needs the cooperative-matrix matmuls, which this \
                     device or VKLLM_MATMUL does not give"
                        .into(),
                ))
            }
            Some(kernel) => kernel,
        };
        let gemv = match forced.gemv {
            None if caps.cpu_device && matmul == MatmulKernel::Lanes => GemvKernel::Gemm,
            None => GemvKernel::Auto,
            Some(kernel) => kernel,
        };
        // q8.glsl's block sums go round 8 lanes by shuffles.
        let gemv_q8 = !forced.gemv_x_f32
            && caps.integer_dot
            && caps.subgroup_shuffle
            && caps.subgroup_size >= 8;
        Ok(Kernels {
            matmul,
            attention,
            gemv,
            gemv_q8,
            decode_rope: !forced.decode_rope_split,
            decode_splits: forced.decode_splits.unwrap_or(!caps.cpu_device),
        })
    }
}

/// The GEMM kernel for `caps`, or the one `forced` names where the device
/// and this binary can run it.
fn choose_matmul(caps: &Caps, forced: Option<MatmulOverride>) -> Result<MatmulKernel> {
    use MatmulKernel::{CoopmatKhr, CoopmatNv, Lanes, Tiles};
    let best_coopmat = [CoopmatKhr, CoopmatNv]
        .into_iter()
        .find(|k| k.available(caps));
    let coopmat = |pick: Option<MatmulKernel>, want: MatmulOverride| {
        pick.ok_or_else(|| {
            Error::Unsupported(format!(
                "VKLLM_MATMUL={}: this device or binary cannot run it (needs 16x16x16 f16 \
                 cooperative matrices, subgroups of 32, shaderFloat16, the Vulkan memory \
                 model, and the shader compiled in: KHR {}, NV {})",
                want.name(),
                super::pipeline::GLSL_COOPMAT_KHR,
                super::pipeline::GLSL_COOPMAT_NV
            ))
        })
    };
    match forced {
        // Cooperative matrices run 2-5x the f32 tiles' speed on a GPU, the
        // lanes ~4x the tiles' on lavapipe (benches/README.md, prefill GEMM
        // and small kernels).
        None => Ok(
            best_coopmat.unwrap_or(if caps.cpu_device && Lanes.available(caps) {
                Lanes
            } else {
                Tiles
            }),
        ),
        Some(MatmulOverride::Tiles) => Ok(Tiles),
        Some(MatmulOverride::Lanes) if Lanes.available(caps) => Ok(Lanes),
        Some(MatmulOverride::Lanes) => Err(Error::Unsupported(
            "VKLLM_MATMUL=lanes: this device cannot run it (needs subgroupBroadcast and \
             subgroups of at least 8)"
                .into(),
        )),
        Some(want @ MatmulOverride::Coopmat) => coopmat(best_coopmat, want),
        Some(want @ MatmulOverride::CoopmatKhr) => {
            coopmat(Some(CoopmatKhr).filter(|k| k.available(caps)), want)
        }
        Some(want @ MatmulOverride::CoopmatNv) => {
            coopmat(Some(CoopmatNv).filter(|k| k.available(caps)), want)
        }
    }
}

impl std::fmt::Display for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let attention = match self.attention {
            PrefillAttention::Flash => "flash tiles (attention_prefill, head_dim <= 128)",
            PrefillAttention::Rows => "one workgroup per row and head (attention)",
            PrefillAttention::Coopmat => {
                "cooperative matrices for an f16 cache (attention_prefill_coopmat), else flash tiles"
            }
            PrefillAttention::Decode => "the decode kernel for every row (attention_decode)",
        };
        let matmul = match self.matmul {
            MatmulKernel::Tiles => "f32 FMA tiles (mul_mat)",
            MatmulKernel::Lanes => "f32, weight rows per lane (mul_mat_lanes)",
            MatmulKernel::CoopmatKhr => "f16 cooperative matrices, KHR (mul_mat_coopmat_khr)",
            MatmulKernel::CoopmatNv => "f16 cooperative matrices, NV (mul_mat_coopmat_nv)",
        };
        let gemv = match self.gemv {
            GemvKernel::Workgroup => "2 (q4_0, q4_1) or 4 rows per workgroup",
            GemvKernel::Subgroup => "2 rows per subgroup",
            GemvKernel::Auto => {
                "2 rows per subgroup with integer dots, 2 (q4_0, q4_1) or 4 per workgroup in f32"
            }
            GemvKernel::Gemm => "the matmul kernel, norm, add and GLU dispatches of their own",
        };
        let gemv_x = if self.gemv_q8 && self.gemv != GemvKernel::Gemm {
            let types: Vec<&str> = DType::ALL
                .into_iter()
                .filter(|&d| super::gemv_int_dot(d))
                .map(DType::name)
                .collect();
            format!(
                ", integer dot products for {} weights over {} MiB (mul_mat_vec_q8)",
                types.join("/"),
                super::GEMV_Q8_MIN_BYTES >> 20
            )
        } else {
            String::new()
        };
        let rope = if self.decode_rope {
            "rope and cache append inside attention_decode"
        } else {
            "rope_store, attention_decode"
        };
        let splits = if self.decode_splits {
            ", then attention_combine"
        } else {
            " (one workgroup per kv head and tile of heads)"
        };
        write!(
            f,
            "matmul (m > 4): {matmul}; prefill attention: {attention}; decode matmul (m <= 4): \
             {gemv}{gemv_x}; decode attention: {rope}{splits}"
        )
    }
}

/// One physical device as `vkllm info` shows it.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub index: usize,
    pub name: String,
    pub kind: String,
    pub api_version: String,
    pub caps: Caps,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.caps;
        write!(
            f,
            "[{}] {} ({}, Vulkan {}): subgroup {} (shuffle {}), fp16 {}, int8 {}, 16-bit storage {}, \
             cooperative matrix {} (f16 16x16x16: KHR {}, NV {}), integer dot {}, max storage buffer {} MiB, \
             shared memory {} KiB, push constants {} B",
            self.index,
            self.name,
            self.kind,
            self.api_version,
            c.subgroup_size,
            c.subgroup_shuffle,
            c.fp16,
            c.int8,
            c.storage16,
            c.coopmat_khr,
            c.coopmat_khr_f16,
            c.coopmat_nv_f16,
            c.integer_dot,
            c.max_storage_buffer_range >> 20,
            c.max_shared_memory >> 10,
            c.max_push_constants
        )
    }
}

impl DeviceInfo {
    /// The kernels this device gets with `forced`'s overrides, as `vkllm
    /// info` shows them under the device, or why it cannot run them.
    pub fn kernels_line(&self, forced: &KernelOverrides) -> String {
        let mut line = match Kernels::choose(&self.caps, forced) {
            Ok(k) => format!("kernels: {k}"),
            Err(e) => format!("kernels: {e}"),
        };
        if self.caps.cpu_device {
            line.push_str("; on this CPU device GEMV workgroups are one subgroup");
        }
        line
    }
}

pub fn device_info(inst: &Instance, index: usize, pd: vk::PhysicalDevice) -> Result<DeviceInfo> {
    // SAFETY: valid physical device handle of this instance.
    let p = unsafe { inst.instance.get_physical_device_properties(pd) };
    let name = p
        .device_name_as_c_str()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unnamed device".into());
    let kind = match p.device_type {
        vk::PhysicalDeviceType::DISCRETE_GPU => "discrete GPU",
        vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated GPU",
        vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual GPU",
        vk::PhysicalDeviceType::CPU => "CPU",
        _ => "other",
    };
    let v = p.api_version;
    Ok(DeviceInfo {
        index,
        name,
        kind: kind.into(),
        api_version: format!(
            "{}.{}.{}",
            vk::api_version_major(v),
            vk::api_version_minor(v),
            vk::api_version_patch(v)
        ),
        caps: Caps::query(inst, pd)?,
    })
}

/// Every Vulkan device of this machine, in the loader's order.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let inst = Instance::shared(false)?;
    // SAFETY: valid instance.
    let pds = unsafe { inst.instance.enumerate_physical_devices() }
        .map_err(vk_err("listing physical devices"))?;
    pds.into_iter()
        .enumerate()
        .map(|(i, pd)| device_info(&inst, i, pd))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU without cooperative matrices, as far as the kernel choice looks.
    fn gpu() -> Caps {
        Caps {
            subgroup_size: 32,
            subgroup_arithmetic: true,
            subgroup_shuffle: true,
            subgroup_ballot: true,
            integer_dot: true,
            ..Caps::default()
        }
    }

    fn lavapipe() -> Caps {
        Caps {
            subgroup_size: 8,
            cpu_device: true,
            ..gpu()
        }
    }

    type Summary = (MatmulKernel, PrefillAttention, GemvKernel, bool, bool, bool);

    fn summary(k: Kernels) -> Summary {
        let Kernels {
            matmul,
            attention,
            gemv,
            gemv_q8,
            decode_rope,
            decode_splits,
        } = k;
        (matmul, attention, gemv, gemv_q8, decode_rope, decode_splits)
    }

    #[test]
    fn defaults_follow_the_device() {
        use GemvKernel::{Auto, Gemm};
        use MatmulKernel::{Lanes, Tiles};
        use PrefillAttention::{Decode, Flash};
        let none = KernelOverrides::default();
        let k = Kernels::choose(&gpu(), &none).unwrap();
        assert_eq!(summary(k), (Tiles, Flash, Auto, true, true, true));
        let k = Kernels::choose(&lavapipe(), &none).unwrap();
        assert_eq!(summary(k), (Lanes, Decode, Gemm, true, true, false));
    }

    #[test]
    fn routed_gemms_take_the_large_tile_only_for_full_experts() {
        use MatmulKernel::{CoopmatNv, Tiles};
        // Qwen3-MoE, 512 tokens: 4,096 slots over 128 experts, 32 rows each.
        assert_eq!(CoopmatNv.experts_shader(768, 4096, 128).1, 64);
        // Mixtral, 2,048 tokens: 4,096 slots over 8 experts, 512 rows each.
        let big = CoopmatNv.experts_shader(14336, 4096, 8);
        assert_eq!(big, ("mul_mat_coopmat_nv_experts", 128, 128));
        // Full experts but too few tiles for the GPU.
        assert_eq!(CoopmatNv.experts_shader(256, 1024, 8).1, 64);
        assert_eq!(Tiles.experts_shader(14336, 4096, 8).0, "mul_mat_experts");
    }

    #[test]
    fn overrides_win_where_the_device_can_run_them() {
        let forced = KernelOverrides {
            matmul: Some(MatmulOverride::Tiles),
            attention: Some(PrefillAttention::Rows),
            gemv: Some(GemvKernel::Subgroup),
            gemv_x_f32: true,
            decode_rope_split: true,
            decode_splits: Some(true),
        };
        let k = Kernels::choose(&lavapipe(), &forced).unwrap();
        let want = (
            MatmulKernel::Tiles,
            PrefillAttention::Rows,
            GemvKernel::Subgroup,
            false,
            false,
            true,
        );
        assert_eq!(summary(k), want);
        let no_ballot = Caps {
            subgroup_ballot: false,
            ..gpu()
        };
        let only = |matmul, attention| KernelOverrides {
            matmul,
            attention,
            ..KernelOverrides::default()
        };
        for (caps, forced) in [
            (gpu(), only(Some(MatmulOverride::Coopmat), None)),
            (no_ballot, only(Some(MatmulOverride::Lanes), None)),
            (gpu(), only(None, Some(PrefillAttention::Coopmat))),
        ] {
            let e = Kernels::choose(&caps, &forced).unwrap_err();
            assert!(matches!(e, Error::Unsupported(_)), "{forced:?}: {e}");
        }
    }
}
