#!/usr/bin/env python3
"""Writes dec_r64g.sh's list (vk_cm_bench entries, README.md): the 64-row products of the 9B and
2b decode steps in fast mode (raw tiles, the sum pass not included), run with VKCM_ROTATE=1, at
matmul_cm.comp layouts with fewer fragment loads from shared memory per multiply-add than the
default 512,2,2,64,2 (16 subgroups of 32 x 32: 4 KB of fragments a 1 KB of weights), with more
workgroups an SM, or with whole waves (docs/benchmarks.md, "Vulkan decode at 64 rows: fragment
loads, whole waves and the ring"); `dec_r64g_list.py ring` writes ring.txt (ring_list). Each shape between two entries of the plugin's default for it (the wide
layout, or vk_cm_plan_narrow's). Fields of a layout: module (mcm_sS: S register sets), WG, SGM,
FM, FN, BK, wave (split-K into floor(wave / tiles) slices, at most K / 256)."""
import math
import sys

# (N, K, name): 9B MLP up / gate and down (every layout); 9B out_proj, 2b in_proj, out_proj,
# MLP up / gate and down (LAYOUTS2)
SHAPES9 = [(14336, 4096, "9b up"), (4096, 14336, "9b down")]
SHAPES2 = [(4096, 8192, "9b out_proj"), (8512, 2048, "2b in_proj"), (2048, 4096, "2b out_proj"), (8192, 2048, "2b up"),
           (2048, 8192, "2b down")]
# (sets, WG, SGM, FM, FN, BK, wave)
WIDE = (2, 512, 2, 2, 2, 64, 132)
NARROW = (2, 256, 2, 2, 1, 64, 264)
LAYOUTS = [
    (2, 448, 2, 2, 2, 64, 132),   # 14 subgroups, 64 x 224 tiles: 9B up in 128 workgroups
    (2, 256, 2, 2, 4, 64, 132),   # 2 x 4 subgroups of 32 x 64: 3 KB of fragments a 1 KB
    (1, 256, 2, 2, 4, 64, 132),
    (2, 256, 1, 4, 2, 64, 132),   # 8 subgroups of 64 x 32: 3 KB a 1 KB
    (2, 512, 2, 2, 4, 32, 132),   # 64 x 512 tiles at K steps of 32
    (2, 256, 2, 2, 4, 32, 264),   # 64 x 256, K steps of 32: two workgroups an SM if <= 128 r
    (3, 256, 2, 2, 4, 32, 264),
    (2, 256, 2, 2, 4, 32, 132),
    (2, 128, 2, 2, 4, 64, 264),   # 2 x 2 subgroups of 32 x 64, 64 x 128 tiles, 2-3 an SM
    (2, 128, 2, 2, 4, 64, 396),
    (2, 128, 2, 2, 4, 32, 264),
    (2, 128, 1, 4, 2, 64, 264),   # 4 subgroups of 64 x 32
    (2, 256, 2, 2, 2, 64, 264),   # 64 x 128 tiles of 2 x 4 subgroups of 32 x 32
    (1, 256, 1, 4, 4, 32, 132),   # 8 subgroups of 64 x 64, 64 x 512 tiles: 2 KB a 1 KB
    (2, 256, 1, 4, 4, 32, 132),
    (2, 512, 1, 4, 2, 32, 132),   # 16 subgroups of 64 x 32, 64 x 512 tiles: 3 KB a 1 KB
]
LAYOUTS2 = [LAYOUTS[i] for i in (0, 1, 3, 5, 8, 10, 12, 13)] + [WIDE]


def smem(wg, sgm, fm, fn, bk, sets):
    bm, bn = 16 * fm * sgm, 16 * fn * (wg // 32 // sgm)
    return (bm + bn) * (bk // 8 + 1) * 16 + (wg // 32 * 16 * 80 if sets == 1 else 0) + 1024


def slices(n, k, wg, sgm, fm, fn, bk, wave):
    tiles = math.ceil(n / (16 * fn * (wg // 32 // sgm))) * math.ceil(64 / (16 * fm * sgm))
    s = max(1, min(wave // tiles, k // 256))
    ks = math.ceil(math.ceil(k / s) / bk) * bk
    return math.ceil(k / ks)


def entry(n, k, lay):
    sets, wg, sgm, fm, fn, bk, wave = lay
    s = slices(n, k, wg, sgm, fm, fn, bk, wave)
    return f"mcm_s{sets} gemm 64 {n} {k} {wg} {sgm} {fm} {fn} 1 {bk} 1 {s} 1"


# the ring (STAGES 2-4: two shared slices, one barrier a step, STAGES - 1 register sets) at
# layouts whose two slices fit 48 KB: (WG, SGM, FM, FN, BK, wave)
RING = [(448, 2, 2, 2, 32, 132), (256, 2, 2, 2, 32, 264), (128, 2, 2, 2, 32, 264),
        (256, 2, 2, 1, 64, 264)]


def ring_list():
    """`dec_r64g_list.py ring`: RING at STAGES 2, 3, 4 (module mcm) on the 9B MLP shapes and the
    2b MLP up, between the defaults, and one slice of 64 x 256 tiles for 64 K steps (the LM
    head's loop: 14336 x 4096 in 56 workgroups), and 64 x 64 tiles at K steps of 128 on the 9B
    MLP shapes"""
    for n, k in ((14336, 4096), (4096, 14336), (8192, 2048)):
        wide_steps = math.ceil(k / slices(n, k, *WIDE[1:])) // 64
        base = entry(n, k, NARROW if wide_steps < 10 else WIDE)
        print(base)
        for wg, sgm, fm, fn, bk, wave in RING:
            bm, bn = 16 * fm * sgm, 16 * fn * (wg // 32 // sgm)
            if 2 * (bm + bn) * (bk // 8 + 1) * 16 + 1024 > 48 * 1024:
                continue
            s = slices(n, k, wg, sgm, fm, fn, bk, wave)
            for st in (2, 3, 4):
                print(f"mcm gemm 64 {n} {k} {wg} {sgm} {fm} {fn} 1 {bk} {st} {s} 1")
        print(base)
    print("mcm_s2 gemm 64 14336 4096 512 2 2 2 1 64 1 1 1")
    print("mcm_s2 gemm 64 14336 4096 448 2 2 2 1 64 1 1 1")
    # K steps of 128 (256 contiguous bytes of each weight row a step) at 64 x 64 tiles
    for n, k in ((14336, 4096), (4096, 14336)):
        for sets, wg, wave in ((2, 256, 264), (1, 256, 264), (2, 256, 132)):
            s = slices(n, k, wg, 2, 2, 1, 128, wave)
            print(f"mcm_s{sets} gemm 64 {n} {k} {wg} 2 2 1 1 128 1 {s} 1")


def main():
    if sys.argv[1:] == ["ring"]:
        ring_list()
        return
    for shapes, lays in ((SHAPES9, LAYOUTS), (SHAPES2, LAYOUTS2)):
        for n, k, _ in shapes:
            wide_steps = math.ceil(k / slices(n, k, *WIDE[1:])) // 64
            base = entry(n, k, NARROW if wide_steps < 10 else WIDE)
            print(base)
            for lay in lays:
                if smem(*lay[1:6], lay[0]) <= 48 * 1024:
                    print(entry(n, k, lay))
            print(base)


if __name__ == "__main__":
    main()
