#!/bin/bash
# Builds the L2-prefetch variants of shaders/matmul_dec.comp (its PFD, PFL, PFS;
# docs/benchmarks.md, "Vulkan decode GEMM: the weights into L2 ahead of the stream") into
# OUT/pf (default build-vk_cm_bench/pf), KHR modules, with the harness itself in OUT, the old
# plans' module (matmul_cm.comp, mcm) and dec_pf_list.py's list OUT/pf/list.txt. The harness
# passes specialization constants 0-8 only, so each variant is a module of its own, its
# prefetch set by the -DPF*_DEFAULT macros (the plugin sets ids 11-13). Needs $GLSLANG_KHR or
# tools/glslang_khr.sh.
#   tools/vk_cm_bench/dec_pf.sh [OUT]
#   (GPU) VK_DRIVER_FILES=... OUT/vk_cm_bench OUT/pf
set -eu
cd "$(dirname "$0")"
ROOT=$PWD/../..
OUT=${1:-$ROOT/build-vk_cm_bench}
GK=${GLSLANG_KHR:-$ROOT/tools/glslang_khr.sh}
mkdir -p "$OUT/pf"
cc -O2 -std=c11 -Wall -Wextra -I"$ROOT/include" -I"$ROOT/backends/vulkan" vk_cm_bench.c \
    "$ROOT/backends/vulkan/vk_mm_pick.c" -o "$OUT/vk_cm_bench" -lvulkan -lm
k() { # shader name defines...
    local sh=$1 n=$2; shift 2
    $GK -V -g0 --target-env vulkan1.2 -DKHR "$@" "$ROOT/shaders/$sh.comp" -o "$OUT/pf/$n.spv" > /dev/null
}
cp "$ROOT/shaders/khr/matmul_cm.spv" "$OUT/pf/mcm.spv"
k matmul_dec dec_ka512 -DKA_DEFAULT=512 -DAPF_DEFAULT=1
python3 dec_pf_list.py variants | while read -r d l s; do
    k matmul_dec dec_ka512_d${d}l${l}s$s -DKA_DEFAULT=512 -DAPF_DEFAULT=1 \
        -DPFD_DEFAULT=$d -DPFL_DEFAULT=$l -DPFS_DEFAULT=$s
done
python3 dec_pf_list.py > "$OUT/pf/list.txt"
echo "built $OUT/pf ($(grep -c gemm "$OUT/pf/list.txt") entries)"
