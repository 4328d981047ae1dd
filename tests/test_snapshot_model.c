// ctest-labels: core
/* Model-based randomized test of recurrent snapshots and the host tier
 * (issue 13 items 1, 3 and 8), beside test_memory_model.c (whose reference
 * runs with snapshots off).
 *
 * A hybrid (a KV cache and a recurrent memory of one 4-float state per
 * sequence, both poisoned) runs random requests: prompts of stem families,
 * continuations of finished conversations, resubmitted aborted prompts,
 * decode steps, conversations that end, plans aborted after some of their
 * ubatches, and clears, with few pages and snapshot slots and a small
 * shared host tier, so that pages and snapshots are evicted, spill and come
 * back. An emulated forward pass writes K = (token, position) for every
 * stored token and the state {length, sum of tokens, position-weighted sum,
 * 7} of exactly the tokens it has seen. The reference is brute force:
 *   - a twin hybrid without any prefix reuse (no prefix cache, no
 *     snapshots, no tier, a large pool) gets the same committed work; after
 *     every request and decode step the sequence's state stream (tokens,
 *     positions, every K/V slot, the current state) must be byte-identical
 *     in both: KV and state agree on every hit, whichever tier served it;
 *   - the first ubatch of a hit must read the state of exactly the hit
 *     tokens (checked by value in the forward pass; poison reads NaN);
 *   - a hit is never longer than the longest common prefix of the prompt
 *     with a committed history (live sequences and ended conversations): a
 *     failed or aborted step never publishes;
 *   - a plan that fails with LLMEM_E_NO_SPACE changes nothing visible;
 *   - llmem_memory_check passes after every step (host tier LRU, index,
 *     byte count, pins);
 *   - with every other host-tier block allocation refused (fault
 *     injection through the backend's alloc hook), all of the above still
 *     hold: a refused spill only loses that entry;
 *   - with a device prefix budget smaller than the pages and snapshot
 *     slots (prefix_cache_bytes), the bytes of cached pages plus snapshots
 *     (counted from pages_cached and snapshots) stay within it after every
 *     step, both kinds get evicted, and all of the above still hold.
 *   LLMEM_TEST_SEED=<n> base seed (default 13); LLMEM_TEST_ITERS (800).
 */
#include "support/run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/llmem.h"
#include "support/memtest.h"

#define NSEQ 3
#define MAXT 40
#define MAXH 1024 /* ended histories held at first; the array doubles as needed */

typedef struct cfg {
    const char *name;
    int32_t page_size, n_pages, n_ckpt, n_snap, interval;
    int64_t host_bytes; /* a page entry is 16 * page_size bytes, a snapshot 16 */
    bool refuse_host;   /* fault injection: every other host block is refused */
    int64_t budget;     /* prefix_cache_bytes of both children (0: none); a cached
                           page costs 16 * page_size bytes, a snapshot 16 */
    bool mid;           /* snap_in_ubatch: a prompt's snapshot written inside its ubatch */
} cfg;

