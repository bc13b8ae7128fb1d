#!/usr/bin/env python3
"""Proof that our GGUF files follow llama.cpp's conventions: llama.cpp (its
CPU wheel cyllama 0.7.0, Python 3.12) loads what `vkllm convert` writes for
the tiny models in tests/data/reference/tiny and its logits at every
prompt position match transformers' there. F32 weights, so llama.cpp's CPU
path quantizes no activations and the bound is tight.

gpt_oss_mxfp4 is left out: against MXFP4 weights llama.cpp's CPU quantizes
the activations to q8_0 (max |dlogit| 7e-2, argmax 22/24); the same file
with its experts dequantized to f32 by gguf-py agrees to 4.4e-6.

    ~/.pyenv/versions/3.12.1/bin/python3 -m venv /tmp/cy
    /tmp/cy/bin/pip install --no-deps cyllama==0.7.0 numpy
    cargo build --release --bin vkllm
    /tmp/cy/bin/python scripts/llamacpp-tiny.py [REFERENCE_DIR]

Prints one line per architecture and exits nonzero if any fails.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from llamacpp_logits import llama_cpp_logits

ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "phi3", "gpt2", "qwen3moe", "mixtral", "gpt_oss"]
# ggml's CPU tanh-GELU reads an f16 table (GGML_GELU_FP16), ~1e-3 of the
# logits; the SiLU models agree to float rounding.
TOL = {"gemma3": 2e-3, "gpt2": 2e-3}
TOL_SILU = 1e-5

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ref_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "data", "reference", "tiny")
vkllm = os.path.join(root, "target", "release", "vkllm")
failed = False
with tempfile.TemporaryDirectory() as tmp:
    for arch in ARCHS:
        src = os.path.join(ref_dir, arch)
        out = os.path.join(tmp, arch + ".gguf")
        subprocess.run([vkllm, "convert", src, "-o", out], check=True, capture_output=True)
        ref = json.load(open(os.path.join(src, "reference.json")))
        ids = ref["prompt_ids"]
        want = np.array(ref["logits"], dtype=np.float64)
        try:
            got = llama_cpp_logits(out, ids)
            err = float(np.abs(got - want).max())
            same = int((got.argmax(-1) == want.argmax(-1)).sum())
            ok = err <= TOL.get(arch, TOL_SILU) and same == len(ids)
            print(f"{arch:7} loaded by llama.cpp: max |dlogit| {err:.2e} over {len(ids)}x{want.shape[1]}, "
                  f"argmax {same}/{len(ids)} {'ok' if ok else 'FAIL'}", flush=True)
            failed |= not ok
        except Exception as e:  # one architecture failing must not hide the others
            print(f"{arch:7} FAIL: {e}", flush=True)
            failed = True
sys.exit(1 if failed else 0)
