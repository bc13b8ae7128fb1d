#!/usr/bin/env python3
"""Write tests/data/llamacpp_names.json: llama.cpp's tensor names per
architecture and its metadata keys, as the `gguf` Python package (0.19.0,
llama.cpp's own gguf-py) tables them in gguf/constants.py. tests/conventions.rs
checks our GGUF writer and loader against this file, so a name or key that
drifts from llama.cpp's fails a test instead of a user's load.

    pip install --no-deps gguf==0.19.0
    python3 scripts/llamacpp-names.py > tests/data/llamacpp_names.json

constants.py is loaded on its own: the package's __init__ pulls in optional
dependencies (yaml, tqdm, numpy) that the tables do not need.
"""
import importlib.metadata
import importlib.util
import json
import os
import sys

ARCHS = ["LLAMA", "QWEN2", "QWEN3", "GEMMA3", "PHI3", "GPT2", "QWEN3MOE", "GPT_OSS", "BITNET"]

spec = importlib.util.find_spec("gguf")
if spec is None or not spec.submodule_search_locations:
    sys.exit("llamacpp-names: the gguf package is not installed (pip install gguf==0.19.0)")
path = os.path.join(list(spec.submodule_search_locations)[0], "constants.py")
cspec = importlib.util.spec_from_file_location("gguf_constants", path)
c = importlib.util.module_from_spec(cspec)
sys.modules["gguf_constants"] = c
cspec.loader.exec_module(c)


def keys(cls):
    """Every string constant of Keys and its nested classes."""
    out = []
    for name, v in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, type):
            out.extend(keys(v))
    return out


tensors = {}
for a in ARCHS:
    arch = c.MODEL_ARCH[a]
    tensors[c.MODEL_ARCH_NAMES[arch]] = [c.TENSOR_NAMES[t] for t in c.MODEL_TENSORS[arch]]

json.dump(
    {
        "source": "gguf " + importlib.metadata.version("gguf") + " gguf/constants.py",
        "tensors": tensors,
        "keys": sorted(set(keys(c.Keys))),
    },
    sys.stdout,
    indent=1,
)
print()
