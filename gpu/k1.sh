#!/bin/bash
# vkb64 call 1: H200 tests of the norm fold; NORM_FOLD 0/1/7 alternated at 9B/2b b16/b64 fast; profiles
C=$PWD/.carry-vkb64; . $C/scripts/env.sh
t0=$(date +%s); R=$OUT/k1.txt; el() { echo $(( $(date +%s)-t0 )); }
(synth 9b; synth 2b) > /dev/null 2>&1 &
SP=$!
T() { local n=$1; shift
  env CK_FORK=no LLMEM_TEST_BACKENDS=cpu,vulkan "$@" timeout 120 $C/bin/$n > $OUT/o.txt 2>&1; local rc=$?
  echo "$n $* rc=$rc $(grep -E '^[0-9]+%' $OUT/o.txt | tail -1) t=$(el)" >> $R
  [ $rc -ne 0 ] && grep -E ":F:|:E:|rror" $OUT/o.txt | head -3 >> $R; }
T test_vulkan_sumhold
T test_vulkan_swiglu_fold LLMEM_VULKAN_NORM_FOLD=7
T test_vulkan_presplit LLMEM_VULKAN_NORM_FOLD=7
wait $SP; echo "synth done t=$(el)" >> $R
export LLMEM_BENCH_PEAK=0 LLMEM_BENCH_PP=16
B() { # B model batch backend [env...]
  local m=$1 n=$2 b=$3; shift 3
  echo "b$m b$n $b $* $(env LLMEM_BENCH_BATCH=$n "$@" $L bench -m /tmp/b$m --backend $b --precision fast 2>&1 | grep -E '^tg128' | awk '{print $4}') t=$(el)" >> $R; }
for mn in 9:16 9:64 2:16 2:64; do m=${mn%:*}; n=${mn#*:}
  B $m $n cuda
  for k in 0 1 7 0 1 7; do B $m $n vulkan LLMEM_VULKAN_NORM_FOLD=$k; done
done
cat $R
# profiles (fast, PP 16): Vulkan NORM_FOLD 0 and 7, CUDA; one step listed at b64 and b16
for n in 16 64; do
  for k in 0 7; do [ $(el) -gt 255 ] && break
    env LLMEM_BENCH_BATCH=$n LLMEM_VULKAN_NORM_FOLD=$k LLMEM_VULKAN_PROFILE=1 LLMEM_VULKAN_PROFILE_SEQ=50 $L bench -m /tmp/b9 --backend vulkan --precision fast > $OUT/pv9_${n}_nf$k.txt 2>&1
    echo "prof vulkan b$n nf$k t=$(el)" >> $R; done
  [ $(el) -gt 260 ] && break
  env LLMEM_BENCH_BATCH=$n LLMEM_CUDA_PROFILE=1 $L bench -m /tmp/b9 --backend cuda --precision fast > $OUT/pc9_$n.txt 2>&1
  echo "prof cuda b$n t=$(el)" >> $R
done
cd $OUT && tar czf prof.tgz p*.txt 2>/dev/null && rm -f p*.txt o.txt
tail -6 $R