static const cfg cfgs[] = {
    {"pages of 4, 2 snapshots every 4, tier of 6 pages", 4, 14, 1, 2, 4, 6 * 64, false, 0},
    {"pages of 1, 3 snapshots, tier of 12 pages", 1, 48, 0, 3, 0, 12 * 16, false, 0},
    {"pages of 4, 2 snapshots every 4, no tier", 4, 14, 1, 2, 4, 0, false, 0},
    {"pages of 4, 4 snapshots every 8, large tier", 4, 16, 0, 4, 8, 1 << 20, false, 0},
    {"pages of 4, 2 snapshots every 4, tier of 6 pages, host allocations fail", 4, 14, 1, 2, 4,
     6 * 64, true, 0},
    /* one device budget for pages and snapshots (prefix_budget.h): more
     * slots and pages than it holds, so the budget decides what stays */
    {"pages of 4, 8 snapshots every 4, budget of 5 pages + 3 snapshots, tier of 6 pages", 4, 24,
     1, 8, 4, 6 * 64, false, 5 * 64 + 3 * 16},
    {"pages of 1, 6 snapshots, budget of 10 pages + 2 snapshots, no tier", 1, 64, 0, 6, 0, 0,
     false, 10 * 16 + 2 * 16},
    /* snapshots inside ubatches (llmem_recurrent_params.snap_in_ubatch): a
     * prompt's last interval boundary is written by the forward pass
     * (llmem_rs_view.snap_slot) instead of ending a ubatch there */
    {"pages of 4, 2 snapshots every 4, tier of 6 pages, inside ubatches", 4, 14, 1, 2, 4, 6 * 64,
     false, 0, true},
    {"pages of 4, 4 snapshots every 8, large tier, inside ubatches", 4, 16, 0, 4, 8, 1 << 20,
     false, 0, true},
    {"pages of 4, 8 snapshots every 4, budget, tier, host allocations fail, inside ubatches", 4,
     24, 1, 8, 4, 6 * 64, true, 5 * 64 + 3 * 16, true},
};

/* Refuses every other allocation of at most 64 bytes (the host tier's
 * blocks here; device buffers are larger): spills are lost, nothing else. */
static bool refuse_half(size_t size, void *ctx)
{
    unsigned *n = ctx;
    return size > 64 || (++*n & 1) == 0;
}

/* What the forward pass knows of each sequence: its state so far. */
typedef struct fw {
    float len[NSEQ], sum[NSEQ], wsum[NSEQ];
    int64_t mids; /* snapshots written inside ubatches */
} fw;

typedef struct hist {
    int32_t n, tok[MAXT];
} hist;

typedef struct model {
    uint64_t rng;
    llmem_memory *h, *kv, *rs, *twin;
    llmem_batch_buf *b;
    fw x, xt; /* of h and of the twin */
    hist live[NSEQ];
    hist *ended; /* committed histories of finished conversations */
    int32_t n_ended, cap_ended;
    hist aborted[8];
    int32_t n_aborted;
    int64_t hits, host_hits, aborts, nospace;
} model;

static uint32_t rn(model *M, uint32_t n)
{
    return test_rand32(&M->rng) % n;
}

