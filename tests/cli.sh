#!/usr/bin/env bash
# The command line's errors: bad arguments, missing files, malformed input,
# tokens outside the vocabulary each give one clear line on stderr and a
# non-zero exit status; --help answers with status 0.
#   tests/cli.sh LLMEM_BIN REPO_ROOT
set -uo pipefail
bin="$1"; root="$2"
fx="$root/tests/fixtures/llama"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail=0
expect_fail() { # description, pattern expected on stderr, command...
  local what="$1" pat="$2"; shift 2
  "$@" > "$tmp/out" 2> "$tmp/err"; local rc=$?
  if [ $rc -eq 0 ] || ! grep -q -- "$pat" "$tmp/err"; then
    echo "FAIL: $what (exit $rc): $(head -c 300 "$tmp/err")"; fail=1
  else
    echo "ok: $what -> $(head -n1 "$tmp/err")"
  fi
}
expect_ok() {
  local what="$1"; shift
  if ! "$@" > "$tmp/out" 2> "$tmp/err"; then echo "FAIL: $what"; fail=1; else echo "ok: $what"; fi
}
for c in generate score replay bench info; do expect_ok "$c --help" "$bin" "$c" --help; done
expect_ok "--help" "$bin" --help
expect_fail "unknown command" "unknown command" "$bin" frobnicate
expect_fail "unknown option" "unknown option" "$bin" score --frob
expect_fail "score without input" "--input" "$bin" score --model "$fx"
expect_fail "missing input file" "cannot open" "$bin" score --model "$fx" --input "$tmp/none.jsonl" --backend cpu
expect_fail "missing model" "cannot load model" "$bin" score --model "$tmp/nomodel" --input "$fx/cases.jsonl" --backend cpu
printf '{"id": 1, "tokens": [1, 2, 999999]}\n' > "$tmp/big.jsonl"
expect_fail "token >= vocab" "not an id in" "$bin" score --model "$fx" --input "$tmp/big.jsonl" --backend cpu
printf '{"id": 1, "tokens": [1, 2\n' > "$tmp/bad.jsonl"
expect_fail "malformed JSON line" "expected an object" "$bin" score --model "$fx" --input "$tmp/bad.jsonl" --backend cpu
expect_fail "bad integer" "wants an integer" "$bin" score --model "$fx" --input "$fx/cases.jsonl" --page-size 0
expect_fail "bad kv type" "kv-type" "$bin" score --model "$fx" --input "$fx/cases.jsonl" --kv-type q4
expect_fail "unknown backend" "backend" "$bin" generate --model "$fx" --backend nosuch -n 1
mkdir -p "$tmp/trunc" && cp "$fx/config.json" "$tmp/trunc/" && head -c 1000 "$fx/model.safetensors" > "$tmp/trunc/model.safetensors"
expect_fail "truncated safetensors" "cannot load model" "$bin" score --model "$tmp/trunc" --input "$fx/cases.jsonl" --backend cpu
mkdir -p "$tmp/cfg" && cp "$fx/model.safetensors" "$tmp/cfg/" && echo '{"model_type": "gpt2"}' > "$tmp/cfg/config.json"
expect_fail "unsupported architecture" "cannot load model" "$bin" score --model "$tmp/cfg" --input "$fx/cases.jsonl" --backend cpu
expect_fail "score --input a directory" "is a directory" "$bin" score --model "$fx" --input "$tmp" --backend cpu
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,4,2\n' > "$tmp/trace.csv"
expect_fail "replay --text a directory" "is a directory" "$bin" replay --model "$fx" --backend cpu --trace "$tmp/trace.csv" --text "$tmp"
expect_fail "replay --trace a directory" "is a directory" "$bin" replay --model "$fx" --backend cpu --trace "$tmp" --text "$fx/config.json"
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n99999999999999999999-11-16 18:15:46.5,4,2\n' > "$tmp/huge.csv"
expect_fail "replay: overflowing year" "huge.csv:2" "$bin" replay --model "$fx" --backend cpu --trace "$tmp/huge.csv" --text "$fx/config.json"
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,99999999999999999999,2\n' > "$tmp/huge2.csv"
expect_fail "replay: overflowing length" "huge2.csv:2" "$bin" replay --model "$fx" --backend cpu --trace "$tmp/huge2.csv" --text "$fx/config.json"
expect_fail "bad --temp" "bad value" "$bin" generate --model "$fx" --temp -1
exit $fail
