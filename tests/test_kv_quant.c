// ctest-labels: core
/* KV cache with scaled 8-bit pools (int8, fp8; issue 17) through the memory
 * interface: a page's per-head scale travels with its page through
 * copy-on-write, prefix sharing and state I/O, and a state stream of a
 * scaled cache loads only into a cache of the same page size.
 *
 * Values written are K = V = token id / 64 + e / 8 for element e (exact in
 * f32); expected values and bounds are computed here (int8: |x| <= 127 *
 * scale, error <= scale / 2 per quantization, a requantization adding
 * another half step). */
#include "support/run.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "support/memtest.h"
#include "support/ops_harness.h"

#define HD 4

static llmem_memory *kv_q(llmem_backend *be, llmem_dtype t, int32_t ps, int32_t n_pages)
{
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.head_dim = HD;
    p.dtype = t;
    p.page_size = ps;
    p.n_pages = n_pages;
    p.n_seq_max = 2;
    p.no_prefix_cache = true;
    llmem_memory *m = NULL;
    char err[256] = "";
    ck_assert_msg(llmem_kv_cache_create(be, &p, &m, err, sizeof err) == LLMEM_OK, "%s", err);
    return m;
}

static double value_of(int32_t tok, int32_t e)
{
    return tok / 64.0 + e / 8.0;
}

/* Stores every ubatch token's K and V through llmem_op_kv_store. */
static void store_tokens(llmem_memory *mem, const llmem_ubatch *ub, void *ctx)
{
    llmem_backend *be = ctx;
    llmem_view v;
    ck_assert_int_eq(llmem_memory_view(mem, 0, &v), LLMEM_OK);
    th_ctx c;
    th_begin(&c, be);
    double *x = th_vec(&c, (int64_t)ub->n_tokens * HD);
    for (int32_t i = 0; i < ub->n_tokens; i++)
        for (int32_t e = 0; e < HD; e++)
            x[i * HD + e] = value_of(ub->token[i], e);
    llmem_tensor k = th_input(&c, LLMEM_DTYPE_F32, 3, ub->n_tokens, 1, HD, x);
    llmem_tensor vv = th_input(&c, LLMEM_DTYPE_F32, 3, ub->n_tokens, 1, HD, x);
    ck_assert_int_eq(llmem_op_kv_store(be, &v, &k, &vv), LLMEM_OK);
    th_end(&c);
}

/* Checks every K/V value of seq (tokens tok0 + i) through a state write:
 * header 16, section 16, geometry 24 (page size included), entry 16, then
 * tokens, positions, shifts, then per K/V each page's rows and scale. */
static void check_seq(llmem_memory *m, int32_t seq, int32_t ps, const int32_t *tok)
{
    size_t sz = 0;
    ck_assert_int_eq(llmem_memory_state_size(m, seq, &sz), LLMEM_OK);
    unsigned char *buf = malloc(sz);
    ck_assert_int_eq(llmem_memory_state_write(m, seq, buf, sz, NULL), LLMEM_OK);
    int32_t len = llmem_memory_seq_len(m, seq);
    size_t off = 16 + 16 + 24 + 16 + (size_t)len * 12;
    for (int kvi = 0; kvi < 2; kvi++)
        for (int32_t j0 = 0; j0 < len; j0 += ps) {
            int32_t n = len - j0 < ps ? len - j0 : ps;
            float sc;
            memcpy(&sc, buf + off + (size_t)n * HD, 4);
            double amax = 0.0;
            for (int32_t i = 0; i < n; i++)
                amax = fmax(amax, value_of(tok[j0 + i], HD - 1));
            /* the scale covers every row of the page (it may be larger:
             * rows written and dropped earlier count) */
            ck_assert_msg(sc >= amax / 127.0 * (1 - 1e-6), "scale %g < %g", (double)sc, amax / 127);
            for (int32_t i = 0; i < n; i++)
                for (int32_t e = 0; e < HD; e++) {
                    double got = (double)(signed char)buf[off + (size_t)i * HD + (size_t)e] * sc;
                    double want = value_of(tok[j0 + i], e);
                    ck_assert_msg(fabs(got - want) <= sc * 1.0 + 1e-7,
                                  "seq %d token %d e %d: %g, want %g (scale %g)", seq, j0 + i,
                                  e, got, want, (double)sc);
                }
            off += (size_t)n * HD + 4;
        }
    free(buf);
}

