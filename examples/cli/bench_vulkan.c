/* llmem bench: a second ceiling for non-CUDA GPU backends. The copy a
 * backend measures is its own ceiling; on an NVIDIA GPU the Vulkan figures
 * are also put against the CUDA copy on the same GPU (issue 12: "Vulkan
 * figures are reported against both the Vulkan copy and the CUDA copy
 * measured in the same machine"). */
#include <stdio.h>
#include <string.h>

#include "examples/cli/bench.h"

/* Measures the CUDA backend's 1 GiB device copy (as bench_copy does) when
 * the benchmarked backend is vulkan and a cuda device opens; sets
 * b->ref_copy_bw (0 when there is none). Never fails the run: a missing
 * CUDA is one line. */
void bench_ref_copy(bench *b, int32_t device)
{
    b->ref_copy_bw = 0.0;
    if (strcmp(b->name, "vulkan") != 0)
        return;
    bench r = {0};
    char err[256] = "";
    if (llmem_backend_open("cuda", device < 0 ? -1 : device, &r.be, err, sizeof err) != LLMEM_OK) {
        printf("%-28s (none: %s)\n", "copy on cuda", err);
        return;
    }
    r.name = "cuda";
    r.iters = b->iters;
    bench_copy_ctx c = {NULL, NULL, 1024 * MIB};
    double t = 0.0;
    llmem_status st = llmem_buffer_alloc(r.be, c.bytes, &c.src);
    if (st == LLMEM_OK)
        st = llmem_buffer_alloc(r.be, c.bytes, &c.dst);
    if (st == LLMEM_OK)
        st = llmem_buffer_fill(c.src, 0, c.bytes, 0x3f800000u);
    if (st == LLMEM_OK)
        st = bench_time_it(&r, "copy on cuda", bench_copy_run, &c, &t);
    if (st == LLMEM_OK) {
        b->ref_copy_bw = 2.0 * (double)c.bytes / t;
        printf("%-28s %9.3f ms  %8.1f GB/s  (same GPU; the second ceiling below)\n",
               "copy on cuda", t * 1e3, b->ref_copy_bw / 1e9);
    } else {
        printf("%-28s (failed: %s)\n", "copy on cuda", llmem_status_str(st));
    }
    llmem_buffer_free(c.src);
    llmem_buffer_free(c.dst);
    llmem_backend_close(r.be);
}
