// ctest-labels: vulkan
/* Vulkan: the up and gate products' split-K sums folded into the SwiGLU
 * (issue 12; backends/vulkan/vk_sum.c vk_sum_park / vk_sum_swiglu_ok,
 * cm_split.comp FOLD, $LLMEM_VULKAN_SWIGLU_FOLD). At 9-64 rows on
 * cooperative matrices the FFN's up = h · W_upᵀ, gate = h · W_gateᵀ,
 * silu(gate) * up record no sum pass: the SwiGLU reads both products' raw
 * tiles, and its terms (the down product's activations) go past the
 * exponents it reads in the presplit buffer. Checked here, precise and
 * fast, at 9, 16, 40 and 64 rows (products of one and several K slices)
 * and at 129 and 256 rows (prefill), with the fold on at decode rows (1:
 * the row in registers), unset (the default, 13), 2 (the two reads of
 * the row), 13 and 6 (the same with the prefill rows; 13 with more
 * workgroups a decode row) and off (0):
 *   - two FFN layers as the model runs them (x += r, h = norm(x); up;
 *     gate; swiglu in place on up; down; then x += down, h = norm(x) and
 *     the same again): the downs, up and gate against a float64
 *     computation from the inputs, and bit for bit equal with the fold
 *     off (the gate product's output too, which the fold writes itself);
 *   - gate recorded before up and the SwiGLU written over the gate (up's
 *     output then written by the fold), and into a third tensor (both
 *     written): the same bits as with the fold off;
 *   - a download of up between the products (the held sum recorded first:
 *     no pair): the same bits.
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

/* the outputs: the two layers' downs and x, up (the SwiGLU's output) and
 * gate of the first; the gate-first chain's swiglu (over gate) and up; the
 * third-tensor chain's out, gate and up; the interrupted chain's up (after
 * the download), swiglu and down */
enum { O_D1, O_D2, O_X, O_SW, O_G, O_B_SW, O_B_U, O_C_SW, O_C_G, O_C_U, O_I_U, O_I_SW, O_I_D,
       N_O };

/* One shape's inputs: x, r [m, k]; nw [k]; wu, wg [n, k], wd [k, n]
 * bf16-exact. */
typedef struct ff_in {
    int32_t m, k, n;
    bool fast;
    float *x, *r, *nw, *wu, *wg, *wd;
} ff_in;

/* A vulkan backend opened with $LLMEM_VULKAN_SWIGLU_FOLD=fold (NULL:
 * unset), which it reads when it opens. */
static llmem_backend *open_fold(const char *fold)
{
    static const char *const name = "LLMEM_VULKAN_SWIGLU_FOLD";
    return test_open_with("vulkan", 1, &name, &fold);
}

