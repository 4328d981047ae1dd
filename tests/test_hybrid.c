// ctest-labels: core
/* Hybrid memory: layer mapping, strictest split, all-or-nothing plans and
 * sequence operations, state I/O over children, stats per child. */
#include "support/run.h"
#include <stdlib.h>
#include <string.h>

#include "support/memtest.h"

static llmem_memory *make_hybrid(llmem_backend *be, int32_t n_pages, int32_t n_ckpt,
                                 llmem_memory **kv, llmem_memory **rs)
{
    *kv = mt_kv(be, 4, n_pages, 3, true, false);
    *rs = mt_rs(be, 3, n_ckpt);
    return mt_hybrid_rs_kv(*kv, *rs); /* layers: recurrent, attention */
}

/* A hybrid (layers: recurrent, attention) of a KV cache (pages of 4, n_pages, 3 sequences,
 * poisoned; 1 layer, 1 head of dim 2, f32: 64 bytes of K and V per page) and a recurrent
 * memory of one 4-float state per sequence (poisoned; 16 bytes), with n_ckpt checkpoints and
 * n_snapshots snapshots (also at multiples of snap_interval tokens; 0: none); both children
 * get a host tier of host_bytes (0: none), which the hybrid makes one. */
static llmem_memory *tiered_hybrid(llmem_backend *be, int32_t n_pages, int32_t n_ckpt,
                                   int32_t n_snapshots, int32_t snap_interval, int64_t host_bytes,
                                   llmem_memory **kv, llmem_memory **rs)
{
    llmem_recurrent_params rp = mt_rs_params(3, n_ckpt);
    rp.poison = true;
    rp.n_snapshots = n_snapshots;
    rp.snap_interval = snap_interval;
    rp.host_tier_bytes = host_bytes;
    llmem_kv_cache_params kp = mt_kv_params(4, n_pages, 3);
    kp.host_tier_bytes = host_bytes;
    *kv = mt_kv_create(be, &kp);
    *rs = mt_rs_create(be, &rp);
    return mt_hybrid_rs_kv(*kv, *rs);
}

static llmem_memory *snapshot_hybrid(llmem_backend *be, int32_t n_pages, int32_t n_ckpt,
                                     int32_t n_snapshots, int32_t snap_interval,
                                     llmem_memory **kv, llmem_memory **rs)
{
    return tiered_hybrid(be, n_pages, n_ckpt, n_snapshots, snap_interval, 0, kv, rs);
}

static void views(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    int32_t *n = c;
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    ck_assert_int_eq(v.kind, LLMEM_VIEW_RECURRENT);
    ck_assert_int_eq(llmem_view_rs(&v)->n_seqs * llmem_view_rs(&v)->n_seq_tokens, ub->n_tokens);
    ck_assert_int_eq(llmem_memory_view(mem, 1, &v), LLMEM_OK);
    ck_assert_int_eq(v.kind, LLMEM_VIEW_KV);
    ck_assert_int_eq(llmem_view_kv(&v)->store_slot.n, ub->n_tokens);
    ck_assert_int_eq(llmem_memory_view(mem, 2, &v), LLMEM_E_INVALID);
    (*n)++;
}

START_TEST(test_compose)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv, *rs;
    llmem_memory *h = make_hybrid(be, 16, 1, &kv, &rs);
    ck_assert_int_eq(llmem_memory_split(h), LLMEM_SPLIT_EQUAL);
    ck_assert_int_eq(llmem_memory_n_children(h), 2);
    ck_assert_ptr_eq(llmem_memory_child(h, 0), kv);
    llmem_batch_buf *b = mt_batch(64, 2);
    mt_add(b, 0, 0, 5, 0, true);
    mt_add(b, 1, 0, 5, 0, true);
    int32_t n = 0;
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 512, views, &n, NULL), LLMEM_OK);
    ck_assert_int_eq(n, 1);
    /* children can not be planned on directly */
    llmem_plan *plan = NULL;
    char err[256];
    ck_assert_int_eq(llmem_memory_plan(kv, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan, err, sizeof err), LLMEM_E_INVALID);
    /* a hybrid with a recurrent child never skips prefix tokens */
    llmem_batch_buf_clear(b);
    mt_add(b, 2, 0, 5, 0, true);
    ck_assert_int_eq(llmem_memory_plan(h, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_plan_n_cached(plan, 2), 0);
    llmem_memory_release(h, plan);
    llmem_memory_stats st, sk, sr;
    llmem_memory_get_stats(h, &st);
    llmem_memory_get_stats(kv, &sk);
    llmem_memory_get_stats(rs, &sr);
    ck_assert_int_eq(st.pages_used, sk.pages_used);
    ck_assert_int_eq(st.slots_used, sr.slots_used);
    ck_assert_int_eq(sk.pages_used, 4);
    ck_assert_int_eq(sr.slots_used, 2 * 2); /* current + checkpoint each */
    mt_assert_check(h);
    mt_free(h, b, be);
}
END_TEST

