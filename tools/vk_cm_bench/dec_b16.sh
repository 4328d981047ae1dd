#!/bin/bash
# Builds dec_b16_list.py's entries (the 16-row decode GEMM: matmul_cm.comp's KHR module at
# 16-row layouts with SETS register sets, matmul_dec.comp at other chunks, depths and touches;
# docs/benchmarks.md, "Vulkan decode at 16 rows: GEMM layouts and the scan") into OUT/b16
# (default build-vk_cm_bench/b16), with the harness itself in OUT, the plugin's module of
# matmul_cm.comp (mcm: shaders/khr/matmul_cm.spv) and the lists OUT/b16/list.txt and refine.txt. The harness
# passes specialization constants 0-8 only, so each chunk and touch setting of matmul_dec and
# each SETS of matmul_cm is a module of its own. Needs $GLSLANG_KHR or tools/glslang_khr.sh.
#   tools/vk_cm_bench/dec_b16.sh [OUT]
#   (GPU) VK_DRIVER_FILES=... OUT/vk_cm_bench OUT/b16 [refine.txt]
set -eu
cd "$(dirname "$0")"
. ./dec_common.sh
dec_setup b16 "${1:-}"
dec_variants dec_b16_list.py
mcm_sets
python3 dec_b16_list.py > "$D/list.txt"
python3 dec_b16_list.py refine > "$D/refine.txt"
echo "built $D ($(grep -c gemm "$D/list.txt") + $(grep -c gemm "$D/refine.txt") entries)"
