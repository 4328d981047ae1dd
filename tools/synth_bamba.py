#!/usr/bin/env python3
"""Writes a random bf16 Bamba checkpoint (config.json + model.safetensors)
of a given shape, for load and speed tests of large models. Never commit
its output.

The tensor names and shapes come from transformers' BambaForCausalLM built
on the meta device (no memory, no initialisation); the data is written
directly: norm weights 1, every other tensor N(0, 0.02^2) values taken
cyclically from one random block whose length is not a multiple of any row,
so rows do not repeat in step. About 20 s for the 9B shape (19.5 GB).

    python3 tools/synth_bamba.py OUT_DIR [--shape 9b|2b|tiny]

9b: the Bamba-9B shape of docs/benchmarks.md (hidden 4096, 32 layers,
attention at 9/18/27, 32/8 heads, 128 Mamba-2 heads x 64, d_state 128,
MLP 14336, vocab 128256).
"""
import argparse
import json
import os
import struct

import numpy as np

SHAPES = {
    "9b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
               num_hidden_layers=32, attn_layer_indices=[9, 18, 27],
               num_attention_heads=32, num_key_value_heads=8, mamba_n_heads=128,
               mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128),
    "2b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
               num_hidden_layers=32, attn_layer_indices=[9, 18, 27],
               num_attention_heads=16, num_key_value_heads=8, mamba_n_heads=64,
               mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128),
    "tiny": dict(vocab_size=300, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=4, attn_layer_indices=[1, 3],
                 num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8,
                 mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--shape", default="9b", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--like", help="take config.json and tensor shapes from this checkpoint "
                    "instead of transformers (a test without transformers)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.like:
        with open(os.path.join(a.like, "model.safetensors"), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))
        names = [(k, tuple(v["shape"])) for k, v in h.items() if k != "__metadata__"]
        with open(os.path.join(a.like, "config.json")) as f:
            c = json.load(f)
        c["torch_dtype"] = "bfloat16"
        with open(os.path.join(a.out, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
        write(a, names)
        return

    import torch
    import transformers as tf

    kw = dict(SHAPES[a.shape], rms_norm_eps=1e-5, max_position_embeddings=8192,
              mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256, mamba_conv_bias=True,
              mamba_proj_bias=False, tie_word_embeddings=False)
    try:
        cfg = tf.BambaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    except TypeError:
        cfg = tf.BambaConfig(**kw, rope_theta=10000.0)
    with torch.device("meta"):
        model = tf.BambaForCausalLM(cfg)
    names = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
    cfg.torch_dtype = "bfloat16"
    cfg.to_json_file(os.path.join(a.out, "config.json"))
    write(a, names)


def write(a, names):
    header, off = {}, 0
    for n, shape in names:
        nbytes = int(np.prod(shape)) * 2
        header[n] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)

    rng = np.random.default_rng(a.seed)
    block = (rng.standard_normal((1 << 25) + 12345, dtype=np.float32) * 0.02)
    block = (block.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
    one = np.full(1 << 16, 0x3F80, dtype=np.uint16)
    pos = 0
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for n, shape in names:
            count = int(np.prod(shape))
            if n.endswith("norm.weight"):
                while count > 0:
                    k = min(count, one.size)
                    f.write(one[:k].tobytes())
                    count -= k
                continue
            while count > 0:
                k = min(count, block.size - pos)
                f.write(block[pos:pos + k].tobytes())
                pos = (pos + k) % block.size
                count -= k
    print(f"{a.out}: {len(names)} tensors, {off / 1e9:.2f} GB of bf16 weights")


if __name__ == "__main__":
    main()
