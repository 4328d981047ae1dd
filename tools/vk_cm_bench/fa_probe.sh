#!/bin/bash
# Builds fa_probe.comp's variants (KHR modules, glslang 15: $GLSLANG_KHR, default
# tools/glslang_khr.sh) into OUT (default build-vk_cm_bench/fa) with their list.txt, and the
# harness into OUT/../vk_cm_bench. Run on the GPU machine: vk_cm_bench OUT. Each entry is
# "fa 132 ITERS FLOPS" (one workgroup an SM) or 264 (two, where the registers allow);
# docs/benchmarks.md, "Vulkan prefill attention: a probe of the block's primitives".
set -eu
cd "$(dirname "$0")"
ROOT=$PWD/../..
OUT=${1:-$ROOT/build-vk_cm_bench/fa}
GK=${GLSLANG_KHR:-$ROOT/tools/glslang_khr.sh}
mkdir -p "$OUT"
cc -O2 -std=c11 -Wall -Wextra -I"$ROOT/include" -I"$ROOT/backends/vulkan" vk_cm_bench.c \
    "$ROOT/backends/vulkan/vk_mm_pick.c" -o "$OUT/../vk_cm_bench" -lvulkan -lm
: > "$OUT/list.txt"
# name groups[:iters] defines... (the module's block: EW 2, RMAX 1, SOFT 1, CONV 1, BAR 1, SHK 1)
v() {
    local n=$1 groups=$2 iters=2048; shift 2
    case $groups in *:*) iters=${groups#*:}; groups=${groups%:*} ;; esac
    local d="" bn=32 pv=1
    for x in "$@"; do
        d="$d -D$x"
        case $x in BN=64) bn=64 ;; PV=0) pv=0 ;; esac
    done
    [ -f "$OUT/$n.spv" ] || $GK -V -g0 --target-env vulkan1.3 $d fa_probe.comp -o "$OUT/$n.spv" > /dev/null
    echo "$n fa $groups $iters $(((bn / 16) * 8 * (1 + pv) * 8192))" >> "$OUT/list.txt"
}
v s 132 PV=0
v s_sk2 132 PV=0 SK=2
v pv 132
v pv_cv1 132 CONV=1 CM2=1
v pv_cv4 132 CONV=4 CM2=1
v pv_cv2 132 CONV=2
v pv_cv3 132 CONV=3
v pv_cv3_cm2 132 CONV=3 CM2=1
v e1_cv1 132 EW=1 CONV=1 CM2=1
v e1_cv3 132 EW=1 CONV=3
v e2_cv1 132 EW=2 CONV=1 CM2=1
v e2_cv3 132 EW=2 CONV=3
v r1_cv1 132 EW=2 RMAX=1 CONV=1 CM2=1
v r2_cv1 132 EW=2 RMAX=2 CONV=1 CM2=1
v r2_cv3 132 EW=2 RMAX=2 CONV=3
v so_r1_cv1 132 EW=2 RMAX=1 SOFT=1 CONV=1 CM2=1
v so_r2_cv1 132 EW=2 RMAX=2 SOFT=1 CONV=1 CM2=1
v so_r2_cv3 132 EW=2 RMAX=2 SOFT=1 CONV=3
v so_r1_cv3 132 EW=2 RMAX=1 SOFT=1 CONV=3 CM2=1
v so_r1_cv2 132 EW=2 RMAX=1 SOFT=1 CONV=2 CM2=1
v bar_r1_cv1 132 EW=2 RMAX=1 SOFT=1 CONV=1 CM2=1 BAR=1
v bar_r2_cv3 132 EW=2 RMAX=2 SOFT=1 CONV=3 BAR=1
v mod_r1_cv1 132 EW=2 RMAX=1 SOFT=1 CONV=1 CM2=1 BAR=1 SHK=1
v mod_r2_cv3 132 EW=2 RMAX=2 SOFT=1 CONV=3 BAR=1 SHK=1
v mod_r1_cv1 264 EW=2 RMAX=1 SOFT=1 CONV=1 CM2=1 BAR=1 SHK=1
v mod_r2_cv3 264 EW=2 RMAX=2 SOFT=1 CONV=3 BAR=1 SHK=1
v sk2_r2_cv3 132 EW=2 RMAX=2 SOFT=1 CONV=3 BAR=1 SHK=1 SK=2
v b64_r2_cv3 132 EW=2 RMAX=2 SOFT=1 CONV=3 BAR=1 SHK=1 BN=64
v b64_r2_cv3 264 EW=2 RMAX=2 SOFT=1 CONV=3 BAR=1 SHK=1 BN=64
v b64sk2_r2_cv3 132 EW=2 RMAX=2 SOFT=1 CONV=3 BAR=1 SHK=1 BN=64 SK=2
v b64_r1_cv1 132 EW=2 RMAX=1 SOFT=1 CONV=1 CM2=1 BAR=1 SHK=1 BN=64
v pv_b64 132 BN=64
v pv_b64_cv3 132 BN=64 CONV=3
M="EW=2 RMAX=1 SOFT=1 CONV=1 CM2=1 BAR=1 SHK=1"
v ring_r1_cv1 132 $M RING=1
v ring_r1_cv1 4092:32 $M RING=1
v pro_r1_cv1 132 $M PRO=1
v pro_r1_cv1 4092:32 $M PRO=1
v pr_r1_cv1 132 $M PRO=1 RING=1
v pr_r1_cv1 4092:32 $M PRO=1 RING=1
v pr_r2_cv3 4092:32 EW=2 RMAX=2 SOFT=1 CONV=3 BAR=1 SHK=1 PRO=1 RING=1
v cring_r1_cv1 4092:32 $M PRO=1 RING=2
