/* llmem bench: memory-bandwidth benchmarks of the backend ops.
 *
 * Every figure is measured in one process against a ceiling measured in the
 * same process: the device copy bandwidth (a large device-to-device
 * llmem_buffer_copy, bytes read + written). Kernels that should be limited
 * by memory traffic report their bytes moved per second as a fraction of
 * that ceiling. Times are host wall-clock around batches of back-to-back
 * calls ended by llmem_backend_synchronize (median of 5 batches, after a
 * warm-up call), so launch gaps count against the kernels.
 *
 * Inputs are random (never zeros); pools are addressed through shuffled
 * page tables, as a long-running KV cache would be. The `--help` text
 * explains each figure (see also docs/benchmarks.md).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "examples/cli/cli.h"
#include "examples/cli/bench.h"
#include "examples/cli/common.h"


static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmem bench [--backend NAME] [--device N] [--iters N] [--all] [--only LIST]\n"
            "       llmem bench --bookkeeping ...   (host bookkeeping of the memories; --help there)\n"
            "\n"
            "Measures, in one run, on one backend:\n"
            "  copy            device-to-device copy of 1 GiB (256 MiB off GPUs); the bandwidth\n"
            "                  counts bytes read + bytes written. This is the ceiling every\n"
            "                  other figure is compared with (\"of copy\").\n"
            "  decode attn     paged decode attention: 64 sequences x 4096 cached tokens, one\n"
            "                  query token each, 32 query / 8 KV heads, head dim 128, f16 K/V,\n"
            "                  pages of 1, 16 and 64 tokens in shuffled page tables. Bytes =\n"
            "                  K + V read (1 GiB) + queries and outputs. Target (CUDA issue):\n"
            "                  >= 80%% of copy at pages of 16, the three page sizes within 10%%.\n"
            "  mamba decode    Mamba-2 single-step state update (ssm_scan, 1 token): 64\n"
            "                  sequences x 128 heads x 64 x 128 f32 state, updated in place.\n"
            "                  Bytes = state read + written (512 MiB) + inputs and outputs.\n"
            "                  Target: >= 70%% of copy.\n"
            "  gdn decode      (gpus, or --all) gated delta net single step (llmem_op_gdn):\n"
            "                  64 sequences x Qwen3-Next-80B's linear attention (16 key / 32\n"
            "                  value heads of 128, f32 state of 2 MiB per sequence), updated\n"
            "                  in place. Bytes = state read + written (256 MiB) + inputs and\n"
            "                  outputs.\n"
            "  gdn prefill     (gpus, or --all) the same layer over 4 sequences x 512 tokens\n"
            "                  from a zero state, in tokens per second.\n"
            "  mamba1 decode,  (gpus, or --all) Mamba-1 scan (ssm_scan1, 1 token): 256\n"
            "  short conv        sequences x d_inner 8192 x d_state 16 f32 state (Jamba); LFM2's\n"
            "                  short_conv: 256 x hidden 2048, L 3. Bytes = state read + written\n"
            "                  + inputs and outputs.\n"
            "  gemv            (gpus, or --all) batch-1 GEMVs (M 1, f32 activations, bf16\n"
            "                  weights) at the 9B Bamba shape's projections: k/v, q/o, MLP up\n"
            "                  and down, Mamba-2 in_proj, the fused gate/up + SwiGLU and the\n"
            "                  LM head. Bytes = weights + activations + outputs, each call on\n"
            "                  another copy of the weights (512 MiB or more in rotation, beyond\n"
            "                  L2). Target (Vulkan issue): >= 80%% of the CUDA copy.\n"
            "  prefill attn    (cuda, or --all) causal paged prefill attention, 8 sequences x\n"
            "                  2048 tokens, same heads, f16 K/V, pages of 16; reported as time\n"
            "                  and TFLOP/s (4 * head_dim * heads * sum of visible keys). On\n"
            "                  cuda it runs twice: the default precise mode (queries and\n"
            "                  probabilities as hi+lo pairs for the tensor cores) and the fast\n"
            "                  mode (LLMEM_CUDA_ATTN_FAST=1, one rounding, FlashAttention's\n"
            "                  precision). Compare with tools/bench_sdpa.py (PyTorch flash SDPA).\n"
            "  model decode    (cuda, or --all) one decode step at batch 1 of a random\n"
            "                  bamba-shaped bf16 model of about 1.1 B parameters (18 Mamba-2 and\n"
            "                  2 attention layers, hidden 2048, MLP 4096, vocab 32000, 1024\n"
            "                  cached tokens), run op by op: embedding, every layer, final norm,\n"
            "                  LM head, argmax. Compared with the time to read the weights the\n"
            "                  step needs (all but the embedding table) once at copy bandwidth;\n"
            "                  target <= 1.5x.\n");
    fprintf(f,
            "  matmul          (only with --only matmul) f32 activations x bf16 weights at the\n"
            "                  9B Bamba shape's projections (4096 x 4096, 14336 x 4096, 4096 x\n"
            "                  14336) for 16, 64, 512 and 2048 rows, precise and fast, in\n"
            "                  TFLOP/s (2 M N K); compare cuda (cuBLAS) with vulkan.\n"
            "  mamba_prefill   (only with --only mamba_prefill) Mamba-2 ssm_conv and ssm_scan at\n"
            "                  the 9B layer shape (128 heads x 64, d_state 128, f32 states) for\n"
            "                  1 x 512, 16 x 32 and 64 x 8 tokens (pp512's ubatches), ms per call\n"
            "\n");
    fprintf(f,
            "Times are wall-clock per call: the median of 5 batches of back-to-back calls, each\n"
            "batch ended by a backend synchronize, after one warm-up call.\n"
            "\n"
            "options:\n"
            "  --iters N        calls per figure (default 100 on GPUs, 2 on cpu)\n"
            "  --all            also run the prefill and model figures on non-cuda backends\n"
            "                   (not with --model; --only runs what it names either way)\n"
            "  --only LIST      comma-separated subset of decode,mamba,gdn,ssm1,gemv,prefill,model,\n"
            "                   matmul,mamba_prefill\n"
            "                   (copy, the ceiling, always runs)\n"
            "  -m, --model DIR  instead of the kernel figures: pp512 and tg128 of checkpoint\n"
            "                   DIR at batch 1, 16 and 64 (greedy, sampled on the device),\n"
            "                   each beside its bound: weight + KV + state bytes per step\n"
            "                   over the copy bandwidth of this run (--precision fast by\n"
            "                   default; the kv and ssm dtype options apply); on GPUs also the\n"
            "                   bf16 GEMM peak of the run (matmul_fast, 8192^3) and each\n"
            "                   pp512's share of it\n"
            "  --json PATH      with --model: also write the figures as JSON\n"
            "  with --model only, the model options of `llmem generate --help`: --kv-type,\n"
            "  --ssm-type, --page-size, --n-pages, --n-ubatch (512 at least), --snapshots,\n"
            "  --tp, --prefix-cache-mb, --no-prefix-cache, --poison, --check-tensors (same\n"
            "  defaults); --n-seq-max and -c/--n-ctx are refused: the figures set them (64\n"
            "  sequences, prompt + 144 tokens)\n"
            "environment (docs/env.md):\n"
            "  the model figures: LLMEM_BENCH_PP (prompt tokens, default 512), LLMEM_BENCH_BATCH\n"
            "  (one batch size), LLMEM_BENCH_PEAK=0 (no GEMM peak), LLMEM_BENCH_WARM=first,\n"
            "  LLMEM_BENCH_HOST_SAMPLE=1 (argmax on the host); the kernel figures:\n"
            "  LLMEM_BENCH_MAMBA_SEQS, LLMEM_BENCH_SCAN_PINGPONG=1, LLMEM_BENCH_MAMBA_HEADS,\n"
            "  LLMEM_BENCH_MATMUL_F16, LLMEM_BENCH_GEMV, LLMEM_BENCH_GEMV_SETS,\n"
            "  LLMEM_BENCH_ATTN_SWEEP=\"N=V,..;..\" (the decode attention again per variant),\n"
            "  LLMEM_BENCH_ATTN_HEADS=Q/KV[/bf16] (its head counts and pool dtype)\n"
            "%s%s",
            cli_log_opts_help, cli_backend_opts_help);
}

/* ---- whole-model decode step ------------------------------------------------------------------ */

