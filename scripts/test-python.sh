#!/usr/bin/env bash
# The Python package (python/): a fresh venv with maturin, pytest and numpy,
# the wheel built in release mode into the shared target/ (reusing the
# dependencies the cargo steps compiled), installed, and its pytest suite run
# on the CPU and on Vulkan (a missing device is a failure; under CI=true so
# is a missing model). The tests compare against the `vkllm` binary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=target/python-venv
# The crate is a workspace of its own, so the main lint steps skip it.
echo "-- cargo fmt --check, cargo clippy -- -D warnings (python/)"
cargo fmt --check --manifest-path python/Cargo.toml
cargo clippy --release --manifest-path python/Cargo.toml --target-dir target --all-targets -- -D warnings
python3 -m venv --clear "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check maturin pytest numpy
echo "-- cargo build --release --bin vkllm (the tests' reference)"
cargo build --release --bin vkllm
echo "-- maturin build --release"
rm -f target/wheels/vkllm-*.whl
"$venv/bin/maturin" build --release --manifest-path python/Cargo.toml \
    --target-dir target --out target/wheels --interpreter "$venv/bin/python"
"$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall target/wheels/vkllm-*.whl
echo "-- pytest python/tests"
# Run from the repository root through the venv's pytest, so `import vkllm`
# finds the installed wheel, not python/vkllm (which lacks the extension).
VKLLM_REQUIRE_VULKAN=1 "$venv/bin/pytest" -q python/tests