START_TEST(test_all_or_nothing)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv, *rs;
    llmem_memory *h = make_hybrid(be, 3, 0, &kv, &rs);
    llmem_batch_buf *b = mt_batch(64, 2);
    mt_add(b, 0, 0, 6, 0, true);
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    mt_snap before, after, kb, ka, rb, ra;
    mt_snapshot(h, &before);
    mt_snapshot(kv, &kb);
    mt_snapshot(rs, &rb);
    /* KV could cut at 3 but the recurrent child has no checkpoint there */
    ck_assert_int_eq(llmem_memory_seq_rm(h, 0, 3, -1), LLMEM_E_STATE);
    /* the KV child runs out of pages: the recurrent child reserves nothing */
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 9, 0, true);
    llmem_plan *plan = NULL;
    char err[256];
    ck_assert_int_eq(llmem_memory_plan(h, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan, err, sizeof err), LLMEM_E_NO_SPACE);
    mt_snapshot(h, &after);
    mt_snapshot(kv, &ka);
    mt_snapshot(rs, &ra);
    mt_assert_same(&before, &after);
    mt_assert_same(&kb, &ka);
    mt_assert_same(&rb, &ra);
    /* both children agree after a whole-sequence operation */
    ck_assert_int_eq(llmem_memory_seq_cp(h, 0, 2, -1, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_len(kv, 2), 6);
    ck_assert_int_eq(llmem_memory_seq_len(rs, 2), 6);
    ck_assert_int_eq(llmem_memory_seq_keep(h, 2), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_len(kv, 0), 0);
    ck_assert_int_eq(llmem_memory_seq_len(rs, 0), 0);
    ck_assert_int_eq(llmem_memory_seq_add(h, 2, 0, -1, 4), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_pos_max(kv, 2), 9);
    ck_assert_int_eq(llmem_memory_seq_pos_max(rs, 2), 9);
    mt_assert_check(h);
    mt_free(h, b, be);
}
END_TEST

START_TEST(test_state_io)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv, *rs;
    llmem_memory *h = make_hybrid(be, 16, 1, &kv, &rs);
    llmem_batch_buf *b = mt_batch(64, 2);
    mt_add(b, 0, 0, 7, 30, true);
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    size_t sz;
    ck_assert_int_eq(llmem_memory_state_size(h, -1, &sz), LLMEM_OK);
    unsigned char *buf = malloc(sz);
    ck_assert_int_eq(llmem_memory_state_write(h, -1, buf, sz, NULL), LLMEM_OK);
    llmem_memory *kv2, *rs2;
    llmem_memory *h2 = make_hybrid(be, 16, 1, &kv2, &rs2);
    char err[256];
    /* the second child's section damaged: the first child must not load */
    buf[sz - 20] ^= 0xff;
    ck_assert_int_eq(llmem_memory_state_read(h2, -1, buf, sz, err, sizeof err), LLMEM_E_CORRUPT);
    ck_assert_int_eq(llmem_memory_seq_len(kv2, 0), 0);
    buf[sz - 20] ^= 0xff;
    ck_assert_int_eq(llmem_memory_state_read(h2, -1, buf, sz, err, sizeof err), LLMEM_OK);
    int32_t t1[16], t2[16];
    ck_assert_int_eq(llmem_memory_seq_tokens(h2, 0, t2, 16), 7);
    llmem_memory_seq_tokens(h, 0, t1, 16);
    ck_assert_mem_eq(t1, t2, 7 * sizeof(int32_t));
    ck_assert_int_ge(llmem_recurrent_seq_slot(rs2, 0), 0);
    /* a KV-only stream does not load into a hybrid */
    size_t ksz;
    ck_assert_int_eq(llmem_memory_state_size(kv, -1, &ksz), LLMEM_OK);
    mt_assert_check(h2);
    free(buf);
    llmem_memory_destroy(h2);
    mt_free(h, b, be);
}
END_TEST

