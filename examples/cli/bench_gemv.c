/* llmem bench: decode GEMV figures (`--only gemv`): out[M, N] = a[M, K] ·
 * w[N, K]ᵀ with f32 activations, bf16 weights and M = 1 (a batch-1 decode
 * step) at the projections of the 9B Bamba shape (hidden 4096, MLP 14336,
 * Mamba-2 in_proj 16768 rows, 8 KV heads of 128, vocab 128256), plus the
 * fused gate/up + SwiGLU GEMV (llmem_op_matmul_swiglu) of the MLP, and the
 * fused decode matmuls a batch-1 model step runs where the backend has
 * llmem_op_norm_matmul (figures "nm ...": the RMS or gated norm of the
 * input, a residual add or SwiGLU of the output, as models/forward.c),
 * and the same at the 2b shape of tools/synth_bamba.py ("gemv2b",
 * "nm2b": hidden 2048, MLP 8192, in_proj 8512 rows). A
 * decode GEMV is bound by reading the weights once, so each figure is the
 * bandwidth of weights + activations + outputs against the copy ceiling of
 * the same run (and the CUDA copy on a vulkan run). Each figure cycles
 * through copies of its weights that together span at least 512 MiB, far
 * beyond the GPU's L2 (60 MiB on the H200), so every call reads them from
 * memory. See bench.c's usage text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/bench.h"
#include "llmem/ops_norm_matmul.h"

#define ROT_BYTES ((size_t)512 << 20) /* weights a figure cycles through, at least */
enum { ROT_MAX = 64 };                  /* copies of them, at most */

typedef struct gemv_ctx {
    llmem_backend *be;
    llmem_tensor a, z, nw, w[ROT_MAX], u[ROT_MAX], out;
    int next, rot;
    bool swiglu;
    int32_t norm, epi; /* nm: the fused op's norm and epilogue; -1: a plain matmul */
} gemv_ctx;

static llmem_status gemv_run(void *vctx)
{
    gemv_ctx *c = vctx;
    int i = c->next;
    c->next = (c->next + 1) % c->rot;
    if (c->norm >= 0) {
        llmem_norm_matmul_params p = {.norm = c->norm, .epilogue = c->epi, .eps = 1e-5f};
        return llmem_op_norm_matmul(c->be, &p, &c->a, c->norm == LLMEM_NM_NORM_GATED ? &c->z : NULL,
                                    c->norm ? &c->nw : NULL, &c->w[i], c->swiglu ? &c->u[i] : NULL,
                                    &c->out);
    }
    return c->swiglu ? llmem_op_matmul_swiglu(c->be, &c->a, &c->w[i], &c->u[i], &c->out)
                     : llmem_op_matmul(c->be, &c->a, &c->w[i], &c->out);
}

/* Sets (set) or unsets every NAME=VALUE of the space-separated list `one`
 * (at most 255 bytes), then has the backend read its knobs again. */
