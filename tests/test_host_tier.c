// ctest-labels: core
/* Host tier of the KV prefix cache (issue 13 item 3): published pages
 * evicted from a small device pool spill to host memory, are found again by
 * their content-keyed chain and come back with identical K/V bytes; the
 * tier evicts LRU within its byte budget; a plan that cannot fit changes
 * nothing; poison mode gives the same results. Expected page counts and
 * values are derived by hand in each step, never from the cache. */
#include "support/run.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/model.h"
#include "llmem/runtime.h"
#include "support/memtest.h"

/* The backend under test: $LLMEM_TEST_HOST_BACKEND (e.g. cuda, for the
 * pinned memory and asynchronous copies), default cpu. */
static llmem_backend *tier_backend(void)
{
    const char *name = getenv("LLMEM_TEST_HOST_BACKEND");
    llmem_backend *be = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_backend_open(name && *name ? name : "cpu", -1, &be, err, sizeof err) ==
                      LLMEM_OK,
                  "%s", err);
    return be;
}

static bool refuse_all(size_t size, void *ctx)
{
    (void)size;
    (void)ctx;
    return false;
}

/* llmem_backend_host_alloc and the _async copies (issue 13 item 3) on the
 * backend under test: a pattern written on the host goes up and comes back
 * through copies queued in order (upload, device copy, download, then a
 * fill of the device source queued after the download, which must not
 * reach the downloaded bytes) and a synchronize (the fence); bad arguments
 * give LLMEM_E_INVALID; the alloc hook refuses host memory as it refuses
 * buffers. Asynchronous exactly on cuda. Expected bytes: the test's own
 * pattern. */
START_TEST(test_host_copies)
{
    llmem_backend *be = tier_backend();
    llmem_backend_info info;
    ck_assert_int_eq(llmem_backend_get_info(be, &info), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_async_copies(be), strcmp(info.backend, "cuda") == 0);
    const size_t n = (size_t)1 << 20;
    unsigned char *a = NULL, *back = NULL;
    ck_assert_int_eq(llmem_backend_host_alloc(be, n, (void **)&a), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_host_alloc(be, n, (void **)&back), LLMEM_OK);
    for (size_t i = 0; i < n; i++) {
        a[i] = (unsigned char)((i * 2654435761u) >> 13);
        back[i] = 0;
    }
    llmem_buffer *d1 = NULL, *d2 = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, n, &d1), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_alloc(be, n, &d2), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload_async(d1, 0, a, n), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_copy(d2, 0, d1, 0, n), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_download_async(d2, 0, back, n), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_fill(d2, 0, n, 0xffffffffu), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_synchronize(be), LLMEM_OK);
    ck_assert_msg(memcmp(a, back, n) == 0, "bytes changed on the way up and back");
    /* a part at an offset */
    ck_assert_int_eq(llmem_buffer_download_async(d1, 4096, back, 100), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_synchronize(be), LLMEM_OK);
    ck_assert_int_eq(memcmp(a + 4096, back, 100), 0);
    /* errors */
    void *p = a;
    ck_assert_int_eq(llmem_backend_host_alloc(be, 0, &p), LLMEM_E_INVALID);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(llmem_backend_host_alloc(be, 16, NULL), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_upload_async(d1, n - 8, a, 16), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_download_async(d1, 0, NULL, 16), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_buffer_upload_async(NULL, 0, a, 16), LLMEM_E_INVALID);
    llmem_backend_set_alloc_hook(be, refuse_all, NULL);
    p = a;
    ck_assert_int_eq(llmem_backend_host_alloc(be, 64, &p), LLMEM_E_NO_MEMORY);
    ck_assert_ptr_null(p);
    llmem_backend_set_alloc_hook(be, NULL, NULL);
    llmem_backend_host_free(be, NULL);
    llmem_backend_host_free(be, a);
    llmem_backend_host_free(be, back);
    llmem_buffer_free(d1);
    llmem_buffer_free(d2);
    llmem_backend_close(be);
}
END_TEST

/* 1 layer, 1 head, head_dim 2, f32, page 4: a page is 4 * 8 = 32 bytes of
 * K and 32 of V, one host entry 64 bytes. */
