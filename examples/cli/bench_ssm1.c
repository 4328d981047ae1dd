/* llmem bench: decode figures of the issue-16 state kinds (`--only ssm1`):
 * the Mamba-1 selective scan (ssm_scan1) at a Jamba shape and LFM2's short
 * conv (short_conv) at an LFM2-1.2B shape, one token per sequence, states
 * updated in place. See bench.c's usage text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/bench.h"
#include "llmem/ops_ssm1.h"

typedef struct ssm1_ctx {
    llmem_backend *be;
    llmem_ssm1_params p;
    llmem_view view;
    llmem_rs_view rs1, rs2; /* the descriptions of the two views */
    llmem_tensor x, dt, bm, cm, z, a_log, d, dt_bias, y; /* scan1 */
    llmem_tensor bcx, w, out;                             /* short conv */
} ssm1_ctx;

static llmem_status scan1_run(void *vctx)
{
    ssm1_ctx *c = vctx;
    return llmem_op_ssm_scan1(c->be, &c->p, &c->view, 0, &c->x, &c->dt, &c->bm, &c->cm,
                              &c->a_log, &c->d, &c->dt_bias, &c->z, &c->y);
}

static llmem_status sconv_run(void *vctx)
{
    ssm1_ctx *c = vctx;
    return llmem_op_short_conv(c->be, &c->view, 0, &c->bcx, &c->w, NULL, &c->out);
}

llmem_status bench_ssm1(bench *b)
{
    /* Jamba v0.1: hidden 4096, expand 2 -> d_inner 8192, d_state 16; 256 sequences */
    const int32_t B = 256, DIN = 8192, N = 16;
    /* LFM2-1.2B: hidden 2048, L_cache 3 */
    const int32_t D = 2048, L = 3;
    size_t sbytes = (size_t)B * DIN * N * 4, cbytes = (size_t)B * (L - 1) * D * 4;
    size_t o_x = 0, o_dt = o_x + (size_t)B * DIN * 4, o_z = o_dt + (size_t)B * DIN * 4;
    size_t o_b = o_z + (size_t)B * DIN * 4, o_c = o_b + (size_t)B * N * 4;
    size_t o_a = o_c + (size_t)B * N * 4, o_d = o_a + (size_t)DIN * N * 4;
    size_t o_db = o_d + (size_t)DIN * 4, o_bcx = o_db + (size_t)DIN * 4;
    size_t o_w = o_bcx + (size_t)B * 3 * D * 4, o_y = o_w + (size_t)D * L * 4;
    size_t o_out = o_y + (size_t)B * DIN * 4, act_bytes = o_out + (size_t)B * D * 4;
    llmem_buffer *sstate = NULL, *cstate = NULL, *act = NULL, *idx1 = NULL, *idx2 = NULL;
    int32_t *slots = malloc((size_t)B * sizeof *slots);
    tables t1 = {0}, t2 = {0};
    ssm1_ctx c;
    memset(&c, 0, sizeof c);
    llmem_status st = slots ? LLMEM_OK : LLMEM_E_NO_MEMORY;
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, sbytes, &sstate);
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, cbytes, &cstate);
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, act_bytes, &act);
    if (st == LLMEM_OK)
        st = bench_fill(b, sstate, 0, (int64_t)(sbytes / 4), LLMEM_DTYPE_F32, false);
    if (st == LLMEM_OK)
        st = bench_fill(b, cstate, 0, (int64_t)(cbytes / 4), LLMEM_DTYPE_F32, false);
    if (st == LLMEM_OK)
        st = bench_fill(b, act, 0, (int64_t)(o_y / 4), LLMEM_DTYPE_F32, true);
    llmem_state_desc sdesc = {"ssm", 2, {DIN, N}, LLMEM_DTYPE_F32};
    llmem_state_desc cdesc = {"conv", 2, {L - 1, D}, LLMEM_DTYPE_F32};
    llmem_buffer *sb[1] = {sstate}, *cb[1] = {cstate};
    double sec = 0;
    c.be = b->be;
    for (int32_t i = 0; slots && i < B; i++)
        slots[i] = i; /* states updated in place */
    if (st == LLMEM_OK)
        st = bench_rs_view(b, &c.view, &c.rs1, &sdesc, sb, B, 1, slots, slots, &t1, &idx1);
    if (st == LLMEM_OK) {
        c.p = (llmem_ssm1_params){DIN, N};
        c.x = llmem_tensor_2d(act, o_x, LLMEM_DTYPE_F32, B, DIN);
        c.dt = llmem_tensor_2d(act, o_dt, LLMEM_DTYPE_F32, B, DIN);
        c.z = llmem_tensor_2d(act, o_z, LLMEM_DTYPE_F32, B, DIN);
        c.bm = llmem_tensor_2d(act, o_b, LLMEM_DTYPE_F32, B, N);
        c.cm = llmem_tensor_2d(act, o_c, LLMEM_DTYPE_F32, B, N);
        c.a_log = llmem_tensor_2d(act, o_a, LLMEM_DTYPE_F32, DIN, N);
        c.d = llmem_tensor_1d(act, o_d, LLMEM_DTYPE_F32, DIN);
        c.dt_bias = llmem_tensor_1d(act, o_db, LLMEM_DTYPE_F32, DIN);
        c.y = llmem_tensor_2d(act, o_y, LLMEM_DTYPE_F32, B, DIN);
        st = bench_time_it(b, "mamba1 decode", scan1_run, &c, &sec);
    }
    if (st == LLMEM_OK)
        bench_report_bw(b, "mamba1 decode (ssm_scan1)", sec,
                        2.0 * (double)sbytes + (double)B * (4.0 * DIN + 2.0 * N) * 4 +
                            (double)DIN * (N + 2) * 4,
                        "(256 seqs, d_inner 8192, d_state 16)");
    if (st == LLMEM_OK)
        st = bench_rs_view(b, &c.view, &c.rs2, &cdesc, cb, B, 1, slots, slots, &t2, &idx2);
    if (st == LLMEM_OK) {
        c.bcx = llmem_tensor_2d(act, o_bcx, LLMEM_DTYPE_F32, B, 3 * D);
        c.w = llmem_tensor_2d(act, o_w, LLMEM_DTYPE_F32, D, L);
        c.out = llmem_tensor_2d(act, o_out, LLMEM_DTYPE_F32, B, D);
        st = bench_time_it(b, "short conv decode", sconv_run, &c, &sec);
    }
    if (st == LLMEM_OK)
        bench_report_bw(b, "short conv decode (short_conv)", sec,
                        2.0 * (double)cbytes + (double)B * 4.0 * D * 4 + (double)D * L * 4,
                        "(256 seqs, hidden 2048, L 3)");
    free(slots);
    free(t1.v);
    free(t2.v);
    llmem_buffer_free(idx1);
    llmem_buffer_free(idx2);
    llmem_buffer_free(sstate);
    llmem_buffer_free(cstate);
    llmem_buffer_free(act);
    return st;
}
