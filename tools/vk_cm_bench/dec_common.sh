# Sourced by the dec_*.sh builders of this folder (not run on its own): the prelude and the
# module loops they share.
#
# dec_setup SUB [OUT]: sets ROOT (the repository), OUT (default build-vk_cm_bench), GK
# ($GLSLANG_KHR or tools/glslang_khr.sh) and D = OUT/SUB; builds the harness into OUT and copies
# the plugin's module of matmul_cm.comp (shaders/khr/matmul_cm.spv) to D/mcm.spv.
dec_setup() {
    ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    OUT=${2:-$ROOT/build-vk_cm_bench}
    GK=${GLSLANG_KHR:-$ROOT/tools/glslang_khr.sh}
    D=$OUT/$1
    mkdir -p "$D"
    cc -O2 -std=c11 -Wall -Wextra -I"$ROOT/include" -I"$ROOT/backends/vulkan" \
        "$ROOT/tools/vk_cm_bench/vk_cm_bench.c" "$ROOT/backends/vulkan/vk_mm_pick.c" \
        -o "$OUT/vk_cm_bench" -lvulkan -lm
    cp "$ROOT/shaders/khr/matmul_cm.spv" "$D/mcm.spv"
}

# khr SHADER NAME DEFINES...: shaders/SHADER.comp compiled as KHR (-DKHR) into D/NAME.spv.
khr() {
    local sh=$1 n=$2
    shift 2
    $GK -V -g0 --target-env vulkan1.2 -DKHR "$@" "$ROOT/shaders/$sh.comp" -o "$D/$n.spv" > /dev/null
}

# dec_variants LIST_PY: matmul_dec.comp with its L2 prefetch, one module per "KA D L S" line
# of `python3 LIST_PY variants` (chunk, distance, lag, segment): D/dec_kaKA_dDlLsS.spv.
dec_variants() {
    python3 "$1" variants | while read -r ka d l s; do
        khr matmul_dec "dec_ka${ka}_d${d}l${l}s$s" -DKA_DEFAULT="$ka" -DAPF_DEFAULT=1 \
            -DPFD_DEFAULT="$d" -DPFL_DEFAULT="$l" -DPFS_DEFAULT="$s"
    done
}

# mcm_sets: matmul_cm.comp with 1, 2 and 3 register sets of loads in flight (SETS):
# D/mcm_sS.spv.
mcm_sets() {
    local s
    for s in 1 2 3; do
        khr matmul_cm "mcm_s$s" -DSETS_DEFAULT="$s"
    done
}