/* A bamba-shaped model (Bamba-9B's block structure, scaled to ~1.1 B): every
 * layer is pre-norm mixer + pre-norm SwiGLU MLP with residuals; the mixer
 * is Mamba-2 (in_proj -> conv1d -> scan -> gated norm -> out_proj) except in
 * M_ATTN_A and M_ATTN_B, which run GQA attention with RoPE over a paged KV
 * cache holding M_CTX tokens. All weights are bf16. */
#define M_D 2048
#define M_LAYERS 20
#define M_ATTN_A 6
#define M_ATTN_B 15
#define M_VOCAB 32000
#define M_FF 4096
#define M_H 64
#define M_P 64
#define M_N 128
#define M_DCONV 4
#define M_DI (M_H * M_P)            /* d_inner 4096 */
#define M_CD (M_DI + 2 * M_N)       /* conv_dim 4352 */
#define M_ZX (M_DI + M_CD + M_H)    /* in_proj rows 8512 */
#define M_QH 32
#define M_KVH 8
#define M_HD 64
#define M_QKV ((M_QH + 2 * M_KVH) * M_HD)
#define M_CTX 1024
#define M_PS 16
#define M_PAGES ((M_CTX + 1 + M_PS - 1) / M_PS)

typedef struct arena {
    llmem_buffer *buf; /* NULL while sizing */
    size_t used;
} arena;

