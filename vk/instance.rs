//! Vulkan loader, instance, and (with validation) the Khronos validation
//! layer plus a debug-utils messenger whose warnings and errors are collected
//! and turned into `Error::Vulkan` by [`Instance::check_messages`].

use super::vk_err;
use crate::error::{Error, Result};
use ash::vk;
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex};

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Validation messages of severity warning or error, in arrival order.
pub(crate) type Messages = Arc<Mutex<Vec<String>>>;

fn messenger_info(messages: &Messages) -> vk::DebugUtilsMessengerCreateInfoEXT<'static> {
    vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(on_message))
        .user_data(messages as *const Messages as *mut c_void)
}

pub struct Instance {
    pub entry: ash::Entry,
    pub instance: ash::Instance,
    messenger: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    /// Kept alive for the messenger callback, which holds a raw pointer to it.
    messages: Option<Box<Messages>>,
}

impl Instance {
    /// The process's instance with (`validate`) or without the validation
    /// layer: made on first use, then shared by every backend (each opens
    /// its own device) and kept until the process exits.
    ///
    /// Why kept: an instance loads the driver and destroying the last one
    /// unloads it, and NVIDIA's driver does not survive many such cycles in
    /// one process (the ~23rd instance failed with
    /// `VK_ERROR_INCOMPATIBLE_DRIVER`). Validation messages of every backend
    /// then land in one list; each check reports what arrived since the last.
    pub fn shared(validate: bool) -> Result<Arc<Instance>> {
        static SHARED: Mutex<[Option<Arc<Instance>>; 2]> = Mutex::new([None, None]);
        let mut slots = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut slots[usize::from(validate)];
        if let Some(inst) = slot {
            return Ok(Arc::clone(inst));
        }
        let inst = Arc::new(Instance::new(validate)?);
        *slot = Some(Arc::clone(&inst));
        Ok(inst)
    }

    fn new(validate: bool) -> Result<Instance> {
        // SAFETY: loading the system Vulkan loader runs its initialisers; this
        // is the documented way to use ash without linking libvulkan.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| {
            Error::Vulkan(format!(
                "no Vulkan loader found ({e}); install libvulkan1 and a driver (e.g. mesa-vulkan-drivers)"
            ))
        })?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"vkllm")
            .engine_name(c"vkllm")
            .api_version(vk::API_VERSION_1_2);
        let mut layers = Vec::new();
        let mut extensions = Vec::new();
        if validate {
            // SAFETY: plain query on a loaded entry.
            let available = unsafe { entry.enumerate_instance_layer_properties() }
                .map_err(vk_err("listing instance layers"))?;
            if !available
                .iter()
                .any(|l| l.layer_name_as_c_str() == Ok(VALIDATION_LAYER))
            {
                return Err(Error::Vulkan(
                    "validation was requested (VKLLM_VALIDATE=1) but VK_LAYER_KHRONOS_validation is not installed; install vulkan-validationlayers or the Vulkan SDK".into(),
                ));
            }
            layers.push(VALIDATION_LAYER.as_ptr());
            extensions.push(ash::ext::debug_utils::NAME.as_ptr());
            extensions.push(ash::ext::validation_features::NAME.as_ptr());
        }
        let messages: Box<Messages> = Box::default();
        let mut chained = messenger_info(&messages);
        let mut info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions);
        // Synchronization validation too: missing barriers are the bugs the
        // recorder's automatic barriers could introduce.
        let enabled = [vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION];
        let mut features =
            vk::ValidationFeaturesEXT::default().enabled_validation_features(&enabled);
        if validate {
            // Chained so messages from instance creation itself are caught too.
            info = info.push_next(&mut chained).push_next(&mut features);
        }
        // SAFETY: `info` and everything it points to outlive the call.
        let instance = unsafe { entry.create_instance(&info, None) }
            .map_err(vk_err("creating the instance"))?;
        let mut inst = Instance {
            entry,
            instance,
            messenger: None,
            messages: None,
        };
        if validate {
            let loader = ash::ext::debug_utils::Instance::new(&inst.entry, &inst.instance);
            // SAFETY: the user-data pointer targets the heap allocation moved
            // into `inst.messages`, which outlives the messenger (Drop).
            let messenger =
                unsafe { loader.create_debug_utils_messenger(&messenger_info(&messages), None) }
                    .map_err(vk_err("creating the debug messenger"))?;
            inst.messenger = Some((loader, messenger));
            inst.messages = Some(messages);
            inst.check_messages()?;
        }
        Ok(inst)
    }

    /// The message list, kept alive past the instance so tests can check
    /// what teardown reported.
    #[cfg(test)]
    pub fn messages(&self) -> Option<Messages> {
        self.messages.as_deref().cloned()
    }

    /// `Err` listing every validation warning/error reported since the last call.
    pub fn check_messages(&self) -> Result<()> {
        let Some(messages) = &self.messages else {
            return Ok(());
        };
        let mut guard = messages.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_empty() {
            return Ok(());
        }
        let all = std::mem::take(&mut *guard).join("; ");
        Err(Error::Vulkan(format!(
            "the validation layer reported: {all}"
        )))
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Shared instances live until the process exits; this runs when
        // making one fails after vkCreateInstance.
        // SAFETY: no device was made from it; the messenger goes before its instance.
        unsafe {
            if let Some((loader, messenger)) = self.messenger.take() {
                loader.destroy_debug_utils_messenger(messenger, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    if user.is_null() || data.is_null() {
        return vk::FALSE;
    }
    // SAFETY: `user` is the `Messages` registered in messenger_info and
    // `data` is valid for the duration of the callback.
    let (messages, data) = unsafe { (&*(user as *const Messages), &*data) };
    let text = unsafe { data.message_as_c_str() }
        .map(|m| m.to_string_lossy().into_owned())
        .unwrap_or_default();
    if layer_lacks_extension(&text) {
        return vk::FALSE;
    }
    let mut guard = messages.lock().unwrap_or_else(|p| p.into_inner());
    guard.push(format!("[{severity:?}] {text}"));
    vk::FALSE
}

/// A layer older than an extension the device enables (Debian's 1.3.239
/// predates VK_KHR_cooperative_matrix) says it cannot validate it and calls
/// the extension's feature structures unknown: the layer's gap, not misuse
/// by us, so those messages are dropped and every other one still fails.
fn layer_lacks_extension(text: &str) -> bool {
    text.contains("is not supported by this layer") || text.contains("unknown VkStructureType")
}
