#!/usr/bin/env bash
# LLMEM_VULKAN_PROFILE=1 (backends/vulkan/vk_prof.c): a profiled `llmem score`
# gives the same log-probs as an unprofiled one, and prints the per-shader
# table with the shaders a llama forward must use, each with calls > 0 and
# a share column that sums to about 100%.
#   tests/vulkan_profile.sh LLMEM_BIN FIXTURE_DIR
set -euo pipefail
bin="$1"; fx="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/support/vk_score.sh"
vk_score_twice 3 LLMEM_VULKAN_PROFILE prof "profiling"
grep -q '^vulkan profile (' "$tmp/prof.err" || { cat "$tmp/prof.err"; echo "no profile table"; exit 1; }
for sh in attention kv_store rms_norm rope; do
  awk -v s="$sh" '$1 ~ "^"s && $4 + 0 > 0 { found = 1 } END { exit !found }' "$tmp/prof.err" ||
    { cat "$tmp/prof.err"; echo "no $sh row with calls"; exit 1; }
done
awk '$3 ~ /%$/ { sub("%", "", $3); t += $3 } END { if (t < 99 || t > 101) { print "shares sum to " t; exit 1 } }' \
  "$tmp/prof.err"
echo "profile table ok: $(grep -c '^  [a-z]' "$tmp/prof.err") rows"
