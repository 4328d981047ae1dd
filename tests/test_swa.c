// ctest-labels: core
/* Sliding-window KV cache (llmem_kv_cache_params.window, memory/swa.c).
 *
 * The references are independent of the cache:
 *  - which keys a token may see: transformers' sliding-window mask (key j
 *    visible to query i when j <= i and i - j < window), brute force;
 *  - which pages a sequence must still hold: every page holding a key
 *    that some query after a rollback of up to window_slack tokens may
 *    see, brute force over those queries;
 *  - attention outputs: float64 softmax over the brute-force visible keys,
 *    against llmem_op_attention_paged (cpu) reading the cache's views with
 *    the window, in poison mode (freed pages hold NaN).
 * K and V of a token are functions of its position only, so sequences
 * that share pages (seq_cp, prefix hits) hold the same values. */
#include "support/run.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/hybrid.h"
#include "llmem/ops.h"
#include "support/memtest.h"
#include "support/ref64.h"

#define TMAX 64

static void key_of(int32_t pos, double k[2], double v[2])
{
    k[0] = sin(0.7 * pos);
    k[1] = cos(0.3 * pos);
    v[0] = pos;
    v[1] = 1.0 + 0.01 * pos;
}

static void query_of(int32_t pos, double q[2])
{
    q[0] = 2.0 * cos(1.1 * pos);
    q[1] = 2.0 * sin(0.5 * pos);
}

/* Runs kv_store and windowed attention on layer `layer` of the current
 * ubatch and compares with the float64 brute force. */
typedef struct attn_ctx {
    llmem_backend *be;
    llmem_buffer *buf; /* q | k | v | out, TMAX rows of 2 floats each */
    int32_t layer, window;
    int32_t n_ubatch_seen;
} attn_ctx;

static void check_attention(llmem_memory *mem, const llmem_ubatch *ub, void *vctx)
{
    attn_ctx *c = vctx;
    int32_t T = ub->n_tokens;
    ck_assert_int_le(T, TMAX);
    float q[TMAX * 2], k[TMAX * 2], v[TMAX * 2], out[TMAX * 2];
    for (int32_t t = 0; t < T; t++) {
        double qd[2], kd[2], vd[2];
        query_of(ub->pos[t], qd);
        key_of(ub->pos[t], kd, vd);
        for (int d = 0; d < 2; d++) {
            q[2 * t + d] = (float)qd[d];
            k[2 * t + d] = (float)kd[d];
            v[2 * t + d] = (float)vd[d];
        }
    }
    size_t rb = TMAX * 2 * sizeof(float);
    ck_assert_int_eq(llmem_buffer_upload(c->buf, 0, q, (size_t)T * 8), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(c->buf, rb, k, (size_t)T * 8), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(c->buf, 2 * rb, v, (size_t)T * 8), LLMEM_OK);
    llmem_tensor tq = llmem_tensor_3d(c->buf, 0, LLMEM_DTYPE_F32, T, 1, 2);
    llmem_tensor tk = llmem_tensor_3d(c->buf, rb, LLMEM_DTYPE_F32, T, 1, 2);
    llmem_tensor tv = llmem_tensor_3d(c->buf, 2 * rb, LLMEM_DTYPE_F32, T, 1, 2);
    llmem_tensor to = llmem_tensor_3d(c->buf, 3 * rb, LLMEM_DTYPE_F32, T, 1, 2);
    llmem_view view;
    ck_assert_int_eq(llmem_memory_view(mem, c->layer, &view), LLMEM_OK);
    ck_assert_int_eq(llmem_op_kv_store(c->be, &view, &tk, &tv), LLMEM_OK);
    llmem_attn_params ap = {.scale = 1.0f, .softcap = 0.0f, .window = c->window};
    ck_assert_int_eq(llmem_op_attention_paged(c->be, &ap, &view, &tq, &to), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_download(c->buf, 3 * rb, out, (size_t)T * 8), LLMEM_OK);
    for (int32_t t = 0; t < T; t++) {
        int32_t a = ub->pos[t]; /* positions equal indices in these tests */
        double qd[2], m = -INFINITY, den = 0, num[2] = {0, 0};
        query_of(a, qd);
        for (int pass = 0; pass < 2; pass++)
            for (int32_t b = 0; b <= a; b++) {
                if (c->window > 0 && a - b >= c->window)
                    continue; /* transformers: visible iff q - kv < sliding_window */
                double kd[2], vd[2];
                key_of(b, kd, vd);
                double s = qd[0] * kd[0] + qd[1] * kd[1];
                if (pass == 0) {
                    m = s > m ? s : m;
                } else {
                    double e = exp(s - m);
                    den += e;
                    num[0] += e * vd[0];
                    num[1] += e * vd[1];
                }
            }
        for (int d = 0; d < 2; d++)
            ck_assert_msg(fabs(out[2 * t + d] - num[d] / den) <= 1e-4 * (1 + fabs(num[d] / den)),
                          "pos %d dim %d: %g, reference %g", a, d, (double)out[2 * t + d],
                          num[d] / den);
    }
    c->n_ubatch_seen++;
}

