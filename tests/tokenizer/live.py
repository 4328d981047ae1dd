#!/usr/bin/env python3
"""Live check of llmem's tokenizers and chat templates against Hugging Face
`tokenizers` and `jinja2` from PyPI, on fresh random inputs, plus encode
throughput of both in the same run.

    live.py --llmem BUILD/bin/llmem --chat-test BUILD/bin/test_chat_template
            --venv BUILD/tok-venv --out BUILD/tok-live [--seed N] [--n 400]

Installs tokenizers and jinja2 into the venv with pip on first use; exits 77
(ctest SKIP_RETURN_CODE) when that is impossible (no network, no venv)."""
import argparse
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
KINDS = ["gpt2", "llama3", "qwen2", "spm", "metaspace", "falcon", "words"]
SKIP = 77


def ensure_venv(venv):
    py = os.path.join(venv, "bin", "python")
    probe = [py, "-c", "import tokenizers, jinja2"]
    if os.path.exists(py) and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    try:
        if not os.path.exists(py):
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, timeout=120)
        r = subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "tokenizers",
                            "jinja2"], capture_output=True, text=True, timeout=240)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"SKIP: cannot make a venv with pip: {e}")
        sys.exit(SKIP)
    if r.returncode != 0 or subprocess.run(probe, capture_output=True).returncode != 0:
        print("SKIP: pip could not install tokenizers/jinja2 (no network?):\n" + r.stderr[-2000:])
        sys.exit(SKIP)
    return py


def corpus_lines():
    lines = open(os.path.join(FIX, "multilingual.txt"), encoding="utf-8").read().split("\n")
    with open(os.path.join(FIX, "gpt2", "cases.jsonl"), encoding="utf-8") as f:
        for l in f:
            t = json.loads(l).get("text")
            if t:
                lines.append(t)
    return lines


def run_live(args):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from make_tokenizer_fixtures import KIND_ADDED, KIND_SPECIALS, make_strings
    from tokenizers import Tokenizer
    seed = args.seed if args.seed is not None else int(time.time()) % 1000000
    print(f"seed {seed}")
    os.makedirs(args.out, exist_ok=True)
    lines = corpus_lines()
    multi = open(os.path.join(FIX, "multilingual.txt"), encoding="utf-8").read()
    failures = 0
    # 1. fresh random strings: ids and decoded strings through `llmem tokenize`
    for kind in KINDS:
        tok = Tokenizer.from_file(os.path.join(FIX, kind, "tokenizer.json"))
        rng = random.Random(seed * 7 + len(kind))
        strings = [s for s in make_strings(rng, args.n, lines, multi, KIND_SPECIALS[kind], KIND_ADDED[kind])
                   if isinstance(s, str)]
        inp = os.path.join(args.out, f"{kind}.jsonl")
        with open(inp, "w", encoding="utf-8") as f:
            for s in strings:
                f.write(json.dumps({"text": s}, ensure_ascii=False) + "\n")
        r = subprocess.run([args.llmem, "tokenize", "--tokenizer", os.path.join(FIX, kind), "--input", inp],
                           capture_output=True, text=True, encoding="utf-8", errors="surrogateescape")
        if r.returncode != 0:
            print(f"FAIL {kind}: llmem tokenize exited {r.returncode}: {r.stderr[-500:]}")
            failures += 1
            continue
        got = [json.loads(l) for l in r.stdout.split("\n") if l]
        bad = 0
        for s, g in zip(strings, got):
            ids = tok.encode(s).ids
            dec = tok.decode(ids, skip_special_tokens=False)
            if g["ids"] != ids or g["decoded"] != dec:
                if bad < 3:
                    print(f"  {kind} mismatch on {s!r}:\n    want {ids} {dec!r}\n    got  {g['ids']} {g['decoded']!r}")
                bad += 1
        if len(got) != len(strings):
            bad += 1
        print(f"{kind}: {len(strings)} fresh strings, {bad} mismatches")
        failures += bad
    # 2. throughput on the same text, in this run
    big = [l for l in lines if l] * 6
    nbytes = sum(len(l.encode("utf-8")) for l in big)
    inp = os.path.join(args.out, "bench.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
        for l in big:
            f.write(json.dumps({"text": l}, ensure_ascii=False) + "\n")
    doc = "\n".join(big)
    inp1 = os.path.join(args.out, "bench_doc.jsonl")
    with open(inp1, "w", encoding="utf-8") as f:
        f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")

    def llmem_mbs(kind, path):
        r = subprocess.run([args.llmem, "tokenize", "--tokenizer", os.path.join(FIX, kind), "--input", path,
                            "--stats"], capture_output=True, text=True)
        return float(r.stderr.strip().split()[-2]) if r.returncode == 0 else float("nan")

    print(f"encode throughput (MB/s; llmem: one thread, encode calls only; tokenizers: its Python call included,"
          f" batch on its thread pool): {nbytes / 1e6:.2f} MB as {len(big)} strings, and as one document")
    print(f"  {'kind':10s} {'llmem':>8s} {'tokenizers':>11s} {'tok. batch':>11s} {'llmem doc':>10s}"
          f" {'tok. doc':>9s}")
    for kind in KINDS:
        tok = Tokenizer.from_file(os.path.join(FIX, kind, "tokenizer.json"))
        ll, ld = llmem_mbs(kind, inp), llmem_mbs(kind, inp1)
        t0 = time.perf_counter()
        for l in big:
            tok.encode(l)
        t1 = time.perf_counter()
        tok.encode_batch(big)
        t2 = time.perf_counter()
        tok.encode(doc)
        t3 = time.perf_counter()
        mb = nbytes / 1e6
        print(f"  {kind:10s} {ll:8.2f} {mb / (t1 - t0):11.2f} {mb / (t2 - t1):11.2f} {ld:10.2f}"
              f" {mb / (t3 - t2):9.2f}")
    # 3. chat templates: fresh random conversations through jinja2 and llmem
    cases = os.path.join(args.out, "chat_cases.jsonl")
    subprocess.run([sys.executable, os.path.join(HERE, "chat_cases.py"), os.path.join(ROOT, "tests", "fixtures",
                    "chat_templates"), cases, "--seed", str(seed), "--random", "25"], check=True)
    r = subprocess.run([args.chat_test], env=dict(os.environ, LLMEM_CHAT_CASES=cases, CK_FORK="no"),
                       capture_output=True, text=True)
    print(f"chat templates: test_chat_template on fresh jinja2 renders: exit {r.returncode}")
    if r.returncode != 0:
        print(r.stdout[-3000:] + r.stderr[-3000:])
        failures += 1
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmem", required=True)
    ap.add_argument("--chat-test", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--in-venv", action="store_true")
    args = ap.parse_args()
    if not args.in_venv:
        py = ensure_venv(args.venv)
        sys.exit(subprocess.run([py, os.path.abspath(__file__), "--in-venv"] + sys.argv[1:]).returncode)
    sys.exit(run_live(args))


if __name__ == "__main__":
    main()
