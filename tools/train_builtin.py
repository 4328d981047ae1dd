#!/usr/bin/env python3
"""Train llmem's built-in model: a small byte-level Bamba hybrid on
tinyshakespeare.

The model is transformers' BambaForCausalLM (Mamba-2 mixers plus two
attention layers, SwiGLU feed-forward after every mixer) with a 256-token
byte vocabulary. The last 5% of the text is held out; the training windows
come from the first 95% only. Training runs for a fixed wall-clock budget
with AdamW and a cosine learning-rate schedule over that budget; the
checkpoint with the lowest validation loss (evaluated every --eval-every
seconds) is kept. Weights are stored in bf16 (at most 10 MB).

It writes, into --out (default models/builtin):
  config.json, model.safetensors, TRAINING.md
and, into --val-out (default tests/fixtures/builtin_val), the held-out
slice cut into non-overlapping windows of --val-window bytes as
cases.jsonl, with transformers' float64 log-probs (CPU, torch code paths,
eager attention) of the stored weights in reference.jsonl. The validation
loss reported in TRAINING.md is exactly -mean(all those log-probs).

Usage (on the GPU machine):
  python3 tools/train_builtin.py --data .data/tinyshakespeare.txt
"""

import argparse
import json
import math
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F


def build_config(args):
    from transformers import BambaConfig
    kw = dict(vocab_size=256, hidden_size=args.hidden, intermediate_size=args.ffn,
              num_hidden_layers=args.layers,
              attn_layer_indices=[int(x) for x in args.attn_layers.split(",")],
              num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
              rms_norm_eps=1e-5, max_position_embeddings=4096,
              mamba_n_heads=args.mamba_heads, mamba_d_head=args.hidden * 2 // args.mamba_heads,
              mamba_n_groups=1, mamba_d_state=args.d_state, mamba_d_conv=4, mamba_expand=2,
              mamba_chunk_size=args.chunk, mamba_conv_bias=True, mamba_proj_bias=False,
              tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    try:
        return BambaConfig(**kw, rope_parameters=rope)
    except TypeError:
        return BambaConfig(**kw, rope_theta=rope["rope_theta"])


def add_residual_dropout(model, p):
    """Dropout on the embedding output and on every mixer and feed-forward
    output (before the residual add), active in training mode only. It is
    implemented with forward hooks, so the architecture and the saved
    checkpoint are plain Bamba."""
    def hook(mod, inp, out):
        if not mod.training or p <= 0:
            return out
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, True),) + tuple(out[1:])
        return F.dropout(out, p, True)
    n = 0
    for layer in model.model.layers:
        for name in ("mamba", "self_attn", "feed_forward"):
            m = getattr(layer, name, None)
            if m is not None:
                m.register_forward_hook(hook)
                n += 1
    model.model.embed_tokens.register_forward_hook(hook)
    return n + 1


def val_windows(val_bytes, window):
    out = []
    for i in range(0, len(val_bytes), window):
        w = val_bytes[i:i + window]
        if len(w) >= 2:
            out.append(w)
    return out


@torch.no_grad()
def eval_loss(model, windows, device, dtype=torch.float32, batch=64):
    """Mean next-byte loss (nats) over all predicted positions."""
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(windows), batch):
        group = windows[i:i + batch]
        by_len = {}
        for w in group:
            by_len.setdefault(len(w), []).append(w)
        for _, ws in by_len.items():
            x = torch.tensor([list(w) for w in ws], dtype=torch.long, device=device)
            logits = model(input_ids=x, use_cache=False).logits.to(torch.float64)
            lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, x[:, 1:, None])[..., 0]
            tot += float(-lp.sum())
            n += lp.numel()
    model.train()
    return tot / n


@torch.no_grad()
def logprob_rows(model, windows, batch=32):
    rows = []
    for i in range(0, len(windows), batch):
        group = windows[i:i + batch]
        by_len = {}
        for j, w in enumerate(group):
            by_len.setdefault(len(w), []).append((j, w))
        res = [None] * len(group)
        for _, items in by_len.items():
            x = torch.tensor([list(w) for _, w in items], dtype=torch.long)
            logits = model(input_ids=x, use_cache=False).logits.to(torch.float64)
            lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, x[:, 1:, None])[..., 0]
            for k, (j, _) in enumerate(items):
                res[j] = lp[k].tolist()
        rows += res
    return rows


