// ctest-labels: vulkan
/* Vulkan: activations split by the op that makes them (issue 12;
 * backends/vulkan/vk_presplit.c). At decode rows (9-64) an RMS norm, the
 * gated norm and matmul_swiglu's SwiGLU also write matmul_cm.comp's f16
 * terms of their output, and the next product of that output reads them
 * instead of running cm_split.comp. Checked here:
 *   - chains norm -> matmul (precise and fast), add + norm -> matmul, gated
 *     norm -> matmul, matmul_swiglu -> matmul, at decode shapes, against a
 *     float64 computation of the whole chain from the inputs, and bit for
 *     bit equal with $LLMEM_VULKAN_PRESPLIT=0 (the split pass: the terms
 *     are computed with its arithmetic from the same f32 values), which
 *     also runs the decode rows' old way (one workgroup a row in the
 *     norms and the SwiGLU, $LLMEM_VULKAN_ROW_SPLIT=1);
 *   - the terms are forgotten when their tensor is written after the norm
 *     (an upload, an in-place op, a copy into part of it): the product then
 *     reads the new values (float64 reference of those);
 *   - the same chains at prefill rows (129, 300: matmul_cmp.comp where it
 *     runs, $LLMEM_VULKAN_PRESPLIT_ROWS);
 *   - a norm's output with more rows than the decode plans (prefill) and a
 *     bad matmul (shapes that do not match) leave everything as it was;
 *   - a recorded step (norms, gated norm, SwiGLU and their products)
 *     replayed on new inputs with eager norms and products around it: the
 *     replay reads its own terms, and an eager product after a replay does
 *     not take terms the replay overwrote.
 * Where the device has no cooperative matrices (lavapipe) nothing is split
 * early and the same checks hold for the SIMT path. Without a usable
 * Vulkan device the suite is skipped.
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

/* ---- the chains -------------------------------------------------------------------------- */

enum { N_OUT = 6 };

/* One shape's inputs: x, r, y, z [m, k]; the norm weight nw [k]; w, g, u
 * [n, k] and d [n, n] bf16-exact weights. */
typedef struct chain_in {
    int32_t m, k, n;
    float *x, *r, *y, *z, *nw, *w, *g, *u, *d;
} chain_in;

/* Runs the chains of one shape on a vulkan backend opened with
 * $LLMEM_VULKAN_PRESPLIT=ps; out[i] (caller's, m n floats each): 0 x += r,
 * norm -> matmul w, 1 the same product fast, 2 norm of r -> matmul w, 3
 * gated norm of y, z -> matmul w, 4 matmul_swiglu (g, u) of the norm of r
 * -> matmul d, 5 the same as two matmuls and llmem_op_swiglu in place (the
 * model's path above 4 rows). */