static attn_ctx ctx_new(llmem_backend *be, int32_t layer, int32_t window)
{
    attn_ctx c = {.be = be, .layer = layer, .window = window};
    ck_assert_int_eq(llmem_buffer_alloc(be, 4 * TMAX * 2 * sizeof(float), &c.buf), LLMEM_OK);
    return c;
}

/* Frees a case's attention buffer, memory, batch buffer and backend. */
static void free_all(attn_ctx *c, llmem_memory *m, llmem_batch_buf *b, llmem_backend *be)
{
    llmem_buffer_free(c->buf);
    mt_free(m, b, be);
}

/* The most pages the contract lets a sequence of len tokens keep after a
 * commit: those not wholly before index len + 1 - window - slack. */
static int32_t pages_kept_max(int32_t len, int32_t ps, int32_t window, int32_t slack)
{
    int32_t n = 0;
    for (int32_t pg = 0; (int64_t)pg * ps < len; pg++)
        n += (pg + 1) * ps > len + 1 - window - slack;
    return n;
}

static void run_ok(llmem_memory *m, llmem_batch_buf *b, int32_t n_ubatch, attn_ctx *c)
{
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), n_ubatch, check_attention, c, NULL),
                     LLMEM_OK);
    mt_assert_check(m);
    llmem_batch_buf_clear(b);
}

/* Page sizes where the window is and is not a multiple of the page. */
static const int32_t k_ps[] = {1, 3, 4, 5, 8, 16};

/* As the window slides, pages leave the table at commit: held pages and
 * pool use equal the brute-force count after every step; outputs equal
 * the float64 windowed attention throughout. */
START_TEST(test_pages_freed_as_window_slides)
{
    int32_t ps = k_ps[_i % 6], W = 8, slack = _i / 6 ? 3 : 0;
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv_window(be, ps, 64, 1, W, slack, false);
    ck_assert_int_eq(llmem_kv_cache_window(m), W);
    ck_assert(!llmem_memory_can_shift(m));
    attn_ctx c = ctx_new(be, 0, W);
    mt_add(b, 0, 0, 21, 100, true); /* a prompt in ubatches of 7 */
    run_ok(m, b, 7, &c);
    ck_assert_int_eq(mt_held_pages(m, 0), mt_window_pages_needed(21, ps, W, slack));
    int32_t len = 21;
    for (int32_t step = 0; step < 30; step++, len++) {
        mt_add(b, 0, len, 1, 200 + step, true);
        run_ok(m, b, 7, &c);
        ck_assert_int_eq(mt_held_pages(m, 0), mt_window_pages_needed(len + 1, ps, W, slack));
        llmem_memory_stats st;
        ck_assert_int_eq(llmem_memory_get_stats(m, &st), LLMEM_OK);
        ck_assert_int_eq(st.pages_used, mt_window_pages_needed(len + 1, ps, W, slack));
        ck_assert_int_eq(llmem_kv_cache_page_table(m, 0, NULL, 0), (len + 1 + ps - 1) / ps);
    }
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 51);
    ck_assert_int_eq(c.n_ubatch_seen, 3 + 30);
    free_all(&c, m, b, be);
}
END_TEST

