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
. ./dec_common.sh
dec_setup rows "${1:-}"
dec_variants dec_rows_list.py
python3 dec_rows_list.py > "$D/list.txt"
echo "built $D ($(grep -c gemm "$D/list.txt") entries)"
