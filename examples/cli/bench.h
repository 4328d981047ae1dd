/* llmem bench: the harness every figure shares (examples/cli/bench_harness.c)
 * and the figures (examples/cli/bench_ops.c: copy, paged attention, Mamba-2
 * decode; examples/cli/bench.c: the whole-model decode step and main). */
#ifndef LLMEM_CLI_BENCH_H
#define LLMEM_CLI_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "llmem/llmem.h"
#include "llmem/ops.h"

#define MIB ((size_t)1 << 20)
#define CHECK(expr)                                                                         \
    do {                                                                                    \
        llmem_status st_ = (expr);                                                          \
        if (st_ != LLMEM_OK) {                                                              \
            fprintf(stderr, "llmem bench: %s:%d: %s: %s\n", __func__, __LINE__, #expr,      \
                    llmem_status_str(st_));                                                 \
            return st_;                                                                     \
        }                                                                                   \
    } while (0)

/* One benchmark run on one backend. */
typedef struct bench {
    llmem_backend *be;
    const char *name;
    int iters;
    double copy_bw; /* bytes / s, read + written */
    llmem_buffer *rnd; /* 4 Mi random f32 in [-1, 1) */
    llmem_buffer *rnd_small; /* the same times 0.02 */
    double ref_copy_bw; /* the CUDA copy on the same GPU (bench_vulkan.c), 0: none */
} bench;

#define RND_N ((int32_t)(4 * MIB))

/* Index tables of a view, built on the host and uploaded in one buffer. */
typedef struct tables {
    int32_t *v;
    int32_t n, cap;
} tables;

typedef llmem_status (*bench_fn)(void *ctx);

/* splitmix64 step; uniform float in [lo, hi). */
uint64_t bench_rng_next(uint64_t *s);
float bench_rng_float(uint64_t *s, float lo, float hi);
/* Random permutation of [0, n). */
void bench_shuffle(int32_t *v, int32_t n, uint64_t seed);
/* Median seconds per call of fn over 5 batches (after one warm-up). When
 * the figure will take more than a second, says so on stderr first, naming
 * it `label` (progress of long runs, e.g. on the cpu backend). */
llmem_status bench_time_it(bench *b, const char *label, bench_fn fn, void *ctx, double *sec);
/* Fills n elements of dtype t at byte `offset` of buf with the random
 * source (small: values in [-0.02, 0.02)). */
llmem_status bench_fill(bench *b, llmem_buffer *buf, size_t offset, int64_t n, llmem_dtype t,
                        bool small);
/* llmem_buffer_alloc with a message naming the size on failure. */
llmem_status bench_new_buffer(bench *b, size_t bytes, llmem_buffer **out);
/* bench_new_buffer of `bytes`, then bench_fill of its first n elements of
 * dtype t (small as there). */
llmem_status bench_new_filled(bench *b, size_t bytes, int64_t n, llmem_dtype t, bool small,
                              llmem_buffer **out);
/* Appends n values to t; the table's host pointer is set by bench_tab_finish.
 * A failed allocation gives n = -1, which bench_tab_finish reports. */
llmem_i32_table bench_tab_add(tables *t, const int32_t *vals, int32_t n);
/* Uploads the tables to a new idx buffer and points their host copies at
 * t->v (which the caller keeps until the view is done). */
llmem_status bench_tab_finish(bench *b, tables *t, llmem_i32_table **list, int n,
                              llmem_buffer **idx);
/* A one-state recurrent view (*rs, wrapped in *view) of B streams of n_tok
 * tokens each over the state buffer bufs[0] that desc describes: stream i
 * reads slot src[i] (-1: a zero state) and writes slot dst[i]; no
 * checkpoints. The tables go to t (the caller keeps t->v until the view is
 * done) and are uploaded to a new *idx (the caller frees it; the view
 * holds it). Returns bench_tab_finish's status. */
llmem_status bench_rs_view(bench *b, llmem_view *view, llmem_rs_view *rs,
                           const llmem_state_desc *desc, llmem_buffer **bufs, int32_t B,
                           int32_t n_tok, const int32_t *src, const int32_t *dst, tables *t,
                           llmem_buffer **idx);
/* One report line: time, bandwidth and its fraction of the copy ceiling. */
void bench_report_bw(const bench *b, const char *what, double t, double bytes, const char *note);

/* The figures (bench_ops.c). */
/* One device-to-device copy of bytes from src to dst: the ceiling every figure is put against;
 * a bench_time_it body (ctx is a bench_copy_ctx). */
typedef struct bench_copy_ctx {
    llmem_buffer *src, *dst;
    size_t bytes;
} bench_copy_ctx;
llmem_status bench_copy_run(void *ctx);
llmem_status bench_copy(bench *b, bool gpu);
llmem_status bench_decode_attention(bench *b);
llmem_status bench_prefill(bench *b, int32_t device);
llmem_status bench_mamba(bench *b);
/* Mamba-2 prefill conv and scan at the 9B shape (bench_mamba_pre.c, --only mamba_prefill). */
llmem_status bench_mamba_prefill(bench *b);
/* Gated delta net decode and prefill (bench_gdn.c). */
llmem_status bench_gdn(bench *b);
/* Mamba-1 scan and LFM2 short-conv decode steps (bench_ssm1.c, --only ssm1). */
llmem_status bench_ssm1(bench *b);
/* Batch-1 GEMVs at the 9B shape's projections, bf16 weights (bench_gemv.c, --only gemv). */
llmem_status bench_gemv(bench *b);
/* GEMMs at the 9B shapes, precise and fast, in TFLOP/s (bench_matmul.c, --only matmul). */
llmem_status bench_matmul(bench *b);
/* The CUDA copy as a second ceiling of a vulkan run (bench_vulkan.c). */
void bench_ref_copy(bench *b, int32_t device);

/* llmem bench --bookkeeping (examples/cli/bench_bookkeeping.c). */
int llmem_cli_bench_bookkeeping(int argc, char **argv);

/* llmem bench --model DIR (bench_model.c): pp512 and tg128 at batch 1, 16
 * and 64 of a checkpoint, beside the memory bound of each; --json PATH. */
struct llmem_model_params;
/* Prompt tokens per sequence of the model figures: 512, or $LLMEM_BENCH_PP
 * when that is in [1, 2^20]; --n-ubatch must hold them (one prompt per
 * ubatch). */
int32_t bench_model_pp(void);
/* The one batch size $LLMEM_BENCH_BATCH asks for (1 .. 64, the sequences
 * the model figures have room for), 0 when unset (1, 16 and 64), -1 (said
 * on stderr) when it is anything else. */
int32_t bench_model_batch(void);
llmem_status bench_model_dir(bench *b, const char *dir, const struct llmem_model_params *p,
                             const char *json_path);

#endif