/* A page shared with another sequence (seq_cp) stays in the pool while
 * that sequence still sees it; both keep attending correctly. */
START_TEST(test_shared_pages_kept)
{
    int32_t ps = 4, W = 6;
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv_window(be, ps, 32, 2, W, 0, false);
    attn_ctx c = ctx_new(be, 0, W);
    mt_add(b, 0, 0, 10, 100, true);
    run_ok(m, b, 512, &c);
    int32_t pt0[8], pt1[8];
    llmem_kv_cache_page_table(m, 0, pt0, 8);
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK);
    mt_assert_check(m);
    for (int32_t i = 0; i < 12; i++) { /* seq 0 moves on, seq 1 stays at 10 tokens */
        mt_add(b, 0, 10 + i, 1, 300 + i, true);
        run_ok(m, b, 512, &c);
    }
    /* seq 1 still holds its pages (3 pages, page 0 dropped at its own
     * commit before the copy: index 0..3 < 10 + 1 - 6 = 5) */
    int32_t n1 = llmem_kv_cache_page_table(m, 1, pt1, 8);
    ck_assert_int_eq(n1, 3);
    ck_assert_int_eq(pt1[0], -1);
    ck_assert_int_eq(pt1[1], pt0[1]);
    ck_assert_int_eq(pt1[2], pt0[2]);
    ck_assert_int_eq(mt_held_pages(m, 0), mt_window_pages_needed(22, ps, W, 0));
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    /* seq 0's table no longer names pt0[1], pt0[2], yet the pool keeps them */
    int32_t pt[8];
    int32_t n0 = llmem_kv_cache_page_table(m, 0, pt, 8);
    for (int32_t i = 0; i < n0; i++)
        ck_assert(pt[i] != pt0[1] && pt[i] != pt0[2]);
    ck_assert_int_eq(st.pages_used, mt_window_pages_needed(22, ps, W, 0) + 2);
    /* seq 1 decodes from its own state: still the exact window */
    for (int32_t i = 0; i < 6; i++) {
        mt_add(b, 1, 10 + i, 1, 400 + i, true);
        run_ok(m, b, 512, &c);
    }
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_used, mt_window_pages_needed(22, ps, W, 0) + mt_window_pages_needed(16, ps, W, 0));
    free_all(&c, m, b, be);
}
END_TEST

/* Published pages that leave the window go to the prefix cache: a new
 * sequence with the same prompt takes them (no recompute) and attends
 * correctly. */
START_TEST(test_prefix_hit_after_slide)
{
    int32_t ps = 4, W = 5;
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv_window(be, ps, 32, 2, W, 0, true);
    attn_ctx c = ctx_new(be, 0, W);
    mt_add(b, 0, 0, 16, 100, true);
    run_ok(m, b, 512, &c);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_cached, 4 - mt_window_pages_needed(16, ps, W, 0)); /* 3 left the window */
    mt_add(b, 1, 0, 17, 100, true); /* same 16 tokens, then one more */
    llmem_plan_info info;
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, check_attention, &c, &info),
                     LLMEM_OK);
    llmem_batch_buf_clear(b);
    ck_assert_int_eq(info.n_tokens_cached, 16);
    ck_assert_int_eq(info.n_tokens, 1);
    mt_assert_check(m);
    ck_assert_int_eq(mt_held_pages(m, 1), mt_window_pages_needed(17, ps, W, 0));
    free_all(&c, m, b, be);
}
END_TEST

/* Rollback (speculative decoding) within window_slack always works; a cut
 * that needs a dropped page fails with LLMEM_E_STATE and changes nothing;
 * seq_cp of a prefix that lost its window likewise. */
