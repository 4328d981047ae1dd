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
. ./dec_common.sh
dec_setup pf "${1:-}"
khr matmul_dec dec_ka512 -DKA_DEFAULT=512 -DAPF_DEFAULT=1
python3 dec_pf_list.py variants | while read -r d l s; do
    khr matmul_dec dec_ka512_d${d}l${l}s$s -DKA_DEFAULT=512 -DAPF_DEFAULT=1 \
        -DPFD_DEFAULT=$d -DPFL_DEFAULT=$l -DPFS_DEFAULT=$s
done
python3 dec_pf_list.py > "$D/list.txt"
echo "built $D ($(grep -c gemm "$D/list.txt") entries)"
