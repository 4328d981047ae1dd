#!/bin/bash
# Builds matmul_dec.comp's row-tile entries (64 rows as 1, 2 or 4 tiles, with and without its L2
# prefetch; 16 rows precise with it: docs/benchmarks.md, "Vulkan decode GEMM at 64 rows: row
# tiles") into OUT/rows (default build-vk_cm_bench/rows), KHR modules, with the harness itself in
# OUT, the old plans' module (mcm) and dec_rows_list.py's list OUT/rows/list.txt. The harness
# passes specialization constants 0-8 only, so each chunk and prefetch is a module of its own
# (-DKA_DEFAULT, -DPF*_DEFAULT). Needs $GLSLANG_KHR or tools/glslang_khr.sh.
#   tools/vk_cm_bench/dec_rows.sh [OUT]
#   (GPU) VK_DRIVER_FILES=... OUT/vk_cm_bench OUT/rows
set -eu
cd "$(dirname "$0")"
ROOT=$PWD/../..
OUT=${1:-$ROOT/build-vk_cm_bench}
GK=${GLSLANG_KHR:-$ROOT/tools/glslang_khr.sh}
mkdir -p "$OUT/rows"
cc -O2 -std=c11 -Wall -Wextra -I"$ROOT/include" -I"$ROOT/backends/vulkan" vk_cm_bench.c \
    "$ROOT/backends/vulkan/vk_mm_pick.c" -o "$OUT/vk_cm_bench" -lvulkan -lm
cp "$ROOT/shaders/khr/matmul_cm.spv" "$OUT/rows/mcm.spv"
python3 dec_rows_list.py variants | while read -r ka d l s; do
    $GK -V -g0 --target-env vulkan1.2 -DKHR -DKA_DEFAULT=$ka -DAPF_DEFAULT=1 -DPFD_DEFAULT=$d \
        -DPFL_DEFAULT=$l -DPFS_DEFAULT=$s "$ROOT/shaders/matmul_dec.comp" \
        -o "$OUT/rows/dec_ka${ka}_d${d}l${l}s$s.spv" > /dev/null
done
python3 dec_rows_list.py > "$OUT/rows/list.txt"
echo "built $OUT/rows ($(grep -c gemm "$OUT/rows/list.txt") entries)"
