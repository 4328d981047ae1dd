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

Around that:
- `llmem --help` exits 0 and lists exactly the commands main.c dispatches
  (strcmp(cmd, "NAME")); those listed are the commands checked.
- Short options: a letter counts as accepted when `llmem CMD ZZZ -X` does
  not answer "unknown option"; each accepted letter must be listed ("-X,
  --name") or named (-X) in --help, each listed one accepted, and each
  listed pair must be one option in the sources ({"name", ..., 'X'}); serve's "-np, --parallel" is checked as a
  word (serve maps it to --parallel itself).
- Environment: every LLMEM_* variable a --help text names is read by some
  C source of the tree (a "LLMEM_..." string), and every one the command
  line's sources (examples/cli/*.c) read is named in some --help text.
- `llmem bench --bookkeeping` parses its own arguments (strcmp on argv):
  the --names its --help gives are exactly those its parser compares.
"""
import glob
import os
import re
import subprocess
import sys

MAIN_LISTED = re.compile(r"^  ([a-z]+)\s{2,}\S", re.M)
DISPATCH = re.compile(r'strcmp\(cmd, "([a-z]+)"\)')
SHORT_LISTED = re.compile(r"^\s{1,8}-([a-zA-Z]{1,2}), --([a-z0-9][a-z0-9-]*)", re.M)
SHORT_DECL = re.compile(r'\{"([a-z0-9][a-z0-9-]*)",\s*(?:no|required|optional)_argument,\s*NULL,\s*\'(.)\'\}')
ENV = re.compile(r"\b(LLMEM_[A-Z0-9_]+)")
C_ENV = re.compile(r'"(LLMEM_[A-Z0-9_]+)"')
BK_PARSED = re.compile(r'strcmp\(a, "--([a-z0-9][a-z0-9-]*)"\)')
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
DECL = re.compile(r'\{"([a-z0-9][a-z0-9-]*)",\s*(?:no|required|optional)_argument')
LISTED = re.compile(r"^\s{1,8}(?:-[a-zA-Z]+, )?--([a-z0-9][a-z0-9-]*)", re.M)


def run(binary, args):
    r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout + r.stderr


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def tree_c_sources(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if not (x.startswith("build") or x.startswith("."))]
        for f in files:
            if f.endswith((".c", ".h", ".cu", ".cuh", ".cpp")):
                yield os.path.join(d, f)


def check_commands(binary, root):
    """llmem --help's commands against main.c's dispatch; returns (commands, help text, fail)."""
    rc, text = run(binary, ["--help"])
    listed = MAIN_LISTED.findall(text.split("commands:", 1)[-1])
    dispatched = set(DISPATCH.findall(read(os.path.join(root, "examples/cli/main.c"))))
    fail = 0
    if rc != 0:
        print(f"FAIL: llmem --help exits {rc}"); fail = 1
    if set(listed) != dispatched or len(listed) < 5:
        print(f"FAIL: llmem --help lists {sorted(listed)}, main.c runs {sorted(dispatched)}"); fail = 1
    else:
        print(f"ok: llmem --help lists the {len(listed)} commands main.c runs")
    return listed, text, fail


def check_short(binary, cmd, text, decl_short):
    """The letters `llmem cmd` accepts against the "-X, --name" lines of its --help."""
    fail = 0
    pairs = SHORT_LISTED.findall(text)
    listed = {x for x, _ in pairs if len(x) == 1}
    accepted = {x for x in LETTERS if "unknown option" not in run(binary, [cmd, "ZZZ", "-" + x])[1]}
    for x, name in pairs:
        if len(x) > 1:  # a word such as serve's -np
            if "unknown option" in run(binary, [cmd, "ZZZ", "-" + x])[1]:
                print(f"FAIL: llmem {cmd} --help lists -{x}, which it refuses"); fail = 1
        elif decl_short.get(name) != x:
            print(f"FAIL: llmem {cmd} --help pairs -{x} with --{name}; the sources give --{name} "
                  f"{'-' + decl_short[name] if name in decl_short else 'no short option'}"); fail = 1
    named = set(re.findall(r"(?<![\w-])-([a-zA-Z])(?![\w-])", text)) | listed
    if not accepted <= named or not listed <= accepted:
        print(f"FAIL: llmem {cmd}: short options accepted {sorted(accepted)}, listed {sorted(listed)}, "
              f"named {sorted(named)}")
        fail = 1
    return fail, len(accepted)


def check_env(root, helps):
    """LLMEM_* names in the help texts against the sources that read them."""
    named = set(ENV.findall("".join(helps)))
    read_tree = set()
    for path in tree_c_sources(root):
        read_tree |= set(C_ENV.findall(read(path)))
    cli = set()
    for path in glob.glob(os.path.join(root, "examples/cli/*.c")):
        cli |= set(C_ENV.findall(read(path)))
    stale, unnamed = sorted(named - read_tree), sorted(cli - named)
    if stale:
        print(f"FAIL: --help names variables no source reads: {stale}")
    if unnamed:
        print(f"FAIL: the command line reads variables no --help names: {unnamed}")
    if not stale and not unnamed:
        print(f"ok: the {len(named)} variables the help texts name are read, and the "
              f"{len(cli)} the command line reads are named")
    return 1 if stale or unnamed else 0


def check_bookkeeping(binary, root):
    rc, text = run(binary, ["bench", "--bookkeeping", "--help"])
    documented = set(re.findall(r"--([a-z0-9][a-z0-9-]*)", text)) - {"help", "bookkeeping"}
    parsed = set(BK_PARSED.findall(read(os.path.join(root, "examples/cli/bench_bookkeeping.c"))))
    parsed -= {"bookkeeping"}
    if rc != 0 or documented != parsed or len(parsed) < 3:
        print(f"FAIL: llmem bench --bookkeeping --help (exit {rc}) names {sorted(documented)}, "
              f"its parser takes {sorted(parsed)}")
        return 1, text
    print(f"ok: llmem bench --bookkeeping: the {len(parsed)} options its parser takes, each named")
    return 0, text


def main():
    binary, root = sys.argv[1], sys.argv[2]
    src = "".join(read(f) for f in sorted(glob.glob(os.path.join(root, "examples/cli/*.c"))))
    candidates = sorted(set(DECL.findall(src)))
    if len(candidates) < 20:
        print(f"only {len(candidates)} options found in examples/cli: the pattern is stale")
        return 1
    decl_short = dict(SHORT_DECL.findall(src))
    commands, main_help, fail = check_commands(binary, root)
    helps = [main_help]
    for cmd in commands:
        rc, text = run(binary, [cmd, "--help"])
        helps.append(text)
        if rc != 0:
            print(f"FAIL: llmem {cmd} --help exits {rc}"); fail = 1
        f, n_short = check_short(binary, cmd, text, decl_short)
        fail |= f
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
        if not unlisted and not refused and not f:
            print(f"ok: llmem {cmd}: {len(accepted)} options accepted, each documented; "
                  f"{len(listed)} listed, each accepted; {n_short} short ones, each documented")
    f, bk_help = check_bookkeeping(binary, root)
    fail |= f
    fail |= check_env(root, helps + [bk_help])
    return fail


if __name__ == "__main__":
    sys.exit(main())
