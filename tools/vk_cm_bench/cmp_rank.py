#!/usr/bin/env python3
"""cmp_rank.py H.TXT: the layouts of cmp_sweep.py (vk_cm_bench OUT/cmpsw >
H.TXT; build.sh) by the geometric mean of their time over the default's (every shape and precision the harness measured,
entries with err != 0 dropped); the last three lines are the best three
non-default layouts, as LLMEM_VULKAN_CMP_CFG values."""
import math
import re
import sys

CFG = {"r16": "256,2,4,4,16,2,132", "w2x2": "128,2,4,4,32,1,264", "w1x4": "128,1,4,4,32,1,264",
       "w4x1": "128,4,4,4,32,1,264", "w2x2r": "128,2,4,4,16,2,264", "s42": "256,2,4,2,32,1,264",
       "s24": "256,4,2,4,32,1,264", "t256": "256,4,4,4,16,1,132", "f28": "256,4,2,8,32,1,132"}
t, regs, last = {}, {}, None
for line in open(sys.argv[1]):
    if "[stats" in line:
        r = re.search(r"Register Count=(\d+)", line)
        last = r.group(1) if r else None
    g = re.match(r"(\S+)\s+\d+x\d+x\d+ split (\d+) depth \d+ raw \d+\s+([\d ]+)x([\d ]+)x([\d ]+)"
                 r"\s+slices\s+(\d+)\s+([\d.]+) ms .*err (\S+)", line)
    if not g:
        continue
    name, split = g.group(1), g.group(2)
    regs[name] = last
    shape = "x".join(x.strip() for x in g.group(3, 4, 5))
    ms, err = float(g.group(7)), g.group(8)
    print(f"{name} s{split} {shape} sl{g.group(6)} {ms:.4f}{'' if err == '0' else ' err ' + err}")
    if err != "0":
        continue
    d = t.setdefault(name, {})
    d[(split, shape)] = min(ms, d.get((split, shape), 1e9))
base = t.get("def", {})
score = []
for name, d in t.items():
    if name == "def":
        continue
    r = [math.log(d[key] / base[key]) for key in d if key in base]
    if r:
        score.append((math.exp(sum(r) / len(r)), name, len(r)))
        for key in sorted(d):
            if key in base:
                print(f"  {name} {key[0]} {key[1]} {d[key] / base[key]:.3f}")
score.sort()
for s, name, n in reversed(score[3:]):
    print(f"{name} {s:.3f} ({n}) regs {regs.get(name)}")
for s, name, n in reversed(score[:3]):
    print(f"{name} {CFG[name]} {s:.3f} ({n}) regs {regs.get(name)}")
