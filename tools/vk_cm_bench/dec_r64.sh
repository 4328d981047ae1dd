#!/bin/bash
# Builds dec_r64_list.py's entries (the 32- and 64-row decode GEMM: matmul_cm.comp's KHR module
# at other warp layouts, matmul_dec.comp at 32 rows; docs/benchmarks.md, "Vulkan decode GEMM at 32
# and 64 rows: fragment traffic") into OUT/r64 (default build-vk_cm_bench/r64), with the harness
# itself in OUT, the plugin's module of matmul_cm.comp (mcm: shaders/khr/matmul_cm.spv) and the
# list OUT/r64/list.txt. The harness passes specialization constants 0-8 only, so each chunk and
# touch setting of matmul_dec is a module of its own. Needs $GLSLANG_KHR or tools/glslang_khr.sh.
#   tools/vk_cm_bench/dec_r64.sh [OUT]
#   (GPU) VK_DRIVER_FILES=... [VKCM_ROTATE=1] OUT/vk_cm_bench OUT/r64 [LIST]
#   LIST: sets.txt, shapes.txt or narrow.txt (the last two with VKCM_ROTATE=1)
set -eu
cd "$(dirname "$0")"
. ./dec_common.sh
dec_setup r64 "${1:-}"
dec_variants dec_r64_list.py
mcm_sets
python3 dec_r64_list.py > "$D/list.txt"
python3 dec_r64_list.py sets > "$D/sets.txt"
python3 dec_r64_list.py shapes > "$D/shapes.txt"
python3 dec_r64_list.py narrow > "$D/narrow.txt"
n() { grep -c gemm "$D/$1"; }
echo "built $D ($(n list.txt) + $(n sets.txt) + $(n shapes.txt) + $(n narrow.txt) entries)"