/* No tensor of an arena crosses a multiple of ARENA_SPAN bytes: a backend
 * that cuts a large buffer into chunks (Vulkan: 2 GiB on NVIDIA, docs/
 * vulkan.md "Large buffers") binds a tensor across a chunk boundary through
 * a copy, which models/runtime.c avoids by giving each weight a buffer of
 * its own. Without this the 1.1B step's LM head, the last 131 MB of a
 * 2.24 GB arena, crossed 2 GiB and every one of its calls was a copy plus
 * the product (0.353 ms on the H200 against CUDA's 0.034). Chunks of
 * ARENA_SPAN or a multiple of it are never crossed. */
#define ARENA_SPAN ((size_t)1 << 30)

static llmem_tensor at(arena *a, llmem_dtype t, int32_t n0, int32_t n1)
{
    size_t bytes = ((size_t)n0 * (size_t)(n1 ? n1 : 1) * llmem_dtype_size(t) + 255) / 256 * 256;
    if (bytes <= ARENA_SPAN && a->used / ARENA_SPAN != (a->used + bytes - 1) / ARENA_SPAN)
        a->used = (a->used / ARENA_SPAN + 1) * ARENA_SPAN;
    llmem_tensor x = llmem_tensor_2d(a->buf, a->used, t, n0, n1);
    if (n1 == 0)
        x = llmem_tensor_1d(a->buf, a->used, t, n0);
    a->used += bytes;
    return x;
}

typedef struct m_layer {
    llmem_tensor norm1, norm2, gate, up, down;
    llmem_tensor in_proj, conv_w, conv_b, a_log, d, dt_bias, gnorm, out_proj; /* Mamba-2 */
    llmem_tensor wqkv, wo;                                                 /* attention */
    llmem_buffer *st[2]; /* conv and ssm state, or the K and V pools */
    llmem_view view;
    llmem_kv_view kv; /* view.desc of an attention layer */
    llmem_rs_view rs; /* view.desc of a Mamba-2 layer */
} m_layer;

typedef struct model {
    llmem_backend *be;
    m_layer layer[M_LAYERS];
    llmem_tensor embed, fnorm, lm_head;
    llmem_tensor x, h, zx, xo, y, y2, o, g, u, qkv, ao, logits, tok, pos;
    llmem_state_desc desc[2];
    int32_t n_ops;
} model;

static bool is_attn(int32_t il)
{
    return il == M_ATTN_A || il == M_ATTN_B;
}

static void model_weights(model *m, arena *w)
{
    m->embed = at(w, LLMEM_DTYPE_BF16, M_VOCAB, M_D);
    for (int32_t il = 0; il < M_LAYERS; il++) {
        m_layer *l = &m->layer[il];
        l->norm1 = at(w, LLMEM_DTYPE_BF16, M_D, 0);
        if (is_attn(il)) {
            l->wqkv = at(w, LLMEM_DTYPE_BF16, M_QKV, M_D);
            l->wo = at(w, LLMEM_DTYPE_BF16, M_D, M_QH * M_HD);
        } else {
            l->in_proj = at(w, LLMEM_DTYPE_BF16, M_ZX, M_D);
            l->conv_w = at(w, LLMEM_DTYPE_BF16, M_CD, M_DCONV);
            l->conv_b = at(w, LLMEM_DTYPE_BF16, M_CD, 0);
            l->a_log = at(w, LLMEM_DTYPE_BF16, M_H, 0);
            l->d = at(w, LLMEM_DTYPE_BF16, M_H, 0);
            l->dt_bias = at(w, LLMEM_DTYPE_BF16, M_H, 0);
            l->gnorm = at(w, LLMEM_DTYPE_BF16, M_DI, 0);
            l->out_proj = at(w, LLMEM_DTYPE_BF16, M_D, M_DI);
        }
        l->norm2 = at(w, LLMEM_DTYPE_BF16, M_D, 0);
        l->gate = at(w, LLMEM_DTYPE_BF16, M_FF, M_D);
        l->up = at(w, LLMEM_DTYPE_BF16, M_FF, M_D);
        l->down = at(w, LLMEM_DTYPE_BF16, M_D, M_FF);
    }
    m->fnorm = at(w, LLMEM_DTYPE_BF16, M_D, 0);
    m->lm_head = at(w, LLMEM_DTYPE_BF16, M_VOCAB, M_D);
}

