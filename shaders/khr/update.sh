#!/bin/bash
# Regenerates shaders/khr/<name>.spv, <name>.comp compiled as
# GL_KHR_cooperative_matrix (-DKHR) by glslang 15 or later ($GLSLANG_KHR,
# default tools/glslang_khr.sh), and <name>.sha256, the SHA-256 of
# <name>.comp (self-contained: it includes nothing), for each name given
# (default: every KHR module, shaders/shaders.cmake's LLMEM_VK_KHR_SHADERS:
# matmul_cmp, matmul_cm, matmul_cm2, matmul_dec, attention_prefill_cm, attention_prefill_cm2,
# attention_prefill_fa
# (attention_prefill_cm.comp with -DCM2=1, LLMEM_VK_CM2_VARIANTS), then the bf16 modules of
# LLMEM_VK_BF16_SHADERS, matmul_dec_bf and matmul_cm_bf). A name
# <base>_bf is <base>.comp with -DKHR -DBF16=1 (bf16 cooperative matrices,
# GL_EXT_bfloat16) compiled by glslang 16 or later ($GLSLANG_BF16, default
# tools/glslang_khr.sh with LLMEM_GLSLANG_SUITE=sid); its .sha256 is
# <base>.comp's too. The build embeds a .spv only while its hash matches
# the source (shaders/shaders.cmake), so a stale module never runs: run
# this after changing one of those shaders. Build with
# -DLLMEM_GLSLANG_KHR=<glslang 15> (-DLLMEM_GLSLANG_BF16=<glslang 16>) to
# compile them from source instead.
#   shaders/khr/update.sh [name...]
set -eu
cd "$(dirname "$0")"
GK=${GLSLANG_KHR:-../../tools/glslang_khr.sh}
GB=${GLSLANG_BF16:-env LLMEM_GLSLANG_SUITE=sid ../../tools/glslang_khr.sh}
[ $# -gt 0 ] || set -- matmul_cmp matmul_cm matmul_cm2 matmul_dec attention_prefill_cm attention_prefill_cm2 attention_prefill_fa matmul_dec_bf matmul_cm_bf
for n in "$@"; do
    env=vulkan1.2
    case $n in matmul_cm2 | attention_prefill_cm2 | attention_prefill_fa) env=vulkan1.3 ;; esac # SPIR-V 1.6
    case $n in
    attention_prefill_cm2) src=attention_prefill_cm; $GK -V -g0 --target-env $env -DKHR -DCM2=1 -I.. ../$src.comp -o $n.spv > /dev/null ;;
    *_bf) src=${n%_bf}; $GB -V -g0 --target-env $env -DKHR -DBF16=1 -I.. ../$src.comp -o $n.spv > /dev/null ;;
    *) src=$n; $GK -V -g0 --target-env $env -DKHR -I.. ../$n.comp -o $n.spv > /dev/null ;;
    esac
    sha256sum < ../$src.comp | cut -d' ' -f1 > $n.sha256
    echo "shaders/khr/$n.spv: $(stat -c %s $n.spv) bytes, sources $(cat $n.sha256)"
done