START_TEST(test_create_errors)
{
    llmem_backend *be = mt_cpu();
    char err[256];
    llmem_memory *kv = mt_kv(be, 4, 4, 2, true, false);
    llmem_memory *rs = mt_rs(be, 3, 0); /* n_seq_max differs */
    llmem_memory *children[2] = {kv, rs}, *h = NULL;
    const int32_t map[2] = {0, 1};
    ck_assert_int_eq(llmem_hybrid_create(children, 2, map, 2, &h, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "n_seq_max"));
    ck_assert_ptr_null(h); /* the children were destroyed (ASan checks leaks) */
    kv = mt_kv(be, 4, 4, 2, true, false);
    rs = mt_rs(be, 2, 0);
    llmem_memory *c2[2] = {kv, rs};
    const int32_t bad[3] = {0, 1, 1}; /* two layers map to a 1-layer child */
    ck_assert_int_eq(llmem_hybrid_create(c2, 2, bad, 3, &h, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "layers map"));
    llmem_backend_close(be);
}
END_TEST

/* --- snapshots (issue 13) ----------------------------------------------------- */

/* The test's forward pass: a sequence's state after L tokens is
 * {L, sum of its token ids}; each ubatch checks the state it reads (src)
 * against what the test knows of the sequence, then writes dst. */
typedef struct fw {
    float len[3], sum[3];
    int32_t first_T[3]; /* tokens of the sequence's first ubatch, -1 before */
} fw;

static void forward(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    fw *x = c;
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    const llmem_rs_view *r = llmem_view_rs(&v);
    for (int32_t s = 0; s < r->n_seqs; s++) {
        int32_t q = ub->seq_id[s], T = r->n_seq_tokens;
        float f[4] = {0};
        mt_rs_src_state(r, s, x->len[q] == 0, f);
        if (x->len[q] != 0) {
            ck_assert_float_eq(f[0], x->len[q]); /* NaN (poison) fails too */
            ck_assert_float_eq(f[1], x->sum[q]);
        }
        if (x->first_T[q] < 0)
            x->first_T[q] = T;
        /* checkpoints: entry j < nc holds the state after all but the last
         * nc - j tokens of the ubatch (nc = n_ckpt - 1; entry nc is dst) */
        int32_t nc = r->n_ckpt > 0 ? r->n_ckpt - 1 : 0;
        for (int32_t j = 0; j < nc; j++) {
            int32_t slot = r->ckpt_slot.host[s * r->n_ckpt + j];
            float g[4] = {x->len[q] + (float)(T - nc + j), x->sum[q], 0, 0};
            for (int32_t t = 0; t < T - nc + j; t++)
                g[1] += (float)ub->token[s * T + t];
            ck_assert_int_ge(slot, 0);
            ck_assert_int_eq(llmem_buffer_upload(r->state[0], (size_t)slot * 16, g, 16), LLMEM_OK);
        }
        for (int32_t t = 0; t < T; t++)
            x->sum[q] += (float)ub->token[s * T + t];
        x->len[q] += (float)T;
        f[0] = x->len[q];
        f[1] = x->sum[q];
        ck_assert_int_eq(llmem_buffer_upload(r->state[0], (size_t)r->dst_slot.host[s] * 16, f, 16),
                         LLMEM_OK);
    }
}

/* Builds tokens 100..107 then n_tail tokens from tail0 for seq. */
static void prompt(llmem_batch_buf *b, int32_t seq, int32_t tail0, int32_t n_tail)
{
    llmem_batch_buf_clear(b);
    mt_add(b, seq, 0, 8, 100, false);
    mt_add(b, seq, 8, n_tail, tail0, true);
}

/* Hybrid of a KV cache (pages of 4, poisoned) and a recurrent memory with
 * 4 snapshots (poisoned). Request A = 100..107, 500: no hit; its prompt end
 * (9) is published. Request B = 100..107, 600, 601: the KV cache holds 8
 * tokens, no snapshot matches, so the plan ends B's first ubatch at 8 and
 * publishes the state there — but only at commit: B applied and released
 * first publishes nothing, and a request planned then gets no hit. Request
 * C = 100..107, 700, 701 then hits 8 tokens in both children and its first
 * ubatch reads the state B wrote after 8 tokens (checked by value; a
 * snapshot published before the write would read NaN). */