static llmem_memory *kv_tiered(llmem_backend *be, int32_t n_pages, int64_t host_bytes, bool poison)
{
    llmem_kv_cache_params p = mt_kv_params(4, n_pages, 2);
    p.poison = poison;
    p.host_tier_bytes = host_bytes;
    return mt_kv_create(be, &p);
}

/* K = (token, 1), V = (-2 * token, 0.5) in every stored slot. */
static void write_kv(llmem_memory *mem, const llmem_ubatch *ub, void *c)
{
    (void)c;
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    for (int32_t j = 0; j < llmem_view_kv(&v)->store_slot.n; j++) {
        float t = (float)ub->token[llmem_view_kv(&v)->store_tok.host[j]];
        float k[2] = {t, 1.0f}, vv[2] = {-2.0f * t, 0.5f};
        size_t off = (size_t)llmem_view_kv(&v)->store_slot.host[j] * 8;
        ck_assert_int_eq(llmem_buffer_upload(llmem_view_kv(&v)->k, off, k, 8), LLMEM_OK);
        ck_assert_int_eq(llmem_buffer_upload(llmem_view_kv(&v)->v, off, vv, 8), LLMEM_OK);
    }
}

/* Runs a prompt of n tokens tok0.. in seq; returns the tokens served by the
 * prefix cache. */
static int32_t prompt(llmem_memory *m, int32_t seq, int32_t n, int32_t tok0)
{
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(64, 2, &b), LLMEM_OK);
    mt_add(b, seq, 0, n, tok0, true);
    llmem_plan_info info;
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_kv, NULL, &info), LLMEM_OK);
    llmem_batch_buf_destroy(b);
    mt_assert_check(m);
    return info.n_tokens_cached;
}

/* The state stream of seq: tokens, positions, and every slot's K and V. */
static unsigned char *state_of(llmem_memory *m, int32_t seq, size_t *sz)
{
    ck_assert_int_eq(llmem_memory_state_size(m, seq, sz), LLMEM_OK);
    unsigned char *buf = malloc(*sz);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(llmem_memory_state_write(m, seq, buf, *sz, NULL), LLMEM_OK);
    return buf;
}

static llmem_memory_stats stats_of(llmem_memory *m)
{
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    return st;
}

