// ctest-labels: core
/* Op conformance suite, part 4: dtype conversions (round to nearest even,
 * checked on every f16/bf16 encoding and on halfway values), the copy op,
 * and block copies (see test_ops.c for the conventions).
 */
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

static const llmem_dtype float_types[3] = {F32, F16, BF16};

/* ---- conversions and copies ---------------------------------------------------------------------------- */

/* Values that stress round-to-nearest-even in f16 and bf16: exact halfway
 * points (odd and even neighbours), subnormals, the overflow edge. */
static int32_t special_values(ref64_rng *r, double *v, int32_t cap)
{
    int32_t n = 0;
    static const double fixed[] = {0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, -65520.0,
                                   1e-8, -3e-8, 5.96e-8, 2.98e-8, 2.9802322387695312e-08,
                                   6.103515625e-05, 6.1e-05, 3.0e38, 1e-40, -1e-42, 1e5, 0.1};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0] && n < cap; i++)
        v[n++] = ref64_round(fixed[i], F32);
    while (n + 4 <= cap) {
        /* halfway between neighbours of f16 / bf16, at a random exponent */
        int e16 = ref64_int(r, -24, 15), e16m = ref64_int(r, 0, 1023);
        double q16 = ldexp(1.0, e16 < -14 ? -24 : e16 - 10);
        double base16 = e16 < -14 ? e16m * q16 : ldexp(1.0 + e16m / 1024.0, e16);
        v[n++] = base16 + q16 / 2;
        int eb = ref64_int(r, -133, 127), ebm = ref64_int(r, 0, 127);
        double qb = ldexp(1.0, eb < -126 ? -133 : eb - 7);
        double baseb = eb < -126 ? ebm * qb : ldexp(1.0 + ebm / 128.0, eb);
        v[n++] = ref64_round(baseb + qb / 2, F32);
        v[n++] = ref64_round(ref64_uniform(r, -70000, 70000), F32);
        v[n++] = ref64_round(ldexp(ref64_uniform(r, -1, 1), ref64_int(r, -30, 20)), F32);
    }
    return n;
}