static void forward(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    fw *x = c;
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    const llmem_rs_view *r = llmem_view_rs(&v), *sn = llmem_rs_view_snap(&v);
    for (int32_t s = 0; s < r->n_seqs; s++) {
        int32_t q = ub->seq_id[s], T = r->n_seq_tokens;
        const int32_t *tok = ub->token + s * T;
        float f[4] = {0};
        /* a snapshot inside the ubatch: the state after token snap_tok[s] */
        if (sn && sn->snap_slot.host[s] >= 0) {
            int32_t upto = sn->snap_tok.host[s] + 1;
            ck_assert(upto >= 1 && upto < T);
            float g[4] = {x->len[q] + (float)upto, x->sum[q], x->wsum[q], 7.0f};
            for (int32_t t = 0; t < upto; t++) {
                g[1] += (float)tok[t];
                g[2] += (float)((x->len[q] + (float)t + 1) * (float)tok[t]);
            }
            ck_assert_int_eq(llmem_buffer_upload(r->state[0], (size_t)sn->snap_slot.host[s] * 16,
                                                 g, 16),
                             LLMEM_OK);
            x->mids++;
        }
        mt_rs_src_state(r, s, x->len[q] == 0, f);
        if (x->len[q] != 0) {
            ck_assert_msg(f[0] == x->len[q] && f[1] == x->sum[q] && f[2] == x->wsum[q] &&
                              f[3] == 7.0f,
                          "seq %d reads state {%g, %g, %g, %g}, wants {%g, %g, %g, 7}", q,
                          (double)f[0], (double)f[1], (double)f[2], (double)f[3],
                          (double)x->len[q], (double)x->sum[q], (double)x->wsum[q]);
        }
        /* checkpoints: entry j < nc holds the state after all but the last
         * nc - j tokens of the ubatch (nc = n_ckpt - 1; entry nc is dst) */
        int32_t nc = r->n_ckpt > 0 ? r->n_ckpt - 1 : 0;
        for (int32_t j = 0; j <= nc; j++) {
            int32_t upto = j < nc ? T - nc + j : T;
            float g[4] = {x->len[q] + (float)upto, x->sum[q], x->wsum[q], 7.0f};
            for (int32_t t = 0; t < upto; t++) {
                g[1] += (float)tok[t];
                g[2] += (float)((x->len[q] + (float)t + 1) * (float)tok[t]);
            }
            int32_t slot = j < nc ? r->ckpt_slot.host[s * r->n_ckpt + j] : r->dst_slot.host[s];
            ck_assert_int_ge(slot, 0);
            ck_assert_int_eq(llmem_buffer_upload(r->state[0], (size_t)slot * 16, g, 16), LLMEM_OK);
            if (j == nc) {
                x->len[q] = g[0];
                x->sum[q] = g[1];
                x->wsum[q] = g[2];
            }
        }
    }
    ck_assert_int_eq(llmem_memory_view(mem, 1, &v), LLMEM_OK);
    for (int32_t j = 0; j < llmem_view_kv(&v)->store_slot.n; j++) {
        int32_t k = llmem_view_kv(&v)->store_tok.host[j];
        float kk[2] = {(float)ub->token[k], (float)ub->pos[k]}, vv[2] = {-kk[0], 0.5f};
        size_t off = (size_t)llmem_view_kv(&v)->store_slot.host[j] * 8;
        ck_assert_int_eq(llmem_buffer_upload(llmem_view_kv(&v)->k, off, kk, 8), LLMEM_OK);
        ck_assert_int_eq(llmem_buffer_upload(llmem_view_kv(&v)->v, off, vv, 8), LLMEM_OK);
    }
}

static llmem_memory *hybrid(llmem_backend *be, const cfg *c, bool reuse, llmem_memory **kv,
                            llmem_memory **rs)
{
    llmem_recurrent_params rp = mt_rs_params(NSEQ, c->n_ckpt);
    rp.poison = true;
    rp.n_snapshots = reuse ? c->n_snap : 0;
    rp.snap_interval = reuse ? c->interval : 0;
    rp.host_tier_bytes = reuse ? c->host_bytes : 0;
    rp.prefix_cache_bytes = reuse ? c->budget : 0;
    rp.snap_in_ubatch = reuse && c->mid;
    llmem_kv_cache_params kp = mt_kv_params(c->page_size, reuse ? c->n_pages : NSEQ * (MAXT + 1),
                                            NSEQ);
    kp.no_prefix_cache = !reuse;
    kp.host_tier_bytes = reuse ? c->host_bytes : 0;
    kp.prefix_cache_bytes = reuse ? c->budget : 0;
    *kv = mt_kv_create(be, &kp);
    *rs = mt_rs_create(be, &rp);
    return mt_hybrid_rs_kv(*kv, *rs);
}

static int32_t lcp(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    int32_t k = 0;
    while (k < na && k < nb && a[k] == b[k])
        k++;
    return k;
}

/* The longest prefix of p that a committed history holds. */
static int32_t bound(const model *M, const int32_t *p, int32_t n)
{
    int32_t best = 0;
    for (int32_t q = 0; q < NSEQ; q++) {
        int32_t k = lcp(p, n, M->live[q].tok, M->live[q].n);
        best = k > best ? k : best;
    }
    for (int32_t i = 0; i < M->n_ended; i++) {
        int32_t k = lcp(p, n, M->ended[i].tok, M->ended[i].n);
        best = k > best ? k : best;
    }
    return best;
}

