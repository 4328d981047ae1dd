#include <stdlib.h>
#include <string.h>

#include "support/memtest.h"
#include "support/run.h"

llmem_backend *mt_cpu(void)
{
    return test_open("cpu");
}

llmem_kv_cache_params mt_kv_params(int32_t page_size, int32_t n_pages, int32_t n_seq_max)
{
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = 2;
    p.dtype = LLMEM_DTYPE_F32;
    p.page_size = page_size;
    p.n_pages = n_pages;
    p.n_seq_max = n_seq_max;
    p.poison = true;
    return p;
}

llmem_memory *mt_kv_create(llmem_backend *be, const llmem_kv_cache_params *p)
{
    llmem_memory *m = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_kv_cache_create(be, p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    return m;
}

static llmem_memory *kv(llmem_backend *be, int32_t page_size, int32_t n_pages, int32_t n_seq_max,
                        bool prefix, bool poison, int32_t window, int32_t slack)
{
    llmem_kv_cache_params p = mt_kv_params(page_size, n_pages, n_seq_max);
    p.no_prefix_cache = !prefix;
    p.poison = poison;
    p.window = window;
    p.window_slack = slack;
    return mt_kv_create(be, &p);
}

llmem_memory *mt_kv(llmem_backend *be, int32_t page_size, int32_t n_pages, int32_t n_seq_max,
                    bool prefix, bool poison)
{
    return kv(be, page_size, n_pages, n_seq_max, prefix, poison, 0, 0);
}

llmem_memory *mt_kv_window(llmem_backend *be, int32_t page_size, int32_t n_pages,
                           int32_t n_seq_max, int32_t window, int32_t slack, bool prefix)
{
    return kv(be, page_size, n_pages, n_seq_max, prefix, true, window, slack);
}

int32_t mt_window_pages_needed(int32_t len, int32_t ps, int32_t window, int32_t slack)
{
    int32_t n = 0;
    for (int32_t pg = 0; (int64_t)pg * ps < len; pg++) {
        bool need = false;
        for (int32_t r = 0; r <= slack && !need; r++) {
            int32_t qi = len - r;
            if (qi < 0)
                break;
            need = qi % ps != 0 && pg == qi / ps;
            for (int32_t j = pg * ps; j < (pg + 1) * ps && j < qi && !need; j++)
                need = qi - j < window;
        }
        n += need;
    }
    return n;
}

int32_t mt_held_pages(llmem_memory *m, int32_t seq)
{
    int32_t pt[512];
    int32_t n = llmem_kv_cache_page_table(m, seq, pt, 512), h = 0;
    ck_assert_int_le(n, 512);
    for (int32_t i = 0; i < n; i++)
        h += pt[i] >= 0;
    return h;
}

llmem_batch_buf *mt_batch_new(void)
{
    return mt_batch(1024, 4);
}

llmem_batch_buf *mt_batch(int32_t n_tokens, int32_t n_seq_id)
{
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(n_tokens, n_seq_id, &b), LLMEM_OK);
    return b;
}

void mt_free(llmem_memory *m, llmem_batch_buf *b, llmem_backend *be)
{
    llmem_memory_destroy(m);
    llmem_batch_buf_destroy(b);
    llmem_backend_close(be);
}

void mt_rs_src_state(const llmem_rs_view *r, int32_t s, bool fresh, float f[4])
{
    if (fresh) {
        ck_assert_int_eq(r->src_slot.host[s], -1);
        return;
    }
    ck_assert_int_ge(r->src_slot.host[s], 0);
    ck_assert_int_eq(
        llmem_buffer_download(r->state[0], (size_t)r->src_slot.host[s] * 16, f, 16),
        LLMEM_OK);
}

llmem_recurrent_params mt_rs_params(int32_t n_seq_max, int32_t n_ckpt)
{
    static const llmem_state_desc d = {.name = "s", .n_dims = 1, .shape = {4},
                                       .dtype = LLMEM_DTYPE_F32};
    static const llmem_state_desc *const states[1] = {&d};
    static const int32_t n_states[1] = {1};
    return (llmem_recurrent_params){.n_layers = 1, .n_states = n_states, .states = states,
                                    .n_seq_max = n_seq_max, .n_ckpt = n_ckpt};
}

