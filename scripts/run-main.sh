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
# A greedy 128-token generation per backend; the timing line (prefill and
# decode tok/s) is what generate prints on stderr.
echo "== bench: greedy generate, 128 tokens"
for backend in auto cpu; do
    printf '%-6s ' "$backend"
    "$vkllm" generate -p "$prompt" -n 128 --temperature 0 --backend "$backend" 2>&1 >/dev/null \
        | grep '^prefill'
done
