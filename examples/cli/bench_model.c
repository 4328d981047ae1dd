/* llmem bench --model DIR: llama-bench style figures of a real checkpoint,
 * each beside its memory bound.
 *
 * For each batch size B in {1, 16, 64} (or $LLMEM_BENCH_BATCH alone):
 *   pp512  B sequences of 512 random prompt tokens in one batch (the
 *          runtime cuts it into ubatches); tokens/s = B * 512 / time;
 *   tg128  then 128 decode steps of B tokens (one per sequence), the next
 *          token picked greedily on the device (llmem_model_decode_sample);
 *          tokens/s = B * 128 / time, and the time per step.
 * The bound of a step is the bytes it must move over the copy bandwidth
 * measured in the same run (bench_copy: bytes read + written per second):
 *   weights   every tensor of the checkpoint, except an untied embedding
 *             table (a step reads only B of its rows);
 *   KV        attention layers read K and V of every cached token of each
 *             sequence and write the new ones (the pool dtype);
 *   state     Mamba-2 layers read and write each sequence's conv and SSM
 *             state (the state dtypes).
 * With --tp N the bound is over N times the copy bandwidth (N devices).
 * pp figures also print the rate in TFLOP/s (2 * weight params * tokens)
 * and, on GPUs, its share of the backend's bf16 GEMM peak measured in the
 * same run (gemm_peak: llmem_op_matmul_fast at 8192 x 8192 x 8192, bf16
 * weights, its rounding of the activations to bf16 included).
 * Each batch size is run once untimed first (LLMEM_BENCH_WARM=first: only
 * the first), so the decode step's recording is made before the timed steps.
 * --json PATH writes the same data. LLMEM_BENCH_HOST_SAMPLE=1 makes the tg
 * steps download all logits and pick on the host instead (for comparison). Shapes: the checkpoint's (use a random
 * checkpoint of the real shape: docs/benchmarks.md says how one is made).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/bench.h"
#include "examples/cli/common.h"
#include "llmem/model.h"
#include "llmem/runtime.h"

#define TG 128
/* Prompt tokens per sequence: 512, or $LLMEM_BENCH_PP (e.g. 4096 for decode
 * at a 4K context; the rows keep the name pp512 / tg128). */
#define PP bench_model_pp()

int32_t bench_model_pp(void)
{
    const char *e = getenv("LLMEM_BENCH_PP");
    int n = e ? atoi(e) : 0;
    return n > 0 && n <= 1 << 20 ? (int32_t)n : 512;
}

typedef struct bm_row {
    int32_t batch;
    double pp_s, tg_s;          /* seconds for the pp batch and the tg128 steps */
    double tg_bound_s;          /* bound of the 128 steps */
    double pp_bound_s;
} bm_row;

/* Bytes of the weights a decode step reads, and their element count. */
static llmem_status weight_bytes(const char *dir, const llmem_model_config *c, double *bytes,
                                 double *params)
{
    llmem_safetensors *st = NULL;
    char err[256];
    llmem_status s = llmem_safetensors_open(dir, &st, err, sizeof err);
    if (s != LLMEM_OK) {
        fprintf(stderr, "llmem bench: %s\n", err);
        return s;
    }
    *bytes = 0;
    *params = 0;
    for (int32_t i = 0; i < llmem_safetensors_count(st); i++) {
        llmem_tensor_info t;
        if (llmem_safetensors_get(st, i, &t) != LLMEM_OK)
            continue;
        if (!c->tie_word_embeddings && strstr(t.name, "embed"))
            continue; /* only B rows of it are read */
        *bytes += (double)t.n_bytes;
        *params += (double)t.n_elements;
    }
    llmem_safetensors_close(st);
    return LLMEM_OK;
}

/* KV and state bytes of one step of B sequences at context ctx (tokens). */
static double cache_bytes(const llmem_model_config *c, const llmem_model_params *p, int32_t b,
                          double ctx)
{
    double kv_tok = 2.0 * c->n_kv_heads * c->head_dim * (double)llmem_dtype_size(p->kv_dtype);
    double kv = c->n_attention_layers * b * kv_tok * (ctx + 1.0); /* read ctx, write 1 */
    double ssm = (double)c->ssm_n_heads * c->ssm_head_dim * c->ssm_d_state *
                 (double)llmem_dtype_size(p->ssm_dtype);
    double conv = (double)(c->ssm_d_conv - 1) * c->ssm_conv_dim * 4.0;
    double state = c->n_mamba_layers * b * 2.0 * (ssm + conv); /* read + write */
    return kv + state;
}

