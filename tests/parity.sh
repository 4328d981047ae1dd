#!/usr/bin/env bash
# Parity of `llmem score` with transformers (float64 reference log-probs in
# tests/fixtures/<name>/reference.jsonl), over page sizes, ubatch sizes,
# a small --n-seq-max that forces queuing, prefix cache on and off, poison.
#   tests/parity.sh LLMEM_BIN FIXTURE_DIR [BACKEND] [full|lite|quick]
# full  (cpu):    pages of 1, 16, 64 x ubatches of 1, 7, 512 (n-seq-max 3,
#                 poison), no prefix cache, n-seq-max 1: every case each run.
# lite  (vulkan on lavapipe, where every submit is slow): pages of 1 and 16
#                 at ubatch 512 over every case, ubatch 7 (chunked prompts,
#                 pages crossed mid-ubatch) over the first 9 cases (1 to 65
#                 tokens), all with n-seq-max 3 and poison; no prefix cache.
# quick:          pages of 16, ubatch 512, poison.
# fused:          pages of 16, ubatch 1, n-seq-max 1, poison over the first 9
#                 cases: every ubatch is one token, so a device backend with
#                 llmem_op_norm_matmul runs the fused decode path
#                 (models/forward.c) throughout; then 24 greedy tokens of
#                 `llmem generate` with recorded steps (the default) must
#                 equal those of eager steps (LLMEM_NO_GRAPHS=1).
set -euo pipefail
bin="$1"; fx="$2"; backend="${3:-cpu}"; mode="${4:-full}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
input="$fx/cases.jsonl"
run() { # label, extra options...
  local label="$1"; shift
  "$bin" score --model "$fx" --input "$input" --backend "$backend" --kv-type f32 "$@" \
    > "$tmp/out.jsonl"
  printf '%-48s ' "$label"
  python3 "$here/tools/compare_logprobs.py" "$fx/reference.jsonl" "$tmp/out.jsonl" --tol 1e-3 \
    $([ "$input" = "$fx/cases.jsonl" ] || echo --subset)
}
if [ "$mode" = quick ]; then
  run "page 16, ubatch 512" --page-size 16 --n-ubatch 512 --poison
  exit 0
fi
if [ "$mode" = fused ]; then
  head -n 9 "$fx/cases.jsonl" > "$tmp/first9.jsonl"; input="$tmp/first9.jsonl"
  run "page 16, ubatch 1, n-seq-max 1, poison (9 cases)" --page-size 16 --n-ubatch 1 --n-seq-max 1 --poison
  gen=(generate --model "$fx" --backend "$backend" --prompt-ids "1 2 3 4" -n 24 --temp 0 --precision precise)
  "$bin" "${gen[@]}" > "$tmp/recorded.txt"
  LLMEM_NO_GRAPHS=1 "$bin" "${gen[@]}" > "$tmp/eager.txt"
  if ! cmp -s "$tmp/recorded.txt" "$tmp/eager.txt"; then
    echo "greedy 24 tokens: recorded steps differ from eager steps" >&2
    exit 1
  fi
  echo "greedy 24 tokens: recorded steps equal eager steps"
  exit 0
fi
if [ "$mode" = lite ]; then
  for ps in 1 16; do
    run "page $ps, ubatch 512, n-seq-max 3, poison" --page-size "$ps" --n-ubatch 512 --n-seq-max 3 --poison
  done
  head -n 9 "$fx/cases.jsonl" > "$tmp/first9.jsonl"; input="$tmp/first9.jsonl"
  run "page 16, ubatch 7, n-seq-max 3, poison (9 cases)" --page-size 16 --n-ubatch 7 --n-seq-max 3 --poison
  input="$fx/cases.jsonl"
  run "page 16, ubatch 512, no prefix cache" --page-size 16 --n-ubatch 512 --no-prefix-cache
  exit 0
fi
for ps in 1 16 64; do
  for ub in 1 7 512; do
    run "page $ps, ubatch $ub, n-seq-max 3, poison" --page-size "$ps" --n-ubatch "$ub" --n-seq-max 3 --poison
  done
done
run "page 16, ubatch 512, no prefix cache" --page-size 16 --n-ubatch 512 --no-prefix-cache
run "page 16, ubatch 64, n-seq-max 1" --page-size 16 --n-ubatch 64 --n-seq-max 1
