#!/usr/bin/env bash
# vkllm against llama.cpp's Vulkan backend, same GPU, same GGUF files, one run.
#
# Run on the GPU machine from the project root, after `source .dev/gpu-env.sh`.
# Brought along (ignored by git):
#   .whl/                     cyllama-vulkan and gguf wheels (pip download, cp312)
#   .dev/vkllm                release binary (or set VKLLM)
# From the repository: scripts/anchors/llamacpp_bench.py (llama.cpp's timer),
# scripts/anchors/synth_gguf.py (the fallback writer when llama.cpp rejects a
# file `vkllm synth` wrote) and tests/data/donor_tokenizer.gguf (the
# synthetic models' tokenizer).
#
# usage: scripts/vs-llama-cpp.sh [SHAPE:QUANT ...]
#        scripts/vs-llama-cpp.sh --formats SHAPE   (every mix on SHAPE, one table;
#                                                   README's "Every format" table)
#   default: smollm2-135m:q4_1 tinyllama-1.1b:q4_0 llama3.2-1b:q4_k_m llama3.1-8b:q4_k_m
# env: PP (512), TG (128), DEPTH (0), REPS (3), BACKEND (vulkan), WORK (/tmp/vs-llama-cpp),
#      PARALLEL (empty; e.g. 4,16,64: many sequences at once too, llama-batched-bench's
#      protocol: B prompts of BPP (128) tokens, then BTG (64) steps of all B, aggregate
#      tok/s by llamacpp_batched.py and `vkllm bench --parallel`), SINGLE (1; 0 skips the
#      single-stream pp/tg comparison),
#      KEEP (0; 1 keeps the model files in WORK and reuses them: a second
#      depth on the same machine skips the minutes the 8B takes to write),
#      WARM (1; 0 skips the untimed run of each engine on each file),
#      FAST (0, 1 with --formats: `vkllm synth --fast`, random valid blocks
#      instead of quantized weights: the same speed, files in seconds),
#      MIXES (with --formats: the mixes, space-separated; default every mix
#      `vkllm synth` writes)
#
# Each engine first runs once untimed on each file, in a process of its own:
# on an H100, a process whose pipelines neither vkllm's pipeline cache nor
# the driver's shader cache held ran pp512 at a quarter of its speed for its
# first few hundred milliseconds (Llama-3.2-1B Q4_K_M: vkllm 7,664 / 7,663 /
# 14,919 / 32,354 tok/s over its repetitions; llama.cpp 10,176 against
# ~25,000), which the engines' own warm-up repetition did not absorb.
#
# Each model is written by `vkllm synth`; llama.cpp loading it is the check
# that our files are real GGUF models. Both engines are timed on the same
# file: llama.cpp by llamacpp_bench.py (pp from DEPTH, then tg right after
# it), vkllm by `vkllm bench --json` with tg at DEPTH + PP to match. Medians of
# REPS repetitions; the table gives vkllm / llama.cpp.
set -uo pipefail

PP=${PP:-512}
TG=${TG:-128}
DEPTH=${DEPTH:-0}
REPS=${REPS:-3}
BACKEND=${BACKEND:-vulkan}
WORK=${WORK:-/tmp/vs-llama-cpp}
KEEP=${KEEP:-0}
WARM=${WARM:-1}
VKLLM=${VKLLM:-.dev/vkllm}
[ -x "$VKLLM" ] || VKLLM=target/release/vkllm
DONOR=tests/data/donor_tokenizer.gguf
ANCHORS=scripts/anchors
PARALLEL=${PARALLEL:-}
BPP=${BPP:-128}
BTG=${BTG:-64}
SINGLE=${SINGLE:-1}
# Every mix `vkllm synth --quant` writes (bench/synth/recipe.rs), the
# issue-60 formats first.
ALL_MIXES="f16 bf16 q8_0 q6_k q5_k_m q5_k_s q5_0 q5_1 q4_k_m q4_k_s q4_0 q4_1 q3_k_l q3_k_m q3_k_s
q2_k q2_k_s iq4_xs iq4_nl iq3_m iq3_s iq3_xs iq3_xxs iq2_m iq2_s iq2_xs iq2_xxs tq2_0 tq1_0
mxfp4 mxfp4_moe"
if [ "${1:-}" = "--formats" ]; then
    [ -n "${2:-}" ] || { echo "vs-llama-cpp: --formats needs a shape" >&2; exit 1; }
    FAST=${FAST:-1}
    models=()
    for mix in ${MIXES:-$ALL_MIXES}; do models+=("$2:$mix"); done