static llmem_status run_batch(llmem_model *m, int32_t b, int32_t v, uint64_t *seed, bm_row *row)
{
    llmem_memory *mem = llmem_model_memory(m);
    for (int32_t s = 0; s < 64; s++)
        (void)llmem_memory_seq_rm(mem, s, -1, -1);
    int32_t n = b * PP;
    int32_t *tok = malloc((size_t)n * sizeof *tok), *pos = malloc((size_t)n * sizeof *pos);
    int32_t *seq = malloc((size_t)n * sizeof *seq);
    const int32_t **seqp = malloc((size_t)n * sizeof *seqp);
    int8_t *out = malloc((size_t)n);
    int32_t ids[64], ctr[64] = {0};
    llmem_status st = LLMEM_E_NO_MEMORY;
    char err[512] = "";
    /* LLMEM_BENCH_HOST_SAMPLE=1: tg steps download every row's logits and
     * pick the argmax on the host (what generate did before device sampling) */
    const char *hs = getenv("LLMEM_BENCH_HOST_SAMPLE");
    float *host_logits = hs && *hs == '1' ? malloc((size_t)64 * v * sizeof(float)) : NULL;
    if (!tok || !pos || !seq || !seqp || !out || (hs && *hs == '1' && !host_logits))
        goto done;
    for (int32_t s = 0; s < b; s++)
        for (int32_t i = 0; i < PP; i++) {
            int32_t k = s * PP + i;
            tok[k] = (int32_t)(bench_rng_next(seed) % (uint64_t)v);
            pos[k] = i;
            seq[k] = s;
            seqp[k] = &seq[k];
            out[k] = i == PP - 1;
        }
    llmem_batch bt = {.n_tokens = n, .token = tok, .pos = pos, .seq_id = seqp, .output = out};
    llmem_model_sampling smp = {.params = {.temperature = 0.0f, .top_p = 1.0f}, .ids = ids,
                                .ctr = ctr};
    int32_t n_out = 0;
    double t0 = cli_now();
    st = llmem_model_decode_sample(m, &bt, &smp, 64, &n_out, err, sizeof err);
    row->pp_s = cli_now() - t0;
    if (st != LLMEM_OK)
        goto done;
    t0 = cli_now();
    for (int32_t step = 0; step < TG && st == LLMEM_OK; step++) {
        for (int32_t s = 0; s < b; s++) {
            tok[s] = ids[s];
            pos[s] = PP + step;
            seq[s] = s;
            seqp[s] = &seq[s];
            out[s] = 1;
            ctr[s] = pos[s];
        }
        llmem_batch st_b = {.n_tokens = b, .token = tok, .pos = pos, .seq_id = seqp,
                            .output = out};
        if (host_logits) { /* the old path: every row's logits to the host */
            st = llmem_model_decode(m, &st_b, false, host_logits, 64, &n_out, err, sizeof err);
            for (int32_t s = 0; st == LLMEM_OK && s < b; s++) {
                const float *x = host_logits + (size_t)s * v;
                int32_t best = 0;
                for (int32_t j = 1; j < v; j++)
                    best = x[j] > x[best] ? j : best;
                ids[s] = best;
            }
        } else {
            st = llmem_model_decode_sample(m, &st_b, &smp, 64, &n_out, err, sizeof err);
        }
    }
    row->tg_s = cli_now() - t0;
done:
    if (st != LLMEM_OK)
        fprintf(stderr, "llmem bench: batch %d: %s (%s)\n", b, err, llmem_status_str(st));
    free(tok);
    free(pos);
    free(seq);
    free(seqp);
    free(out);
    free(host_logits);
    return st;
}

typedef struct peak_ctx {
    llmem_backend *be;
    llmem_tensor a, w, out;
} peak_ctx;

static llmem_status peak_run(void *vctx)
{
    peak_ctx *c = vctx;
    return llmem_op_matmul_fast(c->be, &c->a, &c->w, &c->out);
}

/* The backend's bf16 GEMM rate in FLOP/s: llmem_op_matmul_fast of an
 * [8192, 8192] f32 activation by an [8192, 8192] bf16 weight (as the
 * prefill GEMMs of a fast-mode model run); 0 (not measured) on a device
 * whose copy moves under 200 GB/s (the cpu backend, lavapipe), where one
 * call takes many seconds. */
