#!/usr/bin/env bash
# Installs what is missing, builds llmem into build/, then runs the main job
# on the built-in model: `llmem generate` streams Shakespeare-like text from
# the byte-level Bamba hybrid (Mamba-2 + attention) in models/builtin, first
# one sequence, then three in parallel sharing the prompt's pages.
#
#   ./scripts/demo.sh [extra llmem generate options, e.g. --backend vulkan]
set -euo pipefail
# shellcheck source=scripts/setup.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
llmem_setup

llmem="$LLMEM_BUILD/bin/llmem"
if [ ! -x "$llmem" ]; then
  llmem_log "$llmem was not built; see the build output above"
  exit 1
fi
export LLMEM_MODEL_DIR="${LLMEM_MODEL_DIR:-$LLMEM_ROOT/models/builtin}"
llmem_log "$llmem info"
"$llmem" info
llmem_log "one sequence: $llmem generate --prompt 'ROMEO:' -n 300 $*"
"$llmem" generate --prompt $'ROMEO:\n' -n 300 --stats "$@"
llmem_log "three sequences sharing the prompt: $llmem generate --parallel 3 -n 120 $*"
"$llmem" generate --prompt $'JULIET:\n' --parallel 3 -n 120 --seed 7 --stats "$@"
llmem_log "the memory modules underneath: $LLMEM_BUILD/bin/hybrid_demo"
"$LLMEM_BUILD/bin/hybrid_demo"