static void model_acts(model *m, arena *a)
{
    m->x = at(a, LLMEM_DTYPE_F32, 1, M_D);
    m->h = at(a, LLMEM_DTYPE_F32, 1, M_D);
    m->zx = at(a, LLMEM_DTYPE_F32, 1, M_ZX);
    m->xo = at(a, LLMEM_DTYPE_F32, 1, M_CD);
    m->y = at(a, LLMEM_DTYPE_F32, 1, M_DI);
    m->y2 = at(a, LLMEM_DTYPE_F32, 1, M_DI);
    m->o = at(a, LLMEM_DTYPE_F32, 1, M_D);
    m->g = at(a, LLMEM_DTYPE_F32, 1, M_FF);
    m->u = at(a, LLMEM_DTYPE_F32, 1, M_FF);
    m->qkv = at(a, LLMEM_DTYPE_F32, 1, M_QKV);
    m->ao = at(a, LLMEM_DTYPE_F32, 1, M_QH * M_HD);
    m->logits = at(a, LLMEM_DTYPE_F32, 1, M_VOCAB);
    m->tok = at(a, LLMEM_DTYPE_I32, 1, 0);
    m->pos = at(a, LLMEM_DTYPE_I32, 1, 0);
}

#define OP(expr)                                                                            \
    do {                                                                                    \
        m->n_ops++;                                                                         \
        CHECK(expr);                                                                        \
    } while (0)

static llmem_status model_step(void *vctx)
{
    model *m = vctx;
    llmem_backend *be = m->be;
    const float eps = 1e-5f;
    m->n_ops = 0;
    OP(llmem_op_get_rows(be, &m->embed, &m->tok, &m->x));
    size_t zo = m->zx.offset, qo = m->qkv.offset;
    llmem_tensor z = llmem_tensor_2d(m->zx.buf, zo, LLMEM_DTYPE_F32, 1, M_DI);
    llmem_tensor xbc = llmem_tensor_2d(m->zx.buf, zo + (size_t)M_DI * 4, LLMEM_DTYPE_F32, 1, M_CD);
    llmem_tensor dt = llmem_tensor_2d(m->zx.buf, zo + (size_t)(M_DI + M_CD) * 4, LLMEM_DTYPE_F32,
                                      1, M_H);
    llmem_tensor q = llmem_tensor_3d(m->qkv.buf, qo, LLMEM_DTYPE_F32, 1, M_QH, M_HD);
    llmem_tensor k = llmem_tensor_3d(m->qkv.buf, qo + (size_t)M_QH * M_HD * 4, LLMEM_DTYPE_F32, 1,
                                     M_KVH, M_HD);
    llmem_tensor v = llmem_tensor_3d(m->qkv.buf, qo + (size_t)(M_QH + M_KVH) * M_HD * 4,
                                     LLMEM_DTYPE_F32, 1, M_KVH, M_HD);
    llmem_tensor ao3 = llmem_tensor_3d(m->ao.buf, m->ao.offset, LLMEM_DTYPE_F32, 1, M_QH, M_HD);
    llmem_ssm_params sp = {M_H, M_P, M_N, 1, 0.0f, INFINITY, 0};
    llmem_rope_params rp = {LLMEM_ROPE_NEOX, M_HD, 10000.0f, 1.0f};
    llmem_attn_params ap = {.scale = 1.0f / sqrtf((float)M_HD)};
    for (int32_t il = 0; il < M_LAYERS; il++) {
        m_layer *l = &m->layer[il];
        OP(llmem_op_rms_norm(be, &m->x, &l->norm1, eps, &m->h));
        if (is_attn(il)) {
            OP(llmem_op_matmul(be, &m->h, &l->wqkv, &m->qkv));
            OP(llmem_op_rope(be, &rp, &q, &m->pos, &q));
            OP(llmem_op_rope(be, &rp, &k, &m->pos, &k));
            OP(llmem_op_kv_store(be, &l->view, &k, &v));
            OP(llmem_op_attention_paged(be, &ap, &l->view, &q, &ao3));
            OP(llmem_op_matmul(be, &m->ao, &l->wo, &m->o));
        } else {
            OP(llmem_op_matmul(be, &m->h, &l->in_proj, &m->zx));
            OP(llmem_op_ssm_conv(be, &l->view, 0, &xbc, &l->conv_w, &l->conv_b, &m->xo));
            OP(llmem_op_ssm_scan(be, &sp, &l->view, 1, &m->xo, &dt, &l->a_log, &l->d,
                                 &l->dt_bias, &m->y));
            OP(llmem_op_rms_norm_gated(be, &m->y, &z, &l->gnorm, 1, eps, &m->y2));
            OP(llmem_op_matmul(be, &m->y2, &l->out_proj, &m->o));
        }
        OP(llmem_op_add(be, &m->x, &m->o, &m->x));
        OP(llmem_op_rms_norm(be, &m->x, &l->norm2, eps, &m->h));
        OP(llmem_op_matmul(be, &m->h, &l->gate, &m->g));
        OP(llmem_op_matmul(be, &m->h, &l->up, &m->u));
        OP(llmem_op_swiglu(be, &m->g, &m->u, &m->g));
        OP(llmem_op_matmul(be, &m->g, &l->down, &m->o));
        OP(llmem_op_add(be, &m->x, &m->o, &m->x));
    }
    OP(llmem_op_rms_norm(be, &m->x, &m->fnorm, eps, &m->h));
    OP(llmem_op_matmul(be, &m->h, &m->lm_head, &m->logits));
    OP(llmem_op_argmax(be, &m->logits, &m->tok));
    return LLMEM_OK;
}