START_TEST(test_snapshot_reuse)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv, *rs;
    llmem_memory *h = snapshot_hybrid(be, 16, 0, 4, 0, &kv, &rs);
    char err[256] = "";
    llmem_batch_buf *b = mt_batch(64, 1);
    fw x = {.first_T = {-1, -1, -1}};
    llmem_memory_stats st;

    prompt(b, 0, 500, 1);
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 512, forward, &x, NULL), LLMEM_OK);
    ck_assert_int_eq(x.first_T[0], 9);
    llmem_memory_get_stats(h, &st);
    ck_assert_int_eq(st.snapshots, 1);
    ck_assert_int_eq(st.snapshot_bytes, 16);

    /* B applied and written, then released without commit: nothing published */
    prompt(b, 1, 600, 2);
    llmem_plan *plan = NULL;
    ck_assert_int_eq(llmem_memory_plan(h, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan,
                                       err, sizeof err),
                     LLMEM_OK);
    ck_assert_int_eq(llmem_plan_n_cached(plan, 1), 0);
    ck_assert_int_eq(llmem_plan_n_ubatch(plan), 2);
    const llmem_ubatch *ub = NULL;
    ck_assert_int_eq(llmem_memory_apply(h, plan, 0, &ub), LLMEM_OK);
    ck_assert_int_eq(ub->n_seq_tokens, 8); /* ends where the KV cache's hit ends */
    fw y = {.first_T = {-1, -1, -1}};
    forward(h, ub, &y);
    llmem_memory_release(h, plan);
    mt_assert_check(h);
    llmem_memory_get_stats(h, &st);
    ck_assert_int_eq(st.snapshots, 1);
    prompt(b, 2, 700, 2);
    ck_assert_int_eq(llmem_memory_plan(h, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan,
                                       err, sizeof err),
                     LLMEM_OK);
    ck_assert_int_eq(llmem_plan_n_cached(plan, 2), 0);
    llmem_memory_release(h, plan);

    /* B for real: snapshots at 8 (the cut) and 10 (its prompt end) */
    prompt(b, 1, 600, 2);
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 512, forward, &x, NULL), LLMEM_OK);
    ck_assert_int_eq(x.first_T[1], 8);
    llmem_memory_get_stats(h, &st);
    ck_assert_int_eq(st.snapshots, 3);
    mt_assert_check(h);

    /* C hits 8 tokens; its first ubatch reads B's state after 8 tokens */
    prompt(b, 2, 700, 2);
    x.len[2] = 8;
    for (int32_t t = 100; t < 108; t++)
        x.sum[2] += (float)t;
    llmem_plan_info info;
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 512, forward, &x, &info), LLMEM_OK);
    ck_assert_int_eq(info.n_tokens_cached, 8);
    ck_assert_int_eq(x.first_T[2], 2);
    llmem_memory_get_stats(h, &st);
    ck_assert_int_eq(st.snapshot_hit_tokens, 8);
    ck_assert_int_eq(llmem_memory_seq_len(rs, 2), 10);
    ck_assert_int_eq(llmem_memory_seq_len(kv, 2), 10);
    int32_t t2[16];
    ck_assert_int_eq(llmem_memory_seq_tokens(rs, 2, t2, 16), 10);
    ck_assert_int_eq(t2[7], 107);
    ck_assert_int_eq(t2[8], 700);
    mt_assert_check(h);
    /* clear drops every snapshot */
    ck_assert_int_eq(llmem_memory_clear(h, false), LLMEM_OK);
    llmem_memory_get_stats(h, &st);
    ck_assert_int_eq(st.snapshots, 0);
    mt_free(h, b, be);
}
END_TEST

/* Multi-turn reuse (issue 13 item 2): a conversation (prompt 100..105,
 * then 106 and 107 decoded one by one) is removed when it ends; a prompt
 * that extends it (100..107, 108, 109) reuses all 8 tokens: two whole KV
 * pages of 4 and the conversation's last state, which its first ubatch
 * reads by value. */
