#!/bin/bash
# Builds dec_r64g_list.py's entries (the 64-row products of the 9B and 2b decode steps in fast
# mode at matmul_cm.comp layouts with fewer fragment loads a weight byte, more workgroups an SM
# or whole waves; docs/benchmarks.md, "Vulkan decode at 64 rows: fragment loads and whole
# waves") into OUT/r64g (default build-vk_cm_bench/r64g): the harness in OUT, matmul_cm.comp
# with 1-3 register sets (mcm_sS) and OUT/r64g/list.txt. Needs $GLSLANG_KHR or
# tools/glslang_khr.sh.
#   tools/vk_cm_bench/dec_r64g.sh [OUT]
#   (GPU) VK_DRIVER_FILES=... VKCM_ROTATE=1 OUT/vk_cm_bench OUT/r64g
set -eu
cd "$(dirname "$0")"
. ./dec_common.sh
dec_setup r64g "${1:-}"
mcm_sets
python3 dec_r64g_list.py > "$D/list.txt"
python3 dec_r64g_list.py ring > "$D/ring.txt"
echo "built $D ($(grep -c gemm "$D/list.txt") + $(grep -c gemm "$D/ring.txt") entries)"
