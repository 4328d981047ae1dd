#!/usr/bin/env bash
# Bad input to the command line, seen as a fuzzer would send it: impossible
# parameters, malformed safetensors / config.json / tokenizer.json files
# (and a GGUF file where safetensors belong), allocations that cannot
# succeed, and a model whose logits are NaN. Each must end with one clear
# message on stderr and exit status 1 or 2: never 0, never a crash (a
# signal: status >= 128), never a hang. The files in the fixture folders
# stay as they were (their checksums are compared at the end).
#   tests/cli_bad_input.sh LLMEM_BIN REPO_ROOT
set -uo pipefail
bin="$1"; root="$2"
fx="$root/tests/fixtures/llama"; bfx="$root/tests/fixtures/bamba"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail=0
sums() { (cd "$root/tests/fixtures" && sha256sum llama/* bamba/*); }
sums > "$tmp/before"
expect_fail() { # description, pattern expected on stderr, command...
  local what="$1" pat="$2"; shift 2
  timeout 60 "$@" > "$tmp/out" 2> "$tmp/err"; local rc=$?; last_rc=$rc
  if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
    echo "FAIL: $what: exit $rc (want 1 or 2): $(head -c 300 "$tmp/err")"; fail=1
  elif ! grep -q -- "$pat" "$tmp/err"; then
    echo "FAIL: $what: stderr lacks '$pat': $(head -c 300 "$tmp/err")"; fail=1
  else
    echo "ok: $what -> $(grep -v '^$' "$tmp/err" | head -n1)"
  fi
}
gen=(generate --backend cpu -n 2 --prompt-ids "1 2 3")

# impossible parameters: refused while parsing, or when the model is sized
for a in "--n-ctx 0" "--n-ubatch 0" "--n-ubatch 2000000000" "--n-seq-max 0" "--n-pages -3" \
         "--page-size 0" "--tp 0" "--tp -1" "--threads 0" "--device -1" "--snapshots -5" \
         "--prefix-cache-mb -5" "--prefix-cache-mb nan" "--prefix-cache-mb inf"; do
  # shellcheck disable=SC2086
  expect_fail "generate $a" "wants" "$bin" "${gen[@]}" -m "$fx" $a
done
for a in "-n -5" "--parallel 0" "--draft 65" "--top-p 0" "--temp nan" "--seed x"; do
  # shellcheck disable=SC2086
  expect_fail "generate $a" "bad value" "$bin" "${gen[@]}" -m "$fx" $a
done
expect_fail "--context-shift with --draft" "context-shift works with one sequence" "$bin" \
  "${gen[@]}" -m "$fx" --context-shift --draft 2
expect_fail "--context-shift with --parallel 2" "context-shift works with one sequence" "$bin" \
  "${gen[@]}" -m "$fx" --context-shift --parallel 2
expect_fail "--tp that does not divide the heads" "does not divide" "$bin" "${gen[@]}" -m "$fx" --tp 3
expect_fail "slot ids past int32" "exceeds int32" "$bin" "${gen[@]}" -m "$fx" --n-seq-max 1048576
# an allocation that cannot succeed (100 GB of KV pool): a status, no abort
# (a sanitizer build must let malloc return NULL for this one)
expect_fail "a KV pool no allocator can give" "cannot allocate" \
  env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1" \
  "$bin" "${gen[@]}" -m "$fx" --n-pages 50000000 --page-size 32
expect_fail "bench --only an unknown figure" "is not a figure" "$bin" bench --backend cpu --only gemv,nosuch
expect_fail "tokenize --input a directory" "is a directory" "$bin" tokenize --tokenizer "$fx" --input "$tmp"
# options that would be ignored are refused, and a bad value names its option
expect_fail "bench --n-seq-max (the figures set it)" "does not apply" "$bin" bench --backend cpu --n-seq-max 3
expect_fail "bench --kv-type without --model" "applies only with --model" "$bin" bench --backend cpu --kv-type bf16
expect_fail "bench --json without --model" "applies only with --model" "$bin" bench --backend cpu --json "$tmp/b.json"
expect_fail "bench --model with --only" "does not apply with --model" "$bin" bench --backend cpu -m "$fx" --only gemv
expect_fail "bench --model with --all" "does not apply with --model" "$bin" bench --backend cpu -m "$fx" --all
# a size given explicitly that cannot work is refused with exit 2 (usage),
# not silently raised; left out, the command picks one that works
refused() { # description, pattern, command...: expect_fail with exit status 2
  expect_fail "$@"
  if [ "$last_rc" -eq 1 ]; then echo "FAIL: $1: exit 1, want 2 (a usage error)"; fail=1; fi
}
refused "generate --n-seq-max below --parallel" "--n-seq-max 2 is below --parallel 4" \
  "$bin" "${gen[@]}" -m "$fx" --parallel 4 --n-seq-max 2
refused "generate --n-ubatch below --parallel * (--draft + 1)" "--n-ubatch 5 is below --parallel \* (--draft + 1) = 6" \
  "$bin" "${gen[@]}" -m "$fx" --parallel 2 --draft 2 --n-ubatch 5
refused "serve -np and --n-seq-max that disagree" "-np/--parallel 2 and --n-seq-max 3 disagree" \
  "$bin" serve --backend cpu --port 0 -m "$fx" -np 2 --n-seq-max 3
# recurrent-state options for a model that has none (llama: attention only)
refused "generate --ssm-type on an attention-only model" "--ssm-type sets recurrent state, and .* has none" \
  "$bin" "${gen[@]}" -m "$fx" --ssm-type bf16
refused "score --snapshots on an attention-only model" "--snapshots sets recurrent state, and .* has none" \
  "$bin" score --backend cpu -m "$fx" --snapshots 4 --input "$fx/cases.jsonl"
if timeout 60 "$bin" "${gen[@]}" -m "$bfx" --temp 0 --ssm-type bf16 --snapshots 4 > "$tmp/out" 2> "$tmp/err"; then
  echo "ok: generate --ssm-type bf16 --snapshots 4 on the bamba hybrid runs"
else
  echo "FAIL: generate --ssm-type bf16 --snapshots 4 on bamba: $(tail -1 "$tmp/err")"; fail=1
fi
refused "bench --model --n-ubatch below the prompt" "--n-ubatch 16 is below the 512 prompt tokens" \
  env -u LLMEM_BENCH_PP "$bin" bench --backend cpu -m "$fx" --n-ubatch 16
if timeout 60 "$bin" "${gen[@]}" -m "$fx" --temp 0 --parallel 9 --draft 1 > "$tmp/out" 2> "$tmp/err"; then
  echo "ok: generate --parallel 9 --draft 1 without sizes grows --n-seq-max and --n-ubatch"
else
  echo "FAIL: generate --parallel 9 --draft 1 without sizes: $(head -c 300 "$tmp/err")"; fail=1
fi
if timeout 60 "$bin" "${gen[@]}" -m "$fx" --temp 0 --parallel 3 --n-seq-max 3 --n-ubatch 3 > "$tmp/out" 2> "$tmp/err"; then
  echo "ok: generate --parallel 3 with sizes that hold it runs"
else
  echo "FAIL: generate --parallel 3 --n-seq-max 3 --n-ubatch 3: $(head -c 300 "$tmp/err")"; fail=1
fi
expect_fail "replay --turns 0" "for --turns" "$bin" replay --turns 0
expect_fail "replay --pace-speedup x" "for --pace-speedup" "$bin" replay --pace-speedup x
expect_fail "tokenize --bogus" "unknown option '--bogus'" "$bin" tokenize --bogus
expect_fail "tokenize --tokenizer without a value" "needs a value" "$bin" tokenize --tokenizer
expect_fail "tokenize with a stray argument" "unexpected argument 'extra'" "$bin" tokenize --tokenizer "$fx" --text a extra
expect_fail "an unknown command" "unknown command 'nosuch'" "$bin" nosuch

# malformed model folders (written from the llama fixture)
python3 - "$fx" "$tmp/m" <<'PY' || { echo "FAIL: cannot write the malformed models"; fail=1; }
import json, os, shutil, struct, sys
src, out = sys.argv[1], sys.argv[2]
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr, body = json.loads(raw[8:8 + n]), raw[8 + n:]
cfg = json.load(open(os.path.join(src, "config.json")))
first = sorted(k for k in hdr if k != "__metadata__")[0]

def folder(name, st=raw, config=None, files=None):
    d = os.path.join(out, name)
    os.makedirs(d)
    open(os.path.join(d, "model.safetensors"), "wb").write(st)
    open(os.path.join(d, "config.json"), "w").write(json.dumps(cfg) if config is None else config)
    for k, v in (files or {}).items():
        open(os.path.join(d, k), "w").write(v)

def st(edit=None, length=None):
    h = json.loads(json.dumps(hdr))
    if edit:
        edit(h[first])
    b = json.dumps(h).encode()
    return struct.pack("<Q", len(b) if length is None else length) + b + body

def config(**kw):
    return json.dumps(dict(cfg, **kw))

folder("gguf", b"GGUF\x03\x00\x00\x00" + bytes(64))
folder("empty_file", b"")
folder("header_length_huge", st(length=1 << 62))
folder("header_not_json", struct.pack("<Q", 10) + b'{"a": [1,2' + body)
folder("negative_shape", st(lambda t: t.update(shape=[-1, 4])))
folder("huge_shape", st(lambda t: t.update(shape=[1 << 40, 1 << 40])))
folder("offsets_past_end", st(lambda t: t.update(data_offsets=[0, len(body) + 100])))
folder("offsets_reversed", st(lambda t: t.update(data_offsets=[100, 0])))
folder("size_mismatch", st(lambda t: t.update(shape=[t["shape"][0] + 1] + t["shape"][1:])))
folder("truncated", raw[:-100])
folder("config_not_json", config='{"model_type": "llama", ')
folder("config_zero_heads", config=config(num_attention_heads=0))
folder("config_kv_heads_3", config=config(num_key_value_heads=3))
folder("config_100000_layers", config=config(num_hidden_layers=100000))
folder("config_vocab_string", config=config(vocab_size="256"))
folder("config_deep", config="[" * 100000 + "]" * 100000)
folder("index_escapes", files={"model.safetensors.index.json":
                               '{"weight_map": {"a": "../../etc/passwd"}}'})
tok = {"model": {"type": "BPE", "vocab": {"a": 0, "b": -5}, "merges": []}}
folder("tokenizer_bad_id", files={"tokenizer.json": json.dumps(tok)})
folder("tokenizer_not_json", files={"tokenizer.json": '{"model": '})
PY
for d in "$tmp"/m/*; do
  name="$(basename "$d")"
  case "$name" in
    tokenizer_*) pat="cannot load the tokenizer"; cmd=(generate --backend cpu -n 2 -p ab) ;;
    *) pat="cannot load model"; cmd=("${gen[@]}") ;;
  esac
  expect_fail "model folder: $name" "$pat" "$bin" "${cmd[@]}" -m "$d"
done
expect_fail "score on a GGUF file" "a GGUF file, not safetensors" "$bin" score -m "$tmp/m/gguf" --backend cpu \
  --input "$fx/cases.jsonl"

# non-finite logits (a norm weight of NaN): generate stops with an error on
# the device-sampling path (NaN log-probs come back) and on the host path
python3 - "$fx" "$tmp/nan" <<'PY' || { echo "FAIL: cannot write the NaN model"; fail=1; }
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
shutil.copy(os.path.join(src, "config.json"), dst)
raw = bytearray(open(os.path.join(src, "model.safetensors"), "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
name = next(k for k in sorted(hdr) if "norm" in k and hdr[k]["dtype"] == "F32")
a, b = hdr[name]["data_offsets"]
raw[8 + n + a:8 + n + b] = struct.pack("<f", float("nan")) * ((b - a) // 4)
open(os.path.join(dst, "model.safetensors"), "wb").write(raw)
PY
for extra in "--temp 0" "--temp 0.8" "--temp 0.8 --host-sampling" "--temp 0 --draft 2" \
             "--temp 0 --parallel 3" "--repeat-penalty 1.2"; do
  # shellcheck disable=SC2086
  expect_fail "generate on NaN logits ($extra)" "after position 2 are not finite" "$bin" \
    "${gen[@]}" -m "$tmp/nan" $extra
done
# finite logits after the prompt, NaN from the first generated token on:
# every embedding row but the prompt's (ids 1 2 3) is NaN
python3 - "$fx" "$tmp/nan_late" <<'PY' || { echo "FAIL: cannot write the late-NaN model"; fail=1; }
import json, os, shutil, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst)
shutil.copy(os.path.join(src, "config.json"), dst)
raw = bytearray(open(os.path.join(src, "model.safetensors"), "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
t = json.loads(raw[8:8 + n])["model.embed_tokens.weight"]
assert t["dtype"] == "F32"
rows, dim = t["shape"]
a = 8 + n + t["data_offsets"][0]
for r in range(rows):
    if r not in (1, 2, 3):
        raw[a + 4 * r * dim:a + 4 * (r + 1) * dim] = struct.pack("<f", float("nan")) * dim
open(os.path.join(dst, "model.safetensors"), "wb").write(raw)
PY
for extra in "--temp 0" "--temp 0 --host-sampling" "--temp 0 --draft 2" "--temp 0 --parallel 3"; do
  # shellcheck disable=SC2086
  expect_fail "generate on NaN logits after a step ($extra)" "after position 3 are not finite" \
    "$bin" "${gen[@]}" -m "$tmp/nan_late" $extra
done

sums > "$tmp/after"
if cmp -s "$tmp/before" "$tmp/after"; then echo "ok: fixture files unchanged"
else echo "FAIL: a fixture file changed"; fail=1; fi
exit $fail
