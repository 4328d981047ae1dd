// ctest-labels: vulkan
/* Vulkan: the prefill scan's layouts (shaders/ssm_scan_pre.comp,
 * backends/vulkan/vk_ops_scan_pre.c scan_layout; issue 12). Where the
 * default layout's grid has fewer workgroups than the device has compute
 * units (the Bamba-2B shape on an H200; every case here on lavapipe, which
 * reports none and is planned as 132), the scan takes the wide layout
 * ($LLMEM_VULKAN_SCAN_PRE_WIDE, unset: on): more invocations, fewer rows a
 * lane group, longer token blocks. The layout changes which invocation
 * updates which state element and when a block is staged, not the
 * arithmetic: each element's recurrence and the order in which a row's
 * shares of S · C are added are the same. So, for each case below:
 *   - y and every slot of the state pool after the op are the same bytes
 *     with the wide layout (unset), without it (WIDE=0) and with the layouts
 *     set by hand (rows a lane group, tokens a block, invocations: 1 x 8 x
 *     1024, 2 x 4 x 512, 4 x 8 x 256, 2 x 8 x 256, 4 x 16 x 128, 8 x 2 x
 *     64; a block longer than the device's shared memory takes is halved
 *     until it fits: lavapipe's 32 KiB takes 8 tokens at 16 rows a
 *     workgroup, the H200's 48 KiB at 32);
 *   - y and the written slots against a float64 recurrence (HF
 *     Mamba2Mixer.torch_forward token by token, tests/support/ref64.c), the
 *     slots not written keep their bytes.
 * Cases: the 2B head shape (head_dim 64, d_state 128) over 300 tokens with
 * a snapshot inside the ubatch and checkpoints (f32 state); two streams of
 * 77 tokens (a partial last block; one in place, one copy-on-write; bf16
 * state); head_dim 40, d_state 100 (lane groups of 25, rows past the
 * head); 33 tokens (the shortest that is not a "short stream"). Without a
 * usable Vulkan device the suite is skipped.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "llmem/recurrent.h"
#include "support/ops_harness.h"
#include "support/ref64.h"
#include "support/rs_harness.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16

/* The layouts: WIDE, RPL, T, WG (NULL: unset). */
typedef struct layout {
    const char *wide, *rpl, *t, *wg;
} layout;
static const layout layouts[] = {
    {NULL, NULL, NULL, NULL}, {"0", NULL, NULL, NULL},  {NULL, "1", "8", "1024"},
    {NULL, "2", "4", "512"},  {NULL, "4", "8", "256"},  {NULL, "2", "8", "256"},
    {NULL, "4", "16", "128"}, {NULL, "8", "2", "64"},
};
#define N_LAYOUTS (sizeof layouts / sizeof layouts[0])

static const char *const knob_names[4] = {"LLMEM_VULKAN_SCAN_PRE_WIDE", "LLMEM_VULKAN_SCAN_PRE_RPL",
                                          "LLMEM_VULKAN_SCAN_PRE_T", "LLMEM_VULKAN_SCAN_PRE_WG"};

/* A vulkan backend opened with the layout's variables (read when it opens). */
static llmem_backend *open_layout(const layout *l)
{
    const char *const vals[4] = {l->wide, l->rpl, l->t, l->wg};
    return test_open_with("vulkan", 4, knob_names, vals);
}

typedef struct scan_case {
    rs_setup rs;
    llmem_ssm_params p;
    llmem_dtype st;
} scan_case;

static const scan_case cases[] = {
    /* the 2B head shape, 300 tokens: snapshot after token 100, checkpoints
     * after tokens 297 and 299 (the last), in place */
    {{1, 300, 2, 4, {0}, {0}, {1, 2}, true, {100}, {3}}, {2, 64, 128, 1, 0.0f, INFINITY, 0}, F32},
    /* two streams of 77 tokens: stream 1 reads stream 0's source
     * (copy-on-write), dt limits, bf16 state */
    {{2, 77, 0, 4, {0, 0}, {0, 2}, {0}}, {3, 64, 128, 1, 0.001f, 0.5f, 0}, BF16},
    /* head_dim 40, d_state 100, two groups, a fresh stream */
    {{1, 120, 1, 3, {-1}, {1}, {2}}, {4, 40, 100, 2, 0.0f, INFINITY, 0}, F16},
    /* 33 tokens a stream */
    {{2, 33, 0, 4, {1, 3}, {0, 2}, {0}}, {2, 64, 128, 1, 0.0f, INFINITY, 0}, F32},
};

