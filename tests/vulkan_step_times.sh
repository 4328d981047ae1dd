#!/usr/bin/env bash
# LLMEM_VULKAN_STEP_TIMES=1 (backends/vulkan/vk_steptime.c): a greedy
# `llmem generate` gives the same tokens with the timestamps around each
# recorded step's submit as without them, and prints the line of means per
# step, whose parts add up: GPU = before the step + the step + after it,
# wall = GPU + submit + wait beyond the GPU + host (printed to 4 decimals,
# so within 0.0005 ms of the sums), over the decode steps after the first
# replay (the prompt is a prefill, the first decode step runs eagerly and
# is recorded).
#   tests/vulkan_step_times.sh LLMEM_BIN FIXTURE_DIR
set -euo pipefail
bin="$1"; fx="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
gen() { "$bin" generate --model "$fx" --backend vulkan --prompt-ids "1 2 3 4 5" -n 12 --temp 0; }
gen > "$tmp/plain.txt"
LLMEM_VULKAN_STEP_TIMES=1 gen > "$tmp/timed.txt" 2> "$tmp/timed.err"
cmp "$tmp/plain.txt" "$tmp/timed.txt" || { echo "the timestamps changed the tokens"; exit 1; }
line="$(grep '^vulkan step times (' "$tmp/timed.err")" ||
  { cat "$tmp/timed.err"; echo "no step times line"; exit 1; }
echo "$line"
echo "$line" | sed 's/.*): //' | tr -d '(),=+' | awk '{
  n = $1; wall = $8; gpu = $10; before = $14; step = $17; after = $20; submit = $22
  wait = $27; host = $29
  if (n < 8) { print "only " n " recorded steps timed (12 tokens)"; exit 1 }
  if (gpu <= 0 || step <= 0 || wall < gpu) { print "implausible times"; exit 1 }
  d1 = gpu - (before + step + after); d2 = wall - (gpu + submit + wait + host)
  if (d1 < -0.0005 || d1 > 0.0005 || d2 < -0.0005 || d2 > 0.0005) {
    print "parts do not add up: " d1 " " d2; exit 1 }
}'
