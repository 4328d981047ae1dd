#!/usr/bin/env bash
# Tensor parallelism (issue 19; docs/tp.md) on the in-process CPU
# communicator, over the llama, bamba, mamba2, nemotron_h, nemotron_h_moe
# and granite_moe fixtures (MoE experts split by tensor):
#  1. greedy `generate --tp 2` and `--tp 4` (precise mode) print exactly
#     what --tp 1 prints: pages of 16 with 3 sequences sharing the prompt
#     (prefix pages and state shared), pages of 1 with speculative drafts
#     (rollback through seq_rm on every rank);
#  2. `score --tp 2` log-probs within 5e-5 of transformers' float64
#     reference (tp 1 is within 1e-5), also chunked into ubatches of 7
#     with 3 sequences at a time, poison and prefix reuse;
#  3. the llama and bamba fixtures with projection biases added: --tp 2 / 4
#     equal --tp 1 (row-parallel biases added once);
#  4. `replay --tp 2` serves the same tokens with the same prefix hits and
#     preemptions as --tp 1;
#  5. bad input: --tp that does not divide the heads fails at load with a
#     message naming the dimension; an architecture without a split says so.
# --tp 4 covers KV heads and Mamba-2 groups replicated over ranks (2 of
# each in these fixtures) and the gated norm gathered across ranks.
# BACKEND (default cpu) runs 1 and 2 on another backend: cuda on a host with
# as many GPUs as ranks (NCCL; LLMEM_NCCL_LIB may name libnccl.so.2).
# quick (4th argument): only llama and bamba, greedy with pages of 16 and
# score, no biases, replay or error cases (for slow backends: lavapipe).
#   tests/tp.sh LLMEM_BIN FIXTURES_DIR [BACKEND] [full|quick]
set -euo pipefail
bin="$1"; fixtures="$2"; backend="${3:-cpu}"; mode="${4:-full}"
fxs="llama bamba mamba2 nemotron_h nemotron_h_moe granite_moe"
gen_modes=("--page-size 16 --parallel 3" "--page-size 1 --draft 2")
if [ "$mode" = quick ]; then
  fxs="llama bamba"
  gen_modes=("--page-size 16 --parallel 3")
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
fail=0
prompt=$'ROMEO:\nWhat say you, ROMEO? What say'
for fx in $fxs; do
  # the byte-level view: the fixtures' tokenizer would end random text early
  mkdir "$tmp/$fx" && cp "$fixtures/$fx/config.json" "$fixtures/$fx"/*.safetensors "$tmp/$fx/"
  gen() { # tp, extra options
    local tp="$1"; shift
    "$bin" generate --model "$tmp/$fx" --backend "$backend" --precision precise --temp 0 -n 80 \
      --prompt "$prompt" --tp "$tp" "$@"
  }
  for gm in "${gen_modes[@]}"; do
    # shellcheck disable=SC2086
    gen 1 $gm > "$tmp/ref"
    for tp in 2 $([ "$backend" = cpu ] && echo 4); do
      # shellcheck disable=SC2086
      gen "$tp" $gm > "$tmp/out"
      if cmp -s "$tmp/ref" "$tmp/out" && [ -s "$tmp/ref" ]; then
        echo "$fx $gm --tp $tp: greedy tokens identical to --tp 1"
      else
        echo "$fx $gm --tp $tp: DIFFERENT from --tp 1"; fail=1
      fi
    done
  done
  score() { # label, options
    local label="$1"; shift
    "$bin" score --model "$fixtures/$fx" --input "$fixtures/$fx/cases.jsonl" --backend "$backend" \
      --kv-type f32 "$@" > "$tmp/score.jsonl"
    printf '%-44s ' "$fx $label"
    python3 "$here/tools/compare_logprobs.py" "$fixtures/$fx/reference.jsonl" "$tmp/score.jsonl" \
      --tol 5e-5 || fail=1
  }
  score "--tp 2" --tp 2
  if [ "$mode" = full ] && { [ "$fx" = bamba ] || [ "$fx" = llama ]; }; then
    score "--tp 2, ubatch 7, n-seq-max 3, poison" --tp 2 --n-ubatch 7 --n-seq-max 3 --poison
  fi
done
[ "$mode" = quick ] && exit $fail
# biases: the llama and bamba fixtures with a random bias added to every
# projection (q, k, v, o; gate, up, down; Mamba-2 in_proj and out_proj):
# column-parallel biases are split with their weights (in_proj's by its z,
# x, B, C, dt slices), row-parallel ones (o, down, out_proj) added once
# (rank 0), so --tp 2 and --tp 4 greedy tokens equal --tp 1's and log-probs
# stay within 2e-5
for fx in llama bamba; do
  mkdir "$tmp/${fx}_bias"
  python3 - "$fixtures/$fx" "$tmp/${fx}_bias" <<'EOF2'
import json, random, struct, sys
src, dst = sys.argv[1:3]
cfg = json.load(open(src + "/config.json"))
cfg["attention_bias"] = cfg["mlp_bias"] = cfg["mamba_proj_bias"] = True
json.dump(cfg, open(dst + "/config.json", "w"))
f = open(src + "/model.safetensors", "rb")
n = struct.unpack("<Q", f.read(8))[0]
head = json.loads(f.read(n)); data = f.read()
rng = random.Random(19)
projs = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
         "in_proj", "out_proj")
extra = b""
for name in sorted(head):
    if name.endswith(".weight") and name.split(".")[-2] in projs:
        size = head[name]["shape"][0]
        off = len(data) + len(extra)
        extra += struct.pack("<%df" % size, *[rng.uniform(-0.5, 0.5) for _ in range(size)])
        head[name[:-len("weight")] + "bias"] = {
            "dtype": "F32", "shape": [size], "data_offsets": [off, off + 4 * size]}
hb = json.dumps(head).encode()
hb += b" " * (-len(hb) % 8)
open(dst + "/model.safetensors", "wb").write(struct.pack("<Q", len(hb)) + hb + data + extra)
EOF2
  for tp in 1 2 4; do
    "$bin" generate --model "$tmp/${fx}_bias" --backend "$backend" --precision precise --temp 0 \
      -n 60 --prompt "$prompt" --tp "$tp" > "$tmp/bias$tp.txt"
    "$bin" score --model "$tmp/${fx}_bias" --input "$fixtures/$fx/cases.jsonl" \
      --backend "$backend" --kv-type f32 --tp "$tp" > "$tmp/bias$tp.jsonl"
  done
  if python3 - "$tmp" "$fx" <<'EOF2'
import json, sys
t, fx = sys.argv[1:3]
txt = [open(f"{t}/bias{tp}.txt", "rb").read() for tp in (1, 2, 4)]
assert txt[0] and txt[0] == txt[1] == txt[2], f"{fx} with biases: greedy text differs across --tp"
rows = [[json.loads(l)["logprobs"] for l in open(f"{t}/bias{tp}.jsonl")] for tp in (1, 2, 4)]
d = max(abs(a - b) for r in (1, 2) for ra, rb in zip(rows[0], rows[r]) for a, b in zip(ra, rb))
assert d < 2e-5, f"{fx} with biases: log-probs differ by {d:.3g} across --tp"
print(f"{fx} with every projection biased: --tp 2 and 4 greedy equal --tp 1, log-probs within {d:.2g}")
EOF2
  then :; else fail=1; fi
done
# replay (continuous batching, preemption, a shared system prefix) on the
# built-in Bamba: --tp 2 serves every request the same tokens as --tp 1,
# with the same prefix hits and preemptions (one plan for both ranks)
python3 - "$tmp/trace.csv" <<'EOF2'
import random, sys
rng = random.Random(3)
with open(sys.argv[1], "w") as f:
    f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    for i in range(12):
        f.write("2023-11-16 18:15:%02d.0000000,%d,%d\n" % (i, rng.randrange(50, 200),
                rng.randrange(20, 200)))
EOF2
for tp in 1 2; do
  LLMEM_MODEL_DIR="$here/models/builtin" "$bin" replay --backend "$backend" --trace "$tmp/trace.csv" \
    --text "$here/docs/replay.md" --scale 0.2 --max-context 40 --max-gen 40 --precision precise \
    --system-prefix 32 --n-pages 24 --page-size 16 --tp "$tp" --output "$tmp/replay$tp.jsonl" \
    --json "$tmp/replay$tp.json" > /dev/null
done
if python3 - "$tmp/replay1.json" "$tmp/replay2.json" "$tmp/replay1.jsonl" "$tmp/replay2.jsonl" <<'EOF2'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ta, tb = open(sys.argv[3]).read(), open(sys.argv[4]).read()
assert ta == tb and ta, "replay --tp 2 tokens differ from --tp 1"
for k in ("prefix_hit_tokens", "preemptions", "computed_tokens", "generated_tokens"):
    assert a[k] == b[k], f"{k}: --tp 1 {a[k]}, --tp 2 {b[k]}"
assert a["prefix_hit_tokens"] > 0 and a["preemptions"] > 0, "the replay exercised no hit or preemption"
print(f"replay --tp 2: tokens, prefix hits ({a['prefix_hit_tokens']}) and preemptions "
      f"({a['preemptions']}) equal --tp 1")
EOF2
then :; else fail=1; fi
# bad input: a clear error, exit status 1, nothing printed on stdout
expect_error() { # pattern, options
  local pat="$1"; shift
  if "$bin" generate --backend cpu --temp 0 -n 4 --prompt-ids "1 2" "$@" > "$tmp/o" 2> "$tmp/e"; then
    echo "generate $*: succeeded, expected an error"; fail=1
  elif ! grep -q -- "$pat" "$tmp/e" || [ -s "$tmp/o" ]; then
    echo "generate $*: error does not name '$pat':"; cat "$tmp/e"; fail=1
  else
    echo "generate $*: $(head -c 160 "$tmp/e")"
  fi
}
expect_error "num_attention_heads): 4" --model "$fixtures/llama" --tp 3
expect_error "num_attention_heads): 4" --model "$fixtures/bamba" --tp 8
expect_error "Mamba-2 heads" --model "$fixtures/mamba2" --tp 16
expect_error "not split yet" --model "$fixtures/gemma3_text" --tp 2
expect_error "wants an integer in \[1, 64\]" --model "$fixtures/llama" --tp 0
LLMEM_TP_COMM=nccl expect_error "no NCCL communicator" --model "$fixtures/llama" --tp 2
LLMEM_TP_COMM=mpi expect_error "unknown communicator 'mpi'" --model "$fixtures/llama" --tp 2
exit $fail