START_TEST(test_snapshot_multi_turn)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv, *rs;
    llmem_memory *h = snapshot_hybrid(be, 16, 1, 2, 0, &kv, &rs);
    llmem_batch_buf *b = mt_batch(64, 1);
    fw x = {.first_T = {-1, -1, -1}};
    mt_add(b, 0, 0, 6, 100, true);
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 512, forward, &x, NULL), LLMEM_OK);
    for (int32_t t = 6; t < 8; t++) {
        llmem_batch_buf_clear(b);
        mt_add(b, 0, t, 1, 100 + t, true);
        ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 512, forward, &x, NULL), LLMEM_OK);
    }
    ck_assert_int_eq(llmem_memory_seq_rm(h, 0, -1, -1), LLMEM_OK);
    llmem_memory_stats st;
    llmem_memory_get_stats(h, &st);
    ck_assert_int_eq(st.snapshots, 2); /* prompt end (6) and conversation end (8) */
    mt_assert_check(h);
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 10, 100, true);
    x.len[1] = 8;
    for (int32_t t = 100; t < 108; t++)
        x.sum[1] += (float)t;
    llmem_plan_info info;
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 512, forward, &x, &info), LLMEM_OK);
    ck_assert_int_eq(info.n_tokens_cached, 8);
    ck_assert_int_eq(x.first_T[1], 2);
    mt_assert_check(h);
    mt_free(h, b, be);
}
END_TEST

/* Randomized snapshots (issue 13 items 1, 8): requests whose prompts
 * share stems, decode steps, finished conversations and aborted plans
 * (applied and written, then released) in a hybrid with 3 snapshots (so
 * they are evicted) under poison. On every hit the first ubatch must read
 * the state of exactly the cached tokens (length and token sum by value:
 * KV and state agree), an aborted plan must leave the sequence empty and
 * its data unpublished, and llmem_memory_check must pass after every
 * step. Seed: LLMEM_TEST_SEED (default 13). */
START_TEST(test_snapshot_random)
{
    const char *seed_env = getenv("LLMEM_TEST_SEED");
    unsigned seed = seed_env ? (unsigned)strtoul(seed_env, NULL, 10) : 13u;
    srand(seed);
    llmem_backend *be = mt_cpu();
    llmem_memory *kv, *rs;
    llmem_memory *h = snapshot_hybrid(be, 64, 1, 3, 4, &kv, &rs);
    char err[256] = "";
    llmem_batch_buf *b = mt_batch(64, 1);
    fw x = {.first_T = {-1, -1, -1}};
    int32_t hist[3][64], n_hist[3] = {0}, hits = 0;
    for (int32_t step = 0; step < 400; step++) {
        int32_t q = rand() % 3, op = rand() % 10;
        llmem_batch_buf_clear(b);
        if (n_hist[q] == 0) { /* a new request: a stem, then a random tail */
            int32_t stem = rand() % 3, n_stem = (int32_t[]){0, 9, 12}[stem];
            n_stem -= n_stem > 0 ? rand() % 2 : 0;
            int32_t n = n_stem + 1 + rand() % 6, sum = 0;
            for (int32_t j = 0; j < n; j++) {
                hist[q][j] = j < n_stem ? 10 * stem + j : 50 + rand() % 3;
                llmem_batch_buf_add(b, hist[q][j], j, &q, 1, j == n - 1);
            }
            llmem_plan *plan = NULL;
            ck_assert_msg(llmem_memory_plan(h, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 8, &plan,
                                            err, sizeof err) == LLMEM_OK,
                          "seed %u step %d: %s", seed, step, err);
            int32_t c = llmem_plan_n_cached(plan, q);
            for (int32_t j = 0; j < c; j++)
                sum += hist[q][j];
            x.len[q] = (float)c;
            x.sum[q] = (float)sum;
            x.first_T[q] = -1;
            bool abort = op < 2;
            int32_t n_ub = llmem_plan_n_ubatch(plan);
            for (int32_t u = 0; u < n_ub; u++) {
                const llmem_ubatch *ub = NULL;
                ck_assert_int_eq(llmem_memory_apply(h, plan, u, &ub), LLMEM_OK);
                forward(h, ub, &x);
                if (abort)
                    break;
                ck_assert_int_eq(llmem_memory_commit(h, plan, u), LLMEM_OK);
            }
            llmem_memory_release(h, plan);
            if (abort) {
                x.len[q] = x.sum[q] = 0;
                ck_assert_int_eq(llmem_memory_seq_len(h, q), 0);
            } else {
                n_hist[q] = n;
                hits += c > 0;
            }
        } else if (op < 3 || n_hist[q] >= 60) { /* the conversation ends */
            ck_assert_int_eq(llmem_memory_seq_rm(h, q, -1, -1), LLMEM_OK);
            n_hist[q] = 0;
            x.len[q] = x.sum[q] = 0;
        } else { /* a decode step */
            int32_t t = 50 + rand() % 3;
            hist[q][n_hist[q]] = t;
            llmem_batch_buf_add(b, t, n_hist[q], &q, 1, true);
            ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 8, forward, &x, NULL), LLMEM_OK);
            n_hist[q]++;
        }
        ck_assert_int_eq(llmem_memory_seq_len(kv, q), n_hist[q]);
        ck_assert_int_eq(llmem_memory_seq_len(rs, q), n_hist[q]);
        char e2[256] = "";
        ck_assert_msg(llmem_memory_check(h, e2, sizeof e2) == LLMEM_OK, "seed %u step %d: %s",
                      seed, step, e2);
    }
    ck_assert_int_gt(hits, 0); /* the checks above ran on hits */
    mt_free(h, b, be);
}
END_TEST

