// ctest-labels: vulkan
/* Vulkan: a decode-sized product's split-K sum held back for the op that
 * reads it (issue 12; backends/vulkan/vk_sum.c, $LLMEM_VULKAN_SUM_HOLD).
 * At 9-64 rows on cooperative matrices, column copies of a product's
 * output are written by its sum pass, and an in-place add + RMS norm of it
 * adds the raw tiles itself. Checked here, at 9, 16, 33, 40 and 64 rows
 * (256 and, for the folds at every width, 2304 columns), precise and
 * fast, with the hold on (3), on for the copies only (1), unset (the
 * default, vk_sum.h; here with $LLMEM_VULKAN_ROW_SPLIT=4, and with the
 * default row split and $LLMEM_VULKAN_NORM_FOLD 0, the slices in a loop
 * (with the folding norm over 256 workgroups, $LLMEM_VULKAN_NORM_FOLD_WGS),
 * and 7, unrolled and folded at every width) and off (0):
 *   - the decode chains: norm -> product -> add + norm in place (the
 *     residual add; the product's input k equal to and twice the norm's
 *     width, its terms from the norm or its own split) -> product -> three
 *     column copies (z, xBC, dt) -> an op on a copy; against a float64
 *     computation from the inputs, and bit for bit equal with the hold off;
 *   - the ops that must record the held sum first: a download of the
 *     output, an add reading it, a product reading it, a fourth copy, a
 *     copy to f16, a norm whose output is not its input: the same bits as
 *     with the hold off, and the float64 values;
 *   - with each norm's rows over 4 workgroups ($LLMEM_VULKAN_ROW_SPLIT=4,
 *     the hold's default: bits 2 and 3), the same chains, and norm(x) -> product
 *     -> add + norm in place, twice: the sum added into x by its pass, or
 *     folded into the norm, which reads x from the copy the norm before
 *     wrote (vk_sum.h, the residual's copies): the same bits as one
 *     workgroup a row with the hold off, and the float64 values.
 * Where the device has no cooperative matrices (lavapipe) nothing is held
 * and the same checks hold for the SIMT path. Without a usable Vulkan
 * device the suite is skipped.
 */
#include "support/run.h"
#include "support/vk_test.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"

#define EPS 1e-5f
#define W0 256 /* the copies' widths (z, xBC, dt) */
#define W1 264
#define W2 8
#define NIN (W0 + W1 + W2)

/* ---- the runs ---------------------------------------------------------------------------- */

/* One shape's inputs: a0 [m, k], x0, x2 [m, d]; nw0 [k], nw [d]; w [d, k],
 * win [NIN, d] bf16-exact. */
typedef struct sh_in {
    int32_t m, d, k;
    bool fast;
    float *a0, *x0, *x2, *nw0, *nw, *w, *win;
} sh_in;

enum { O_X, O_H, O_ZX, O_Z, O_XB, O_DT, O_X2, O_P, O_DL, O_ADD, O_MM, O_C4, O_F16, O_NO, O_PN, O_ZB, O_XBB, O_DTB,
       O_G4, O_R4, O_R5, O_X4, N_O };

/* Runs every chain of one shape on a vulkan backend opened with
 * $LLMEM_VULKAN_SUM_HOLD=hold and $LLMEM_VULKAN_ROW_SPLIT=split (NULL:
 * unset); o[i] malloc'd here (caller frees). */
