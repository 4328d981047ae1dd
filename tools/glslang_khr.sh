#!/bin/bash
# glslang 15 (Debian trixie's glslang-tools) on Debian 12, as a build-time
# tool: Debian 12's glslang 12 compiles GL_NV_cooperative_matrix only, and
# matmul_cmp.comp runs much faster on the H200 as GL_KHR_cooperative_matrix
# (docs/benchmarks.md, "Vulkan prefill GEMM with larger warp tiles").
# Trixie's glslang needs GLIBC 2.38, so it runs through trixie's own
# loader with trixie's libc6, libstdc++6 and libgcc-s1 unpacked beside it
# (nothing is installed). The packages are fetched once with apt-get
# download from a trixie source list of their own, into
# $LLMEM_GLSLANG_KHR_DIR (default ~/.cache/llmem-glslang-khr).
#   tools/glslang_khr.sh ARGS...   runs glslang ARGS...
# Used by shaders/khr/update.sh, and by the build with
# -DLLMEM_GLSLANG_KHR=<this script> (shaders/shaders.cmake).
set -eu
T=${LLMEM_GLSLANG_KHR_DIR:-$HOME/.cache/llmem-glslang-khr}
L=$T/x/usr/lib/x86_64-linux-gnu
if [ ! -x "$T/x/usr/bin/glslang" ]; then
    mkdir -p "$T/lists/partial" "$T/cache/archives/partial" "$T/x"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
        > "$T/sources.list"
    A=(-o "Dir::Etc::SourceList=$T/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o "Dir::State::Lists=$T/lists" -o "Dir::Cache=$T/cache")
    apt-get "${A[@]}" update > "$T/update.log" 2>&1
    (cd "$T" && apt-get "${A[@]}" download glslang-tools libc6 libstdc++6 libgcc-s1 > "$T/download.log" 2>&1)
    for f in "$T"/*.deb; do dpkg -x "$f" "$T/x"; done
fi
exec "$L/ld-linux-x86-64.so.2" --library-path "$L" "$T/x/usr/bin/glslang" "$@"
