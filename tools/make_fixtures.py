#!/usr/bin/env python3
"""Write the parity fixtures for llmem's model runtime.

For each architecture llmem runs (llama, mamba2, bamba, nemotron_h) this
builds a tiny random-weight checkpoint with Hugging Face transformers, saves
it with save_pretrained (config.json + model.safetensors), and writes

  cases.jsonl      one {"id": ..., "tokens": [...]} a line
  reference.jsonl  one {"id": ..., "logprobs": [...]} a line, where
                   logprobs[i] = log p(tokens[i+1] | tokens[0..i]),
                   computed by transformers in float64 on the CPU
                   (torch code paths, eager attention).

Random weights are scaled so that the model is far from uniform: the
reference log-probs then spread over tens of nats, and an error in any
layer shows up. Besides random-token cases, each fixture has cases sampled
from the model itself, so high-probability tokens are covered too.

Usage (on a machine with torch and transformers, no network needed):
  python3 tools/make_fixtures.py --out tests/fixtures
"""

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch

VOCAB = 256
HIDDEN = 64


def common_cases(seed):
    """Token cases shared by every fixture: page boundaries (page sizes 1, 16
    and 64), lengths past 256, shared long prefixes and duplicates."""
    g = torch.Generator().manual_seed(seed)

    def rnd(n):
        return torch.randint(0, VOCAB, (n,), generator=g).tolist()

    cases = []
    for n in (1, 2, 3, 15, 16, 17, 63, 64, 65, 129, 300):
        cases.append({"id": f"len{n}", "tokens": rnd(n)})
    # Long shared prefix, then divergent suffixes (one of them crosses a
    # 64-token page boundary inside the suffix); the prefix on its own too.
    prefix = rnd(100)
    cases.append({"id": "prefix_only", "tokens": list(prefix)})
    for name, n in (("prefix_a", 5), ("prefix_b", 28), ("prefix_c", 40)):
        cases.append({"id": name, "tokens": prefix + rnd(n)})
    # Prefix that ends exactly on a page boundary of 16 and 64.
    p64 = rnd(64)
    cases.append({"id": "page64_a", "tokens": p64 + rnd(9)})
    cases.append({"id": "page64_b", "tokens": p64 + rnd(33)})
    # Exact duplicates (different ids, same tokens), and a duplicate of a
    # case that is itself a prefix of another.
    dup = rnd(40)
    cases.append({"id": "dup_a", "tokens": list(dup)})
    cases.append({"id": "dup_b", "tokens": list(dup)})
    cases.append({"id": "dup_prefix", "tokens": list(prefix)})
    # A repeated pattern (attention layers can copy it).
    motif = rnd(12)
    cases.append({"id": "repeat", "tokens": (motif * 6)[:70]})
    return cases


def scale_weights(model, seed, hidden, tied, arch=""):
    """Re-draw every parameter so activations stay O(1) through the depth
    and the logits have a standard deviation of about 3.

    For the fixtures of the second round (NEW_ARCHS) two more rules apply,
    so that the older fixtures stay reproducible: 3-D expert and conv
    weights are scaled by their fan-in, and norms that compute x * (1 + w)
    (Gemma, Qwen3-Next) draw w around 0, so the effective gain is 0.6-1.4
    like everywhere else."""
    new = arch in NEW_ARCHS
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = p.shape
            if name.endswith("A_log"):
                v = torch.log(torch.empty(shape).uniform_(1.0, 8.0, generator=g))
            elif name.endswith("dt_bias"):
                dt = torch.exp(torch.empty(shape).uniform_(math.log(0.01), math.log(0.3), generator=g))
                v = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
            elif name.endswith(".D"):
                v = torch.empty(shape).uniform_(0.5, 1.5, generator=g)
            elif new and "norm" in name and name.endswith("weight") and offset_norm(arch, name):
                v = torch.empty(shape).uniform_(-0.4, 0.4, generator=g)
            elif "norm" in name and name.endswith("weight"):
                v = torch.empty(shape).uniform_(0.6, 1.4, generator=g)
            elif name.endswith("bias"):
                v = torch.randn(shape, generator=g) * 0.1
            elif "conv1d.weight" in name:
                v = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
            elif "embed" in name:
                # Tied models use the embedding as the LM head too.
                std = 3.0 / math.sqrt(hidden) if tied else 1.0
                v = torch.randn(shape, generator=g) * std
            elif "lm_head" in name:
                v = torch.randn(shape, generator=g) * (3.0 / math.sqrt(hidden))
            elif p.dim() == 2:
                v = torch.randn(shape, generator=g) / math.sqrt(shape[1])
            elif new and p.dim() == 3:
                v = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
            else:
                v = torch.randn(shape, generator=g) * 0.5
            p.copy_(v.to(p.dtype))
        for name, b in model.named_buffers():
            # the router's selection-only bias: spread so that it reorders
            if name.endswith("e_score_correction_bias"):
                b.copy_((torch.randint(-4, 5, b.shape, generator=g) * 0.0625).to(b.dtype))