static void apply_set(llmem_backend *be, const char *one, bool set)
{
    char names[256], *save = NULL;
    snprintf(names, sizeof names, "%s", one);
    for (char *t = strtok_r(names, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(t, '=');
        if (eq) {
            *eq = 0;
            set ? setenv(t, eq + 1, 1) : unsetenv(t);
        }
    }
    llmem_backend_reload_env(be);
}

/* One figure: rot copies of the weights (gate and up for SwiGLU), each its
 * own buffer so that no matrix straddles a chunk of a large buffer; norm
 * >= 0 runs llmem_op_norm_matmul with that norm and epilogue epi (x and z
 * from ba, the norm weight from bn). */
static llmem_status gemv_figure(bench *b, const char *what, int32_t n, int32_t k, bool swiglu,
                                int32_t norm, int32_t epi, llmem_buffer *ba, llmem_buffer *bn,
                                llmem_buffer *bo)
{
    size_t wb = (size_t)n * k * 2, set = wb * (swiglu ? 2 : 1);
    gemv_ctx c = {.be = b->be, .swiglu = swiglu, .norm = norm, .epi = epi};
    c.rot = (int)((ROT_BYTES + set - 1) / set);
    c.rot = c.rot < 2 ? 2 : c.rot > ROT_MAX ? ROT_MAX : c.rot;
    c.a = llmem_tensor_2d(ba, 0, LLMEM_DTYPE_F32, 1, k);
    c.z = llmem_tensor_2d(ba, (size_t)k * 4, LLMEM_DTYPE_F32, 1, k);
    c.nw = llmem_tensor_1d(bn, 0, LLMEM_DTYPE_BF16, k);
    c.out = llmem_tensor_2d(bo, 0, LLMEM_DTYPE_F32, 1, n);
    llmem_buffer *bw[ROT_MAX] = {0};
    llmem_status st = LLMEM_OK;
    for (int r = 0; r < c.rot && st == LLMEM_OK; r++) {
        st = bench_new_filled(b, set, (int64_t)(set / 2), LLMEM_DTYPE_BF16, true, &bw[r]);
        c.w[r] = llmem_tensor_2d(bw[r], 0, LLMEM_DTYPE_BF16, n, k);
        c.u[r] = llmem_tensor_2d(bw[r], swiglu ? wb : 0, LLMEM_DTYPE_BF16, n, k);
    }
    /* bytes: weights, x (and z), the norm weight, out (read too by the add) */
    double bytes = (double)set + 4.0 * k * (norm == LLMEM_NM_NORM_GATED ? 2 : 1) +
                   (norm > 0 ? 2.0 * k : 0) + 4.0 * n * (epi == LLMEM_NM_ADD ? 2 : 1);
    /* $LLMEM_BENCH_GEMV_SETS: "A=1 B=2;C=3;" times the figure once per set of environment
     * settings (an empty set: as the environment is), each set undone after its run (knob
     * sweeps in one process: llmem_backend_reload_env makes the backend read its knobs
     * again after each change) */
    const char *sets = getenv("LLMEM_BENCH_GEMV_SETS");
    const char *sp = sets ? sets : "";
    do {
        char one[256] = "";
        size_t len = strcspn(sp, ";");
        if (len >= sizeof one)
            len = sizeof one - 1;
        memcpy(one, sp, len);
        one[len] = 0;
        sp += strcspn(sp, ";");
        apply_set(b->be, one, true);
        double sec = 0;
        if (st == LLMEM_OK)
            st = bench_time_it(b, what, gemv_run, &c, &sec);
        char note[300];
        snprintf(note, sizeof note, "(M 1, bf16 weights)%s%s", one[0] ? " " : "", one);
        if (st == LLMEM_OK)
            bench_report_bw(b, what, sec, bytes, note);
        apply_set(b->be, one, false);
    } while (*sp++ == ';' && *sp);
    if (st == LLMEM_E_UNSUPPORTED) { /* e.g. a matrix beyond lavapipe's 128 MiB bindings */
        printf("%-28s (not run: the backend cannot hold this shape)\n", what);
        st = LLMEM_OK;
    }
    for (int r = 0; r < c.rot; r++)
        llmem_buffer_free(bw[r]);
    return st;
}

llmem_status bench_gemv(bench *b)
{
    static const struct {
        const char *what;
        int32_t n, k;
        bool swiglu;
        int32_t norm, epi; /* -1: llmem_op_matmul(_swiglu) */
    } shapes[] = {
        {"gemv k/v 1024x4096", 1024, 4096, false, -1, 0},
        {"gemv q/o 4096x4096", 4096, 4096, false, -1, 0},
        {"gemv up 14336x4096", 14336, 4096, false, -1, 0},
        {"gemv down 4096x14336", 4096, 14336, false, -1, 0},
        {"gemv in_proj 16768x4096", 16768, 4096, false, -1, 0},
        {"gemv gate+up swiglu", 14336, 4096, true, -1, 0},
        {"gemv lm head 128256x4096", 128256, 4096, false, -1, 0},
        {"nm o_proj +add 4096x4096", 4096, 4096, false, LLMEM_NM_NORM_NONE, LLMEM_NM_ADD},
        {"nm down +add 4096x14336", 4096, 14336, false, LLMEM_NM_NORM_NONE, LLMEM_NM_ADD},
        {"nm in_proj rms 16768x4096", 16768, 4096, false, LLMEM_NM_NORM_RMS, LLMEM_NM_STORE},
        {"nm out_proj gated +add", 4096, 8192, false, LLMEM_NM_NORM_GATED, LLMEM_NM_ADD},
        {"nm gate+up rms swiglu", 14336, 4096, true, LLMEM_NM_NORM_RMS, LLMEM_NM_SWIGLU},
        {"nm lm head rms 128256x4096", 128256, 4096, false, LLMEM_NM_NORM_RMS, LLMEM_NM_STORE},
        /* the 2b shape of tools/synth_bamba.py (hidden 2048, MLP 8192, in_proj 8512 rows) */
        {"gemv2b q 2048x2048", 2048, 2048, false, -1, 0},
        {"gemv2b k/v 1024x2048", 1024, 2048, false, -1, 0},
        {"nm2b o_proj +add 2048x2048", 2048, 2048, false, LLMEM_NM_NORM_NONE, LLMEM_NM_ADD},
        {"nm2b down +add 2048x8192", 2048, 8192, false, LLMEM_NM_NORM_NONE, LLMEM_NM_ADD},
        {"nm2b in_proj rms 8512x2048", 8512, 2048, false, LLMEM_NM_NORM_RMS, LLMEM_NM_STORE},
        {"nm2b out_proj gated +add", 2048, 4096, false, LLMEM_NM_NORM_GATED, LLMEM_NM_ADD},
        {"nm2b gate+up rms swiglu", 8192, 2048, true, LLMEM_NM_NORM_RMS, LLMEM_NM_SWIGLU},
        {"nm2b lm head rms 128256x2048", 128256, 2048, false, LLMEM_NM_NORM_RMS,
         LLMEM_NM_STORE},
    };
    const int32_t k_max = 14336, n_max = 128256;
    llmem_buffer *ba = NULL, *bn = NULL, *bo = NULL;
    llmem_status st =
        bench_new_filled(b, (size_t)k_max * 8, 2 * k_max, LLMEM_DTYPE_F32, false, &ba);
    if (st == LLMEM_OK)
        st = bench_new_filled(b, (size_t)k_max * 2, k_max, LLMEM_DTYPE_BF16, false, &bn);
    if (st == LLMEM_OK)
        st = bench_new_filled(b, (size_t)n_max * 4, n_max, LLMEM_DTYPE_F32, false, &bo);
    bool nm = llmem_backend_supports(b->be, LLMEM_OP_NORM_MATMUL, NULL, 0);
    /* $LLMEM_BENCH_GEMV: only the figures whose name holds it (tuning sweeps) */
    const char *only = getenv("LLMEM_BENCH_GEMV");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0] && st == LLMEM_OK; s++) {
        if ((shapes[s].norm >= 0 && !nm) || (only && !strstr(shapes[s].what, only)))
            continue; /* the backend has no fused op, or not asked for */
        st = gemv_figure(b, shapes[s].what, shapes[s].n, shapes[s].k, shapes[s].swiglu,
                         shapes[s].norm, shapes[s].epi, ba, bn, bo);
    }
    llmem_buffer_free(ba);
    llmem_buffer_free(bn);
    llmem_buffer_free(bo);
    return st;
}
