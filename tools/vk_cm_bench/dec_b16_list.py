#!/usr/bin/env python3
"""Writes dec_b16.sh's list (vk_cm_bench entries, README.md): the 16-row decode GEMM on the
117 MB shapes (16 x 14336 x 4096, 16 x 4096 x 14336), fast (SPLIT 1) and precise (SPLIT 2)
(docs/benchmarks.md, "Vulkan decode at 16 rows: GEMM layouts and the scan"), each shape and
mode between two entries of the plugin's 16-row default (matmul_dec.comp at vk_dec_cfg_default
with its L2 touches: d2l2s32 fast, d2l2s64 precise, KA 512 halved to fit) and one of
matmul_cm.comp's old plan (mcm):
- matmul_cm.comp at vk_cm_plan_mid-style layouts at 16 rows (SGM 1: 16-row subgroup tiles;
  WG 256 / 512, FN 1 / 2, BK 64 / 32) with SETS 1-3 register sets of loads in flight (module
  mcm_sS), at vk_cm_plan_wave's slices for 132 workgroups and twice them;
- matmul_dec.comp at other chunks (KA 64 / 128 / 256), depths (1-3), workgroups (128) and
  touch settings (modules dec_kaKA_dDlLsS), at vk_dec_plan_make's slices for 264 workgroups
  and twice them.
`dec_b16_list.py refine` writes the second list (refine.txt): around the first list's best
(matmul_dec at chunks of 128 fast, 64 precise: other touches, depths and slice counts;
matmul_cm SETS 2 / 3 at 1-4x vk_cm_plan_wave's slices) between the old and the new default,
and matmul_dec at 32 rows fast (chunks of 64 and 128) against the old plan.
`dec_b16_list.py variants` prints the matmul_dec modules (KA D L S) for dec_b16.sh. Entries
whose shared memory would pass 47 KiB are left out (dec_list.py says why)."""
import math
import sys

from dec_list import old, plan, smem
from dec_r64_list import mcm_smem, mcm_slices

# matmul_cm at 16 rows: (WG, FN, BK, SETS, slice factor)
MCM16 = [(256, 1, 64, 1, 1), (256, 1, 64, 2, 1), (256, 1, 64, 3, 1), (512, 1, 64, 2, 1),
         (512, 1, 64, 3, 1), (512, 1, 64, 2, 2), (256, 2, 64, 2, 1), (256, 2, 64, 3, 1),
         (512, 2, 64, 2, 1), (512, 1, 32, 3, 1), (256, 1, 64, 2, 2), (512, 1, 64, 1, 2)]
# matmul_dec at 16 rows: (WG, DEPTH, KA, (PFD, PFL, PFS), slice factor); PFS 0: the mode's
DEC16 = [(256, 2, 256, (2, 2, 0), 1), (256, 2, 128, (2, 2, 0), 1), (256, 2, 64, (2, 2, 0), 1),
         (256, 3, 512, (2, 2, 0), 1), (256, 3, 128, (2, 2, 0), 1), (256, 3, 64, (2, 2, 0), 1),
         (256, 1, 64, (2, 2, 0), 1), (256, 2, 64, (3, 2, 0), 1), (256, 2, 64, (2, 2, 0), 2),
         (128, 2, 512, (2, 2, 0), 1), (128, 3, 512, (2, 2, 0), 1), (128, 2, 128, (2, 2, 0), 1),
         (256, 2, 512, (0, 2, 32), 1), (256, 3, 512, (3, 2, 0), 1)]


def seg(pf, split):
    return pf[2] if pf[2] else (32 if split == 1 else 64)