else
    models=("$@")
fi
FAST=${FAST:-0}
synth_flags=()
[ "$FAST" = 1 ] && synth_flags=(--fast)
[ ${#models[@]} -gt 0 ] || models=(smollm2-135m:q4_1 tinyllama-1.1b:q4_0 llama3.2-1b:q4_k_m llama3.1-8b:q4_k_m)
# What will run, first: an unexported MIXES silently means every mix (and
# with KEEP=1 on the 8B shape, more files than a 64 GB disk holds).
echo "vs-llama-cpp: ${#models[@]} models: ${models[*]}" >&2

die() { echo "vs-llama-cpp: $*" >&2; exit 1; }
[ -x "$VKLLM" ] || die "no vkllm binary (.dev/vkllm or target/release/vkllm)"
[ -f "$DONOR" ] || die "$DONOR missing"
ls .whl/*.whl >/dev/null 2>&1 || die ".whl/ has no wheels (cyllama-vulkan, gguf)"

python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || die "installing the wheels failed"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$WORK"
results="$WORK/results.jsonl"
batched="$WORK/batched.jsonl"
: > "$results"
: > "$batched"

# llama.cpp on FILE; prints its JSON line or nothing.
llamacpp() {
    python3 $ANCHORS/llamacpp_bench.py "$1" --pp "$PP" --tg "$TG" --reps "$REPS" --depth "$DEPTH" 2> "$WORK/llamacpp.err" | tail -n 1
}

# vkllm on FILE: pp at DEPTH and tg at DEPTH + PP, as one JSON array.
vkllm_bench() {
    local pp tg
    pp=$("$VKLLM" bench -m "$1" -b "$BACKEND" -p "$PP" -n 0 -d "$DEPTH" -r "$REPS" --json 2> "$WORK/vkllm.err") || return 1
    tg=$("$VKLLM" bench -m "$1" -b "$BACKEND" -p 0 -n "$TG" -d $((DEPTH + PP)) -r "$REPS" --json 2>> "$WORK/vkllm.err") || return 1
    python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1]) + json.loads(sys.argv[2])))' "$pp" "$tg"
}

for spec in "${models[@]}"; do
    shape=${spec%%:*}
    quant=${spec#*:}
    file="$WORK/$shape-$quant.gguf"
    writer="vkllm synth"
    echo "== $shape $quant" >&2
    if [ "$KEEP" = 1 ] && [ -f "$file" ]; then
        echo "reusing $file" >&2
    else
        "$VKLLM" synth ${synth_flags[@]+"${synth_flags[@]}"} --shape "$shape" --quant "$quant" --donor "$DONOR" -o "$file" || die "vkllm synth $shape $quant failed"
    fi
    if [ "$WARM" = 1 ]; then
        python3 $ANCHORS/llamacpp_bench.py "$file" --pp "$PP" --tg 16 --reps 1 --depth "$DEPTH" > /dev/null 2>&1
        "$VKLLM" bench -m "$file" -b "$BACKEND" -p "$PP" -n 16 -d "$DEPTH" -r 1 > /dev/null 2>&1
    fi
    if [ -n "$PARALLEL" ]; then
        lcb=$(python3 $ANCHORS/llamacpp_batched.py "$file" --pp "$BPP" --tg "$BTG" --b "$PARALLEL" 2>> "$WORK/llamacpp.err" | python3 -c 'import json,sys; print(json.dumps([json.loads(l) for l in sys.stdin if l.startswith("{")]))')
        vkb=$("$VKLLM" bench -m "$file" -b "$BACKEND" -p "$BPP" -n "$BTG" --parallel "$PARALLEL" -r "$REPS" --json 2>> "$WORK/vkllm.err") || vkb=null
        python3 -c 'import json,sys; print(json.dumps({"shape": sys.argv[1], "quant": sys.argv[2],
            "llamacpp": json.loads(sys.argv[3] or "[]"), "vkllm": json.loads(sys.argv[4])}))' \
            "$shape" "$quant" "$lcb" "$vkb" >> "$batched"
    fi
    if [ "$SINGLE" != 1 ]; then
        [ "$KEEP" = 1 ] || rm -f "$file"
        continue
    fi
    lc=$(llamacpp "$file")
    if [ -z "$lc" ]; then
        echo "llama.cpp cannot load the file vkllm synth wrote ($shape $quant):" >&2
        tail -n 5 "$WORK/llamacpp.err" >&2
        if [ -f $ANCHORS/synth_gguf.py ] && python3 $ANCHORS/synth_gguf.py "$shape" "$quant" "$file" --donor "$DONOR"; then
            writer="synth_gguf.py (vkllm synth rejected)"
            lc=$(llamacpp "$file")
        fi
    fi
    vk=$(vkllm_bench "$file") || { echo "vkllm bench failed:" >&2; tail -n 5 "$WORK/vkllm.err" >&2; vk=null; }
    python3 -c 'import json,sys; print(json.dumps({"shape": sys.argv[1], "quant": sys.argv[2], "writer": sys.argv[3],
        "llamacpp": json.loads(sys.argv[4] or "null"), "vkllm": json.loads(sys.argv[5])}))' \
        "$shape" "$quant" "$writer" "$lc" "$vk" >> "$results"
    [ "$KEEP" = 1 ] || rm -f "$file"
done

python3 - "$results" "$PP" "$TG" "$DEPTH" <<'EOF'
import json, statistics, sys
path, pp, tg, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def med(xs): return statistics.median(xs) if xs else None
def fmt(x, d=1): return "-" if x is None else f"{x:,.{d}f}"
def ratio(a, b): return None if a is None or not b else a / b
print(f"\npp{pp} / tg{tg}" + (f" at depth {depth}" if depth else "") + ", medians; ratio = vkllm / llama.cpp\n")
print("| model | file by | llama.cpp pp | vkllm pp | pp ratio | llama.cpp tg | vkllm tg | tg ratio | vkllm tg roofline |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for line in open(path):
    r = json.loads(line)
    lc = r["llamacpp"] or {}
    vk = {x["kind"]: x for x in (r["vkllm"] or [])}
    lpp, ltg = lc.get("pp_tok_s"), lc.get("tg_tok_s")
    vpp = med(vk["pp"]["samples_ts"]) if "pp" in vk else None
    vtg = med(vk["tg"]["samples_ts"]) if "tg" in vk else None
    roof = vk.get("tg", {}).get("roofline_pct")
    print(f"| {r['shape']} {r['quant']} | {r['writer']} | {fmt(lpp)} | {fmt(vpp)} | {fmt(ratio(vpp, lpp), 2)} "
          f"| {fmt(ltg)} | {fmt(vtg)} | {fmt(ratio(vtg, ltg), 2)} | {fmt(roof, 0)}{'%' if roof is not None else ''} |")
EOF
echo "raw results: $results" >&2

[ -n "$PARALLEL" ] || exit 0
python3 - "$batched" "$BPP" "$BTG" <<'EOF'
import json, statistics, sys
path, pp, tg = sys.argv[1], sys.argv[2], sys.argv[3]
def fmt(x, d=1): return "-" if x is None else f"{x:,.{d}f}"
print(f"\nmany sequences: B prompts of {pp} tokens, then {tg} steps of all B; aggregate tg tok/s; ratio = vkllm / llama.cpp\n")
print("| model | B | llama.cpp tg | vkllm tg | ratio | vkllm tg per sequence | vkllm ms per step | llama.cpp pp | vkllm pp |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for line in open(path):
    r = json.loads(line)
    lc = {x["B"]: x for x in r["llamacpp"] or []}
    for v in r["vkllm"] or []:
        b = v["sequences"]
        vtg = statistics.median([b * v["gen"] * 1e9 / ns for ns in v["tg_ns"]])
        vpp = statistics.median([b * v["prompt"] * 1e9 / ns for ns in v["pp_ns"]])
        l = lc.get(b, {})
        ltg, lpp = l.get("tg_tok_s"), l.get("pp_tok_s")
        ratio = vtg / ltg if ltg else None
        print(f"| {r['shape']} {r['quant']} | {b} | {fmt(ltg)} | {fmt(vtg)} | {fmt(ratio, 2)} | {fmt(vtg / b)} "
              f"| {v['step_ms']:.2f} | {fmt(lpp)} | {fmt(vpp)} |")
EOF
echo "raw batched results: $batched" >&2