START_TEST(test_host_tier_roundtrip)
{
    bool poison = _i != 0;
    llmem_backend *be = tier_backend();
    /* 4 device pages, a host budget of 3 entries (and a bit, not a 4th) */
    llmem_memory *m = kv_tiered(be, 4, 3 * 64 + 40, poison);
    /* prompt A: 9 tokens = 2 full pages + 1 partial */
    ck_assert_int_eq(prompt(m, 0, 9, 100), 0);
    size_t sz_a = 0;
    unsigned char *state_a = state_of(m, 0, &sz_a);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    llmem_memory_stats st = stats_of(m);
    ck_assert_int_eq(st.pages_cached, 2);
    ck_assert_int_eq(st.host_tier_pages, 0);
    /* prompt B: 16 tokens = 4 pages, the whole pool: A's 2 pages spill */
    ck_assert_int_eq(prompt(m, 0, 16, 500), 0);
    st = stats_of(m);
    ck_assert_int_eq(st.prefix_evictions, 2);
    ck_assert_int_eq(st.host_tier_pages, 2);
    ck_assert_int_eq(st.host_tier_bytes, 128);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK); /* B: 4 cached */

    /* a plan that cannot fit changes nothing: A (3 pages, 2 from the host)
     * and 9 more tokens in seq 1 (3 pages) need 6 of 4 */
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(64, 2, &b), LLMEM_OK);
    mt_add(b, 0, 0, 9, 100, true);
    mt_add(b, 1, 0, 9, 900, true);
    mt_snap before, after;
    mt_snapshot(m, &before);
    llmem_plan *plan = NULL;
    char err[256];
    ck_assert_int_eq(llmem_memory_plan(m, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 512, &plan,
                                       err, sizeof err),
                     LLMEM_E_NO_SPACE);
    mt_snapshot(m, &after);
    mt_assert_same(&before, &after);
    ck_assert_int_eq(after.stats.host_tier_pages, 2);
    ck_assert_int_eq(after.stats.host_tier_hits, 0);
    llmem_batch_buf_destroy(b);
    mt_assert_check(m);

    /* A again: its 2 full pages come back from the host (8 tokens, no
     * compute); 3 pages taken evict 3 of B's, which spill in turn */
    ck_assert_int_eq(prompt(m, 0, 9, 100), 8);
    st = stats_of(m);
    ck_assert_int_eq(st.host_tier_hits, 2);
    ck_assert_int_eq(st.host_tier_pages, 3); /* A's entries left, B's 3 came in */
    ck_assert_int_eq(st.prefix_hit_tokens, 8);
    size_t sz_a2 = 0;
    unsigned char *state_a2 = state_of(m, 0, &sz_a2);
    ck_assert_uint_eq(sz_a, sz_a2);
    ck_assert_int_eq(memcmp(state_a, state_a2, sz_a), 0); /* identical K/V bytes */
    free(state_a2);

    /* budget: drop A (cached A0, A1 after B's last page), then C takes 4
     * pages with 1 free: B0, A1, A0 spill into a full tier, which evicts
     * its 3 oldest entries (B's) */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    ck_assert_int_eq(prompt(m, 0, 16, 700), 0);
    st = stats_of(m);
    ck_assert_int_eq(st.host_tier_pages, 3);
    ck_assert_int_eq(st.host_tier_bytes, 192);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    /* A: both pages from the host again, same bytes; their copies evict
     * C's pages, whose first spill takes the tier's oldest entry, B0 */
    ck_assert_int_eq(prompt(m, 0, 9, 100), 8);
    state_a2 = state_of(m, 0, &sz_a2);
    ck_assert_int_eq(memcmp(state_a, state_a2, sz_a), 0);
    free(state_a2);
    free(state_a);
    st = stats_of(m);
    ck_assert_int_eq(st.host_tier_hits, 4);
    ck_assert_int_eq(st.host_tier_pages, 3); /* 3 of C's pages */
    /* B: nothing left anywhere */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    ck_assert_int_eq(prompt(m, 1, 16, 500), 0);
    ck_assert_int_eq(stats_of(m).host_tier_hits, 4);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 1, -1, -1), LLMEM_OK);

    /* clear drops the tier too */
    ck_assert_int_eq(llmem_memory_clear(m, true), LLMEM_OK);
    ck_assert_int_eq(stats_of(m).host_tier_pages, 0);
    ck_assert_int_eq(prompt(m, 0, 9, 100), 0);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

/* Two sequences of one plan hit the same host page: it is restored once and
 * shared; a tier of 0 bytes (off) never holds a page. */
START_TEST(test_host_tier_shared_hit)
{
    llmem_backend *be = tier_backend();
    llmem_memory *m = kv_tiered(be, 4, 1 << 20, false);
    ck_assert_int_eq(prompt(m, 0, 5, 100), 0); /* 1 full page */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    ck_assert_int_eq(prompt(m, 0, 16, 500), 0); /* evicts it */
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    ck_assert_int_eq(stats_of(m).host_tier_pages, 1);
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(64, 2, &b), LLMEM_OK);
    mt_add(b, 0, 0, 5, 100, true);
    mt_add(b, 1, 0, 6, 100, true);
    llmem_plan_info info;
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, write_kv, NULL, &info), LLMEM_OK);
    ck_assert_int_eq(info.n_tokens_cached, 8);
    int32_t a[4], c[4];
    ck_assert_int_eq(llmem_kv_cache_page_table(m, 0, a, 4), 2);
    ck_assert_int_eq(llmem_kv_cache_page_table(m, 1, c, 4), 2);
    ck_assert_int_eq(a[0], c[0]);
    llmem_memory_stats st = stats_of(m);
    ck_assert_int_eq(st.host_tier_hits, 1);
    ck_assert_int_eq(st.pages_used, 3);
    mt_assert_check(m);
    llmem_batch_buf_destroy(b);
    llmem_memory_destroy(m);

    m = kv_tiered(be, 4, 0, false);
    ck_assert_int_eq(prompt(m, 0, 5, 100), 0);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    ck_assert_int_eq(prompt(m, 0, 16, 500), 0);
    ck_assert_int_eq(llmem_memory_seq_rm(m, 0, -1, -1), LLMEM_OK);
    ck_assert_int_eq(stats_of(m).host_tier_pages, 0);
    ck_assert_int_eq(prompt(m, 0, 5, 100), 0);
    llmem_memory_destroy(m);
    /* a negative budget is refused */
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_layers = p.n_kv_heads = p.n_pages = 1;
    p.head_dim = 2;
    p.host_tier_bytes = -1;
    char err[128] = "";
    m = NULL;
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(err, "host_tier_bytes"));
    llmem_backend_close(be);
}
END_TEST

