#!/usr/bin/env bash
# Conformance (cuda and vulkan against cpu), memcheck of the cuda suites and
# fixture parity on both GPU backends, at HEAD, on the GPU machine. Run from
# the repository root with build-gpu/{bin,lib} and .gl (Vulkan loader
# packages, docs/vulkan.md) carried.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
mkdir -p /tmp/vvl && dpkg -x .gl/extra/vulkan-validationlayers_*.deb /tmp/vvl
export LD_LIBRARY_PATH=$PWD/.gl/libs:$PWD/build-gpu/lib:/tmp/vvl/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export VK_LAYER_PATH=/tmp/vvl/usr/share/vulkan/explicit_layer.d
export LLMEM_BACKEND_PATH=$PWD/build-gpu/lib LLMEM_MODEL_DIR=$PWD/models/builtin
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
B=build-gpu/bin
echo "=== $(date -u '+%F %T') $(nvidia-smi -L 2>&1 | head -1)"
for t in test_ops test_ops_attention test_ops_mamba test_ops_convert; do
  r1=$(LLMEM_TEST_BACKENDS=cpu,cuda CK_FORK=no timeout 200 $B/$t 2>&1 | grep -E "^[0-9]+%" )
  r2=$(LLMEM_TEST_BACKENDS=cpu,vulkan VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation timeout 200 $B/$t 2>&1 | grep -E "^[0-9]+%")
  echo "$t: cuda: $r1 | vulkan (validation on): $r2"
done
for t in test_cuda test_ops_attention; do
  echo "=== compute-sanitizer memcheck $t"
  LLMEM_TEST_BACKENDS=cpu,cuda CK_FORK=no timeout 200 compute-sanitizer --tool memcheck --report-api-errors no $B/$t 2>&1 | grep -E "ERROR SUMMARY|^[0-9]+%"
done
for be in cuda vulkan; do
  for fx in llama mamba2 bamba nemotron_h bamba_bf16; do
    printf '%-7s %-11s ' $be $fx
    bash tests/parity.sh $B/llmem tests/fixtures/$fx $be quick | sed 's/^page 16, ubatch 512 *//'
  done
done
