#!/usr/bin/env python3
"""Every LLMEM_* environment variable the tree reads is documented in docs/.

Names read: string literals "LLMEM_..." in C / CUDA sources (getenv,
setenv, env_*() helpers, tables of knob names; the status names LLMEM_OK
and LLMEM_E_* are not variables), and ${LLMEM_X:-...} / os.environ /
os.getenv reads in shell and Python scripts. Documented: the name appears
in docs/*.md other than docs/benchmarks.md (a log of measurements, not the
place a knob is described). docs/env.md says where each group lives.

Fails listing each undocumented name with one file that reads it.
  tests/env_documented.py [REPO_ROOT]
"""
import os
import re
import sys

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), ".."))
C_EXT = (".c", ".h", ".cu", ".cuh", ".cpp")
SCRIPT_EXT = (".sh", ".py", ".bash")
C_NAME = re.compile(r'"(LLMEM_[A-Z0-9_]+)"')
SCRIPT_NAME = re.compile(r'\$\{(LLMEM_[A-Z0-9_]+):?[-+=?]'
                         r'|environ(?:\.get\(|\[)\s*["\'](LLMEM_[A-Z0-9_]+)'
                         r'|getenv\(\s*["\'](LLMEM_[A-Z0-9_]+)')
NOT_VARIABLES = re.compile(r"^LLMEM_(OK|E_[A-Z0-9_]+)$")


def walk(top):
    for d, dirs, files in os.walk(top):
        # build trees, git data, GPU carry copies and the docs are not sources
        dirs[:] = [x for x in dirs if x == ".ci" or not (
            x.startswith("build") or x.startswith(".") or x in ("docs", "__pycache__"))]
        for f in files:
            yield os.path.join(d, f)


read = {}  # name -> first file that reads it
me = os.path.abspath(__file__)
for path in sorted(walk(root)):
    if os.path.abspath(path) == me:
        continue
    if path.endswith(C_EXT):
        pat = C_NAME
    elif path.endswith(SCRIPT_EXT) or os.path.basename(os.path.dirname(path)) == ".ci":
        pat = SCRIPT_NAME
    else:
        continue
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        continue
    for m in pat.finditer(text):
        name = next(g for g in m.groups() if g) if m.groups() else m.group(1)
        if not NOT_VARIABLES.match(name):
            read.setdefault(name, os.path.relpath(path, root))

docs = ""
ddir = os.path.join(root, "docs")
for f in sorted(os.listdir(ddir)):
    if f.endswith(".md") and f != "benchmarks.md":
        docs += open(os.path.join(ddir, f), encoding="utf-8").read() + "\n"
documented = set(re.findall(r"LLMEM_[A-Z0-9_]+", docs))

if len(read) < 20:  # the scan itself broke (moved sources, a bad pattern)
    print(f"FAIL: only {len(read)} LLMEM_* names found under {root}")
    sys.exit(1)
missing = sorted(n for n in read if n not in documented)
for n in missing:
    print(f"FAIL: {n} (read in {read[n]}) is not documented in docs/ (docs/env.md says where)")
print(f"{len(read)} LLMEM_* environment names read, {len(missing)} undocumented")
sys.exit(1 if missing else 0)
