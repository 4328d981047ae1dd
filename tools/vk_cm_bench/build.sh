#!/bin/bash
# Builds vk_cm_bench and a set of shader variants into OUT (default
# build-vk_cm_bench/): OUT/vk_cm_bench, OUT/nv/ and, when $GLSLANG_KHR names a
# glslang of version 15 or later (a command line; README.md says how to run
# Debian trixie's on Debian 12), OUT/khr/, each with its list.txt. Run each
# directory in its own process on the GPU machine: vk_cm_bench OUT/nv.
set -eu
cd "$(dirname "$0")"
SRC=$PWD
ROOT=$SRC/../..
OUT=${1:-$ROOT/build-vk_cm_bench}
GLSLANG=${GLSLANG:-glslangValidator}
mkdir -p "$OUT/nv"
cc -O2 -std=c11 -Wall -Wextra -I"$ROOT/include" -I"$ROOT/backends/vulkan" vk_cm_bench.c \
    "$ROOT/backends/vulkan/vk_mm_pick.c" -o "$OUT/vk_cm_bench" -lvulkan -lm
# name, defines
shaders() { # api dir glslang...
    local api=$1 dir=$2; shift 2
    local khr=""; [ "$api" = khr ] && khr=-DKHR
    local env=vulkan1.1; [ "$api" = khr ] && env=vulkan1.3
    : > "$dir/list.txt"
    for shape in 16x16x16 16x8x16; do
        IFS=x read -r tm tn tk <<< "$shape"
        for acc in 1x1 2x2 2x4 4x4; do
            IFS=x read -r na nb <<< "$acc"
            n=${api}_${shape}_${acc}
            "$@" -V --target-env $env $khr -DTM=$tm -DTN=$tn -DTK=$tk -DNA=$na -DNB=$nb -DCF16=0 \
                mma.comp -o "$dir/$n.spv" > /dev/null
            echo "$n mma 2112 256 $((na * nb * 2 * tm * tn * tk))" >> "$dir/list.txt"
        done
    done
    for bar in 0:1 1:1 2:1 4:1; do
        IFS=: read -r k e <<< "$bar"
        n=${api}_sh_4x4_bar$k
        "$@" -V --target-env $env $khr -DNA=4 -DNB=4 -DBARK=$k -DBAREVERY=${e}u mma_sh.comp \
            -o "$dir/$n.spv" > /dev/null
        echo "$n mma 2112 256 131072" >> "$dir/list.txt"
    done
}
shaders nv "$OUT/nv" $GLSLANG
for h in 0 1; do
    $GLSLANG -V --target-env vulkan1.1 -DHALF=$h simt.comp -o "$OUT/nv/simt_half$h.spv" > /dev/null
    echo "simt_half$h simt 2112 4096 64" >> "$OUT/nv/list.txt"
done
# the plugin's own shader, at the plans of vk_cm_plan_make (K step 64 up to 64 rows, 32 above;
# the last field, when given, is its depth STAGES, LLMEM_VULKAN_CM_STAGES: the ring takes K
# steps of 64 at 16 rows, 32 at 17-64 rows)
$GLSLANG -V --target-env vulkan1.1 -I"$ROOT/shaders" "$ROOT/shaders/matmul_cm.comp" \
    -o "$OUT/nv/matmul_cm.spv" > /dev/null
