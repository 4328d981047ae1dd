#!/bin/bash
# Builds the entries of shaders/matmul_dec.comp (the 9-64-row decode GEMM that streams the
# weights with each subgroup on its own: docs/benchmarks.md, "A decode GEMM that streams the
# weights") against matmul_cm.comp's decode plans (its KHR module, shaders/khr/matmul_cm.spv)
# into OUT/dec (default build-vk_cm_bench/dec), with the harness itself in OUT: both KHR, so one
# process runs them all (README.md: NV and KHR in separate processes). dec_list.py writes the
# list (old and new alternated per shape; entries whose shared memory would pass 48 KiB are
# left out: a larger one lost the device on the H200). Needs $GLSLANG_KHR or
# tools/glslang_khr.sh.
#   tools/vk_cm_bench/dec_build.sh [OUT]
#   (GPU) VK_DRIVER_FILES=... OUT/vk_cm_bench OUT/dec [LIST]   (LIST: list.txt or ws.txt)
set -eu
cd "$(dirname "$0")"
. ./dec_common.sh
dec_setup dec "${1:-}"
for ka in 64 128 256 512 1024; do
    khr matmul_dec dec_ka${ka}_a1 -DKA_DEFAULT=$ka -DAPF_DEFAULT=1
    khr matmul_dec dec_ka${ka}_a0 -DKA_DEFAULT=$ka -DAPF_DEFAULT=0
done
khr matmul_dec dec_probe -DPROBE=1 -DKA_DEFAULT=1024
# the staging's subgroup barriers as workgroup barriers (vkws measured them 2-14% slower)
khr matmul_dec dec_ka512_a1_wgs -DKA_DEFAULT=512 -DAPF_DEFAULT=1 -DWG_SYNC=1
khr matmul_dec dec_ka512_a0_wgs -DKA_DEFAULT=512 -DAPF_DEFAULT=0 -DWG_SYNC=1
khr matmul_dec dec_ka64_a1_wgs -DKA_DEFAULT=64 -DAPF_DEFAULT=1 -DWG_SYNC=1
# dec_ws.comp, the warp-specialized variant (docs/benchmarks.md, "A warp-specialized decode
# GEMM"): one module a chunk KA and producer count NP; its list ws.txt (ws_list.py) also runs
# the old plans and the _wgs entries above. (GPU) OUT/vk_cm_bench OUT/dec ws.txt
for ka in 64 128 256 512; do
    for np in 2 4 6 8; do
        $GK -V -g0 --target-env vulkan1.2 -DKA_DEFAULT=$ka -DNP_DEFAULT=$np dec_ws.comp \
            -o "$D/ws_ka${ka}_np$np.spv" > /dev/null
        $GK -V -g0 --target-env vulkan1.2 -DKA_DEFAULT=$ka -DNP_DEFAULT=$np -DSEP=1 dec_ws.comp \
            -o "$D/sep_ka${ka}_np$np.spv" > /dev/null
    done
done
# -DFLAGS=1 (a ring of NSTAGE stages handed over by counters): fl_kaKA_npNP_sS
for v in 512:4:3 512:6:3 512:2:4 512:2:3 256:4:2 256:6:2; do
    IFS=: read -r ka np st <<< "$v"
    $GK -V -g0 --target-env vulkan1.2 -DKA_DEFAULT=$ka -DNP_DEFAULT=$np -DFLAGS=1 -DNSTAGE=$st \
        dec_ws.comp -o "$D/fl_ka${ka}_np${np}_s$st.spv" > /dev/null
done
python3 dec_list.py > "$D/list.txt"
python3 ws_list.py > "$D/ws.txt"
python3 ws_list.py flags > "$D/fl.txt"
echo "built $D ($(grep -c gemm "$D/list.txt") + $(grep -c gemm "$D/ws.txt") entries)"
