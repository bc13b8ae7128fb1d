//! Physical device selection (`VKLLM_DEVICE` or discrete > integrated >
//! virtual > CPU), the logical device and its compute queue.

use super::caps::{device_info, Caps, DeviceInfo, Kernels, MatmulKernel};
use super::instance::Instance;
use super::options::KernelOverrides;
use super::vk_err;
use crate::error::{Error, Result};
use ash::vk;

pub struct Device {
    pub physical: vk::PhysicalDevice,
    pub device: ash::Device,
    pub queue: vk::Queue,
    pub queue_family: u32,
    pub info: DeviceInfo,
    /// Kernel variants for this device (chosen here: some need extensions
    /// and features enabled at device creation).
    pub kernels: Kernels,
    /// VK_KHR_pipeline_executable_properties is enabled (asked for, and
    /// the device has it).
    pub pipeline_stats: bool,
}

impl Device {
    /// Pick and open a device. `selector` is an index into the loader's list
    /// or a case-insensitive substring of the device name.
    /// `stats`: enable pipeline statistics where the device has them;
    /// `forced`: the kernels the caller wants instead of the defaults.
    pub fn open(
        inst: &Instance,
        selector: Option<&str>,
        stats: bool,
        forced: &KernelOverrides,
    ) -> Result<Device> {
        // SAFETY: valid instance.
        let pds = unsafe { inst.instance.enumerate_physical_devices() }
            .map_err(vk_err("listing physical devices"))?;
        if pds.is_empty() {
            return Err(Error::Vulkan(
                "no Vulkan device found; install a driver (e.g. mesa-vulkan-drivers for lavapipe)"
                    .into(),
            ));
        }
        let infos = pds
            .iter()
            .enumerate()
            .map(|(i, &pd)| device_info(inst, i, pd))
            .collect::<Result<Vec<_>>>()?;
        let chosen = match selector {
            Some(sel) => select(&infos, sel)?,
            None => infos
                .iter()
                .min_by_key(|d| preference(&d.kind))
                .map(|d| d.index)
                .unwrap_or(0),
        };
        let info = infos[chosen].clone();
        require(&info)?;
        let kernels = Kernels::choose(&info.caps, forced)?;
        let physical = pds[chosen];
        // SAFETY: valid physical device.
        let families = unsafe {
            inst.instance
                .get_physical_device_queue_family_properties(physical)
        };
        let queue_family = compute_family(&families)
            .ok_or_else(|| Error::Vulkan(format!("device {} has no compute queue", info.name)))?
            as u32;
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(queue_family)
            .queue_priorities(&priorities)];
        // The cooperative-matrix GEMM needs its extension, the feature, f16
        // arithmetic and the Vulkan memory model (its SPIR-V declares it),
        // with device scope: under that model the status words' atomicMax is
        // a device-scope atomic, which the validation layer rejects without
        // it. The int8-activation GEMV needs integer dot products; nothing
        // else enables optional features.
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
            .shader_float16(true)
            .vulkan_memory_model(true)
            .vulkan_memory_model_device_scope(true);
        let mut cm_khr =
            vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let mut cm_nv =
            vk::PhysicalDeviceCooperativeMatrixFeaturesNV::default().cooperative_matrix(true);
        let mut idp = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default()
            .shader_integer_dot_product(true);
        let mut exts = Vec::new();
        let mut create = vk::DeviceCreateInfo::default().queue_create_infos(&queues);
        match kernels.matmul {
            MatmulKernel::Tiles | MatmulKernel::Lanes => {}
            MatmulKernel::CoopmatKhr => {
                exts.push(ash::khr::cooperative_matrix::NAME.as_ptr());
                create = create.push_next(&mut f12).push_next(&mut cm_khr);
            }
            MatmulKernel::CoopmatNv => {
                exts.push(ash::nv::cooperative_matrix::NAME.as_ptr());
                create = create.push_next(&mut f12).push_next(&mut cm_nv);
            }
        }
        if kernels.gemv_q8 {
            exts.push(ash::khr::shader_integer_dot_product::NAME.as_ptr());
            create = create.push_next(&mut idp);
        }
        let pipeline_stats = stats && info.caps.pipeline_stats;
        let mut pep = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
            .pipeline_executable_info(true);
        if pipeline_stats {
            exts.push(ash::khr::pipeline_executable_properties::NAME.as_ptr());
            create = create.push_next(&mut pep);
        }
        let create = create.enabled_extension_names(&exts);
        // SAFETY: `create` and what it points to outlive the call.
        let device = unsafe { inst.instance.create_device(physical, &create, None) }
            .map_err(vk_err("creating the logical device"))?;
        // SAFETY: the family was requested with one queue.
        let queue = unsafe { device.get_device_queue(queue_family, 0) };
        Ok(Device {
            physical,
            device,
            queue,
            queue_family,
            info,
            kernels,
            pipeline_stats,
        })
    }

    pub fn caps(&self) -> &Caps {
        &self.info.caps
    }
}

