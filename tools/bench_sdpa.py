#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention (flash backend) on the prefill shapes
of `llmem bench`: 8 sequences x 2048 tokens, causal, 32 query / 8 KV heads,
head dim 128, f16 (and bf16).

It is the reference for the CUDA issue's prefill target: llmem's paged prefill
attention should take at most 1.25x this time (>= 0.8x its speed). Run it on
the same GPU in the same session as `llmem bench --backend cuda`.

Timing: CUDA events around each call, 5 warm-up calls, median of 30. Inputs
are random normal. FLOPs counted as llmem bench counts them:
4 * head_dim * heads * (sum over queries of visible keys).

Usage: python3 tools/bench_sdpa.py [--iters N]
"""
import argparse
import sys

from cuda_timing import median_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:  # pragma: no cover - environment dependent
        print(f"bench_sdpa: PyTorch with torch.nn.attention is needed ({e})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("bench_sdpa: no CUDA device", file=sys.stderr)
        return 1

    B, N, H, HKV, D = 8, 2048, 32, 8, 128
    flops = 4.0 * D * H * B * (N * (N + 1) / 2)
    print(f"bench_sdpa: torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for dtype in (torch.float16, torch.bfloat16):
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(B, H, N, D, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(B, HKV, N, D, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(B, HKV, N, D, device="cuda", dtype=dtype, generator=g)
        variants = []
        # native GQA if this torch's flash kernel takes it, else K/V repeated per query head
        variants.append(("gqa", lambda: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True)))
        kr = k.repeat_interleave(H // HKV, dim=1)
        vr = v.repeat_interleave(H // HKV, dim=1)
        variants.append(("repeated kv", lambda: F.scaled_dot_product_attention(
            q, kr, vr, is_causal=True)))
        for name, fn in variants:
            try:
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                    ms = median_ms(fn, args.iters)
            except (RuntimeError, TypeError) as err:
                print(f"sdpa flash {str(dtype)[6:]:9s} {name:12s} unavailable: "
                      f"{str(err).splitlines()[0][:100]}")
                continue
            print(f"sdpa flash {str(dtype)[6:]:9s} {name:12s} {ms:9.3f} ms  "
                  f"{flops / (ms * 1e-3) / 1e12:7.1f} TFLOP/s  (8 x 2048 causal, 32/8 heads, hd 128)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
