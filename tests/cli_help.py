#!/usr/bin/env python3
"""Each `llmem <command> --help` lists exactly the options the command accepts.

usage: cli_help.py LLMEM_BIN REPO_ROOT

The candidates are every long option any command declares (the
{"name", no|required|optional_argument, ...} entries of examples/cli/*.c).
For each command, a candidate counts as accepted when
`llmem CMD ZZZ --NAME` does not answer "unknown option" (ZZZ, a stray
argument, stops the command once its options are read, so nothing runs);
a candidate that is only an abbreviation of a documented option
(getopt_long accepts unique prefixes) is not counted. Listed options are
those at the start of a help line ("  -x, --name" or "  --name"); an
accepted one must be listed or at least named (--name) in the text. Fails,
naming them, when an accepted option is not documented or a listed one is
refused, and when `--help` does not exit 0 or a stray argument beside an
accepted option does not exit 2.
"""
import glob
import os
import re
import subprocess
import sys

COMMANDS = ["generate", "score", "replay", "serve", "bench", "tokenize", "info"]
DECL = re.compile(r'\{"([a-z0-9][a-z0-9-]*)",\s*(?:no|required|optional)_argument')
LISTED = re.compile(r"^\s{1,8}(?:-[a-zA-Z]+, )?--([a-z0-9][a-z0-9-]*)", re.M)


def run(binary, args):
    r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout + r.stderr


def main():
    binary, root = sys.argv[1], sys.argv[2]
    src = "".join(open(f).read() for f in sorted(glob.glob(os.path.join(root, "examples/cli/*.c"))))
    candidates = sorted(set(DECL.findall(src)))
    if len(candidates) < 20:
        print(f"only {len(candidates)} options found in examples/cli: the pattern is stale")
        return 1
    fail = 0
    for cmd in COMMANDS:
        rc, text = run(binary, [cmd, "--help"])
        if rc != 0:
            print(f"FAIL: llmem {cmd} --help exits {rc}"); fail = 1
        listed = set(LISTED.findall(text))
        named = set(re.findall(r"--([a-z0-9][a-z0-9-]*)", text)) | listed
        accepted = set()
        for name in candidates:
            rc, out = run(binary, [cmd, "ZZZ", "--" + name])
            if "unknown option" in out:
                continue
            if rc != 2 and name != "help":
                print(f"FAIL: llmem {cmd} ZZZ --{name} exits {rc}, not 2: {out[:200]}"); fail = 1
            if name not in named and any(o.startswith(name) for o in named):
                continue  # getopt's abbreviation of a listed option
            accepted.add(name)
        unlisted, refused = sorted(accepted - named), sorted(listed - accepted)
        if unlisted:
            print(f"FAIL: llmem {cmd} accepts options its --help does not list: {unlisted}"); fail = 1
        if refused:
            print(f"FAIL: llmem {cmd} --help lists options it refuses: {refused}"); fail = 1
        if not unlisted and not refused:
            print(f"ok: llmem {cmd}: {len(accepted)} options accepted, each documented; "
                  f"{len(listed)} listed, each accepted")
    return fail


if __name__ == "__main__":
    sys.exit(main())