# Second-round architectures (issues 16 and 17): see scale_weights.
NEW_ARCHS = {"gemma3_text", "qwen3_next", "lfm2", "jamba"}


def offset_norm(arch, name):
    """True for a norm weight w applied as x * (1 + w)."""
    if arch == "gemma3_text":
        return True
    if arch == "qwen3_next":
        return "linear_attn.norm" not in name  # the gated norm is plain x * w
    return False


def make_config(arch):
    import transformers as tf

    rope = {"rope_type": "default", "rope_theta": 5000.0}
    if arch == "llama":
        kw = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=1024,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
        try:
            return tf.LlamaConfig(**kw, rope_parameters=rope)
        except TypeError:
            return tf.LlamaConfig(**kw, rope_theta=rope["rope_theta"])
    if arch == "mamba2":
        return tf.Mamba2Config(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2,
                               num_heads=8, head_dim=16, expand=2, state_size=16,
                               n_groups=2, conv_kernel=4, chunk_size=16,
                               use_bias=False, use_conv_bias=True, layer_norm_epsilon=1e-5,
                               residual_in_fp32=False, tie_word_embeddings=True)
    if arch == "bamba":
        kw = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                  num_hidden_layers=4, attn_layer_indices=[1, 3],
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                  max_position_embeddings=1024, mamba_n_heads=8, mamba_d_head=16,
                  mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                  mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
                  tie_word_embeddings=False)
        try:
            return tf.BambaConfig(**kw, rope_parameters=rope)
        except TypeError:
            return tf.BambaConfig(**kw, rope_theta=rope["rope_theta"])
    if arch == "nemotron_h":
        pattern = "M-M*-"
        kw = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
                  conv_kernel=4, expand=2, chunk_size=16, use_conv_bias=True,
                  mamba_proj_bias=False, use_bias=False, mlp_bias=False,
                  attention_bias=False, mlp_hidden_act="relu2",
                  layer_norm_epsilon=1e-5, max_position_embeddings=1024,
                  residual_in_fp32=False, tie_word_embeddings=False)
        errors = []
        for extra in (dict(hybrid_override_pattern=pattern, num_hidden_layers=len(pattern)),
                      dict(hybrid_override_pattern=pattern),
                      dict(layers_block_type=[{"M": "mamba", "*": "attention", "-": "mlp"}[c]
                                              for c in pattern])):
            try:
                cfg = tf.NemotronHConfig(**kw, **extra)
                if cfg.num_hidden_layers == len(pattern):
                    return cfg
                errors.append(f"{extra}: num_hidden_layers={cfg.num_hidden_layers}")
            except Exception as e:  # noqa: BLE001 - try the next spelling
                errors.append(f"{extra}: {e}")
        raise RuntimeError("NemotronHConfig: " + " | ".join(errors))
    if arch == "nemotron_h_moe":
        # Mamba-2, MoE, Mamba-2, attention, MoE: sigmoid routing over 8
        # experts in 4 groups (2 kept), top-2, renormalized, scaled by 2.5,
        # plus a shared relu2 expert (Nemotron-3 style).
        pattern = "MEM*E"
        return tf.NemotronHConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
            conv_kernel=4, expand=2, chunk_size=16, use_conv_bias=True,
            mamba_proj_bias=False, use_bias=False, mlp_bias=False, attention_bias=False,
            mlp_hidden_act="relu2", layer_norm_epsilon=1e-5, max_position_embeddings=1024,
            residual_in_fp32=False, tie_word_embeddings=False,
            layers_block_type=[{"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}[c]
                               for c in pattern],
            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=48, n_group=4, topk_group=2,
            routed_scaling_factor=2.5, norm_topk_prob=True)
    if arch in ("granitemoehybrid_moe", "granitemoehybrid_dense"):
        moe = arch.endswith("moe")
        kw = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=4,
                  layer_types=["mamba", "attention", "mamba", "attention"],
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                  max_position_embeddings=1024, mamba_n_heads=8, mamba_d_head=16,
                  mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                  mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
                  tie_word_embeddings=moe,
                  embedding_multiplier=6.0, residual_multiplier=0.5,
                  attention_multiplier=0.2, logits_scaling=0.8,
                  intermediate_size=16 if moe else 96,
                  num_local_experts=8 if moe else 0, num_experts_per_tok=3,
                  shared_intermediate_size=32 if moe else 96,
                  position_embedding_type="rope" if moe else "nope")
        return tf.GraniteMoeHybridConfig(**kw, rope_parameters=rope)
    if arch == "falcon_h1":
        # attention and Mamba-2 in parallel in every layer, muP multipliers
        return tf.FalconH1Config(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
            max_position_embeddings=1024, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16,
            mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
            mamba_chunk_size=16, mamba_conv_bias=True, mamba_proj_bias=False,
            mamba_rms_norm=False, projectors_bias=False, tie_word_embeddings=False,
            rope_parameters=rope, embedding_multiplier=2.0, lm_head_multiplier=0.7,
            mlp_multipliers=[1.3, 0.6], key_multiplier=0.8, attention_in_multiplier=1.1,
            attention_out_multiplier=0.9, ssm_multipliers=[1.2, 0.8, 1.1, 0.9, 1.4],
            ssm_in_multiplier=0.7, ssm_out_multiplier=1.2)
    if arch == "gemma3_text":
        # sliding, sliding, full, sliding; a window of 20 (not a multiple of
        # the page sizes 16 and 64); local and global RoPE bases differ
        return tf.Gemma3TextConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            hidden_activation="gelu_pytorch_tanh", max_position_embeddings=1024,
            rms_norm_eps=1e-6, tie_word_embeddings=True, query_pre_attn_scalar=16,
            sliding_window=20,
            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 5000.0}},
            final_logit_softcapping=None, attn_logit_softcapping=None)
    if arch == "qwen3_next":
        # gated delta net, gated delta net, gated full attention, gated delta
        # net; every layer's MLP is sparse: 8 experts of 32, top-2, plus a
        # shared expert of 48 behind a sigmoid gate
        return tf.Qwen3NextConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            rms_norm_eps=1e-6, max_position_embeddings=1024, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 5000.0,
                             "partial_rotary_factor": 0.25},
            linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4,
            decoder_sparse_step=1, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts_per_tok=2, num_experts=8,
            norm_topk_prob=True, mlp_only_layers=[],
            layer_types=["linear_attention", "linear_attention", "full_attention",
                         "linear_attention"])
    if arch == "lfm2":
        # short conv, short conv, attention, short conv (L_cache 3)
        return tf.Lfm2Config(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            norm_eps=1e-5, tie_word_embeddings=True, conv_bias=False, conv_L_cache=3,
            block_auto_adjust_ff_dim=False,
            rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
            layer_types=["conv", "conv", "full_attention", "conv"])
    if arch == "jamba":
        # Mamba-1, attention (no RoPE), Mamba-1, attention; layers 1 and 3
        # are MoE (4 experts, top-2), layers 0 and 2 dense
        return tf.JambaConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
            max_position_embeddings=1024, num_experts_per_tok=2, num_experts=4,
            expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2,
            attn_layer_offset=1, use_mamba_kernels=False, mamba_d_state=16, mamba_d_conv=4,
            mamba_expand=2, mamba_dt_rank=4, mamba_conv_bias=True, mamba_proj_bias=False,
            tie_word_embeddings=False)
    raise ValueError(arch)


