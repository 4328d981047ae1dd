#!/usr/bin/env bash
# The batch-1 GEMV's speed hangs on how many CTAs of it share an SM, which
# its register count decides (docs/benchmarks.md, "Batch-1 step: norms in
# the epilogue"): when a change of kernels/gemv.cu let the compiler give the
# out_proj shape 71 registers instead of 64 (1 CTA per SM instead of 2), the
# Bamba-9B batch-1 step on the H200 lost 0.17 ms. This compiles gemv.cu for
# sm_90a as the plugin does, with ptxas's resource report, and checks the
# default launch shapes of the decode step (bf16 weights): CTAs per SM from
# the register count (65536 registers, allocated 8 per thread at a time) at
# least what was measured, and no spills.
#
#   tests/gemv_registers.sh NVCC SOURCE_DIR
set -euo pipefail
nvcc=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$nvcc" -O3 -DNDEBUG -std=c++17 --expt-relaxed-constexpr -lineinfo \
    -gencode arch=compute_90a,code=sm_90a -I"$src" -I"$src/include" \
    -Xptxas -v -c "$src/kernels/gemv.cu" -o "$tmp/gemv.o" > "$tmp/log" 2>&1; then
  cat "$tmp/log"
  echo "FAIL: nvcc could not compile kernels/gemv.cu for sm_90a"
  exit 1
fi
fail=0
# check WHAT C R NW THREADS MIN_CTAS: the gemv_rows_kernel<bf16, C, R, NW,
# not pipelined, hinted> launched with THREADS threads per CTA
check() {
  local what=$1 c=$2 r=$3 nw=$4 threads=$5 want=$6
  local name="_Z16gemv_rows_kernelI10cuk_bf16_tLi${c}ELi${r}ELi${nw}ELb0ELb1EEv13cuk_gemv_rows"
  local res
  res=$(awk -v n="'$name'" '
    $0 ~ "Compiling entry function " n { on = 1; next }
    on && /spill stores/ { for (i = 1; i <= NF; i++) if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $(i + 3) == "stores,") s = $i }
    on && /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") print $(i + 1), s + 0; exit }
  ' "$tmp/log")
  if [ -z "$res" ]; then
    echo "FAIL: $what: no ptxas report for $name"
    fail=1
    return
  fi
  local regs=${res% *} spill=${res#* }
  local per=$(((regs + 7) / 8 * 8))
  local ctas=$((65536 / (per * threads)))
  [ $ctas -gt $((2048 / threads)) ] && ctas=$((2048 / threads))
  if [ $ctas -lt "$want" ] || [ "$spill" -gt 0 ]; then
    echo "FAIL: $what (C $c, R $r, NW $nw, $threads threads): $regs registers, $spill bytes spilled: $ctas CTAs per SM, want >= $want and no spill"
    fail=1
  else
    echo "ok: $what: $regs registers, $ctas CTAs per SM"
  fi
}
check "in_proj, attention q/k/v/o" 1 2 1 256 6
check "lm_head" 1 1 1 256 6
check "FFN gate/up + SwiGLU" 1 2 2 256 4
check "out_proj (K 8192)" 2 2 1 512 2
check "FFN down (K 14336)" 4 2 1 512 1
exit $fail
