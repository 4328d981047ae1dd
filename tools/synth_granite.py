#!/usr/bin/env python3
"""Writes a random bf16 Granite-4.0-H checkpoint (config.json +
model.safetensors) of the Granite-4.0-H-Tiny shape, for the MoE decode
benchmark of docs/benchmarks.md. Never commit its output.

Tensor names and shapes come from transformers' GraniteMoeHybridForCausalLM
built on the meta device; the data is written as tools/synth_bamba.py
writes it (norm weights 1, the rest N(0, 0.02^2) from one cyclic random
block). The router weights are random too, so tokens spread over experts.

    python3 tools/synth_granite.py OUT_DIR [--shape tiny-h|toy]

tiny-h: hidden 1536, 40 layers (attention at 5, 15, 25, 35, Mamba-2
elsewhere: 48 heads x 64, d_state 128), 12/4 heads, 64 experts of 512
with top-6 routing, a shared MLP of 1024, vocab 100352, no positional
encoding, tied embeddings: about 6.9 B parameters, 1.4 B active per token.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_bamba import write  # noqa: E402

SHAPES = {
    "tiny-h": dict(vocab_size=100352, hidden_size=1536, num_hidden_layers=40,
                   layer_types=["attention" if i in (5, 15, 25, 35) else "mamba"
                                for i in range(40)],
                   num_attention_heads=12, num_key_value_heads=4, intermediate_size=512,
                   shared_intermediate_size=1024, num_local_experts=64,
                   num_experts_per_tok=6, mamba_n_heads=48, mamba_d_head=64,
                   mamba_n_groups=1, mamba_d_state=128),
    "toy": dict(vocab_size=300, hidden_size=64, num_hidden_layers=4,
                layer_types=["mamba", "attention", "mamba", "attention"],
                num_attention_heads=4, num_key_value_heads=2, intermediate_size=32,
                shared_intermediate_size=64, num_local_experts=8, num_experts_per_tok=2,
                mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--shape", default="tiny-h", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    import torch
    import transformers as tf

    cfg = tf.GraniteMoeHybridConfig(
        **SHAPES[a.shape], rms_norm_eps=1e-5, max_position_embeddings=8192, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False,
        tie_word_embeddings=True, position_embedding_type="nope",
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
        logits_scaling=6.0)
    with torch.device("meta"):
        model = tf.GraniteMoeHybridForCausalLM(cfg)
    # save_pretrained's names (the legacy ones transformers' conversion maps)
    legacy = {"block_sparse_moe.experts.gate_up_proj": "block_sparse_moe.input_linear.weight",
              "block_sparse_moe.experts.down_proj": "block_sparse_moe.output_linear.weight",
              "block_sparse_moe.router.weight": "block_sparse_moe.router.layer.weight"}
    names = []
    for n, t in model.state_dict().items():
        if cfg.tie_word_embeddings and n == "lm_head.weight":
            continue
        for k, v in legacy.items():
            n = n.replace(k, v)
        names.append((n, tuple(t.shape)))
    cfg.dtype = "bfloat16"
    cfg.to_json_file(os.path.join(a.out, "config.json"))
    write(a, names)


if __name__ == "__main__":
    main()