START_TEST(test_rollback_and_copy_limits)
{
    int32_t ps = 4, W = 6, R = 3;
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv_window(be, ps, 32, 3, W, R, false);
    attn_ctx c = ctx_new(be, 0, W);
    mt_add(b, 0, 0, 30, 100, true);
    run_ok(m, b, 512, &c);
    for (int32_t round = 0; round < 5; round++) { /* draft 3, reject 1..3, accept the rest */
        int32_t len = llmem_memory_seq_len(m, 0);
        mt_add(b, 0, len, R, 500 + 10 * round, true);
        run_ok(m, b, 512, &c);
        int32_t reject = 1 + round % R;
        ck_assert_int_eq(llmem_memory_seq_rm(m, 0, len + R - reject, -1), LLMEM_OK);
        mt_assert_check(m);
        ck_assert_int_eq(llmem_memory_seq_len(m, 0), len + R - reject);
        mt_add(b, 0, len + R - reject, 1, 600 + round, true); /* the correction */
        run_ok(m, b, 512, &c);
    }
    int32_t len = llmem_memory_seq_len(m, 0);
    /* a cut within the slack works on a copy; a deeper one needs dropped pages */
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, len - R, -1), LLMEM_OK);
    mt_add(b, 1, len - R, 1, 700, true);
    run_ok(m, b, 512, &c);
    mt_snap before, after;
    mt_snapshot(m, &before);
    int32_t deep = len - R - W - ps; /* its next query reads a dropped page */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, deep, -1), LLMEM_E_STATE);
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 2, 0, deep), LLMEM_E_STATE);
    ck_assert_int_eq(llmem_memory_seq_rm(m, -1, deep, -1), LLMEM_E_STATE);
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
    mt_assert_check(m);
    /* removing a whole sequence always works and frees its pages */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_seq_len(m, 0), 0);
    ck_assert_int_eq(llmem_memory_seq_keep(m, 1), LLMEM_OK);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    ck_assert_int_eq(st.pages_used, mt_held_pages(m, 1));
    mt_assert_check(m);
    /* no K-shift on a windowed cache */
    ck_assert_int_eq(llmem_memory_seq_add(m, 1, 0, -1, 2), LLMEM_E_UNSUPPORTED);
    free_all(&c, m, b, be);
}
END_TEST

/* State I/O: a windowed sequence reads back with its window only, and
 * attention after the read equals the float64 reference. */
