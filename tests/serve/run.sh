#!/usr/bin/env bash
# The `llmem serve` test with the official `openai` Python client:
#   run.sh LLMEM_BINARY BUILD_DIR [MODEL_DIR]
# Installs `openai` from PyPI into BUILD_DIR/serve-venv (once); exits 77
# (ctest SKIP_RETURN_CODE) when PyPI cannot be reached.
set -u
llmem=$1
venv=$2/serve-venv
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! "$venv/bin/python" -c 'import openai' 2>/dev/null; then
  python3 -m venv "$venv" || { echo "SKIP: python3 -m venv failed"; exit 77; }
  if ! timeout 180 "$venv/bin/pip" install -q --disable-pip-version-check openai; then
    echo "SKIP: cannot install the openai package from PyPI"
    exit 77
  fi
fi
shift 2
exec "$venv/bin/python" "$here/test_serve.py" "$llmem" "$@"