static llmem_status model_setup(bench *b, model *m, arena *w, arena *a, tables *t,
                                llmem_buffer **idx)
{
    memset(m, 0, sizeof *m);
    m->be = b->be;
    model_weights(m, w);
    CHECK(bench_new_buffer(b, w->used, &w->buf));
    w->used = 0;
    model_weights(m, w);
    CHECK(bench_fill(b, w->buf, 0, (int64_t)(w->used / 2), LLMEM_DTYPE_BF16, true));
    model_acts(m, a);
    CHECK(bench_new_buffer(b, a->used, &a->buf));
    a->used = 0;
    model_acts(m, a);
    int32_t tok_pos[2] = {1, M_CTX};
    CHECK(llmem_buffer_upload(a->buf, m->tok.offset, &tok_pos[0], 4));
    CHECK(llmem_buffer_upload(a->buf, m->pos.offset, &tok_pos[1], 4));
    /* index tables shared by every layer's view */
    int32_t zero = 0, slot = M_CTX, len = M_CTX + 1, pt[M_PAGES];
    for (int32_t i = 0; i < M_PAGES; i++)
        pt[i] = i;
    llmem_i32_table src = bench_tab_add(t, &zero, 1), dst = bench_tab_add(t, &zero, 1);
    llmem_i32_table none = bench_tab_add(t, NULL, 0), stok = bench_tab_add(t, &zero, 1);
    llmem_i32_table sslot = bench_tab_add(t, &slot, 1), ptab = bench_tab_add(t, pt, M_PAGES);
    llmem_i32_table slen = bench_tab_add(t, &len, 1), tkl = bench_tab_add(t, &len, 1);
    llmem_i32_table tseq = bench_tab_add(t, &zero, 1);
    llmem_i32_table *list[] = {&src, &dst, &none, &stok, &sslot, &ptab, &slen, &tkl, &tseq};
    CHECK(bench_tab_finish(b, t, list, 9, idx));
    m->desc[0] = (llmem_state_desc){"conv", 2, {M_DCONV - 1, M_CD}, LLMEM_DTYPE_F32};
    m->desc[1] = (llmem_state_desc){"ssm", 3, {M_H, M_P, M_N}, LLMEM_DTYPE_F32};
    for (int32_t il = 0; il < M_LAYERS; il++) {
        m_layer *l = &m->layer[il];
        l->view.idx = *idx;
        if (is_attn(il)) {
            int64_t n = (int64_t)M_PAGES * M_PS * M_KVH * M_HD;
            for (int j = 0; j < 2; j++) {
                CHECK(bench_new_buffer(b, (size_t)n * 2, &l->st[j]));
                CHECK(bench_fill(b, l->st[j], 0, n, LLMEM_DTYPE_BF16, false));
            }
            llmem_kv_view *kv = &l->kv;
            l->view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, l->view.idx);
            *kv = (llmem_kv_view){.k = l->st[0], .v = l->st[1], .dtype = LLMEM_DTYPE_BF16,
                                  .n_pages = M_PAGES, .page_size = M_PS, .n_kv_heads = M_KVH,
                                  .head_dim = M_HD, .store_tok = stok, .store_slot = sslot,
                                  .max_pages = M_PAGES, .page_table = ptab, .seq_len = slen,
                                  .tok_kv_len = tkl, .tok_seq = tseq, .shift_slot = none,
                                  .shift_delta = none};
        } else {
            for (int j = 0; j < 2; j++) {
                int64_t n = 1;
                for (int32_t e = 0; e < m->desc[j].n_dims; e++)
                    n *= m->desc[j].shape[e];
                CHECK(bench_new_buffer(b, (size_t)n * 4, &l->st[j]));
                CHECK(bench_fill(b, l->st[j], 0, n, LLMEM_DTYPE_F32, true));
            }
            llmem_rs_view *rs = &l->rs;
            l->view = llmem_view_make(LLMEM_VIEW_RECURRENT, rs, sizeof *rs, l->view.idx);
            *rs = (llmem_rs_view){.n_states = 2, .desc = m->desc, .state = l->st, .n_slots = 1,
                                  .n_seqs = 1, .n_seq_tokens = 1, .src_slot = src,
                                  .dst_slot = dst, .ckpt_slot = none, .n_ckpt = 0};
        }
    }
    return LLMEM_OK;
}

