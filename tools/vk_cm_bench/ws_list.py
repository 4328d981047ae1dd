#!/usr/bin/env python3
"""Writes the list of dec_ws.comp (the warp-specialized decode GEMM: docs/benchmarks.md, "A
warp-specialized decode GEMM") against matmul_cm.comp's decode plans and matmul_dec.comp's best
plans and -DWG_SYNC=1 entries (dec_build.sh builds every module into OUT/dec). For each 117 MB
shape, rows 16 and 64: the old plans first and last, the variants between. Fields as
dec_list.py's: NAME gemm M N K WG SGM FM FN SPLIT BK STAGES SLICES RAW; for dec_ws the module
ws_kaKA_npNP carries the chunk KA and the producer subgroups NP (STAGES is its DEPTH), sep_kaKA_npNP
the same with -DSEP=1 (a loop for each role). Entries
whose shared memory would pass 47 KiB, or whose consumers do not divide the tile, are left
out. `ws_list.py flags`: the -DFLAGS=1 entries (dec_build.sh's fl.txt)."""
import math

from dec_list import old  # matmul_cm.comp's plan

# dec_ws blocking by rows: (WG, FN, BK, DEPTH, NP, KA)
WS = {
    16: [(256, 1, 64, 2, 4, 256), (256, 1, 64, 3, 4, 256), (256, 1, 32, 4, 4, 512),
         (256, 1, 32, 3, 4, 256), (128, 1, 64, 2, 2, 512), (128, 1, 64, 3, 2, 512),
         (256, 1, 64, 2, 6, 256), (256, 1, 64, 3, 6, 128), (512, 1, 32, 3, 8, 128),
         (256, 1, 64, 2, 4, 128)],
    64: [(256, 1, 64, 2, 4, 64), (256, 1, 32, 4, 4, 128), (256, 1, 32, 3, 4, 128),
         (128, 1, 64, 2, 2, 128), (128, 1, 32, 4, 2, 256), (128, 1, 64, 3, 2, 128)],
}


def smem(split, bm, wg, fn, bk, ka):
    bn = 16 * fn * wg // 32
    return split * bm * (ka // 8 + 1) * 16 + 2 * bn * (bk // 8 + 1) * 16


def dec(m, n, k, split, ka, groups, wgs=False):
    """matmul_dec.comp's plan at WG 256, FN 1, BK 64, depth 2 (vk_dec_plan_make); None where
    its shared memory would pass 47 KiB (one such entry lost the device on the H200)"""
    fm = math.ceil(m / 16)
    if split * 16 * fm * (ka // 8 + 1) * 16 + 8 * 16 * 9 * 16 > 47 * 1024:
        return None
    tiles = math.ceil(n / 128)
    s = max(1, min((groups + tiles // 2) // tiles, k // 256))
    ks = math.ceil(math.ceil(k / s) / 64) * 64
    s = math.ceil(k / ks)
    name = f"dec_ka{ka}_a{1 if ks > ka else 0}" + ("_wgs" if wgs else "")
    return f"{name} gemm {m} {n} {k} 256 1 {fm} 1 {split} 64 2 {s} 1"


# -DFLAGS=1 (fl_kaKA_npNP_sS: one chunk a slice, so k_split <= KA): (WG, BK, DEPTH, NP, KA, NSTAGE)
FLAGS = [(256, 32, 2, 4, 512, 3), (256, 32, 3, 4, 512, 3), (256, 32, 4, 4, 512, 3),
         (256, 32, 3, 6, 512, 3), (128, 32, 2, 2, 512, 4), (128, 32, 3, 2, 512, 4),
         (128, 32, 4, 2, 512, 4), (128, 64, 2, 2, 512, 3), (128, 64, 3, 2, 512, 3),
         (256, 64, 2, 4, 256, 2), (256, 64, 2, 6, 256, 2)]


def flags():
    """the fl entries at 16 rows, fast, between the old plans and dec_ws's best -DSEP=1"""
    for n, k in ((14336, 4096), (4096, 14336)):
        print(old(16, n, k, 1))
        print(dec(16, n, k, 1, 512, 1056))
        print(f"sep_ka256_np6 gemm 16 {n} {k} 256 1 1 1 1 64 2 {2 if n > k else 8} 1")
        for wg, bk, depth, np_, ka, st in FLAGS:
            print(f"fl_ka{ka}_np{np_}_s{st} gemm 16 {n} {k} {wg} 1 1 1 1 {bk} {depth} {k // ka} 1")
        print(old(16, n, k, 1))


def main():
    import sys
    if sys.argv[1:] == ["flags"]:
        flags()
        return
    for n, k in ((14336, 4096), (4096, 14336)):
        print(f"dec_probe gemm 16 {n} {k} 256 1 1 1 1 64 3 {max(1, 264 // math.ceil(n / 128))} 1")
    for split in (1, 2):
        for n, k in ((14336, 4096), (4096, 14336)):
            for m in (16, 64):
                print(old(m, n, k, split))
                ka = 512 if m == 16 else 64
                for wgs in (False, True) if split == 1 else (False,):
                    g = 1056 if m == 16 else 264
                    d = dec(m, n, k, split, ka, g, wgs) or dec(m, n, k, split, ka // 2, g, wgs)
                    if d:
                        print(d)
                fm = math.ceil(m / 16)
                for wg, fn, bk, depth, np_, ka in WS[m]:
                    nsg = wg // 32
                    nc = nsg - np_
                    if (fn * nsg) % nc or smem(split, 16 * fm, wg, fn, bk, ka) > 47 * 1024:
                        continue
                    if split == 2 and (wg, bk, depth) not in ((256, 64, 2), (256, 32, 4), (128, 64, 2)):
                        continue
                    bn = 16 * fn * nsg
                    tiles = math.ceil(n / bn)
                    for groups in ((264, 528, 1056) if split == 1 else (528,)):
                        s = max(1, min(round(groups / tiles), k // 256))
                        for mod in ("ws", "sep"):
                            print(f"{mod}_ka{ka}_np{np_} gemm {m} {n} {k} {wg} 1 {fm} {fn} {split} "
                                  f"{bk} {depth} {s} 1")
                print(old(m, n, k, split))


main()
