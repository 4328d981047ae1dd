#!/bin/bash
# Builds bf_list.py's entries (docs/benchmarks.md, "Vulkan decode GEMM on bf16 cooperative
# matrices": matmul_dec.comp and matmul_cm.comp with -DBF16=1 against their f16 modules,
# dec_bfd.comp's weights straight into bf16 matrices, the bf16 multiply-add) into OUT/bf
# (default build-vk_cm_bench/bf), with the harness itself in OUT. The f16 KHR modules take
# $GLSLANG_KHR or tools/glslang_khr.sh, the bf16 ones $GLSLANG_BF16 or tools/glslang_khr.sh
# with LLMEM_GLSLANG_SUITE=sid (glslang 16: GL_EXT_bfloat16). All KHR: one process a list.
#   tools/vk_cm_bench/bf_build.sh [OUT]
#   (GPU) VK_DRIVER_FILES=... OUT/vk_cm_bench OUT/bf; VKCM_ROTATE=1 OUT/vk_cm_bench OUT/bf b2.txt
set -eu
cd "$(dirname "$0")"
. ./dec_common.sh
dec_setup bf "${1:-}"
GB=${GLSLANG_BF16:-env LLMEM_GLSLANG_SUITE=sid $ROOT/tools/glslang_khr.sh}
bfd() { # NAME DEFINES...: dec_bfd.comp into D/NAME.spv
    local n=$1
    shift
    $GB -V -g0 --target-env vulkan1.2 "$@" dec_bfd.comp -o "$D/$n.spv" > /dev/null
}
khr_bf() { # SHADER NAME DEFINES...: shaders/SHADER.comp -DKHR -DBF16=1 into D/NAME.spv
    local sh=$1 n=$2
    shift 2
    $GB -V -g0 --target-env vulkan1.2 -DKHR -DBF16=1 "$@" "$ROOT/shaders/$sh.comp" -o "$D/$n.spv" \
        > /dev/null
}
bfd bfd_ka256 -DKA_DEFAULT=256
bfd bfd_wt_ka256 -DKA_DEFAULT=256 -DWT=1
bfd bfd_probe -DPROBE=1
bfd bfd_probe_wt -DPROBE=1 -DWT=1
bfd bfd_probe_k4096 -DPROBE=1 -DKCONST=4096
bfd bfd_probe_k14336 -DPROBE=1 -DKCONST=14336
khr matmul_cm mcm_s2 -DSETS_DEFAULT=2
khr_bf matmul_cm mcm_bf_s2 -DSETS_DEFAULT=2
khr_bf matmul_cm mcm_bf_s3 -DSETS_DEFAULT=3
khr matmul_dec dec_probe -DPROBE=1 -DKA_DEFAULT=1024
for v in 64:2 128:2 128:0 256:2; do
    IFS=: read -r ka d <<< "$v"
    pf="-DKA_DEFAULT=$ka -DAPF_DEFAULT=1 -DPFD_DEFAULT=$d -DPFL_DEFAULT=2 -DPFS_DEFAULT=32"
    [ "$d" = 2 ] && khr matmul_dec dec_ka${ka}_d${d}l2s32 $pf
    khr_bf matmul_dec dec_bf_ka${ka}_d${d}l2s32 $pf
done
for na in 1x1 2x4 4x4; do
    IFS=x read -r a b <<< "$na"
    $GK -V --target-env vulkan1.3 -DKHR -DNA=$a -DNB=$b mma.comp -o "$D/khr_16x16x16_$na.spv" > /dev/null
    $GB -V --target-env vulkan1.3 -DKHR -DBF16=1 -DNA=$a -DNB=$b mma.comp \
        -o "$D/khr_bf_16x16x16_$na.spv" > /dev/null
done
python3 bf_list.py > "$D/list.txt"
python3 bf_list.py b2 > "$D/b2.txt"
echo "built $D ($(grep -c gemm "$D/list.txt") + $(grep -c gemm "$D/b2.txt") gemm entries)"
