#!/usr/bin/env python3
"""Prefill attention: llmem's paged CUDA kernels against PyTorch's SDPA
backends (flash, cuDNN) and flex_attention, in one process.

llmem's kernels come from the stand-alone harness kernels/bench_attn_prefill.cu,
built as a shared library and loaded with ctypes (its header comment has the
nvcc command). Shapes: causal prefill of B sequences x N tokens, 32 query /
8 KV heads, head dim 128, bf16 K/V (llmem: a paged pool with pages of 16 in
shuffled order, f32 queries and outputs as the op takes them; torch: bf16
q/k/v/out, contiguous). FLOPs counted as `llmem bench` counts them:
4 * head_dim * heads * (sum over queries of visible keys).

Timing: CUDA events, median of --iters calls after warm-ups.

Usage: python3 tools/bench_prefill_attn.py LIB.so [--iters N] [--variants 0,1,2]
"""
import argparse
import ctypes
import sys

from cuda_timing import median_ms


def torch_times(B, N, H, HKV, D, iters):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    kr = k.repeat_interleave(H // HKV, dim=1)
    vr = v.repeat_interleave(H // HKV, dim=1)

    def timed(fn):
        return median_ms(fn, iters)

    res = {}
    for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
        for kvname, kk, vv, gqa in (("gqa", k, v, True), ("repeated kv", kr, vr, False)):
            try:
                with sdpa_kernel([backend]):
                    ms = timed(lambda: F.scaled_dot_product_attention(
                        q, kk, vv, is_causal=True, enable_gqa=gqa))
                res[f"{name} ({kvname})"] = ms
            except (RuntimeError, TypeError) as err:
                print(f"  {name} ({kvname}) unavailable: {str(err).splitlines()[0][:120]}")
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def causal(b, h, qi, ki):
            return qi >= ki

        bm = create_block_mask(causal, None, None, N, N, device="cuda")
        fa = torch.compile(flex_attention)
        res["flex_attention (gqa)"] = timed(lambda: fa(q, k, v, block_mask=bm, enable_gqa=True))
    except Exception as err:  # compile errors come in many types
        print(f"  flex_attention unavailable: {str(err).splitlines()[0][:120]}")
    del q, k, v, kr, vr
    torch.cuda.empty_cache()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--variants", default="")
    ap.add_argument("--pages", default="16", help="page sizes at 8 x 2048, comma-separated")
    ap.add_argument("--shapes", default="8x2048,1x512,1x16384")
    ap.add_argument("--check-variants", default="",
                    help="variants checked at head_dim 64 bf16 and 128 f16 (default 0,2)")
    args = ap.parse_args()
    import torch

    lib = ctypes.CDLL(args.lib)
    lib.fattn_name.restype = ctypes.c_char_p
    lib.fattn_time.restype = ctypes.c_double
    n_var = lib.fattn_count()
    variants = [int(x) for x in args.variants.split(",")] if args.variants else list(range(n_var))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    H, HKV, D = 32, 8, 128
    for shape in args.shapes.split(","):
        B, N = (int(x) for x in shape.split("x"))
        flops = 4.0 * D * H * B * (N * (N + 1) / 2)
        print(f"== {B} x {N} causal, {H}/{HKV} heads, hd {D}, bf16 ==")
        tt = torch_times(B, N, H, HKV, D, args.iters)
        for name, ms in tt.items():
            print(f"  {name:34s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
        ref = tt.get("sdpa flash (gqa)") or tt.get("sdpa flash (repeated kv)")
        pages = [int(p) for p in args.pages.split(",")] if shape == "8x2048" else [16]
        for ps in pages:
            rc = lib.fattn_setup(B, N, ps, D, 2, H, HKV)
            if rc != 0:
                print(f"  llmem setup failed ({rc})")
                continue
            for v in variants:
                ms = lib.fattn_time(v, args.iters)
                mx, ne = ctypes.c_double(), ctypes.c_double()
                ok = lib.fattn_check(v, 48, ctypes.byref(mx), ctypes.byref(ne))
                if ms <= 0:
                    print(f"  llmem [{v}] {lib.fattn_name(v).decode()}: failed")
                    continue
                ratio = f"{ref / ms:5.2f}x flash" if ref else ""
                err = f"max|d| {mx.value:.2e} nerr {ne.value:.2e}" if ok == 0 else "check failed"
                print(f"  llmem [{v}] pages {ps:2d} {lib.fattn_name(v).decode():40s} {ms:8.3f} ms "
                      f"{flops / ms / 1e9:7.1f} TFLOP/s {ratio}  {err}")
        lib.fattn_free()
    # other head dims / dtypes, for correctness (--check-variants)
    chk = [int(x) for x in args.check_variants.split(",")] if args.check_variants else [0, 2]
    for (dt, hd, name) in ((2, 64, "bf16 hd 64"), (1, 128, "f16 hd 128")):
        if lib.fattn_setup(2, 1000, 16, hd, dt, 32, 8) != 0:
            continue
        for v in chk:
            mx, ne = ctypes.c_double(), ctypes.c_double()
            ok = lib.fattn_check(v, 48, ctypes.byref(mx), ctypes.byref(ne))
            ms = lib.fattn_time(v, 5)
            print(f"  {name} 2 x 1000 [{v}] {ms:7.3f} ms check rc {ok} max|d| {mx.value:.2e} "
                  f"nerr {ne.value:.2e}")
        lib.fattn_free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
