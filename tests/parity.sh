#!/usr/bin/env bash
# Parity of `llmem score` with transformers (float64 reference log-probs in
# tests/fixtures/<name>/reference.jsonl), over page sizes, ubatch sizes,
# a small --n-seq-max that forces queuing, prefix cache on and off, poison.
#   tests/parity.sh LLMEM_BIN FIXTURE_DIR [BACKEND] [full|lite|quick]
# lite skips --n-ubatch 1 (one submit per token is slow on lavapipe).
set -euo pipefail
bin="$1"; fx="$2"; backend="${3:-cpu}"; mode="${4:-full}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
run() { # label, extra options...
  local label="$1"; shift
  "$bin" score --model "$fx" --input "$fx/cases.jsonl" --backend "$backend" --kv-type f32 "$@" \
    > "$tmp/out.jsonl"
  printf '%-48s ' "$label"
  python3 "$here/tools/compare_logprobs.py" "$fx/reference.jsonl" "$tmp/out.jsonl" --tol 1e-3
}
if [ "$mode" = quick ]; then
  run "page 16, ubatch 512" --page-size 16 --n-ubatch 512 --poison
  exit 0
fi
for ps in 1 16 64; do
  ubs="1 7 512"; [ "$mode" = lite ] && ubs="7 512"
  for ub in $ubs; do
    run "page $ps, ubatch $ub, n-seq-max 3, poison" --page-size "$ps" --n-ubatch "$ub" --n-seq-max 3 --poison
  done
done
run "page 16, ubatch 512, no prefix cache" --page-size 16 --n-ubatch 512 --no-prefix-cache
run "page 16, ubatch 64, n-seq-max 1" --page-size 16 --n-ubatch 64 --n-seq-max 1