static void run_all(const sh_in *c, const char *hold, const char *split, const char *nfold,
                    const char *wgs, float *o[N_O], size_t n_o[N_O])
{
    test_env keep_wgs = test_env_set("LLMEM_VULKAN_NORM_FOLD_WGS", wgs);
    test_env keep = test_env_set("LLMEM_VULKAN_SUM_HOLD", hold);
    test_env keep_split = test_env_set("LLMEM_VULKAN_ROW_SPLIT", split);
    test_env keep_nf = test_env_set("LLMEM_VULKAN_NORM_FOLD", nfold);
    llmem_backend *vk = test_open("vulkan");
    int32_t m = c->m, d = c->d, k = c->k;
    llmem_buffer *b[32];
    int nb = 0;
#define T32(v, a, bb) vk_up_f32_2d(vk, &b[nb++], v, a, bb)
    llmem_tensor a0 = T32(c->a0, m, k), x = T32(c->x0, m, d), x2 = T32(c->x2, m, d);
    llmem_tensor nw0 = T32(c->nw0, k, 0), nw = T32(c->nw, d, 0);
    llmem_tensor w = vk_up_bf16_2d(vk, &b[nb++], c->w, d, k);
    llmem_tensor win = vk_up_bf16_2d(vk, &b[nb++], c->win, NIN, d);
    llmem_tensor a = T32(NULL, m, k), h = T32(NULL, m, d), zx = T32(NULL, m, NIN);
    llmem_tensor z = T32(NULL, m, W0), xb = T32(NULL, m, W1), dt = T32(NULL, m, W2);
    llmem_tensor p = T32(NULL, m, d), q = T32(NULL, m, d), q2 = T32(NULL, m, d);
    llmem_tensor hh = T32(NULL, m, NIN), x3 = T32(c->x2, m, d), pn = T32(NULL, m, d);
    llmem_tensor f16 = {NULL, 0, F16, 2, {m, W0, 1, 1}};
    OK(llmem_buffer_alloc(vk, llmem_tensor_nbytes(&f16), &b[nb++]));
    f16.buf = b[nb - 1];
    llmem_tensor zw = T32(NULL, m, W0), zb = T32(NULL, m, W0), xbb = T32(NULL, m, W1);
    llmem_tensor dtb = T32(NULL, m, W2);
    llmem_tensor x4 = T32(c->x0, m, d), g4 = T32(NULL, m, d), r4 = T32(NULL, m, d);
    llmem_tensor r5 = T32(NULL, m, d);
#undef T32
    llmem_status (*mm)(llmem_backend *, const llmem_tensor *, const llmem_tensor *,
                       const llmem_tensor *) = c->fast ? llmem_op_matmul_fast : llmem_op_matmul;
    /* the decode chain: the product's terms from the norm */
    OK(llmem_op_rms_norm(vk, &a0, &nw0, EPS, &a));
    OK(mm(vk, &a, &w, &h));
    OK(llmem_op_add_rms_norm(vk, &x, &h, &nw, EPS, &h));
    OK(mm(vk, &h, &win, &zx));
    OK(llmem_op_copy(vk, &zx, 0, &z));
    OK(llmem_op_copy(vk, &zx, W0, &xb));
    OK(llmem_op_copy(vk, &zx, W0 + W1, &dt));
    OK(llmem_op_add(vk, &z, &z, &z));
    /* its own split (a0 made by no norm), then the add + norm */
    OK(mm(vk, &a0, &w, &p));
    OK(llmem_op_add_rms_norm(vk, &x2, &p, &nw, EPS, &p));
    /* the ops that record the held sum first */
    OK(mm(vk, &a0, &w, &q));
    float *dl = malloc((size_t)m * d * 4);
    ck_assert_ptr_nonnull(dl);
    OK(llmem_buffer_download(q.buf, q.offset, dl, (size_t)m * d * 4)); /* a download */
    OK(mm(vk, &a0, &w, &q));
    OK(llmem_op_add(vk, &q, &q, &q2)); /* an add reading it: q2 = 2 q */
    OK(mm(vk, &a0, &w, &q));
    OK(mm(vk, &q, &win, &hh)); /* a product reading it */
    OK(mm(vk, &h, &win, &zx));
    OK(llmem_op_copy(vk, &zx, 0, &zb));
    OK(llmem_op_copy(vk, &zx, W0, &xbb));
    OK(llmem_op_copy(vk, &zx, W0 + W1, &dtb));
    OK(llmem_op_copy(vk, &zx, 8, &zw)); /* a fourth copy */
    OK(mm(vk, &h, &win, &zx));
    OK(llmem_op_copy(vk, &zx, 0, &f16)); /* to f16 */
    OK(mm(vk, &a0, &w, &q));
    OK(llmem_op_add_rms_norm(vk, &x3, &q, &nw, EPS, &pn)); /* out is not r: q keeps the product */
    /* a norm of x, then two residual adds into x (each row split over
     * workgroups: x's values from its copy, the sum folded into the norm) */
    OK(llmem_op_rms_norm(vk, &x4, &nw, EPS, &g4));
    OK(mm(vk, &a, &w, &r4));
    OK(llmem_op_add_rms_norm(vk, &x4, &r4, &nw, EPS, &r4));
    OK(mm(vk, &a, &w, &r5));
    OK(llmem_op_add_rms_norm(vk, &x4, &r5, &nw, EPS, &r5));
    llmem_tensor outs[N_O] = {x,  h,  zx,  z,   xb, dt, x2, p,  q,  q2, hh,
                              zw, f16, q, pn, zb, xbb, dtb, g4, r4, r5, x4};
    for (int i = 0; i < N_O; i++) {
        n_o[i] = llmem_tensor_nbytes(&outs[i]);
        o[i] = malloc(n_o[i]);
        ck_assert_ptr_nonnull(o[i]);
        if (i == O_DL)
            memcpy(o[i], dl, n_o[i]);
        else
            OK(llmem_buffer_download(outs[i].buf, outs[i].offset, o[i], n_o[i]));
    }
    free(dl);
    for (int i = 0; i < nb; i++)
        llmem_buffer_free(b[i]);
    llmem_backend_close(vk);
    test_env_restore(&keep_nf);
    test_env_restore(&keep_wgs);
    test_env_restore(&keep_split);
    test_env_restore(&keep);
}

