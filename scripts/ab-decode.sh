#!/usr/bin/env bash
# Same-call A/B of decode speed (tg128, `vkllm bench`) between builds or
# environment knobs, on synthetic models of the anchor shapes. Run on the GPU
# machine from the project root, after `source .dev/gpu-env.sh`.
#
# usage: scripts/ab-decode.sh MODE [MODE ...]
#   MODE: a command prefix that runs vkllm, e.g. ".dev/vkllm" or
#         "VKLLM_GEMV=workgroup .dev/vkllm"; modes alternate within each round
# env: MODELS ("smollm2-135m:q4_1 tinyllama-1.1b:q4_0 llama3.2-1b:q4_k_m"),
#      DEPTHS ("0 4096"), ROUNDS (2), SYNTH (the first mode's vkllm writes the
#      models), WORK (/tmp/ab-decode: the models, kept for the next call)
# prints one line per run: shape, depth, mode, tok/s, dispatches and barriers
# per token, host µs per token
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,13p "$0"; exit 2; }
MODELS=${MODELS:-"smollm2-135m:q4_1 tinyllama-1.1b:q4_0 llama3.2-1b:q4_k_m"}
DEPTHS=${DEPTHS:-"0 4096"}
ROUNDS=${ROUNDS:-2}
WORK=${WORK:-/tmp/ab-decode}
read -r -a first <<< "$1"
SYNTH=${SYNTH:-${first[-1]}}
mkdir -p "$WORK"
for ms in $MODELS; do
    shape=${ms%%:*}
    quant=${ms##*:}
    f=$WORK/$shape-$quant.gguf
    if [ ! -f "$f" ] && ! "$SYNTH" synth --shape "$shape" --quant "$quant" -o "$f" > /dev/null 2>&1; then
        echo "$ms: synth failed"
        continue
    fi
    for d in $DEPTHS; do
        for _ in $(seq "$ROUNDS"); do
            for mode in "$@"; do
                json=$(env $mode bench -m "$f" -b vulkan -p 0 -n 128 -d "$d" -r 3 --copy-mib 0 --json 2> "$WORK/err")
                echo "$json" | python3 -c '
import json, sys
shape, d, mode, err = sys.argv[1:]
try:
    r = json.load(sys.stdin)[0]
    print("%-16s d=%-5s %8.1f tok/s %4d disp %4d barr %6.1f host-us  [%s]" % (shape, d,
          r["avg_ts"], r["dispatches"], r["barriers"], r["host_us_per_token"], mode))
except Exception:
    print("%-16s d=%-5s FAILED [%s]: %s" % (shape, d, mode, open(err).read()[-300:]))
' "$shape" "$d" "$mode" "$WORK/err"
            done
        done
    done
done
