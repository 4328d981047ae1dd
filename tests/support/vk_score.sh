# Sourced by the Vulkan diagnostics tests that score with a knob on
# (tests/vulkan_profile.sh, tests/vulkan_pipeline_stats.sh).
# vk_score_twice N VAR NAME WHAT: scores the first N cases of $fx (the
# fixture folder) with $bin (the llmem binary) on vulkan, without and then
# with VAR=1, in $tmp (the caller's scratch folder); the second run's
# log-probs go to $tmp/NAME.jsonl and its stderr to $tmp/NAME.err. The two
# runs must give the same log-probs byte for byte; otherwise it prints
# "WHAT changed the results" and exits 1.
vk_score_twice() {
  local n="$1" var="$2" name="$3" what="$4"
  head -n "$n" "$fx/cases.jsonl" > "$tmp/cases.jsonl"
  "$bin" score --model "$fx" --input "$tmp/cases.jsonl" --backend vulkan > "$tmp/plain.jsonl"
  env "$var=1" "$bin" score --model "$fx" --input "$tmp/cases.jsonl" --backend vulkan \
    > "$tmp/$name.jsonl" 2> "$tmp/$name.err"
  cmp "$tmp/plain.jsonl" "$tmp/$name.jsonl" || { echo "$what changed the results"; exit 1; }
}
