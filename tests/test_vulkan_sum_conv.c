// ctest-labels: vulkan
/* Vulkan: the Mamba-2 decode conv folded into in_proj's held split-K sum
 * (issue 12, fifteenth session; backends/vulkan/vk_sum.c vk_sum_take_conv,
 * sum_slices_cm.comp CONV and VEC4, $LLMEM_VULKAN_SUM_CONV). A decode step of m
 * streams records in_proj (a product of m rows), three column copies of
 * its output (z, xBC, dt) and the causal conv of xBC with the conv state;
 * on cooperative matrices at 9-64 rows the product's sum pass writes the
 * copies and, with the knob on, does the conv too. Checked at 9, 16, 33
 * and 64 rows, precise and fast, with an f32 state and bf16 weights and
 * bias, and with a bf16 state (16-bit stores by atomics), f32 weights and
 * no bias (d_conv 4 and 3); state slots shuffled, sources and destinations
 * apart, some aliased (a stream's src = its dst), some zero (src -1), some
 * not written (dst -1):
 *   - the conv's output, the copies and every state slot bit for bit
 *     equal with $LLMEM_VULKAN_SUM_CONV 1 (the fold), 2 (the pass moving
 *     4 columns an invocation), 3 (both) and 0 (the conv's own dispatch,
 *     ssm_conv.comp);
 *   - against float64 from the inputs: in_proj's product, then the conv
 *     (HF transformers Mamba2Mixer.torch_forward, one token: silu(b +
 *     sum_k w[c, k] u_k), u the state rows then the token), the new state
 *     (shifted by one, the token last) in every destination slot, every
 *     other slot unchanged;
 *   - a view where a stream reads another stream's destination (copy-on-
 *     write: the fold refuses it, the conv snapshots its sources) gives
 *     the same values.
 * Where the device has no cooperative matrices (lavapipe) nothing is held
 * and the same checks hold for the conv's own path. Without a usable
 * Vulkan device the suite is skipped.
 */
#include "support/run.h"
#include "support/vk_conv_step.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"

/* One case: rows (streams), precision, the conv's d_conv and dtypes, and
 * whether stream 0 reads stream 1's destination (the fold refuses it). */
typedef struct conv_case {
    int32_t m;
    bool fast;
    int32_t dc;
    llmem_dtype st_dt, w_dt;
    bool bias, cross;
} conv_case;

/* What one run gives back (malloc'd): vcs_download's results. */
enum { N_R = VCS_N_R };

/* Runs in_proj, the three copies and the conv on a vulkan backend opened
 * with $LLMEM_VULKAN_SUM_CONV=knob; r[i] malloc'd here (caller frees). */
static void run_step(const conv_case *k, const vcs_in *in, const char *knob, float *r[N_R])
{
    test_env keep = test_env_set("LLMEM_VULKAN_SUM_CONV", knob);
    llmem_backend *vk = test_open("vulkan");
    vcs_step st;
    vcs_make(vk, in, &st);
    vcs_in_proj(vk, &st, k->fast);
    vcs_conv(vk, &st, in);
    OK(llmem_backend_synchronize(vk));
    vcs_download(&st, r);
    vcs_free(&st);
    llmem_backend_close(vk);
    test_env_restore(&keep);
}

/* Fills the inputs of case k: values exact in their dtypes, slots
 * shuffled (n_slots = 2m + 3): stream s reads slot src[s] and writes
 * dst[s], all apart, but every fifth stream writes its own source, every
 * seventh reads zeros (src -1), every eleventh writes nothing (dst -1),
 * and with k->cross stream 0 reads stream 1's destination. */
