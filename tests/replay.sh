#!/usr/bin/env bash
# `llmem replay` under a deliberately small KV page budget: requests are
# preempted and recomputed, and every request's greedy output must equal its
# output when served alone (--n-seq-max 1, a large page budget, no prefix
# cache). Runs the built-in model (Bamba hybrid; as fast as possible and
# paced) and the llama fixture with a shared system prefix (prefix hits > 0).
#   tests/replay.sh LLMEM_BIN [BACKEND]
set -euo pipefail
bin="$1"; backend="${2:-cpu}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
data="$here/../shared/data"

# The trace: the Azure copy beside the repository, else a synthetic one in
# the same format (so the test runs without ../shared).
trace="$data/azure_llm_inference_conv_2023.csv"
if [ ! -r "$trace" ]; then
  trace="$tmp/trace.csv"
  python3 - "$trace" <<'EOF'
import random, sys
rng = random.Random(7)
with open(sys.argv[1], "w") as f:
    f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    for i in range(16):
        f.write("2023-11-16 18:15:%02d.%07d,%d,%d\n" % (i, rng.randrange(10**7),
                rng.randrange(50, 2000), rng.randrange(20, 400)))
EOF
fi
text="$data/tinyshakespeare.txt"
[ -r "$text" ] || text="$here/docs/replay.md"

n=16; scale=0.2; maxc=40; maxg=40
slice=(--backend "$backend" --trace "$trace" --text "$text" --limit $n --scale $scale
       --max-context $maxc --max-gen $maxg)

# check LABEL PREFIX WANT_HITS -- TIGHT_OPTIONS...
check() {
  local label="$1" prefix="$2" want_hits="$3"; shift 4
  local model=()
  [ -n "${MODEL:-}" ] && model=(--model "$MODEL")
  "$bin" replay "${slice[@]}" ${model[@]+"${model[@]}"} --system-prefix "$prefix" --check --poison \
    --json "$tmp/tight.json" --output "$tmp/tight.jsonl" "$@" > "$tmp/tight.txt"
  "$bin" replay "${slice[@]}" ${model[@]+"${model[@]}"} --system-prefix "$prefix" --n-seq-max 1 \
    --n-pages 64 --page-size 16 --no-prefix-cache --output "$tmp/alone.jsonl" > /dev/null
  printf '%-44s ' "$label"
  python3 - "$trace" "$tmp/tight.json" "$tmp/tight.jsonl" "$tmp/alone.jsonl" \
    "$n" "$scale" "$maxc" "$maxg" "$prefix" "$want_hits" <<'EOF'
import csv, json, math, sys
trace, rep_path, tight_path, alone_path = sys.argv[1:5]
n, scale, maxc, maxg, prefix, want_hits = (int(sys.argv[5]), float(sys.argv[6]),
    int(sys.argv[7]), int(sys.argv[8]), int(sys.argv[9]), sys.argv[10] == "1")
def scaled(v, cap):
    return min(max(1, math.floor(v * scale + 0.5)), cap)
rows = list(csv.DictReader(open(trace)))[:n]
want_gen = [scaled(int(r["GeneratedTokens"]), maxg) for r in rows]
want_prompt = sum(prefix + scaled(int(r["ContextTokens"]), maxc) for r in rows)
def load(path):
    out = [json.loads(l) for l in open(path)]
    assert [o["request"] for o in out] == list(range(n)), path + ": requests 0..n-1 in order"
    return [o["tokens"] for o in out]
tight, alone = load(tight_path), load(alone_path)
for i in range(n):
    assert len(alone[i]) == want_gen[i], f"request {i}: {len(alone[i])} tokens, want {want_gen[i]}"
    assert all(0 <= t < 256 for t in alone[i]), f"request {i}: token outside the vocabulary"
    assert tight[i] == alone[i], \
        f"request {i}: batched output differs from alone:\n {tight[i]}\n {alone[i]}"
rep = json.load(open(rep_path))
assert rep["requests"] == n, rep["requests"]
assert rep["generated_tokens"] == sum(want_gen), (rep["generated_tokens"], sum(want_gen))
assert rep["prompt_tokens"] == want_prompt, (rep["prompt_tokens"], want_prompt)
assert rep["preemptions"] > 0, "the small page budget caused no preemption"
assert rep["pages_peak"] <= rep["pages_total"]
# every token is computed once (the last generated one is never fed), plus
# recomputation after preemption, minus what the prefix cache served
want_computed = (want_prompt + sum(want_gen) - n + rep["recomputed_tokens"]
                 - rep["prefix_hit_tokens"])
assert rep["computed_tokens"] == want_computed, (rep["computed_tokens"], want_computed)
if want_hits:
    assert rep["prefix_hit_tokens"] > 0 and rep["prefix_hit_rate"] > 0, "no prefix-cache hits"
print(f"ok: {n} requests equal alone; {rep['preemptions']} preemptions, "
      f"{rep['prefix_hit_tokens']} prefix-hit tokens "
      f"({rep.get('host_tier_hits', 0)} pages from the host tier), "
      f"peak {rep['pages_peak']}/{rep['pages_total']} pages")
EOF
}

