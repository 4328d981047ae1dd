#!/usr/bin/env bash
# The command line's errors: bad arguments, missing files, malformed input,
# tokens outside the vocabulary each give one clear line on stderr and a
# non-zero exit status; --help answers with status 0. Then the flags people
# type (llama.cpp aliases, --opt=value, --stop) and admission under memory
# pressure: work that does not fit waits, and its output equals the output
# of a run with room for everything.
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
for b in 0 65 x 16x; do
  expect_fail "LLMEM_BENCH_BATCH=$b" "LLMEM_BENCH_BATCH='$b' is not a batch size" env LLMEM_BENCH_BATCH=$b "$bin" bench -m "$fx" --backend cpu
done
expect_fail "unknown option" "unknown option" "$bin" score --frob
# bench --bookkeeping --mem: exact names (a name that merely contains one was read as it)
for m in kvfoo "kv_cache," hybridx recurrentkv; do
  expect_fail "bench --bookkeeping --mem $m" "is not a memory" "$bin" bench --bookkeeping --mem "$m" --seqs 2 --ctx 16 --page 16 --reps 1 --no-prompt
done
expect_ok "bench --bookkeeping --mem kv,rec,hybrid" "$bin" bench --bookkeeping --mem kv,rec,hybrid --seqs 2 --ctx 16 --page 16 --reps 1 --no-prompt
expect_fail "score without input" "--input" "$bin" score --model "$fx"
expect_fail "missing input file" "cannot open" "$bin" score --model "$fx" --input "$tmp/none.jsonl" --backend cpu
expect_fail "missing model" "cannot load model" "$bin" score --model "$tmp/nomodel" --input "$fx/cases.jsonl" --backend cpu
printf '{"id": 1, "tokens": [1, 2, 999999]}\n' > "$tmp/big.jsonl"
expect_fail "token >= vocab" "not an id in" "$bin" score --model "$fx" --input "$tmp/big.jsonl" --backend cpu
printf '{"id": 1, "tokens": [1, 2\n' > "$tmp/bad.jsonl"
expect_fail "malformed JSON line" "bad.jsonl:1: not valid JSON" "$bin" score --model "$fx" --input "$tmp/bad.jsonl" --backend cpu
# a line is one JSON text as json.loads reads it: these were taken, the first
# as its object, the second as its first "tokens" (json.loads keeps the last)
printf '{"id": 1, "tokens": [1, 2, 3]} [4]\n' > "$tmp/tail.jsonl"
expect_fail "bytes after a JSON line" "tail.jsonl:1: bytes after the JSON object" "$bin" score --model "$fx" --input "$tmp/tail.jsonl" --backend cpu
printf '{"id": 1, "tokens": [1, 2, 3], "tokens": [4, 5]}\n' > "$tmp/dup.jsonl"
expect_fail "a key twice in a JSON line" "key 'tokens' appears twice" "$bin" score --model "$fx" --input "$tmp/dup.jsonl" --backend cpu
printf '{"text": "a\\u0000b"}\n' > "$tmp/nul.jsonl"
expect_fail "tokenize: a text holding U+0000" "holds \\\\u0000" "$bin" tokenize --tokenizer "$fx" --input "$tmp/nul.jsonl"
expect_fail "bad integer" "wants an integer" "$bin" score --model "$fx" --input "$fx/cases.jsonl" --page-size 0
expect_fail "bad kv type" "kv-type" "$bin" score --model "$fx" --input "$fx/cases.jsonl" --kv-type q4
expect_fail "unknown backend" "backend" "$bin" generate --model "$fx" --backend nosuch -n 1
mkdir -p "$tmp/trunc" && cp "$fx/config.json" "$tmp/trunc/" && head -c 1000 "$fx/model.safetensors" > "$tmp/trunc/model.safetensors"
expect_fail "truncated safetensors" "cannot load model" "$bin" score --model "$tmp/trunc" --input "$fx/cases.jsonl" --backend cpu
mkdir -p "$tmp/cfg" && cp "$fx/model.safetensors" "$tmp/cfg/" && echo '{"model_type": "gpt2"}' > "$tmp/cfg/config.json"
expect_fail "unsupported architecture" "cannot load model" "$bin" score --model "$tmp/cfg" --input "$fx/cases.jsonl" --backend cpu
expect_fail "score --input a directory" "is a directory" "$bin" score --model "$fx" --input "$tmp" --backend cpu
# a config.json with fewer layers than the checkpoint: the unused tensors are named
mkdir -p "$tmp/fewer" && cp "$fx/model.safetensors" "$tmp/fewer/" &&
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["num_hidden_layers"]-=1; json.dump(c,open(sys.argv[2],"w"))' \
    "$fx/config.json" "$tmp/fewer/config.json"
