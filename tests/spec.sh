#!/usr/bin/env bash
# Speculative decoding: with greedy sampling, `llmem generate --draft N`
# must print exactly what --draft 0 prints, for every page size and with
# --parallel > 1 (rejected drafts are rolled back with seq_rm: KV slots
# freed, recurrent state switched to a checkpoint).
#   tests/spec.sh LLMEM_BIN MODEL_DIR [BACKEND]
set -euo pipefail
bin="$1"; model="$2"; backend="${3:-cpu}"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
if [ -f "$model/tokenizer.json" ]; then
  # the byte-level view of the checkpoint: its tokenizer's end-of-text would
  # end these random-weight fixtures' sequences after a few tokens
  mkdir "$tmp/bytes" && cp "$model/config.json" "$model"/*.safetensors "$tmp/bytes/"
  model="$tmp/bytes"
fi
prompt=$'ROMEO:\nWhat say you, ROMEO? What say'
fail=0
for ps in 1 16 64; do
  for par in 1 3; do
    "$bin" generate --model "$model" --backend "$backend" --temp 0 -n 120 --page-size "$ps" \
      --parallel "$par" --prompt "$prompt" --draft 0 > "$tmp/ref"
    for d in 1 4; do
      "$bin" generate --model "$model" --backend "$backend" --temp 0 -n 120 --page-size "$ps" \
        --parallel "$par" --prompt "$prompt" --draft "$d" --stats > "$tmp/out" 2> "$tmp/err"
      if cmp -s "$tmp/ref" "$tmp/out"; then
        echo "page $ps parallel $par draft $d: identical ($(grep -o 'acceptance [0-9.]*%' "$tmp/err" || echo 'no drafts'))"
      else
        echo "page $ps parallel $par draft $d: DIFFERENT from --draft 0"; fail=1
      fi
    done
  done
done
exit $fail
