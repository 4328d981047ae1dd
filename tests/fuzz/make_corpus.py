#!/usr/bin/env python3
"""Writes the committed seed corpora of the libFuzzer harnesses
(tests/fuzz/corpus/<harness>/) from the fixtures in tests/fixtures and
models/builtin, kept small: checkpoints cut to a few tensors of at most
2 x 2 elements, tokenizers cut to a few hundred vocabulary entries.
Deterministic; run it again after a fixture changes:

    python3 tests/fuzz/make_corpus.py

Input layouts are the harnesses' own (see each tests/fuzz/fuzz_*.c)."""
import json
import os
import re
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")


def put(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def model_dirs():
    dirs = sorted(d for d in os.listdir(FIX) if os.path.isfile(os.path.join(FIX, d, "config.json")))
    return [(d, os.path.join(FIX, d)) for d in dirs] + [("builtin", os.path.join(ROOT, "models", "builtin"))]


# ---- config.json: the fixtures' files as they are --------------------------------------------
def config_seeds():
    for name, d in model_dirs():
        with open(os.path.join(d, "config.json"), "rb") as f:
            put("fuzz_config", name + ".json", f.read())


# ---- safetensors: each fixture's first tensors, shapes cut to <= 2 per dimension ---------------
def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I8": 1, "U8": 1}


def small_st(header, data, names):
    """A safetensors file of `names`, each cut to <= 2 elements per dimension
    (its bytes: the first bytes of the original tensor)."""
    out_h, blobs, off = {}, [], 0
    if "__metadata__" in header:
        out_h["__metadata__"] = header["__metadata__"]
    for name in names:
        e = header[name]
        shape = [min(d, 2) for d in e["shape"]]
        n = SIZES[e["dtype"]]
        for d in shape:
            n *= d
        b = e["data_offsets"][0]
        blobs.append(data[b:b + n])
        out_h[name] = {"dtype": e["dtype"], "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(out_h, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def safetensors_seeds():
    for name, d in model_dirs():
        path = os.path.join(d, "model.safetensors")
        if not os.path.isfile(path):
            continue
        header, data = read_st(path)
        names = sorted(k for k in header if k != "__metadata__")[:6]
        put("fuzz_safetensors", name, b"\x00" + small_st(header, data, names))
    # two shards, without and with an index (the llama fixture split in two)
    header, data = read_st(os.path.join(FIX, "llama", "model.safetensors"))
    names = sorted(k for k in header if k != "__metadata__")[:6]
    a, b = small_st(header, data, names[:3]), small_st(header, data, names[3:])
    two = struct.pack("<H", len(a)) + a + b
    put("fuzz_safetensors", "llama_shards", b"\x01" + two)
    index = {"metadata": {"total_size": 0},
             "weight_map": {**{k: "a.safetensors" for k in names[:3]},
                            **{k: "b.safetensors" for k in names[3:]}}}
    put("fuzz_safetensors", "llama_index",
        b"\x02" + json.dumps(index, separators=(",", ":")).encode() + b"\x00" + two)


# ---- tokenizer.json: the fixture tokenizers, vocabularies cut and renumbered ------------------
TEXT = "Hello world, it's 2026!\n\tDon't  stop \u00e9t\u00e9 \u65e5\u672c <s> [INST] x [/INST]".encode()


def small_tokenizer(t, keep=240):
    m = t["model"]
    vocab = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    kept = [k for k, _ in vocab[:keep]]
    ids = {k: i for i, k in enumerate(kept)}
    merges = []
    for mg in m["merges"]:
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in ids and b in ids and a + b in ids:
            merges.append(mg)
    old_to_new = {v: ids[k] for k, v in vocab[:keep]}
    nxt = len(kept)
    added = []
    for tok in t.get("added_tokens", []):
        tok = dict(tok)
        if tok["id"] not in old_to_new:
            old_to_new[tok["id"]] = nxt
            nxt += 1
        tok["id"] = old_to_new[tok["id"]]
        added.append(tok)
    t = dict(t)
    t["added_tokens"] = added
    t["model"] = dict(m, vocab=ids, merges=merges)

    def renumber(pp):
        if isinstance(pp, dict):
            if pp.get("type") == "Sequence":
                return dict(pp, processors=[renumber(p) for p in pp.get("processors", [])])
            if pp.get("type") == "TemplateProcessing":
                sp = {k: dict(v, ids=[old_to_new.get(i, 0) for i in v["ids"]])
                      for k, v in pp.get("special_tokens", {}).items()}
                return dict(pp, special_tokens=sp)
        return pp
    t["post_processor"] = renumber(t.get("post_processor"))
    return t


def tokenizer_seeds():
    tdir = os.path.join(FIX, "tokenizers")
    for name in sorted(os.listdir(tdir)):
        path = os.path.join(tdir, name, "tokenizer.json")
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            t = small_tokenizer(json.load(f))
        with open(os.path.join(tdir, name, "tokenizer_config.json"), "rb") as f:
            cfg = f.read()
        tj = json.dumps(t, ensure_ascii=False, separators=(",", ":")).encode()
        put("fuzz_tokenizer_load", name, tj + b"\x00" + cfg + b"\x00\x03" + TEXT)
    # a model fixture's tokenizer with its chat template, as it is
    with open(os.path.join(FIX, "llama", "tokenizer.json"), "rb") as f:
        tj = f.read()
    with open(os.path.join(FIX, "llama", "tokenizer_config.json"), "rb") as f:
        cfg = f.read()
    put("fuzz_tokenizer_load", "llama_fixture", tj + b"\x00" + cfg + b"\x00\x07" + TEXT)


# ---- llmem serve request bodies --------------------------------------------------------------
def serve_seeds():
    bodies = [
        (0, {"model": "m", "prompt": "Hello", "max_tokens": 8, "temperature": 0}),
        (0, {"prompt": [1, 2, 3], "max_tokens": 4, "stop": ["\n", "end"], "seed": 5,
             "top_p": 0.9, "top_k": 40, "min_p": 0.05, "stream": True,
             "stream_options": {"include_usage": True}}),
        (2, {"prompt": ["To be"], "max_tokens": 3, "stop": "x", "n": 1, "logprobs": None,
             "presence_penalty": 0, "frequency_penalty": 0, "best_of": 1}),
        (1, {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hi"}], "max_tokens": 5}),
        (3, {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                       {"type": "text", "text": "there"}]},
                          {"role": "assistant", "content": "Hello"},
                          {"role": "user", "content": "and?"}],
             "max_completion_tokens": 6, "stream": True, "tools": []}),
        (3, {"messages": [{"role": "user", "content": None}], "temperature": 1.5}),
    ]
    for i, (mode, body) in enumerate(bodies):
        put("fuzz_serve_api", "body_%d" % i, bytes([mode]) + json.dumps(body).encode())


# ---- dictionaries: the JSON keys the parsers look up, and awkward numbers ---------------------
NUMBERS = ["0", "-1", "1", "2", "0.5", "1e300", "-1e300", "1e-300", "2147483647", "2147483648",
           "4294967296", "9007199254740993", "16777217", "1.5", "-0", "NaN", "Infinity"]


def keys_in(paths, patterns):
    found = set()
    for path in paths:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
        for pat in patterns:
            for m in re.finditer(pat, text):
                found.update(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
    return sorted(k for k in found if k and len(k) < 48)


def write_dict(harness, words):
    d = os.path.join(ROOT, "tests", "fuzz", "dict")
    os.makedirs(d, exist_ok=True)
    lines = ['"\\"%s\\""' % w.replace("\\", "\\\\").replace('"', '\\"') for w in words]
    lines += ['"%s"' % n for n in NUMBERS]
    lines += ['"{"', '"}"', '"["', '"]"', '":"', '","', '"null"', '"true"', '"false"',
              '"\\\\u0000"', '"{\\"__float__\\": \\"Infinity\\"}"']
    with open(os.path.join(d, harness + ".dict"), "w", encoding="utf-8") as f:
        f.write("# JSON keys %s looks up (tests/fuzz/make_corpus.py)\n" % harness)
        f.write("\n".join(lines) + "\n")


def dicts():
    models = sorted("models/" + f for f in os.listdir(os.path.join(ROOT, "models"))
                    if f.startswith(("config", "gemma3", "lfm2", "jamba", "qwen3_next", "falcon_h1",
                                     "moe")) and f.endswith(".c"))
    write_dict("fuzz_config", keys_in(models, [r"KEYS\(([^)]*)\)", r"GetObjectItemCaseSensitive\([^,]+,\s*(\"[^\"]+\")",
                                                r"arch_names\[[^\]]*\]\s*=\s*\{([^}]*)\}"]))
    write_dict("fuzz_tokenizer_load", keys_in(["models/tokenizer.c"], [
        r"jstr\([^,]+,\s*(\"[^\"]+\")", r"jbool\([^,]+,\s*(\"[^\"]+\")",
        r"GetObjectItemCaseSensitive\([^,]+,\s*(\"[^\"]+\")", r"strcmp\([^,]+,\s*(\"[^\"]+\")"]))
    write_dict("fuzz_serve_api", keys_in(["examples/cli/serve_api.c"], [
        r"GetObjectItemCaseSensitive\([^,]+,\s*(\"[^\"]+\")", r"falsy\[\][^;]*=\s*\{([^}]*)\}",
        r"num_field\([^,]+,\s*(\"[^\"]+\")", r"bool_field\([^,]+,\s*(\"[^\"]+\")"]))


def main():
    if os.path.isdir(OUT):
        for h in ("fuzz_config", "fuzz_safetensors", "fuzz_tokenizer_load", "fuzz_serve_api"):
            shutil.rmtree(os.path.join(OUT, h), ignore_errors=True)
    config_seeds()
    safetensors_seeds()
    tokenizer_seeds()
    serve_seeds()
    dicts()
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    print("wrote %s (%d bytes)" % (OUT, total), file=sys.stderr)


if __name__ == "__main__":
    main()