/* Runs every chain on vk; o[i] malloc'd here. */
static void run_all(const ff_in *c, llmem_backend *vk, float *o[N_O])
{
    llmem_status (*mm)(llmem_backend *, const llmem_tensor *, const llmem_tensor *,
                       const llmem_tensor *) = c->fast ? llmem_op_matmul_fast : llmem_op_matmul;
    int32_t m = c->m, k = c->k, n = c->n;
    size_t sz[N_O];
    for (int i = 0; i < N_O; i++) {
        sz[i] = (size_t)m * (i <= O_X || i == O_I_D ? k : n);
        o[i] = malloc(sz[i] * sizeof(float));
        ck_assert_ptr_nonnull(o[i]);
    }
    llmem_buffer *bx, *br, *bnw, *bu, *bg, *bd, *bh, *bup, *bgt, *bdn, *b3;
    llmem_tensor x = vk_up_f32_2d(vk, &bx, c->x, m, k), r = vk_up_f32_2d(vk, &br, c->r, m, k);
    llmem_tensor nw = vk_up_f32_2d(vk, &bnw, c->nw, k, 0);
    llmem_tensor wu = vk_up_bf16_2d(vk, &bu, c->wu, n, k), wg = vk_up_bf16_2d(vk, &bg, c->wg, n, k);
    llmem_tensor wd = vk_up_bf16_2d(vk, &bd, c->wd, k, n);
    llmem_tensor h = vk_up_f32_2d(vk, &bh, NULL, m, k), up = vk_up_f32_2d(vk, &bup, NULL, m, n);
    llmem_tensor gate = vk_up_f32_2d(vk, &bgt, NULL, m, n);
    llmem_tensor dn = vk_up_f32_2d(vk, &bdn, NULL, m, k), t3 = vk_up_f32_2d(vk, &b3, NULL, m, n);
    /* two layers, the model's order */
    OK(llmem_op_add_rms_norm(vk, &x, &r, &nw, EPS, &h));
    for (int layer = 0; layer < 2; layer++) {
        if (layer == 1)
            OK(llmem_op_add_rms_norm(vk, &x, &dn, &nw, EPS, &h));
        OK(mm(vk, &h, &wu, &up));
        OK(mm(vk, &h, &wg, &gate));
        OK(llmem_op_swiglu(vk, &gate, &up, &up));
        OK(mm(vk, &up, &wd, &dn));
        get_f32(&dn, o[layer == 0 ? O_D1 : O_D2]);
        if (layer == 0) {
            get_f32(&up, o[O_SW]);
            get_f32(&gate, o[O_G]);
        }
    }
    get_f32(&x, o[O_X]);
    /* gate first, the SwiGLU over the gate */
    OK(llmem_op_rms_norm(vk, &r, &nw, EPS, &h));
    OK(mm(vk, &h, &wg, &gate));
    OK(mm(vk, &h, &wu, &up));
    OK(llmem_op_swiglu(vk, &gate, &up, &gate));
    get_f32(&gate, o[O_B_SW]);
    get_f32(&up, o[O_B_U]);
    /* into a third tensor */
    OK(llmem_op_rms_norm(vk, &r, &nw, EPS, &h));
    OK(mm(vk, &h, &wu, &up));
    OK(mm(vk, &h, &wg, &gate));
    OK(llmem_op_swiglu(vk, &gate, &up, &t3));
    get_f32(&t3, o[O_C_SW]);
    get_f32(&gate, o[O_C_G]);
    get_f32(&up, o[O_C_U]);
    /* a download between the products */
    OK(llmem_op_rms_norm(vk, &r, &nw, EPS, &h));
    OK(mm(vk, &h, &wu, &up));
    get_f32(&up, o[O_I_U]);
    OK(mm(vk, &h, &wg, &gate));
    OK(llmem_op_swiglu(vk, &gate, &up, &up));
    OK(mm(vk, &up, &wd, &dn));
    get_f32(&up, o[O_I_SW]);
    get_f32(&dn, o[O_I_D]);
    llmem_buffer *all[] = {bx, br, bnw, bu, bg, bd, bh, bup, bgt, bdn, b3};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        llmem_buffer_free(all[i]);
}

/* ---- float64 references ----------------------------------------------------------------- */