cat >> "$OUT/nv/list.txt" <<'L'
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64
matmul_cm gemm 64 4096 4096 256 1 4 1 2 32
matmul_cm gemm 512 4096 4096 256 2 4 2 1 32
matmul_cm gemm 512 4096 4096 256 2 4 2 2 32
matmul_cm gemm 2048 4096 4096 256 2 4 2 1 32
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64 2
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64 3
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64 4
matmul_cm gemm 64 4096 4096 256 1 4 1 2 32 1
matmul_cm gemm 64 4096 4096 256 1 4 1 2 32 2
matmul_cm gemm 64 4096 4096 256 1 4 1 2 32 3
matmul_cm gemm 64 4096 4096 256 1 4 1 2 32 4
L
# bisect.comp's variants (OUT/bisect): one feature of matmul_cm.comp's K loop each (name, defines);
# its list.txt is the last set measured (docs/benchmarks.md, "Vulkan GEMM: the accumulators in
# local memory", has the earlier ones)
B=$OUT/bisect
mkdir -p "$B"
: > "$B/list.txt"
bis() { # name defines...
    local n=$1; shift
    $GLSLANG -V --target-env vulkan1.1 -I"$ROOT/shaders" "$@" bisect.comp -o "$B/$n.spv" > /dev/null
}
bis b_ref
bis b_old_epi -DEPI=2
bis b_noload -DLOADS=0
bis b_noload_nobar -DLOADS=0 -DBARS=0
bis b_noconv -DCONV=0
bis b_noepi -DEPI=0
bis b_sep -DSEP=1
bis b_dirb -DDIRB=1
cp "$OUT/nv/matmul_cm.spv" "$OUT"/nv/nv_16x16x16_*.spv "$B/"
# (fields: M N K WG SGM FM FN SPLIT BK [STAGES [SLICES]]; the plans of vk_cm_plan_make first)
cat >> "$B/list.txt" <<'L'
nv_16x16x16_1x1 mma 33 256 8192
nv_16x16x16_1x1 mma 2112 256 8192
nv_16x16x16_2x4 mma 132 256 65536
nv_16x16x16_2x4 mma 2112 256 65536
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64 3
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64
matmul_cm gemm 512 4096 4096 256 2 4 2 2 32 1 1
matmul_cm gemm 512 4096 4096 256 2 4 2 1 32 1 1
matmul_cm gemm 2048 4096 4096 256 2 4 2 2 32 1 1
matmul_cm gemm 512 4096 4096 256 2 4 2 2 32
matmul_cm gemm 512 4096 4096 256 1 4 1 2 64 1 1
b_old_epi gemm 512 4096 4096 256 2 4 2 2 32 1 1
b_old_epi gemm 512 4096 4096 256 2 4 2 1 32 1 1
b_noload gemm 512 4096 4096 256 2 4 2 2 32 1 1
b_noload_nobar gemm 512 4096 4096 256 2 4 2 2 32 1 1
b_noconv gemm 512 4096 4096 256 2 4 2 2 32 1 1
b_noepi gemm 512 4096 4096 256 2 4 2 2 32 1 1
b_sep gemm 512 4096 4096 256 2 4 2 2 32 1 1
b_noload gemm 64 4096 4096 256 1 4 1 2 64
b_noload_nobar gemm 64 4096 4096 256 1 4 1 2 64
b_noepi gemm 64 4096 4096 256 1 4 1 2 64
b_dirb gemm 64 4096 4096 256 1 4 1 2 64
b_dirb gemm 64 4096 4096 256 1 4 1 2 128
b_dirb gemm 16 4096 4096 256 1 1 1 2 64
b_dirb gemm 16 4096 4096 256 1 1 1 2 128
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64
matmul_cm gemm 16 4096 4096 256 1 1 2 2 32
matmul_cm gemm 16 4096 4096 256 1 1 2 2 32 3
matmul_cm gemm 16 4096 4096 256 1 1 2 1 32
matmul_cm gemm 64 4096 4096 256 1 4 2 2 32
matmul_cm gemm 64 4096 4096 256 1 4 2 1 32
matmul_cm gemm 64 4096 4096 256 2 2 1 2 64
matmul_cm gemm 64 4096 4096 256 2 2 2 2 32
matmul_cm gemm 64 4096 4096 128 1 4 1 2 64
matmul_cm gemm 16 4096 4096 256 1 1 1 1 64
matmul_cm gemm 64 4096 4096 256 1 4 1 1 64
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64
L
# the raw epilogue (RAW 1, the last field: raw accumulators to the padded partial buffer,
# LLMEM_VULKAN_CM_RAW) against the scaled one at the plans of vk_cm_plan_make (OUT/raw)
R=$OUT/raw
mkdir -p "$R"
cp "$OUT/nv/matmul_cm.spv" "$B/b_noepi.spv" "$R/"
cat > "$R/list.txt" <<'L'
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 0 0
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 0 1
b_noepi gemm 64 4096 4096 256 1 4 1 2 64
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64 3 0 0
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64 3 0 1
matmul_cm gemm 64 4096 4096 256 1 4 1 1 64 1 0 0
matmul_cm gemm 64 4096 4096 256 1 4 1 1 64 1 0 1
matmul_cm gemm 16 4096 4096 256 1 1 1 1 64 3 0 0
matmul_cm gemm 16 4096 4096 256 1 1 1 1 64 3 0 1
matmul_cm gemm 64 14336 4096 256 1 4 1 2 64 1 0 0
matmul_cm gemm 64 14336 4096 256 1 4 1 2 64 1 0 1
matmul_cm gemm 512 4096 4096 256 2 4 2 2 32 1 1 0
matmul_cm gemm 512 4096 4096 256 2 4 2 2 32 1 1 1
matmul_cm gemm 2048 4096 4096 256 2 4 2 2 32 1 1 0
matmul_cm gemm 2048 4096 4096 256 2 4 2 2 32 1 1 1
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 0 0
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 0 1
matmul_cm gemm 512 4096 4096 256 2 4 2 2 16 1 1
matmul_cm gemm 512 4096 4096 256 2 4 2 2 16 2 1
matmul_cm gemm 512 4096 4096 256 2 4 2 2 16 3 1
matmul_cm gemm 512 4096 4096 256 2 4 2 2 16 4 1
matmul_cm gemm 512 4096 4096 256 2 4 2 1 32 2 1
matmul_cm gemm 512 4096 4096 256 2 4 2 1 32 3 1
matmul_cm gemm 512 4096 4096 256 2 4 2 1 32 1 1
matmul_cm gemm 512 4096 4096 256 2 4 2 2 32 1 1 0
L
# the sum of the split-K slices in the shader (RAW 2, LLMEM_VULKAN_CM_RAW=3) against the raw
# tiles alone (RAW 1, whose sum_slices_cm pass is not timed here) at the plugin's plans (one
# wave: 4 slices at 16/64 x 4096 x 4096, 1 at 64 x 14336; OUT/fused)
F=$OUT/fused
mkdir -p "$F"
cp "$OUT/nv/matmul_cm.spv" "$F/"
cat > "$F/list.txt" <<'L'
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 4 1
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 4 2
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64 3 4 1
matmul_cm gemm 16 4096 4096 256 1 1 1 2 64 3 4 2
matmul_cm gemm 64 14336 4096 256 1 4 1 2 64 1 1 1
matmul_cm gemm 64 14336 4096 256 1 4 1 2 64 1 1 2
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 8 1
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 8 2
matmul_cm gemm 512 4096 4096 256 2 4 2 2 32 1 1 1
matmul_cm gemm 512 4096 4096 256 2 4 2 2 32 1 1 2
matmul_cm gemm 2048 4096 4096 256 2 4 2 2 32 1 1 1
matmul_cm gemm 2048 4096 4096 256 2 4 2 2 32 1 1 2
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 4 1
matmul_cm gemm 64 4096 4096 256 1 4 1 2 64 1 4 2
L
# shaders/matmul_cmp.comp (the prefill GEMM with larger warp tiles: docs/benchmarks.md, "Vulkan
# prefill GEMM with larger warp tiles") against matmul_cm.comp at 512 x 4096 x 4096 and the other
# prefill shapes (OUT/cmp; fields M N K WG SGM FM FN SPLIT BK STAGES SLICES RAW: matmul_cmp is
# RAW 1 (raw tiles) or 2 (out written by the shader: cmp_fin only); cmp_pf0 / cmp_pf2 / cmp_pf3: its PF 0 / 2 / 3
# schedules; cmp_noload: no global loads in its K loop, cmp_nl: nor barriers; cmp_noconv: bf16
# weights not converted (timing only); cmp_ad: a's fragments straight from global memory (ADIRECT);
# cmp_fin: with the RAW 2 epilogue (FINAL_EPI);
# OUT/cmpk: the same compiled as GL_KHR_cooperative_matrix)
C=$OUT/cmp
mkdir -p "$C"
cp "$OUT/nv/matmul_cm.spv" "$C/"
cmp() { # dir name api defines... (api: nv, or khr with $GLSLANG_KHR)
    local dir=$1 n=$2 api=$3; shift 3
    if [ "$api" = khr ]; then
        $GLSLANG_KHR -V -g0 --target-env vulkan1.2 -DKHR -I"$ROOT/shaders" "$@" "$ROOT/shaders/matmul_cmp.comp" \
            -o "$dir/$n.spv" > /dev/null
    else
        $GLSLANG -V --target-env vulkan1.1 -I"$ROOT/shaders" "$@" "$ROOT/shaders/matmul_cmp.comp" \
            -o "$dir/$n.spv" > /dev/null
    fi
}
cmp_set() { # dir api
    cmp "$1" cmp "$2"
    cmp "$1" cmp_pf0 "$2" -DPF=0
    cmp "$1" cmp_pf2 "$2" -DPF=2
    cmp "$1" cmp_noload "$2" -DLOADS=0
    cmp "$1" cmp_nl "$2" -DLOADS=0 -DBARS=0
    cmp "$1" cmp_pf3 "$2" -DPF=3
    cmp "$1" cmp_noconv "$2" -DCONV=0
    cmp "$1" cmp_ad "$2" -DADIRECT=1
    cmp "$1" cmp_fin "$2" -DFINAL_EPI=1
}
cmp_set "$C" nv
cp "$SRC/cmp_list.txt" "$C/list.txt"
if [ -n "${GLSLANG_KHR:-}" ]; then
    mkdir -p "$OUT/cmpk"
    cmp_set "$OUT/cmpk" khr
    cp "$SRC/cmp_list_khr.txt" "$OUT/cmpk/list.txt"
    # the layout sweep at the 496-row prefill shapes (OUT/cmpsw: cmp_sweep.py's list, one copy
    # of the KHR module per layout name; cmp_rank.py ranks a run's output against the default)
    mkdir -p "$OUT/cmpsw"
    python3 "$SRC/cmp_sweep.py" > "$OUT/cmpsw/list.txt"
    for n in $(cut -d' ' -f1 "$OUT/cmpsw/list.txt" | sort -u); do
        cp "$OUT/cmpk/cmp.spv" "$OUT/cmpsw/$n.spv"
    done