static llmem_status gemm_peak(bench *b, double *flops)
{
    const int32_t n = 8192;
    *flops = 0;
    if (b->copy_bw < 200e9)
        return LLMEM_OK;
    llmem_buffer *ba = NULL, *bw = NULL, *bo = NULL;
    size_t an = (size_t)n * n;
    llmem_status st = bench_new_filled(b, an * 4, (int64_t)an, LLMEM_DTYPE_F32, false, &ba);
    if (st == LLMEM_OK)
        st = bench_new_filled(b, an * 2, (int64_t)an, LLMEM_DTYPE_BF16, true, &bw);
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, an * 4, &bo);
    peak_ctx c = {b->be, llmem_tensor_2d(ba, 0, LLMEM_DTYPE_F32, n, n),
                  llmem_tensor_2d(bw, 0, LLMEM_DTYPE_BF16, n, n),
                  llmem_tensor_2d(bo, 0, LLMEM_DTYPE_F32, n, n)};
    double sec = 0;
    if (st == LLMEM_OK)
        st = bench_time_it(b, "gemm peak", peak_run, &c, &sec);
    if (st == LLMEM_OK)
        *flops = 2.0 * n * (double)n * n / sec;
    llmem_buffer_free(ba);
    llmem_buffer_free(bw);
    llmem_buffer_free(bo);
    return st;
}

int32_t bench_model_batch(void)
{
    const char *e = getenv("LLMEM_BENCH_BATCH");
    if (!e)
        return 0;
    char *end = NULL;
    long x = strtol(e, &end, 10);
    if (end == e || *end != '\0' || x < 1 || x > 64) {
        fprintf(stderr, "llmem bench: LLMEM_BENCH_BATCH='%s' is not a batch size from 1 to 64\n", e);
        return -1;
    }
    return (int32_t)x;
}

