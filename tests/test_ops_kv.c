// ctest-labels: core
/* Op conformance suite, part 2b: the KV cache's own ops on pools built by
 * hand: the K-shift (llmem_op_rope_shift: RoPE by a position delta of cached
 * keys, V untouched) and KV page copies (llmem_op_kv_page_copy), against a
 * float64 reference and byte for byte (see test_ops.c for the conventions).
 * Split from test_ops_attention.c, which keeps the store and attention. */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16

/* ---- K-shift ------------------------------------------------------------------------------ */

START_TEST(test_rope_shift)
{
    /* n_kv_heads, head_dim, n_rot, mode */
    static const int32_t shapes[][4] = {{2, 64, 64, 1}, {1, 80, 40, 1}, {3, 128, 128, 0}, {2, 80, 2, 0}};
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (int dt = 0; dt < 3; dt++) {
            llmem_dtype t = (llmem_dtype[]){F32, F16, BF16}[dt];
            int32_t hkv = shapes[s][0], hd = shapes[s][1], n_slots = 48, n_shift = 13;
            llmem_rope_params p = {shapes[s][3] ? LLMEM_ROPE_NEOX : LLMEM_ROPE_NORMAL,
                                   shapes[s][2], 10000.0f, s == 2 ? 0.5f : 1.0f};
            ref64_rng r = ref64_rng_make(ref64_seed(), 3000 + s * 4 + dt);
            th_ctx h;
            th_begin(&h, NULL);
            int64_t n = (int64_t)n_slots * hkv * hd, row = (int64_t)hkv * hd;
            double *k = th_alloc(&h, (size_t)n * sizeof *k), *got = th_alloc(&h, (size_t)n * sizeof *got);
            double *ref = th_alloc(&h, (size_t)n * sizeof *ref);
            ref64_fill(&r, k, n, -2, 2, t);
            int32_t *perm = th_alloc(&h, n_slots * sizeof *perm), delta[13];
            ref64_shuffle(&r, perm, n_slots);
            for (int j = 0; j < n_shift; j++)
                delta[j] = ref64_int(&r, -3000, 3000);
            llmem_backend *runs[2] = {be, cpu};
            for (int run = 0; run < (cpu ? 2 : 1); run++) {
                th_ctx c;
                th_begin(&c, runs[run]);
                llmem_kv_view kvd = {0};
                llmem_kv_view *kv = &kvd;
                llmem_view view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, NULL);
                size_t es = llmem_dtype_size(t), row_bytes = (size_t)row * es;
                kv->dtype = t;
                kv->page_size = 1;
                kv->n_pages = n_slots;
                kv->n_kv_heads = hkv;
                kv->head_dim = hd;
                kv->k = th_pool(&c, (size_t)n_slots * row_bytes, t);
                kv->v = th_pool(&c, (size_t)n_slots * row_bytes, t);
                unsigned char *enc = th_alloc(&c, (size_t)n * es);
                for (int64_t e = 0; e < n; e++)
                    ref64_encode(k[e], t, enc + e * es);
                ck_assert_int_eq(llmem_buffer_upload(kv->k, 0, enc, (size_t)n * es), LLMEM_OK);
                unsigned char *v_before = th_snapshot(&c, kv->v);
                int32_t slots[13];
                for (int j = 0; j < n_shift; j++)
                    slots[j] = perm[j];
                th_idx b = {0};
                kv->shift_slot = th_idx_add(&b, slots, n_shift);
                kv->shift_delta = th_idx_add(&b, delta, n_shift);
                llmem_i32_table *tabs[] = {&kv->shift_slot, &kv->shift_delta};
                view.idx = th_idx_finish(&c, &b, tabs, 2);
                ck_assert_int_eq(llmem_op_rope_shift(runs[run], &p, &view), LLMEM_OK);
                unsigned char *pool = th_snapshot(&c, kv->k);
                for (int64_t e = 0; e < n; e++)
                    (run ? ref : got)[e] = ref64_decode(pool + e * es, t);
                th_expect_same_bytes(th_snapshot(&c, kv->v), v_before, llmem_buffer_size(kv->v),
                                     "V pool after rope_shift");
                th_end(&c);
            }
            if (!cpu) {
                memcpy(ref, k, (size_t)n * sizeof *ref);
                for (int j = 0; j < n_shift; j++)
                    for (int32_t g = 0; g < hkv; g++) {
                        double *x = k + perm[j] * row + g * hd, *o = ref + perm[j] * row + g * hd;
                        ref64_rope(&p, hd, delta[j], x, o);
                    }
            }
            /* untouched slots and dims >= n_rot keep their exact bytes */
            for (int32_t sl = 0; sl < n_slots; sl++) {
                bool shifted = false;
                for (int j = 0; j < n_shift; j++)
                    shifted |= perm[j] == sl;
                for (int32_t g = 0; g < hkv; g++)
                    for (int32_t e = shifted ? p.n_rot : 0; e < hd; e++) {
                        int64_t at = sl * row + g * hd + e;
                        if (got[at] != k[at])
                            ck_abort_msg("rope_shift changed slot %d dim %d", sl, e);
                    }
            }
            char what[96];
            snprintf(what, sizeof what, "rope_shift %s hd=%d n_rot=%d", llmem_dtype_name(t), hd, p.n_rot);
            th_expect_close(got, ref, n, ref64_tol(t, cpu != NULL) + (cpu ? 5e-3 : 0.0), what);
            th_end(&h);
        }
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_kv_page_copy)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 3100);
    th_ctx c;
    th_begin(&c, be);
    llmem_kv_view kvd = {0};
    llmem_kv_view *kv = &kvd;
    llmem_view view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, NULL);
    kv->dtype = F16;
    kv->n_pages = 6;
    kv->page_size = 3;
    kv->n_kv_heads = 2;
    kv->head_dim = 5;
    size_t page = 3 * 2 * 5 * 2, bytes = 6 * page;
    kv->k = th_pool(&c, bytes, F16);
    kv->v = th_pool(&c, bytes, F16);
    unsigned char *k0 = th_alloc(&c, bytes), *v0 = th_alloc(&c, bytes);
    for (size_t i = 0; i < bytes; i++) {
        k0[i] = (unsigned char)ref64_next(&r);
        v0[i] = (unsigned char)ref64_next(&r);
    }
    ck_assert_int_eq(llmem_buffer_upload(kv->k, 0, k0, bytes), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(kv->v, 0, v0, bytes), LLMEM_OK);
    ck_assert_int_eq(llmem_op_kv_page_copy(be, &view, 4, 1), LLMEM_OK);
    memcpy(k0 + page, k0 + 4 * page, page);
    memcpy(v0 + page, v0 + 4 * page, page);
    th_expect_same_bytes(th_snapshot(&c, kv->k), k0, bytes, "K pool after page copy");
    th_expect_same_bytes(th_snapshot(&c, kv->v), v0, bytes, "V pool after page copy");
    ck_assert_int_eq(llmem_op_kv_page_copy(be, &view, 2, 2), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_kv_page_copy(be, &view, 2, 6), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_kv_page_copy(be, &view, -1, 0), LLMEM_E_INVALID);
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_kv: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_kv");
    TCase *tc = tcase_create("kv");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_rope_shift, 0, n);
    tcase_add_loop_test(tc, test_kv_page_copy, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return n > 0 && failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
