/* llmem bench --only mamba_prefill: the Mamba-2 prefill ops alone, at the
 * 9B Bamba layer shape (128 heads x 64, d_state 128, one group, d_conv 4,
 * conv_dim 8448, f32 states), in the ubatch layouts of pp512 at batch 1,
 * 16 and 64 (1 x 512, 16 x 32 and 64 x 8 tokens): ssm_conv then ssm_scan,
 * each timed alone (ms per call, wall-clock as every figure of bench.c).
 * Each stream updates its own state slot in place, as a prefill does.
 * LLMEM_BENCH_MAMBA_HEADS=H (1..256): H heads instead of 128 (64: the
 * Bamba-2B shape, conv_dim 4352). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/bench.h"
#include "examples/cli/common.h"

#define PP 64
#define PN 128
#define PDC 4
#define PH pre_heads()
#define PCD (PH * PP + 2 * PN) /* conv_dim: 8448 at 128 heads */

static int32_t pre_heads(void)
{
    const char *e = getenv("LLMEM_BENCH_MAMBA_HEADS");
    int h = e ? atoi(e) : 0;
    return h >= 1 && h <= 256 ? (int32_t)h : 128;
}

typedef struct pre_ctx {
    llmem_backend *be;
    llmem_ssm_params p;
    llmem_view view;
    llmem_rs_view rs;
    llmem_state_desc desc[2];
    llmem_buffer *bufs[2];
    llmem_tensor x, w, b, xo, dt, a_log, d, dt_bias, y;
} pre_ctx;

static llmem_status conv_run(void *vctx)
{
    pre_ctx *c = vctx;
    return llmem_op_ssm_conv(c->be, &c->view, 0, &c->x, &c->w, &c->b, &c->xo);
}

static llmem_status scan_run(void *vctx)
{
    pre_ctx *c = vctx;
    return llmem_op_ssm_scan(c->be, &c->p, &c->view, 1, &c->xo, &c->dt, &c->a_log, &c->d,
                             &c->dt_bias, &c->y);
}

/* One layout: B streams of n_tok tokens. */
static llmem_status pre_once(bench *b, int32_t B, int32_t n_tok)
{
    int64_t T = (int64_t)B * n_tok;
    size_t conv_bytes = (size_t)B * (PDC - 1) * PCD * 4, ssm_bytes = (size_t)B * PH * PP * PN * 4;
    size_t o_x = 0, o_xo = o_x + (size_t)T * PCD * 4, o_dt = o_xo + (size_t)T * PCD * 4;
    size_t o_w = o_dt + (size_t)T * PH * 4, o_par = o_w + (size_t)PCD * (PDC + 1) * 4;
    size_t o_y = o_par + 3 * (size_t)PH * 4, act_bytes = o_y + (size_t)T * PH * PP * 4;
    llmem_buffer *conv = NULL, *ssm = NULL, *act = NULL, *idx = NULL;
    int32_t *slots = malloc((size_t)B * sizeof *slots);
    tables t = {0};
    pre_ctx c;
    memset(&c, 0, sizeof c);
    llmem_status st = slots ? LLMEM_OK : LLMEM_E_NO_MEMORY;
    if (st == LLMEM_OK)
        st = bench_new_filled(b, conv_bytes, (int64_t)(conv_bytes / 4), LLMEM_DTYPE_F32, false,
                              &conv);
    if (st == LLMEM_OK)
        st = bench_new_filled(b, ssm_bytes, (int64_t)(ssm_bytes / 4), LLMEM_DTYPE_F32, true, &ssm);
    if (st == LLMEM_OK)
        st = bench_new_filled(b, act_bytes, (int64_t)(o_y / 4), LLMEM_DTYPE_F32, false, &act);
    if (st == LLMEM_OK) {
        for (int32_t i = 0; i < B; i++)
            slots[i] = i;
        c.desc[0] = (llmem_state_desc){"conv", 2, {PDC - 1, PCD}, LLMEM_DTYPE_F32};
        c.desc[1] = (llmem_state_desc){"ssm", 3, {PH, PP, PN}, LLMEM_DTYPE_F32};
        c.bufs[0] = conv;
        c.bufs[1] = ssm;
        st = bench_rs_view(b, &c.view, &c.rs, c.desc, c.bufs, B, n_tok, slots, slots, &t, &idx);
        c.rs.n_states = 2;
    }
    double sc = 0, ss = 0;
    if (st == LLMEM_OK) {
        c.be = b->be;
        c.p = (llmem_ssm_params){PH, PP, PN, 1, 0.0f, INFINITY, 0};
        c.x = llmem_tensor_2d(act, o_x, LLMEM_DTYPE_F32, (int32_t)T, PCD);
        c.xo = llmem_tensor_2d(act, o_xo, LLMEM_DTYPE_F32, (int32_t)T, PCD);
        c.dt = llmem_tensor_2d(act, o_dt, LLMEM_DTYPE_F32, (int32_t)T, PH);
        c.w = llmem_tensor_2d(act, o_w, LLMEM_DTYPE_F32, PCD, PDC);
        c.b = llmem_tensor_1d(act, o_w + (size_t)PCD * PDC * 4, LLMEM_DTYPE_F32, PCD);
        c.a_log = llmem_tensor_1d(act, o_par, LLMEM_DTYPE_F32, PH);
        c.d = llmem_tensor_1d(act, o_par + (size_t)PH * 4, LLMEM_DTYPE_F32, PH);
        c.dt_bias = llmem_tensor_1d(act, o_par + 2 * (size_t)PH * 4, LLMEM_DTYPE_F32, PH);
        c.y = llmem_tensor_2d(act, o_y, LLMEM_DTYPE_F32, (int32_t)T, PH * PP);
        st = bench_time_it(b, "mamba prefill conv", conv_run, &c, &sc);
    }
    if (st == LLMEM_OK)
        st = bench_time_it(b, "mamba prefill scan", scan_run, &c, &ss);
    if (st == LLMEM_OK)
        printf("mamba prefill %2d x %-3d h%-3d conv %8.3f ms  scan %8.3f ms  (%.2f M tok/s scan)\n",
               B, n_tok, PH, sc * 1e3, ss * 1e3, (double)T / ss / 1e6);
    free(slots);
    free(t.v);
    llmem_buffer_free(idx);
    llmem_buffer_free(conv);
    llmem_buffer_free(ssm);
    llmem_buffer_free(act);
    return st;
}

llmem_status bench_mamba_prefill(bench *b)
{
    static const int32_t lay[][2] = {{1, 512}, {16, 32}, {64, 8}};
    llmem_status st = LLMEM_OK;
    for (size_t i = 0; i < sizeof lay / sizeof lay[0] && st == LLMEM_OK; i++)
        st = pre_once(b, lay[i][0], lay[i][1]);
    return st;
}