MODEL= check "built-in, 32 pages of 4, ubatch 16" 0 0 -- --page-size 4 --n-pages 32 --n-ubatch 16
MODEL= check "built-in, 40 pages of 4, paced x50" 0 0 -- --page-size 4 --n-pages 40 --pace \
  --pace-speedup 50
MODEL="$here/tests/fixtures/llama" check "llama, system prefix 40, 48 pages of 4" 40 1 -- \
  --page-size 4 --n-pages 48 --n-ubatch 24
# the KV host tier (issue 13 item 3): evicted pages come back on hits,
# outputs still equal alone (under --poison)
LLMEM_HOST_TIER_MB=1 MODEL= check "built-in, 40 pages of 4, paced, host tier" 0 1 -- \
  --page-size 4 --n-pages 40 --pace --pace-speedup 50

# Hybrid prefix reuse (issue 13): with recurrent snapshots on, the built-in
# hybrid's prefix hit rate is within 5 points of the attention-only llama
# fixture's on the same workload (a shared system prefix; conversations of
# several turns), at page sizes 16 and 1, and its outputs equal its
# cache-off outputs.
hybrid_hits() {
  local ps="$1"; shift
  local w=(--backend "$backend" --trace "$trace" --text "$text" --limit 16 --scale 0.2
           --max-context 40 --max-gen 16 --page-size "$ps" "$@")
  LLMEM_SNAPSHOTS=64:16 "$bin" replay "${w[@]}" --poison --json "$tmp/hy.json" \
    --output "$tmp/hy.jsonl" > /dev/null
  "$bin" replay "${w[@]}" --no-prefix-cache --output "$tmp/hy_off.jsonl" > /dev/null
  "$bin" replay "${w[@]}" --model "$here/tests/fixtures/llama" --json "$tmp/ll.json" > /dev/null
  printf '%-44s ' "hybrid prefix reuse, pages of $ps $*"
  python3 - "$tmp/hy.json" "$tmp/ll.json" "$tmp/hy.jsonl" "$tmp/hy_off.jsonl" <<'PY'
import json, sys
hy, ll = (json.load(open(p)) for p in sys.argv[1:3])
on, off = (open(p).read() for p in sys.argv[3:5])
assert on == off, "hybrid outputs with the cache differ from cache-off outputs"
h, l = 100 * hy["prefix_hit_rate"], 100 * ll["prefix_hit_rate"]
assert h > 0, "the hybrid got no prefix hits"
assert abs(h - l) <= 5, f"hybrid hit rate {h:.1f}% vs llama {l:.1f}%: more than 5 points apart"
print(f"ok: hybrid {h:.1f}% vs llama {l:.1f}% of prompt tokens, outputs equal cache-off")
PY
}
hybrid_hits 16 --system-prefix 64
hybrid_hits 1 --system-prefix 64
# multi-turn (issue 13 items 2, 7): conversations of 4 turns, each extending the last
hybrid_hits 16 --turns 4
hybrid_hits 1 --turns 4

