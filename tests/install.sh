#!/usr/bin/env bash
# The install is relocatable and safe: `cmake --install` to a temporary
# prefix, the prefix moved, then
#   - every installed file lies under the prefix (plugins in lib/llmem, the
#     built-in model in share/llmem/builtin);
#   - the moved `llmem info` runs (RPATH $ORIGIN/../lib), finds the moved
#     plugins and the built-in model, and names no build-tree folder;
#   - libllmem's read-only data holds no build-tree path;
#   - a plugin in a folder others can write is refused with a clear message;
#   - the README example builds and runs with pkg-config and with
#     find_package(llmem 0.1), and find_package(llmem 1.0) is refused.
#   tests/install.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build="$(cd "$1" && pwd)"; src="$(cd "$2" && pwd)"
tmp="$(mktemp -d)"; trap 'chmod -R u+w "$tmp"; rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

cmake --install "$build" --prefix "$tmp/p1" > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
outside=$(grep -o '^-- Installing: .*' "$tmp/install.log" | sed 's/^-- Installing: //' | grep -v "^$tmp/p1/" || true)
[ -z "$outside" ] && ok "every file under the prefix" || bad "installed outside the prefix: $outside"
mv "$tmp/p1" "$tmp/p2"; P="$tmp/p2"
lib="$(dirname "$(find "$P" -name 'libllmem.so.*' | head -n1)")"
[ -f "$P/share/llmem/builtin/config.json" ] && ok "built-in model in share/llmem" || bad "no share/llmem/builtin/config.json"
[ -f "$P/share/bash-completion/completions/llmem" ] && ok "bash completion installed" || bad "no bash completion"
for f in "$build"/lib/llmem/libllmem-*.so; do
  [ -e "$f" ] || continue
  [ -f "$lib/llmem/$(basename "$f")" ] && ok "plugin $(basename "$f") in lib/llmem" || bad "plugin $(basename "$f") not installed in lib/llmem"
done

clean_env=(env -u LLMEM_BACKEND_PATH -u LLMEM_MODEL_DIR -u LD_LIBRARY_PATH)
if "${clean_env[@]}" "$P/bin/llmem" info > "$tmp/info" 2>&1; then
  ok "moved llmem info runs"
  if grep -q "$build" "$tmp/info"; then bad "llmem info names the build tree: $(cat "$tmp/info")"; fi
  if [ -f "$lib/llmem/libllmem-vulkan.so" ] && ! grep -q "^  vulkan: device" "$tmp/info"; then
    bad "the moved vulkan plugin is not found: $(grep vulkan "$tmp/info")"
  fi
  if grep -q "searched: " "$tmp/info" && ! grep "searched: " "$tmp/info" | grep -q "$P/"; then
    bad "a missing plugin was not searched for in the moved prefix: $(grep 'searched: ' "$tmp/info")"
  else
    ok "plugins searched in the moved prefix"
  fi
else
  bad "moved llmem info: $(cat "$tmp/info")"
fi
if "${clean_env[@]}" "$P/bin/llmem" generate -n 4 --temp 0 --backend cpu -v > "$tmp/gen" 2>&1 &&
   grep -q "loading model '$P/.*share/llmem/builtin'" "$tmp/gen"; then
  ok "moved llmem generate uses the moved built-in model"
else
  bad "moved llmem generate: $(cat "$tmp/gen")"
fi
so="$(find "$lib" -maxdepth 1 -name 'libllmem.so.*' -type f | head -n1)"
if objcopy -O binary --only-section=.rodata "$so" "$tmp/rodata" 2>/dev/null; then
  grep -aq "$build" "$tmp/rodata" && bad "libllmem's .rodata holds the build folder $build" || ok "no build-tree path in libllmem"
fi

# a plugin others can write (the folder, then the file) is refused
if [ -f "$build/tests/plugins/libllmem-testplug.so" ]; then
  mkdir "$tmp/ww" && cp "$build/tests/plugins/libllmem-testplug.so" "$tmp/ww/" && chmod 777 "$tmp/ww"
  out=$(LLMEM_BACKEND_PATH="$tmp/ww" "$P/bin/llmem" bench --backend testplug 2>&1)
  if [ $? -ne 0 ] && grep -q "refused.*writable by others" <<< "$out"; then ok "world-writable plugin folder refused"; else bad "world-writable folder: $out"; fi
  chmod 755 "$tmp/ww"; chmod 666 "$tmp/ww/libllmem-testplug.so"
  out=$(LLMEM_BACKEND_PATH="$tmp/ww" "$P/bin/llmem" bench --backend testplug 2>&1)
  if [ $? -ne 0 ] && grep -q "refused.*writable by others" <<< "$out"; then ok "world-writable plugin file refused"; else bad "world-writable file: $out"; fi
fi

# the README example, built against the moved install
awk '/^```c$/{on=1; next} /^```$/{if (on) exit} on' "$src/README.md" > "$tmp/example.c"
[ -s "$tmp/example.c" ] || bad "no C example in README.md"
if PKG_CONFIG_PATH="$lib/pkgconfig" cc -std=c11 "$tmp/example.c" -o "$tmp/ex_pc" \
     $(PKG_CONFIG_PATH="$lib/pkgconfig" pkg-config --cflags --libs llmem) -Wl,-rpath,"$lib" 2> "$tmp/cc.log" &&
   "${clean_env[@]}" "$tmp/ex_pc" > "$tmp/ex.out" 2>&1; then
  ok "README example with pkg-config: $(tail -n1 "$tmp/ex.out")"
else
  bad "README example with pkg-config: $(cat "$tmp/cc.log" "$tmp/ex.out" 2>/dev/null | head -c 600)"
fi
mkdir -p "$tmp/cm" && cp "$tmp/example.c" "$tmp/cm/"
cat > "$tmp/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(llmem_example C)
find_package(llmem ${WANT} REQUIRED)
add_executable(example example.c)
target_link_libraries(example PRIVATE llmem::llmem)
CM
if cmake -S "$tmp/cm" -B "$tmp/cm/b" -DWANT=0.1 -DCMAKE_PREFIX_PATH="$P" > "$tmp/cm.log" 2>&1 &&
   cmake --build "$tmp/cm/b" >> "$tmp/cm.log" 2>&1 && "${clean_env[@]}" "$tmp/cm/b/example" > "$tmp/ex2.out" 2>&1; then
  ok "README example with find_package(llmem 0.1): $(tail -n1 "$tmp/ex2.out")"
else
  bad "find_package(llmem 0.1): $(tail -n 20 "$tmp/cm.log")"
fi
if cmake -S "$tmp/cm" -B "$tmp/cm/b2" -DWANT=1.0 -DCMAKE_PREFIX_PATH="$P" > "$tmp/cm2.log" 2>&1; then
  bad "find_package(llmem 1.0) accepted version $(grep -o 'version: [0-9.]*' "$tmp/cm2.log")"
else
  ok "find_package(llmem 1.0) refused"
fi
exit $fail
