//! Device buffers through gpu-allocator: device-local storage buffers for
//! weights and activations, and one upload and one download staging buffer,
//! allocated on first use, grown up to [`STAGING_CAP`] and then reused, so
//! transfers of any size go through them in chunks.

use super::vk_err;
use crate::backend::DeviceMemoryUse;
use crate::error::{Error, Result};
use ash::vk;
use gpu_allocator::vulkan::{
    Allocation, AllocationCreateDesc, AllocationScheme, Allocator, AllocatorCreateDesc,
};
use gpu_allocator::{AllocationError, MemoryLocation};
use std::collections::HashMap;

/// Largest staging buffer; bigger transfers are split into chunks of this size.
pub const STAGING_CAP: u64 = 64 << 20;

pub struct DeviceBuffer {
    pub buffer: vk::Buffer,
    pub size: u64,
    allocation: Allocation,
    /// Made by [`Memory::alloc_mapped`]: host-coherent and mapped, so the
    /// host reads and writes it in place.
    pub host: bool,
}

pub struct Memory {
    device: ash::Device,
    allocator: Option<Allocator>,
    buffers: HashMap<u32, DeviceBuffer>,
    next_id: u32,
    pub upload: Option<DeviceBuffer>,
    pub download: Option<DeviceBuffer>,
    /// Allocations left before injected failures begin (`Options::fail_alloc_after`).
    allocations_left: Option<u64>,
}

/// gpu-allocator's failures as [`Error`]s: running out is its own variant
/// (see `vk_err`), and so is a Vulkan result it passes through.
fn alloc_err(what: &str, e: AllocationError) -> Error {
    match e {
        AllocationError::OutOfMemory => Error::out_of_device_memory(format!("allocating {what}")),
        AllocationError::Internal(msg) if msg.contains("ERROR_OUT_OF_HOST_MEMORY") => {
            Error::out_of_host_memory(format!("allocating {what}"))
        }
        AllocationError::Internal(msg) if msg.contains("ERROR_DEVICE_LOST") => {
            Error::DeviceLost(format!("allocating {what}"))
        }
        e => Error::Vulkan(format!("allocating {what} failed: {e}")),
    }
}

