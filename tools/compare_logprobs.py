#!/usr/bin/env python3
"""Compares `llmem score` output with reference log-probs (tests/fixtures/*/reference.jsonl).

usage: compare_logprobs.py REFERENCE.jsonl SCORED.jsonl [--tol 1e-3] [--ppl-rel 0.005] [--subset]
Prints the max |delta log-prob| and both perplexities; exits 1 when a case is
missing, a length differs, max |delta| > tol, or (with --ppl-rel) the
perplexities differ by more than that relative amount. With --subset the
scored file may hold only some of the reference's cases (at least one);
those are compared.
"""
import json
import math
import sys


def load(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                o = json.loads(line)
                out[json.dumps(o["id"])] = o["logprobs"]
    return out


def main():
    args = sys.argv[1:]
    tol, ppl_rel, subset = 1e-3, None, False
    if "--subset" in args:
        args.remove("--subset"); subset = True
    if "--tol" in args:
        i = args.index("--tol"); tol = float(args[i + 1]); del args[i:i + 2]
    if "--ppl-rel" in args:
        i = args.index("--ppl-rel"); ppl_rel = float(args[i + 1]); del args[i:i + 2]
    ref, got = load(args[0]), load(args[1])
    if subset:
        extra = [k for k in got if k not in ref]
        if extra or not got:
            print(f"scored cases not in the reference: {extra}" if extra else "no scored cases"); return 1
        ref = {k: v for k, v in ref.items() if k in got}
    worst, worst_id, n, sr, sg = 0.0, None, 0, 0.0, 0.0
    for k, r in ref.items():
        if k not in got:
            print(f"missing case {k}"); return 1
        g = got[k]
        if len(g) != len(r):
            print(f"case {k}: {len(g)} log-probs, expected {len(r)}"); return 1
        for a, b in zip(r, g):
            if b is None or not math.isfinite(b):
                print(f"case {k}: non-finite log-prob"); return 1
            d = abs(a - b)
            if d > worst:
                worst, worst_id = d, k
            n += 1; sr += a; sg += b
    ppl_r = math.exp(-sr / max(n, 1)); ppl_g = math.exp(-sg / max(n, 1))
    rel = abs(ppl_g - ppl_r) / ppl_r
    print(f"cases {len(ref)}, log-probs {n}, max |delta| {worst:.3e} (case {worst_id}), "
          f"perplexity ref {ppl_r:.5f} llmem {ppl_g:.5f} (rel {rel:.2e})")
    if worst > tol:
        print(f"FAIL: max |delta| {worst:.3e} > {tol}"); return 1
    if ppl_rel is not None and rel > ppl_rel:
        print(f"FAIL: perplexity differs by {rel:.2e} > {ppl_rel}"); return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
