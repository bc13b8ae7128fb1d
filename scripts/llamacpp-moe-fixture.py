#!/usr/bin/env python3
"""llama.cpp's logits on the tiny mixture-of-experts models as `vkllm
convert` writes them: tests/data/llamacpp_moe.json, read by tests/moe.rs.
llama.cpp (its CPU wheel cyllama 0.7.0, Python 3.12) with an f32 KV cache
and no flash attention, every prompt position teacher-forced; for each
position its 8 largest logits (ids and values).

    ~/.pyenv/versions/3.12.1/bin/python3 -m venv /tmp/cy
    /tmp/cy/bin/pip install --no-deps cyllama==0.7.0 numpy
    cargo build --release --bin vkllm
    /tmp/cy/bin/python scripts/llamacpp-moe-fixture.py
"""
import json
import os
import subprocess
import tempfile

import numpy as np
from llamacpp_logits import llama_cpp_logits

MODELS = ["qwen3moe", "mixtral", "gpt_oss", "gpt_oss_mxfp4"]
TOP = 8

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ref_dir = os.path.join(root, "tests", "data", "reference", "tiny")
vkllm = os.path.join(root, "target", "release", "vkllm")
out = {"llama_cpp": "cyllama 0.7.0 (CPU), f32 KV cache, no flash attention", "top": TOP, "models": {}}
with tempfile.TemporaryDirectory() as tmp:
    for name in MODELS:
        src = os.path.join(ref_dir, name)
        path = os.path.join(tmp, name + ".gguf")
        subprocess.run([vkllm, "convert", src, "-o", path], check=True, capture_output=True)
        ids = json.load(open(os.path.join(src, "reference.json")))["prompt_ids"]
        logits = llama_cpp_logits(path, ids)
        top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP]
        out["models"][name] = {
            "prompt_ids": ids,
            "top_ids": top.tolist(),
            "top_logits": [[round(float(logits[p, i]), 7) for i in row] for p, row in enumerate(top)],
        }
        print(name, "done", flush=True)
with open(os.path.join(root, "tests", "data", "llamacpp_moe.json"), "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
