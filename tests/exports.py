#!/usr/bin/env python3
"""libllmem.so exports exactly its public API.

Usage: exports.py LIBLLMEM_SO INCLUDE_DIR

Lists the shared library's dynamic symbols (`nm -D --defined-only`) and
reads the declarations of the public headers (INCLUDE_DIR/*.h) with a small
C scanner of its own (comments and preprocessor lines dropped, file-scope
statements split at `;` and at brace bodies). A declaration is public when
it is a file-scope function or `extern` variable that is not `static`, not
a `typedef` and not marked hidden (`..._HIDDEN` macros: what plugin.h and
backend_impl.h declare for the plugin's own side). It checks that

  1. every exported symbol starts with llmem_ and is declared public in a
     header (nothing internal leaks: the library is built with
     -fvisibility=hidden, CMakeLists.txt);
  2. every public declaration is exported (no header lost its
     LLMEM_API_BEGIN / LLMEM_API_END, include/llmem/status.h).

Neither list comes from the build's own sources of truth: the symbols are
read from the linked file, the declarations from the header text.
"""
import glob
import os
import re
import subprocess
import sys


def strip_comments(text):
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def strip_preprocessor(text):
    """Drops preprocessor lines, the C++ `extern "C"` fences (#ifdef
    __cplusplus blocks) and the LLMEM_API_BEGIN / LLMEM_API_END markers."""
    out, cont, cplusplus = [], False, False
    for line in text.split("\n"):
        t = line.strip()
        if t.startswith("#ifdef __cplusplus"):
            cplusplus = True
        if cont or cplusplus or t.startswith("#"):
            if t.startswith("#endif"):
                cplusplus = False
            cont = line.rstrip().endswith("\\")
            out.append("")
        else:
            out.append(re.sub(r"\bLLMEM_API_(BEGIN|END)\b", " ", line))
    return "\n".join(out)


def statements(text):
    """File-scope statements: (head text, had a brace body)."""
    head, depth, body, i = [], 0, False, 0
    while i < len(text):
        c = text[i]
        if depth == 0 and c == ";":
            yield "".join(head), body
            head, body = [], False
        elif c == "{":
            if depth == 0:
                body = True
                h = "".join(head)
                fn_def = ")" in h and not re.search(r"\b(struct|union|enum)\b", h)
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and fn_def:  # a function definition ends at its brace
                yield h, True
                head, body = [], False
        elif depth == 0:
            head.append(c)
        i += 1


KEYWORDS = {"const", "volatile", "extern", "static", "inline", "unsigned", "signed",
            "struct", "union", "enum", "__attribute__", "sizeof"}


def public_names(header_dir):
    names = {}
    for path in sorted(glob.glob(os.path.join(header_dir, "*.h"))):
        text = strip_preprocessor(strip_comments(open(path, encoding="utf-8").read()))
        for stmt, body in statements(text):
            s = " ".join(stmt.split())
            if not s or re.search(r"\b(typedef|static)\b", s):
                continue  # types, and static inline helpers (not exported)
            if re.search(r"\b\w*_HIDDEN\b", s):
                continue  # a plugin's own hidden globals
            if body and re.match(r"^(struct|union|enum)\b", s):
                continue
            m = re.search(r"\b([A-Za-z_]\w*)\s*\(", s)
            if m and m.group(1) not in KEYWORDS and not re.search(r"\(\s*\*\s*$", s[:m.start()]):
                names[m.group(1)] = os.path.basename(path)
            elif s.startswith("extern ") and "(" not in s:
                ids = [t for t in re.findall(r"[A-Za-z_]\w*", re.sub(r"\[[^]]*\]", "", s))
                       if t not in KEYWORDS]
                if ids:
                    names[ids[-1]] = os.path.basename(path)
    return names


def exported(lib):
    try:
        out = subprocess.run(["nm", "-D", "--defined-only", "--format=posix", lib],
                             check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"exports: cannot list the dynamic symbols of {lib}: {e}")
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            syms[parts[0]] = parts[1]
    return syms


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lib, header_dir = sys.argv[1], sys.argv[2]
    public = public_names(header_dir)
    syms = exported(lib)
    bad = []
    # sanity of both scanners: the first functions a user calls
    for must in ("llmem_status_str", "llmem_backend_open", "llmem_kv_cache_create",
                 "llmem_memory_plan"):
        if must not in public:
            bad.append(f"the header scan missed {must} (scanner broken?)")
        if must not in syms:
            bad.append(f"{must} is not exported")
    for name in sorted(syms):
        if syms[name] in ("A", "U", "w", "v"):
            continue  # absolute (version nodes) and undefined/weak references
        if not name.startswith("llmem_"):
            bad.append(f"exported but internal (no llmem_ prefix): {name} ({syms[name]})")
        elif name not in public:
            bad.append(f"exported but not declared public in {header_dir}: {name}")
    for name in sorted(public):
        if name not in syms:
            bad.append(f"declared in {public[name]} but not exported: {name}")
    for b in bad:
        print(b)
    print(f"exports: {len(syms)} exported symbols, {len(public)} public declarations, "
          f"{len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
