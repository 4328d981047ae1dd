#!/usr/bin/env bash
# The fused decode path's fallback (models/forward.c, nm_linear): when the
# backend refuses llmem_op_norm_matmul for a shape (LLMEM_E_UNSUPPORTED, as
# CUDA does past its kernel's limits), the one-token ubatch runs the unfused
# ops for that call instead. On the CPU backend, LLMEM_NORM_MATMUL_CPU=1
# takes the fused path and LLMEM_NORM_MATMUL_CPU_MAX_K=n makes the CPU op
# refuse rows longer than n. `llmem score` at ubatch 1 (every ubatch one
# token) is run four ways:
#   unfused   the path off (the plain ops)
#   fused     every call fused
#   fallback  every call refused (MAX_K=0): the fallback for each call site
#   mixed     rows of hidden_size fused (in_proj, FFN gate/up, o_proj, the
#             LM head), longer ones refused (out_proj's gated norm, FFN down)
# Each must match transformers' float64 log-probs (reference.jsonl, 1e-3 as
# parity.sh); fallback must equal unfused byte for byte (on the CPU the
# fallback is the unfused ops' arithmetic) and differ from fused (else the
# fused path or the refusal did not happen: the fused op's norm sums in
# another order); mixed must be within 1e-4 of fused (llama's mixed case
# refuses only FFN down, whose fused and unfused sums agree to the bit).
# The attention layers' q/k/v (models/forward.c, qkv_decode) run four more
# ways, each against float64 as well: qkv0 (LLMEM_NM_QKV=0: a norm launch
# and three plain matmuls) must differ from fused (else the norm did not go
# into the q/k/v matmuls); qkv1 (LLMEM_NM_QKV=1: one fused call per
# projection) and nopack (LLMEM_NO_QKV_PACK=1: q, k, v not packed at load,
# so three fused calls) must equal fused byte for byte, and qkv3
# (LLMEM_NM_QKV=3: a norm launch and one plain matmul of the packed rows)
# must equal qkv0 (the CPU computes each output row alone, so one call over
# the packed rows gives the bits of three).
#   tests/fused_fallback.sh LLMEM_BIN FIXTURE_DIR
set -euo pipefail
bin="$1"; fx="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmp_lp="$here/tools/compare_logprobs.py"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
hidden="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["hidden_size"])' \
  "$fx/config.json")"
run() { # label, env assignments...
  local label="$1"; shift
  env -u LLMEM_NORM_MATMUL_CPU -u LLMEM_NORM_MATMUL_CPU_MAX_K -u LLMEM_NO_NORM_MATMUL \
    -u LLMEM_NM_QKV -u LLMEM_NO_QKV_PACK "$@" \
    "$bin" score --model "$fx" --input "$fx/cases.jsonl" --backend cpu --kv-type f32 \
    --page-size 16 --n-ubatch 1 > "$tmp/$label.jsonl"
  printf '%-10s vs float64: ' "$label"
  python3 "$cmp_lp" "$fx/reference.jsonl" "$tmp/$label.jsonl" --tol 1e-3
}
run unfused
run fused LLMEM_NORM_MATMUL_CPU=1
run fallback LLMEM_NORM_MATMUL_CPU=1 LLMEM_NORM_MATMUL_CPU_MAX_K=0
run mixed LLMEM_NORM_MATMUL_CPU=1 LLMEM_NORM_MATMUL_CPU_MAX_K="$hidden"
if ! cmp -s "$tmp/fallback.jsonl" "$tmp/unfused.jsonl"; then
  echo "fallback (every norm_matmul refused) differs from the unfused ops:"
  python3 "$cmp_lp" "$tmp/unfused.jsonl" "$tmp/fallback.jsonl" --tol 0 || true
  exit 1
fi
if cmp -s "$tmp/fallback.jsonl" "$tmp/fused.jsonl"; then
  echo "fallback equals fused byte for byte: the fused path was not taken"
  exit 1
fi
echo "fallback   equals unfused byte for byte, differs from fused"
printf 'mixed      vs fused:   '
python3 "$cmp_lp" "$tmp/fused.jsonl" "$tmp/mixed.jsonl" --tol 1e-4
run qkv0 LLMEM_NORM_MATMUL_CPU=1 LLMEM_NM_QKV=0
run qkv1 LLMEM_NORM_MATMUL_CPU=1 LLMEM_NM_QKV=1
run qkv3 LLMEM_NORM_MATMUL_CPU=1 LLMEM_NM_QKV=3
run nopack LLMEM_NORM_MATMUL_CPU=1 LLMEM_NO_QKV_PACK=1
if cmp -s "$tmp/qkv0.jsonl" "$tmp/fused.jsonl"; then
  echo "qkv0 equals fused byte for byte: the q/k/v norm was not fused"
  exit 1
fi
for p in qkv1:fused nopack:fused qkv3:qkv0; do
  v="${p%%:*}"; w="${p##*:}"
  if ! cmp -s "$tmp/$v.jsonl" "$tmp/$w.jsonl"; then
    echo "$v differs from $w (one q/k/v call over the packed rows):"
    python3 "$cmp_lp" "$tmp/$w.jsonl" "$tmp/$v.jsonl" --tol 0 || true
    exit 1
  fi
done
echo "qkv0       differs from fused; qkv1 and nopack equal fused, qkv3 equals qkv0 byte for byte"