def model_class(arch):
    import transformers as tf
    return {"llama": tf.LlamaForCausalLM, "mamba2": tf.Mamba2ForCausalLM,
            "bamba": tf.BambaForCausalLM, "nemotron_h": tf.NemotronHForCausalLM,
            "nemotron_h_moe": tf.NemotronHForCausalLM,
            "granitemoehybrid_moe": tf.GraniteMoeHybridForCausalLM,
            "granitemoehybrid_dense": tf.GraniteMoeHybridForCausalLM,
            "falcon_h1": getattr(tf, "FalconH1ForCausalLM", None),
            "gemma3_text": tf.Gemma3ForCausalLM, "qwen3_next": tf.Qwen3NextForCausalLM,
            "lfm2": tf.Lfm2ForCausalLM, "jamba": tf.JambaForCausalLM}[arch]


# Fixtures whose reference is a from_pretrained(dtype=...) reload (never a
# cast of a loaded model: casting rounds buffers such as RoPE frequencies),
# with transformers' eager experts (grouped_mm has no float64).
RELOAD_DTYPE = {"nemotron_h_moe", "granitemoehybrid_moe", "granitemoehybrid_dense", "falcon_h1",
                "gemma3_text", "qwen3_next", "lfm2", "jamba"}


def load_eval_model(arch, path, dtype):
    cls = model_class(arch)
    if arch in RELOAD_DTYPE:
        m = cls.from_pretrained(path, dtype=dtype, attn_implementation="eager")
        if hasattr(m, "set_experts_implementation"):
            m.set_experts_implementation("eager")
        return m.eval()
    try:
        m = cls.from_pretrained(path, attn_implementation="eager")
    except (TypeError, ValueError):
        m = cls.from_pretrained(path)
    return m.to(dtype).eval()