/* The llama fixture on cpu, page 4, n_pages pages, one sequence; the host
 * tier through LLMEM_HOST_TIER_MB (how the runtime turns it on). */
static llmem_model *load_llama(llmem_backend *be, int32_t n_pages, bool tier)
{
    char dir[1024], err[256] = "";
    snprintf(dir, sizeof dir, "%s/tests/fixtures/llama", test_source_dir());
    llmem_model_params p = llmem_model_default_params();
    p.n_seq_max = 1;
    p.n_ctx = 16;
    p.page_size = 4;
    p.n_pages = n_pages;
    if (tier)
        setenv("LLMEM_HOST_TIER_MB", "1", 1);
    llmem_model *m = NULL;
    llmem_status st = llmem_model_load(dir, be, &p, &m, err, sizeof err);
    unsetenv("LLMEM_HOST_TIER_MB");
    ck_assert_msg(st == LLMEM_OK, "%s", err);
    return m;
}

/* Logits of the last of n tokens tok(i) = (i * 7 + tok0) % n_vocab. */
static void run_logits(llmem_model *m, int32_t n, int32_t tok0, float *out)
{
    int32_t tok[16], pos[16], seq = 0;
    const int32_t *seqp[16];
    int8_t outf[16];
    int32_t v = llmem_model_n_vocab(m), n_out = 0;
    for (int32_t i = 0; i < n; i++) {
        tok[i] = (i * 7 + tok0) % v;
        pos[i] = i;
        seqp[i] = &seq;
        outf[i] = i == n - 1;
    }
    llmem_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = seqp, .output = outf};
    char err[256] = "";
    ck_assert_msg(llmem_model_decode(m, &b, false, out, 1, &n_out, err, sizeof err) == LLMEM_OK,
                  "%s", err);
    ck_assert_int_eq(n_out, 1);
    ck_assert_int_eq(llmem_memory_seq_rm(llmem_model_memory(m), 0, -1, -1), LLMEM_OK);
}

/* Model outputs: a prompt whose prefix was evicted to the host tier (pool
 * of 4 pages) gives the same logits as the same prompt whose prefix stayed
 * on the device (pool of 8 pages, no tier): both compute only the last
 * token over the same cached K/V. */
START_TEST(test_host_tier_model_outputs)
{
    llmem_backend *be = tier_backend();
    llmem_model *mh = load_llama(be, 4, true), *md = load_llama(be, 8, false);
    int32_t v = llmem_model_n_vocab(mh);
    float *lh = malloc((size_t)v * sizeof *lh), *ld = malloc((size_t)v * sizeof *ld);
    ck_assert(lh && ld);
    llmem_model *ms[2] = {mh, md};
    for (int32_t k = 0; k < 2; k++) {
        run_logits(ms[k], 9, 3, k ? ld : lh);  /* A: 2 pages published */
        run_logits(ms[k], 16, 11, k ? ld : lh); /* B: 4 pages; evicts A in mh only */
        run_logits(ms[k], 9, 3, k ? ld : lh);  /* A again: 8 tokens cached */
    }
    for (int32_t i = 0; i < v; i++)
        ck_assert_msg(memcmp(&lh[i], &ld[i], sizeof *lh) == 0, "logit %d: %g vs %g", i,
                      (double)lh[i], (double)ld[i]);
    llmem_memory_stats sh, sd;
    llmem_memory_get_stats(llmem_model_memory(mh), &sh);
    llmem_memory_get_stats(llmem_model_memory(md), &sd);
    ck_assert_int_eq(sh.prefix_hit_tokens, 8);
    ck_assert_int_eq(sd.prefix_hit_tokens, 8);
    ck_assert_int_eq(sh.host_tier_hits, 2);
    ck_assert_int_eq(sd.host_tier_hits, 0);
    free(lh);
    free(ld);
    llmem_model_free(mh);
    llmem_model_free(md);
    llmem_backend_close(be);
}
END_TEST

