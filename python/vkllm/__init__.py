"""vkllm: LLM inference with a Vulkan-native compute backend and a SIMD CPU backend."""

from ._vkllm import Logits, Model, TextStream, VkllmError, __version__

__all__ = ["Logits", "Model", "TextStream", "VkllmError", "__version__"]