llmem_memory *mt_rs_create(llmem_backend *be, const llmem_recurrent_params *p)
{
    llmem_memory *m = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_recurrent_create(be, p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    return m;
}

llmem_memory *mt_rs(llmem_backend *be, int32_t n_seq_max, int32_t n_ckpt)
{
    llmem_recurrent_params p = mt_rs_params(n_seq_max, n_ckpt);
    return mt_rs_create(be, &p);
}

llmem_memory *mt_hybrid_rs_kv(llmem_memory *kv, llmem_memory *rs)
{
    llmem_memory *children[2] = {kv, rs}, *h = NULL;
    const int32_t map[2] = {1, 0};
    char err[256] = "";
    ck_assert_msg(llmem_hybrid_create(children, 2, map, 2, &h, err, sizeof err) == LLMEM_OK, "%s",
                  err);
    return h;
}

void mt_add(llmem_batch_buf *b, int32_t seq, int32_t pos0, int32_t n, int32_t tok0, bool out_last)
{
    for (int32_t i = 0; i < n; i++)
        ck_assert_int_eq(llmem_batch_buf_add(b, tok0 + i, pos0 + i, &seq, 1, out_last && i == n - 1),
                         LLMEM_OK);
}

llmem_status mt_run(llmem_memory *mem, const llmem_batch *b, int32_t n_ubatch, mt_ubatch_fn fn,
                    void *ctx, llmem_plan_info *info)
{
    llmem_plan *plan = NULL;
    char err[256] = "";
    llmem_status st = llmem_memory_plan(mem, b, LLMEM_SPLIT_AUTO, n_ubatch, &plan, err, sizeof err);
    if (st != LLMEM_OK)
        return st;
    if (info)
        llmem_plan_get_info(plan, info);
    for (int32_t i = 0; i < llmem_plan_n_ubatch(plan); i++) {
        const llmem_ubatch *ub = NULL;
        ck_assert_int_eq(llmem_memory_apply(mem, plan, i, &ub), LLMEM_OK);
        if (fn)
            fn(mem, ub, ctx);
        ck_assert_int_eq(llmem_memory_commit(mem, plan, i), LLMEM_OK);
    }
    llmem_memory_release(mem, plan);
    return LLMEM_OK;
}

void mt_snapshot(llmem_memory *mem, mt_snap *s)
{
    memset(s, 0, sizeof *s);
    s->n_seq = llmem_memory_n_seq_max(mem);
    ck_assert_int_le(s->n_seq, 16);
    for (int32_t q = 0; q < s->n_seq; q++) {
        s->len[q] = llmem_memory_seq_tokens(mem, q, s->tok[q], 256);
        s->pmin[q] = llmem_memory_seq_pos_min(mem, q);
        s->pmax[q] = llmem_memory_seq_pos_max(mem, q);
    }
    llmem_memory_get_stats(mem, &s->stats);
}

void mt_assert_same(const mt_snap *a, const mt_snap *b)
{
    ck_assert_int_eq(a->n_seq, b->n_seq);
    for (int32_t q = 0; q < a->n_seq; q++) {
        ck_assert_int_eq(a->len[q], b->len[q]);
        ck_assert_int_eq(a->pmin[q], b->pmin[q]);
        ck_assert_int_eq(a->pmax[q], b->pmax[q]);
        ck_assert_mem_eq(a->tok[q], b->tok[q], sizeof a->tok[q]);
    }
    ck_assert_int_eq(a->stats.pages_used, b->stats.pages_used);
    ck_assert_int_eq(a->stats.pages_free, b->stats.pages_free);
    ck_assert_int_eq(a->stats.pages_cached, b->stats.pages_cached);
    ck_assert_int_eq(a->stats.slots_used, b->stats.slots_used);
}

void mt_assert_check(llmem_memory *mem)
{
    char err[256] = "";
    ck_assert_msg(llmem_memory_check(mem, err, sizeof err) == LLMEM_OK, "invariant: %s", err);
}

void mt_expect_tokens(llmem_memory *m, int32_t seq, const int32_t *ref, int32_t n)
{
    int32_t got[128];
    ck_assert_int_eq(llmem_memory_seq_tokens(m, seq, got, 128), n);
    for (int32_t i = 0; i < n; i++)
        ck_assert_int_eq(got[i], ref[i]);
}

/* Copies sequence 0 into sequence `into` by a state write + read (into 2)
 * or seq_cp (into 1). */
static void copy_seq0(llmem_memory *m, bool by_state)
{
    if (!by_state) {
        ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK);
        return;
    }
    char err[256] = "";
    size_t sz;
    ck_assert_int_eq(llmem_memory_state_size(m, 0, &sz), LLMEM_OK);
    unsigned char *buf = malloc(sz);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(llmem_memory_state_write(m, 0, buf, sz, NULL), LLMEM_OK);
    ck_assert_msg(llmem_memory_state_read(m, 2, buf, sz, err, sizeof err) == LLMEM_OK, "%s", err);
    free(buf);
}

