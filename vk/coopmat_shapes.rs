//! The cooperative-matrix shapes a device lists (VK_KHR_cooperative_matrix
//! and NVIDIA's older VK_NV_cooperative_matrix): which element types and
//! sizes its tensor cores take, shown by `vkllm info` so that a kernel for
//! another type (int8, bf16) can be judged against what the device offers.

use super::instance::Instance;
use ash::vk;

/// One listed shape: `m x n x k`, A · B + C -> result, at a scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoopmatShape {
    /// "KHR" or "NV".
    pub ext: &'static str,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Element types of A, B, C and the result (`component_name`).
    pub types: [String; 4],
    /// "subgroup", "workgroup", ...
    pub scope: &'static str,
}

impl CoopmatShape {
    /// The 16x16x16 f16 · f16 + f32 -> f32 subgroup shape mul_mat_coopmat
    /// is written for.
    pub fn is_f16_16(&self) -> bool {
        (self.m, self.n, self.k) == (16, 16, 16)
            && self.types == ["f16", "f16", "f32", "f32"]
            && self.scope == "subgroup"
    }
}

impl std::fmt::Display for CoopmatShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, r] = &self.types;
        write!(
            f,
            "{} {}x{}x{} {a}*{b}+{c}->{r} {}",
            self.ext, self.m, self.n, self.k, self.scope
        )
    }
}

/// A component type's short name (both extensions share the values).
fn component_name(t: i32) -> String {
    match t {
        0 => "f16".into(),
        1 => "f32".into(),
        2 => "f64".into(),
        3 => "s8".into(),
        4 => "s16".into(),
        5 => "s32".into(),
        6 => "s64".into(),
        7 => "u8".into(),
        8 => "u16".into(),
        9 => "u32".into(),
        10 => "u64".into(),
        1_000_141_000 => "bf16".into(),
        1_000_491_000 => "s8x4".into(),
        1_000_491_001 => "u8x4".into(),
        1_000_491_002 => "e4m3".into(),
        1_000_491_003 => "e5m2".into(),
        other => format!("type{other}"),
    }
}

/// A scope's name (both extensions share the values).
fn scope_name(s: i32) -> &'static str {
    match s {
        1 => "device",
        2 => "workgroup",
        3 => "subgroup",
        5 => "queue family",
        _ => "unknown scope",
    }
}

/// A shape from an extension's raw values.
fn listed(ext: &'static str, [m, n, k]: [u32; 3], types: [i32; 4], scope: i32) -> CoopmatShape {
    CoopmatShape {
        ext,
        m,
        n,
        k,
        types: types.map(component_name),
        scope: scope_name(scope),
    }
}

/// What a device's cooperative-matrix extensions offer.
#[derive(Clone, Debug, Default)]
pub struct CoopmatShapes {
    pub shapes: Vec<CoopmatShape>,
    /// The KHR / NV extension's feature is on and it lists the f16 shape
    /// mul_mat_coopmat needs.
    pub khr_f16: bool,
    pub nv_f16: bool,
}

/// The shapes `pd` lists through the extensions it has (`khr`, `nv`).
pub fn query(inst: &Instance, pd: vk::PhysicalDevice, khr: bool, nv: bool) -> CoopmatShapes {
    let i = &inst.instance;
    let mut out = CoopmatShapes::default();
    if khr {
        let mut feat = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut feats2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut feat);
        let ext = ash::khr::cooperative_matrix::Instance::new(&inst.entry, i);
        // SAFETY: valid handles; the extension is present, so the chained
        // struct and the function are known to the driver.
        let props = unsafe {
            i.get_physical_device_features2(pd, &mut feats2);
            ext.get_physical_device_cooperative_matrix_properties(pd)
        }
        .unwrap_or_default();
        let shapes: Vec<CoopmatShape> = props
            .iter()
            .map(|p| {
                let types = [p.a_type, p.b_type, p.c_type, p.result_type].map(|t| t.as_raw());
                listed(
                    "KHR",
                    [p.m_size, p.n_size, p.k_size],
                    types,
                    p.scope.as_raw(),
                )
            })
            .collect();
        out.khr_f16 = feat.cooperative_matrix == vk::TRUE && shapes.iter().any(|s| s.is_f16_16());
        out.shapes.extend(shapes);
    }
    if nv {
        let mut feat = vk::PhysicalDeviceCooperativeMatrixFeaturesNV::default();
        let mut feats2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut feat);
        let f = ash::nv::cooperative_matrix::Instance::new(&inst.entry, i)
            .fp()
            .get_physical_device_cooperative_matrix_properties_nv;
        let mut count = 0u32;
        let mut props = Vec::new();
        // SAFETY: as above; the two-call idiom with a vector of `count`
        // default-initialised (sType set) structs.
        unsafe {
            i.get_physical_device_features2(pd, &mut feats2);
            if f(pd, &mut count, std::ptr::null_mut()) == vk::Result::SUCCESS {
                props = vec![vk::CooperativeMatrixPropertiesNV::default(); count as usize];
                if f(pd, &mut count, props.as_mut_ptr()) != vk::Result::SUCCESS {
                    props.clear();
                }
                props.truncate(count as usize);
            }
        }
        let shapes: Vec<CoopmatShape> = props
            .iter()
            .map(|p| {
                let types = [p.a_type, p.b_type, p.c_type, p.d_type].map(|t| t.as_raw());
                listed(
                    "NV",
                    [p.m_size, p.n_size, p.k_size],
                    types,
                    p.scope.as_raw(),
                )
            })
            .collect();
        out.nv_f16 = feat.cooperative_matrix == vk::TRUE && shapes.iter().any(|s| s.is_f16_16());
        out.shapes.extend(shapes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(m: u32, types: [&str; 4], scope: &'static str) -> CoopmatShape {
        CoopmatShape {
            ext: "KHR",
            m,
            n: 16,
            k: 16,
            types: types.map(String::from),
            scope,
        }
    }

    #[test]
    fn names_and_the_gemm_shape() {
        let f16 = shape(16, ["f16", "f16", "f32", "f32"], "subgroup");
        assert!(f16.is_f16_16());
        assert_eq!(f16.to_string(), "KHR 16x16x16 f16*f16+f32->f32 subgroup");
        assert!(!shape(8, ["f16", "f16", "f32", "f32"], "subgroup").is_f16_16());
        assert!(!shape(16, ["f16", "f16", "f16", "f16"], "subgroup").is_f16_16());
        assert!(!shape(16, ["f16", "f16", "f32", "f32"], "workgroup").is_f16_16());
        let raw = [vk::ComponentTypeKHR::SINT8, vk::ComponentTypeKHR::SINT32];
        assert_eq!(raw.map(|t| component_name(t.as_raw())), ["s8", "s32"]);
        assert_eq!(scope_name(vk::ScopeKHR::SUBGROUP.as_raw()), "subgroup");
        assert_eq!(component_name(77), "type77");
    }
}
