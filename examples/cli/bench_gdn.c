/* llmem bench: the gated delta net figures (llmem_op_gdn) at Qwen3-Next-80B's
 * linear-attention sizes (16 key heads, 32 value heads, head dims 128, f32
 * delta-rule state of 2 MiB per sequence):
 *   gdn decode   64 sequences x 1 token, the state updated in place; bytes =
 *                state read + written + inputs and outputs, against copy;
 *   gdn prefill  4 sequences x 512 tokens from a zero state (the chunked
 *                form on cpu, the recurrent one on cuda and vulkan), in
 *                tokens per second. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/bench.h"
#include "llmem/ops_gdn.h"

typedef struct gdn_ctx {
    llmem_backend *be;
    llmem_gdn_params p;
    llmem_view view;
    llmem_rs_view rs; /* view.desc */
    llmem_tensor qkv, a, b, a_log, dt_bias, out;
} gdn_ctx;

static llmem_status gdn_run(void *vctx)
{
    gdn_ctx *c = vctx;
    return llmem_op_gdn(c->be, &c->p, &c->view, 0, &c->qkv, &c->a, &c->b, &c->a_log,
                        &c->dt_bias, &c->out);
}

/* One figure: B sequences of n_tok tokens each. */
static llmem_status gdn_figure(bench *b, int32_t B, int32_t n_tok, const char *label)
{
    const llmem_gdn_params p = {16, 32, 128, 128};
    int64_t elems = (int64_t)p.n_v_heads * p.d_k * p.d_v;
    int64_t W = 2 * (int64_t)p.n_k_heads * p.d_k + (int64_t)p.n_v_heads * p.d_v;
    int64_t T = (int64_t)B * n_tok, Hv = p.n_v_heads;
    size_t state_bytes = (size_t)B * (size_t)elems * 4;
    size_t o_qkv = 0, o_a = o_qkv + (size_t)(T * W) * 4, o_b = o_a + (size_t)(T * Hv) * 4;
    size_t o_par = o_b + (size_t)(T * Hv) * 4, o_out = o_par + 2 * (size_t)Hv * 4;
    size_t act_bytes = o_out + (size_t)(T * Hv * p.d_v) * 4;
    llmem_buffer *state = NULL, *act = NULL, *idx = NULL;
    llmem_status st =
        bench_new_filled(b, state_bytes, (int64_t)(state_bytes / 4), LLMEM_DTYPE_F32, false, &state);
    if (st == LLMEM_OK)
        st = bench_new_filled(b, act_bytes, (int64_t)(o_out / 4), LLMEM_DTYPE_F32, false, &act);
    int32_t *slots = malloc((size_t)B * 2 * sizeof *slots);
    tables t = {0};
    gdn_ctx c;
    memset(&c, 0, sizeof c);
    llmem_state_desc desc = {"delta", 3, {p.n_v_heads, p.d_k, p.d_v}, LLMEM_DTYPE_F32};
    llmem_buffer *bufs[1] = {state};
    if (!slots && st == LLMEM_OK)
        st = LLMEM_E_NO_MEMORY;
    if (st == LLMEM_OK) {
        for (int32_t i = 0; i < B; i++) {
            slots[i] = n_tok == 1 ? i : -1; /* prefill starts from zeros */
            slots[B + i] = i;
        }
        st = bench_rs_view(b, &c.view, &c.rs, &desc, bufs, B, n_tok, slots, slots + B, &t, &idx);
    }
    double sec = 0;
    if (st == LLMEM_OK) {
        c.be = b->be;
        c.p = p;
        c.qkv = llmem_tensor_2d(act, o_qkv, LLMEM_DTYPE_F32, (int32_t)T, (int32_t)W);
        c.a = llmem_tensor_2d(act, o_a, LLMEM_DTYPE_F32, (int32_t)T, (int32_t)Hv);
        c.b = llmem_tensor_2d(act, o_b, LLMEM_DTYPE_F32, (int32_t)T, (int32_t)Hv);
        c.a_log = llmem_tensor_1d(act, o_par, LLMEM_DTYPE_F32, (int32_t)Hv);
        c.dt_bias = llmem_tensor_1d(act, o_par + (size_t)Hv * 4, LLMEM_DTYPE_F32, (int32_t)Hv);
        c.out = llmem_tensor_2d(act, o_out, LLMEM_DTYPE_F32, (int32_t)T, (int32_t)(Hv * p.d_v));
        st = bench_time_it(b, label, gdn_run, &c, &sec);
    }
    if (st == LLMEM_OK && n_tok == 1)
        bench_report_bw(b, "gdn decode (gdn)", sec,
                        2.0 * (double)state_bytes + (double)act_bytes, NULL);
    else if (st == LLMEM_OK)
        printf("%-28s %9.3f ms  %8.0f tokens/s  (%d sequences x %d tokens)\n",
               "gdn prefill (gdn)", sec * 1e3, (double)T / sec, (int)B, (int)n_tok);
    free(slots);
    free(t.v);
    llmem_buffer_free(idx);
    llmem_buffer_free(state);
    llmem_buffer_free(act);
    return st;
}

llmem_status bench_gdn(bench *b)
{
    llmem_status st = gdn_figure(b, 64, 1, "gdn decode");
    if (st == LLMEM_OK)
        st = gdn_figure(b, 4, 512, "gdn prefill");
    return st;
}