llmem_status bench_model_dir(bench *b, const char *dir, const llmem_model_params *mp,
                             const char *json_path)
{
    llmem_model_params p = *mp;
    p.n_seq_max = 64;
    p.n_ctx = PP + TG + 16;
    if (p.n_ubatch < PP)
        p.n_ubatch = PP;
    llmem_model *m = NULL;
    char err[512] = "";
    double t0 = cli_now();
    llmem_status st = llmem_model_load(dir, b->be, &p, &m, err, sizeof err);
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem bench: cannot load model '%s': %s (%s)\n", dir, err,
                llmem_status_str(st));
        return st;
    }
    const llmem_model_config *c = llmem_model_get_config(m);
    double wb = 0, params = 0;
    if ((st = weight_bytes(dir, c, &wb, &params)) != LLMEM_OK)
        goto done;
    /* the resolved dtypes (kv by precision) */
    if (p.kv_dtype == LLMEM_DTYPE_COUNT)
        p.kv_dtype = p.precision == LLMEM_PRECISION_FAST ? LLMEM_DTYPE_BF16 : LLMEM_DTYPE_F32;
    printf("model %s: %s, %d layers (%d attention, %d mamba2), hidden %d, vocab %d; %.2f B "
           "params, %.2f GB of weights read per step; precision %s, kv %s, ssm state %s; "
           "loaded in %.1f s\n",
           dir, llmem_arch_name(c->arch), c->n_layers, c->n_attention_layers,
           c->n_mamba_layers, c->hidden_size, c->vocab_size, params / 1e9, wb / 1e9,
           llmem_precision_name(p.precision), llmem_dtype_name(p.kv_dtype),
           llmem_dtype_name(p.ssm_dtype), cli_now() - t0);
    double peak = 0; /* $LLMEM_BENCH_PEAK=0: not measured (about 20 s on Vulkan) */
    const char *peak_env = getenv("LLMEM_BENCH_PEAK");
    if (!(peak_env && strcmp(peak_env, "0") == 0) && (st = gemm_peak(b, &peak)) != LLMEM_OK)
        goto done;
    if (peak > 0)
        printf("gemm peak %.1f TFLOP/s  (llmem_op_matmul_fast, 8192 x 8192 x 8192, bf16 weights)\n",
               peak / 1e12);
    int32_t batches[3] = {1, 16, 64}, n_batches = 3;
    bm_row rows[3] = {{0}};
    uint64_t seed = 0x5eed;
    printf("%-6s %-6s %12s %12s %12s %8s\n", "test", "batch", "tokens/s", "ms/step",
           "bound ms", "ratio");
    int32_t only = bench_model_batch();
    if (only < 0) {
        st = LLMEM_E_INVALID;
        goto done;
    }
    if (only > 0) {
        batches[0] = only;
        n_batches = 1;
    }
    /* $LLMEM_BENCH_WARM=first: only the first batch size gets a warm-up
     * run (what bench did before); default: every batch size, so tg128 is
     * the steady-state step, its recorded decode step (CUDA graph) made in
     * the warm-up as llama-bench discards a warm-up run per test, instead
     * of one eager step + recording among the 128 timed ones */
    const char *warm_env = getenv("LLMEM_BENCH_WARM");
    bool warm_each = !(warm_env && strcmp(warm_env, "first") == 0);
    bool warm = false;
    for (int i = 0; i < n_batches && st == LLMEM_OK; i++) {
        bm_row *r = &rows[i];
        r->batch = batches[i];
        /* warm-up: module load, cuBLAS handles, scratch, recorded steps */
        if ((!warm || warm_each) &&
            (st = run_batch(m, r->batch, c->vocab_size, &seed, r)) != LLMEM_OK)
            break;
        warm = true;
        if ((st = run_batch(m, r->batch, c->vocab_size, &seed, r)) != LLMEM_OK)
            break;
        /* --tp N: N devices move their shares at once (replicated norms,
         * embedding rows and KV heads make the true bound a little higher) */
        double bw = b->copy_bw * (p.tp > 1 ? p.tp : 1);
        double tg_bytes = 0;
        for (int32_t s = 0; s < TG; s++)
            tg_bytes += wb + cache_bytes(c, &p, r->batch, PP + s);
        r->tg_bound_s = tg_bytes / bw;
        /* a prompt reads the weights once, writes its K/V, reads and writes
         * each state once */
        double kv_tok = 2.0 * c->n_kv_heads * c->head_dim * (double)llmem_dtype_size(p.kv_dtype);
        r->pp_bound_s = (wb + cache_bytes(c, &p, r->batch, 0) +
                         (double)c->n_attention_layers * r->batch * (PP - 1) * kv_tok) /
                        bw;
        double pp_tok = (double)r->batch * PP, tg_tok = (double)r->batch * TG;
        double pp_flops = 2.0 * params * pp_tok / r->pp_s;
        printf("%-6s %-6d %12.1f %12.3f %12.3f %7.2fx  (%.1f TFLOP/s", "pp512", r->batch,
               pp_tok / r->pp_s, r->pp_s * 1e3, r->pp_bound_s * 1e3, r->pp_s / r->pp_bound_s,
               pp_flops / 1e12);
        if (peak > 0)
            printf(", %.1f%% of the GEMM peak", 100.0 * pp_flops / peak);
        printf(")\n");
        printf("%-6s %-6d %12.1f %12.3f %12.3f %7.2fx\n", "tg128", r->batch, tg_tok / r->tg_s,
               r->tg_s / TG * 1e3, r->tg_bound_s / TG * 1e3, r->tg_s / r->tg_bound_s);
        fflush(stdout);
    }
    if (st == LLMEM_OK && json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f) {
            fprintf(stderr, "llmem bench: cannot write '%s'\n", json_path);
            st = LLMEM_E_IO;
            goto done;
        }
        fprintf(f, "{\"model\": \"%s\", \"backend\": \"%s\", \"precision\": \"%s\", "
                   "\"copy_gbps\": %.1f, \"gemm_peak_tflops\": %.1f, \"weight_bytes\": %.0f, "
                   "\"params\": %.0f, \"runs\": [",
                dir, b->name, llmem_precision_name(p.precision), b->copy_bw / 1e9, peak / 1e12, wb,
                params);
        const char *sep = "";
        for (int i = 0; i < 3; i++)
            if (rows[i].batch > 0 && fprintf(f,
                    "%s{\"batch\": %d, \"pp512_tok_s\": %.2f, \"pp512_ms\": %.3f, "
                    "\"pp512_bound_ms\": %.3f, \"tg128_tok_s\": %.2f, \"tg128_ms_per_step\": "
                    "%.4f, \"tg128_bound_ms_per_step\": %.4f, \"tg128_ratio\": %.3f}",
                    sep, rows[i].batch, rows[i].batch * PP / rows[i].pp_s,
                    rows[i].pp_s * 1e3, rows[i].pp_bound_s * 1e3,
                    rows[i].batch * TG / rows[i].tg_s, rows[i].tg_s / TG * 1e3,
                    rows[i].tg_bound_s / TG * 1e3, rows[i].tg_s / rows[i].tg_bound_s) > 0)
                sep = ", ";
        fprintf(f, "]}\n");
        fclose(f);
    }
done:
    llmem_model_free(m);
    return st;
}
