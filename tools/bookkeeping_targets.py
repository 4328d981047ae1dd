#!/usr/bin/env python3
"""Issue 10's targets from `llmem bench --bookkeeping --json` runs.

Usage: tools/bookkeeping_targets.py RUN.json [RUN.json ...]

Each RUN.json is the output of `llmem bench --bookkeeping --json` (the
default grid; a run of a few cells, e.g. `--mem kv_cache,hybrid --seqs
1000,4000 --page 1`, checks only the targets whose cells it has).

Takes the median step time of each cell (memory, sequences, context, page
size) over the runs given, then checks the issue's targets: hybrid 1,000 x
128K at page 16 in at most 1 ms; 1K -> 128K context at most x1.5; 1,000 ->
4,000 sequences at most x4.5; page 1 within x2 of page 16. Prints each
target's count of cells met and every cell missed. Cells a run skipped
(over --max-gb) are left out. Runs that give step_max_ms (the bench's JSON
from book16 on) also name the cell whose longest step is the most times
its median step (the largest of each cell's max / median over the runs):
the token stages' step (memory/tok_stage.h) shows there. Cells of runs
with --seq-max above their sequence count are another configuration and
are left out (counted).

The 1,000 -> 4,000 target also counts the cells met in every run that has
both cells (each run's own ratio), and gives each missed or near (> x4.3)
cell's ratios over those runs as [lowest-highest]: a cell met only by the
median of runs that straddle x4.5 is not met with margin. The load of other
processes moves single runs on this 2-core machine; alternate builds and
give each at least three runs.
"""
import json
import statistics
import sys

K = 1024


def main(paths):
    cells, spikes, wide = {}, {}, 0
    runs = []  # per run: cell -> step_ms (the per-run ratios)
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            raise ValueError(f"{path}: no \"steps\" list")
        runs.append({})
        for x in data["steps"]:
            if "step_ms" in x and x.get("seq_max", x["seqs"]) > x["seqs"]:
                wide += 1  # another configuration (--seq-max): not the cells
            elif "step_ms" in x:
                key = (x["memory"], x["seqs"], x["ctx"], x["page"])
                cells.setdefault(key, []).append(x["step_ms"])
                runs[-1][key] = x["step_ms"]
                if "step_max_ms" in x and x["step_ms"] > 0:
                    q = x["step_max_ms"] / x["step_ms"]
                    if q > spikes.get(key, (0, 0))[0]:
                        spikes[key] = (q, x["step_max_ms"])
    m = {k: statistics.median(v) for k, v in cells.items()}
    print(f"{len(paths)} runs, {len(m)} cells" +
          (f" ({wide} cells with n_seq_max above their sequences left out)" if wide else ""))
    print("hybrid 1000 x 128K page 16: %s ms (target <= 1)" % m.get(("hybrid", 1000, 128 * K, 16)))

    def check(title, pairs, limit, near=None):
        met, seen, every, missed, close = 0, 0, 0, [], []
        for a, b in pairs:
            if a in m and b in m:
                q = m[b] / m[a]
                seen += 1
                # each run's own ratio, where the run has both cells
                qs = [r[b] / r[a] for r in runs if a in r and b in r and r[a] > 0]
                spread = f" [{min(qs):.2f}-{max(qs):.2f} over {len(qs)} runs]" if qs else ""
                every += bool(qs) and max(qs) <= limit
                if q <= limit:
                    met += 1
                    if near is not None and q > near:
                        close.append(f"{a} -> {b}: x{q:.2f}{spread}")
                else:
                    missed.append(f"{a} -> {b}: x{q:.2f}{spread}")
        tail = f" (in every run: {every})" if near is not None else ""
        print(f"{title}: met {met} of {seen}{tail}")
        for line in missed:
            print("   missed", line)
        for line in close:
            print("   near", line)

    mems = ("kv_cache", "recurrent", "hybrid")
    check("1K -> 128K context <= x1.5",
          [((mm, s, K, p), (mm, s, 128 * K, p)) for mm in mems for s in (250, 1000, 4000)
           for p in (1, 16, 64)], 1.5)
    check("1,000 -> 4,000 sequences <= x4.5",
          [((mm, 1000, c, p), (mm, 4000, c, p)) for mm in mems
           for c in (K, 8 * K, 64 * K, 128 * K) for p in (1, 16, 64)], 4.5, near=4.3)
    check("page 1 <= x2 page 16",
          [((mm, s, c, 16), (mm, s, c, 1)) for mm in ("kv_cache", "hybrid")
           for s in (250, 1000, 4000) for c in (K, 8 * K, 64 * K, 128 * K)], 2.0)
    if spikes:
        k, (q, mx) = max(spikes.items(), key=lambda kv: kv[1][0])
        print(f"longest step against its cell's median: {k} x{q:.1f} ({mx:.3f} ms)")


if __name__ == "__main__":
    args = sys.argv[1:]
    if any(a in ("-h", "--help") for a in args):
        print(__doc__.strip())
        sys.exit(0)
    if not args:
        sys.exit(__doc__)
    try:
        main(args)
    except BrokenPipeError:  # a reader such as head went away
        sys.exit(0)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"bookkeeping_targets: {e} (each argument: the JSON of a "
                 "`llmem bench --bookkeeping --json` run)")
