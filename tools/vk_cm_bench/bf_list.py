#!/usr/bin/env python3
"""Writes bf_build.sh's lists (vk_cm_bench entries, README.md; docs/benchmarks.md, "Vulkan
decode GEMM on bf16 cooperative matrices"). Fast mode (SPLIT 1) only.

`bf_list.py` (list.txt), the 117 MB shapes (16 / 32 / 64 x 14336 x 4096 and x 4096 x 14336),
each between two entries of the plugin's f16 default there: at 9-32 rows matmul_dec.comp with
its L2 touches (dec_ka128_d2l2s32 at 16 rows, dec_ka64_d2l2s32 at 32) against the same
source compiled with -DBF16=1 (dec_bf_*: bf16 matrices, the weights staged unconverted, the
activations rounded to bf16), also at depth 3; at 64 rows matmul_cm.comp's wide layout with
two register sets (mcm_s2: WG 512, SGM 2, FM 2, FN 2, BK 64 at 132 workgroups) against
-DBF16=1 (mcm_bf_s2), and matmul_dec_bf at 64 rows; then dec_bfd.comp (weights straight from
the storage buffer into bf16 matrices; modules bfd_* : WT 1 the transposed product, KCONST a
literal K, PROBE the weight stream alone) against matmul_dec's loads alone (dec_probe); then
the bf16 multiply-add alone (mma entries, khr_bf_16x16x16_NAxNB) beside the f16 one.

`bf_list.py b2` (b2.txt, run with VKCM_ROTATE=1: the weights from copies in turn, so that
products of less than the L2 stream from memory): the 2b shape's products (hidden 2048, MLP
8192, in_proj 8512, out_proj 2048 x 4096) at 16 rows (matmul_dec, f16 / bf16) and 64 rows
(matmul_cm wide and narrow layouts, f16 / bf16)."""
import math
import sys

SHAPES = [(14336, 4096), (4096, 14336)]
B2 = [(8512, 2048), (2048, 4096), (8192, 2048), (2048, 8192), (2048, 2048)]


def slices(n, k, wg, fn, bk, groups):
    """vk_dec_plan_make's slices"""
    tiles = math.ceil(n / (16 * fn * wg // 32))
    s = max(1, min((groups + tiles // 2) // tiles, k // 256))
    ks = math.ceil(math.ceil(k / s) / bk) * bk
    return math.ceil(k / ks)


def dec(mod, m, n, k, depth=2, groups=264):
    s = slices(n, k, 256, 1, 64, groups)
    return f"{mod} gemm {m} {n} {k} 256 1 {(m + 15) // 16} 1 1 64 {depth} {s} 1"


def mcm(mod, m, n, k, wg=512, sgm=2, fm=2, fn=2, wave=132, rnd=False):
    tiles = math.ceil(n / (16 * fn * (wg // 32 // sgm))) * math.ceil(m / (16 * fm * sgm))
    s = (wave + tiles // 2) // tiles if rnd else wave // tiles
    s = max(1, min(s, k // 256))
    ks = math.ceil(math.ceil(k / s) / 64) * 64
    return f"{mod} gemm {m} {n} {k} {wg} {sgm} {fm} {fn} 1 64 1 {math.ceil(k / ks)} 1"


def pair(a, b):
    print(a)
    print(b)
    print(a)
    print(b)


def main():
    for n, k in SHAPES:
        pair(dec("dec_ka128_d2l2s32", 16, n, k), dec("dec_bf_ka128_d2l2s32", 16, n, k))
        print(dec("dec_bf_ka128_d2l2s32", 16, n, k, 3))
        print(dec("dec_bf_ka256_d2l2s32", 16, n, k))
        print(dec("dec_bf_ka128_d0l2s32", 16, n, k))
        pair(dec("dec_ka64_d2l2s32", 32, n, k), dec("dec_bf_ka64_d2l2s32", 32, n, k))
        print(dec("dec_bf_ka64_d2l2s32", 32, n, k, 3))
        pair(mcm("mcm_s2", 64, n, k), mcm("mcm_bf_s2", 64, n, k))
        print(mcm("mcm_bf_s3", 64, n, k))
        print(dec("dec_bf_ka128_d2l2s32", 64, n, k))
        print(dec("dec_ka128_d2l2s32", 64, n, k))
        s = slices(n, k, 256, 1, 64, 264)
        print(f"bfd_ka256 gemm 16 {n} {k} 256 1 1 1 1 64 4 {s} 1")
        print(f"bfd_wt_ka256 gemm 16 {n} {k} 256 1 1 1 1 64 4 {s} 1")
        for mod in ("bfd_probe", "bfd_probe_wt", f"bfd_probe_k{k}"):
            for d in (2, 4):
                print(f"{mod} gemm 16 {n} {k} 256 1 1 1 1 64 {d} {s} 1")
        print(f"dec_probe gemm 16 {n} {k} 256 1 1 1 1 64 3 {s} 1")
    for na, nb in ((1, 1), (2, 4), (4, 4)):
        fl = na * nb * 2 * 16 * 16 * 16
        print(f"khr_16x16x16_{na}x{nb} mma 2112 256 {fl}")
        print(f"khr_bf_16x16x16_{na}x{nb} mma 2112 256 {fl}")


def b2():
    for n, k in B2:
        pair(dec("dec_ka128_d2l2s32", 16, n, k), dec("dec_bf_ka128_d2l2s32", 16, n, k))
        pair(mcm("mcm_s2", 64, n, k), mcm("mcm_bf_s2", 64, n, k))
        pair(mcm("mcm_s2", 64, n, k, 256, 2, 2, 1, 264, True),
             mcm("mcm_bf_s2", 64, n, k, 256, 2, 2, 1, 264, True))


if __name__ == "__main__":
    b2() if sys.argv[1:] == ["b2"] else main()