/* One token of seq q at position pos through the test's forward pass. */
static void decode(llmem_memory *h, llmem_batch_buf *b, int32_t q, int32_t tok, int32_t pos,
                   fw *x)
{
    llmem_batch_buf_clear(b);
    llmem_batch_buf_add(b, tok, pos, &q, 1, true);
    ck_assert_int_eq(mt_run(h, llmem_batch_buf_get(b), 8, forward, x, NULL), LLMEM_OK);
}

/* Plans, runs and commits a new request tok[0, n) of seq q; returns its hit
 * (the forward pass checks that the state it resumes from is that of
 * exactly the hit tokens). */
static int32_t request(llmem_memory *h, llmem_batch_buf *b, int32_t q, const int32_t *tok,
                       int32_t n, fw *x)
{
    char err[256] = "";
    llmem_batch_buf_clear(b);
    for (int32_t j = 0; j < n; j++)
        llmem_batch_buf_add(b, tok[j], j, &q, 1, j == n - 1);
    llmem_plan *plan = NULL;
    ck_assert_msg(llmem_memory_plan(h, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 256, &plan, err,
                                    sizeof err) == LLMEM_OK, "%s", err);
    int32_t c = llmem_plan_n_cached(plan, q);
    x->len[q] = (float)c;
    x->sum[q] = 0;
    for (int32_t j = 0; j < c; j++)
        x->sum[q] += (float)tok[j];
    for (int32_t u = 0; u < llmem_plan_n_ubatch(plan); u++) {
        const llmem_ubatch *ub = NULL;
        ck_assert_int_eq(llmem_memory_apply(h, plan, u, &ub), LLMEM_OK);
        forward(h, ub, x);
        ck_assert_int_eq(llmem_memory_commit(h, plan, u), LLMEM_OK);
    }
    llmem_memory_release(h, plan);
    return c;
}

/* Snapshot keys of long histories (issue 13; rs_snap.c keys a snapshot by
 * a chain hash over blocks of 64 tokens that each sequence extends
 * incrementally). A conversation of 120 prompt tokens decodes one token at
 * a time to 131 (a snapshot every 16 tokens: the one at 128 hashes a
 * second block), is cut back to 127 (a checkpoint) and decodes 9 other
 * tokens (snapshot at 128 of the new tokens), then ends (snapshot at 136).
 * A block hash left stale by the cut would key the new snapshots by the old
 * tokens: llmem_memory_check recomputes every key from scratch, and a
 * request extending the new history must hit all 136 tokens (the longest
 * snapshot there is, by construction) with the state of exactly those. */