def dec(m, n, k, split, wg, depth, ka, pf, f):
    s, _, _ = plan(n, k, wg, 1, 64, ka, 264)
    s = min(s * f, k // 256)
    while ka > 64 and smem(split, 16, wg, 1, 64, ka) > 47 * 1024:
        ka //= 2
    if smem(split, 16, wg, 1, 64, ka) > 47 * 1024:
        return None
    return (f"dec_ka{ka}_d{pf[0]}l{pf[1]}s{seg(pf, split)} gemm {m} {n} {k} {wg} 1 1 1 {split} 64 "
            f"{depth} {s} 1")


# refine: matmul_dec (WG, DEPTH, KA, PF, groups) and matmul_cm (WG, FN, SETS, slice factor)
REF_DEC = {1: [(256, 2, 128, (3, 2, 32), 264), (256, 2, 128, (2, 2, 64), 264),
               (256, 1, 128, (2, 2, 32), 264), (256, 2, 128, (2, 2, 32), 396),
               (256, 2, 128, (2, 2, 32), 198), (256, 2, 128, (0, 2, 32), 264),
               (256, 2, 64, (2, 2, 32), 264)],
           2: [(256, 2, 64, (2, 2, 32), 264), (256, 2, 64, (3, 2, 64), 264),
               (256, 2, 64, (2, 2, 64), 396), (256, 2, 64, (2, 2, 64), 198),
               (256, 1, 64, (2, 2, 32), 264), (256, 2, 64, (0, 2, 64), 264)]}
REF_MCM = [(256, 1, 2, 2), (256, 1, 2, 3), (256, 1, 2, 4), (256, 1, 3, 2), (512, 1, 2, 2)]
NEW_KA = {1: 128, 2: 64}
OLD_KA = {1: 512, 2: 256}


def dec_g(m, n, k, split, wg, depth, ka, pf, groups):
    s, _, _ = plan(n, k, wg, 1, 64, ka, groups)
    fm = (m + 15) // 16
    return (f"dec_ka{ka}_d{pf[0]}l{pf[1]}s{pf[2]} gemm {m} {n} {k} {wg} 1 {fm} 1 {split} 64 "
            f"{depth} {s} 1")


def refine():
    for n, k in ((14336, 4096), (4096, 14336)):
        for split in (1, 2):
            sg = 32 if split == 1 else 64
            olde = dec_g(16, n, k, split, 256, 2, OLD_KA[split], (2, 2, sg), 264)
            newe = dec_g(16, n, k, split, 256, 2, NEW_KA[split], (2, 2, sg), 264)
            print(olde)
            print(newe)
            for wg, depth, ka, pf, groups in REF_DEC[split]:
                print(dec_g(16, n, k, split, wg, depth, ka, pf, groups))
            for wg, fn, sets, f in REF_MCM:
                s = mcm_slices(16, n, k, wg, 1, 1, fn, 64)
                print(f"mcm_s{sets} gemm 16 {n} {k} {wg} 1 1 {fn} {split} 64 1 "
                      f"{min(f * s, k // 256)} 1")
            print(olde)
            print(newe)
        base = old(32, n, k, 1)  # 32 rows fast: the old plan against matmul_dec
        print(base)
        for ka in (64, 128):
            print(dec_g(32, n, k, 1, 256, 2, ka, (2, 2, 32), 264))
        print(base)


def variants():
    out = set()
    for split in (1, 2):
        for _, _, ka, pf, _ in REF_DEC[split]:
            out.add((ka,) + pf)
    for split in (1, 2):
        for wg, depth, ka, pf, f in DEC16 + [(256, 2, 512, (2, 2, 0), 1)]:
            e = dec(16, 14336, 4096, split, wg, depth, ka, pf, f)
            if e:
                name = e.split()[0]
                ka_, rest = name[6:].split("_")
                d, rest = rest[1:].split("l")
                l_, s_ = rest.split("s")
                out.add((int(ka_), int(d), int(l_), int(s_)))
    return sorted(out)


def main():
    if sys.argv[1:] == ["refine"]:
        refine()
        return
    if sys.argv[1:] == ["variants"]:
        for v in variants():
            print(*v)
        return
    for n, k in ((14336, 4096), (4096, 14336)):
        for split in (1, 2):
            base = dec(16, n, k, split, 256, 2, 512, (2, 2, 0), 1)
            print(base)
            print(old(16, n, k, split))
            for wg, fn, bk, sets, f in MCM16:
                sm = mcm_smem(split, wg, 1, 1, fn, bk) - (0 if sets == 1 else wg // 32 * 16 * 80)
                if sm > 47 * 1024:
                    continue
                s = mcm_slices(16, n, k, wg, 1, 1, fn, bk)
                print(f"mcm_s{sets} gemm 16 {n} {k} {wg} 1 1 {fn} {split} {bk} 1 "
                      f"{min(f * s, k // 256)} 1")
            for wg, depth, ka, pf, f in DEC16:
                e = dec(16, n, k, split, wg, depth, ka, pf, f)
                if e:
                    print(e)
            print(base)
            print(old(16, n, k, split))


if __name__ == "__main__":
    main()