typedef struct mm_ctx {
    llmem_backend *be;
    const llmem_tensor *a, *w, *out;
} mm_ctx;

static llmem_status mm_run(void *vctx)
{
    mm_ctx *c = vctx;
    return llmem_op_matmul(c->be, c->a, c->w, c->out);
}

static llmem_status bench_model(bench *b)
{
    model *m = calloc(1, sizeof *m);
    if (!m)
        return LLMEM_E_NO_MEMORY;
    arena w = {0}, a = {0};
    tables t = {0};
    llmem_buffer *idx = NULL;
    double sec = 0;
    llmem_status st = model_setup(b, m, &w, &a, &t, &idx);
    if (st == LLMEM_OK)
        st = bench_time_it(b, "model decode step", model_step, m, &sec);
    /* host time to enqueue one step: the launch-rate floor of op-by-op decode */
    double enq = 0;
    if (st == LLMEM_OK) {
        double t0 = cli_now();
        st = model_step(m);
        enq = cli_now() - t0;
        if (st == LLMEM_OK)
            st = llmem_backend_synchronize(b->be);
    }
    if (st == LLMEM_OK) {
        /* parameters: every weight element (bf16, no padding) */
        double params = (double)M_VOCAB * M_D * 2 + M_D;
        for (int32_t il = 0; il < M_LAYERS; il++) {
            params += 2.0 * M_D + 3.0 * M_FF * M_D;
            params += is_attn(il) ? (double)M_QKV * M_D + (double)M_D * M_QH * M_HD
                                  : (double)M_ZX * M_D + (double)M_CD * (M_DCONV + 1) +
                                        3.0 * M_H + M_DI + (double)M_D * M_DI;
        }
        double step_bytes = 2.0 * (params - (double)M_VOCAB * M_D);
        double ideal = step_bytes / b->copy_bw;
        printf("%-28s %9.3f ms  %8.2fx the weight read (%.2f B params; %.2f GB of weights "
               "read per step in %.3f ms at copy bandwidth; %d ops enqueued in %.3f ms; "
               "target <= 1.5x)\n",
               "model decode step", sec * 1e3, sec / ideal, params / 1e9, step_bytes / 1e9,
               ideal * 1e3, m->n_ops, enq * 1e3);
        /* where the time goes: the two largest single-row matmuls alone */
        mm_ctx c1 = {b->be, &m->h, &m->layer[0].in_proj, &m->zx};
        mm_ctx c2 = {b->be, &m->h, &m->lm_head, &m->logits};
        double t1 = 0, t2 = 0;
        st = bench_time_it(b, "matmul 8512x2048", mm_run, &c1, &t1);
        if (st == LLMEM_OK)
            st = bench_time_it(b, "matmul 32000x2048", mm_run, &c2, &t2);
        if (st == LLMEM_OK) {
            bench_report_bw(b, "  matmul 1x2048 . 8512x2048", t1, (double)M_ZX * M_D * 2, "(bf16)");
            bench_report_bw(b, "  matmul 1x2048 . 32000x2048", t2, (double)M_VOCAB * M_D * 2, "(bf16)");
        }
    }
    for (int32_t il = 0; il < M_LAYERS; il++) {
        llmem_buffer_free(m->layer[il].st[0]);
        llmem_buffer_free(m->layer[il].st[1]);
    }
    llmem_buffer_free(idx);
    llmem_buffer_free(w.buf);
    llmem_buffer_free(a.buf);
    free(t.v);
    free(m);
    return st;
}

