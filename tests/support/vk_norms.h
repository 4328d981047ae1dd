/* The norm checks shared by the Vulkan suites test_vulkan_dec_norm.c
 * (decode rows) and test_vulkan_prefill.c (prefill rows): every norm op of
 * one [m, k] shape on one backend, each against float64 (vk_test.h's
 * references). Header-only, as vk_test.h: each suite is its own program. */
#ifndef LLMEM_TESTS_VK_NORMS_H
#define LLMEM_TESTS_VK_NORMS_H

#include "support/vk_test.h"

/* Outputs of vk_run_norms: 3 plain norms (f32, bf16, no weights), x and r
 * of the add + norm, 4 gated norms (1 and 4 groups, apart and in place). */
enum { VK_NORMS_N_OUT = 9 };

/* Runs on vk, for x, r, y, z [m, k] and w [k] (f32 host arrays):
 *  - out = rms_norm(x) with f32, bf16 and no weights;
 *  - x += r; r = rms_norm(x) (llmem_op_add_rms_norm), which must equal an
 *    add then a norm bit for bit;
 *  - the gated norm of y by silu(z), 1 and 4 groups, apart and in place on
 *    y, where k is a multiple of group_align * groups (o[i] NULL otherwise).
 * With check, each output against the float64 reference (1e-5 normalized,
 * the add 1e-6); tag ends each message ("DEC_NORM=7"). o[0, VK_NORMS_N_OUT)
 * receive the downloaded outputs in that order (malloc'ed, the caller frees
 * them). */
static inline void vk_run_norms(llmem_backend *vk, const char *tag, int32_t m, int32_t k,
                                int32_t group_align, float eps, const float *x, const float *r,
                                const float *y, const float *z, const float *w, bool check,
                                float *o[VK_NORMS_N_OUT])
{
    size_t mk = (size_t)m * k;
    double *ref = malloc(mk * sizeof *ref);
    ck_assert_ptr_nonnull(ref);
    llmem_buffer *b[12];
    int nb = 0;
#define T32(v, a, bb) vk_up_f32_2d(vk, &b[nb++], v, a, bb)
    llmem_tensor tx = T32(x, m, k), tr = T32(r, m, k), to = T32(NULL, m, k);
    llmem_tensor tw = T32(w, k, 0), tw16 = vk_up_bf16_2d(vk, &b[nb++], w, 1, k);
    tw16.n_dims = 1, tw16.ne[0] = k, tw16.ne[1] = 1;
    llmem_tensor tx2 = T32(x, m, k), tr2 = T32(r, m, k), ty = T32(y, m, k), tz = T32(z, m, k);
#undef T32
    char what[128];
    const llmem_tensor *ws[3] = {&tw, &tw16, NULL};
    static const char *wn[3] = {"f32", "bf16", "none"};
    int n = 0;
    for (int i = 0; i < 3; i++) { /* out = norm(x) */
        OK(llmem_op_rms_norm(vk, &tx, ws[i], eps, &to));
        o[n] = vk_download_f32(&to);
        for (size_t j = 0; j < mk; j++)
            ref[j] = x[j];
        vk_ref_norm_groups(ref, i < 2 ? w : NULL, m, k, 1, eps);
        snprintf(what, sizeof what, "norm, %s weights, %dx%d %s", wn[i], m, k, tag);
        if (check)
            vk_expect_close(o[n], ref, m, k, 1e-5, what);
        n++;
    }
    /* x += r; r = norm(x), against x2 += r2 (an add) then norm(x2) -> out */
    OK(llmem_op_add_rms_norm(vk, &tx, &tr, &tw, eps, &tr));
    OK(llmem_op_add(vk, &tx2, &tr2, &tx2));
    OK(llmem_op_rms_norm(vk, &tx2, &tw, eps, &to));
    float *xo = vk_download_f32(&tx), *ro = vk_download_f32(&tr);
    float *x2o = vk_download_f32(&tx2), *oo = vk_download_f32(&to);
    for (size_t j = 0; j < mk; j++)
        ref[j] = (double)x[j] + r[j];
    snprintf(what, sizeof what, "add + norm, %dx%d %s", m, k, tag);
    if (check)
        vk_expect_close(xo, ref, m, k, 1e-6, what);
    vk_ref_norm_groups(ref, w, m, k, 1, eps);
    if (check)
        vk_expect_close(ro, ref, m, k, 1e-5, what);
    ck_assert_msg(memcmp(xo, x2o, mk * 4) == 0 && memcmp(ro, oo, mk * 4) == 0,
                  "%s: differs from add then norm", what);
    o[n++] = xo, o[n++] = ro;
    free(x2o), free(oo);
    /* the gated norm, 1 and 4 groups: apart, then in place on y */
    for (int32_t groups = 1; groups <= 4; groups *= 4) {
        for (int in_place = 0; in_place < 2; in_place++, n++) {
            o[n] = NULL;
            if (k % (group_align * groups) != 0)
                continue;
            OK(llmem_buffer_upload(ty.buf, ty.offset, y, mk * 4));
            llmem_tensor *out = in_place ? &ty : &to;
            OK(llmem_op_rms_norm_gated(vk, &ty, &tz, &tw, groups, eps, out));
            o[n] = vk_download_f32(out);
            for (size_t j = 0; j < mk; j++)
                ref[j] = (double)y[j] * vk_silu(z[j]);
            vk_ref_norm_groups(ref, w, m, k, groups, eps);
            snprintf(what, sizeof what, "gated norm, %d groups%s, %dx%d %s", groups,
                     in_place ? " in place" : "", m, k, tag);
            if (check)
                vk_expect_close(o[n], ref, m, k, 1e-5, what);
        }
    }
    ck_assert_int_eq(n, VK_NORMS_N_OUT);
    for (int i = 0; i < nb; i++)
        llmem_buffer_free(b[i]);
    free(ref);
}

#endif
