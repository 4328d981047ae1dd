#!/usr/bin/env python3
"""Write tests/fixtures/<name>/reference_bf16.jsonl: what transformers
computes when it runs the fixture in bfloat16, the reference of llmem's
FAST precision mode (docs/cuda.md "Precision modes").

For each case of cases.jsonl: one forward pass of the whole token list with
the model loaded by from_pretrained(dtype=torch.bfloat16) (eager attention,
torch code paths, on the CPU), then
  logprobs[i] = log_softmax(float32(logits[i]))[tokens[i+1]]
  greedy[i]   = argmax(logits[i])   (the greedy next token after tokens[..i])
Usage (torch and transformers, no network):
  python3 tools/make_bf16_refs.py tests/fixtures [--only llama,bamba]
"""
import json
import os
import sys

import torch
import transformers as tf


def main():
    root = sys.argv[1]
    only = None
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1].split(",")
    names = only or ["llama", "bamba", "mamba2", "nemotron_h"]
    torch.set_num_threads(os.cpu_count() or 1)
    for name in names:
        d = os.path.join(root, name)
        try:
            model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16,
                                                            attn_implementation="eager")
        except TypeError:
            model = tf.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16,
                                                            attn_implementation="eager")
        model.eval()
        rows = []
        with open(os.path.join(d, "cases.jsonl")) as f:
            cases = [json.loads(line) for line in f if line.strip()]
        with torch.no_grad():
            for c in cases:
                t = c["tokens"]
                logits = model(torch.tensor([t])).logits[0]
                lp = torch.log_softmax(logits.float(), dim=-1)
                rows.append({"id": c["id"],
                             "logprobs": [lp[i, t[i + 1]].item() for i in range(len(t) - 1)],
                             "greedy": logits.float().argmax(dim=-1).tolist()})
        with open(os.path.join(d, "reference_bf16.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        print(f"{name}: {len(rows)} cases", flush=True)


if __name__ == "__main__":
    main()
