#!/bin/bash
# Builds dec_r64_list.py's entries (the 32- and 64-row decode GEMM: matmul_cm.comp's KHR module
# at other warp layouts, matmul_dec.comp at 32 rows; docs/benchmarks.md, "Vulkan decode GEMM at 32
# and 64 rows: fragment traffic") into OUT/r64 (default build-vk_cm_bench/r64), with the harness
# itself in OUT, the plugin's module of matmul_cm.comp (mcm: shaders/khr/matmul_cm.spv) and the
# list OUT/r64/list.txt. The harness passes specialization constants 0-8 only, so each chunk and
# touch setting of matmul_dec is a module of its own. Needs $GLSLANG_KHR or tools/glslang_khr.sh.
#   tools/vk_cm_bench/dec_r64.sh [OUT]
#   (GPU) VK_DRIVER_FILES=... OUT/vk_cm_bench OUT/r64 [sets.txt]
set -eu
cd "$(dirname "$0")"
ROOT=$PWD/../..
OUT=${1:-$ROOT/build-vk_cm_bench}
GK=${GLSLANG_KHR:-$ROOT/tools/glslang_khr.sh}
mkdir -p "$OUT/r64"
cc -O2 -std=c11 -Wall -Wextra -I"$ROOT/include" -I"$ROOT/backends/vulkan" vk_cm_bench.c \
    "$ROOT/backends/vulkan/vk_mm_pick.c" -o "$OUT/vk_cm_bench" -lvulkan -lm
cp "$ROOT/shaders/khr/matmul_cm.spv" "$OUT/r64/mcm.spv"
python3 dec_r64_list.py variants | while read -r ka d l s; do
    $GK -V -g0 --target-env vulkan1.2 -DKHR -DKA_DEFAULT=$ka -DAPF_DEFAULT=1 -DPFD_DEFAULT=$d \
        -DPFL_DEFAULT=$l -DPFS_DEFAULT=$s "$ROOT/shaders/matmul_dec.comp" \
        -o "$OUT/r64/dec_ka${ka}_d${d}l${l}s$s.spv" > /dev/null
done
for sets in 1 2 3; do
    $GK -V -g0 --target-env vulkan1.2 -DKHR -DSETS_DEFAULT=$sets "$ROOT/shaders/matmul_cm.comp" \
        -o "$OUT/r64/mcm_s$sets.spv" > /dev/null
done
python3 dec_r64_list.py > "$OUT/r64/list.txt"
python3 dec_r64_list.py sets > "$OUT/r64/sets.txt"
echo "built $OUT/r64 ($(grep -c gemm "$OUT/r64/list.txt") + $(grep -c gemm "$OUT/r64/sets.txt") entries)"
