#!/usr/bin/env bash
# Issue 7 figures on the GPU machine: speculative decoding and trace replay
# of the built-in model on cuda and vulkan. Run from the repo root with
# build-gpu/{bin,lib}, .gl and .data carried.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export LD_LIBRARY_PATH=$PWD/.gl/libs:$PWD/build-gpu/lib:${LD_LIBRARY_PATH:-}
export LLMEM_BACKEND_PATH=$PWD/build-gpu/lib LLMEM_MODEL_DIR=$PWD/models/builtin
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
B=build-gpu/bin
echo "=== $(date -u '+%F %T') $(nvidia-smi -L 2>&1 | head -1)"
$B/llmem info 2>&1 | head -8
for be in cuda vulkan; do
  echo "=== generate on $be"
  for d in 0 4; do
    $B/llmem generate --backend $be -n 300 --temp 0 --draft $d --stats > /tmp/g$d.$be 2> /tmp/s$d.$be
    echo "--draft $d: $(tail -1 /tmp/s$d.$be)"
  done
  cmp -s /tmp/g0.$be /tmp/g4.$be && echo "greedy --draft 4 output identical to --draft 0 on $be" || echo "OUTPUT DIFFERS on $be"
  cmp -s /tmp/g0.$be /tmp/g0.cuda && echo "$be output identical to cuda's" || echo "$be output differs from cuda's"
  $B/llmem generate --backend $be -n 200 --temp 0 --parallel 16 --draft 4 --stats > /dev/null 2> /tmp/p.$be
  echo "--parallel 16 --draft 4: $(tail -1 /tmp/p.$be)"
  $B/llmem generate --backend $be -n 200 --temp 0 --parallel 16 --draft 0 --stats > /dev/null 2> /tmp/p0.$be
  echo "--parallel 16 --draft 0: $(tail -1 /tmp/p0.$be)"
  echo "=== replay on $be"
  timeout 200 $B/llmem replay --backend $be --trace .data/azure_llm_inference_conv_2023.csv \
    --text .data/tinyshakespeare.txt --limit 200 --scale 0.25 --max-context 1024 --max-gen 256 \
    --n-seq-max 32 2>&1 | tail -22
done
