// ctest-labels: vulkan
/* Vulkan: the prefill paths around the GEMM (issue 12, twelfth session).
 * Above 64 rows (the prefill ubatches):
 *   - the RMS norms move runs of 4 elements an invocation (rms_norm.comp and
 *     rms_norm_gated.comp V4; vk_ops_basic.c, norm_v4): rms_norm with f32,
 *     bf16 and no weights, add + norm (out the residual r, or apart), the
 *     gated norm in place and apart, 1 and 4 groups, at row widths that
 *     fill one to eight runs an invocation and with a partial last run;
 *     against float64 from the inputs, with $LLMEM_VULKAN_PF_NORM unset
 *     and 0 (the REG / loop paths), and add + norm bit for bit equal to an
 *     add followed by the norm (llmem_op_add_rms_norm's contract); the
 *     gated norm's runs kept in shared memory ($LLMEM_VULKAN_PF_NORM=2):
 *     float64, and bit for bit the registers' path;
 *   - a product's split-K sum held for the column copies of its output
 *     (the pass writes z / xBC / dt: sum_slices_cm.comp VEC4 with NDST,
 *     and at widths that are not multiples of 4 the one-column pass) and
 *     for the residual add + norm (rms_norm.comp V4 reads the raw tiles:
 *     ADD 2); against float64 and bit for bit equal with
 *     $LLMEM_VULKAN_SUM_HOLD=0.
 * Where the device has no cooperative matrices (lavapipe) nothing is held
 * (the products sum their own tiles) and the same checks hold for the
 * norms' paths. Without a usable Vulkan device the suite is skipped.
 */
#include "support/run.h"
#include "support/vk_norms.h"
#include "support/vk_test.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"

#define EPS 1e-5f

/* ---- the norms ----------------------------------------------------------------------------- */

/* Every norm of one [m, k] shape on a backend opened with
 * $LLMEM_VULKAN_PF_NORM=pf (NULL: unset), against float64. */
static void check_norms(const char *pf, int32_t m, int32_t k)
{
    test_env keep = test_env_set("LLMEM_VULKAN_PF_NORM", pf);
    llmem_backend *vk = test_open("vulkan");
    size_t mk = (size_t)m * k;
    float *x = rand_vals(mk, -2, 2, false), *r = rand_vals(mk, -2, 2, false);
    float *y = rand_vals(mk, -3, 3, false), *z = rand_vals(mk, -3, 3, false);
    float *w = rand_vals((size_t)k, 0.5f, 1.5f, true);
    char tag[32];
    snprintf(tag, sizeof tag, "PF_NORM=%s", pf ? pf : "unset");
    float *o[VK_NORMS_N_OUT];
    vk_run_norms(vk, tag, m, k, 1, EPS, x, r, y, z, w, true, o);
    for (int i = 0; i < VK_NORMS_N_OUT; i++)
        free(o[i]);
    llmem_backend_close(vk);
    free(x), free(r), free(y), free(z), free(w);
    test_env_restore(&keep);
}

/* The gated norm (one group) of y, z [m, k] into a new array, on a
 * backend opened with $LLMEM_VULKAN_PF_NORM=pf. */
static float *gated(const char *pf, int32_t m, int32_t k, const float *y, const float *z,
                    const float *w)
{
    test_env keep = test_env_set("LLMEM_VULKAN_PF_NORM", pf);
    llmem_backend *vk = test_open("vulkan");
    llmem_buffer *b[4];
    llmem_tensor ty = vk_up_f32_2d(vk, &b[0], y, m, k), tz = vk_up_f32_2d(vk, &b[1], z, m, k);
    llmem_tensor tw = vk_up_f32_2d(vk, &b[2], w, k, 0), to = vk_up_f32_2d(vk, &b[3], NULL, m, k);
    OK(llmem_op_rms_norm_gated(vk, &ty, &tz, &tw, 1, EPS, &to));
    float *o = vk_download_f32(&to);
    for (int i = 0; i < 4; i++)
        llmem_buffer_free(b[i]);
    llmem_backend_close(vk);
    test_env_restore(&keep);
    return o;
}

