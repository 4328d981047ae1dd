#!/usr/bin/env python3
"""Writes the harness list of matmul_cmp.comp layouts at the prefill shapes of
the 9B and 2b Bamba models, each entry named by its layout (copies of
matmul_cmp's KHR module under those names) (496 rows: the pp512 ubatch less the 16-row one),
for vk_cm_bench (fields NAME gemm M N K WG SGM FM FN SPLIT BK STAGES SLICES
RAW), split-K as the plugin splits (vk_cmp_plan_cfg: floor(WAVE / tiles)
slices, at most K / 256, at least 1).
    python3 cmp_sweep.py > list.txt"""
import sys

# (name, WG, SGM, FM, FN, BK, STAGES, WAVE)
LAYOUTS = [
    ("def", 256, 2, 4, 4, 32, 1, 132),      # 128 x 256, one workgroup an SM (the default)
    ("r16", 256, 2, 4, 4, 16, 2, 132),      # the same, a ring of two 16-deep slices
    ("w2x2", 128, 2, 4, 4, 32, 1, 264),     # 128 x 128 in 128 invocations: two an SM
    ("w1x4", 128, 1, 4, 4, 32, 1, 264),     # 64 x 256 in 128
    ("w4x1", 128, 4, 4, 4, 32, 1, 264),     # 256 x 64 in 128
    ("w2x2r", 128, 2, 4, 4, 16, 2, 264),    # 128 x 128, ring of 16
    ("s42", 256, 2, 4, 2, 32, 1, 264),      # 128 x 128, 8 subgroups of 4 x 2
    ("s24", 256, 4, 2, 4, 32, 1, 264),      # 128 x 128, 8 subgroups of 2 x 4
    ("t256", 256, 4, 4, 4, 16, 1, 132),     # 256 x 128 (BK 16: 48 KiB)
    ("f28", 256, 4, 2, 8, 32, 1, 132),      # 128 x 256, subgroups of 2 x 8
]
SHAPES = [  # M N K: 9B in_proj-like / gate,up; out_proj; down; 2b in_proj, gate/up, down, out
    (496, 14336, 4096), (496, 4096, 8192), (496, 4096, 14336),
    (496, 8512, 2048), (496, 8192, 2048), (496, 2048, 8192), (496, 2048, 4096),
]


def slices(m, n, k, wg, sgm, fm, fn, wave):
    bm, bn = 16 * fm * sgm, 16 * fn * (wg // 32 // sgm)
    tiles = -(-m // bm) * -(-n // bn)
    s = max(1, min(wave // tiles, k // 256))
    return s


def main():
    for split in (2, 1):
        for m, n, k in SHAPES:
            for name, wg, sgm, fm, fn, bk, st, wave in LAYOUTS:
                s = slices(m, n, k, wg, sgm, fm, fn, wave)
                print(f"{name} gemm {m} {n} {k} {wg} {sgm} {fm} {fn} {split} {bk} {st} {s} 1")
    # the default again, for drift
    print("def gemm 496 14336 4096 256 2 4 4 2 32 1 1 1")


if __name__ == "__main__" and len(sys.argv) == 1:
    main()