START_TEST(test_scan_pre_layouts)
{
    llmem_backend *be[N_LAYOUTS];
    for (size_t i = 0; i < N_LAYOUTS; i++)
        be[i] = open_layout(&layouts[i]);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const scan_case *k = &cases[ci];
        const rs_setup *rs = &k->rs;
        ref64_rng r = ref64_rng_make(ref64_seed(), 7100 + ci);
        th_ctx h;
        th_begin(&h, NULL);
        llmem_state_desc d = {"ssm", 3, {k->p.n_heads, k->p.head_dim, k->p.d_state}, k->st};
        unsigned char *init = rs_source_image(&h, &r, &d, rs, -1, 1);
        int64_t n_tok = (int64_t)rs->n_seqs * rs->n_tok, H = k->p.n_heads;
        int64_t cd = rs_ssm_conv_dim(&k->p);
        double *xbc = th_vec(&h, n_tok * cd), *dt = th_vec(&h, n_tok * H);
        double *a_log = th_vec(&h, H), *dd = th_vec(&h, H), *dt_bias = th_vec(&h, H);
        ref64_fill(&r, xbc, n_tok * cd, -1, 1, F32);
        ref64_fill(&r, dt, n_tok * H, -5, 3, F32);
        ref64_fill(&r, a_log, H, -1, 2, F32);
        ref64_fill(&r, dd, H, -1, 1, F32);
        ref64_fill(&r, dt_bias, H, -2, 1, F32);
        rs_scan_in in = {k->p, F32, xbc, dt, a_log, dd, dt_bias};
        int64_t e = rs_desc_elems(&d), ny = n_tok * H * k->p.head_dim;
        size_t img_bytes = (size_t)(e * rs->n_slots) * llmem_dtype_size(k->st) + 4;
        double *ref = th_vec(&h, ny), *want = th_vec(&h, e * rs->n_slots);
        bool written[RS_MAXS * 4];
        rs_reference_ubatch(rs, &d, init, rs_ssm_scan_step, &in, H * k->p.head_dim, ref, want,
                            written);
        double *y0 = th_vec(&h, ny), *y = th_vec(&h, ny);
        unsigned char *img0 = th_alloc(&h, img_bytes), *img = th_alloc(&h, img_bytes);
        char what[96];
        for (size_t li = 0; li < N_LAYOUTS; li++) {
            const layout *l = &layouts[li];
            snprintf(what, sizeof what, "scan case %zu, layout WIDE=%s RPL=%s T=%s WG=%s", ci,
                     l->wide ? l->wide : "-", l->rpl ? l->rpl : "-", l->t ? l->t : "-",
                     l->wg ? l->wg : "-");
            rs_ssm_scan_run(be[li], rs, &d, &in, init, li == 0 ? y0 : y, li == 0 ? img0 : img);
            if (li == 0) {
                th_expect_close(y0, ref, ny, ref64_tol(F32, false), what);
                rs_check_slots(rs, &d, init, img0, want, written, false, false, what);
            } else {
                th_expect_same_bytes(y, y0, sizeof(double) * (size_t)ny, what);
                th_expect_same_bytes(img, img0, img_bytes - 4, what);
            }
        }
        th_end(&h);
    }
    for (size_t i = 0; i < N_LAYOUTS; i++)
        llmem_backend_close(be[i]);
}
END_TEST

int main(void)
{
    char err[256] = "";
    llmem_backend *be = NULL;
    if (llmem_backend_open("vulkan", -1, &be, err, sizeof err) != LLMEM_OK) {
        printf("test_vulkan_scan_pre: no usable Vulkan device (%s); skipped\n", err);
        return EXIT_SUCCESS;
    }
    llmem_backend_close(be);
    Suite *s = suite_create("vulkan_scan_pre");
    TCase *tc = tcase_create("scan_pre");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_scan_pre_layouts);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
