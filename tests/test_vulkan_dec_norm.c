// ctest-labels: vulkan
/* Vulkan: the decode rows' RMS norms (issue 12, fifteenth session;
 * $LLMEM_VULKAN_DEC_NORM, vk_presplit.h): at 9-64 rows rms_norm.comp and
 * rms_norm_gated.comp on the REG path may load their elements in straight
 * lines (DN bit 0) and reduce the row's largest output by subgroups (DN
 * bit 2), and the producers of matmul_cm's terms (the norms, the gated
 * norm, the SwiGLU) may write hi alone when the products read no lo (fast
 * mode: VK_DEC_NORM_HI; SPLIT 2 of the norms, 1 of cm_split.comp). Each
 * gives the same bits as the knob off. Checked at 1, 9, 16, 33 and 64
 * rows with DEC_NORM 0 and 7 (and 15, whose sums of squares add in
 * another order: against float64 alone; and the norms alone with 23, the
 * gated norm's REG loops written out, VK_DEC_NORM_WO: bit for bit 7's):
 *   - rms_norm (f32, bf16 and no weights), add + norm (out the residual,
 *     bit for bit an add followed by the norm) and the gated norm (1 and 4
 *     groups, in place and apart) at widths of 1024-8192 and 1030, with
 *     the products' terms written ($LLMEM_VULKAN_PRESPLIT=2, so on
 *     lavapipe too, where the terms are hi alone with VK_DEC_NORM_HI):
 *     against float64 from the inputs, and bit for bit across DEC_NORM;
 *   - the decode chain norm -> product -> add + norm in place (on
 *     cooperative matrices the product's split-K sum folded into the norm)
 *     -> gated norm -> product -> SwiGLU of two products -> product,
 *     precise and fast: against float64, and bit for bit across DEC_NORM
 *     and with $LLMEM_VULKAN_PRESPLIT=0 (every product splits its own
 *     activations: the terms the producers wrote, hi alone or not, are
 *     those).
 * Without a usable Vulkan device the suite is skipped.
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

/* A vulkan backend opened with $LLMEM_VULKAN_DEC_NORM=dec and
 * $LLMEM_VULKAN_PRESPLIT=presplit (NULL: unset), which it reads when it
 * opens; the environment is put back after. */
static llmem_backend *open_with(const char *dec, const char *presplit)
{
    static const char *const names[2] = {"LLMEM_VULKAN_DEC_NORM", "LLMEM_VULKAN_PRESPLIT"};
    const char *const values[2] = {dec, presplit};
    return test_open_with("vulkan", 2, names, values);
}

/* ---- the norms alone -------------------------------------------------------------------- */

enum { N_OUT = VK_NORMS_N_OUT };

/* Every norm of one [m, k] shape on vk (opened with
 * $LLMEM_VULKAN_DEC_NORM=dec and PRESPLIT=2): vk_run_norms, the gated norm
 * where its groups are multiples of 4 elements. */
static void run_norms(llmem_backend *vk, const char *dec, int32_t m, int32_t k, const float *x,
                      const float *r, const float *y, const float *z, const float *w, bool check,
                      float *o[N_OUT])
{
    char tag[32];
    snprintf(tag, sizeof tag, "DEC_NORM=%s", dec);
    vk_run_norms(vk, tag, m, k, 4, EPS, x, r, y, z, w, check, o);
}

/* Widths of 1 to 16 elements an invocation (1024-8192: the 2b and 9B
 * shapes' norms and the 9B gated norm) and one that is not a multiple of
 * the workgroup (1030: the guarded last elements). */
