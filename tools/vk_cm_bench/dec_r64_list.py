#!/usr/bin/env python3
"""Writes dec_r64.sh's list (vk_cm_bench entries, README.md): the 32- and 64-row decode GEMM on
the 117 MB shapes (64 x 14336 x 4096, 64 x 4096 x 14336; 32 rows of both), fast and precise
(docs/benchmarks.md, "Vulkan decode GEMM at 32 and 64 rows: fragment traffic"), each shape and
mode between two entries of matmul_cm.comp's KHR module at the plugin's plan (mcm, dec_list.py's
old):
- 64 rows: matmul_cm.comp at other warp layouts (specialization constants only): WG SGM FM FN
  BK, with tiles of 64 x 128 (SGM 2: 2 x 4 subgroups of 32 x 32) and 64 x 256 (FN 2 or SGM 2 FN
  4 at K steps of 32; 16 subgroups at WG 512), at the plugin's wave of 132 workgroups
  (vk_cm_plan_wave) and at twice its slices: fewer fragment loads from shared memory per
  multiply-add than the plan's 1 x 8 subgroups of 64 x 16, where every subgroup loads all 64 rows'
  activation fragments (and the plan's own layout at K steps of 32);
- 48 rows (64 x 14336 x 4096's weights): the plan (FM 3), SGM 2 (64-row tiles), matmul_dec;
- 32 rows: matmul_dec.comp at K steps of 64, chunks of 64, one or two steps in flight, with and
  without its L2 touches (module dec_kaKA_dDlLsS), at vk_dec_plan_make's slices for 264
  workgroups and twice them.
`dec_r64_list.py shapes` writes shapes.txt: the 64-row products of the 2b and 9B steps in fast
mode at narrower tiles (64 x 128, 64 x 64), more workgroups (two to four an SM) and the fused
sum (RAW 2), run with VKCM_ROTATE=1 (docs/benchmarks.md, "Vulkan decode at 64 rows: layouts by
shape"); `dec_r64_list.py narrow` narrow.txt, the layout taken for the short ones (the same
section). `dec_r64_list.py sets` writes the list sets.txt: matmul_cm.comp with 2 or 3 register
sets of loads in flight in its one-slice loop (SETS) at 64 rows. `dec_r64_list.py variants`
prints the matmul_dec modules (KA D L S) for dec_r64.sh. Entries whose shared memory would pass
47 KiB are left out (dec_list.py says why)."""
import math
import sys

from dec_list import old, plan, smem

# matmul_cm layouts at 64 rows: (WG, SGM, FM, FN, BK)
MCM64 = [(256, 1, 4, 1, 32), (256, 2, 2, 2, 64), (256, 2, 2, 2, 32), (256, 1, 4, 2, 32), (256, 2, 2, 4, 32),
         (512, 2, 2, 2, 32), (512, 2, 2, 1, 32), (512, 2, 2, 1, 64)]
# matmul_dec at 32 rows: (DEPTH, KA, (PFD, PFL, PFS), slice factor)
DEC32 = [(2, 64, (2, 2, 32), 1), (2, 64, (0, 2, 32), 1), (2, 64, (3, 2, 32), 1),
         (1, 64, (0, 2, 32), 1), (2, 64, (2, 2, 32), 2), (2, 64, (2, 2, 64), 1)]