static void make_inputs(const conv_case *k, vcs_in *in)
{
    int32_t m = k->m;
    in->m = m;
    in->dc = k->dc;
    in->w_dt = k->w_dt;
    in->st_dt = k->st_dt;
    in->bias = k->bias;
    in->a = rand_vals((size_t)m * K_IN, -1.0f, 1.0f, false);
    in->win = rand_vals((size_t)NIN * K_IN, -0.125f, 0.125f, true);
    in->cw = rand_vals((size_t)CD * k->dc, -1.0f, 1.0f, k->w_dt == BF16);
    in->cb = rand_vals(CD, -0.5f, 0.5f, k->w_dt == BF16);
    in->n_slots = 2 * m + 3;
    int32_t perm[2 * MAX_M + 3];
    for (int32_t i = 0; i < in->n_slots; i++)
        perm[i] = i;
    for (int32_t i = in->n_slots - 1; i > 0; i--) {
        int32_t j = (int32_t)(rnd() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int32_t s = 0; s < m; s++) {
        in->src[s] = s % 7 == 3 ? -1 : perm[2 * s];
        in->dst[s] = s % 11 == 5 ? -1 : s % 5 == 2 ? in->src[s] : perm[2 * s + 1];
        if (in->dst[s] < 0 && s % 11 != 5)
            in->dst[s] = perm[2 * s + 1];
    }
    if (k->cross)
        in->src[0] = in->dst[1];
    in->st = rand_vals(vcs_st_elems(in), -2.0f, 2.0f, k->st_dt == BF16);
}

static void check_case(const conv_case *k)
{
    vcs_in in;
    make_inputs(k, &in);
    float *on[N_R], *off[N_R], *v4[N_R], *f4[N_R];
    run_step(k, &in, "1", on);
    run_step(k, &in, "0", off);
    run_step(k, &in, "2", v4);
    run_step(k, &in, "3", f4);
    int32_t m = k->m;
    size_t n_st = vcs_st_elems(&in);
    size_t n_r[N_R] = {(size_t)m * CD, (size_t)m * W0, (size_t)m * CD, (size_t)m * W2, n_st};
    char what[128];
    snprintf(what, sizeof what, "m %d %s dc %d state %s w %s%s%s", m, k->fast ? "fast" : "precise",
             k->dc, k->st_dt == F32 ? "f32" : "bf16", k->w_dt == F32 ? "f32" : "bf16",
             k->bias ? " bias" : "", k->cross ? " cross" : "");
    for (int i = 0; i < N_R; i++) {
        ck_assert_msg(memcmp(on[i], off[i], n_r[i] * 4) == 0, "%s: result %d: SUM_CONV 1 != 0",
                      what, i);
        ck_assert_msg(memcmp(v4[i], off[i], n_r[i] * 4) == 0, "%s: result %d: SUM_CONV 2 != 0",
                      what, i);
        ck_assert_msg(memcmp(f4[i], off[i], n_r[i] * 4) == 0, "%s: result %d: SUM_CONV 3 != 0",
                      what, i);
    }
    double *zx = malloc((size_t)m * NIN * sizeof *zx), *out = malloc(n_r[R_OUT] * sizeof *out);
    double *want = malloc(n_st * sizeof *want), *col = malloc((size_t)m * CD * sizeof *col);
    bool *written = malloc(n_st);
    ck_assert(zx && out && want && col && written);
    vcs_reference(&in, zx, out, want, written);
    /* fast: 11-bit activations into the product; the conv's inputs carry
     * that error, each weighted by at most 1 */
    double tol = k->fast ? 2 * vk_fast_rtol() : 2e-5;
    for (int32_t s = 0; s < m; s++)
        for (int32_t c = 0; c < CD; c++)
            col[(size_t)s * CD + c] = zx[(size_t)s * NIN + W0 + c];
    vk_expect_close(on[R_XB], col, m, CD, tol, what);
    vk_expect_close(on[R_OUT], out, m, CD, 4 * tol, what);
    /* the state: written slots within the product's error (plus bf16's
     * rounding), all others bit for bit as they were */
    double st_tol = k->st_dt == BF16 ? 1.0 / 128 : 0.0;
    for (size_t i = 0; i < n_st; i++) {
        double got = on[R_ST][i], err = fabs(got - want[i]);
        if (!written[i])
            ck_assert_msg(memcmp(&on[R_ST][i], &in.st[i], 4) == 0, "%s: state %zu changed", what, i);
        else
            ck_assert_msg(isfinite(got) && err <= st_tol * fabs(want[i]) + 4 * tol,
                          "%s: state %zu: %g, want %g", what, i, got, want[i]);
    }
    for (int i = 0; i < N_R; i++)
        free(on[i]), free(off[i]), free(v4[i]), free(f4[i]);
    free(zx), free(out), free(want), free(col), free(written);
    free(in.a), free(in.win), free(in.cw), free(in.cb), free(in.st);
}

START_TEST(test_sum_conv)
{
    static const int32_t rows[] = {9, 16, 33, 64};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (int fast = 0; fast < 2; fast++) {
            conv_case a = {rows[i], fast == 1, 4, F32, BF16, true, false};
            conv_case b = {rows[i], fast == 1, 3, BF16, F32, false, false};
            check_case(&a);
            check_case(&b);
        }
    conv_case x = {16, false, 4, F32, BF16, true, true};
    check_case(&x);
}
END_TEST

int main(void)
{
    vk_test_seed();
    if (!vulkan_opens("test_vulkan_sum_conv", "skipped"))
        return 77;
    Suite *s = suite_create("vulkan_sum_conv");
    TCase *tc = tcase_create("sum_conv");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_sum_conv);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