START_TEST(test_cow_and_state_io)
{
    llmem_backend *be = mt_cpu();
    llmem_batch_buf *b = NULL;
    ck_assert_int_eq(llmem_batch_buf_create(1024, 4, &b), LLMEM_OK);
    llmem_memory *m = kv_q(be, LLMEM_DTYPE_I8, 4, 8);
    int32_t tok0[8], tok1[8];
    mt_add(b, 0, 0, 6, 10, true); /* page 0 full, page 1 holds 2 */
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, store_tokens, be, NULL), LLMEM_OK);
    for (int32_t i = 0; i < 6; i++)
        tok0[i] = tok1[i] = 10 + i;
    check_seq(m, 0, 4, tok0);
    /* seq 1 shares both pages; appending a large value copies page 1 and
     * grows the copy's scale (requantizing its 2 rows), not seq 0's */
    ck_assert_int_eq(llmem_memory_seq_cp(m, 0, 1, -1, -1), LLMEM_OK);
    llmem_batch_buf_clear(b);
    mt_add(b, 1, 6, 1, 200, true);
    ck_assert_int_eq(mt_run(m, llmem_batch_buf_get(b), 512, store_tokens, be, NULL), LLMEM_OK);
    tok1[6] = 200;
    check_seq(m, 0, 4, tok0);
    check_seq(m, 1, 4, tok1);
    /* state I/O: seq 1 read back into seq 0, same bytes */
    size_t sz = 0;
    ck_assert_int_eq(llmem_memory_state_size(m, 1, &sz), LLMEM_OK);
    unsigned char *buf = malloc(sz);
    ck_assert_int_eq(llmem_memory_state_write(m, 1, buf, sz, NULL), LLMEM_OK);
    char err[256] = "";
    ck_assert_int_eq(llmem_memory_state_read(m, 0, buf, sz, err, sizeof err), LLMEM_OK);
    check_seq(m, 0, 4, tok1);
    /* another page size: refused with a reason, the cache unchanged */
    llmem_memory *m2 = kv_q(be, LLMEM_DTYPE_I8, 8, 8);
    ck_assert_int_eq(llmem_memory_state_read(m2, 0, buf, sz, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "page size"));
    ck_assert_int_eq(llmem_memory_seq_len(m2, 0), 0);
    /* and another dtype */
    llmem_memory *m3 = kv_q(be, LLMEM_DTYPE_F8E4M3, 4, 8);
    ck_assert_int_eq(llmem_memory_state_read(m3, 0, buf, sz, err, sizeof err), LLMEM_E_INVALID);
    mt_assert_check(m);
    free(buf);
    llmem_memory_destroy(m3);
    llmem_memory_destroy(m2);
    mt_free(m, b, be);
}
END_TEST

START_TEST(test_create_checks)
{
    llmem_backend *be = mt_cpu();
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_layers = 1;
    p.n_kv_heads = 2;
    p.head_dim = 6; /* not a multiple of 4 */
    p.dtype = LLMEM_DTYPE_I8;
    p.n_pages = 4;
    p.n_seq_max = 1;
    llmem_memory *m = NULL;
    char err[256] = "";
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(err, "multiple of 4"));
    p.head_dim = 8;
    p.page_size = 3;
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &m, err, sizeof err), LLMEM_OK);
    llmem_memory_stats st;
    llmem_memory_get_stats(m, &st);
    /* 2 pools x 4 pages x (3 x 2 x 8 codes -> 48, + 2 scales -> 64 bytes) */
    ck_assert_int_eq(st.bytes_device, 2 * 4 * 64);
    llmem_memory_destroy(m);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_quant");
    TCase *tc = tcase_create("kv_quant");
    tcase_add_test(tc, test_cow_and_state_io);
    tcase_add_test(tc, test_create_checks);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
