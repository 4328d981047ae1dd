// ctest-labels: vulkan
/* llmem_op_discard (<llmem/ops_discard.h>), and its one use: in_proj's
 * held split-K sum on Vulkan (issue 12; backends/vulkan/vk_sum.c
 * vk_sum_drop_dead via vk_ops_discard.c, sum_slices_cm.comp's o_off NO_OUT,
 * $LLMEM_VULKAN_DISCARD).
 *   - the wrapper's contract on the CPU backend and on Vulkan: bad
 *     arguments refused, zero elements and a backend without an
 *     implementation (CPU) a no-op, and the debug poison
 *     (LLMEM_DISCARD_POISON=1) filling exactly the whole words of the
 *     tensor with 0xffffffff, the bytes around it untouched;
 *   - the Mamba-2 decode step as models/forward.c records it (in_proj, the
 *     z / xBC / dt copies, discard of in_proj's output, the conv with its
 *     state, discard of xBC) at 9, 16 and 64 rows, precise and fast: z, dt,
 *     the conv's output and every state slot bit for bit equal with
 *     $LLMEM_VULKAN_DISCARD 3 (the held pass writes z, dt and the conv
 *     alone), 1, 2 and 0, with the poison on too (the pass recorded first,
 *     then in_proj's output and xBC NaN: nothing reads them), and against
 *     float64 from the inputs (HF transformers Mamba2Mixer, one token:
 *     silu(b + w · [state, x]));
 *   - what the discard must not drop: a discard covering only part of the
 *     output (the rest keeps its values: float64), and the next product
 *     into the same output after a discard (written whole: float64).
 * On lavapipe (no cooperative matrices) nothing is held and the same
 * checks hold for the ops' own path. Without a usable Vulkan device the
 * Vulkan cases are skipped.
 */
#include "support/run.h"
#include "support/vk_conv_step.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "llmem/ops_discard.h"

#define DC 4 /* d_conv */

static bool g_vulkan;

/* ---- the wrapper's contract ------------------------------------------------------------- */

static void contract_on(const char *name)
{
    llmem_backend *be = test_open(name), *cpu = test_open("cpu");
    test_env keep = test_env_set("LLMEM_DISCARD_POISON", NULL);
    uint8_t init[64], got[64];
    for (int i = 0; i < 64; i++)
        init[i] = (uint8_t)(i * 7 + 1);
    llmem_buffer *b, *other;
    OK(llmem_buffer_alloc(be, sizeof init, &b));
    OK(llmem_buffer_alloc(cpu, 16, &other));
    OK(llmem_buffer_upload(b, 0, init, sizeof init));
    llmem_tensor t = {b, 2, F16, 1, {5, 1, 1, 1}}; /* bytes [2, 12) */
    llmem_tensor empty = {b, 8, F32, 2, {0, 4, 1, 1}};
    llmem_tensor foreign = {other, 0, F32, 1, {4, 1, 1, 1}};
    llmem_tensor outside = {b, 60, F32, 1, {4, 1, 1, 1}};
    ck_assert_int_eq(llmem_op_discard(NULL, &t), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_discard(be, NULL), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_discard(be, &foreign), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_discard(be, &outside), LLMEM_E_INVALID);
    OK(llmem_op_discard(be, &empty));
    OK(llmem_op_discard(be, &t));
    OK(llmem_backend_synchronize(be));
    OK(llmem_buffer_download(b, 0, got, sizeof got));
    /* nothing held, nothing to drop: the contents as they were */
    ck_assert_msg(memcmp(got, init, sizeof got) == 0, "%s: discard changed the buffer", name);
    /* the poison: the whole words inside [2, 12), i.e. [4, 12), and nothing else */
    test_env_put("LLMEM_DISCARD_POISON", "1");
    OK(llmem_op_discard(be, &empty));
    OK(llmem_op_discard(be, &t));
    OK(llmem_backend_synchronize(be));
    OK(llmem_buffer_download(b, 0, got, sizeof got));
    for (int i = 0; i < 64; i++)
        ck_assert_msg(got[i] == (i >= 4 && i < 12 ? 0xff : init[i]), "%s: poison byte %d: %#x",
                      name, i, got[i]);
    test_env_restore(&keep);
    llmem_buffer_free(b);
    llmem_buffer_free(other);
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}

