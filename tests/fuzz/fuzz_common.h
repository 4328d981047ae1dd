/* Helpers shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.c): small
 * memories on the CPU backend, snapshots for "a failed operation changes
 * nothing", and the invariant check. A violation prints a reason and
 * aborts, which libFuzzer reports as a crash with the input saved. */
#ifndef LLMEM_FUZZ_COMMON_H
#define LLMEM_FUZZ_COMMON_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"

static void fz_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

static llmem_backend *fz_backend(void)
{
    static llmem_backend *be;
    char err[256] = "";
    if (!be && llmem_backend_open("cpu", -1, &be, err, sizeof err) != LLMEM_OK)
        fz_die("cannot open the cpu backend: %s", err);
    return be;
}

static llmem_memory *fz_kv(int32_t ps, int32_t n_pages, int32_t n_seq, int32_t n_layers)
{
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_layers = n_layers;
    p.n_kv_heads = 1;
    p.head_dim = 2;
    p.dtype = LLMEM_DTYPE_F32;
    p.page_size = ps;
    p.n_pages = n_pages;
    p.n_seq_max = n_seq;
    llmem_memory *m = NULL;
    char err[256] = "";
    if (llmem_kv_cache_create(fz_backend(), &p, &m, err, sizeof err) != LLMEM_OK)
        fz_die("kv_cache_create: %s", err);
    return m;
}

static llmem_memory *fz_rs(int32_t n_seq, int32_t n_ckpt, int32_t n_layers)
{
    static const llmem_state_desc d[2] = {
        {.name = "conv", .n_dims = 2, .shape = {2, 3}, .dtype = LLMEM_DTYPE_F32},
        {.name = "ssm", .n_dims = 1, .shape = {4}, .dtype = LLMEM_DTYPE_F16}};
    const llmem_state_desc *states[4] = {d, d, d, d};
    const int32_t n_states[4] = {2, 2, 2, 2};
    llmem_recurrent_params p = {.n_layers = n_layers, .n_states = n_states, .states = states,
                                .n_seq_max = n_seq, .n_ckpt = n_ckpt};
    llmem_memory *m = NULL;
    char err[256] = "";
    if (llmem_recurrent_create(fz_backend(), &p, &m, err, sizeof err) != LLMEM_OK)
        fz_die("recurrent_create: %s", err);
    return m;
}

/* A hybrid of two children; layer 0 and 2 go to child 0, layer 1 to child 1. */
static llmem_memory *fz_hybrid(llmem_memory *a, int32_t a_layers, llmem_memory *b)
{
    llmem_memory *kids[2] = {a, b}, *m = NULL;
    int32_t map[3] = {0, 1, 0};
    char err[256] = "";
    if (llmem_hybrid_create(kids, 2, map, a_layers + 1, &m, err, sizeof err) != LLMEM_OK)
        fz_die("hybrid_create: %s", err);
    return m;
}

static void fz_check(llmem_memory *m, const char *where)
{
    char err[256] = "";
    if (llmem_memory_check(m, err, sizeof err) != LLMEM_OK)
        fz_die("after %s: llmem_memory_check: %s", where, err);
}

/* What a memory holds, as far as the API shows it (no plan in flight). */
typedef struct fz_snap {
    uint8_t *state;
    size_t n;
    llmem_memory_stats st;
} fz_snap;

static void fz_snapshot(llmem_memory *m, fz_snap *s)
{
    size_t got = 0;
    if (llmem_memory_state_size(m, -1, &s->n) != LLMEM_OK)
        fz_die("state_size failed");
    s->state = malloc(s->n ? s->n : 1);
    if (!s->state || llmem_memory_state_write(m, -1, s->state, s->n, &got) != LLMEM_OK ||
        got != s->n)
        fz_die("state_write failed");
    llmem_memory_get_stats(m, &s->st);
}

static void fz_same(const fz_snap *a, const fz_snap *b, const char *where)
{
    const llmem_memory_stats *x = &a->st, *y = &b->st;
    if (a->n != b->n || memcmp(a->state, b->state, a->n) != 0)
        fz_die("%s changed what the memory holds", where);
    if (x->pages_used != y->pages_used || x->pages_free != y->pages_free ||
        x->pages_cached != y->pages_cached || x->slots_used != y->slots_used ||
        x->n_seqs_live != y->n_seqs_live || x->cow_copies != y->cow_copies ||
        x->prefix_evictions != y->prefix_evictions || x->prefix_hit_tokens != y->prefix_hit_tokens)
        fz_die("%s changed the stats: pages used %lld -> %lld, free %lld -> %lld, cached %lld -> "
               "%lld, slots %lld -> %lld, copies %lld -> %lld",
               where, (long long)x->pages_used, (long long)y->pages_used,
               (long long)x->pages_free, (long long)y->pages_free, (long long)x->pages_cached,
               (long long)y->pages_cached, (long long)x->slots_used, (long long)y->slots_used,
               (long long)x->cow_copies, (long long)y->cow_copies);
}

static void fz_snap_free(fz_snap *s)
{
    free(s->state);
    s->state = NULL;
}

/* Plans the batch and commits its first n_commit ubatches (all when
 * negative); with apply_next, the next ubatch is applied and never
 * committed. Returns the plan status. */
static llmem_status fz_run(llmem_memory *m, const llmem_batch *b, llmem_split split,
                           int32_t n_ubatch, int32_t n_commit, int apply_next)
{
    llmem_plan *p = NULL;
    llmem_status st = llmem_memory_plan(m, b, split, n_ubatch, &p, NULL, 0);
    if (st != LLMEM_OK) {
        if (p)
            fz_die("a failed plan returned a plan");
        return st;
    }
    int32_t n = llmem_plan_n_ubatch(p);
    if (n_commit < 0 || n_commit > n)
        n_commit = n;
    for (int32_t u = 0; u < n_commit; u++) {
        llmem_view v;
        if (llmem_memory_apply(m, p, u, NULL) != LLMEM_OK)
            fz_die("apply %d failed", u);
        for (int32_t il = 0; il < llmem_memory_n_layers(m); il++)
            if (llmem_memory_view(m, il, &v) != LLMEM_OK)
                fz_die("view %d failed", il);
        if (llmem_memory_commit(m, p, u) != LLMEM_OK)
            fz_die("commit %d failed", u);
    }
    if (apply_next && n_commit < n && llmem_memory_apply(m, p, n_commit, NULL) != LLMEM_OK)
        fz_die("apply %d failed", n_commit);
    llmem_memory_release(m, p);
    return LLMEM_OK;
}

#endif