START_TEST(test_dec_norms)
{
    static const int32_t rows[] = {1, 9, 16, 33, 64};
    static const int32_t widths[] = {1024, 2048, 4096, 8192, 1030};
    llmem_backend *v7 = open_with("7", "2"), *v0 = open_with("0", "2");
    llmem_backend *v15 = open_with("15", "2"); /* wg_sum_sg: float64 only */
    llmem_backend *v23 = open_with("23", "2"); /* 7 and the gated norm's loops written out */
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        for (size_t j = 0; j < sizeof widths / sizeof *widths; j++) {
            int32_t m = rows[i], k = widths[j];
            size_t mk = (size_t)m * k;
            float *x = rand_vals(mk, -2, 2, false), *r = rand_vals(mk, -2, 2, false);
            float *y = rand_vals(mk, -3, 3, false), *z = rand_vals(mk, -3, 3, false);
            float *w = rand_vals((size_t)k, 0.5f, 1.5f, true);
            float *o7[N_OUT], *o0[N_OUT], *o15[N_OUT], *o23[N_OUT];
            run_norms(v7, "7", m, k, x, r, y, z, w, true, o7);
            run_norms(v23, "23", m, k, x, r, y, z, w, false, o23);
            run_norms(v0, "0", m, k, x, r, y, z, w, j == 0, o0);
            run_norms(v15, "15", m, k, x, r, y, z, w, true, o15);
            for (int n = 0; n < N_OUT; n++) {
                free(o15[n]);
                ck_assert_msg((o7[n] == NULL) == (o0[n] == NULL), "output %d", n);
                ck_assert_msg(!o7[n] || memcmp(o7[n], o0[n], mk * 4) == 0,
                              "%dx%d output %d: DEC_NORM=7 differs from 0", m, k, n);
                ck_assert_msg(!o7[n] || memcmp(o7[n], o23[n], mk * 4) == 0,
                              "%dx%d output %d: DEC_NORM=23 differs from 7", m, k, n);
                free(o7[n]), free(o0[n]), free(o23[n]);
            }
            free(x), free(r), free(y), free(z), free(w);
        }
    llmem_backend_close(v7);
    llmem_backend_close(v0);
    llmem_backend_close(v15);
    llmem_backend_close(v23);
}
END_TEST

/* ---- the decode chain -------------------------------------------------------------------- */

enum { C_X, C_H, C_G, C_P, C_S, C_P2, N_C };

/* One chain's inputs: a0, x0, z0 [m, d]; nw [d]; w, w2, wg, wu, wd [d, d]
 * bf16-exact. */
typedef struct chain_in {
    int32_t m, d;
    bool fast;
    float *a0, *x0, *z0, *nw, *w, *w2, *wg, *wu, *wd;
} chain_in;

/* a = norm(a0); h = a · wᵀ; x += h, h = norm(x) in place; g = gated(h, z);
 * p = g · w2ᵀ; s = silu(p · wgᵀ) * (p · wuᵀ) (in place on the gate);
 * p2 = s · wdᵀ: x, h, g, p, s, p2 into o[0..N_C), on vk. */
static void run_chain(llmem_backend *vk, const chain_in *c, float *o[N_C])
{
    int32_t m = c->m, d = c->d;
    llmem_buffer *b[20];
    int nb = 0;
#define T32(v, a, bb) vk_up_f32_2d(vk, &b[nb++], v, a, bb)
#define B16(v) vk_up_bf16_2d(vk, &b[nb++], v, d, d)
    llmem_tensor ta0 = T32(c->a0, m, d), x = T32(c->x0, m, d), z = T32(c->z0, m, d);
    llmem_tensor tnw = T32(c->nw, d, 0), a = T32(NULL, m, d), h = T32(NULL, m, d);
    llmem_tensor g = T32(NULL, m, d), p = T32(NULL, m, d), gg = T32(NULL, m, d);
    llmem_tensor uu = T32(NULL, m, d), p2 = T32(NULL, m, d);
    llmem_tensor tw = B16(c->w), tw2 = B16(c->w2), twg = B16(c->wg), twu = B16(c->wu);
    llmem_tensor twd = B16(c->wd);
#undef B16
#undef T32
    llmem_status (*mm)(llmem_backend *, const llmem_tensor *, const llmem_tensor *,
                       const llmem_tensor *) = c->fast ? llmem_op_matmul_fast : llmem_op_matmul;
    OK(llmem_op_rms_norm(vk, &ta0, &tnw, EPS, &a));
    OK(mm(vk, &a, &tw, &h));
    OK(llmem_op_add_rms_norm(vk, &x, &h, &tnw, EPS, &h));
    OK(llmem_op_rms_norm_gated(vk, &h, &z, &tnw, 1, EPS, &g));
    OK(mm(vk, &g, &tw2, &p));
    OK(mm(vk, &p, &twg, &gg));
    OK(mm(vk, &p, &twu, &uu));
    OK(llmem_op_swiglu(vk, &gg, &uu, &gg));
    OK(mm(vk, &gg, &twd, &p2));
    llmem_tensor outs[N_C] = {x, h, g, p, gg, p2};
    for (int i = 0; i < N_C; i++)
        o[i] = vk_download_f32(&outs[i]);
    for (int i = 0; i < nb; i++)
        llmem_buffer_free(b[i]);
}

/* vk[0..4): opened with DEC_NORM 7, 0, 7 with PRESPLIT=0, and 15 (float64
 * only: wg_sum_sg adds in another order) */