START_TEST(test_contract)
{
    contract_on("cpu");
    if (g_vulkan)
        contract_on("vulkan");
}
END_TEST

/* ---- the decode step -------------------------------------------------------------------- */


/* How the step ends: a whole discard of in_proj's output (D_WHOLE), a
 * discard of its first rows only (D_PART: the rest must stay), or the
 * next product into it after a whole discard (D_AGAIN). */
enum { D_WHOLE, D_PART, D_AGAIN };

/* What one run gives back (malloc'd, f32): vcs_download's results (the
 * state image [2m, DC - 1, CD]), then in_proj's output [m, NIN]. */
enum { R_ZX = VCS_N_R, N_R };

/* The step on a vulkan backend opened with $LLMEM_VULKAN_DISCARD=knob and
 * LLMEM_DISCARD_POISON=poison (NULL: unset). */
static void run_step(const vcs_in *in, bool fast, const char *knob, const char *poison, int how,
                     float *r[N_R])
{
    test_env keep = test_env_set("LLMEM_VULKAN_DISCARD", knob);
    test_env keep_p = test_env_set("LLMEM_DISCARD_POISON", poison);
    llmem_backend *vk = test_open("vulkan");
    vcs_step st;
    vcs_make(vk, in, &st);
    vcs_in_proj(vk, &st, fast);
    llmem_tensor part = st.zx;
    part.ne[0] = in->m / 2; /* the first rows: the rest must keep its values */
    OK(llmem_op_discard(vk, how == D_PART ? &part : &st.zx));
    vcs_conv(vk, &st, in);
    if (how != D_PART)
        OK(llmem_op_discard(vk, &st.xb));
    if (how == D_AGAIN)
        OK((fast ? llmem_op_matmul_fast : llmem_op_matmul)(vk, &st.a, &st.win, &st.zx));
    OK(llmem_backend_synchronize(vk));
    vcs_download(&st, r);
    r[R_ZX] = vk_download_f32(&st.zx);
    vcs_free(&st);
    llmem_backend_close(vk);
    test_env_restore(&keep_p);
    test_env_restore(&keep);
}

static void free_run(float *r[N_R])
{
    for (int i = 0; i < N_R; i++)
        free(r[i]);
}

