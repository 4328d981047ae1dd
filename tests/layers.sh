#!/usr/bin/env bash
# The layers of DESIGN.md, checked on the #include lines of the sources:
#   base/      status, errf, dtypes, buffers, registry, view checks: public
#              headers of the base only (status, backend, backend_impl, view,
#              ops) and its own; no memory, no backend, no model.
#   memory/    public memory headers and its own; no backend implementation
#              header (backend_impl, ops_impl, ops, plugin), nothing of
#              base/ or backends/.
#   backends/  views and the base, never a memory header or memory internals;
#              the cuda and vulkan plugins also stay off base/ internals
#              (they reach llmem through the host table of <llmem/plugin.h>).
#   include/llmem/ base headers (status, backend, backend_impl, view, ops,
#              ops_impl, plugin) include no memory header.
# Usage: tests/layers.sh <source root>. Prints every violation; exits 1 if any.
set -u
root="${1:-$(dirname "$0")/..}"
cd "$root" || exit 2
fail=0

# check <what> <regex of forbidden include targets> <files...>
check() {
  local what="$1" bad="$2"
  shift 2
  local f
  for f in "$@"; do
    [ -f "$f" ] || continue
    while IFS= read -r line; do
      echo "layers: $what: $f: $line"
      fail=1
    done < <(grep -nE "^[[:space:]]*#[[:space:]]*include[[:space:]]+\"($bad)\"" "$f")
  done
}

mem_pub='llmem/(memory|memory_impl|kv_cache|recurrent|hybrid|batch|runtime|model|tokenizer|chat_template)\.h'

check "base includes memory, backends or models" \
  "$mem_pub|memory/.*|backends/.*|models/.*|llmem/plugin\.h" base/*.c base/*.h
check "memory includes backend implementation or base/backends internals" \
  "llmem/(backend_impl|ops_impl|ops|plugin)\.h|base/.*|backends/.*|models/.*" memory/*.c memory/*.h
check "backends include memory" \
  "$mem_pub|memory/.*|models/.*" $(find backends -name '*.c' -o -name '*.h')
check "plugins include base internals or the cpu backend" \
  "base/.*|backends/cpu/.*" $(find backends/cuda backends/vulkan -name '*.c' -o -name '*.h' 2>/dev/null)
check "base headers include memory headers" \
  "$mem_pub" include/llmem/status.h include/llmem/backend.h include/llmem/backend_impl.h \
  include/llmem/view.h include/llmem/ops.h include/llmem/ops_impl.h include/llmem/plugin.h

if [ "$fail" = 0 ]; then
  echo "layers: ok"
fi
exit "$fail"
