#!/usr/bin/env python3
"""Writes dec_rows.sh's list (vk_cm_bench entries, README.md): the 117 MB decode shapes at 64
and 16 rows, fast and precise, matmul_cm.comp's KHR module at the plugin's plan (mcm,
dec_list.py's old) first and last, between them matmul_dec.comp with its rows split into tiles
of 16 FM rows (FM 4: one tile; FM 2: two 32-row tiles; FM 1: four 16-row tiles; the tiles of one
column block are neighbours in the grid, so all but the first find its weights in L2), each with
and without the L2 prefetch (module dec_kaKA_dDlLsS: chunk KA, PFD D, PFL L, PFS S; d0 off), at
the plugin's slice count for 264 workgroups and at twice it. `dec_rows_list.py variants` prints
the modules (KA D L S) for dec_rows.sh. Entries whose shared memory would pass 47 KiB are left
out (dec_list.py says why). docs/benchmarks.md, "Vulkan decode GEMM at 64 rows: row tiles"
(the 16-row entries alone: awk '$3 == 16' list.txt > list16.txt)."""
import math
import sys

from dec_list import old, smem

PF = {"d0": (0, 2, 32), "d2": (2, 2, 32), "d3": (3, 2, 32), "d2s64": (2, 2, 64)}
# (rows M, split, FM, KA, prefetch, slice factor)
ENTRIES = {
    (64, 1): [(4, 128, "d0", 1), (4, 128, "d2", 1),
              (2, 128, "d0", 1), (2, 128, "d2", 1), (2, 128, "d3", 1), (2, 128, "d2s64", 1),
              (2, 128, "d2", 2), (2, 256, "d2", 1), (2, 256, "d0", 1),
              (1, 512, "d0", 1), (1, 512, "d2", 1), (1, 512, "d2", 2), (1, 256, "d2", 1)],
    (64, 2): [(4, 64, "d0", 1), (2, 128, "d0", 1), (2, 128, "d2", 1), (2, 128, "d2s64", 1),
              (2, 128, "d2", 2), (2, 256, "d2", 1), (1, 256, "d0", 1), (1, 256, "d2", 1),
              (1, 512, "d2", 1)],
    (16, 1): [(1, 512, "d2", 1), (1, 512, "d2s64", 1)],
    (16, 2): [(1, 256, "d0", 1), (1, 256, "d2", 1), (1, 256, "d3", 1), (1, 256, "d2s64", 1),
              (1, 128, "d2", 1), (1, 128, "d0", 1), (1, 512, "d2", 1), (1, 256, "d2", 2)],
}


def module(ka, pf):
    d, lag, seg = PF[pf]
    return f"dec_ka{ka}_d{d}l{lag}s{seg}"


def slices(m, n, k, fm, factor):
    """vk_dec_plan_make's slice count for 264 workgroups over tiles_n x tiles_m tiles, times
    factor"""
    tiles = math.ceil(n / 128) * math.ceil(m / (16 * fm))
    s = max(1, min((264 + tiles // 2) // tiles, k // 256))
    return max(1, min(s * factor, k // 256))


def main():
    if sys.argv[1:] == ["variants"]:
        seen = set()
        for (_, split), rows in ENTRIES.items():
            for fm, ka, pf, _ in rows:
                if smem(split, 16 * fm, 256, 1, 64, ka) <= 47 * 1024 and (ka, pf) not in seen:
                    seen.add((ka, pf))
                    print(ka, *PF[pf])
        return
    for n, k in ((14336, 4096), (4096, 14336)):
        for (m, split), rows in ENTRIES.items():
            base = old(m, n, k, split)
            print(base)
            for fm, ka, pf, f in rows:
                if smem(split, 16 * fm, 256, 1, 64, ka) > 47 * 1024:
                    continue
                s = slices(m, n, k, fm, f)
                print(f"{module(ka, pf)} gemm {m} {n} {k} 256 1 {fm} 1 {split} 64 2 {s} 1")
            print(base)


if __name__ == "__main__":
    main()