/* ---- main ------------------------------------------------------------------------------------------ */

/* The figures --only may name (a new figure adds its name here). */
static const char *const figures[] = {"decode", "mamba",   "gdn",   "ssm1",         "gemv",
                                      "matmul", "prefill", "model", "mamba_prefill"};

/* The first name in the comma-separated list that is not a figure (its
 * length in *len), or NULL when every one is. */
static const char *unknown_figure(const char *list, size_t *len)
{
    for (const char *p = list;; p++) {
        size_t k = strcspn(p, ",");
        bool known = false;
        for (size_t i = 0; i < sizeof figures / sizeof figures[0] && !known; i++)
            known = strlen(figures[i]) == k && !strncmp(p, figures[i], k);
        if (!known) {
            *len = k;
            return p;
        }
        p += k;
        if (!*p)
            return NULL;
    }
}

/* Whether figure `name` runs: listed in --only, else by default. */
static bool wanted(const char *only, const char *name, bool dflt)
{
    if (!only)
        return dflt;
    size_t n = strlen(name);
    for (const char *p = only; *p;) {
        size_t k = strcspn(p, ",");
        if (k == n && !strncmp(p, name, n))
            return true;
        p += k + (p[k] == ',');
    }
    return false;
}

/* Whether c is a backend option (--backend, --device, --threads,
 * --precision), which every figure uses. */
static bool is_backend_opt(int c)
{
    return c == CLI_OPT_BACKEND || c == CLI_OPT_DEVICE || c == 't' || c == CLI_OPT_PRECISION;
}

