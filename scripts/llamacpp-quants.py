#!/usr/bin/env python3
"""Proof that llama.cpp reads the new block formats as vkllm does: for each
mix `vkllm synth` writes (Q3_K_M, Q2_K, IQ4_XS, ..., every one; the `tiny` shape,
whose 256-wide rows take every type of the mix), llama.cpp (its wheel
cyllama 0.7.0, Python 3.12) loads the file, and its logits at every prompt
position match `vkllm logits` on the CPU (f32 activations). llama.cpp's CPU
rounds activations to 8 bits (Q8_K / Q8_0), so the two differ by a few
percent of the logits' spread, as much for the long-supported q8_0 and
q4_k_m (run first, as the baseline) as for the new mixes; a misread block
would be off by the logits' whole scale.

Any further arguments are GGUF files (e.g. `vkllm synth --shape
llama3.2-1b` output) that llama.cpp must load and decode a few tokens of.

    ~/.pyenv/versions/3.12.1/bin/python3 -m venv /tmp/cy
    /tmp/cy/bin/pip install --no-deps cyllama==0.7.0 numpy
    cargo build --release --bin vkllm
    /tmp/cy/bin/python scripts/llamacpp-quants.py [FILE.gguf ...]
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from llamacpp_logits import llama_cpp_logits

MIXES = ["q4_k_m", "q8_0", "q3_k_m", "q2_k", "iq4_xs",
         # The rest of `vkllm synth`'s mixes; the IQ2 / IQ3 grids are random
         # valid blocks (vkllm has no quantizer for them).
         "bf16", "q6_k", "q5_k_m", "q5_k_s", "q5_0", "q5_1", "q4_k_s", "q3_k_l", "q3_k_s",
         "q2_k_s", "iq4_nl", "iq3_m", "iq3_s", "iq3_xs", "iq3_xxs", "iq2_m", "iq2_s", "iq2_xs",
         "iq2_xxs", "tq2_0", "tq1_0", "mxfp4", "mxfp4_moe", "q4_0", "q4_1", "f16"]
IDS = [1, 17, 300, 5, 42, 900, 7, 64]
# FAST=1: the files of `vkllm synth --fast` (random valid blocks of every type).
FAST = ["--fast"] if os.environ.get("FAST") == "1" else []
# Of the logits' standard deviation (the baseline mixes measure 0.04-0.06).
TOL = 0.1

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
vkllm = os.path.join(root, "target", "release", "vkllm")


failed = False
with tempfile.TemporaryDirectory() as tmp:
    for mix in MIXES:
        out = os.path.join(tmp, mix + ".gguf")
        try:
            subprocess.run([vkllm, "synth", *FAST, "--shape", "tiny", "--quant", mix, "-o", out],
                           check=True, capture_output=True)
            ours = subprocess.run([vkllm, "logits", "-m", out, "-b", "cpu", "--activations", "f32",
                                   "--prompt-ids", ",".join(map(str, IDS)), "--json"],
                                  check=True, capture_output=True, text=True).stdout
            want = np.array(json.loads(ours)["logits"], dtype=np.float64)
            got = llama_cpp_logits(out, IDS)
            err = float(np.abs(got - want).max())
            spread = float(want.std())
            same = int((got.argmax(-1) == want.argmax(-1)).sum())
            ok = err <= TOL * spread
            print(f"{mix:7} tiny loaded by llama.cpp: max |dlogit| {err:.2e} = {err / spread:.3f} of the "
                  f"logit std, argmax {same}/{len(IDS)} {'ok' if ok else 'FAIL'}", flush=True)
            failed |= not ok
        except Exception as e:  # one mix failing must not hide the others
            print(f"{mix:7} FAIL: {e}", flush=True)
            failed = True
for path in sys.argv[1:]:
    try:
        logits = llama_cpp_logits(path, IDS)
        ok = bool(np.isfinite(logits).all())
        print(f"{os.path.basename(path)} loaded by llama.cpp: {logits.shape[0]} positions of "
              f"{logits.shape[1]} logits, {'finite ok' if ok else 'non-finite FAIL'}", flush=True)
        failed |= not ok
    except Exception as e:
        print(f"{os.path.basename(path)} FAIL: {e}", flush=True)
        failed = True
sys.exit(1 if failed else 0)