fi
# shaders/matmul_cm2.comp (the prefill GEMM on VK_NV_cooperative_matrix2's workgroup-scope
# matrices; SPIR-V 1.6, glslang 15 only) against matmul_cmp.comp's KHR module, in one process
# (OUT/cm2, list cm2_list.txt; the same gemm fields: its tile is 16 FM SGM x 16 FN (WG / 32 /
# SGM), RAW 1): cm2 (the defaults: every tile through clamping layouts, bf16 weights converted
# element by element, the K loop unrolled 2 steps), cm2_c2 (CLAMP 2: clamping layouts only on
# edge tiles), cm2_u1 / cm2_u4 (1 / 4 steps a trip), cm2_dec (CONV 1: bf16 through a decode
# function), cm2_nc (CONV 0: no conversion, timing only), cm2_c2u1 (CLAMP 2 and UNROLL 1).
# docs/benchmarks.md, "Vulkan prefill on VK_NV_cooperative_matrix2", has what they measured.
if [ -n "${GLSLANG_KHR:-}" ]; then
    M2=$OUT/cm2
    mkdir -p "$M2"
    cmp "$M2" cmp khr
    for v in cm2: cm2_c2:-DCLAMP=2 cm2_u1:-DUNROLL=1 cm2_u4:-DUNROLL=4 cm2_dec:-DCONV=1 \
        cm2_nc:-DCONV=0 cm2_c2u1:-DCLAMP=2:-DUNROLL=1; do
        IFS=: read -r n d d2 <<< "$v"
        $GLSLANG_KHR -V -g0 --target-env vulkan1.3 $d $d2 "$ROOT/shaders/matmul_cm2.comp" \
            -o "$M2/$n.spv" > /dev/null
    done
    cp "$SRC/cm2_list.txt" "$M2/list.txt"
fi
if [ -n "${GLSLANG_KHR:-}" ]; then
    mkdir -p "$OUT/khr"
    shaders khr "$OUT/khr" $GLSLANG_KHR
fi
echo "built $OUT"