static void cols(const double *src, int32_t m, int32_t n, int32_t c0, int32_t w, double s,
                 double *dst)
{
    for (int32_t r = 0; r < m; r++)
        for (int32_t j = 0; j < w; j++)
            dst[(size_t)r * w + j] = s * src[(size_t)r * n + c0 + j];
}

static void check_shape(int32_t m, int32_t d, int32_t k, bool fast)
{
    sh_in c = {.m = m, .d = d, .k = k, .fast = fast};
    size_t md = (size_t)m * d, mk = (size_t)m * k;
    c.a0 = rand_vals(mk, -2, 2, false), c.x0 = rand_vals(md, -2, 2, false);
    c.x2 = rand_vals(md, -2, 2, false), c.nw0 = rand_vals((size_t)k, 0.5f, 1.5f, false);
    c.nw = rand_vals((size_t)d, 0.5f, 1.5f, false), c.w = rand_vals((size_t)d * k, -1, 1, true);
    c.win = rand_vals((size_t)NIN * d, -1, 1, true);
    float *on[N_O], *off[N_O], *cp[N_O];
    size_t nn[N_O], nf[N_O], nc[N_O];
    run_all(&c, "3", NULL, NULL, NULL, on, nn);
    run_all(&c, "0", "1", NULL, NULL, off, nf); /* one workgroup a row */
    run_all(&c, "1", NULL, NULL, NULL, cp, nc); /* the copies only */
    float *df[N_O], *n0[N_O], *n7[N_O];
    size_t nd[N_O], nz[N_O], ns7[N_O];
    /* unset: the copies, and the norm at 64 rows; each row over 4
     * workgroups (at these widths the default is 1): the sum added into x
     * or folded into the split norm */
    run_all(&c, NULL, "4", NULL, NULL, df, nd);
    /* the sums in a loop in the norm (0; the folding norm over 256
     * workgroups in all: $LLMEM_VULKAN_NORM_FOLD_WGS), and unrolled and
     * folded at every width (7, the default row split) */
    run_all(&c, NULL, NULL, "0", "256", n0, nz);
    run_all(&c, NULL, NULL, "7", NULL, n7, ns7);
    static const char *names[N_O] = {"x after add + norm", "add + norm in place",
                                     "product of the normed h", "copy z (then doubled)",
                                     "copy xBC", "copy dt", "x2 after add + norm",
                                     "add + norm of an own-split product", "download",
                                     "add reading the product", "product reading the product",
                                     "a fourth copy", "copy to f16", "norm out of place: r kept",
                                     "norm out of place", "z again", "xBC again", "dt again",
                                     "norm of x4", "x4 += r4, norm", "x4 += r5, norm", "x4"};
    for (int i = 0; i < N_O; i++) {
        ck_assert_uint_eq(nn[i], nf[i]);
        ck_assert_msg(memcmp(on[i], off[i], nn[i]) == 0, "%s (%dx%dx%d %s): hold 3 differs from 0",
                      names[i], m, d, k, fast ? "fast" : "precise");
        ck_assert_msg(nc[i] == nf[i] && memcmp(cp[i], off[i], nn[i]) == 0,
                      "%s (%dx%dx%d %s): hold 1 differs from 0", names[i], m, d, k,
                      fast ? "fast" : "precise");
        ck_assert_msg(nd[i] == nf[i] && memcmp(df[i], off[i], nn[i]) == 0,
                      "%s (%dx%dx%d %s): the default, 4 workgroups a row, differs from 0",
                      names[i], m, d, k, fast ? "fast" : "precise");
        ck_assert_msg(nz[i] == nf[i] && memcmp(n0[i], off[i], nn[i]) == 0,
                      "%s (%dx%dx%d %s): NORM_FOLD 0 differs from hold 0", names[i], m, d, k,
                      fast ? "fast" : "precise");
        ck_assert_msg(ns7[i] == nf[i] && memcmp(n7[i], off[i], nn[i]) == 0,
                      "%s (%dx%dx%d %s): NORM_FOLD 7 differs from hold 0", names[i], m, d, k,
                      fast ? "fast" : "precise");
    }
    /* float64 values of the chain */
    double *a = malloc(mk * sizeof *a), *h = malloc(md * sizeof *h), *x = malloc(md * sizeof *x);
    double *zx = calloc((size_t)m * NIN, sizeof *zx), *e = calloc((size_t)m * NIN, sizeof *e);
    double *q = malloc(md * sizeof *q), *a0 = malloc(mk * sizeof *a0);
    ck_assert(a && h && x && zx && e && q && a0);
    for (size_t i = 0; i < mk; i++)
        a[i] = a0[i] = c.a0[i];
    vk_ref_norm_groups(a, c.nw0, m, k, 1, EPS);
    vk_ref_mm(a, c.w, m, k, d, h);
    for (size_t i = 0; i < md; i++)
        x[i] = c.x0[i] + h[i];
    /* fast: 11-bit activations into each product */
    double tol = fast ? 4e-3 : 2e-5;
    char what[128];
    snprintf(what, sizeof what, "%dx%dx%d %s", m, d, k, fast ? "fast" : "precise");
    vk_expect_close(on[O_X], x, m, d, tol, what);
    memcpy(h, x, md * sizeof *h);
    vk_ref_norm_groups(h, c.nw, m, d, 1, EPS);
    vk_expect_close(on[O_H], h, m, d, tol, what);
    vk_ref_mm(h, c.win, m, d, NIN, zx);
    cols(zx, m, NIN, 0, W0, 2.0, e);
    vk_expect_close(on[O_Z], e, m, W0, tol, what);
    cols(zx, m, NIN, W0, W1, 1.0, e);
    vk_expect_close(on[O_XB], e, m, W1, tol, what);
    cols(zx, m, NIN, W0 + W1, W2, 1.0, e);
    vk_expect_close(on[O_DT], e, m, W2, tol, what);
    cols(zx, m, NIN, 0, W0, 1.0, e);
    vk_expect_close(on[O_ZB], e, m, W0, tol, what);
    cols(zx, m, NIN, W0, W1, 1.0, e);
    vk_expect_close(on[O_XBB], e, m, W1, tol, what);
    cols(zx, m, NIN, 8, W0, 1.0, e);
    vk_expect_close(on[O_C4], e, m, W0, tol, what);
    vk_ref_mm(a0, c.w, m, k, d, q);
    vk_expect_close(on[O_DL], q, m, d, tol, what);
    vk_expect_close(on[O_NO], q, m, d, tol, what);
    for (size_t i = 0; i < md; i++)
        x[i] = 2.0 * q[i];
    vk_expect_close(on[O_ADD], x, m, d, tol, what);
    for (size_t i = 0; i < md; i++)
        x[i] = c.x2[i] + q[i];
    vk_expect_close(on[O_X2], x, m, d, tol, what);
    vk_ref_norm_groups(x, c.nw, m, d, 1, EPS); /* the own-split product's add + norm */
    vk_expect_close(on[O_P], x, m, d, tol, what);
    vk_expect_close(on[O_PN], x, m, d, tol, what);
    vk_ref_mm(q, c.win, m, d, NIN, zx);
    vk_expect_close(on[O_MM], zx, m, NIN, 2 * tol, what);
    /* x4's chain: norm(x0); twice x0 += a · wᵀ, norm */
    vk_ref_mm(a, c.w, m, k, d, q);
    for (size_t i = 0; i < md; i++)
        x[i] = h[i] = c.x0[i];
    vk_ref_norm_groups(h, c.nw, m, d, 1, EPS);
    vk_expect_close(df[O_G4], h, m, d, tol, what);
    for (int o = O_R4; o <= O_R5; o++) {
        for (size_t i = 0; i < md; i++)
            h[i] = x[i] = x[i] + q[i];
        vk_ref_norm_groups(h, c.nw, m, d, 1, EPS);
        vk_expect_close(df[o], h, m, d, tol, what);
    }
    vk_expect_close(df[O_X4], x, m, d, tol, what);
    for (int i = 0; i < N_O; i++)
        free(on[i]), free(off[i]), free(cp[i]), free(df[i]), free(n0[i]), free(n7[i]);
    free(a), free(h), free(x), free(zx), free(e), free(q), free(a0);
    free(c.a0), free(c.x0), free(c.x2), free(c.nw0), free(c.nw), free(c.w), free(c.win);
}

/* The product's input as wide as the norm (o_proj: the exponents' slot is
 * the norm's own) and twice as wide (down, out_proj). */
START_TEST(test_sum_hold_chains)
{
    static const int32_t shapes[][3] = {{16, 256, 256}, {64, 256, 512}, {16, 256, 512},
                                        {9, 256, 512},  {33, 256, 512}, {16, 2304, 512},
                                        {40, 2304, 512}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int fast = 0; fast < 2; fast++)
            check_shape(shapes[i][0], shapes[i][1], shapes[i][2], fast == 1);
}
END_TEST

int main(void)
{
    vk_test_seed();
    if (!vulkan_opens("test_vulkan_sumhold", "skipped"))
        return 77;
    Suite *s = suite_create("vulkan_sumhold");
    TCase *tc = tcase_create("sumhold");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_sum_hold_chains);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