static void check_chain(llmem_backend *const *vk, int32_t m, int32_t d, bool fast)
{
    size_t md = (size_t)m * d, dd = (size_t)d * d;
    chain_in c = {.m = m, .d = d, .fast = fast};
    c.a0 = rand_vals(md, -2, 2, false), c.x0 = rand_vals(md, -2, 2, false);
    c.z0 = rand_vals(md, -3, 3, false), c.nw = rand_vals((size_t)d, 0.5f, 1.5f, false);
    c.w = rand_vals(dd, -1, 1, true), c.w2 = rand_vals(dd, -1, 1, true);
    c.wg = rand_vals(dd, -0.1f, 0.1f, true), c.wu = rand_vals(dd, -0.1f, 0.1f, true);
    c.wd = rand_vals(dd, -1, 1, true);
    float *on[N_C], *off[N_C], *own[N_C], *o15[N_C];
    run_chain(vk[0], &c, on);
    run_chain(vk[1], &c, off);
    run_chain(vk[2], &c, own); /* each product splits its own activations */
    run_chain(vk[3], &c, o15);
    char what[128];
    snprintf(what, sizeof what, "chain %dx%d %s", m, d, fast ? "fast" : "precise");
    for (int i = 0; i < N_C; i++) {
        ck_assert_msg(memcmp(on[i], off[i], md * 4) == 0, "%s: output %d, DEC_NORM 7 != 0", what,
                      i);
        ck_assert_msg(memcmp(on[i], own[i], md * 4) == 0,
                      "%s: output %d differs with PRESPLIT=0", what, i);
    }
    double *a = malloc(md * sizeof *a), *h = malloc(md * sizeof *h);
    double *g = malloc(md * sizeof *g), *p = malloc(md * sizeof *p);
    double *gg = malloc(md * sizeof *gg), *uu = malloc(md * sizeof *uu);
    ck_assert(a && h && g && p && gg && uu);
    for (size_t i = 0; i < md; i++)
        a[i] = c.a0[i];
    vk_ref_norm_groups(a, c.nw, m, d, 1, EPS);
    vk_ref_mm(a, c.w, m, d, d, h);
    for (size_t i = 0; i < md; i++)
        h[i] += c.x0[i];
    double tol = fast ? 4e-3 : 2e-5;
#define CLOSE(i, ref, t)                                                                           \
    vk_expect_close(on[i], ref, m, d, t, what), vk_expect_close(o15[i], ref, m, d, t, what)
    CLOSE(C_X, h, tol);
    vk_ref_norm_groups(h, c.nw, m, d, 1, EPS);
    CLOSE(C_H, h, tol);
    for (size_t i = 0; i < md; i++)
        g[i] = h[i] * vk_silu(c.z0[i]);
    vk_ref_norm_groups(g, c.nw, m, d, 1, EPS);
    CLOSE(C_G, g, tol);
    vk_ref_mm(g, c.w2, m, d, d, p);
    CLOSE(C_P, p, 2 * tol);
    vk_ref_mm(p, c.wg, m, d, d, gg);
    vk_ref_mm(p, c.wu, m, d, d, uu);
    for (size_t i = 0; i < md; i++)
        gg[i] = vk_silu(gg[i]) * uu[i];
    CLOSE(C_S, gg, 4 * tol);
    vk_ref_mm(gg, c.wd, m, d, d, p);
    CLOSE(C_P2, p, 8 * tol);
#undef CLOSE
    for (int i = 0; i < N_C; i++)
        free(on[i]), free(off[i]), free(own[i]), free(o15[i]);
    free(a), free(h), free(g), free(p), free(gg), free(uu);
    free(c.a0), free(c.x0), free(c.z0), free(c.nw), free(c.w), free(c.w2), free(c.wg), free(c.wu);
    free(c.wd);
}

START_TEST(test_dec_chain)
{
    static const int32_t rows[] = {1, 9, 16, 33, 64};
    llmem_backend *vk[4] = {open_with("7", NULL), open_with("0", NULL), open_with("7", "0"),
                            open_with("15", NULL)};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        for (int fast = 0; fast < 2; fast++)
            check_chain(vk, rows[i], 1024, fast == 1);
    for (int i = 0; i < 4; i++)
        llmem_backend_close(vk[i]);
}
END_TEST

int main(void)
{
    vk_test_seed();
    if (!vulkan_opens("test_vulkan_dec_norm", "skipped"))
        return 77;
    Suite *s = suite_create("vulkan_dec_norm");
    TCase *tc = tcase_create("dec_norm");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_dec_norms);
    tcase_add_test(tc, test_dec_chain);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