static void stream_equal(model *M, int32_t q)
{
    size_t na = 0, nb = 0;
    ck_assert_int_eq(llmem_memory_state_size(M->h, q, &na), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_state_size(M->twin, q, &nb), LLMEM_OK);
    ck_assert_uint_eq(na, nb);
    unsigned char *a = malloc(na), *b = malloc(nb);
    ck_assert(a && b);
    ck_assert_int_eq(llmem_memory_state_write(M->h, q, a, na, NULL), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_state_write(M->twin, q, b, nb, NULL), LLMEM_OK);
    ck_assert_msg(memcmp(a, b, na) == 0, "seq %d: state stream differs from the twin's", q);
    free(a);
    free(b);
}

static void fw_set(fw *x, int32_t q, const int32_t *tok, int32_t n)
{
    x->len[q] = (float)n;
    x->sum[q] = x->wsum[q] = 0;
    for (int32_t j = 0; j < n; j++) {
        x->sum[q] += (float)tok[j];
        x->wsum[q] += (float)((j + 1) * tok[j]);
    }
}

static void end_conversation(model *M, int32_t q)
{
    ck_assert_int_eq(llmem_memory_seq_rm(M->h, q, -1, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(M->twin, q, -1, -1), LLMEM_OK);
    if (M->live[q].n > 0) { /* every one: bound() must see all that the cache may hold */
        if (M->n_ended == M->cap_ended) {
            M->cap_ended *= 2;
            M->ended = realloc(M->ended, (size_t)M->cap_ended * sizeof *M->ended);
            ck_assert_ptr_nonnull(M->ended);
        }
        M->ended[M->n_ended++] = M->live[q];
    }
    M->live[q].n = 0;
    fw_set(&M->x, q, NULL, 0);
    fw_set(&M->xt, q, NULL, 0);
}

/* The twin computes tok[0, n) of q from scratch. */
static void twin_prompt(model *M, int32_t q, const int32_t *tok, int32_t n)
{
    llmem_batch_buf_clear(M->b);
    for (int32_t j = 0; j < n; j++)
        llmem_batch_buf_add(M->b, tok[j], j, &q, 1, j == n - 1);
    ck_assert_int_eq(mt_run(M->twin, llmem_batch_buf_get(M->b), 64, forward, &M->xt, NULL),
                     LLMEM_OK);
}

static void new_request(model *M, int32_t q)
{
    hist p = {0};
    uint32_t kind = rn(M, 10);
    if (kind < 2 && M->n_aborted > 0) { /* an aborted prompt again */
        p = M->aborted[rn(M, (uint32_t)M->n_aborted)];
    } else if (kind < 5 && M->n_ended > 0) { /* a finished conversation continues */
        p = M->ended[M->n_ended - 1 - (int32_t)rn(M, M->n_ended < 4 ? (uint32_t)M->n_ended : 4)];
        if (p.n > MAXT - 6)
            p.n = MAXT - 6;
        for (int32_t j = 1 + (int32_t)rn(M, 5); j > 0; j--)
            p.tok[p.n++] = 1 + (int32_t)rn(M, 3);
    } else { /* a stem of a family, then a tail */
        int32_t f = (int32_t)rn(M, 3), n_stem = (int32_t)rn(M, 14);
        for (int32_t j = 0; j < n_stem; j++)
            p.tok[p.n++] = 10 * (f + 1) + j % 10;
        for (int32_t j = 1 + (int32_t)rn(M, 8); j > 0; j--)
            p.tok[p.n++] = 1 + (int32_t)rn(M, 3);
    }
    llmem_batch_buf_clear(M->b);
    for (int32_t j = 0; j < p.n; j++)
        llmem_batch_buf_add(M->b, p.tok[j], j, &q, 1, j == p.n - 1);
    mt_snap before, after;
    mt_snapshot(M->h, &before);
    llmem_plan *plan = NULL;
    char err[256] = "";
    int32_t n_ub = (int32_t[]){3, 8, 64}[rn(M, 3)];
    llmem_status st =
        llmem_memory_plan(M->h, llmem_batch_buf_get(M->b), LLMEM_SPLIT_AUTO, n_ub, &plan, err,
                          sizeof err);
    if (st == LLMEM_E_NO_SPACE) {
        M->nospace++;
        mt_snapshot(M->h, &after);
        mt_assert_same(&before, &after);
        return;
    }
    ck_assert_msg(st == LLMEM_OK, "%s: %s", llmem_status_str(st), err);
    int32_t c = llmem_plan_n_cached(plan, q);
    int32_t lim = bound(M, p.tok, p.n);
    ck_assert_msg(c <= lim, "seq %d hits %d tokens, committed histories hold %d", q, c, lim);
    M->hits += c > 0;
    fw_set(&M->x, q, p.tok, c);
    int32_t n = llmem_plan_n_ubatch(plan), stop = rn(M, 6) == 0 ? (int32_t)rn(M, (uint32_t)n) : n;
    for (int32_t u = 0; u < n && u <= stop; u++) {
        const llmem_ubatch *ub = NULL;
        ck_assert_int_eq(llmem_memory_apply(M->h, plan, u, &ub), LLMEM_OK);
        forward(M->h, ub, &M->x);
        if (u == stop)
            break; /* aborted: applied and written, never committed */
        ck_assert_int_eq(llmem_memory_commit(M->h, plan, u), LLMEM_OK);
    }
    llmem_memory_release(M->h, plan);
    int32_t len = llmem_memory_seq_len(M->h, q);
    if (stop < n) {
        M->aborts++;
        if (M->n_aborted < 8)
            M->aborted[M->n_aborted++] = p;
        else
            M->aborted[rn(M, 8)] = p;
        ck_assert_int_lt(len, p.n);
    } else {
        ck_assert_int_eq(len, p.n);
    }
    M->live[q] = p;
    M->live[q].n = len;
    fw_set(&M->x, q, p.tok, len);
    if (len > 0) {
        twin_prompt(M, q, p.tok, len);
        stream_equal(M, q);
    }
}

static void decode(model *M, int32_t q)
{
    hist *l = &M->live[q];
    int32_t t = 1 + (int32_t)rn(M, 3);
    llmem_batch_buf_clear(M->b);
    llmem_batch_buf_add(M->b, t, l->n, &q, 1, true);
    mt_snap before, after;
    mt_snapshot(M->h, &before);
    llmem_status st = mt_run(M->h, llmem_batch_buf_get(M->b), 8, forward, &M->x, NULL);
    if (st == LLMEM_E_NO_SPACE) {
        M->nospace++;
        mt_snapshot(M->h, &after);
        mt_assert_same(&before, &after);
        return;
    }
    ck_assert_int_eq(st, LLMEM_OK);
    ck_assert_int_eq(mt_run(M->twin, llmem_batch_buf_get(M->b), 8, forward, &M->xt, NULL),
                     LLMEM_OK);
    l->tok[l->n++] = t;
    stream_equal(M, q);
}

START_TEST(test_snapshot_model)
{
    const cfg *c = &cfgs[_i];
    const char *se = getenv("LLMEM_TEST_SEED"), *it = getenv("LLMEM_TEST_ITERS");
    uint64_t seed = (se ? strtoull(se, NULL, 10) : 13u) * 1000003u + (uint64_t)_i;
    int32_t iters = it ? atoi(it) : 800;
    llmem_backend *be = mt_cpu();
    model M = {.rng = seed};
    llmem_memory *tkv, *trs;
    M.h = hybrid(be, c, true, &M.kv, &M.rs);
    M.twin = hybrid(be, c, false, &tkv, &trs);
    M.ended = calloc(MAXH, sizeof *M.ended);
    M.cap_ended = MAXH;
    ck_assert_ptr_nonnull(M.ended);
    llmem_batch_buf_create(64, 1, &M.b);
    unsigned n_host_allocs = 0;
    if (c->refuse_host)
        llmem_backend_set_alloc_hook(be, refuse_half, &n_host_allocs);
    for (int32_t step = 0; step < iters; step++) {
        int32_t q = (int32_t)rn(&M, NSEQ);
        uint32_t op = rn(&M, 100);
        if (op == 0) {
            ck_assert_int_eq(llmem_memory_clear(M.h, false), LLMEM_OK);
            for (int32_t s = 0; s < NSEQ; s++)
                end_conversation(&M, s); /* seq_rm of an empty sequence is a no-op */
        } else if (M.live[q].n == 0) {
            end_conversation(&M, q); /* an aborted first ubatch may leave a twin-less state */
            new_request(&M, q);
        } else if (op < 25 || M.live[q].n >= MAXT - 1) {
            end_conversation(&M, q);
        } else {
            decode(&M, q);
        }
        ck_assert_int_eq(llmem_memory_seq_len(M.kv, q), M.live[q].n);
        ck_assert_int_eq(llmem_memory_seq_len(M.rs, q), M.live[q].n);
        char err[256] = "";
        ck_assert_msg(llmem_memory_check(M.h, err, sizeof err) == LLMEM_OK,
                      "%s, seed %llu, step %d: %s", c->name, (unsigned long long)seed, step, err);
        /* the device bytes of cached data, counted from the page and
         * snapshot counts, stay within the budget after every step */
        llmem_memory_stats ms;
        llmem_memory_get_stats(M.h, &ms);
        ck_assert_int_eq(ms.cached_kv_bytes, ms.pages_cached * 16 * c->page_size);
        ck_assert_int_eq(ms.snapshot_bytes, ms.snapshots * 16);
        ck_assert_int_eq(ms.prefix_cache_bytes, c->budget);
        if (c->budget > 0)
            ck_assert_msg(ms.cached_kv_bytes + ms.snapshot_bytes <= c->budget,
                          "%s, seed %llu, step %d: %lld cached page bytes + %lld snapshot "
                          "bytes over the budget of %lld",
                          c->name, (unsigned long long)seed, step, (long long)ms.cached_kv_bytes,
                          (long long)ms.snapshot_bytes, (long long)c->budget);
    }
    llmem_memory_stats st;
    llmem_memory_get_stats(M.h, &st);
    printf("%s: %lld hits (%lld snapshot tokens, %lld snapshots and %lld pages from the host), "
           "%lld aborts, %lld no-space\n",
           c->name, (long long)M.hits, (long long)st.snapshot_hit_tokens,
           (long long)st.host_tier_snapshot_hits, (long long)st.host_tier_hits,
           (long long)M.aborts, (long long)M.nospace);
    ck_assert_int_gt(M.hits, 0); /* the checks above ran on hits */
    printf("%s: %lld snapshots written inside ubatches\n", c->name, (long long)M.x.mids);
    if (c->mid) /* prompts were published without a cut */
        ck_assert_int_gt(M.x.mids, 0);
    else
        ck_assert_int_eq(M.x.mids, 0);
    ck_assert_int_gt(M.aborts, 0);
    if (c->host_bytes > 0 && c->host_bytes < (1 << 20))
        ck_assert_int_gt(st.host_tier_snapshot_hits, 0); /* snapshots came back */
    if (c->refuse_host)
        ck_assert_uint_gt(n_host_allocs, 1); /* and some spills were refused */
    if (c->budget > 0) { /* the budget evicted both kinds */
        ck_assert_int_gt(st.snapshot_evictions, 0);
        ck_assert_int_gt(st.prefix_evictions, 0);
    }
    llmem_backend_set_alloc_hook(be, NULL, NULL);
    llmem_memory_destroy(M.h);
    llmem_memory_destroy(M.twin);
    llmem_batch_buf_destroy(M.b);
    free(M.ended);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("snapshot_model");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_snapshot_model, 0, (int)(sizeof cfgs / sizeof cfgs[0]));
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}
