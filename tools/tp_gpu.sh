#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU host (issue 19; docs/tp.md): NOT run in
# CI. Needs a build with the CUDA plugin and libnccl.so.2 (PyTorch's wheel
# has one; found below, or set LLMEM_NCCL_LIB).
#   1. tests/tp.sh on cuda: greedy --tp 2 equals --tp 1 (precise) on the
#      fixtures, score --tp 2 within 5e-5 of transformers, replay equal;
#   2. the same over the CPU communicator on the GPUs (LLMEM_TP_COMM=cpu);
#   3. the issue's targets on the 9B Bamba shape (tools/synth_bamba.py):
#      batch-1 decode step with --tp 2 <= 0.6x the --tp 1 step, batch-64
#      decode throughput >= 1.8x; pp512 reported too.
#   tools/tp_gpu.sh LLMEM_BIN [OUT_DIR]
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the lent H200s want.
set -uo pipefail
bin="$1"; out="${2:-/tmp}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export NCCL_NVLS_ENABLE=0
if [ -z "${LLMEM_NCCL_LIB:-}" ]; then
  LLMEM_NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null ||
                   find / -name 'libnccl.so.2' -not -path '*/proc/*' 2>/dev/null | head -1)
  export LLMEM_NCCL_LIB
fi
echo "NCCL: ${LLMEM_NCCL_LIB:-not found}"
nvidia-smi --query-gpu=index,name --format=csv,noheader
echo "=== 1. tests/tp.sh on cuda (NCCL)"
bash "$here/tests/tp.sh" "$bin" "$here/tests/fixtures" cuda 2>&1 | tail -20
echo "=== 2. tests/tp.sh on cuda over the CPU communicator"
LLMEM_TP_COMM=cpu bash "$here/tests/tp.sh" "$bin" "$here/tests/fixtures" cuda 2>&1 | grep -c identical
echo "=== 3. 9B Bamba shape, --tp 1 and --tp 2"
[ -d /tmp/b9 ] || python3 "$here/tools/synth_bamba.py" /tmp/b9 --shape 9b > /tmp/synth.log 2>&1
for tp in 1 2; do
  timeout 280 "$bin" bench -m /tmp/b9 --backend cuda --tp "$tp" --json "$out/tp_bench_$tp.json" 2>&1 |
    grep -v '^\s*$' | tail -8
done
python3 - "$out/tp_bench_1.json" "$out/tp_bench_2.json" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ra = {r["batch"]: r for r in a["runs"]}; rb = {r["batch"]: r for r in b["runs"]}
s1 = rb[1]["tg128_ms_per_step"] / ra[1]["tg128_ms_per_step"]
t64 = rb[64]["tg128_tok_s"] / ra[64]["tg128_tok_s"]
print(f"batch-1 decode step: --tp 2 {rb[1]['tg128_ms_per_step']:.3f} ms / --tp 1 "
      f"{ra[1]['tg128_ms_per_step']:.3f} ms = {s1:.2f}x (target <= 0.6x): {'met' if s1 <= 0.6 else 'MISSED'}")
print(f"batch-64 throughput: --tp 2 {rb[64]['tg128_tok_s']:.0f} / --tp 1 {ra[64]['tg128_tok_s']:.0f} "
      f"tok/s = {t64:.2f}x (target >= 1.8x): {'met' if t64 >= 1.8 else 'MISSED'}")
for n in (1, 64):
    print(f"pp512 batch {n}: --tp 2 {rb[n]['pp512_ms']:.1f} ms, --tp 1 {ra[n]['pp512_ms']:.1f} ms")
EOF
