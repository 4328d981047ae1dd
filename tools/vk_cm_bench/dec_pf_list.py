#!/usr/bin/env python3
"""Writes dec_pf.sh's list (vk_cm_bench entries, README.md): for each 117 MB decode shape at 16
rows, fast (SPLIT 1: where the plugin runs matmul_dec by default), matmul_cm.comp's KHR module at
the plugin's plan (as dec_list.py's old) and matmul_dec.comp at vk_dec_cfg_default's blocking
without the prefetch, first and last; between them matmul_dec's L2-prefetch variants
dec_ka512_dDlLsS (PFD D, PFL L, PFS S). `dec_pf_list.py variants` prints the (PFD, PFL, PFS)
grid for dec_pf.sh. (The first call's list also had 64 rows, precise mode, the same prefetch in
matmul_cm.comp's plans and atomic touches: docs/benchmarks.md, "Vulkan decode GEMM: the weights
into L2 ahead of the stream".)"""
import sys

from dec_list import old, plan

VARIANTS = [(4, 2, 32), (2, 1, 32), (3, 1, 32), (4, 1, 32), (6, 1, 32), (2, 2, 32), (3, 2, 32),
            (5, 2, 32), (4, 2, 64), (3, 1, 64), (4, 3, 32), (4, 2, 16)]


def dec(m, n, k, split, name):
    s, _, _ = plan(n, k, 256, 1, 64, 512, 264)
    return f"{name} gemm {m} {n} {k} 256 1 {(m + 15) // 16} 1 {split} 64 2 {s} 1"


def main():
    if sys.argv[1:] == ["variants"]:
        for v in VARIANTS:
            print(*v)
        return
    for n, k in ((14336, 4096), (4096, 14336)):
        base = old(16, n, k, 1)
        print(base)
        print(dec(16, n, k, 1, "dec_ka512"))
        for d, l, s in VARIANTS:
            print(dec(16, n, k, 1, f"dec_ka512_d{d}l{l}s{s}"))
        print(base)
        print(dec(16, n, k, 1, "dec_ka512"))


if __name__ == "__main__":
    main()
