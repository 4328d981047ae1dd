#!/usr/bin/env python3
"""Writes dec_build.sh's list (vk_cm_bench entries, README.md): for each decode shape, rows 16
and 64, fast (SPLIT 1) and precise (SPLIT 2), matmul_cm.comp's KHR module at the plugin's plan
(vk_cm_plan_make_fn + vk_cm_plan_wave at 132 workgroups) first and last, matmul_dec.comp's
variants between. Fields: NAME gemm M N K WG SGM FM FN SPLIT BK STAGES SLICES RAW (STAGES is
matmul_dec's DEPTH; its KA is the module's, dec_kaKA). Variants whose shared memory would pass
47 KiB are left out (the H200's limit is 48 KiB, and a larger pipeline lost the device)."""
import math

SHAPES = [  # (N, K): the 9B shape's 14336-wide ones (117 MB of weights: beyond the L2)
    (14336, 4096), (4096, 14336)]
# matmul_dec.comp's blocking (vk_dec_cfg: WG, FN, BK, DEPTH, KA, GROUPS) by rows and split;
# the module is dec_kaKA_aAPF (APF 1 where a slice has several chunks, as vk_dec_plan_make)
CONFIGS = {
    16: [(256, 1, 64, 2, 512, 264), (256, 1, 64, 3, 512, 264), (256, 1, 64, 2, 512, 1056),
         (128, 1, 64, 3, 512, 264), (128, 2, 64, 3, 512, 264), (256, 1, 64, 2, 256, 264),
         (128, 1, 128, 2, 512, 264), (128, 2, 64, 2, 256, 528)],
    64: [(256, 1, 64, 2, 128, 264), (256, 1, 64, 3, 128, 264), (128, 1, 64, 3, 256, 264),
         (128, 2, 64, 3, 128, 264), (256, 1, 64, 2, 64, 264), (128, 1, 64, 3, 128, 264),
         (128, 2, 64, 2, 64, 264)],
}
# the weight stream alone (dec_probe: PROBE, no product; its err is meaningless): WG BK DEPTH
PROBES = [(256, 64, 3), (128, 256, 2)]


def smem(split, bm, wg, fn, bk, ka):
    """VK_DEC_SMEM at the module's KA"""
    return split * bm * (ka // 8 + 1) * 16 + (wg // 32) * 16 * fn * (bk // 8 + 1) * 16


def old(m, n, k, split):
    fm = max(1, math.ceil(m / 16))
    stages = 3 if m <= 16 else 1
    tiles = math.ceil(n / 128)
    slices = max(1, min(132 // tiles, k // 256))
    return f"mcm gemm {m} {n} {k} 256 1 {fm} 1 {split} 64 {stages} {slices} 1"


def plan(n, k, wg, fn, bk, ka, groups):
    """slices and the module of vk_dec_plan_make's plan"""
    tiles = math.ceil(n / (16 * fn * wg // 32))
    s = max(1, min((groups + tiles // 2) // tiles, k // 256))
    ks = math.ceil(math.ceil(k / s) / bk) * bk
    s = math.ceil(k / ks)
    return s, f"dec_ka{ka}_a{1 if ks > ka else 0}", min(ka, ks)


def main():
    for n, k in ((14336, 4096), (4096, 14336)):
        for wg, bk, depth in PROBES:
            s, _, _ = plan(n, k, wg, 1, bk, 1024, 264)
            print(f"dec_probe gemm 16 {n} {k} {wg} 1 1 1 1 {bk} {depth} {s} 1")
    for n, k in SHAPES:
        for m in (16, 64):
            for split in (1, 2):
                print(old(m, n, k, split))
                for wg, fn, bk, depth, ka, groups in CONFIGS[m]:
                    fm = math.ceil(m / 16)
                    s, module, ka_used = plan(n, k, wg, fn, bk, ka, groups)
                    if smem(split, 16 * fm, wg, fn, bk, ka) > 47 * 1024:
                        continue
                    print(f"{module} gemm {m} {n} {k} {wg} 1 {fm} {fn} {split} {bk} {depth} {s} 1")
                    if (wg, fn, bk, depth) == (256, 1, 64, 2) and ka in (512, 64):
                        # the same with workgroup barriers for the staging (WG_SYNC; vkws
                        # measured them 2-14% slower)
                        print(f"{module}_wgs gemm {m} {n} {k} {wg} 1 {fm} {fn} {split} {bk} "
                              f"{depth} {s} 1")
                print(old(m, n, k, split))


if __name__ == "__main__":
    main()
