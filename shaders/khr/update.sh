#!/bin/bash
# Regenerates shaders/khr/matmul_cmp.spv, matmul_cmp.comp compiled as
# GL_KHR_cooperative_matrix (-DKHR) by glslang 15 or later ($GLSLANG_KHR,
# default tools/glslang_khr.sh), and matmul_cmp.sha256, the SHA-256 of
# matmul_cmp.comp (self-contained: it includes nothing). The build embeds
# the .spv only while that hash matches the source (shaders/shaders.cmake),
# so a stale module never runs: run this after changing matmul_cmp.comp. Build with -DLLMEM_GLSLANG_KHR=<glslang 15> to
# compile it from source instead.
set -eu
cd "$(dirname "$0")"
GK=${GLSLANG_KHR:-../../tools/glslang_khr.sh}
$GK -V -g0 --target-env vulkan1.2 -DKHR -I.. ../matmul_cmp.comp -o matmul_cmp.spv > /dev/null
sha256sum < ../matmul_cmp.comp | cut -d' ' -f1 > matmul_cmp.sha256
echo "shaders/khr/matmul_cmp.spv: $(stat -c %s matmul_cmp.spv) bytes, sources $(cat matmul_cmp.sha256)"