@torch.no_grad()
def logprobs_of(model, tokens):
    ids = torch.tensor([tokens], dtype=torch.long)
    out = model(input_ids=ids, use_cache=False)
    lp = torch.log_softmax(out.logits[0].to(torch.float64), dim=-1)
    tgt = ids[0, 1:]
    return lp[:-1].gather(1, tgt[:, None])[:, 0].tolist()


@torch.no_grad()
def sample_case(model, seed, n):
    g = torch.Generator().manual_seed(seed)
    toks = [int(torch.randint(0, VOCAB, (1,), generator=g))]
    while len(toks) < n:
        ids = torch.tensor([toks], dtype=torch.long)
        logits = model(input_ids=ids, use_cache=False).logits[0, -1].to(torch.float64)
        p = torch.softmax(logits, dim=-1)
        toks.append(int(torch.multinomial(p, 1, generator=g)))
    return toks


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def build_fixture(name, arch, seed, store_dtype, out_root):
    t0 = time.time()
    torch.manual_seed(seed)
    cfg = make_config(arch)
    model = model_class(arch)(cfg).to(torch.float32).eval()
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    scale_weights(model, seed, cfg.hidden_size, tied, arch)
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    model.to(store_dtype).save_pretrained(out)
    for extra in ("generation_config.json",):
        p = os.path.join(out, extra)
        if os.path.exists(p):
            os.remove(p)

    m64 = load_eval_model(arch, out, torch.float64)
    m32 = load_eval_model(arch, out, torch.float32)
    cases = common_cases(1234)
    cases.append({"id": "sampled_a", "tokens": sample_case(m64, seed + 1, 48)})
    cases.append({"id": "sampled_b", "tokens": sample_case(m64, seed + 2, 80)})
    refs, all_lp, maxdiff32 = [], [], 0.0
    for c in cases:
        lp = logprobs_of(m64, c["tokens"])
        lp32 = logprobs_of(m32, c["tokens"])
        if lp:
            maxdiff32 = max(maxdiff32, max(abs(a - b) for a, b in zip(lp, lp32)))
        all_lp += lp
        refs.append({"id": c["id"], "logprobs": lp})
    # Cross-check: one forward over a long case equals the per-prefix result
    # (causality) -- the last log-prob of a prefix run matches.
    long = next(c for c in cases if c["id"] == "len300")["tokens"]
    full = logprobs_of(m64, long)
    part = logprobs_of(m64, long[:200])
    causal_err = max(abs(a - b) for a, b in zip(full[:199], part))
    write_jsonl(os.path.join(out, "cases.jsonl"), cases)
    write_jsonl(os.path.join(out, "reference.jsonl"), refs)
    lp = torch.tensor(all_lp, dtype=torch.float64)
    files = sorted(os.listdir(out))
    size = os.path.getsize(os.path.join(out, "model.safetensors"))
    from safetensors import safe_open
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        names = {k: (str(f.get_slice(k).get_dtype()), list(f.get_slice(k).get_shape()))
                 for k in f.keys()}
    stats = {
        "fixture": name, "arch": arch, "store_dtype": str(store_dtype),
        "safetensors_bytes": size, "files": files, "n_cases": len(cases),
        "n_logprobs": int(lp.numel()),
        "logprob_min": float(lp.min()), "logprob_max": float(lp.max()),
        "logprob_mean": float(lp.mean()), "logprob_std": float(lp.std()),
        "uniform_logprob": -math.log(VOCAB),
        "frac_above_-1": float((lp > -1).double().mean()),
        "frac_below_-10": float((lp < -10).double().mean()),
        "max_abs_f32_vs_f64": maxdiff32, "causality_err": causal_err,
        "seconds": round(time.time() - t0, 1), "tensors": names,
    }
    return stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated fixture names")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers
    print(f"torch {torch.__version__} transformers {transformers.__version__}", flush=True)
    fixtures = [("llama", "llama", 11, torch.float32),
                ("mamba2", "mamba2", 12, torch.float32),
                ("bamba", "bamba", 13, torch.float32),
                ("nemotron_h", "nemotron_h", 14, torch.float32),
                ("bamba_bf16", "bamba", 15, torch.bfloat16),
                ("granite_moe", "granitemoehybrid_moe", 16, torch.float32),
                ("granite_dense_nope", "granitemoehybrid_dense", 17, torch.float32),
                ("nemotron_h_moe", "nemotron_h_moe", 18, torch.float32),
                ("falcon_h1", "falcon_h1", 19, torch.float32),
                ("gemma3_text", "gemma3_text", 20, torch.float32),
                ("qwen3_next", "qwen3_next", 21, torch.float32),
                ("lfm2", "lfm2", 22, torch.float32),
                ("jamba", "jamba", 23, torch.float32)]
    only = set(filter(None, args.only.split(",")))
    os.makedirs(args.out, exist_ok=True)
    summary, failed = [], []
    for name, arch, seed, dt in fixtures:
        if only and name not in only:
            continue
        try:
            st = build_fixture(name, arch, seed, dt, args.out)
            summary.append(st)
            brief = {k: v for k, v in st.items() if k != "tensors"}
            print(json.dumps(brief), flush=True)
            print("  tensors:", json.dumps(st["tensors"]), flush=True)
            with open(os.path.join(args.out, name, "config.json")) as f:
                print("  config.json:", f.read().replace("\n", " "), flush=True)
        except Exception:  # noqa: BLE001 - report and go on with the others
            failed.append(name)
            print(f"FIXTURE {name} FAILED", flush=True)
            traceback.print_exc()
    rows = [{k: v for k, v in s.items() if k != "tensors"} for s in summary]
    path = os.path.join(args.out, "fixtures_summary.json")
    if only and os.path.exists(path):  # keep the other fixtures' rows
        with open(path) as f:
            old = [r for r in json.load(f) if r["fixture"] not in {r2["fixture"] for r2 in rows}]
        rows = old + rows
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"done: {len(summary)} ok, failed: {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