START_TEST(test_convert_exact)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 800);
    th_ctx c;
    th_begin(&c, be);
    /* f32 -> f16, bf16: every output equals the independent rounding */
    enum { NV = 4096 };
    double *v = th_vec(&c, NV), *out = th_vec(&c, NV);
    int32_t n = special_values(&r, v, NV);
    llmem_tensor src = th_input(&c, F32, 2, 1, n, 1, v);
    for (int d = 1; d < 3; d++) {
        llmem_tensor dst = th_tensor(&c, float_types[d], 2, 1, n, 1);
        ck_assert_int_eq(llmem_op_copy(be, &src, 0, &dst), LLMEM_OK);
        th_get(&dst, out);
        for (int32_t i = 0; i < n; i++) {
            double want = ref64_round(v[i], float_types[d]);
            if (!(out[i] == want || (isnan(out[i]) && isnan(want))))
                ck_abort_msg("f32 %.17g -> %s: %.17g, want %.17g", v[i],
                             llmem_dtype_name(float_types[d]), out[i], want);
        }
    }
    /* f16, bf16 -> f32: all 65536 encodings, NaN stays NaN, inf stays inf */
    uint16_t *bits = th_alloc(&c, 65536 * sizeof *bits);
    double *wide = th_vec(&c, 65536);
    for (uint32_t i = 0; i < 65536; i++)
        bits[i] = (uint16_t)i;
    for (int d = 1; d < 3; d++) {
        llmem_tensor s16 = th_tensor(&c, float_types[d], 2, 1, 65536, 1);
        ck_assert_int_eq(llmem_buffer_upload(s16.buf, s16.offset, bits, 65536 * 2), LLMEM_OK);
        llmem_tensor d32 = th_tensor(&c, F32, 2, 1, 65536, 1);
        ck_assert_int_eq(llmem_op_copy(be, &s16, 0, &d32), LLMEM_OK);
        th_get(&d32, wide);
        for (uint32_t i = 0; i < 65536; i++) {
            double want = ref64_decode(&bits[i], float_types[d]);
            if (!(wide[i] == want || (isnan(wide[i]) && isnan(want))))
                ck_abort_msg("%s 0x%04x -> f32: %.17g, want %.17g",
                             llmem_dtype_name(float_types[d]), i, wide[i], want);
        }
    }
    /* f32 NaN -> 16-bit NaN */
    double nan_in = NAN;
    llmem_tensor snan = th_input(&c, F32, 1, 1, 1, 1, &nan_in);
    for (int d = 1; d < 3; d++) {
        llmem_tensor dnan = th_tensor(&c, float_types[d], 1, 1, 1, 1);
        ck_assert_int_eq(llmem_op_copy(be, &snan, 0, &dnan), LLMEM_OK);
        double o;
        th_get(&dnan, &o);
        ck_assert(isnan(o));
    }
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_copy)
{
    /* rows, src cols, dst cols, col0 */
    static const int32_t cases[][4] = {{1, 1, 1, 0}, {3, 7, 5, 2}, {4, 300, 257, 43}, {2, 64, 64, 0}};
    llmem_backend *be = th_open(_i);
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        for (int sd = 0; sd < 3; sd++) {
            for (int dd = 0; dd < 3; dd++) {
                int32_t rows = cases[s][0], sc = cases[s][1], dc = cases[s][2], c0 = cases[s][3];
                ref64_rng r = ref64_rng_make(ref64_seed(), 900 + s * 16 + sd * 4 + dd);
                th_ctx c;
                th_begin(&c, be);
                double *src = th_vec(&c, (int64_t)rows * sc), *out = th_vec(&c, (int64_t)rows * dc);
                double *ref = th_vec(&c, (int64_t)rows * dc);
                ref64_fill(&r, src, (int64_t)rows * sc, -4, 4, float_types[sd]);
                for (int32_t i = 0; i < rows; i++)
                    for (int32_t j = 0; j < dc; j++)
                        ref[(int64_t)i * dc + j] =
                            ref64_round(src[(int64_t)i * sc + c0 + j], float_types[dd]);
                llmem_tensor ts = th_input(&c, float_types[sd], 2, rows, sc, 1, src);
                llmem_tensor td = th_tensor(&c, float_types[dd], 2, rows, dc, 1);
                ck_assert_int_eq(llmem_op_copy(be, &ts, c0, &td), LLMEM_OK);
                th_get(&td, out);
                th_expect_close(out, ref, (int64_t)rows * dc, 0.0, "copy");
                th_end(&c);
            }
        }
    }
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_copy_blocks)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 1000);
    th_ctx c;
    th_begin(&c, be);
    enum { BLOCK = 96, NBLK = 10 };
    unsigned char *data = th_alloc(&c, BLOCK * NBLK);
    for (int i = 0; i < BLOCK * NBLK; i++)
        data[i] = (unsigned char)ref64_next(&r);
    llmem_buffer *buf = th_pool(&c, BLOCK * NBLK, F32);
    ck_assert_int_eq(llmem_buffer_upload(buf, 0, data, BLOCK * NBLK), LLMEM_OK);
    int32_t src[3] = {0, 7, 3}, dst[3] = {9, 2, 4};
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 3, src, dst), LLMEM_OK);
    unsigned char *got = th_snapshot(&c, buf);
    for (int b = 0; b < NBLK; b++) {
        int from = b;
        for (int j = 0; j < 3; j++)
            if (dst[j] == b)
                from = src[j];
        th_expect_same_bytes(got + b * BLOCK, data + from * BLOCK, BLOCK, "copy_blocks");
    }
    /* a dst that is also a src, a repeated dst, a block out of range */
    int32_t s2[2] = {1, 2}, d2[2] = {2, 5}, d3[2] = {5, 5}, d4[2] = {5, NBLK};
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 2, s2, d2), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 2, s2, d3), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 2, s2, d4), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_copy_blocks(be, buf, BLOCK, 0, NULL, NULL), LLMEM_OK);
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_convert: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_convert");
    TCase *tc = tcase_create("convert");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_convert_exact, 0, n);
    tcase_add_loop_test(tc, test_copy, 0, n);
    tcase_add_loop_test(tc, test_copy_blocks, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return n > 0 && failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