expect_fail "config with fewer layers than the checkpoint" "not used by config.json" "$bin" score --model "$tmp/fewer" --input "$fx/cases.jsonl" --backend cpu
# an infinite time_step_min (a Mamba-2 dt initialisation value) is refused
bfx="$root/tests/fixtures/bamba"
mkdir -p "$tmp/dt" && cp "$bfx/model.safetensors" "$tmp/dt/" &&
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c["time_step_min"]="INF"; open(sys.argv[2],"w").write(json.dumps(c).replace("\"INF\"","1e999"))' \
    "$bfx/config.json" "$tmp/dt/config.json"
expect_fail "infinite time_step_min" "time_step_min" "$bin" score --model "$tmp/dt" --input "$bfx/cases.jsonl" --backend cpu
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,4,2\n' > "$tmp/trace.csv"
expect_fail "replay --logprobs without --output" "goes with --output" "$bin" replay --model "$fx" --backend cpu --logprobs
expect_fail "replay --text a directory" "is a directory" "$bin" replay --model "$fx" --backend cpu --trace "$tmp/trace.csv" --text "$tmp"
expect_fail "replay --trace a directory" "is a directory" "$bin" replay --model "$fx" --backend cpu --trace "$tmp" --text "$fx/config.json"
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n99999999999999999999-11-16 18:15:46.5,4,2\n' > "$tmp/huge.csv"
expect_fail "replay: overflowing year" "huge.csv:2" "$bin" replay --model "$fx" --backend cpu --trace "$tmp/huge.csv" --text "$fx/config.json"
printf 'TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,99999999999999999999,2\n' > "$tmp/huge2.csv"
expect_fail "replay: overflowing length" "huge2.csv:2" "$bin" replay --model "$fx" --backend cpu --trace "$tmp/huge2.csv" --text "$fx/config.json"
expect_fail "bad --temp" "bad value" "$bin" generate --model "$fx" --temp -1
expect_fail "prompt ids with junk" "'x', is not an id" "$bin" generate --model "$fx" --backend cpu -n 1 --prompt-ids "1 2 x 3"
expect_fail "prompt id out of range" "'256', is not an id" "$bin" generate --model "$fx" --backend cpu -n 1 --prompt-ids "1 256"
expect_fail "two prompt sources" "one of --prompt" "$bin" generate --model "$fx" -p a --prompt-ids 1
expect_fail "prompt file a directory" "is a directory" "$bin" generate --model "$fx" --backend cpu -n 1 --file "$tmp"
expect_fail "missing value" "needs a value" "$bin" generate --model "$fx" --temp
expect_fail "stray argument" "unexpected argument" "$bin" generate --model "$fx" hello
expect_fail "bad --precision" "precise or fast" "$bin" score --model "$fx" --input "$fx/cases.jsonl" --precision medium
expect_fail "bad --log-level" "log-level" "$bin" info --log-level loud
expect_fail "bad --prefix-cache-mb" "prefix-cache-mb wants" "$bin" generate --model "$fx" --prefix-cache-mb 0
expect_fail "prefix budget below one page" "cannot hold one cached page" "$bin" generate --model "$fx" --backend cpu -n 1 --prefix-cache-mb 0.000001
expect_fail "hybrid prefix budget below a page and a snapshot" "cannot hold" "$bin" generate --model "$bfx" --backend cpu -n 1 --prefix-cache-mb 0.000001
# a model whose every log-prob is NaN: the run fails and names the case
python3 - "$fx" "$tmp/nan" <<'PY' || { echo "FAIL: cannot write the NaN model"; fail=1; }
import json, struct, sys, os, shutil
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
shutil.copy(os.path.join(src, "config.json"), dst)
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
data = bytearray(raw)
name = next(k for k in sorted(hdr) if "norm" in k and k != "__metadata__" and hdr[k]["dtype"] == "F32")
a, b = hdr[name]["data_offsets"]
data[8 + n + a:8 + n + b] = struct.pack("<f", float("nan")) * ((b - a) // 4)
open(os.path.join(dst, "model.safetensors"), "wb").write(data)
PY
expect_fail "non-finite log-probs" "not finite" "$bin" score --model "$tmp/nan" --input "$fx/cases.jsonl" --backend cpu
expect_fail "--check-tensors on a NaN weight" "has a non-finite value" "$bin" score --model "$tmp/nan" --input "$fx/cases.jsonl" --backend cpu --check-tensors

# llama.cpp-style flags: -m -p -n -c -t, --temp 0 and --temp=0 give the same text
expect_ok "generate -m -p -n -c -t --temp 0" "$bin" generate -m "$fx" -p "ab" -n 8 -c 64 -t 1 --temp 0 --backend cpu
cp "$tmp/out" "$tmp/g_space"
expect_ok "generate --temp=0" "$bin" generate --model="$fx" --prompt=ab --n-predict=8 --temp=0 --backend=cpu
if cmp -s "$tmp/out" "$tmp/g_space"; then echo "ok: --temp 0 and --temp=0 agree"; else echo "FAIL: --temp=0 differs"; fail=1; fi
if [ "$(tail -c 1 "$tmp/out" | od -An -c | tr -d ' ')" = '\n' ]; then echo "ok: final newline"; else echo "FAIL: no final newline"; fail=1; fi
expect_ok "info --json" "$bin" info --json
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert any(b["name"]=="cpu" and b["available"] for b in d["backends"])' "$tmp/out"; then
  echo "ok: info --json parses, cpu available"; else echo "FAIL: info --json"; fail=1; fi
# -n 1 prints one token (the built-in model is byte-level, and "ROMEO:\n"
# is followed by a letter, then by more): the first byte of -n 2's text
"$bin" generate -p $'ROMEO:\n' -n 2 --temp 0 --backend cpu > "$tmp/n2" 2> "$tmp/err" || { echo "FAIL: generate -n 2"; fail=1; }
expect_ok "generate -n 1" "$bin" generate -p $'ROMEO:\n' -n 1 --temp 0 --backend cpu
if python3 -c 'import sys; a, b = (open(f, "rb").read() for f in sys.argv[1:]); assert b[7] != 10 and a == b[:8] + b"\n", (a, b)' \
     "$tmp/out" "$tmp/n2"; then echo "ok: -n 1 prints one token"
else echo "FAIL: -n 1 printed '$(cat "$tmp/out")'"; fail=1; fi
# --stop: the text ends right before the first occurrence of the stop string
expect_ok "generate (no stop)" "$bin" generate -p "ROMEO:" -n 60 --temp 0 --backend cpu
cp "$tmp/out" "$tmp/nostop"
expect_ok "generate --stop" "$bin" generate -p "ROMEO:" -n 60 --temp 0 --backend cpu --stop "the" --stop "zzzz"
if python3 - "$tmp/nostop" "$tmp/out" <<'PY'; then echo "ok: --stop cuts before the stop string"; else echo "FAIL: --stop"; fail=1; fi
import sys
full = open(sys.argv[1], "rb").read(); cut = open(sys.argv[2], "rb").read()
gen = full[len(b"ROMEO:"):]
i = gen.find(b"the")
assert i >= 0, "stop string not in the reference text; pick another"
assert cut == b"ROMEO:" + gen[:i] + (b"" if gen[:i].endswith(b"\n") else b"\n"), (cut, gen[:i])
PY

# admission: too few pages for everything at once; the work waits and the
# results equal a run with room for everything (score: 23 cases on 24 pages)
"$bin" score --model "$fx" --input "$fx/cases.jsonl" --backend cpu --n-seq-max 1 > "$tmp/s1" 2> "$tmp/err" || { echo "FAIL: score --n-seq-max 1"; fail=1; }
expect_ok "score --n-pages 24 --n-seq-max 64" "$bin" score --model "$fx" --input "$fx/cases.jsonl" --backend cpu --n-pages 24 --n-seq-max 64
if cmp -s "$tmp/out" "$tmp/s1"; then echo "ok: score under memory pressure equals --n-seq-max 1"; else echo "FAIL: score under memory pressure differs"; fail=1; fi
# (a byte-level copy of the bamba fixture: no tokenizer, so no end-of-text stop)
mkdir -p "$tmp/bamba_bytes" && cp "$root/tests/fixtures/bamba/config.json" "$root/tests/fixtures/bamba/model.safetensors" "$tmp/bamba_bytes/"
for model in "$tmp/bamba_bytes" "$root/models/builtin"; do
  "$bin" generate -m "$model" --backend cpu --temp 0 -n 60 --parallel 4 -p "ROMEO: hello" > "$tmp/g1" 2> "$tmp/err" || { echo "FAIL: generate --parallel 4"; fail=1; }
  expect_ok "generate --parallel 4 on 30 pages of 4 ($(basename "$model"))" "$bin" generate -m "$model" --backend cpu --temp 0 -n 60 --parallel 4 -p "ROMEO: hello" --n-pages 30 --page-size 4 --stats
  if cmp -s "$tmp/out" "$tmp/g1" && grep -q "[1-9][0-9]* suspensions" "$tmp/err"; then echo "ok: suspended sequences resume with the same text"; else echo "FAIL: generate under memory pressure: $(cat "$tmp/err")"; fail=1; fi
done
# device sampling (only ids downloaded) equals host sampling of downloaded
# logits in greedy mode, with drafts and parallel sequences too; sampling on
# the device is reproducible from --seed, and the seed matters
for model in "$tmp/bamba_bytes" "$root/models/builtin"; do
  for extra in "--parallel 1" "--parallel 3 --draft 3"; do
    "$bin" generate -m "$model" --backend cpu --temp 0 -n 40 -p "ROMEO: hello" $extra --host-sampling > "$tmp/gh" 2> "$tmp/err" || { echo "FAIL: generate --host-sampling: $(cat "$tmp/err")"; fail=1; }
    "$bin" generate -m "$model" --backend cpu --temp 0 -n 40 -p "ROMEO: hello" $extra > "$tmp/gd" 2> "$tmp/err" || { echo "FAIL: generate (device sampling): $(cat "$tmp/err")"; fail=1; }
    if cmp -s "$tmp/gh" "$tmp/gd"; then echo "ok: device greedy equals host greedy ($(basename "$model"), $extra)"; else echo "FAIL: device greedy differs from host greedy ($(basename "$model"), $extra)"; fail=1; fi
  done
done
for s in 7 7 8; do
  "$bin" generate -m "$tmp/bamba_bytes" --backend cpu --temp 1.5 --top-k 0 --top-p 1 -n 40 -p "ROMEO:" --parallel 2 --draft 2 --seed "$s" > "$tmp/gs_$s.$( [ -f "$tmp/gs_$s.a" ] && echo b || echo a)" 2> "$tmp/err" || { echo "FAIL: generate --temp 1.5 --seed $s"; fail=1; }
done
if cmp -s "$tmp/gs_7.a" "$tmp/gs_7.b"; then echo "ok: device sampling repeats with the seed"; else echo "FAIL: device sampling differs between runs with one seed"; fail=1; fi
if ! cmp -s "$tmp/gs_7.a" "$tmp/gs_8.a"; then echo "ok: another seed samples other text"; else echo "FAIL: seeds 7 and 8 give the same text"; fail=1; fi
expect_fail "one sequence that can never fit" "raise --n-pages" "$bin" generate -m "$fx" --backend cpu --temp 0 -n 60 -p "ROMEO" --n-pages 4 --page-size 4
# context shift (issue 13): 4 pages of 8 tokens hold 32; 6 + 80 tokens need more
shift_args=(generate --backend cpu --temp 0 -n 80 -p "ROMEO:" --n-pages 4 --page-size 8 --stats)
expect_ok "generate --context-shift past the window" "$bin" "${shift_args[@]}" -m "$fx" --context-shift -v
if grep -q "generation: 80 tokens" "$tmp/err" && grep -q "context shift: dropped [1-9]" "$tmp/err"; then
  echo "ok: --context-shift dropped tokens and generated all 80"
else echo "FAIL: --context-shift: $(tail -n 3 "$tmp/err")"; fail=1; fi
expect_fail "past the window without --context-shift" "no free pages.*raise --n-pages" "$bin" "${shift_args[@]}" -m "$fx"
expect_fail "--context-shift on the built-in hybrid" "recurrent layers cannot drop" "$bin" "${shift_args[@]}" --context-shift
exit $fail