@torch.no_grad()
def sample_text(model, device, prompt, n, temp, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    toks = list(prompt.encode())
    for _ in range(n):
        x = torch.tensor([toks[-512:]], dtype=torch.long, device=device)
        logits = model(input_ids=x, use_cache=False).logits[0, -1].float() / temp
        toks.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g)))
    return bytes(toks).decode("utf-8", errors="replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=".data/tinyshakespeare.txt")
    ap.add_argument("--out", default="models/builtin")
    ap.add_argument("--val-out", default="tests/fixtures/builtin_val")
    ap.add_argument("--budget", type=float, default=300.0, help="training wall-clock seconds")
    ap.add_argument("--eval-every", type=float, default=20.0, help="seconds between val evals")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--attn-layers", default="2,5")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--mamba-heads", type=int, default=8)
    ap.add_argument("--d-state", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=float, default=0.03, help="fraction of the budget")
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for the float64 reference")
    ap.add_argument("--val-window", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-bytes", type=int, default=10_000_000)
    args = ap.parse_args()
    cmd = "python3 tools/train_builtin.py " + " ".join(sys.argv[1:])

    import transformers
    from transformers import BambaForCausalLM
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor()
    try:
        import transformers.models.bamba.modeling_bamba as mb
        fast = bool(getattr(mb, "is_fast_path_available", False))
    except Exception:  # noqa: BLE001
        fast = False
    import importlib.util
    found = [n for n in ("mamba_ssm", "causal_conv1d") if importlib.util.find_spec(n)]
    fast = f"{fast} (importable: {', '.join(found) or 'none'})"
    print(f"torch {torch.__version__} transformers {transformers.__version__} device {gpu} "
          f"mamba fast path {fast}", flush=True)

    data = open(args.data, "rb").read()
    split = int(len(data) * 0.95)
    train_bytes, val_bytes = data[:split], data[split:]
    train = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8).to(device).long()
    windows = val_windows(val_bytes, args.val_window)
    full = [w for w in windows if len(w) == args.val_window]
    print(f"data {len(data)} bytes: train {len(train_bytes)}, val {len(val_bytes)} "
          f"({len(windows)} windows of <= {args.val_window})", flush=True)

    cfg = build_config(args)
    model = BambaForCausalLM(cfg)
    try:
        model.config._attn_implementation = "sdpa"
    except Exception:  # noqa: BLE001
        pass
    model.to(device).train()
    n_drop = add_residual_dropout(model, args.dropout)
    print(f"residual dropout {args.dropout} on {n_drop} module outputs", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params} ({n_params * 2 / 1e6:.2f} MB as bf16)", flush=True)
    assert n_params * 2 + 100_000 <= args.max_bytes, "model too large for the 10 MB budget"

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            fused=(device == "cuda"))
    offs = torch.arange(args.seq + 1, device=device)

    def batch():
        idx = torch.randint(0, train.numel() - args.seq - 1, (args.batch,), device=device)
        xy = train[idx[:, None] + offs]
        return xy[:, :-1], xy[:, 1:]

    def lr_at(frac):
        if frac < args.warmup:
            return args.lr * frac / args.warmup
        q = min(1.0, (frac - args.warmup) / (1 - args.warmup))
        return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * q))

    best, best_state, best_step = float("inf"), None, 0
    history = []
    step, tokens = 0, 0
    t_start = time.time()
    next_eval = args.eval_every
    train_ema = None
    loss_sum, loss_n = None, 0
    while True:
        el = time.time() - t_start
        if el >= args.budget:
            break
        for grp in opt.param_groups:
            grp["lr"] = lr_at(el / args.budget)
        x, y = batch()
        logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        loss_n += 1
        if step % 50 == 0 or step == 1:
            # Mean training loss (with dropout) over the steps since the last print.
            lv = float(loss_sum) / loss_n
            loss_sum, loss_n = None, 0
            if not math.isfinite(lv):
                print(f"step {step}: loss is {lv}, stopping", flush=True)
                break
            train_ema = lv
            if step == 1 or step % 200 == 0:
                print(f"step {step:6d} t {el:6.1f}s lr {lr_at(el / args.budget):.2e} "
                      f"train {train_ema:.4f}", flush=True)
        if el >= next_eval:
            vl = eval_loss(model, full, device)
            history.append((step, round(el, 1), round(train_ema or float('nan'), 4), round(vl, 4)))
            mark = ""
            if vl < best:
                best, best_step = vl, step
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                mark = " *"
            print(f"eval step {step} t {el:.1f}s train~{train_ema:.4f} val {vl:.4f}{mark}", flush=True)
            next_eval += args.eval_every
    wall = time.time() - t_start
    vl = eval_loss(model, full, device)
    history.append((step, round(wall, 1), round(train_ema or float('nan'), 4), round(vl, 4)))
    if vl < best:
        best, best_step, best_state = vl, step, None
    print(f"end of training: {step} steps, {tokens} tokens, {wall:.1f}s; "
          f"last val {vl:.4f}, best val {best:.4f} at step {best_step}", flush=True)
    if best_state is not None:
        model.load_state_dict(best_state)

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    for f in os.listdir(args.out):
        if f not in ("config.json", "model.safetensors", "TRAINING.md"):
            os.remove(os.path.join(args.out, f))
    st_bytes = os.path.getsize(os.path.join(args.out, "model.safetensors"))
    print(f"saved {args.out}: model.safetensors {st_bytes} bytes", flush=True)
    assert st_bytes <= args.max_bytes

    # The stored (bf16) weights, evaluated exactly as llmem score will see them.
    stored = BambaForCausalLM.from_pretrained(args.out, attn_implementation="eager")
    m32 = stored.to(device=device, dtype=torch.float32).eval()
    gen = torch.Generator(device=device).manual_seed(7)
    idx = torch.randint(0, train.numel() - args.seq - 1, (512,), device=device, generator=gen)
    tw = [bytes(train[i:i + args.seq + 1].tolist()) for i in idx.tolist()]
    train_loss = eval_loss(m32, tw, device)
    val32 = eval_loss(m32, windows, device)
    sample = sample_text(m32, device, "ROMEO:\n", 400, 0.8, 3)
    print(f"stored weights: train {train_loss:.4f} val(f32, all windows) {val32:.4f}", flush=True)
    print("sample:\n" + sample, flush=True)

    t_ref = time.time()
    torch.set_num_threads(args.threads or os.cpu_count() or 8)
    m64 = BambaForCausalLM.from_pretrained(args.out, attn_implementation="eager")
    m64 = m64.to(device="cpu", dtype=torch.float64).eval()
    rows = logprob_rows(m64, windows)
    allv = [v for r in rows for v in r]
    val64 = -sum(allv) / len(allv)
    print(f"float64 reference: val {val64:.6f} nats/byte over {len(allv)} predictions "
          f"({time.time() - t_ref:.1f}s)", flush=True)
    os.makedirs(args.val_out, exist_ok=True)
    with open(os.path.join(args.val_out, "cases.jsonl"), "w") as f:
        for i, w in enumerate(windows):
            f.write(json.dumps({"id": f"val{i:04d}", "tokens": list(w)}, separators=(",", ":")) + "\n")
    with open(os.path.join(args.val_out, "reference.jsonl"), "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": f"val{i:04d}", "logprobs": [round(v, 6) for v in r]},
                               separators=(",", ":")) + "\n")

    hist = "\n".join(f"| {s} | {t} | {tr} | {v} |" for s, t, tr, v in history)
    md = f"""# Built-in model: training run

`BambaForCausalLM` (transformers {transformers.__version__}, torch {torch.__version__}),
byte-level (vocabulary 256: token = byte value), trained on
`shared/data/tinyshakespeare.txt` ({len(data)} bytes). The first 95%
({len(train_bytes)} bytes) is the training text; the last 5%
({len(val_bytes)} bytes) is held out.

## Result

| | nats per byte |
| --- | --- |
| **validation loss (held-out 5%, stored bf16 weights, float64)** | **{val64:.4f}** |
| validation loss, same, float32 on the GPU | {val32:.4f} |
| training loss (512 random {args.seq}-byte windows of the training text, stored weights) | {train_loss:.4f} |

The validation loss is the mean of -log p(byte | preceding bytes of its
window) over the held-out slice cut into {len(windows)} non-overlapping
windows of at most {args.val_window} bytes (the first byte of each window is
not predicted): {len(allv)} predictions. Those windows and transformers'
float64 log-probs are `tests/fixtures/builtin_val/cases.jsonl` and
`reference.jsonl`, so `llmem score` reproduces this number.

The kept checkpoint is the one with the lowest validation loss among the
evaluations made during training (every {args.eval_every:.0f} s; step {best_step} of
{step}), i.e. the held-out slice also served for early stopping.

## Architecture

{json.dumps({k: getattr(cfg, k, None) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "attn_layer_indices", "num_attention_heads", "num_key_value_heads", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups", "mamba_d_conv", "mamba_expand", "mamba_chunk_size")}, indent=1)}

{n_params} parameters, stored as bf16: model.safetensors is {st_bytes} bytes.

## Training

- device: {gpu}; mamba CUDA kernels (mamba_ssm/causal_conv1d) available: {fast}
  (when not, transformers' chunked torch path runs).
- AdamW, betas (0.9, 0.95), weight decay {args.wd} on matrices (not on
  embeddings, norms, biases, A_log, D, dt_bias), gradient clipping 1.0.
- learning rate {args.lr} peak, linear warm-up over the first {args.warmup:.0%} of the
  time budget, cosine decay to {args.min_lr} at the end of the budget.
- residual dropout {args.dropout} (embedding output and every mixer and
  feed-forward output, training only; forward hooks, so the saved model is
  plain Bamba).
- batch {args.batch} random windows x {args.seq} bytes ({args.batch * args.seq} tokens a step),
  float32 weights and activations with TF32 matrix products.
- wall-clock budget {args.budget:.0f} s: {step} steps, {tokens} tokens ({tokens / len(train_bytes):.1f} epochs),
  {wall:.1f} s of training.

| step | seconds | train loss (last 50 steps, with dropout) | val loss (full windows, f32) |
| --- | --- | --- | --- |
{hist}

## Sample (temperature 0.8, prompt "ROMEO:\\n")

```
{sample}
```

## Command

```
{cmd}
```
"""
    with open(os.path.join(args.out, "TRAINING.md"), "w") as f:
        f.write(md)
    print(f"VAL_LOSS {val64:.4f} (limit 1.6)", flush=True)
    return 0 if val64 <= 1.6 else 2


if __name__ == "__main__":
    sys.exit(main())
