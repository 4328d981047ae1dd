#!/bin/bash
# A newer glslang than Debian 12's, as a build-time tool: Debian 12's
# glslang 12 compiles GL_NV_cooperative_matrix only, and matmul_cmp.comp
# runs much faster on the H200 as GL_KHR_cooperative_matrix
# (docs/benchmarks.md, "Vulkan prefill GEMM with larger warp tiles").
# $LLMEM_GLSLANG_SUITE picks the Debian suite it comes from:
#   trixie (default)  glslang 15: GL_KHR_cooperative_matrix (the KHR modules)
#   sid               glslang 16: also GL_EXT_bfloat16, bf16 cooperative
#                     matrices (shaders/matmul_bf.comp)
# Those glslangs need a newer GLIBC than Debian 12's (2.38 and up), so each
# runs through its suite's own loader with that suite's libc6, libstdc++6
# and libgcc-s1 unpacked beside it (nothing is installed). The packages are
# fetched once with apt-get download from a source list of their own, into
# $LLMEM_GLSLANG_KHR_DIR (default ~/.cache/llmem-glslang-khr for trixie,
# ~/.cache/llmem-glslang-sid for sid).
#   tools/glslang_khr.sh ARGS...   runs glslang ARGS...
# Used by shaders/khr/update.sh, and by the build with
# -DLLMEM_GLSLANG_KHR=<this script> (and -DLLMEM_GLSLANG_BF16="env
# LLMEM_GLSLANG_SUITE=sid <this script>"; shaders/shaders.cmake).
set -eu
S=${LLMEM_GLSLANG_SUITE:-trixie}
case $S in
trixie) T=${LLMEM_GLSLANG_KHR_DIR:-$HOME/.cache/llmem-glslang-khr} ;;
sid) T=${LLMEM_GLSLANG_KHR_DIR:-$HOME/.cache/llmem-glslang-sid} ;;
*)
    echo "glslang_khr.sh: LLMEM_GLSLANG_SUITE=$S: want trixie or sid" >&2
    exit 2
    ;;
esac
L=$T/x/usr/lib/x86_64-linux-gnu
if [ ! -x "$T/x/usr/bin/glslang" ]; then
    mkdir -p "$T/lists/partial" "$T/cache/archives/partial" "$T/x"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $S main" \
        > "$T/sources.list"
    A=(-o "Dir::Etc::SourceList=$T/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o "Dir::State::Lists=$T/lists" -o "Dir::Cache=$T/cache")
    apt-get "${A[@]}" update > "$T/update.log" 2>&1
    (cd "$T" && apt-get "${A[@]}" download glslang-tools libc6 libstdc++6 libgcc-s1 > "$T/download.log" 2>&1)
    for f in "$T"/*.deb; do dpkg -x "$f" "$T/x"; done
fi
exec "$L/ld-linux-x86-64.so.2" --library-path "$L" "$T/x/usr/bin/glslang" "$@"