def mcm_smem(split, wg, sgm, fm, fn, bk):
    bm, bn = 16 * fm * sgm, 16 * fn * (wg // 32 // sgm)
    return (split * bm + bn) * (bk // 8 + 1) * 16 + (wg // 32) * 16 * 20 * 4


def mcm_slices(m, n, k, wg, sgm, fm, fn, bk):
    tiles = math.ceil(n / (16 * fn * (wg // 32 // sgm))) * math.ceil(m / (16 * fm * sgm))
    s = max(1, min(132 // tiles, k // 256))
    ks = math.ceil(math.ceil(k / s) / bk) * bk
    return math.ceil(k / ks)


# matmul_cm with SETS register sets in its one-slice loop (module mcm_sS, shaders/matmul_cm.comp
# -DSETS_DEFAULT=S: the harness passes constants 0-8 only) at 64 rows: (WG, SGM, FM, FN, BK, SETS,
# slice factor)
SETS64 = [(256, 1, 4, 1, 64, 1, 1), (512, 2, 2, 1, 64, 2, 1), (512, 2, 2, 1, 64, 3, 1),
          (512, 2, 2, 1, 64, 2, 2), (256, 2, 2, 2, 64, 2, 1), (256, 2, 2, 2, 64, 3, 1),
          (256, 1, 4, 1, 64, 2, 1), (512, 2, 2, 2, 64, 2, 1), (512, 2, 2, 1, 32, 3, 1)]


def sets_list():
    """`dec_r64_list.py sets`: the SETS64 entries between the plan's (mcm, the plugin's module
    before SETS) for both 64-row shapes and modes; shared memory without the epilogue matrices
    where SETS > 1"""
    for n, k in ((14336, 4096), (4096, 14336)):
        for split in (1, 2):
            base = old(64, n, k, split)
            print(base)
            for wg, sgm, fm, fn, bk, sets, f in SETS64:
                sm = mcm_smem(split, wg, sgm, fm, fn, bk) - (0 if sets == 1 else wg // 32 * 16 * 80)
                if sm > 47 * 1024:
                    continue
                s = mcm_slices(64, n, k, wg, sgm, fm, fn, bk)
                print(f"mcm_s{sets} gemm 64 {n} {k} {wg} {sgm} {fm} {fn} {split} {bk} 1 "
                      f"{min(f * s, k // 256)} 1")
            print(base)


# 64-row products of the step, fast mode: the 2b shape's in_proj (2048 -> 2 x 4096 + 2 x 128 +
# 64), out_proj, MLP up and down, attention output; the 9B shape's MLP up and down and out_proj
SHAPES = [(8512, 2048), (2048, 4096), (8192, 2048), (2048, 8192), (2048, 2048),
          (14336, 4096), (4096, 14336), (4096, 8192)]
# matmul_cm layouts for them: (WG, SGM, FN, SETS, wave workgroups, RAW); BK 64, FM 2 (SGM 2)
LAYOUTS = [(512, 2, 2, 2, 132, 1), (512, 2, 2, 2, 66, 1), (512, 2, 2, 2, 132, 2),
           (256, 2, 2, 2, 132, 1), (256, 2, 2, 2, 264, 1), (256, 2, 2, 2, 264, 2),
           (256, 2, 2, 3, 264, 1), (256, 2, 2, 2, 528, 1),
           (256, 2, 1, 2, 264, 1), (256, 2, 1, 2, 528, 1),
           (128, 2, 2, 2, 264, 1), (128, 2, 2, 2, 528, 1), (128, 2, 2, 2, 528, 2),
           (128, 2, 2, 3, 528, 1), (512, 2, 1, 2, 264, 1), (256, 2, 2, 1, 264, 1)]


def wave_slices(n, k, bm, bn, bk, wave):
    """vk_cm_plan_wave's slices at `wave` workgroups"""
    tiles = math.ceil(n / bn) * math.ceil(64 / bm)
    s = max(1, min(wave // tiles, k // 256))
    ks = math.ceil(math.ceil(k / s) / bk) * bk
    return math.ceil(k / ks)


def shapes_list():
    """`dec_r64_list.py shapes`: LAYOUTS on SHAPES at 64 rows fast (run with VKCM_ROTATE=1, so
    that the products under 50 MB stream their weights from memory), between the plugin's
    default (512,2,2,64,2 at 132 workgroups)"""
    for n, k in SHAPES:
        base = f"mcm_s2 gemm 64 {n} {k} 512 2 2 2 1 64 1 {wave_slices(n, k, 64, 256, 64, 132)} 1"
        print(base)
        for wg, sgm, fn, sets, wave, raw in LAYOUTS:
            bn = 16 * fn * (wg // 32 // sgm)
            s = wave_slices(n, k, 64, bn, 64, wave)
            print(f"mcm_s{sets} gemm 64 {n} {k} {wg} {sgm} 2 {fn} 1 64 1 {s} {raw}")
        print(base)


def narrow_list():
    """`dec_r64_list.py narrow`: the narrow layout (vk_cm_plan_narrow: 256,2,1,64 at round(264 /
    tiles) slices) with 2 and 3 register sets and at half and twice its slices, on the 9B
    shape's attention products (q 4096 -> 4096, k and v 4096 -> 1024) and three 2b products,
    between the plugin's default (VKCM_ROTATE=1)"""
    for n, k in ((4096, 4096), (1024, 4096), (8512, 2048), (2048, 4096), (8192, 2048)):
        base = f"mcm_s2 gemm 64 {n} {k} 512 2 2 2 1 64 1 {wave_slices(n, k, 64, 256, 64, 132)} 1"
        print(base)
        for wg, fn, sets, wave in ((256, 1, 2, 264), (256, 1, 3, 264), (256, 1, 2, 132),
                                   (256, 1, 2, 528)):
            bn = 16 * fn * (wg // 64)
            t = math.ceil(n / bn)
            s = wave_slices(n, k, 64, bn, 64, (wave + t // 2) // t * t)
            print(f"mcm_s{sets} gemm 64 {n} {k} {wg} 2 2 {fn} 1 64 1 {s} 1")
        print(base)


def main():
    if sys.argv[1:] == ["narrow"]:
        narrow_list()
        return
    if sys.argv[1:] == ["sets"]:
        sets_list()
        return
    if sys.argv[1:] == ["shapes"]:
        shapes_list()
        return
    if sys.argv[1:] == ["variants"]:
        for v in sorted({(ka,) + pf for _, ka, pf, _ in DEC32}):
            print(*v)
        return
    for n, k in ((14336, 4096), (4096, 14336)):
        for split in (1, 2):
            base = old(64, n, k, split)
            print(base)
            for wg, sgm, fm, fn, bk in MCM64:
                if mcm_smem(split, wg, sgm, fm, fn, bk) > 47 * 1024:
                    continue
                s = mcm_slices(64, n, k, wg, sgm, fm, fn, bk)
                for f in (1, 2):
                    print(f"mcm gemm 64 {n} {k} {wg} {sgm} {fm} {fn} {split} {bk} 1 "
                          f"{min(f * s, k // 256)} 1")
            print(base)
    for split in (1, 2):  # 48 rows: the old plan (FM 3), SGM 2 (tiles of 64 rows), matmul_dec
        base = old(48, 14336, 4096, split)
        print(base)
        print(f"mcm gemm 48 14336 4096 256 2 2 2 {split} 64 1 1 1")
        s, _, _ = plan(14336, 4096, 256, 1, 64, 64, 264)
        print(f"dec_ka64_d2l2s32 gemm 48 14336 4096 256 1 3 1 {split} 64 2 {s} 1")
        print(base)
    for n, k in ((14336, 4096), (4096, 14336)):
        for split in (1, 2):
            base = old(32, n, k, split)
            print(base)
            if split == 2:
                print(f"mcm gemm 32 {n} {k} 256 2 1 2 2 64 1 {mcm_slices(32, n, k, 256, 2, 1, 2, 64)} 1")
            for depth, ka, pf, f in DEC32:
                s, _, _ = plan(n, k, 256, 1, 64, ka, 264)
                s = min(s * f, k // 256)
                print(f"dec_ka{ka}_d{pf[0]}l{pf[1]}s{pf[2]} gemm 32 {n} {k} 256 1 2 1 {split} 64 "
                      f"{depth} {s} 1")
            print(base)


if __name__ == "__main__":
    main()
