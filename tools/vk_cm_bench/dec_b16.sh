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
ROOT=$PWD/../..
OUT=${1:-$ROOT/build-vk_cm_bench}
GK=${GLSLANG_KHR:-$ROOT/tools/glslang_khr.sh}
mkdir -p "$OUT/b16"
cc -O2 -std=c11 -Wall -Wextra -I"$ROOT/include" -I"$ROOT/backends/vulkan" vk_cm_bench.c \
    "$ROOT/backends/vulkan/vk_mm_pick.c" -o "$OUT/vk_cm_bench" -lvulkan -lm
cp "$ROOT/shaders/khr/matmul_cm.spv" "$OUT/b16/mcm.spv"
python3 dec_b16_list.py variants | while read -r ka d l s; do
    $GK -V -g0 --target-env vulkan1.2 -DKHR -DKA_DEFAULT=$ka -DAPF_DEFAULT=1 -DPFD_DEFAULT=$d \
        -DPFL_DEFAULT=$l -DPFS_DEFAULT=$s "$ROOT/shaders/matmul_dec.comp" \
        -o "$OUT/b16/dec_ka${ka}_d${d}l${l}s$s.spv" > /dev/null
done
for sets in 1 2 3; do
    $GK -V -g0 --target-env vulkan1.2 -DKHR -DSETS_DEFAULT=$sets "$ROOT/shaders/matmul_cm.comp" \
        -o "$OUT/b16/mcm_s$sets.spv" > /dev/null
done
python3 dec_b16_list.py > "$OUT/b16/list.txt"
python3 dec_b16_list.py refine > "$OUT/b16/refine.txt"
echo "built $OUT/b16 ($(grep -c gemm "$OUT/b16/list.txt") + $(grep -c gemm "$OUT/b16/refine.txt") entries)"