static void run_chains(const chain_in *c, const char *ps, float *out[N_OUT])
{
    test_env keep = test_env_set("LLMEM_VULKAN_PRESPLIT", ps);
    /* with the split pass, the old prefill sums too: one column an invocation */
    test_env keep_vec = test_env_set("LLMEM_VULKAN_PF_SUM_VEC", strcmp(ps, "0") == 0 ? "0" : "1");
    /* and the decode rows' old way: one workgroup a row in the norms and
     * the SwiGLU */
    test_env keep_rows = test_env_save("LLMEM_VULKAN_ROW_SPLIT");
    if (strcmp(ps, "0") == 0)
        test_env_put("LLMEM_VULKAN_ROW_SPLIT", "1");
    llmem_backend *vk = test_open("vulkan");
    int32_t m = c->m, k = c->k, n = c->n;
    llmem_buffer *bx, *br, *by, *bz, *bnw, *bw, *bg, *bu, *bd, *bh, *bo, *bup;
    llmem_tensor x = vk_up_f32_2d(vk, &bx, c->x, m, k), r = vk_up_f32_2d(vk, &br, c->r, m, k);
    llmem_tensor y = vk_up_f32_2d(vk, &by, c->y, m, k), z = vk_up_f32_2d(vk, &bz, c->z, m, k);
    llmem_tensor nw = vk_up_f32_2d(vk, &bnw, c->nw, k, 0);
    llmem_tensor w = vk_up_bf16_2d(vk, &bw, c->w, n, k), g = vk_up_bf16_2d(vk, &bg, c->g, n, k);
    llmem_tensor u = vk_up_bf16_2d(vk, &bu, c->u, n, k), d = vk_up_bf16_2d(vk, &bd, c->d, n, n);
    llmem_tensor h = vk_up_f32_2d(vk, &bh, NULL, m, k), o = vk_up_f32_2d(vk, &bo, NULL, m, n);
    llmem_tensor upt = vk_up_f32_2d(vk, &bup, NULL, m, n);
    OK(llmem_op_add_rms_norm(vk, &x, &r, &nw, EPS, &h));
    OK(llmem_op_matmul(vk, &h, &w, &o));
    get_f32(&o, out[0]);
    OK(llmem_op_matmul_fast(vk, &h, &w, &o));
    get_f32(&o, out[1]);
    OK(llmem_op_rms_norm(vk, &r, &nw, EPS, &h));
    OK(llmem_op_matmul(vk, &h, &w, &o));
    get_f32(&o, out[2]);
    OK(llmem_op_rms_norm_gated(vk, &y, &z, &nw, 1, EPS, &y));
    OK(llmem_op_matmul(vk, &y, &w, &o));
    get_f32(&o, out[3]);
    OK(llmem_op_matmul_swiglu(vk, &h, &g, &u, &upt));
    OK(llmem_op_matmul(vk, &upt, &d, &o));
    get_f32(&o, out[4]);
    llmem_buffer *bgp;
    llmem_tensor gp = vk_up_f32_2d(vk, &bgp, NULL, m, n);
    OK(llmem_op_matmul(vk, &h, &u, &upt));
    OK(llmem_op_matmul(vk, &h, &g, &gp));
    OK(llmem_op_swiglu(vk, &gp, &upt, &upt));
    OK(llmem_op_matmul(vk, &upt, &d, &o));
    get_f32(&o, out[5]);
    llmem_buffer *all[] = {bx, br, by, bz, bnw, bw, bg, bu, bd, bh, bo, bup, bgp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        llmem_buffer_free(all[i]);
    llmem_backend_close(vk);
    test_env_restore(&keep_rows);
    test_env_restore(&keep_vec);
    test_env_restore(&keep);
}

/* The float64 chains of run_chains into ref[i] (m n doubles each). */
static void ref_chains(const chain_in *c, double *ref[N_OUT])
{
    int32_t m = c->m, k = c->k, n = c->n;
    size_t mk = (size_t)m * k, mn = (size_t)m * n;
    double *a = calloc(mk, sizeof *a), *h = calloc(mk, sizeof *h);
    double *gp = malloc(mn * sizeof *gp), *upp = malloc(mn * sizeof *upp);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(h);
    ck_assert_ptr_nonnull(gp);
    ck_assert_ptr_nonnull(upp);
    for (size_t i = 0; i < mk; i++)
        a[i] = (double)c->x[i] + c->r[i];
    vk_ref_norm(a, c->nw, m, k, EPS, h);
    vk_ref_mm(h, c->w, m, k, n, ref[0]);
    memcpy(ref[1], ref[0], mn * sizeof(double));
    for (size_t i = 0; i < mk; i++)
        a[i] = c->r[i];
    vk_ref_norm(a, c->nw, m, k, EPS, h); /* h: the norm of r, also matmul_swiglu's input */
    vk_ref_mm(h, c->w, m, k, n, ref[2]);
    vk_ref_mm(h, c->g, m, k, n, gp);
    vk_ref_mm(h, c->u, m, k, n, upp);
    for (size_t i = 0; i < mn; i++)
        gp[i] = vk_silu(gp[i]) * upp[i];
    vk_ref_mm(gp, c->d, m, n, n, ref[4]);
    memcpy(ref[5], ref[4], mn * sizeof(double));
    for (size_t i = 0; i < mk; i++)
        a[i] = (double)c->y[i] * vk_silu(c->z[i]);
    vk_ref_norm(a, c->nw, m, k, EPS, h);
    vk_ref_mm(h, c->w, m, k, n, ref[3]);
    free(a), free(h), free(gp), free(upp);
}

/* Decode shapes of the tensor-core plans: 16 and 64 rows (split-K), 40
 * (partial tiles), 9 (the first row count on matmul_cm), K from 264 to
 * 2048, n from 24 to 136 (also the down's K: n % 8 == 0); and prefill
 * rows, 129 and 300 ($LLMEM_VULKAN_PRESPLIT_ROWS 512; 129 x 520: two K
 * slices), where the products' sums go 4 columns an invocation: bit for
 * bit the split pass's chains with one column ($LLMEM_VULKAN_PF_SUM_VEC=0
 * in run_chains' "0" run). */
START_TEST(test_presplit_chains)
{
    static const int32_t shapes[][3] = {{16, 1024, 96}, {64, 512, 136}, {40, 2048, 40},
                                        {9, 264, 24},   {129, 520, 136}, {300, 264, 40}};
    /* (the prefill rows, 129 and 300, on matmul_cmp.comp where it runs) */
    test_env keep = test_env_set("LLMEM_VULKAN_PRESPLIT_ROWS", "512");
    static const char *names[N_OUT] = {"add + norm -> matmul", "add + norm -> matmul_fast",
                                       "norm -> matmul", "gated norm -> matmul",
                                       "matmul_swiglu -> matmul",
                                       "matmul, matmul, swiglu in place -> matmul"};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        chain_in c = {.m = shapes[si][0], .k = shapes[si][1], .n = shapes[si][2]};
        size_t mk = (size_t)c.m * c.k, nk = (size_t)c.n * c.k, mn = (size_t)c.m * c.n;
        c.x = rand_vec(mk, -2, 2), c.r = rand_vec(mk, -2, 2), c.y = rand_vec(mk, -3, 3);
        c.z = rand_vec(mk, -3, 3), c.nw = rand_vec((size_t)c.k, 0.5f, 1.5f);
        c.w = rand_vec(nk, -1, 1), c.g = rand_vec(nk, -1, 1), c.u = rand_vec(nk, -1, 1);
        c.d = rand_vec((size_t)c.n * c.n, -1, 1);
        vk_trunc_bf16(c.w, nk), vk_trunc_bf16(c.g, nk), vk_trunc_bf16(c.u, nk);
        vk_trunc_bf16(c.d, (size_t)c.n * c.n);
        float *o[3][N_OUT];
        double *ref[N_OUT];
        for (int i = 0; i < N_OUT; i++) {
            for (int j = 0; j < 3; j++) {
                o[j][i] = malloc(mn * sizeof(float));
                ck_assert_ptr_nonnull(o[j][i]);
            }
            ref[i] = malloc(mn * sizeof(double));
            ck_assert_ptr_nonnull(ref[i]);
        }
        run_chains(&c, "1", o[0]);
        run_chains(&c, "0", o[1]);
        run_chains(&c, "2", o[2]); /* the producers' terms even without cooperative matrices */
        ref_chains(&c, ref);
        for (int i = 0; i < N_OUT; i++) {
            char what[128];
            snprintf(what, sizeof what, "%s, %dx%dx%d", names[i], c.m, c.k, c.n);
            /* f32 norms and products: a few 2^-24 per step; fast: vk_fast_rtol() */
            vk_expect_close(o[0][i], ref[i], c.m, c.n, i == 1 ? vk_fast_rtol() : 2e-5, what);
            ck_assert_msg(memcmp(o[0][i], o[1][i], mn * sizeof(float)) == 0,
                          "%s: differs from LLMEM_VULKAN_PRESPLIT=0", what);
            ck_assert_msg(memcmp(o[2][i], o[1][i], mn * sizeof(float)) == 0,
                          "%s: LLMEM_VULKAN_PRESPLIT=2 differs from 0", what);
            free(o[0][i]), free(o[1][i]), free(o[2][i]), free(ref[i]);
        }
        free(c.x), free(c.r), free(c.y), free(c.z), free(c.nw), free(c.w), free(c.g), free(c.u);
        free(c.d);
    }
    test_env_restore(&keep);
}
END_TEST

