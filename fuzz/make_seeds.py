#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/seeds/<target>/ from the real files:
the two GGUF models in models/ (metadata kept, vocabularies cut to 400
tokens, two tiny tensors in place of the weights, plus their first
4 KiB as truncated headers), the tiny Hugging Face checkpoints'
config.json files (tests/data/reference/tiny) with
small safetensors images, the models' chat templates, and hand-written
tokenizer.json files of each model family. Run from anywhere:
python3 fuzz/make_seeds.py"""
import json, os, struct, sys
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
SEEDS = FUZZ / "seeds"
REF = ROOT / "tests" / "data" / "reference"
VOCAB = 400  # tokens kept from each real vocabulary (small: each run rebuilds it)

# --- GGUF reading and writing (v3, little-endian) ---
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
          F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}

class Reader:
    def __init__(self, b): self.b, self.o = b, 0
    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.o)[0]; self.o += struct.calcsize(fmt); return v
    def string(self):
        n = self.take("<Q"); s = self.b[self.o:self.o + n].decode("utf-8", "replace"); self.o += n; return s
    def value(self, t):
        if t == STR: return self.string()
        if t == ARR:
            et, n = self.take("<I"), self.take("<Q")
            return (et, [self.value(et) for _ in range(n)])
        return self.take(SCALAR[t])

def read_gguf(path):
    r = Reader(path.read_bytes())
    assert r.b[:4] == b"GGUF"
    r.o = 4
    _version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    meta = []
    for _ in range(n_kv):
        k = r.string(); t = r.take("<I"); meta.append((k, t, r.value(t)))
    return meta

def put_string(out, s):
    b = s.encode(); out += struct.pack("<Q", len(b)) + b

def put_value(out, t, v):
    if t == STR: put_string(out, v)
    elif t == ARR:
        et, items = v; out += struct.pack("<IQ", et, len(items))
        for x in items: put_value(out, et, x)
    else: out += struct.pack(SCALAR[t], v)

def write_gguf(meta, tensors, align=32):
    """tensors: (name, dims, ggml type, data bytes)."""
    out = bytearray(b"GGUF") + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, t, v in meta:
        put_string(out, k); out += struct.pack("<I", t); put_value(out, t, v)
    offset, blobs = 0, b""
    for name, dims, ggml, data in tensors:
        put_string(out, name); out += struct.pack("<I", len(dims))
        for d in dims: out += struct.pack("<Q", d)
        out += struct.pack("<IQ", ggml, offset)
        pad = (-len(data)) % align
        blobs += data + b"\0" * pad; offset += len(data) + pad
    out += b"\0" * ((-len(out)) % align)
    return bytes(out + blobs)

def cut_vocab(meta):
    """The vocabulary arrays cut to VOCAB tokens; merges kept only where all
    their pieces survive; special ids past the cut dropped."""
    kept = None
    for k, t, v in meta:
        if k == "tokenizer.ggml.tokens": kept = set(v[1][:VOCAB])
    out = []
    for k, t, v in meta:
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            v = (v[0], v[1][:VOCAB])
        elif k == "tokenizer.ggml.merges":
            ok = [m for m in v[1] if all(p in kept for p in m.split(" ", 1)) and m.replace(" ", "", 1) in kept]
            v = (v[0], ok[:2000])
        elif k.startswith("tokenizer.ggml.") and k.endswith("_token_id") and v >= VOCAB:
            continue
        out.append((k, t, v))
    return out

def framed(text, body):
    t = text.encode()
    return struct.pack("<H", len(t)) + t + body

def write(target, name, data):
    d = SEEDS / target; d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)

TEXTS = ["Hello, world! 123 + 4567 = ?", "  leading spaces\n\ttabs and é ü 日本語 🙂",
         "<|im_start|>user\nhi<|im_end|>", "<start_of_turn>user\nhi<end_of_turn>", ""]

def gguf_seeds():
    q4_1 = struct.pack("<ee", 0.5, -1.0) + bytes(range(16))          # 32 weights
    q4_k = struct.pack("<ee", 0.25, 0.01) + bytes(range(12)) + bytes(range(128))  # 256 weights
    for model, weight in (("SmolLM2-135M-Instruct.Q4_1.gguf", (3, [32, 2], q4_1 * 2)),
                          ("gemma-3-270m-q4_k_m.gguf", (12, [256, 1], q4_k))):
        path = ROOT / "models" / model
        if not path.exists():
            sys.exit(f"{path} is missing (scripts/fetch-model.sh, scripts/fetch-gemma3.sh)")
        stem = model.split(".")[0].split("-")[0].lower()
        meta = cut_vocab(read_gguf(path))
        ggml, dims, data = weight
        tensors = [("output_norm.weight", [8], 0, struct.pack("<8f", *range(8))),
                   ("blk.0.attn_q.weight", dims, ggml, data)]
        write("gguf", f"{stem}.gguf", write_gguf(meta, tensors))
        write("gguf", f"{stem}-header-4k.gguf", path.read_bytes()[:4096])
        vocab_only = [m for m in meta if m[0].startswith("tokenizer.ggml") or m[0] == "general.architecture"]
        body = write_gguf(vocab_only, [])
        for i, text in enumerate(TEXTS):
            write("gguf_vocab", f"{stem}-{i}", framed(text, body))
        for k, t, v in meta:
            if k == "tokenizer.chat_template":
                write("chat_template", f"{stem}.jinja", v.encode())

F32_ID = {"F32": 4, "F16": 2, "BF16": 2}

def safetensors_image(names):
    """A small image: every name a [2, 4] F32 tensor, a 1-D [4] for norms."""
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name in names:
        shape = [4] if "norm" in name or name.endswith(".bias") else [2, 4]
        n = 1
        for s in shape: n *= s
        raw = struct.pack(f"<{n}f", *[0.25 * i for i in range(n)])
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data

def safetensors_seeds():
    tiny = REF / "tiny"
    if not tiny.is_dir():
        sys.exit(f"{tiny} is missing")
    for arch in sorted(p.name for p in tiny.iterdir()):
        config = (tiny / arch / "config.json").read_text()
        b = (tiny / arch / "model.safetensors").read_bytes()
        n = struct.unpack_from("<Q", b)[0]
        names = [k for k in json.loads(b[8:8 + n]) if k != "__metadata__"][:8]
        write("safetensors", arch, framed(config, safetensors_image(names)))
        write("safetensors", f"{arch}-header-only", framed(config, b[:8 + n]))

def byte_level_bpe():
    # GPT-2's byte-to-unicode table.
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs: bs.append(b); cs.append(256 + n); n += 1
    chars = [chr(c) for c in cs]
    vocab = {"<|endoftext|>": 0}
    for c in chars: vocab[c] = len(vocab)
    merges = ["Ġ t", "h e", "Ġt he", "l l", "o r", "Ġ w"]
    for m in merges: vocab.setdefault(m.replace(" ", ""), len(vocab))
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 0, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": merges}}

def sentencepiece_bpe():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256): vocab[f"<0x{b:02X}>"] = len(vocab)
    for p in ["▁", "e", "t", "h", "l", "o", "▁t", "he", "▁the", "ll", "▁w"]: vocab[p] = len(vocab)
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for c, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": None,
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": ["▁ t", "h e", "▁t he", "l l", "▁ w"]}}

def unigram_metaspace():
    pieces = [["<unk>", 0.0], ["▁", -2.0], ["▁the", -1.0], ["h", -3.0], ["e", -3.0], ["l", -3.0], ["o", -3.0], ["▁w", -2.5]]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
            "post_processor": None,
            "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
            "model": {"type": "Unigram", "unk_id": 0, "vocab": pieces, "byte_fallback": False}}

def wordpiece():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "!", ",", "the"])}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                           "strip_accents": None, "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
            "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100, "vocab": vocab}}

def tokenizer_json_seeds():
    for name, make in (("byte-level-bpe", byte_level_bpe), ("sentencepiece-bpe", sentencepiece_bpe),
                       ("unigram", unigram_metaspace), ("wordpiece", wordpiece)):
        body = json.dumps(make(), ensure_ascii=False).encode()
        for i, text in enumerate(TEXTS[:3]):
            write("tokenizer_json", f"{name}-{i}", framed(text, body))

def template_and_ids_seeds():
    write("chat_template", "chatml.jinja", (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}").encode())
    write("chat_template", "raises.jinja",
          b"{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}"
          b"{{ messages | tojson }}{{ messages[0].content.strip().startswith('Be') }}{% for k, v in {'a': 1}.items() %}{{ k }}{% endfor %}")
    for i, ids in enumerate(["1,2,3", " 4 , 5,", "4294967295", "0", "12,,13", "-1", "1e3"]):
        write("prompt_ids", f"ids-{i}", ids.encode())

gguf_seeds()
safetensors_seeds()
tokenizer_json_seeds()
template_and_ids_seeds()
