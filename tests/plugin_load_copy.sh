#!/usr/bin/env bash
# plugin_load from a copy of the build (bin/, lib/ and tests/plugins/ in a
# temporary folder, as a GPU machine runs a carried copy): the copy must
# find and dlopen its own libllmem and plugins (plugin_load checks where
# libllmem came from), not the build's absolute paths.
#   tests/plugin_load_copy.sh BUILD_DIR EXE_SUBDIR EXE_NAME
set -euo pipefail
build="$1"; sub="$2"; exe="$3"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/$sub" "$tmp/tests"
cp -a "$build/$sub/$exe" "$tmp/$sub/"
cp -a "$build/lib" "$tmp/"
cp -a "$build/tests/plugins" "$tmp/tests/"
out="$("$tmp/$sub/$exe")" || { echo "$out"; exit 1; }
echo "$out"
grep -q "^plugin_load: libllmem $tmp/lib/" <<< "$out" ||
  { echo "plugin_load_copy: the copy did not use its own libllmem" >&2; exit 1; }