START_TEST(test_snapshot_long_chain)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv, *rs;
    llmem_memory *h = snapshot_hybrid(be, 128, 4, 8, 16, &kv, &rs);
    llmem_batch_buf *b = mt_batch(256, 1);
    fw x = {.first_T = {-1, -1, -1}};
    int32_t old[140], neu[140];
    for (int32_t j = 0; j < 140; j++) {
        old[j] = 1 + (j * 37) % 500;
        neu[j] = j < 127 ? old[j] : 600 + j;
    }
    ck_assert_int_eq(request(h, b, 0, old, 120, &x), 0);
    for (int32_t j = 120; j < 131; j++)
        decode(h, b, 0, old[j], j, &x);
    ck_assert_int_eq(llmem_memory_seq_rm(h, 0, 127, -1), LLMEM_OK);
    x.len[0] = 127;
    x.sum[0] = 0;
    for (int32_t j = 0; j < 127; j++)
        x.sum[0] += (float)old[j];
    for (int32_t j = 127; j < 136; j++)
        decode(h, b, 0, neu[j], j, &x);
    mt_assert_check(h);
    ck_assert_int_eq(llmem_memory_seq_rm(h, 0, -1, -1), LLMEM_OK);
    mt_assert_check(h);
    ck_assert_int_eq(request(h, b, 1, neu, 139, &x), 136);
    /* the old history's snapshot at 120 (its prompt end) is still found */
    int32_t o2[124];
    memcpy(o2, old, sizeof o2);
    o2[120] = 999;
    ck_assert_int_eq(request(h, b, 2, o2, 124, &x), 120);
    mt_assert_check(h);
    mt_free(h, b, be);
}
END_TEST

static llmem_memory_stats hstats(llmem_memory *h)
{
    llmem_memory_stats st;
    llmem_memory_get_stats(h, &st);
    return st;
}

/* Snapshots spill to the host tier and come back (issue 13 items 1, 3): a
 * hybrid with 4 KV pages, ONE snapshot slot and one host tier of 64 bytes
 * for both children (a page entry is 64 bytes, a snapshot 16), all
 * poisoned. Expected contents follow from LRU order, by hand:
 *   A = 100..104 (5 tokens, snapshot A@5), ended: its full page is cached;
 *   B = 200..203 (snapshot B@4 replaces A@5, which spills: 16 bytes);
 *   C = 300..311 (3 pages: evicts A's cached page, which spills and, the
 *     budget being shared, evicts the older A@5; then snapshot C@12
 *     replaces B@4, which spills and evicts A's page). Separate budgets
 *     would keep A's page and both snapshots; one budget keeps only B@4;
 *   C ends; D = 200..203, 900 hits B's shared page and B@4 from the host
 *     tier: the host entry stays pinned while the KV cache spills a page
 *     (its insert fails, nothing else to evict), then comes back into the
 *     snapshot slot at the first apply; the forward pass checks that the
 *     state read is that of exactly 200..203 (poison would read NaN). */
START_TEST(test_snapshot_host_tier)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv, *rs;
    llmem_memory *h = tiered_hybrid(be, 4, 0, 1, 0, 64, &kv, &rs);
    llmem_batch_buf *b = mt_batch(64, 1);
    fw x = {.first_T = {-1, -1, -1}};
    int32_t a[5], bt[4], c[12], d[5];
    for (int32_t j = 0; j < 12; j++) {
        if (j < 5)
            a[j] = 100 + j;
        if (j < 4)
            bt[j] = d[j] = 200 + j;
        c[j] = 300 + j;
    }
    d[4] = 900;
    ck_assert_int_eq(request(h, b, 0, a, 5, &x), 0);
    ck_assert_int_eq(llmem_memory_seq_rm(h, 0, -1, -1), LLMEM_OK);
    x.len[0] = x.sum[0] = 0;
    ck_assert_int_eq(request(h, b, 1, bt, 4, &x), 0);
    llmem_memory_stats st = hstats(h);
    ck_assert_int_eq(st.snapshots, 1);
    ck_assert_int_eq(st.host_tier_snapshots, 1); /* A@5 */
    ck_assert_int_eq(st.host_tier_snapshot_bytes, 16);
    ck_assert_int_eq(st.host_tier_pages, 0);
    mt_assert_check(h);
    ck_assert_int_eq(request(h, b, 2, c, 12, &x), 0);
    st = hstats(h);
    ck_assert_int_eq(st.host_tier_pages, 0);
    ck_assert_int_eq(st.host_tier_bytes, 0);
    ck_assert_int_eq(st.host_tier_snapshots, 1); /* B@4 */
    ck_assert_int_eq(st.host_tier_snapshot_bytes, 16);
    ck_assert_int_eq(st.prefix_evictions, 1);
    mt_assert_check(h);
    ck_assert_int_eq(llmem_memory_seq_rm(h, 2, -1, -1), LLMEM_OK);
    x.len[2] = x.sum[2] = 0;
    x.first_T[0] = -1;
    ck_assert_int_eq(request(h, b, 0, d, 5, &x), 4);
    st = hstats(h);
    ck_assert_int_eq(st.host_tier_snapshot_hits, 1);
    ck_assert_int_eq(st.snapshot_hit_tokens, 4);
    ck_assert_int_eq(st.host_tier_snapshots, 1); /* C@12, replaced by B@4 */
    ck_assert_int_eq(st.host_tier_pages, 0);
    mt_assert_check(h);
    /* a cleared memory keeps nothing on the host either */
    ck_assert_int_eq(llmem_memory_clear(h, false), LLMEM_OK);
    st = hstats(h);
    ck_assert_int_eq(st.host_tier_snapshots + st.host_tier_pages, 0);
    mt_assert_check(h);
    mt_free(h, b, be);
}
END_TEST