/* h -> up, gate [m, n], sw = silu(gate) * up, down [m, k] */
static void ref_ffn(const ff_in *c, const double *h, double *up, double *gate, double *sw,
                    double *down)
{
    size_t mn = (size_t)c->m * c->n;
    vk_ref_mm(h, c->wu, c->m, c->k, c->n, up);
    vk_ref_mm(h, c->wg, c->m, c->k, c->n, gate);
    for (size_t i = 0; i < mn; i++)
        sw[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
    vk_ref_mm(sw, c->wd, c->m, c->n, c->k, down);
}

static void check_f64(const ff_in *cp, float *const on[N_O]);

/* the backends: $LLMEM_VULKAN_SWIGLU_FOLD 1, 0, unset, 2, 13 (1 with the
 * prefill rows and ceil(128 / rows) workgroups a decode row), 6 (2 with
 * the prefill rows) */
enum { B_ON, B_OFF, B_DEFAULT, B_LOOP, B_ALL, B_LOOP_PF, N_B };

static void check_shape(llmem_backend *const be[N_B], int32_t m, int32_t k, int32_t n, bool fast)
{
    ff_in c = {.m = m, .k = k, .n = n, .fast = fast};
    size_t mk = (size_t)m * k, nk = (size_t)n * k;
    c.x = rand_vals(mk, -2, 2, false), c.r = rand_vals(mk, -2, 2, false);
    c.nw = rand_vals((size_t)k, 0.5f, 1.5f, false);
    c.wu = rand_vals(nk, -1, 1, true), c.wg = rand_vals(nk, -1, 1, true);
    c.wd = rand_vals(nk, -1, 1, true);
    float *on[N_O], *off[N_O], *df[N_O], *lp[N_O], *al[N_O], *lpf[N_O];
    run_all(&c, be[B_ON], on);
    run_all(&c, be[B_OFF], off);
    run_all(&c, be[B_DEFAULT], df);
    run_all(&c, be[B_LOOP], lp);
    run_all(&c, be[B_ALL], al);
    run_all(&c, be[B_LOOP_PF], lpf);
    static const char *names[N_O] = {
        "down, layer 1", "down, layer 2", "x", "swiglu in place on up", "gate",
        "gate first: swiglu over gate", "gate first: up", "third tensor: swiglu",
        "third tensor: gate", "third tensor: up", "interrupted: up", "interrupted: swiglu",
        "interrupted: down"};
    char what[160];
    for (int i = 0; i < N_O; i++) {
        size_t bytes = (size_t)m * (i <= O_X || i == O_I_D ? k : n) * sizeof(float);
        snprintf(what, sizeof what, "%s (%dx%dx%d %s)", names[i], m, k, n,
                 fast ? "fast" : "precise");
        ck_assert_msg(memcmp(on[i], off[i], bytes) == 0, "%s: fold 1 differs from 0", what);
        ck_assert_msg(memcmp(df[i], off[i], bytes) == 0, "%s: the default differs from 0", what);
        ck_assert_msg(memcmp(lp[i], off[i], bytes) == 0, "%s: fold 2 differs from 0", what);
        ck_assert_msg(memcmp(al[i], off[i], bytes) == 0, "%s: fold 13 differs from 0", what);
        ck_assert_msg(memcmp(lpf[i], off[i], bytes) == 0, "%s: fold 6 differs from 0", what);
    }
    check_f64(&c, on);
    for (int i = 0; i < N_O; i++)
        free(on[i]), free(off[i]), free(df[i]), free(lp[i]), free(al[i]), free(lpf[i]);
    free(c.x), free(c.r), free(c.nw), free(c.wu), free(c.wg), free(c.wd);
}

/* Every output of run_all against a float64 computation from c's inputs. */
static void check_f64(const ff_in *cp, float *const on[N_O])
{
    ff_in c = *cp;
    int32_t m = c.m, k = c.k, n = c.n;
    bool fast = c.fast;
    size_t mk = (size_t)m * k, mn = (size_t)m * n;
    char what[160];
    /* float64: fast mode rounds each product's activations to 11 bits */
    double tol = fast ? 4e-3 : 2e-5;
    double *a = calloc(mk, sizeof *a), *h = calloc(mk, sizeof *h), *d = calloc(mk, sizeof *d);
    double *up = calloc(mn, sizeof *up), *g = calloc(mn, sizeof *g), *sw = calloc(mn, sizeof *sw);
    ck_assert(a && h && d && up && g && sw);
    snprintf(what, sizeof what, "%dx%dx%d %s", m, k, n, fast ? "fast" : "precise");
    for (size_t i = 0; i < mk; i++)
        a[i] = (double)c.x[i] + c.r[i];
    vk_ref_norm(a, c.nw, m, k, EPS, h);
    ref_ffn(&c, h, up, g, sw, d);
    vk_expect_close(on[O_G], g, m, n, tol, what);
    vk_expect_close(on[O_SW], sw, m, n, tol, what);
    vk_expect_close(on[O_D1], d, m, k, 2 * tol, what);
    for (size_t i = 0; i < mk; i++)
        a[i] += d[i];
    vk_expect_close(on[O_X], a, m, k, 2 * tol, what);
    vk_ref_norm(a, c.nw, m, k, EPS, h);
    ref_ffn(&c, h, up, g, sw, d);
    vk_expect_close(on[O_D2], d, m, k, 4 * tol, what);
    for (size_t i = 0; i < mk; i++)
        a[i] = c.r[i];
    vk_ref_norm(a, c.nw, m, k, EPS, h);
    ref_ffn(&c, h, up, g, sw, d);
    vk_expect_close(on[O_B_SW], sw, m, n, tol, what);
    vk_expect_close(on[O_B_U], up, m, n, tol, what);
    vk_expect_close(on[O_C_SW], sw, m, n, tol, what);
    vk_expect_close(on[O_C_G], g, m, n, tol, what);
    vk_expect_close(on[O_C_U], up, m, n, tol, what);
    vk_expect_close(on[O_I_U], up, m, n, tol, what);
    vk_expect_close(on[O_I_SW], sw, m, n, tol, what);
    vk_expect_close(on[O_I_D], d, m, k, 2 * tol, what);
    free(a), free(h), free(d), free(up), free(g), free(sw);
}

/* 16 and 64 rows (the batched decode), 40 (partial row tiles) and 9 (the
 * first row count on tensor cores), K from 256 to 1024 and n up to 2048
 * (several K slices in the down product, and in up and gate where the
 * output tiles are few); 129 and 256 rows: prefill (folded with 13 and 6). */
START_TEST(test_swiglu_fold_chains)
{
    static const int32_t shapes[][3] = {
        {16, 1024, 2048}, {64, 512, 1024}, {16, 256, 512}, {40, 512, 264}, {9, 264, 136},
        {129, 256, 520}, {256, 512, 1024}};
    llmem_backend *be[N_B] = {open_fold("1"),  open_fold("0"),  open_fold(NULL),
                              open_fold("2"),  open_fold("13"), open_fold("6")};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int fast = 0; fast < 2; fast++)
            check_shape(be, shapes[i][0], shapes[i][1], shapes[i][2], fast == 1);
    for (int b = 0; b < N_B; b++)
        llmem_backend_close(be[b]);
}
END_TEST