/* Row widths (one group) for 1 run of 4 an invocation of 256 with a
 * partial last one (520), 2 (2048), 3 of 512 invocations, partial (4100:
 * more than 4 runs at 256), and 4 of 512 (8192, Bamba-9B's gated norm);
 * 65-129 rows, just above the decode rows. */
START_TEST(test_prefill_norms)
{
    static const int32_t shapes[][2] = {{65, 520}, {129, 2048}, {70, 4100}, {66, 8192}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        check_norms(NULL, shapes[i][0], shapes[i][1]);
        if (i == 0)
            check_norms("0", shapes[i][0], shapes[i][1]);
    }
    check_norms("2", 66, 8192); /* the gated norm's runs in shared memory */
    /* which keeps the values of the registers' path, bit for bit */
    int32_t m = 66, k = 8192;
    float *y = rand_vals((size_t)m * k, -3, 3, false), *z = rand_vals((size_t)m * k, -3, 3, false);
    float *w = rand_vals((size_t)k, 0.5f, 1.5f, false);
    float *o1 = gated("1", m, k, y, z, w), *o2 = gated("2", m, k, y, z, w);
    ck_assert_msg(memcmp(o1, o2, (size_t)m * k * 4) == 0,
                  "gated norm %dx%d: PF_NORM=2 differs from 1", m, k);
    free(y), free(z), free(w), free(o1), free(o2);
}
END_TEST

/* ---- the held sums ------------------------------------------------------------------------- */

/* in_proj's output split into three column ranges (z, xBC, dt) */
typedef struct widths {
    int32_t w[3];
} widths;

/* The prefill chain of one shape on a backend opened with
 * $LLMEM_VULKAN_SUM_HOLD=hold (NULL: unset): h = norm(a0) · wᵀ; x += h,
 * h = norm(x) in place (the residual add); zx = h · winᵀ; the three
 * copies of zx's column ranges; the outputs x, h, z, xBC, dt into o[0..5). */
static void run_chain(const char *hold, bool fast, int32_t m, int32_t d, const widths *cw,
                      const float *a0, const float *x0, const float *nw, const float *w,
                      const float *win, float *o[5])
{
    test_env keep = test_env_set("LLMEM_VULKAN_SUM_HOLD", hold);
    llmem_backend *vk = test_open("vulkan");
    int32_t nin = cw->w[0] + cw->w[1] + cw->w[2];
    llmem_buffer *b[12];
    int nb = 0;
#define T32(v, a, bb) vk_up_f32_2d(vk, &b[nb++], v, a, bb)
    llmem_tensor ta0 = T32(a0, m, d), tx = T32(x0, m, d), tnw = T32(nw, d, 0);
    llmem_tensor tw = vk_up_bf16_2d(vk, &b[nb++], w, d, d);
    llmem_tensor twin = vk_up_bf16_2d(vk, &b[nb++], win, nin, d);
    llmem_tensor ta = T32(NULL, m, d), th = T32(NULL, m, d), tzx = T32(NULL, m, nin);
    llmem_tensor tc[3] = {T32(NULL, m, cw->w[0]), T32(NULL, m, cw->w[1]), T32(NULL, m, cw->w[2])};
#undef T32
    llmem_status (*mm)(llmem_backend *, const llmem_tensor *, const llmem_tensor *,
                       const llmem_tensor *) = fast ? llmem_op_matmul_fast : llmem_op_matmul;
    OK(llmem_op_rms_norm(vk, &ta0, &tnw, EPS, &ta));
    OK(mm(vk, &ta, &tw, &th));
    OK(llmem_op_add_rms_norm(vk, &tx, &th, &tnw, EPS, &th));
    OK(mm(vk, &th, &twin, &tzx));
    for (int j = 0, c0 = 0; j < 3; c0 += cw->w[j++])
        OK(llmem_op_copy(vk, &tzx, c0, &tc[j]));
    o[0] = vk_download_f32(&tx);
    o[1] = vk_download_f32(&th);
    for (int j = 0; j < 3; j++)
        o[2 + j] = vk_download_f32(&tc[j]);
    for (int i = 0; i < nb; i++)
        llmem_buffer_free(b[i]);
    llmem_backend_close(vk);
    test_env_restore(&keep);
}