/* Two host-tier hits in one plan with ONE snapshot slot (issue 13): A, B
 * and C (8 tokens each, one after the other in seq 0) leave C's snapshot
 * on the device and A's and B's in the host tier. One plan then starts
 * seq 1 = A + 900 and seq 2 = B + 901: both hit 8 tokens; one snapshot
 * comes back into the snapshot slot, the other into a free state slot (no
 * snapshot slot is left), and each first ubatch must read the state of
 * exactly its own 8 tokens (by value; poison reads NaN). */
START_TEST(test_snapshot_host_two_hits)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv, *rs;
    llmem_memory *h = tiered_hybrid(be, 16, 0, 1, 0, 1024, &kv, &rs);
    llmem_batch_buf *b = mt_batch(64, 1);
    fw x = {.first_T = {-1, -1, -1}};
    int32_t p[3][9];
    for (int32_t k = 0; k < 3; k++) {
        for (int32_t j = 0; j < 8; j++)
            p[k][j] = 100 * (k + 1) + j;
        p[k][8] = 900 + k;
        ck_assert_int_eq(request(h, b, 0, p[k], 8, &x), 0);
        ck_assert_int_eq(llmem_memory_seq_rm(h, 0, -1, -1), LLMEM_OK);
        x.len[0] = x.sum[0] = 0;
    }
    llmem_memory_stats st = hstats(h);
    ck_assert_int_eq(st.snapshots, 1);
    ck_assert_int_eq(st.host_tier_snapshots, 2);
    llmem_batch_buf_clear(b);
    for (int32_t q = 1; q <= 2; q++)
        for (int32_t j = 0; j < 9; j++)
            llmem_batch_buf_add(b, p[q - 1][j], j, &q, 1, j == 8);
    llmem_plan *plan = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_memory_plan(h, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 64, &plan, err,
                                    sizeof err) == LLMEM_OK, "%s", err);
    for (int32_t q = 1; q <= 2; q++) {
        ck_assert_int_eq(llmem_plan_n_cached(plan, q), 8);
        x.len[q] = 8;
        x.sum[q] = 0;
        for (int32_t j = 0; j < 8; j++)
            x.sum[q] += (float)p[q - 1][j];
    }
    for (int32_t u = 0; u < llmem_plan_n_ubatch(plan); u++) {
        const llmem_ubatch *ub = NULL;
        ck_assert_int_eq(llmem_memory_apply(h, plan, u, &ub), LLMEM_OK);
        forward(h, ub, &x);
        ck_assert_int_eq(llmem_memory_commit(h, plan, u), LLMEM_OK);
    }
    llmem_memory_release(h, plan);
    st = hstats(h);
    ck_assert_int_eq(st.host_tier_snapshot_hits, 2);
    ck_assert_int_eq(st.snapshot_hit_tokens, 16);
    ck_assert_int_eq(llmem_memory_seq_len(h, 1), 9);
    ck_assert_int_eq(llmem_memory_seq_len(h, 2), 9);
    mt_assert_check(h);
    mt_free(h, b, be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hybrid");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_compose);
    tcase_add_test(tc, test_all_or_nothing);
    tcase_add_test(tc, test_state_io);
    tcase_add_test(tc, test_create_errors);
    tcase_add_test(tc, test_snapshot_reuse);
    tcase_add_test(tc, test_snapshot_multi_turn);
    tcase_add_test(tc, test_snapshot_random);
    tcase_add_test(tc, test_snapshot_long_chain);
    tcase_add_test(tc, test_snapshot_host_tier);
    tcase_add_test(tc, test_snapshot_host_two_hits);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return failed ? 1 : 0;
}