/* $LLMEM_VULKAN_PAIR_PLAN=1 (backends/vulkan/vk_sum.c vk_pair_plan): at 33-64 rows in
 * fast mode, up's weights learnt as the first of a pair in layer 1 (gate parked its sum),
 * up and gate each planned into half the wave in layer 2 and in the third-tensor chain, up
 * alone so in the interrupted one (no pair: the download records its sum). The shape is
 * one where that changes the plan on the H200 (132 SMs: 45 column tiles of 256, 2 K
 * slices of 10 steps each, 1 slice paired); every output against float64, with the knob
 * on and off (the plans differ, so the bits may). Skipped on llvmpipe, which has no
 * cooperative matrices (the SIMT path takes no plan) and would take minutes. */
START_TEST(test_pair_plan)
{
    llmem_backend *probe = test_open("vulkan");
    llmem_backend_info info;
    OK(llmem_backend_get_info(probe, &info));
    bool cpu = strstr(info.device_name, "llvmpipe") != NULL;
    llmem_backend_close(probe);
    if (cpu)
        return;
    ff_in c = {.m = 40, .k = 1280, .n = 45 * 256, .fast = true};
    size_t mk = (size_t)c.m * c.k, nk = (size_t)c.n * c.k;
    c.x = rand_vals(mk, -2, 2, false), c.r = rand_vals(mk, -2, 2, false);
    c.nw = rand_vals((size_t)c.k, 0.5f, 1.5f, false);
    c.wu = rand_vals(nk, -1, 1, true), c.wg = rand_vals(nk, -1, 1, true);
    c.wd = rand_vals(nk, -1, 1, true);
    test_env keep = test_env_save("LLMEM_VULKAN_PAIR_PLAN");
    for (int on = 1; on >= 0; on--) {
        test_env_put("LLMEM_VULKAN_PAIR_PLAN", on ? "1" : "0");
        llmem_backend *vk = open_fold(NULL);
        float *o[N_O];
        run_all(&c, vk, o);
        check_f64(&c, o);
        for (int i = 0; i < N_O; i++)
            free(o[i]);
        llmem_backend_close(vk);
    }
    test_env_restore(&keep);
    free(c.x), free(c.r), free(c.nw), free(c.wu), free(c.wg), free(c.wd);
}
END_TEST

int main(void)
{
    vk_test_seed();
    if (!vulkan_opens("test_vulkan_swiglu_fold", "skipped"))
        return 77;
    Suite *s = suite_create("vulkan_swiglu_fold");
    TCase *tc = tcase_create("swiglu_fold");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_swiglu_fold_chains);
    tcase_add_test(tc, test_pair_plan);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