impl Memory {
    pub fn new(
        instance: &ash::Instance,
        device: &ash::Device,
        physical: vk::PhysicalDevice,
        fail_alloc_after: Option<u64>,
    ) -> Result<Memory> {
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: instance.clone(),
            device: device.clone(),
            physical_device: physical,
            debug_settings: Default::default(),
            buffer_device_address: false,
            allocation_sizes: Default::default(),
        })
        .map_err(|e| alloc_err("the memory allocator", e))?;
        Ok(Memory {
            device: device.clone(),
            allocator: Some(allocator),
            buffers: HashMap::new(),
            next_id: 1,
            upload: None,
            download: None,
            allocations_left: fail_alloc_after,
        })
    }

    /// Device memory blocks this allocator holds, in bytes.
    pub fn reserved_bytes(&self) -> u64 {
        self.allocator
            .as_ref()
            .map_or(0, |a| a.generate_report().total_reserved_bytes)
    }

    /// What the allocator holds now.
    pub fn usage(&self) -> DeviceMemoryUse {
        let report = self.allocator.as_ref().map(Allocator::generate_report);
        DeviceMemoryUse {
            reserved_bytes: report.as_ref().map_or(0, |r| r.total_reserved_bytes),
            allocated_bytes: report.as_ref().map_or(0, |r| r.total_allocated_bytes),
            allocations: report.as_ref().map_or(0, |r| r.allocations.len()),
        }
    }

    fn create(&mut self, size: u64, location: MemoryLocation, what: &str) -> Result<DeviceBuffer> {
        let storage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        self.create_with(size, location, storage, what)
    }

    fn create_with(
        &mut self,
        size: u64,
        location: MemoryLocation,
        usage: vk::BufferUsageFlags,
        what: &str,
    ) -> Result<DeviceBuffer> {
        if let Some(left) = &mut self.allocations_left {
            if *left == 0 {
                return Err(Error::out_of_device_memory(format!(
                    "allocating {what} of {size} bytes (a failure injected by VKLLM_FAIL_ALLOC_AFTER)"
                )));
            }
            *left -= 1;
        }
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: valid device and create info.
        let buffer = unsafe { self.device.create_buffer(&info, None) }
            .map_err(vk_err(&format!("creating {what} of {size} bytes")))?;
        // SAFETY: `buffer` was just created from this device.
        let requirements = unsafe { self.device.get_buffer_memory_requirements(buffer) };
        let allocator = self
            .allocator
            .as_mut()
            .ok_or_else(|| Error::Vulkan("the allocator is already destroyed".into()))?;
        let allocation = allocator.allocate(&AllocationCreateDesc {
            name: what,
            requirements,
            location,
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        });
        let allocation = match allocation {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: unused buffer of this device.
                unsafe { self.device.destroy_buffer(buffer, None) };
                return Err(alloc_err(&format!("{what} of {size} bytes"), e));
            }
        };
        // SAFETY: memory and offset come from the allocator for this buffer.
        let bound = unsafe {
            self.device
                .bind_buffer_memory(buffer, allocation.memory(), allocation.offset())
        };
        let dev = DeviceBuffer {
            buffer,
            size,
            allocation,
            host: false,
        };
        if let Err(e) = bound {
            self.destroy(dev);
            return Err(vk_err("binding buffer memory")(e));
        }
        Ok(dev)
    }

    fn destroy(&mut self, b: DeviceBuffer) {
        // SAFETY: the caller guarantees the GPU no longer uses the buffer
        // (every submission is waited for before control returns).
        unsafe { self.device.destroy_buffer(b.buffer, None) };
        if let Some(a) = self.allocator.as_mut() {
            // A failed free leaks the block until the allocator drops; nothing to report.
            let _ = a.free(b.allocation);
        }
    }

    /// A new device-local buffer of at least `bytes` bytes (rounded up to 4,
    /// and at least 4, as Vulkan fills and storage views need).
    pub fn alloc(&mut self, bytes: usize) -> Result<(u32, vk::Buffer, u64)> {
        let size = (bytes.max(4) as u64).div_ceil(4) * 4;
        let buf = self.create(size, MemoryLocation::GpuOnly, "a device buffer")?;
        Ok(self.register(buf))
    }

    /// A small host-visible storage buffer that shaders write and the host
    /// reads without a copy (the status word of checks done on the GPU).
    pub fn alloc_host_readable(&mut self, bytes: usize) -> Result<u32> {
        let size = (bytes.max(4) as u64).div_ceil(4) * 4;
        let buf = self.create(size, MemoryLocation::GpuToCpu, "the status buffer")?;
        Ok(self.register(buf).0)
    }

    /// A small storage buffer the host writes and reads through a mapping,
    /// with no copy or submit (per-token values, the sampled token). Device
    /// local where the device offers host-visible VRAM.
    pub fn alloc_mapped(&mut self, bytes: usize) -> Result<(u32, vk::Buffer, u64)> {
        let size = (bytes.max(4) as u64).div_ceil(4) * 4;
        let mut buf = self.create(size, MemoryLocation::CpuToGpu, "a host-mapped buffer")?;
        buf.host = buf.is_mapped();
        Ok(self.register(buf))
    }

    fn register(&mut self, buf: DeviceBuffer) -> (u32, vk::Buffer, u64) {
        let id = self.next_id;
        // Wraps only after 2^32 allocations, far beyond any run.
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let out = (id, buf.buffer, buf.size);
        self.buffers.insert(id, buf);
        out
    }

    /// The device buffer behind handle `buf`, checking that the handle
    /// claims no more bytes than the buffer has (handles are plain data, and
    /// a GPU read past a buffer is undefined behaviour, not an error).
    pub fn resolve(&self, buf: &crate::backend::Buffer) -> Result<&DeviceBuffer> {
        let db = self.get(buf.id)?;
        if buf.bytes as u64 > db.size {
            return Err(Error::Vulkan(format!(
                "buffer handle {} claims {} bytes but holds {}",
                buf.id, buf.bytes, db.size
            )));
        }
        Ok(db)
    }

    pub fn get_mut(&mut self, id: u32) -> Result<&mut DeviceBuffer> {
        self.buffers
            .get_mut(&id)
            .ok_or_else(|| Error::Vulkan(format!("buffer {id} does not exist")))
    }

    pub fn free(&mut self, id: u32) {
        if let Some(b) = self.buffers.remove(&id) {
            self.destroy(b);
        }
    }

    pub fn get(&self, id: u32) -> Result<&DeviceBuffer> {
        self.buffers.get(&id).ok_or_else(|| {
            Error::Vulkan(format!(
                "buffer {id} does not exist (freed, or from another backend)"
            ))
        })
    }

    /// The upload (`download == false`) or download staging buffer, holding
    /// at least `min(want, STAGING_CAP)` bytes.
    pub fn staging(&mut self, want: u64, download: bool) -> Result<&mut DeviceBuffer> {
        let want = want.clamp(4, STAGING_CAP);
        let slot_size = if download {
            &self.download
        } else {
            &self.upload
        }
        .as_ref()
        .map(|b| b.size);
        if !matches!(slot_size, Some(s) if s >= want) {
            let old = if download {
                self.download.take()
            } else {
                self.upload.take()
            };
            if let Some(old) = old {
                self.destroy(old);
            }
            let (location, what) = if download {
                (MemoryLocation::GpuToCpu, "the download staging buffer")
            } else {
                (MemoryLocation::CpuToGpu, "the upload staging buffer")
            };
            let usage = if download {
                vk::BufferUsageFlags::TRANSFER_DST
            } else {
                vk::BufferUsageFlags::TRANSFER_SRC
            };
            let fresh = self.create_with(want, location, usage, what)?;
            *if download {
                &mut self.download
            } else {
                &mut self.upload
            } = Some(fresh);
        }
        let slot = if download {
            &mut self.download
        } else {
            &mut self.upload
        };
        slot.as_mut()
            .ok_or_else(|| Error::Vulkan("staging buffer missing".into()))
    }
}

impl Drop for Memory {
    /// Frees every buffer, then the allocator (before the device goes: the
    /// owner declares Memory before Device). The device must be idle.
    fn drop(&mut self) {
        let ids: Vec<u32> = self.buffers.keys().copied().collect();
        for id in ids {
            self.free(id);
        }
        for b in [self.upload.take(), self.download.take()]
            .into_iter()
            .flatten()
        {
            self.destroy(b);
        }
        self.allocator = None;
    }
}

impl DeviceBuffer {
    /// Whether the host can reach the buffer through a mapping.
    pub fn is_mapped(&self) -> bool {
        self.allocation.mapped_ptr().is_some()
    }

    pub fn mapped(&mut self) -> Result<&mut [u8]> {
        self.allocation
            .mapped_slice_mut()
            .ok_or_else(|| Error::Vulkan("staging memory is not host-mapped".into()))
    }
}