impl Drop for Device {
    /// The owner waits for idle and drops every child object first.
    fn drop(&mut self) {
        // SAFETY: nothing made from this device outlives it (VulkanBackend
        // declares its children before the device).
        unsafe { self.device.destroy_device(None) };
    }
}

/// The device `auto` should use (an explicit `selector` wins; otherwise the
/// most preferred device, if it is a real GPU: lavapipe runs on the CPU and
/// is slower than the CPU backend), or why there is none.
pub fn auto_choice(
    infos: &[DeviceInfo],
    selector: Option<&str>,
) -> std::result::Result<usize, String> {
    if infos.is_empty() {
        return Err("no Vulkan device".into());
    }
    if let Some(sel) = selector {
        return select(infos, sel).map_err(|e| e.to_string());
    }
    infos
        .iter()
        .filter(|d| preference(&d.kind) <= 1)
        .min_by_key(|d| preference(&d.kind))
        .map(|d| d.index)
        .ok_or_else(|| "no Vulkan GPU; the Vulkan devices here run on the CPU".into())
}

fn preference(kind: &str) -> u32 {
    match kind {
        "discrete GPU" => 0,
        "integrated GPU" => 1,
        "virtual GPU" => 2,
        "CPU" => 3,
        _ => 4,
    }
}

fn select(infos: &[DeviceInfo], sel: &str) -> Result<usize> {
    let names = || {
        infos
            .iter()
            .map(|d| format!("{}: {}", d.index, d.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Ok(i) = sel.trim().parse::<usize>() {
        return if i < infos.len() {
            Ok(i)
        } else {
            Err(Error::Vulkan(format!(
                "Vulkan device {sel} is out of range (VKLLM_DEVICE or --backend vulkan:N); devices are {}",
                names()
            )))
        };
    }
    let lower = sel.to_lowercase();
    infos
        .iter()
        .find(|d| d.name.to_lowercase().contains(&lower))
        .map(|d| d.index)
        .ok_or_else(|| {
            Error::Vulkan(format!(
                "no Vulkan device matches '{sel}' (VKLLM_DEVICE or --backend vulkan:NAME); devices are {}",
                names()
            ))
        })
}

/// Features every kernel relies on.
fn require(info: &DeviceInfo) -> Result<()> {
    let c = &info.caps;
    if vk::api_version_major(c.api_version) == 1 && vk::api_version_minor(c.api_version) < 2 {
        return Err(Error::Vulkan(format!(
            "device {} supports Vulkan {} but vkllm needs 1.2",
            info.name, info.api_version
        )));
    }
    if !c.subgroup_arithmetic {
        return Err(Error::Vulkan(format!(
            "device {} lacks subgroup arithmetic in compute shaders, which vkllm needs",
            info.name
        )));
    }
    Ok(())
}

/// The queue family passes go to: a compute-only one where the device has
/// it (NVIDIA's async compute family), else the first with compute: the
/// same passes run faster there (benches/README.md, the queue family).
fn compute_family(families: &[vk::QueueFamilyProperties]) -> Option<usize> {
    let has = |f: &vk::QueueFamilyProperties, flag| f.queue_flags.contains(flag);
    families
        .iter()
        .position(|f| has(f, vk::QueueFlags::COMPUTE) && !has(f, vk::QueueFlags::GRAPHICS))
        .or_else(|| {
            families
                .iter()
                .position(|f| has(f, vk::QueueFlags::COMPUTE))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family(flags: vk::QueueFlags) -> vk::QueueFamilyProperties {
        vk::QueueFamilyProperties::default().queue_flags(flags)
    }

    #[test]
    fn passes_go_to_a_compute_only_family_where_there_is_one() {
        use vk::QueueFlags as F;
        let nvidia = [
            family(F::GRAPHICS | F::COMPUTE | F::TRANSFER),
            family(F::TRANSFER),
            family(F::COMPUTE | F::TRANSFER),
        ];
        assert_eq!(compute_family(&nvidia), Some(2));
        let lavapipe = [family(F::GRAPHICS | F::COMPUTE | F::TRANSFER)];
        assert_eq!(compute_family(&lavapipe), Some(0));
        assert_eq!(compute_family(&[family(F::TRANSFER)]), None);
    }
}
