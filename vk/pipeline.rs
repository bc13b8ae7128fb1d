//! Compute pipelines, created once per (shader, specialization) and kept
//! for the backend's lifetime, through one VkPipelineCache that is read from
//! and written back to disk ([`DiskCache`]): compiling a pipeline takes the
//! driver milliseconds, so without it every process paid them on its first
//! pass (benches/README.md, small kernels). A survey
//! ([`Pipelines::begin_survey`])
//! makes the kernels a model's passes will use before the first of them runs,
//! all at once and in parallel (drivers compile on the calling thread);
//! anything else is made on first use. Every kernel binds only storage
//! buffers (bindings 0..n) and takes up to [`PUSH_BYTES`] of push constants.

use super::vk_err;
use crate::dtype::DType;
use crate::error::{Error, Result};
use ash::vk;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;

mod shaders {
    include!(concat!(env!("OUT_DIR"), "/shaders.rs"));
}
pub use shaders::{GLSLC_INT_DOT, GLSL_COOPMAT_KHR, GLSL_COOPMAT_NV};

/// Specialization constants 0, 1, 2 of a pipeline.
pub type Spec = [u32; 3];

/// A pipeline: its shader's stem, the weight type it was compiled for, its
/// specialization constants.
type Key = (&'static str, Option<DType>, Spec);

/// Push-constant block size shared by all kernels (the largest block used).
pub const PUSH_BYTES: u32 = 64;

pub struct Kernel {
    pub pipeline: vk::Pipeline,
    pub layout: vk::PipelineLayout,
    pub set_layout: vk::DescriptorSetLayout,
}

#[derive(Default)]
struct Layout {
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
}

/// Where a device's pipeline cache lives on disk, and the header the
/// driver writes for it (`VkPipelineCacheHeaderVersionOne`: header size,
/// version 1, vendor and device ids, pipelineCacheUUID): a file that does
/// not start with it came from another device or driver and is not used.
pub struct DiskCache {
    pub path: PathBuf,
    pub header: [u8; 32],
}

impl DiskCache {
    /// `dir/pipelines-<vendor>-<device>-<uuid>.bin` for a device.
    pub fn for_device(dir: PathBuf, props: &vk::PhysicalDeviceProperties) -> DiskCache {
        let mut header = [0u8; 32];
        header[..4].copy_from_slice(&32u32.to_le_bytes());
        header[4..8].copy_from_slice(&1u32.to_le_bytes());
        header[8..12].copy_from_slice(&props.vendor_id.to_le_bytes());
        header[12..16].copy_from_slice(&props.device_id.to_le_bytes());
        header[16..].copy_from_slice(&props.pipeline_cache_uuid);
        let uuid: String = props
            .pipeline_cache_uuid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let name = format!(
            "pipelines-{:04x}-{:04x}-{uuid}.bin",
            props.vendor_id, props.device_id
        );
        DiskCache {
            path: dir.join(name),
            header,
        }
    }

    /// The cache file's bytes when it is this device's, else nothing.
    fn read(&self) -> Vec<u8> {
        match std::fs::read(&self.path) {
            Ok(data) if data.len() >= 32 && data[..32] == self.header => data,
            _ => Vec::new(),
        }
    }

    /// Replace the file with `data`: written beside it, then renamed over
    /// it, so concurrent processes never read half a file. Failing is not
    /// an error (the cache only saves time).
    fn write(&self, data: &[u8]) {
        let Some(dir) = self.path.parent() else {
            return;
        };
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        let ok = std::fs::create_dir_all(dir).is_ok() && std::fs::write(&tmp, data).is_ok();
        if !ok || std::fs::rename(&tmp, &self.path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

pub struct Pipelines {
    device: ash::Device,
    cache: vk::PipelineCache,
    disk: Option<DiskCache>,
    /// Bytes of cache data read from disk at creation (0: none usable).
    pub loaded_bytes: usize,
    /// A pipeline was created since: the cache has new entries to save.
    dirty: bool,
    /// Descriptor-set and pipeline layouts by binding count.
    layouts: HashMap<u32, Layout>,
    kernels: HashMap<Key, Kernel>,
    /// Where set, each new pipeline's compiled statistics go to stderr.
    stats: Option<ash::khr::pipeline_executable_properties::Device>,
    /// During a survey: the kernels it met that do not exist yet, with
    /// their binding counts.
    survey: Option<Vec<(Key, u32)>>,
}

fn spirv(name: &str) -> Result<Vec<u32>> {
    let bytes = shaders::SHADERS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| *b)
        .ok_or_else(|| Error::Vulkan(format!("shader {name} was not built into this binary")))?;
    ash::util::read_spv(&mut std::io::Cursor::new(bytes))
        .map_err(|e| Error::Vulkan(format!("shader {name} is not valid SPIR-V: {e}")))
}

impl Pipelines {
    pub fn new(
        device: &ash::Device,
        disk: Option<DiskCache>,
        stats: Option<ash::khr::pipeline_executable_properties::Device>,
    ) -> Result<Pipelines> {
        let data = disk.as_ref().map(DiskCache::read).unwrap_or_default();
        let info = vk::PipelineCacheCreateInfo::default().initial_data(&data);
        // SAFETY: valid device; the data starts with this device's header
        // (checked by DiskCache::read), and drivers check the rest.
        let cache = unsafe { device.create_pipeline_cache(&info, None) }
            .map_err(vk_err("creating the pipeline cache"))?;
        Ok(Pipelines {
            device: device.clone(),
            cache,
            disk,
            loaded_bytes: data.len(),
            dirty: false,
            layouts: HashMap::new(),
            kernels: HashMap::new(),
            stats,
            survey: None,
        })
    }

    fn layout(&mut self, bindings: u32) -> Result<(vk::DescriptorSetLayout, vk::PipelineLayout)> {
        if let Some(l) = self.layouts.get(&bindings) {
            return Ok((l.set_layout, l.layout));
        }
        let binds: Vec<_> = (0..bindings)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&binds);
        // SAFETY: valid device and create info.
        let set_layout = unsafe { self.device.create_descriptor_set_layout(&info, None) }
            .map_err(vk_err("creating a descriptor set layout"))?;
        let mut entry = Layout {
            set_layout,
            layout: vk::PipelineLayout::null(),
        };
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .size(PUSH_BYTES)];
        let sets = [set_layout];
        let info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&sets)
            .push_constant_ranges(&ranges);
        // SAFETY: valid device and create info.
        let made = unsafe { self.device.create_pipeline_layout(&info, None) };
        let result = made.map_err(vk_err("creating a pipeline layout"));
        if let Ok(l) = result {
            entry.layout = l;
        }
        self.layouts.insert(bindings, entry);
        result.map(|l| (set_layout, l))
    }

    /// The pipeline of shader `stem` (compiled for `dtype` when the shader
    /// reads weights) with `bindings` storage buffers; `spec` holds
    /// specialization constants 0.. (0: the workgroup size of shaders that
    /// declare `local_size_x_id = 0`), all 0 if none; and whether this call
    /// compiled it (a pass's stats count those its recording waited for).
    /// The key allocates nothing, so lookups cost no heap traffic per
    /// dispatch.
    pub fn get(
        &mut self,
        stem: &'static str,
        dtype: Option<DType>,
        bindings: u32,
        spec: Spec,
    ) -> Result<(&Kernel, bool)> {
        let key = (stem, dtype, spec);
        let made = !self.kernels.contains_key(&key);
        if made {
            let (set_layout, layout) = self.layout(bindings)?;
            let kernel = self.compile(key, set_layout, layout)?;
            self.kernels.insert(key, kernel);
            self.dirty = true;
        }
        self.kernels
            .get(&key)
            .map(|k| (k, made))
            .ok_or_else(|| Error::Vulkan(format!("pipeline {stem} missing")))
    }

    /// Start a survey: until [`Pipelines::end_survey`], passes are recorded
    /// only to learn their kernels ([`Pipelines::note`]), and nothing
    /// recorded runs.
    pub fn begin_survey(&mut self) {
        self.survey.get_or_insert_with(Vec::new);
    }

    pub fn surveying(&self) -> bool {
        self.survey.is_some()
    }

    /// During a survey: the kernel [`Pipelines::get`] would return, to be
    /// made by [`Pipelines::end_survey`] if it does not exist yet.
    pub fn note(&mut self, stem: &'static str, dtype: Option<DType>, bindings: u32, spec: Spec) {
        let key = (stem, dtype, spec);
        if let Some(wanted) = &mut self.survey {
            if !self.kernels.contains_key(&key) && !wanted.iter().any(|(k, _)| *k == key) {
                wanted.push((key, bindings));
            }
        }
    }

    /// End the survey and make the kernels it met, in parallel; returns how
    /// many were made. On an error the others made are kept.
    pub fn end_survey(&mut self) -> Result<usize> {
        let wanted = self.survey.take().unwrap_or_default();
        let mut jobs = Vec::with_capacity(wanted.len());
        for (key, bindings) in wanted {
            let (set_layout, layout) = self.layout(bindings)?;
            jobs.push((key, set_layout, layout));
        }
        let made: Vec<_> = jobs
            .par_iter()
            .map(|&(key, set_layout, layout)| (key, self.compile(key, set_layout, layout)))
            .collect();
        let mut first_error = None;
        let mut count = 0;
        for (key, kernel) in made {
            match kernel {
                Ok(k) => {
                    self.kernels.insert(key, k);
                    count += 1;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.dirty |= count > 0;
        first_error.map_or(Ok(count), Err)
    }

    /// The pipeline of `key` with these layouts (safe to call from several
    /// threads at once: the pipeline cache is internally synchronized).
    fn compile(
        &self,
        (stem, dtype, spec): Key,
        set_layout: vk::DescriptorSetLayout,
        layout: vk::PipelineLayout,
    ) -> Result<Kernel> {
        let name = match dtype {
            Some(d) => format!("{stem}.{}", d.name()),
            None => stem.to_string(),
        };
        let code = spirv(&name)?;
        let info = vk::ShaderModuleCreateInfo::default().code(&code);
        // SAFETY: valid device; `code` is SPIR-V from glslc.
        let module = unsafe { self.device.create_shader_module(&info, None) }
            .map_err(vk_err(&format!("creating shader module {name}")))?;
        let spec_data: [u8; 12] = bytemuck::cast(spec);
        let spec_entries = [0u32, 1, 2].map(|i| {
            vk::SpecializationMapEntry::default()
                .constant_id(i)
                .offset(4 * i)
                .size(4)
        });
        let spec_info = vk::SpecializationInfo::default()
            .map_entries(&spec_entries)
            .data(&spec_data);
        let mut stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        if spec != [0; 3] {
            stage = stage.specialization_info(&spec_info);
        }
        let flags = if self.stats.is_some() {
            vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
        } else {
            vk::PipelineCreateFlags::empty()
        };
        let info = [vk::ComputePipelineCreateInfo::default()
            .flags(flags)
            .stage(stage)
            .layout(layout)];
        // SAFETY: valid device, cache, module and layout.
        let made = unsafe {
            self.device
                .create_compute_pipelines(self.cache, &info, None)
        };
        // SAFETY: the module is only needed during pipeline creation.
        unsafe { self.device.destroy_shader_module(module, None) };
        let pipeline = made
            .map_err(|(_, e)| vk_err(&format!("creating pipeline {name}"))(e))?
            .into_iter()
            .next()
            .ok_or_else(|| Error::Vulkan(format!("no pipeline returned for {name}")))?;
        if let Some(ext) = &self.stats {
            eprintln!("pipeline {name} {spec:?}: {}", statistics(ext, pipeline));
        }
        Ok(Kernel {
            pipeline,
            layout,
            set_layout,
        })
    }
}

/// A pipeline's compiled statistics as `name value` pairs, as the driver
/// names them (NVIDIA: register count, shared memory, ...).
fn statistics(ext: &ash::khr::pipeline_executable_properties::Device, p: vk::Pipeline) -> String {
    let info = vk::PipelineInfoKHR::default().pipeline(p);
    // SAFETY: valid pipeline, created with CAPTURE_STATISTICS_KHR.
    let Ok(execs) = (unsafe { ext.get_pipeline_executable_properties(&info) }) else {
        return "no statistics".into();
    };
    let mut out = Vec::new();
    for i in 0..execs.len() as u32 {
        let info = vk::PipelineExecutableInfoKHR::default()
            .pipeline(p)
            .executable_index(i);
        // SAFETY: valid pipeline and executable index.
        let Ok(stats) = (unsafe { ext.get_pipeline_executable_statistics(&info) }) else {
            continue;
        };
        for s in stats {
            let name = s
                .name_as_c_str()
                .map_or("?".into(), |n| n.to_string_lossy());
            // SAFETY: the union member read is the one `format` names.
            let value = unsafe {
                match s.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => s.value.b32.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                    _ => s.value.f64.to_string(),
                }
            };
            out.push(format!("{name} {value}"));
        }
    }
    out.join(", ")
}

impl Drop for Pipelines {
    /// The owner waits for the device to be idle before dropping.
    fn drop(&mut self) {
        if let (Some(disk), true) = (&self.disk, self.dirty) {
            // SAFETY: valid device and cache.
            if let Ok(data) = unsafe { self.device.get_pipeline_cache_data(self.cache) } {
                disk.write(&data);
            }
        }
        // SAFETY: the device is idle and these objects belong to it.
        unsafe {
            for (_, k) in self.kernels.drain() {
                self.device.destroy_pipeline(k.pipeline, None);
            }
            for (_, l) in self.layouts.drain() {
                if l.layout != vk::PipelineLayout::null() {
                    self.device.destroy_pipeline_layout(l.layout, None);
                }
                self.device
                    .destroy_descriptor_set_layout(l.set_layout, None);
            }
            self.device.destroy_pipeline_cache(self.cache, None);
        }
    }
}