/* Prompt of family f, variant v, n tokens: 8 tokens shared by the family,
 * then the variant's. */
static void add_prompt(llmem_batch_buf *b, int32_t seq, int32_t f, int32_t v, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        int32_t t = i < 8 ? f * 1000 + i : f * 1000 + v * 100 + i;
        llmem_batch_buf_add(b, t, i, &seq, 1, i == n - 1);
    }
}

/* Randomized: prompts of 3 families x 3 variants, 5..16 tokens, in 2
 * sequences of a 6-page pool with a 4-page host tier, with removals. After
 * every prompt the sequence's state stream (tokens, positions, every
 * slot's K and V) equals the stream of the same prompt written into a
 * cache without prefix caching (the reference: K/V depend only on token
 * ids, so any hit, device or host, must give the same bytes). A plan that
 * does not fit changes nothing. The invariant checker runs every step. */
START_TEST(test_host_tier_random)
{
    bool poison = _i != 0;
    llmem_backend *be = tier_backend();
    llmem_memory *m = kv_tiered(be, 6, 4 * 64, poison);
    llmem_memory *ref = mt_kv(be, 4, 8, 2, false, false);
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(64, 2, &b), LLMEM_OK);
    uint32_t rng = 12345u + (uint32_t)_i;
    int64_t hits = 0;
    for (int32_t it = 0; it < 300; it++) {
        rng = rng * 1664525u + 1013904223u;
        int32_t seq = (int32_t)(rng >> 31);
        if ((rng >> 8) % 4 == 0) {
            ck_assert_int_eq(llmem_memory_seq_rm(m, seq, -1, -1), LLMEM_OK);
            continue;
        }
        if (llmem_memory_seq_len(m, seq) > 0)
            ck_assert_int_eq(llmem_memory_seq_rm(m, seq, -1, -1), LLMEM_OK);
        int32_t f = (int32_t)((rng >> 10) % 3), v = (int32_t)((rng >> 14) % 3);
        int32_t n = 5 + (int32_t)((rng >> 18) % 12);
        llmem_batch_buf_clear(b);
        add_prompt(b, seq, f, v, n);
        mt_snap before, after;
        mt_snapshot(m, &before);
        llmem_plan_info info;
        llmem_status st = mt_run(m, llmem_batch_buf_get(b), 512, write_kv, NULL, &info);
        if (st == LLMEM_E_NO_SPACE) {
            mt_snapshot(m, &after);
            mt_assert_same(&before, &after);
            continue;
        }
        ck_assert_int_eq(st, LLMEM_OK);
        hits += info.n_tokens_cached;
        mt_assert_check(m);
        ck_assert_int_le(stats_of(m).host_tier_pages, 4);
        ck_assert_int_eq(mt_run(ref, llmem_batch_buf_get(b), 512, write_kv, NULL, NULL), LLMEM_OK);
        size_t sa = 0, sb = 0;
        unsigned char *x = state_of(m, seq, &sa), *y = state_of(ref, seq, &sb);
        ck_assert_uint_eq(sa, sb);
        ck_assert_msg(memcmp(x, y, sa) == 0, "iteration %d: K/V differ", it);
        free(x);
        free(y);
        ck_assert_int_eq(llmem_memory_seq_rm(ref, seq, -1, -1), LLMEM_OK);
    }
    llmem_memory_stats st = stats_of(m);
    ck_assert_int_gt(st.host_tier_hits, 0); /* the tier was exercised */
    ck_assert_int_gt(st.prefix_evictions, 0);
    ck_assert_int_eq(st.prefix_hit_tokens, hits);
    llmem_batch_buf_destroy(b);
    llmem_memory_destroy(ref);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("host_tier");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_host_tier_roundtrip, 0, 2); /* 1: poison mode */
    tcase_add_test(tc, test_host_tier_shared_hit);
    tcase_add_test(tc, test_host_copies);
    tcase_add_test(tc, test_host_tier_model_outputs);
    tcase_add_loop_test(tc, test_host_tier_random, 0, 2); /* 1: poison mode */
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? 1 : 0;
}