START_TEST(test_state_roundtrip)
{
    int32_t ps = 3, W = 7;
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv_window(be, ps, 32, 2, W, 1, false);
    attn_ctx c = ctx_new(be, 0, W);
    mt_add(b, 0, 0, 25, 100, true);
    run_ok(m, b, 512, &c);
    size_t size = 0, written = 0;
    ck_assert_int_eq(llmem_memory_state_size(m, -1, &size), LLMEM_OK);
    void *buf = malloc(size);
    ck_assert_int_eq(llmem_memory_state_write(m, -1, buf, size, &written), LLMEM_OK);
    ck_assert_uint_eq(written, size);
    llmem_memory *m2 = mt_kv_window(be, ps, 32, 2, W, 1, false);
    char err[256] = "";
    ck_assert_msg(llmem_memory_state_read(m2, -1, buf, size, err, sizeof err) == LLMEM_OK, "%s",
                  err);
    mt_assert_check(m2);
    ck_assert_int_eq(mt_held_pages(m2, 0), mt_window_pages_needed(25, ps, W, 1));
    ck_assert_int_eq(llmem_memory_seq_len(m2, 0), 25);
    mt_add(b, 0, 25, 4, 900, true);
    run_ok(m2, b, 2, &c);
    /* a full cache refuses it (it would take the lost rows as keys), and
     * stays as it was */
    llmem_memory *full = mt_kv(be, ps, 16, 2, false, false);
    mt_add(b, 1, 0, 5, 40, true);
    ck_assert_int_eq(mt_run(full, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_snap before, after;
    mt_snapshot(full, &before);
    ck_assert_int_eq(llmem_memory_state_read(full, -1, buf, size, err, sizeof err),
                     LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "sliding window"));
    mt_snapshot(full, &after);
    mt_assert_same(&before, &after);
    mt_assert_check(full);
    /* a cache with a wider window too (its queries would see lost rows) */
    llmem_memory *wide = mt_kv_window(be, ps, 32, 2, W + 4, 1, false);
    ck_assert_int_eq(llmem_memory_state_read(wide, -1, buf, size, err, sizeof err),
                     LLMEM_E_INVALID);
    llmem_memory_destroy(wide);
    free(buf);
    llmem_memory_destroy(full);
    llmem_memory_destroy(m2);
    free_all(&c, m, b, be);
}
END_TEST

/* The generic hybrid composes a windowed and a full KV cache per layer
 * (layers 0, 1, 3 windowed, layer 2 full, as Gemma-3's pattern): each
 * layer's view attends with its own window; only the windowed child
 * frees pages. */
START_TEST(test_hybrid_window_and_full)
{
    int32_t ps = 4, W = 5;
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_kv_heads = 1;
    p.head_dim = 2;
    p.dtype = LLMEM_DTYPE_F32;
    p.page_size = ps;
    p.n_pages = 16;
    p.n_seq_max = 1;
    p.poison = true;
    llmem_memory *ch[2] = {NULL, NULL}, *h = NULL;
    char err[256] = "";
    p.n_layers = 3;
    p.window = W;
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &ch[0], err, sizeof err), LLMEM_OK);
    p.n_layers = 1;
    p.window = 0;
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &ch[1], err, sizeof err), LLMEM_OK);
    const int32_t map[4] = {0, 0, 1, 0};
    ck_assert_msg(llmem_hybrid_create(ch, 2, map, 4, &h, err, sizeof err) == LLMEM_OK, "%s", err);
    ck_assert_int_eq(llmem_kv_cache_window(h), -1);
    ck_assert_int_eq(llmem_kv_cache_window(llmem_memory_child(h, 0)), W);
    ck_assert_int_eq(llmem_kv_cache_window(llmem_memory_child(h, 1)), 0);
    ck_assert(!llmem_memory_can_shift(h));
    attn_ctx cw = ctx_new(be, 3, W), cf = ctx_new(be, 2, 0);
    for (int32_t step = 0; step < 12; step++) {
        int32_t len = llmem_memory_seq_len(h, 0);
        mt_add(b, 0, len, step == 0 ? 9 : 1, 100 + len, true);
        llmem_plan *plan = NULL;
        ck_assert_int_eq(llmem_memory_plan(h, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512,
                                           &plan, err, sizeof err),
                         LLMEM_OK);
        const llmem_ubatch *ub = NULL;
        ck_assert_int_eq(llmem_memory_apply(h, plan, 0, &ub), LLMEM_OK);
        check_attention(h, ub, &cw); /* layer 3: windowed child */
        check_attention(h, ub, &cf); /* layer 2: full child */
        ck_assert_int_eq(llmem_memory_commit(h, plan, 0), LLMEM_OK);
        llmem_memory_release(h, plan);
        llmem_batch_buf_clear(b);
        mt_assert_check(h);
    }
    int32_t len = llmem_memory_seq_len(h, 0);
    ck_assert_int_eq(len, 20);
    ck_assert_int_eq(mt_held_pages(llmem_memory_child(h, 0), 0), mt_window_pages_needed(len, ps, W, 0));
    ck_assert_int_eq(mt_held_pages(llmem_memory_child(h, 1), 0), 5);
    llmem_buffer_free(cw.buf);
    llmem_buffer_free(cf.buf);
    mt_free(h, b, be);
}
END_TEST

START_TEST(test_create_errors)
{
    llmem_backend *be = mt_cpu();
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = 2;
    p.n_pages = 4;
    llmem_memory *m = NULL;
    char err[256] = "";
    p.window = -1;
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(err, "window"));
    p.window = 0;
    p.window_slack = 2; /* slack without a window */
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_E_INVALID);
    p.window = 4;
    p.window_slack = -1;
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(m);
    ck_assert_int_eq(llmem_kv_cache_window(NULL), -1);
    llmem_backend_close(be);
}
END_TEST

/* ---- randomized: every operation against the brute force ------------------------ */

/* Whether the first k tokens of seq still hold every key their next query
 * sees, and the page that query writes its key into when the k-th token
 * left it partly filled (brute force over the page table: an entry -1 left
 * the window). */
