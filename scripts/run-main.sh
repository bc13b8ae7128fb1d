#!/usr/bin/env bash
# From a fresh clone to generated text: system packages, the default model,
# a release build, one generation on the best backend, and a small bench.
# PROMPT overrides the prompt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
scripts/fetch-model.sh
cargo build --release
vkllm=target/release/vkllm
prompt=${PROMPT:-The capital of France is}

echo "== vkllm info"
"$vkllm" info

echo "== vkllm generate (backend auto)"
"$vkllm" generate -p "$prompt" -n 64 --temperature 0

# ---- bench --------------------------------------------------------------
# llama-bench's protocol: pp512 (one 512-token batch) and tg128 (128 greedy
# single-token steps), on the CPU and, when a Vulkan device exists, on it.
echo "== vkllm bench"
backends=cpu
if "$vkllm" info 2>/dev/null | grep -qE '\((discrete|integrated) GPU'; then backends=cpu,vulkan; fi
"$vkllm" bench -b "$backends" -p 512 -n 128 -r 3
