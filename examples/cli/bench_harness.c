/* llmem bench: the harness every figure shares (timing, random inputs,
 * buffers, index tables, report lines). See bench.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/bench.h"
#include "examples/cli/common.h"

uint64_t bench_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float bench_rng_float(uint64_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(bench_rng_next(s) >> 11) * 0x1p-53);
}

/* Random permutation of [0, n). */
void bench_shuffle(int32_t *v, int32_t n, uint64_t seed)
{
    for (int32_t i = 0; i < n; i++)
        v[i] = i;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)(bench_rng_next(&seed) % (uint64_t)(i + 1));
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

llmem_status bench_time_it(bench *b, const char *label, bench_fn fn, void *ctx, double *sec)
{
    /* results go to stdout line by line even when it is a pipe */
    fflush(stdout);
    double w0 = cli_now();
    CHECK(fn(ctx));
    CHECK(llmem_backend_synchronize(b->be));
    int per = b->iters / 5 > 0 ? b->iters / 5 : 1;
    double eta = (cli_now() - w0) * 5 * per;
    if (eta > 1.0) {
        fprintf(stderr, "llmem bench: measuring %s: %d calls, about %.0f s\n", label, 5 * per,
                eta);
        fflush(stderr);
    }
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = cli_now();
        for (int i = 0; i < per; i++)
            CHECK(fn(ctx));
        CHECK(llmem_backend_synchronize(b->be));
        t[r] = (cli_now() - t0) / per;
    }
    for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    *sec = t[2];
    return LLMEM_OK;
}

/* Fills n elements of dtype t at byte `offset` of buf with the random
 * source (small: values in [-0.02, 0.02)). */
llmem_status bench_fill(bench *b, llmem_buffer *buf, size_t offset, int64_t n, llmem_dtype t,
                        bool small)
{
    size_t es = llmem_dtype_size(t);
    for (int64_t i = 0; i < n; i += RND_N) {
        int32_t m = (int32_t)(n - i < RND_N ? n - i : RND_N);
        llmem_tensor src = llmem_tensor_1d(small ? b->rnd_small : b->rnd, 0, LLMEM_DTYPE_F32, m);
        llmem_tensor dst = llmem_tensor_1d(buf, offset + (size_t)i * es, t, m);
        CHECK(llmem_op_copy(b->be, &src, 0, &dst));
    }
    return LLMEM_OK;
}

llmem_status bench_new_buffer(bench *b, size_t bytes, llmem_buffer **out)
{
    llmem_status st = llmem_buffer_alloc(b->be, bytes, out);
    if (st != LLMEM_OK)
        fprintf(stderr, "llmem bench: cannot allocate %.1f MiB: %s\n", (double)bytes / MIB,
                llmem_status_str(st));
    return st;
}

llmem_status bench_new_filled(bench *b, size_t bytes, int64_t n, llmem_dtype t, bool small,
                              llmem_buffer **out)
{
    llmem_status st = bench_new_buffer(b, bytes, out);
    return st == LLMEM_OK ? bench_fill(b, *out, 0, n, t, small) : st;
}

llmem_i32_table bench_tab_add(tables *t, const int32_t *vals, int32_t n)
{
    llmem_i32_table r = {NULL, (size_t)t->n * 4, n};
    if (t->n + n > t->cap) {
        int32_t cap = (t->n + n) * 2;
        int32_t *v = realloc(t->v, (size_t)cap * sizeof *v);
        if (!v)
            return (llmem_i32_table){NULL, 0, -1};
        t->v = v;
        t->cap = cap;
    }
    if (n > 0)
        memcpy(t->v + t->n, vals, (size_t)n * sizeof *vals);
    t->n += n;
    return r;
}

/* Uploads the tables to a new idx buffer and points their host copies at
 * t->v (which the caller keeps until the view is done). */
llmem_status bench_tab_finish(bench *b, tables *t, llmem_i32_table **list, int n,
                               llmem_buffer **idx)
{
    for (int i = 0; i < n; i++)
        if (list[i]->n < 0)
            return LLMEM_E_NO_MEMORY;
    CHECK(bench_new_buffer(b, (size_t)(t->n > 0 ? t->n : 1) * 4, idx));
    if (t->n > 0)
        CHECK(llmem_buffer_upload(*idx, 0, t->v, (size_t)t->n * 4));
    for (int i = 0; i < n; i++)
        list[i]->host = list[i]->n > 0 ? t->v + list[i]->offset / 4 : NULL;
    return LLMEM_OK;
}

llmem_status bench_rs_view(bench *b, llmem_view *view, llmem_rs_view *rs,
                           const llmem_state_desc *desc, llmem_buffer **bufs, int32_t B,
                           int32_t n_tok, const int32_t *src, const int32_t *dst, tables *t,
                           llmem_buffer **idx)
{
    memset(rs, 0, sizeof *rs);
    rs->n_states = 1;
    rs->desc = desc;
    rs->state = bufs;
    rs->n_slots = B;
    rs->n_seqs = B;
    rs->n_seq_tokens = n_tok;
    rs->src_slot = bench_tab_add(t, src, B);
    rs->dst_slot = bench_tab_add(t, dst, B);
    rs->ckpt_slot = bench_tab_add(t, NULL, 0);
    llmem_i32_table *list[] = {&rs->src_slot, &rs->dst_slot, &rs->ckpt_slot};
    llmem_status st = bench_tab_finish(b, t, list, 3, idx);
    *view = llmem_view_make(LLMEM_VIEW_RECURRENT, rs, sizeof *rs, *idx);
    return st;
}

void bench_report_bw(const bench *b, const char *what, double t, double bytes, const char *note)
{
    double bw = bytes / t;
    printf("%-28s %9.3f ms  %8.1f GB/s  %5.1f%% of copy", what, t * 1e3, bw / 1e9,
           100.0 * bw / b->copy_bw);
    if (b->ref_copy_bw > 0.0)
        printf(", %5.1f%% of cuda copy", 100.0 * bw / b->ref_copy_bw);
    printf("%s%s\n", note ? "  " : "", note ? note : "");
}
