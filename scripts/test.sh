#!/usr/bin/env bash
# Everything CI checks, on a fresh machine: system packages, the default
# model and the real Gemma 3 270M (tests/gemma3.rs skips without it),
# formatting, lints, and the full test suite in release mode with the
# Vulkan validation layer on and a Vulkan device required (lavapipe counts).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# CI never reads the release builds' debug info (the profile keeps line
# tables for local profiling): without it the compile and the links of the
# ~30 test binaries, about 100 MB each with it, take less of CI's 2 cores.
if [ "${CI:-}" = true ]; then
    export CARGO_PROFILE_RELEASE_DEBUG=0
fi
scripts/install-deps.sh
scripts/fetch-model.sh
scripts/fetch-gemma3.sh
if command -v rustup >/dev/null 2>&1; then
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi
echo "== cargo fmt --check"
cargo fmt --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
# The fuzz targets (fuzz/, a workspace of their own) must keep building;
# their long runs stay out of CI (fuzz/README.md). Linting them on stable
# reuses the dependencies the line above checked (about 2 minutes).
echo "== fuzz targets: cargo fmt --check, cargo clippy -- -D warnings"
cargo fmt --check --manifest-path fuzz/Cargo.toml
cargo clippy --manifest-path fuzz/Cargo.toml --target-dir target --all-targets -- -D warnings
# tests/capi.rs links examples/c/demo.c against libvkllm.so, which
# `cargo test` does not produce (it builds the library as an rlib only).
echo "== cargo build --release --lib (libvkllm.so for the C API test)"
cargo build --release --lib
echo "== cargo test --release (VKLLM_VALIDATE=1 VKLLM_REQUIRE_VULKAN=1)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
VKLLM_VALIDATE=1 VKLLM_REQUIRE_VULKAN=1 cargo test --release 2>&1 | tee "$log"
# One closing line over every test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
echo "== python package (scripts/test-python.sh)"
scripts/test-python.sh