/* norm -> (a write of h) -> matmul: the product must read h as written
 * last. Writes: an upload of new values, an in-place scale, a copy into
 * the second half of h's rows (part of its range), and, as a control that
 * must keep the terms, a write next to h in the same buffer. */
START_TEST(test_presplit_invalidated)
{
    enum { M = 32, K = 512, N = 64 };
    llmem_backend *vk = test_open("vulkan");
    float *x = rand_vec((size_t)M * K, -2, 2), *x2 = rand_vec((size_t)M * K, -1, 1);
    float *nw = rand_vec(K, 0.5f, 1.5f), *w = rand_vec((size_t)N * K, -1, 1);
    vk_trunc_bf16(w, (size_t)N * K);
    llmem_buffer *bx, *bnw, *bw, *bh, *bo, *bx2;
    llmem_tensor tx = vk_up_f32_2d(vk, &bx, x, M, K), tnw = vk_up_f32_2d(vk, &bnw, nw, K, 0);
    llmem_tensor tw = vk_up_bf16_2d(vk, &bw, w, N, K), tx2 = vk_up_f32_2d(vk, &bx2, x2, M, K);
    /* h and a neighbour [M, K] in one buffer */
    OK(llmem_buffer_alloc(vk, 2 * (size_t)M * K * 4, &bh));
    llmem_tensor th = {bh, 0, F32, 2, {M, K, 1, 1}}, tnb = {bh, (size_t)M * K * 4, F32, 2, {M, K, 1, 1}};
    llmem_tensor to = vk_up_f32_2d(vk, &bo, NULL, M, N);
    double *a = malloc((size_t)M * K * sizeof *a), *h = malloc((size_t)M * K * sizeof *h);
    double *ref = malloc((size_t)M * N * sizeof *ref);
    float *o = malloc((size_t)M * N * sizeof *o), *hv = malloc((size_t)M * K * sizeof *hv);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(h);
    ck_assert_ptr_nonnull(ref);
    ck_assert_ptr_nonnull(o);
    ck_assert_ptr_nonnull(hv);
    for (int mode = 0; mode < 4; mode++) {
        OK(llmem_op_rms_norm(vk, &tx, &tnw, EPS, &th));
        if (mode == 0) {
            OK(llmem_buffer_upload(bh, 0, x2, (size_t)M * K * 4));
        } else if (mode == 1) {
            OK(llmem_op_scale(vk, &th, -3.0f, &th));
        } else if (mode == 2) { /* rows M/2 .. M of h from x2's first rows */
            llmem_tensor half = {bh, (size_t)(M / 2) * K * 4, F32, 2, {M / 2, K, 1, 1}};
            llmem_tensor src = {bx2, 0, F32, 2, {M / 2, K, 1, 1}};
            OK(llmem_op_copy(vk, &src, 0, &half));
        } else {
            OK(llmem_op_scale(vk, &tx2, 1.0f, &tnb)); /* next to h, not in it */
        }
        OK(llmem_op_matmul(vk, &th, &tw, &to));
        get_f32(&to, o);
        get_f32(&th, hv); /* h as it is now; the reference is built from it in float64 */
        /* and h itself as it must be: the norm's output, then the write */
        for (size_t i = 0; i < (size_t)M * K; i++)
            a[i] = x[i];
        vk_ref_norm(a, nw, M, K, EPS, h);
        for (size_t i = 0; i < (size_t)M * K; i++) {
            double want = mode == 0   ? x2[i]
                          : mode == 1 ? -3.0 * h[i]
                          : mode == 2 && i >= (size_t)(M / 2) * K ? x2[i - (size_t)(M / 2) * K]
                                                                  : h[i];
            ck_assert_msg(fabs(hv[i] - want) <= 1e-5 * (1 + fabs(want)),
                          "write %d: h[%zu] = %g, want %g", mode, i, hv[i], want);
            a[i] = hv[i];
        }
        vk_ref_mm(a, w, M, K, N, ref);
        char what[64];
        snprintf(what, sizeof what, "norm, write %d, matmul", mode);
        vk_expect_close(o, ref, M, N, 1e-5, what);
    }
    free(a), free(h), free(ref), free(o), free(hv), free(x), free(x2), free(nw), free(w);
    llmem_buffer *all[] = {bx, bnw, bw, bh, bo, bx2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        llmem_buffer_free(all[i]);
    llmem_backend_close(vk);
}
END_TEST

/* A matmul of a normed h whose K does not match the weights fails with
 * LLMEM_E_INVALID and leaves its output as it was; the next good product
 * of the same h is right. 65 rows (above the decode plans: a prefill
 * product) norm -> matmul too. */
START_TEST(test_presplit_bad_and_prefill)
{
    enum { K = 256, N = 32 };
    llmem_backend *vk = test_open("vulkan");
    for (int32_t m = 16; m <= 65; m += 49) {
        float *x = rand_vec((size_t)m * K, -2, 2), *nw = rand_vec(K, 0.5f, 1.5f);
        float *w = rand_vec((size_t)N * K, -1, 1);
        vk_trunc_bf16(w, (size_t)N * K);
        llmem_buffer *bx, *bnw, *bw, *bh, *bo, *bwb;
        llmem_tensor tx = vk_up_f32_2d(vk, &bx, x, m, K), tnw = vk_up_f32_2d(vk, &bnw, nw, K, 0);
        llmem_tensor tw = vk_up_bf16_2d(vk, &bw, w, N, K), th = vk_up_f32_2d(vk, &bh, NULL, m, K);
        llmem_tensor wbad = vk_up_bf16_2d(vk, &bwb, w, N, K - 8);
        llmem_tensor to = vk_up_f32_2d(vk, &bo, NULL, m, N);
        OK(llmem_buffer_fill(bo, 0, (size_t)m * N * 4, 0x7fc00000u));
        OK(llmem_op_rms_norm(vk, &tx, &tnw, EPS, &th));
        ck_assert_int_eq(llmem_op_matmul(vk, &th, &wbad, &to), LLMEM_E_INVALID);
        float *o = malloc((size_t)m * N * sizeof *o);
        ck_assert_ptr_nonnull(o);
        get_f32(&to, o);
        for (size_t i = 0; i < (size_t)m * N; i++)
            ck_assert_msg(isnan(o[i]), "rejected matmul wrote out[%zu]", i);
        OK(llmem_op_rms_norm(vk, &tx, &tnw, EPS, &th));
        OK(llmem_op_matmul(vk, &th, &tw, &to));
        get_f32(&to, o);
        double *a = malloc((size_t)m * K * sizeof *a), *h = malloc((size_t)m * K * sizeof *h);
        double *ref = malloc((size_t)m * N * sizeof *ref);
        ck_assert_ptr_nonnull(a);
        ck_assert_ptr_nonnull(h);
        ck_assert_ptr_nonnull(ref);
        for (size_t i = 0; i < (size_t)m * K; i++)
            a[i] = x[i];
        vk_ref_norm(a, nw, m, K, EPS, h);
        vk_ref_mm(h, w, m, K, N, ref);
        char what[64];
        snprintf(what, sizeof what, "norm -> matmul, %d rows", m);
        vk_expect_close(o, ref, m, N, 2e-5, what);
        free(a), free(h), free(ref), free(o), free(x), free(nw), free(w);
        llmem_buffer *all[] = {bx, bnw, bw, bh, bo, bwb};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            llmem_buffer_free(all[i]);
    }
    llmem_backend_close(vk);
}
END_TEST

/* ---- recorded steps -------------------------------------------------------------------- */

/* One decode-like step: x += r, h = norm(x) -> o0 = h · wᵀ; gated norm of
 * y, z in place -> o1 = y · wᵀ; gate, up of h, swiglu in place -> o2 =
 * up · dᵀ. */
typedef struct step_ctx {
    llmem_backend *be;
    llmem_tensor x, r, y, z, nw, w, g, u, d, h, gp, up, o[3];
} step_ctx;

static llmem_status step_fn(void *p)
{
    step_ctx *c = p;
    llmem_status st;
    if ((st = llmem_op_add_rms_norm(c->be, &c->x, &c->r, &c->nw, EPS, &c->h)) != LLMEM_OK ||
        (st = llmem_op_matmul(c->be, &c->h, &c->w, &c->o[0])) != LLMEM_OK ||
        (st = llmem_op_rms_norm_gated(c->be, &c->y, &c->z, &c->nw, 1, EPS, &c->y)) != LLMEM_OK ||
        (st = llmem_op_matmul(c->be, &c->y, &c->w, &c->o[1])) != LLMEM_OK ||
        (st = llmem_op_matmul(c->be, &c->h, &c->g, &c->gp)) != LLMEM_OK ||
        (st = llmem_op_matmul(c->be, &c->h, &c->u, &c->up)) != LLMEM_OK ||
        (st = llmem_op_swiglu(c->be, &c->gp, &c->up, &c->up)) != LLMEM_OK)
        return st;
    return llmem_op_matmul(c->be, &c->up, &c->d, &c->o[2]);
}

/* float64 of step_fn's three outputs for inputs x, r, y, z (ref[3][m n]). */
static void ref_step(const chain_in *c, double *ref[3])
{
    chain_in t = *c;
    double *all[N_OUT];
    size_t mn = (size_t)c->m * c->n;
    for (int i = 0; i < N_OUT; i++) {
        all[i] = malloc(mn * sizeof(double));
        ck_assert_ptr_nonnull(all[i]);
    }
    /* ref_chains' chain 0 is the add + norm product; its chain 4 the FFN of
     * the norm of r: here the FFN reads the norm of x + r, so swap r in */
    ref_chains(&t, all);
    memcpy(ref[0], all[0], mn * sizeof(double));
    memcpy(ref[1], all[3], mn * sizeof(double));
    float *xr = malloc((size_t)c->m * c->k * sizeof *xr);
    ck_assert_ptr_nonnull(xr);
    for (size_t i = 0; i < (size_t)c->m * c->k; i++)
        xr[i] = c->x[i] + c->r[i]; /* the f32 sum the device normalizes */
    t.r = xr;
    ref_chains(&t, all);
    memcpy(ref[2], all[4], mn * sizeof(double));
    free(xr);
    for (int i = 0; i < N_OUT; i++)
        free(all[i]);
}

/* A step recorded with the terms written by its norms and SwiGLU, replayed
 * three times on new inputs, with eager work between the replays that
 * (a) writes the terms buffer for another tensor (a norm of q) before a
 * replay, whose products must read their own terms, and (b) after a
 * replay, reads a norm's output made before it (the replay rewrote the
 * terms buffer: that product must not take the stale terms). Each replay's
 * outputs against float64 of its inputs; q's product too. */
START_TEST(test_presplit_recorded)
{
    enum { M = 32, K = 512, N = 64, REPS = 3 };
    llmem_backend *vk = test_open("vulkan");
    chain_in c = {.m = M, .k = K, .n = N};
    size_t mk = (size_t)M * K, nk = (size_t)N * K, mn = (size_t)M * N;
    c.nw = rand_vec(K, 0.5f, 1.5f);
    c.w = rand_vec(nk, -1, 1), c.g = rand_vec(nk, -1, 1), c.u = rand_vec(nk, -1, 1);
    c.d = rand_vec((size_t)N * N, -1, 1);
    vk_trunc_bf16(c.w, nk), vk_trunc_bf16(c.g, nk), vk_trunc_bf16(c.u, nk), vk_trunc_bf16(c.d, (size_t)N * N);
    llmem_buffer *b[16];
    step_ctx s = {.be = vk};
    s.x = vk_up_f32_2d(vk, &b[0], NULL, M, K), s.r = vk_up_f32_2d(vk, &b[1], NULL, M, K);
    s.y = vk_up_f32_2d(vk, &b[2], NULL, M, K), s.z = vk_up_f32_2d(vk, &b[3], NULL, M, K);
    s.nw = vk_up_f32_2d(vk, &b[4], c.nw, K, 0);
    s.w = vk_up_bf16_2d(vk, &b[5], c.w, N, K), s.g = vk_up_bf16_2d(vk, &b[6], c.g, N, K);
    s.u = vk_up_bf16_2d(vk, &b[7], c.u, N, K), s.d = vk_up_bf16_2d(vk, &b[8], c.d, N, N);
    s.h = vk_up_f32_2d(vk, &b[9], NULL, M, K), s.gp = vk_up_f32_2d(vk, &b[10], NULL, M, N);
    s.up = vk_up_f32_2d(vk, &b[11], NULL, M, N);
    for (int i = 0; i < 3; i++)
        s.o[i] = vk_up_f32_2d(vk, &b[12 + i], NULL, M, N);
    llmem_buffer *bq, *bqh, *bqo;
    float *q = rand_vec(mk, -2, 2);
    llmem_tensor tq = vk_up_f32_2d(vk, &bq, q, M, K), tqh = vk_up_f32_2d(vk, &bqh, NULL, M, K);
    llmem_tensor tqo = vk_up_f32_2d(vk, &bqo, NULL, M, N);
    float *in[4];
    for (int i = 0; i < 4; i++)
        in[i] = malloc(mk * sizeof(float));
    double *ref[3], *qref = malloc(mn * sizeof(double)), *qa = malloc(mk * sizeof(double));
    float *o = malloc(mn * sizeof(float));
    ck_assert_ptr_nonnull(qref);
    ck_assert_ptr_nonnull(qa);
    ck_assert_ptr_nonnull(o);
    for (int i = 0; i < 3; i++) {
        ref[i] = malloc(mn * sizeof(double));
        ck_assert_ptr_nonnull(ref[i]);
    }
    for (size_t i = 0; i < mk; i++)
        qa[i] = q[i];
    vk_ref_norm(qa, c.nw, M, K, EPS, qa);
    vk_ref_mm(qa, c.w, M, K, N, qref);
    llmem_recording *rec = NULL;
    for (int rep = -1; rep < REPS; rep++) {
        for (int i = 0; i < 4; i++)
            for (size_t j = 0; j < mk; j++)
                in[i][j] = frand(i < 2 ? -2 : -3, i < 2 ? 2 : 3);
        c.x = in[0], c.r = in[1], c.y = in[2], c.z = in[3];
        llmem_tensor *dst[4] = {&s.x, &s.r, &s.y, &s.z};
        for (int i = 0; i < 4; i++)
            OK(llmem_buffer_upload(dst[i]->buf, 0, in[i], mk * 4));
        if (rep < 0) { /* the warm-up, then the recording */
            OK(step_fn(&s));
            OK(llmem_backend_synchronize(vk));
            for (int i = 0; i < 4; i++)
                OK(llmem_buffer_upload(dst[i]->buf, 0, in[i], mk * 4));
            OK(llmem_backend_record(vk, step_fn, &s, &rec));
            ck_assert_ptr_nonnull(rec);
            OK(llmem_recording_replay(rec));
        } else {
            OK(llmem_op_rms_norm(vk, &tq, &s.nw, EPS, &tqh)); /* (a) */
            OK(llmem_recording_replay(rec));
            OK(llmem_op_matmul(vk, &tqh, &s.w, &tqo)); /* (b) */
            get_f32(&tqo, o);
            vk_expect_close(o, qref, M, N, 2e-5, "a norm's product after a replay");
        }
        ref_step(&c, ref);
        for (int i = 0; i < 3; i++) {
            char what[64];
            snprintf(what, sizeof what, "replay %d, output %d", rep + 1, i);
            get_f32(&s.o[i], o);
            vk_expect_close(o, ref[i], M, N, 2e-5, what);
        }
    }
    llmem_recording_free(rec);
    for (int i = 0; i < 15; i++)
        llmem_buffer_free(b[i]);
    llmem_buffer_free(bq), llmem_buffer_free(bqh), llmem_buffer_free(bqo);
    for (int i = 0; i < 4; i++)
        free(in[i]);
    for (int i = 0; i < 3; i++)
        free(ref[i]);
    free(qref), free(qa), free(o), free(q), free(c.nw), free(c.w), free(c.g), free(c.u), free(c.d);
    llmem_backend_close(vk);
}
END_TEST

int main(void)
{
    vk_test_seed();
    if (!vulkan_opens("test_vulkan_presplit", "skipped"))
        return 77;
    Suite *s = suite_create("vulkan_presplit");
    TCase *tc = tcase_create("presplit");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_presplit_chains);
    tcase_add_test(tc, test_presplit_invalidated);
    tcase_add_test(tc, test_presplit_bad_and_prefill);
    tcase_add_test(tc, test_presplit_recorded);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