static bool window_intact(llmem_memory *m, int32_t seq, int32_t k, int32_t ps, int32_t W,
                          int32_t lost)
{
    int32_t pt[512];
    int32_t n = llmem_kv_cache_page_table(m, seq, pt, 512);
    for (int32_t j = k + 1 - W > 0 ? k + 1 - W : 0; j < k; j++)
        if (j / ps >= n || pt[j / ps] < 0 || j < lost)
            return false;
    return k % ps == 0 || (k / ps < n && pt[k / ps] >= 0);
}

/* Random appends (several sequences, several ubatch sizes, prefix hits),
 * rollbacks within and past the slack, copies of whole sequences and of
 * prefixes, removals and state round trips on a windowed cache in poison
 * mode. After each step: the invariant checker; every status the brute
 * force predicts; the exact held-page count after a commit; the pool's use
 * equal to the distinct pages of all tables; attention through the views
 * equal to the float64 windowed reference (check_attention). Seed:
 * LLMEM_TEST_SEED; to debug one case, SWA_ONLY=<loop index> runs only it
 * and SWA_TRACE=1 prints every step. */
START_TEST(test_randomized)
{
    if (getenv("SWA_ONLY") && atoi(getenv("SWA_ONLY")) != _i)
        return;
    ref64_rng r = ref64_rng_make(ref64_seed(), 1700 + (uint64_t)_i);
    static const int32_t ws[] = {1, 3, 5, 8}, pss[] = {1, 3, 4, 5};
    int32_t W = ws[ref64_int(&r, 0, 3)], ps = pss[ref64_int(&r, 0, 3)];
    int32_t slack = ref64_int(&r, 0, 3), NS = 4;
    bool prefix = ref64_int(&r, 0, 1);
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = mt_batch_new();
    llmem_memory *m = mt_kv_window(be, ps, 96, NS, W, slack, prefix);
    attn_ctx c = ctx_new(be, 0, W);
    int32_t len[4] = {0, 0, 0, 0};
    int32_t lost[4] = {0, 0, 0, 0}; /* leading tokens whose keys left (observed) */
    char err[256] = "";
    for (int32_t step = 0; step < 150; step++) {
        int32_t op = ref64_int(&r, 0, 9), s = ref64_int(&r, 0, NS - 1);
        if (getenv("SWA_TRACE"))
            fprintf(stderr, "step %d op %d seq %d lens %d %d %d %d (W %d ps %d slack %d)\n",
                    step, op, s, len[0], len[1], len[2], len[3], W, ps, slack);
        mt_snap before, after;
        mt_snapshot(m, &before);
        if (op <= 4) { /* append to one or two sequences */
            int32_t s2 = op == 4 ? (s + 1) % NS : -1, n = ref64_int(&r, 1, 12);
            for (int32_t q = s; q >= 0; q = q == s ? s2 : -1) {
                if (len[q] + n > 200)
                    continue;
                /* tokens depend on the position only: sequences share prefixes */
                for (int32_t i = 0; i < n; i++)
                    ck_assert_int_eq(llmem_batch_buf_add(b, (len[q] + i) * 13 % 97, len[q] + i,
                                                         &q, 1, i == n - 1),
                                     LLMEM_OK);
            }
            static const int32_t ubs[] = {1, 3, 512};
            const llmem_batch *bt = llmem_batch_buf_get(b);
            if (bt->n_tokens > 0) {
                llmem_status st = mt_run(m, bt, ubs[ref64_int(&r, 0, 2)], check_attention, &c,
                                         NULL);
                if (st == LLMEM_E_NO_SPACE) {
                    mt_snapshot(m, &after);
                    mt_assert_same(&before, &after);
                } else {
                    ck_assert_int_eq(st, LLMEM_OK);
                    for (int32_t q = s; q >= 0; q = q == s ? s2 : -1)
                        if (len[q] + n <= 200) {
                            len[q] += n;
                            /* at least the window (the slack too unless a
                             * rollback or a copy took pages of it), at most
                             * what the contract keeps */
                            ck_assert_int_le(mt_held_pages(m, q), pages_kept_max(len[q], ps, W, slack));
                            ck_assert_int_ge(mt_held_pages(m, q), mt_window_pages_needed(len[q], ps, W, 0));
                        }
                }
            }
            llmem_batch_buf_clear(b);
        } else if (op <= 6) { /* rollback by 1 .. slack + 3 */
            int32_t k = len[s] - ref64_int(&r, 1, slack + 3);
            k = k > 0 ? k : 0;
            bool ok = k == 0 || window_intact(m, s, k, ps, W, lost[s]);
            ck_assert_int_eq(llmem_memory_seq_rm(m, s, k, -1), ok ? LLMEM_OK : LLMEM_E_STATE);
            if (ok) {
                len[s] = len[s] < k ? len[s] : k;
                lost[s] = len[s] ? lost[s] : 0;
            } else {
                mt_snapshot(m, &after);
                mt_assert_same(&before, &after);
            }
        } else if (op == 7) { /* copy a whole sequence or a prefix of it */
            int32_t d = (s + ref64_int(&r, 1, NS - 1)) % NS;
            int32_t k = ref64_int(&r, 0, 1) ? len[s] : ref64_int(&r, 0, len[s]);
            bool ok = k == 0 || window_intact(m, s, k, ps, W, lost[s]);
            ck_assert_int_eq(llmem_memory_seq_cp(m, s, d, 0, k), ok ? LLMEM_OK : LLMEM_E_STATE);
            if (ok) {
                len[d] = k;
                lost[d] = k ? lost[s] : 0;
            }
        } else if (op == 8) {
            ck_assert_int_eq(llmem_memory_seq_rm(m, s, -1, -1), LLMEM_OK);
            len[s] = lost[s] = 0;
        } else { /* state round trip into a fresh cache, which replaces m */
            size_t size = 0, w = 0;
            ck_assert_int_eq(llmem_memory_state_size(m, -1, &size), LLMEM_OK);
            void *buf = malloc(size);
            ck_assert_int_eq(llmem_memory_state_write(m, -1, buf, size, &w), LLMEM_OK);
            llmem_memory *m2 = mt_kv_window(be, ps, 96, NS, W, slack, prefix);
            ck_assert_msg(llmem_memory_state_read(m2, -1, buf, size, err, sizeof err) ==
                              LLMEM_OK, "%s", err);
            free(buf);
            for (int32_t q = 0; q < NS; q++) {
                ck_assert_int_eq(llmem_memory_seq_len(m2, q), len[q]);
                ck_assert_int_le(mt_held_pages(m2, q), pages_kept_max(len[q], ps, W, slack));
                ck_assert_int_ge(mt_held_pages(m2, q), mt_window_pages_needed(len[q], ps, W, 0));
            }
            llmem_memory_destroy(m);
            m = m2;
        }
        mt_assert_check(m);
        /* the pool holds exactly the pages the tables name (no prefix cache:
         * a dropped page is free at once) */
        int32_t seen[96] = {0}, distinct = 0;
        for (int32_t q = 0; q < NS; q++) {
            ck_assert_int_eq(llmem_memory_seq_len(m, q), len[q]);
            ck_assert(len[q] == 0 || window_intact(m, q, len[q], ps, W, lost[q]));
            int32_t pt[512];
            int32_t n = llmem_kv_cache_page_table(m, q, pt, 512);
            for (int32_t j = 0; j < n; j++)
                if (pt[j] >= 0 && !seen[pt[j]]++)
                    distinct++;
            int32_t d = 0; /* pages that left the window: their keys are lost */
            while (d < n && pt[d] < 0)
                d++;
            lost[q] = d * ps > lost[q] ? d * ps : lost[q];
        }
        llmem_memory_stats st;
        llmem_memory_get_stats(m, &st);
        ck_assert_int_eq(st.pages_used, distinct);
    }
    free_all(&c, m, b, be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("swa");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_pages_freed_as_window_slides, 0, 12);
    tcase_add_test(tc, test_shared_pages_kept);
    tcase_add_test(tc, test_prefix_hit_after_slide);
    tcase_add_test(tc, test_rollback_and_copy_limits);
    tcase_add_test(tc, test_state_roundtrip);
    tcase_add_test(tc, test_hybrid_window_and_full);
    tcase_add_test(tc, test_create_errors);
    tcase_add_loop_test(tc, test_randomized, 0, 16);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}
