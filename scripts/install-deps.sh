#!/usr/bin/env bash
# Install the system packages vkllm needs to build and test, when missing:
# glslc (shader compiler, used by build.rs), the Vulkan loader, Mesa's
# drivers (lavapipe, a CPU Vulkan device, so Vulkan tests run anywhere), the
# Khronos validation layer, and pip (scripts/fetch-model.sh uses it).
set -euo pipefail
missing=0
command -v glslc >/dev/null 2>&1 || missing=1
ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' || missing=1
compgen -G '/usr/share/vulkan/icd.d/lvp_icd*.json' >/dev/null || missing=1
compgen -G '/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json' >/dev/null || missing=1
pkgs=(glslc libvulkan1 mesa-vulkan-drivers vulkan-validationlayers)
python3 -m pip --version >/dev/null 2>&1 || { missing=1; pkgs+=(python3-pip); }
if [ "$missing" = 0 ]; then exit 0; fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${pkgs[@]}"
