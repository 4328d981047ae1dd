#!/usr/bin/env bash
# LLMEM_VULKAN_PIPELINE_STATS=1 (backends/vulkan/vk_pstats.c): a `llmem score`
# with pipeline statistics gives the same log-probs as one without, and stderr
# has, where the device lists VK_KHR_pipeline_executable_properties, one
# "pipeline stats: SHADER [spec ...] exe N ..." line with name=value
# statistics for each shader a llama forward uses; where it does not, the
# line saying the variable is ignored and why.
#   tests/vulkan_pipeline_stats.sh LLMEM_BIN FIXTURE_DIR
set -euo pipefail
bin="$1"; fx="$2"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/support/vk_score.sh"
vk_score_twice 2 LLMEM_VULKAN_PIPELINE_STATS stats "pipeline statistics"
if grep -q 'LLMEM_VULKAN_PIPELINE_STATS ignored: ' "$tmp/stats.err"; then
  grep -q 'pipeline stats: ' "$tmp/stats.err" && { cat "$tmp/stats.err"; echo "statistics printed although ignored"; exit 1; }
  echo "pipeline statistics unavailable here: $(grep -o 'ignored: .*' "$tmp/stats.err" | head -1)"
  exit 0
fi
for sh in attention kv_store rms_norm rope; do
  grep -E "^llmem: vulkan: pipeline stats: ${sh}[a-z_0-9]* \[spec[ 0-9,]*\] exe [0-9]+ \".*\" sg [0-9]+: [^=]+=[-0-9.e]+" \
    "$tmp/stats.err" > /dev/null || { cat "$tmp/stats.err"; echo "no statistics line for $sh"; exit 1; }
done
echo "pipeline statistics ok: $(grep -c 'pipeline stats: ' "$tmp/stats.err") lines"