# One device budget for cached pages and snapshots (issue 13 item 1,
# --prefix-cache-mb): 4 MiB holds 6 snapshots of the built-in hybrid
# (555,008 bytes each) or 256 pages of 16 tokens (16,384 bytes), fewer than
# the run publishes, so both kinds are evicted (least recently used
# together); --check verifies after every step that the cached bytes stay
# within it (llmem_memory_check), and the outputs equal cache-off.
budget_hits() {
  local w=(--backend "$backend" --trace "$trace" --text "$text" --limit 16 --scale 0.2
           --max-context 40 --max-gen 16 --page-size 16 --turns 4)
  "$bin" replay "${w[@]}" --prefix-cache-mb 4 --check --poison --json "$tmp/pb.json" \
    --output "$tmp/pb.jsonl" > /dev/null
  "$bin" replay "${w[@]}" --no-prefix-cache --output "$tmp/pb_off.jsonl" > /dev/null
  printf '%-44s ' "device prefix budget of 4 MiB"
  python3 - "$tmp/pb.json" "$tmp/pb.jsonl" "$tmp/pb_off.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
on, off = (open(p).read() for p in sys.argv[2:4])
assert on == off, "outputs under the budget differ from cache-off outputs"
budget = 4 * 1048576
assert r["prefix_cache_bytes"] == budget, r["prefix_cache_bytes"]
assert r["cached_kv_bytes"] + r["snapshot_bytes"] <= budget, (r["cached_kv_bytes"], r["snapshot_bytes"])
assert r["snapshot_bytes"] == r["snapshots"] * 555008, (r["snapshots"], r["snapshot_bytes"])
assert r["prefix_hit_tokens"] > 0, "no prefix hits under the budget"
assert r["snapshot_evictions"] > 0 and r["prefix_evictions"] > 0, \
    (r["snapshot_evictions"], r["prefix_evictions"])
print(f"ok: {r['prefix_hit_tokens']} hit tokens, evicted {r['prefix_evictions']} pages and "
      f"{r['snapshot_evictions']} snapshots, outputs equal cache-off")
PY
}
budget_hits

# A request admitted with a small leftover budget still takes the whole
# cached prefix (the scheduler's first chunk covers it): with ubatch 64 and a
# 64-token system prefix, request 0 computes the prefix alone in step 1 and
# publishes it (4 pages of 16, a snapshot at 64); every later request is
# admitted behind request 0's remaining prompt, with less than 64 tokens of
# budget left, and must still hit all 64 prefix tokens. Outputs equal the
# cache-off run.
first_chunk_hits() {
  local label="$1"; shift
  local w=(--backend "$backend" --trace "$trace" --text "$text" --limit 16 --scale 0.2
           --max-context 40 --max-gen 8 --page-size 16 --n-ubatch 64 --system-prefix 64 "$@")
  "$bin" replay "${w[@]}" --check --poison --json "$tmp/fc.json" --output "$tmp/fc.jsonl" > /dev/null
  "$bin" replay "${w[@]}" --no-prefix-cache --output "$tmp/fc_off.jsonl" > /dev/null
  printf '%-44s ' "first chunk covers cached prefix, $label"
  python3 - "$tmp/fc.json" "$tmp/fc.jsonl" "$tmp/fc_off.jsonl" <<'PY'
import json, sys
rep = json.load(open(sys.argv[1]))
on, off = (open(p).read() for p in sys.argv[2:4])
assert on == off, "outputs with the cache differ from cache-off outputs"
want = 64 * (16 - 1)
assert rep["preemptions"] == 0, rep["preemptions"]
assert rep["prefix_hit_tokens"] >= want, \
    f"{rep['prefix_hit_tokens']} prefix-hit tokens, want >= {want} (64 per request after the first)"
print(f"ok: {rep['prefix_hit_tokens']} prefix-hit tokens (>= {want}), outputs equal cache-off")
PY
}
first_chunk_hits "built-in hybrid"
first_chunk_hits "llama" --model "$here/tests/fixtures/llama"