void mt_decode_read_back(llmem_memory *m, llmem_batch_buf *b, int32_t ref[3][128], int32_t n[3])
{
    int32_t checks = 0;
    llmem_batch_buf_clear(b);
    for (int32_t s = 0; s < 3; s++) {
        mt_add(b, s, 0, 5, 100 * (s + 1), true);
        for (n[s] = 0; n[s] < 5; n[s]++)
            ref[s][n[s]] = 100 * (s + 1) + n[s];
    }
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    for (int32_t step = 0; step < 40; step++) {
        llmem_batch_buf_clear(b);
        for (int32_t s = 0; s < 3; s++) {
            int32_t tok = 7000 + 1000 * s + 13 * step;
            mt_add(b, s, n[s], 1, tok, true);
            ref[s][n[s]++] = tok;
        }
        ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
        mt_assert_check(m);
        if (step % 5 != 3 && step != 14 && step != 15)
            continue;
        /* each reader of sequence 0 in turn reads it first */
        int32_t first = checks++ % 3;
        if (first == 0)
            mt_expect_tokens(m, 0, ref[0], n[0]);
        copy_seq0(m, first == 2);
        copy_seq0(m, first != 2);
        for (int32_t s = 1; s < 3; s++) {
            memcpy(ref[s], ref[0], (size_t)n[0] * sizeof *ref[0]);
            n[s] = n[0];
        }
        for (int32_t s = 0; s < 3; s++)
            mt_expect_tokens(m, s, ref[s], n[s]);
        mt_assert_check(m);
    }
}

void mt_decode_steps(llmem_memory *m, llmem_batch_buf *b, int32_t *ref, int32_t *n, int32_t tok0,
                     int32_t steps)
{
    for (int32_t step = 0; step < steps; step++) {
        llmem_batch_buf_clear(b);
        mt_add(b, 0, *n, 1, tok0 + step, true);
        ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
        ref[(*n)++] = tok0 + step;
    }
}

void mt_rm_last_and_on(llmem_memory *m, llmem_batch_buf *b, int32_t *ref, int32_t *n, int32_t tok0)
{
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, *n - 1, -1), LLMEM_OK);
    (*n)--;
    mt_decode_steps(m, b, ref, n, tok0, 3);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, *n - 1, -1), LLMEM_OK);
    (*n)--;
    mt_expect_tokens(m, 0, ref, *n);
}

void mt_clear_staged_then_prompt(llmem_memory *m, llmem_batch_buf *b, int32_t n1)
{
    llmem_batch_buf_clear(b);
    mt_add(b, 1, n1, 1, 5000, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_clear(m, false), LLMEM_OK);
    mt_assert_check(m);
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 0, 2, 60, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, NULL, NULL, NULL), LLMEM_OK);
    mt_expect_tokens(m, 1, (const int32_t[]){60, 61}, 2);
    mt_assert_check(m);
}