static void check_chain(int32_t m, int32_t d, const widths *cw)
{
    int32_t nin = cw->w[0] + cw->w[1] + cw->w[2];
    size_t md = (size_t)m * d;
    float *a0 = rand_vals(md, -2, 2, false), *x0 = rand_vals(md, -2, 2, false);
    float *nw = rand_vals((size_t)d, 0.5f, 1.5f, false), *w = rand_vals(md / m * d, -1, 1, true);
    float *win = rand_vals((size_t)nin * d, -1, 1, true);
    double *a = malloc(md * sizeof *a), *h = malloc(md * sizeof *h), *x = malloc(md * sizeof *x);
    double *zx = malloc((size_t)m * nin * sizeof *zx), *e = malloc((size_t)m * nin * sizeof *e);
    ck_assert(a && h && x && zx && e);
    for (size_t i = 0; i < md; i++)
        a[i] = a0[i];
    vk_ref_norm_groups(a, nw, m, d, 1, EPS);
    vk_ref_mm(a, w, m, d, d, h);
    for (size_t i = 0; i < md; i++)
        x[i] = h[i] = x0[i] + h[i];
    vk_ref_norm_groups(h, nw, m, d, 1, EPS);
    vk_ref_mm(h, win, m, d, nin, zx);
    static const char *names[5] = {"x after add + norm", "add + norm in place", "copy z",
                                   "copy xBC", "copy dt"};
    for (int fast = 0; fast < 2; fast++) {
        float *on[5], *off[5];
        run_chain(NULL, fast, m, d, cw, a0, x0, nw, w, win, on);
        run_chain("0", fast, m, d, cw, a0, x0, nw, w, win, off);
        char what[128];
        snprintf(what, sizeof what, "%dx%d, copies %d/%d/%d, %s", m, d, cw->w[0], cw->w[1],
                 cw->w[2], fast ? "fast" : "precise");
        double tol = fast ? 4e-3 : 2e-5; /* fast: 11-bit activations into each product */
        vk_expect_close(on[0], x, m, d, tol, what);
        vk_expect_close(on[1], h, m, d, tol, what);
        for (int j = 0, c0 = 0; j < 3; c0 += cw->w[j++]) {
            for (int32_t r = 0; r < m; r++)
                for (int32_t i = 0; i < cw->w[j]; i++)
                    e[(size_t)r * cw->w[j] + i] = zx[(size_t)r * nin + c0 + i];
            vk_expect_close(on[2 + j], e, m, cw->w[j], tol, what);
        }
        for (int i = 0; i < 5; i++) {
            size_t n = (size_t)m * (i < 2 ? d : cw->w[i - 2]) * 4;
            ck_assert_msg(memcmp(on[i], off[i], n) == 0, "%s (%s): differs from SUM_HOLD=0",
                          names[i], what);
            free(on[i]), free(off[i]);
        }
    }
    free(a0), free(x0), free(nw), free(w), free(win), free(a), free(h), free(x), free(zx),
        free(e);
}

/* 129 and 300 rows (matmul_cmp.comp where it runs); copies at widths and
 * offsets that are multiples of 4 (the 4-column pass writes them) and not
 * (the one-column pass) */
START_TEST(test_prefill_held_sums)
{
    static const widths v4 = {{256, 264, 8}}, odd = {{250, 262, 6}};
    check_chain(129, 256, &v4);
    check_chain(300, 264, &odd);
}
END_TEST

int main(void)
{
    vk_test_seed();
    if (!vulkan_opens("test_vulkan_prefill", "skipped"))
        return 77;
    Suite *s = suite_create("vulkan_prefill");
    TCase *tc = tcase_create("prefill");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_prefill_norms);
    tcase_add_test(tc, test_prefill_held_sums);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
