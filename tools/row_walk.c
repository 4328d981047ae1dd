/* tools/row_walk: what address translation costs a decode step that touches
 * one entry in each of many page-table rows (issue 10, docs/benchmarks.md,
 * helper book12's section). Stand-alone; not built by CMake:
 *
 *   cc -O2 -o /tmp/row_walk tools/row_walk.c
 *   /tmp/row_walk STRIDE ROWS HUGE     e.g. 262208 4000 1
 *
 * ROWS lines, one per row of STRIDE bytes (a row of 64K int32 entries plus
 * a line is 262208 bytes), each pointing at the next in a random cycle;
 * the region is advised MADV_HUGEPAGE (HUGE 1) or MADV_NOHUGEPAGE (0).
 * Prints the best of 27 passes of dependent loads over the cycle in ns a
 * load (thread CPU time) and the region's AnonHugePages. The lines
 * themselves (ROWS x 64 bytes) stay in the L2 for a few thousand rows, so
 * what grows with the span and the row count is the TLB miss and its page
 * walk. Linux only (madvise, /proc/self/smaps_rollup). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static long anon_huge_kb(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "AnonHugePages:", 14))
            kb = atol(line + 14);
    if (f)
        fclose(f);
    return kb;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: row_walk STRIDE ROWS HUGE(0|1)\n");
        return 2;
    }
    size_t stride = strtoull(argv[1], NULL, 0), huge = (size_t)2 << 20;
    long rows = atol(argv[2]);
    if (stride < sizeof(void *) || rows < 2 || rows > (1L << 24)) {
        fprintf(stderr, "row_walk: STRIDE >= %zu, 2 <= ROWS <= 2^24\n", sizeof(void *));
        return 2;
    }
    size_t bytes = (stride * (size_t)rows + huge - 1) / huge * huge;
    char *p = aligned_alloc(huge, bytes);
    long *order = malloc((size_t)rows * sizeof *order);
    if (!p || !order) {
        fprintf(stderr, "row_walk: out of memory\n");
        return 1;
    }
    madvise(p, bytes, atoi(argv[3]) ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    memset(p, 0, bytes);
    uint64_t s = 1;
    for (long i = 0; i < rows; i++)
        order[i] = i;
    for (long i = rows - 1; i > 0; i--) { /* Fisher-Yates, LCG */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        long j = (long)((s >> 33) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (long i = 0; i < rows; i++)
        *(char **)(void *)(p + (size_t)order[i] * stride) =
            p + (size_t)order[(i + 1) % rows] * stride;
    char *c = p + (size_t)order[0] * stride;
    double best = 1e300;
    for (int pass = 0; pass < 30; pass++) {
        double t0 = now_ns();
        for (long i = 0; i < rows; i++)
            c = *(char **)(void *)c;
        double t = now_ns() - t0;
        if (pass >= 3 && t < best)
            best = t;
    }
    printf("stride %zu rows %ld huge %s: %.1f ns a load (AnonHugePages %ld kB)%s\n", stride, rows,
           argv[3], best / (double)rows, anon_huge_kb(), c ? "" : " ");
    free(order);
    free(p);
    return 0;
}