static void check_rows(int32_t m, bool fast)
{
    vcs_in in = {.m = m, .dc = DC, .w_dt = BF16, .st_dt = F32, .bias = true, .n_slots = 2 * m};
    in.a = rand_vals((size_t)m * K_IN, -1.0f, 1.0f, false);
    in.win = rand_vals((size_t)NIN * K_IN, -0.125f, 0.125f, true);
    in.cw = rand_vals((size_t)CD * DC, -1.0f, 1.0f, true);
    in.cb = rand_vals(CD, -0.5f, 0.5f, true);
    size_t n_st = vcs_st_elems(&in);
    in.st = rand_vals(n_st, -2.0f, 2.0f, false);
    for (int32_t s = 0; s < m; s++) { /* sources the even slots, destinations the odd */
        in.src[s] = 2 * s;
        in.dst[s] = 2 * ((s * 5 + 3) % m) + 1;
    }
    char what[96];
    snprintf(what, sizeof what, "m %d %s", m, fast ? "fast" : "precise");
    float *on[N_R], *off[N_R], *k1[N_R], *k2[N_R], *poi[N_R], *part[N_R], *again[N_R];
    run_step(&in, fast, "3", NULL, D_WHOLE, on);
    run_step(&in, fast, "0", NULL, D_WHOLE, off);
    run_step(&in, fast, "1", NULL, D_WHOLE, k1);
    run_step(&in, fast, "2", NULL, D_WHOLE, k2);
    run_step(&in, fast, "3", "1", D_WHOLE, poi);
    run_step(&in, fast, "3", NULL, D_PART, part);
    run_step(&in, fast, "3", NULL, D_AGAIN, again);
    size_t n_r[R_ZX] = {(size_t)m * CD, (size_t)m * W0, (size_t)m * CD, (size_t)m * W2, n_st};
    for (int i = 0; i < R_ZX; i++) {
        ck_assert_msg(memcmp(part[i], off[i], n_r[i] * 4) == 0, "%s: result %d: part != 0",
                      what, i);
        if (i == R_XB) /* discarded: unspecified */
            continue;
        ck_assert_msg(memcmp(on[i], off[i], n_r[i] * 4) == 0, "%s: result %d: DISCARD 3 != 0",
                      what, i);
        ck_assert_msg(memcmp(k1[i], off[i], n_r[i] * 4) == 0, "%s: result %d: DISCARD 1 != 0",
                      what, i);
        ck_assert_msg(memcmp(k2[i], off[i], n_r[i] * 4) == 0, "%s: result %d: DISCARD 2 != 0",
                      what, i);
        ck_assert_msg(memcmp(poi[i], off[i], n_r[i] * 4) == 0, "%s: result %d: poisoned != 0",
                      what, i);
    }
    /* the poison reached the discarded tensors, and only after their readers ran */
    for (size_t i = 0; i < (size_t)m * NIN; i++) {
        uint32_t u, x = 0xffffffffu;
        memcpy(&u, &poi[R_ZX][i], 4);
        if (i < (size_t)m * CD)
            memcpy(&x, &poi[R_XB][i], 4);
        ck_assert_msg(u == 0xffffffffu && x == 0xffffffffu, "%s: poisoned %zu: %#x %#x", what,
                      i, u, x);
    }
    double *zx = malloc((size_t)m * NIN * sizeof *zx), *out = malloc((size_t)m * CD * sizeof *out);
    double *st = malloc(n_st * sizeof *st), *col = malloc((size_t)m * CD * sizeof *col);
    bool *written = malloc(n_st);
    ck_assert(zx && out && st && col && written);
    vcs_reference(&in, zx, out, st, written);
    double tol = fast ? 2 * vk_fast_rtol() : 2e-5;
    for (int32_t s = 0; s < m; s++)
        for (int32_t c = 0; c < CD; c++)
            col[(size_t)s * CD + c] = zx[(size_t)s * NIN + W0 + c];
    vk_expect_close(part[R_XB], col, m, CD, tol, what);
    vk_expect_close(on[R_OUT], out, m, CD, 4 * tol, what);
    for (size_t i = 0; i < n_st; i++)
        ck_assert_msg(fabs(on[R_ST][i] - st[i]) <= 4 * tol * (1 + fabs(st[i])),
                      "%s: state %zu: %g, want %g", what, i, on[R_ST][i], st[i]);
    /* a part discarded: the rows outside it written; the next product: all of it */
    int32_t half = m / 2;
    vk_expect_close(part[R_ZX] + (size_t)half * NIN, zx + (size_t)half * NIN, m - half, NIN, tol,
                    what);
    vk_expect_close(again[R_ZX], zx, m, NIN, tol, what);
    free_run(on), free_run(off), free_run(k1), free_run(k2), free_run(poi), free_run(part);
    free_run(again);
    free(zx), free(out), free(st), free(col), free(written);
    free(in.a), free(in.win), free(in.cw), free(in.cb), free(in.st);
}

START_TEST(test_decode_step)
{
    static const int32_t rows[] = {9, 16, 64};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        for (int fast = 0; fast < 2; fast++)
            check_rows(rows[i], fast == 1);
}
END_TEST

int main(void)
{
    vk_test_seed();
    g_vulkan = vulkan_opens("test_vulkan_discard", "the CPU contract alone");
    Suite *s = suite_create("vulkan_discard");
    TCase *tc = tcase_create("discard");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_contract);
    if (g_vulkan)
        tcase_add_test(tc, test_decode_step);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
