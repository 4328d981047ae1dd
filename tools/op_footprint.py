#!/usr/bin/env python3
"""Which files of the tree name an op family, and whether any of them is shared.

An open op (<llmem/ops_impl.h>, "Open ops") lives in files of its own: an
op header, the wrapper file, one kernel file per backend (plus CUDA/GLSL
kernel sources). Nothing else of the library, the backends or the build
should need to name it: that is what "adding an op touches no shared file"
means (docs/adding-a-cache-type.md). This script checks it from the code.

Families are found from their op headers (include/llmem/ops_<family>.h
that define an LLMEM_OP_TAG id), so a new op needs no line here. For each
family it scans every source file (C, CUDA, GLSL, CMake) of the
tree, with comments stripped, for the family's identifiers, and sorts the
files that name one:
  own       the family's files (by file name, whether or not they name it),
  consumer  code that calls the op: models/, examples/, tests/, tools/,
  shared    everything else: include/, base/, memory/, backends/, kernels/,
            shaders/, CMake files, scripts/.
It exits 1 when a shared file names a family (and says which), else 0.

  tools/op_footprint.py [--root DIR] [--headers-from DIR] [FAMILY ...]
(default: every family). E.g. the tree before open ops:
  git worktree add /tmp/old 7b0eb44 && tools/op_footprint.py --root /tmp/old --headers-from .
"""
import argparse
import os
import re
import sys

def families(root):
    """Every open-op family, found from its op header include/llmem/ops_<fam>.h
    (each header that defines an LLMEM_OP_TAG id): {fam: (own-file regex,
    identifier regex)}. Own files are those whose name ends in _<x> or is <x>,
    for x the family or one of its ops (ops_gdn.c, cuda_ops_gdn.c, gdn.cu,
    sigmoid_mul.comp); identifiers are the header's op ids, wrappers,
    implementation types, layouts and parameter structs, and the backends'
    names for them (*_op_<op>, cuk_<op>*, VK_SH_<OP>*, <op>.comp, <fam>.cu,
    kernels/<fam>.h, ops_<fam>.h)."""
    out = {}
    inc = os.path.join(root, "include", "llmem")
    for f in sorted(os.listdir(inc)):
        m = re.fullmatch(r"ops_(\w+)\.h", f)
        if not m or m.group(1) == "impl":
            continue
        with open(os.path.join(inc, f), encoding="utf-8") as fh:
            text = strip_comments(f, fh.read())
        ids = re.findall(r"#define\s+(LLMEM_OP_\w+)\s+LLMEM_OP_TAG\b", text)
        if not ids:
            continue
        fam = m.group(1)
        ops = sorted(set(re.findall(r"\bllmem_op_(\w+?)(?:_fn)?\s*\(", text)) |
                     set(re.findall(r"\(\*llmem_op_(\w+?)_fn\)", text)))
        params = re.findall(r"\}\s*(llmem_\w+_params)\s*;", text)
        names = sorted(set(ops) | {fam})
        alt = "|".join(re.escape(x) for x in names)
        ALT = "|".join(re.escape(x.upper()) for x in names)
        ident = [r"\b(" + "|".join(re.escape(i) for i in ids) + r")\w*\b",
                 r"\bllmem_op_(" + alt + r")\w*\b",
                 r"\b\w+_op_(" + alt + r")\b",
                 r"\bcuk_(" + alt + r")\w*\b",
                 r"\bVK_SH_(" + ALT + r")\w*\b",
                 r"\b(" + alt + r")\.(comp|cu)\b",
                 r"kernels/(" + alt + r")\.h", r"ops_" + re.escape(fam) + r"\.h"]
        if params:
            ident.append(r"\b(" + "|".join(re.escape(x) for x in params) + r")\b")
        own = r"(^|/)([\w]*_)?(" + alt + r")\.(c|h|cu|cuh|comp)$"
        out[fam] = (own, "|".join(ident))
    return out


SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".comp", ".glsl", ".cmake")
SKIP_DIRS = {".git", "fixtures", "__pycache__"}
CONSUMERS = ("models/", "examples/", "tests/", "tools/", "docs/")


def strip_comments(path, text):
    """Code without its comments (C-like: // and /* */; CMake: #)."""
    if path.endswith(".cmake") or os.path.basename(path) == "CMakeLists.txt":
        return "\n".join(re.sub(r"#.*", "", line) for line in text.splitlines())
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def sources(root):
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = sorted(x for x in dirs
                         if x not in SKIP_DIRS and not x.startswith("build")
                         and not x.startswith("."))
        for f in sorted(files):
            if f.endswith(SOURCE_EXT) or f == "CMakeLists.txt":
                yield os.path.normpath(os.path.join(rel, f))


def footprint(root, own_re, ident_re):
    own, consumer, shared = [], [], []
    ident = re.compile(ident_re)
    ownp = re.compile(own_re)
    for rel in sources(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            code = strip_comments(rel, fh.read())
        if ownp.search(rel):
            own.append(rel)
        elif not ident.search(code):
            continue
        elif rel.startswith(CONSUMERS):
            consumer.append(rel)
        else:
            shared.append(rel)
    return own, consumer, shared


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--headers-from", metavar="DIR",
                    help="read the op headers from this tree instead of --root "
                         "(to measure an older tree, which lacks them)")
    ap.add_argument("families", nargs="*")
    a = ap.parse_args()
    fams = families(a.headers_from or a.root)
    if not fams:
        print("op_footprint: no op header include/llmem/ops_<family>.h defines an op tag")
        return 1
    bad = 0
    for fam in a.families or sorted(fams):
        if fam not in fams:
            print(f"op_footprint: unknown family {fam} (known: {', '.join(sorted(fams))})")
            return 2
        own, consumer, shared = footprint(a.root, *fams[fam])
        print(f"{fam}: {len(own)} own, {len(consumer)} consumer, {len(shared)} shared file(s)")
        for kind, files in (("own", own), ("consumer", consumer), ("shared", shared)):
            for f in files:
                print(f"  {kind:9s}{f}")
        if not own:
            print(f"op_footprint: {fam}: no own file names it (the pattern is stale)")
            bad = 1
        if shared:
            print(f"op_footprint: {fam}: shared files name it (an open op should need none)")
            bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