int llmem_cli_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) /* host bookkeeping: examples/cli/bench_bookkeeping.c */
        if (!strcmp(argv[i], "--bookkeeping"))
            return llmem_cli_bench_bookkeeping(argc, argv);
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    int32_t iters = 0;
    bool all = false;
    const char *only = NULL;
    const char *json = NULL;
    enum { O_ITERS = CLI_OPT_OWN, O_ALL, O_ONLY, O_JSON };
    static const struct option own[] = {
        {"json", required_argument, NULL, O_JSON},
        {"iters", required_argument, NULL, O_ITERS},
        {"all", no_argument, NULL, O_ALL},
        {"only", required_argument, NULL, O_ONLY},
        {0},
    };
    cli_parser p;
    cli_parser_init(&p, "bench", argc, argv, own, "", CLI_GROUP_LOG | CLI_GROUP_BACKEND | CLI_GROUP_MODEL);
    const char *v;
    /* options that apply only with --model, not with it, or never (the
     * model figures set the sequences and the context): none is ignored */
    int model_only = 0, not_model = 0, never = 0;
    for (int c; (c = cli_next(&p, &v)) != -1;) {
        int r = cli_model_opt(&mo, "bench", c, v);
        if (r < 0 || c == '?')
            return 2;
        if (c == 'c' || c == CLI_OPT_N_SEQ_MAX)
            never = c;
        if (c == O_ONLY || c == O_ALL)
            not_model = c;
        if (c == O_JSON || (r > 0 && !is_backend_opt(c) && c != 'm' && c != 'c' &&
                            c != CLI_OPT_N_SEQ_MAX))
            model_only = c;
        if (r > 0)
            continue;
        if (c == 'h') {
            usage(stdout);
            return 0;
        } else if (c == O_ITERS && !cli_int(v, 1, 100000, &iters)) {
            fprintf(stderr, "llmem bench: bad --iters '%s'\n", v);
            return 2;
        } else if (c == O_ALL) {
            all = true;
        } else if (c == O_ONLY) {
            size_t k = 0;
            const char *bad = unknown_figure(v, &k);
            if (bad) {
                fprintf(stderr, "llmem bench: --only: '%.*s' is not a figure (one of", (int)k, bad);
                for (size_t i = 0; i < sizeof figures / sizeof figures[0]; i++)
                    fprintf(stderr, "%s %s", i ? "," : "", figures[i]);
                fprintf(stderr, ")\n");
                return 2;
            }
            only = v;
        } else if (c == O_JSON) {
            json = v;
        }
    }
    if (never) {
        fprintf(stderr, "llmem bench: --%s does not apply (the model figures set the sequences "
                        "and the context)\n", cli_opt_name(&p, never));
        return 2;
    }
    if (!mo.model && model_only) {
        fprintf(stderr, "llmem bench: --%s applies only with --model\n",
                cli_opt_name(&p, model_only));
        return 2;
    }
    if (mo.model && not_model) {
        fprintf(stderr, "llmem bench: --%s does not apply with --model (it runs only the model "
                        "figures)\n", cli_opt_name(&p, not_model));
        return 2;
    }
    if (mo.model && cli_model_opt_given(&mo, CLI_OPT_N_UBATCH) &&
        mo.params.n_ubatch < bench_model_pp()) {
        fprintf(stderr, "llmem bench: --n-ubatch %d is below the %d prompt tokens of the model "
                        "figures (one prompt per ubatch); raise it or leave it out\n",
                (int)mo.params.n_ubatch, (int)bench_model_pp());
        return 2;
    }
    if (mo.model && bench_model_batch() < 0)
        return 2;
    /* the prefill figure runs both modes on cuda; --precision is plumbed for
     * the model figure */
    mo.precision = cli_precision_of(&mo, CLI_PRECISION_FAST);
    const char *backend = mo.backend;
    int32_t device = mo.device;
    cli_apply_threads(&mo);
    bench b = {0};
    char err[512] = "";
    llmem_status st = llmem_backend_open(backend, device, &b.be, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem bench: %s\n", err[0] ? err : llmem_status_str(st));
        return 1;
    }
    b.name = llmem_backend_name(b.be);
    llmem_backend_info info;
    llmem_backend_get_info(b.be, &info);
    bool gpu = !info.host_visible;
    bool cuda = strcmp(b.name, "cuda") == 0;
    b.iters = iters > 0 ? iters : gpu ? 100 : 2;
    printf("llmem bench: backend %s, device %d: %s (%.1f GiB), %d calls per figure\n", b.name,
           (int)info.device, info.device_name, (double)info.memory_total / (1024.0 * MIB),
           b.iters);
    /* the random source: 4 Mi floats in [-1, 1), and a copy times 0.02 */
    float *h = malloc((size_t)RND_N * 4);
    uint64_t seed = 0x11e3b3c4ull;
    st = h ? bench_new_buffer(&b, (size_t)RND_N * 4, &b.rnd) : LLMEM_E_NO_MEMORY;
    if (st == LLMEM_OK)
        st = bench_new_buffer(&b, (size_t)RND_N * 4, &b.rnd_small);
    if (st == LLMEM_OK) {
        for (int32_t i = 0; i < RND_N; i++)
            h[i] = bench_rng_float(&seed, -1.0f, 1.0f);
        st = llmem_buffer_upload(b.rnd, 0, h, (size_t)RND_N * 4);
    }
    free(h);
    if (st == LLMEM_OK) {
        llmem_tensor x = llmem_tensor_1d(b.rnd, 0, LLMEM_DTYPE_F32, RND_N);
        llmem_tensor y = llmem_tensor_1d(b.rnd_small, 0, LLMEM_DTYPE_F32, RND_N);
        st = llmem_op_scale(b.be, &x, 0.02f, &y);
    }
    if (st == LLMEM_OK)
        st = bench_copy(&b, gpu);
    if (st == LLMEM_OK && gpu)
        bench_ref_copy(&b, device);
    if (st == LLMEM_OK && mo.model) { /* llmem bench --model DIR (bench_model.c) */
        mo.params.precision = mo.precision == CLI_PRECISION_PRECISE ? LLMEM_PRECISION_PRECISE
                                                                     : LLMEM_PRECISION_FAST;
        st = bench_model_dir(&b, mo.model, &mo.params, json);
        only = "";
    }
    if (st == LLMEM_OK && wanted(only, "decode", true))
        st = bench_decode_attention(&b);
    if (st == LLMEM_OK && wanted(only, "mamba", true))
        st = bench_mamba(&b);
    if (st == LLMEM_OK && wanted(only, "gdn", gpu || all))
        st = bench_gdn(&b);
    if (st == LLMEM_OK && wanted(only, "ssm1", gpu || all))
        st = bench_ssm1(&b);
    if (st == LLMEM_OK && wanted(only, "gemv", gpu || all))
        st = bench_gemv(&b);
    if (st == LLMEM_OK && wanted(only, "matmul", false))
        st = bench_matmul(&b);
    if (st == LLMEM_OK && wanted(only, "mamba_prefill", false))
        st = bench_mamba_prefill(&b);
    if (st == LLMEM_OK && wanted(only, "prefill", cuda || all))
        st = bench_prefill(&b, device);
    if (st == LLMEM_OK && wanted(only, "model", cuda || all))
        st = bench_model(&b);
    llmem_buffer_free(b.rnd);
    llmem_buffer_free(b.rnd_small);
    llmem_backend_close(b.be);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem bench: stopped: %s\n", llmem_status_str(st));
        return 1;
    }
    return 0;
}
