#!/usr/bin/env bash
# Installs what is missing, builds llmem into build/, then runs the demo:
# a hybrid memory (paged KV cache + recurrent state) that plans, applies and
# commits a multi-sequence batch and prints what it did.
#
#   ./scripts/demo.sh
set -euo pipefail
# shellcheck source=scripts/setup.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
llmem_setup

demo="$LLMEM_BUILD/bin/hybrid_demo"
if [ ! -x "$demo" ]; then
  if [ ! -f "$LLMEM_ROOT/examples/hybrid_demo.c" ]; then
    llmem_log "the demo program examples/hybrid_demo.c does not exist yet; nothing to run"
  else
    llmem_log "$demo was not built; see the build output above"
  fi
  exit 1
fi
llmem_log "running $demo"
exec "$demo"
