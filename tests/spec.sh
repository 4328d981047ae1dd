#!/usr/bin/env bash
# Speculative decoding: with greedy sampling, `llmem generate --draft N`
# must print exactly what --draft 0 prints, for every page size and with
# --parallel > 1 (rejected drafts are rolled back with seq_rm: KV slots
# freed, recurrent state switched to a checkpoint).
#   tests/spec.sh LLMEM_BIN MODEL_DIR [BACKENDS]
# BACKENDS: comma-separated (default $LLMEM_TEST_BACKENDS, else cpu); one
# that `llmem info` lists as unavailable is skipped with a message (exit 77
# when none is left). LLMEM_SPEC_PRECISION=precise|fast picks the precision
# (default: generate's, fast).
#
# The near-tie caveat. On cpu a row's logits do not depend on how many
# tokens its ubatch holds, so the outputs must be identical. A device
# backend sums a one-token decode step (CUDA: the row-block GEMV and the
# fused norm_matmul) and a 2-5-token verify step (the multi-row GEMV) in
# different orders, so greedy decoding may choose another token where the
# two best are within that rounding. There, a difference is checked by
# tests/spec_tie.py: it scores the text before the first differing byte
# plus each run's token with `llmem score` (same backend, precision, page
# size; one-token ubatches) and accepts the difference only when the two
# log-probs are within LLMEM_SPEC_TIE_TOL (default 1e-3 precise, 0.05 fast:
# bf16 KV and activations). A real rollback bug parts the outputs at a
# token that --draft 0 preferred by more, and fails.
set -euo pipefail
bin="$1"; model="$2"; backends="${3:-${LLMEM_TEST_BACKENDS:-cpu}}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
prec="${LLMEM_SPEC_PRECISION:-fast}"
case "$prec" in
  precise) tie_tol="${LLMEM_SPEC_TIE_TOL:-1e-3}" ;;
  fast) tie_tol="${LLMEM_SPEC_TIE_TOL:-0.05}" ;;
  *) echo "LLMEM_SPEC_PRECISION must be precise or fast, not '$prec'"; exit 2 ;;
esac
if [ -f "$model/tokenizer.json" ]; then
  # the byte-level view of the checkpoint: its tokenizer's end-of-text would
  # end these random-weight fixtures' sequences after a few tokens
  mkdir "$tmp/bytes" && cp "$model/config.json" "$model"/*.safetensors "$tmp/bytes/"
  model="$tmp/bytes"
fi
"$bin" info > "$tmp/info" 2>&1 || true
prompt=$'ROMEO:\nWhat say you, ROMEO? What say'
fail=0; ran=0
for be in ${backends//,/ }; do
  if [ "$be" != cpu ] && ! grep -Eq "^  $be: (available, )?device" "$tmp/info"; then
    echo "$be: not available here ($(grep -E "^  $be:" "$tmp/info" | head -1 | sed 's/^ *//')), skipped"
    continue
  fi
  ran=$((ran + 1))
  for ps in 1 16 64; do
    for par in 1 3; do
      gen=("$bin" generate --model "$model" --backend "$be" --precision "$prec" --temp 0 -n 120
           --page-size "$ps" --parallel "$par" --prompt "$prompt")
      "${gen[@]}" --draft 0 > "$tmp/ref"
      for d in 1 4; do
        "${gen[@]}" --draft "$d" --stats > "$tmp/out" 2> "$tmp/err"
        what="$be page $ps parallel $par draft $d"; rm -f "$tmp/tie"
        if cmp -s "$tmp/ref" "$tmp/out"; then
          echo "$what: identical ($(grep -o 'acceptance [0-9.]*%' "$tmp/err" || echo 'no drafts'))"
        elif [ "$be" != cpu ] && python3 "$here/spec_tie.py" "$tmp/ref" "$tmp/out" "$tie_tol" \
            "$bin" score --model "$model" --backend "$be" --precision "$prec" \
            --page-size "$ps" --n-ubatch 1 > "$tmp/tie"; then
          echo "$what: differs from --draft 0 at a $(cat "$tmp/tie")"
        else
          echo "$what: DIFFERENT from --draft 0"; fail=1
          if [ -s "$tmp/tie" ]; then cat "$tmp/tie"; fi
        fi
      done
    done
  done
done
[ "$ran" -gt 0 ] || exit 77
exit $fail
