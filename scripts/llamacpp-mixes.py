#!/usr/bin/env python3
"""Proof that `vkllm synth --quant MIX` picks each tensor's type as
llama.cpp's own quantizer does: for each shape, `vkllm synth` writes an F16
file, llama.cpp (its wheel cyllama, Python 3.12) quantizes it to every mix
in a dry run (`llama_model_quantize` with `dry_run`: types chosen and
logged, nothing written), and each tensor's type is compared with the file
`vkllm synth --fast --quant MIX` writes.

The dry run has no importance matrix, and cyllama cannot hand it one; the
mixes llama.cpp writes only with one (the IQ2 mixes, iq3_xxs, iq3_xs,
q2_k_s) are the files vkllm writes, so where llama.cpp's choice depends on
the matrix (iq3_xxs's attn_v and ffn_down) the two may differ, and those
are reported apart, not as failures.

    /tmp/cy/bin/python scripts/llamacpp-mixes.py [--json OUT] [SHAPE ...]
    (default: tiny smollm2-135m tiny-qwen3moe; llama3.2-1b and
    tinyllama-1.1b write 2.5 GB F16 files first)

`--json OUT` also writes llama.cpp's choices, the fixture
tests/data/llamacpp_mix_types.json that tests/bench.rs checks `synth::plan`
against: per shape, its quantized tensors' names and, per mix, their types
in that order.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
vkllm = os.path.join(root, "target", "release", "vkllm")

# llama.cpp's llama_ftype of each mix (bench/synth/recipe.rs has the same);
# f16 and bf16 are left out (no recipe: every matrix in the float type).
FTYPES = {
    "q8_0": 7, "q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q2_k_s": 21,
    "q3_k_s": 11, "q3_k_m": 12, "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15, "q5_k_s": 16,
    "q5_k_m": 17, "q6_k": 18, "iq2_xxs": 19, "iq2_xs": 20, "iq2_s": 28, "iq2_m": 29,
    "iq3_xxs": 23, "iq3_xs": 22, "iq3_s": 26, "iq3_m": 27, "iq4_nl": 25, "iq4_xs": 30,
    "tq1_0": 36, "tq2_0": 37, "mxfp4_moe": 38,
    # `llama-quantize --pure` to MXFP4_MOE: every matrix MXFP4.
    "mxfp4": (38, "pure"),
}
# Tensors whose type llama.cpp picks differently with an importance matrix.
IMATRIX_DEPENDENT = {"iq3_xxs": ("attn_v.weight", "ffn_down")}

# ggml type ids -> names (the types synth writes).
GGML = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 10: "q2_k",
        11: "q3_k", 12: "q4_k", 13: "q5_k", 14: "q6_k", 16: "iq2_xxs", 17: "iq2_xs",
        18: "iq3_xxs", 20: "iq4_nl", 21: "iq3_s", 22: "iq2_s", 23: "iq4_xs", 30: "bf16",
        34: "tq1_0", 35: "tq2_0", 39: "mxfp4"}


def tensor_types(path):
    """name -> type name of every tensor in the GGUF at `path`."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    pos = 4 + 4
    n_tensors, n_kv = struct.unpack_from("<QQ", data, pos)
    pos += 16

    def string(pos):
        (n,) = struct.unpack_from("<Q", data, pos)
        return data[pos + 8:pos + 8 + n].decode(), pos + 8 + n

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def value(kind, pos):
        if kind == 8:
            return string(pos)[1]
        if kind == 9:
            inner, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(n):
                pos = value(inner, pos)
            return pos
        return pos + sizes[kind]

    for _ in range(n_kv):
        _, pos = string(pos)
        (kind,) = struct.unpack_from("<I", data, pos)
        pos = value(kind, pos + 4)
    out = {}
    for _ in range(n_tensors):
        name, pos = string(pos)
        (nd,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * nd
        (kind,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8
        out[name] = GGML.get(kind, f"ggml type {kind}")
    return out


LINE = re.compile(r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\S+), size =[^\n(]*(?:\((\S+)\))?")


def llama_cpp_types(src, mix):
    """name -> type llama.cpp's quantizer picks for `src` under `mix` (an
    ftype, or (ftype, "pure")), from
    its dry run's log (in a child process: the log goes to its stderr)."""
    code = (
        "import sys\n"
        "from cyllama.llama import llama_cpp as cy\n"
        "p = cy.LlamaModelQuantizeParams()\n"
        "p.ftype = int(sys.argv[2]); p.dry_run = True; p.nthread = 1\n"
        "p.pure = sys.argv[3] == 'pure'\n"
        "cy.model_quantize(sys.argv[1], sys.argv[1] + '.out', p)\n"
    )
    ftype, pure = mix if isinstance(mix, tuple) else (mix, "")
    r = subprocess.run([sys.executable, "-c", code, src, str(ftype), pure], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp's dry run failed: {r.stderr[-2000:]}")
    types = {}
    for m in LINE.finditer(r.stdout + r.stderr):
        name, cur, new = m.groups()
        types[name] = (new or cur).lower()
    if not types:
        raise RuntimeError(f"no tensor lines in llama.cpp's log: {r.stderr[-2000:]}")
    return types


def main():
    args = sys.argv[1:]
    out_json = None
    if args[:1] == ["--json"]:
        out_json, args = args[1], args[2:]
    shapes = args or ["tiny", "smollm2-135m", "tiny-qwen3moe"]
    fixture = {}
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            base = os.path.join(tmp, f"{shape}-f16.gguf")
            subprocess.run([vkllm, "synth", "--shape", shape, "--quant", "f16", "-o", base],
                           check=True, capture_output=True)
            for mix, ftype in FTYPES.items():
                ours_path = os.path.join(tmp, f"{shape}-{mix}.gguf")
                subprocess.run([vkllm, "synth", "--fast", "--shape", shape, "--quant", mix,
                                "-o", ours_path], check=True, capture_output=True)
                ours = tensor_types(ours_path)
                os.remove(ours_path)
                try:
                    theirs = llama_cpp_types(base, ftype)
                except RuntimeError as e:
                    print(f"{shape:14} {mix:9} FAIL: {e}", flush=True)
                    failed = True
                    continue
                # Only what a recipe decides: the tensors llama.cpp quantizes.
                names = [n for n in sorted(theirs) if theirs[n] != "f32"]
                entry = fixture.setdefault(shape, {"tensors": names, "mixes": {}})
                if entry["tensors"] != names:
                    raise RuntimeError(f"{shape} {mix}: another set of quantized tensors")
                entry["mixes"][mix] = " ".join(theirs[n] for n in names)
                skip = IMATRIX_DEPENDENT.get(mix, ())
                diff, apart = [], []
                for name in sorted(set(ours) | set(theirs)):
                    a, b = ours.get(name), theirs.get(name)
                    if a != b:
                        (apart if any(s in name for s in skip) else diff).append(f"{name}: ours {a}, llama.cpp {b}")
                status = "ok" if not diff else "FAIL"
                note = f" ({len(apart)} imatrix-dependent differ)" if apart else ""
                print(f"{shape:14} {mix:9} {len(ours)} tensors {status}{note}", flush=True)
                for d in diff[:8]:
                    print(f"    {d}")
                failed |= bool(diff)
            os.remove(base)
    if out_json:
        with open(out_json, "w") as f:
            json.dump({"llama_cpp": "cyllama's llama.cpp (b11669), llama_model_quantize dry run, no imatrix",
                       "shapes": fixture}, f, indent=1)
            f.write("\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
