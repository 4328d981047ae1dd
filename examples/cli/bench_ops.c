/* llmem bench: the kernel figures: device copy (the ceiling), paged decode
 * and prefill attention, Mamba-2 decode (ssm_scan). See bench.c's usage
 * text for what each measures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/cli/bench.h"

/* ---- copy ---------------------------------------------------------------------------------- */

llmem_status bench_copy_run(void *vctx)
{
    bench_copy_ctx *c = vctx;
    return llmem_buffer_copy(c->dst, 0, c->src, 0, c->bytes);
}

llmem_status bench_copy(bench *b, bool gpu)
{
    bench_copy_ctx c = {NULL, NULL, gpu ? 1024 * MIB : 256 * MIB};
    llmem_status st = bench_new_buffer(b, c.bytes, &c.src);
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, c.bytes, &c.dst);
    if (st == LLMEM_OK)
        st = bench_fill(b, c.src, 0, (int64_t)(c.bytes / 4), LLMEM_DTYPE_F32, false);
    double t = 0;
    if (st == LLMEM_OK)
        st = bench_time_it(b, "copy", bench_copy_run, &c, &t);
    if (st == LLMEM_OK) {
        b->copy_bw = 2.0 * (double)c.bytes / t;
        printf("%-28s %9.3f ms  %8.1f GB/s  (%zu MiB copied; read + written)\n", "copy", t * 1e3,
               b->copy_bw / 1e9, c.bytes / MIB);
    }
    llmem_buffer_free(c.src);
    llmem_buffer_free(c.dst);
    return st;
}


/* ---- paged attention ------------------------------------------------------------------------- */

typedef struct attn_ctx {
    llmem_backend *be;
    llmem_attn_params p;
    llmem_view view;
    llmem_kv_view kv; /* view.desc */
    llmem_tensor q, out;
} attn_ctx;

static llmem_status attn_run(void *vctx)
{
    attn_ctx *c = vctx;
    return llmem_op_attention_paged(c->be, &c->p, &c->view, &c->q, &c->out);
}

/* A KV view of n_seq streams of ctx cached tokens each, pages of ps in a
 * shuffled page table; query token i belongs to stream i / q_per_seq and
 * sees ctx - q_per_seq + 1 + i % q_per_seq keys (causal). */
typedef struct kv_setup {
    int32_t n_seq, ctx, q_per_seq, ps, n_heads, n_kv, hd;
    llmem_dtype dtype;
} kv_setup;

static llmem_status attn_prepare(bench *b, const kv_setup *s, llmem_buffer *kp, llmem_buffer *vp,
                                 attn_ctx *c, tables *t, llmem_buffer **idx)
{
    int32_t max_pages = llmem_pages_for(0, s->ctx, s->ps), n_pages = s->n_seq * max_pages;
    int32_t n_tok = s->n_seq * s->q_per_seq;
    int32_t *perm = malloc((size_t)n_pages * sizeof *perm);
    int32_t *lens = malloc((size_t)s->n_seq * sizeof *lens);
    int32_t *tl = malloc((size_t)n_tok * sizeof *tl), *ts = malloc((size_t)n_tok * sizeof *ts);
    if (!perm || !lens || !tl || !ts) {
        free(perm);
        free(lens);
        free(tl);
        free(ts);
        return LLMEM_E_NO_MEMORY;
    }
    bench_shuffle(perm, n_pages, 0x5eed0000u + (uint64_t)s->ps);
    for (int32_t i = 0; i < s->n_seq; i++)
        lens[i] = s->ctx;
    for (int32_t i = 0; i < n_tok; i++) {
        ts[i] = i / s->q_per_seq;
        tl[i] = s->ctx - s->q_per_seq + 1 + i % s->q_per_seq;
    }
    memset(c, 0, sizeof *c);
    c->be = b->be;
    c->p = (llmem_attn_params){.scale = 1.0f / sqrtf((float)s->hd)};
    llmem_kv_view *kv = &c->kv;
    c->view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, NULL);
    kv->k = kp;
    kv->v = vp;
    kv->dtype = s->dtype;
    kv->n_pages = n_pages;
    kv->page_size = s->ps;
    kv->n_kv_heads = s->n_kv;
    kv->head_dim = s->hd;
    kv->max_pages = max_pages;
    kv->page_table = bench_tab_add(t, perm, n_pages);
    kv->seq_len = bench_tab_add(t, lens, s->n_seq);
    kv->tok_kv_len = bench_tab_add(t, tl, n_tok);
    kv->tok_seq = bench_tab_add(t, ts, n_tok);
    free(perm);
    free(lens);
    free(tl);
    free(ts);
    llmem_i32_table *list[] = {&kv->page_table, &kv->seq_len, &kv->tok_kv_len, &kv->tok_seq};
    CHECK(bench_tab_finish(b, t, list, 4, idx));
    c->view.idx = *idx;
    return LLMEM_OK;
}

/* K and V pools of pool_elems 2-byte elements each and queries and outputs of nq f32, from b's
 * backend; the pools (as dtype) and the queries are filled. The caller frees the buffers. */
static llmem_status attn_buffers(bench *b, int64_t pool_elems, int64_t nq, llmem_dtype dtype,
                                 llmem_buffer **kp, llmem_buffer **vp, llmem_buffer **qb,
                                 llmem_buffer **ob)
{
    llmem_status st = bench_new_buffer(b, (size_t)pool_elems * 2, kp);
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, (size_t)pool_elems * 2, vp);
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, (size_t)nq * 4, qb);
    if (st == LLMEM_OK)
        st = bench_new_buffer(b, (size_t)nq * 4, ob);
    if (st == LLMEM_OK)
        st = bench_fill(b, *kp, 0, pool_elems, dtype, false);
    if (st == LLMEM_OK)
        st = bench_fill(b, *vp, 0, pool_elems, dtype, false);
    if (st == LLMEM_OK)
        st = bench_fill(b, *qb, 0, nq, LLMEM_DTYPE_F32, false);
    return st;
}

/* Sets (set != 0) or restores the settings "NAME=VALUE,NAME=VALUE" of one sweep variant v
 * (n characters): the previous values go to / come from old[] (NULL: unset before). */
#define SWEEP_MAX 8
static llmem_status sweep_apply(const char *v, size_t n, bool set, char **old)
{
    char buf[256];
    if (n >= sizeof buf) {
        fprintf(stderr, "llmem bench: LLMEM_BENCH_ATTN_SWEEP: a variant is longer than %zu "
                        "characters\n", sizeof buf - 1);
        return LLMEM_E_INVALID;
    }
    memcpy(buf, v, n);
    buf[n] = 0;
    int k = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), k++) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok || strncmp(tok, "LLMEM_", 6) != 0 || k >= SWEEP_MAX) {
            fprintf(stderr, "llmem bench: LLMEM_BENCH_ATTN_SWEEP: '%s' is not LLMEM_NAME=VALUE "
                            "(at most %d a variant)\n", tok, SWEEP_MAX);
            return LLMEM_E_INVALID;
        }
        *eq = 0;
        if (set) {
            const char *was = getenv(tok);
            old[k] = was ? strdup(was) : NULL;
            setenv(tok, eq + 1, 1);
        } else {
            if (old[k])
                setenv(tok, old[k], 1);
            else
                unsetenv(tok);
            free(old[k]);
            old[k] = NULL;
        }
    }
    return LLMEM_OK;
}

/* $LLMEM_BENCH_ATTN_SWEEP="A;B;...": the decode attention of c timed again under each variant,
 * a list "NAME=VALUE,..." of settings made (setenv, llmem_backend_reload_env) for its timing
 * and undone after it, on the same pool; one line each, labelled "  <variant>". */
static llmem_status attn_sweep(bench *b, attn_ctx *c, double bytes)
{
    const char *e = getenv("LLMEM_BENCH_ATTN_SWEEP");
    llmem_status st = LLMEM_OK;
    for (const char *v = e; v && *v && st == LLMEM_OK;) {
        size_t n = strcspn(v, ";");
        char *old[SWEEP_MAX] = {0};
        st = sweep_apply(v, n, true, old);
        if (st == LLMEM_OK)
            st = llmem_backend_reload_env(b->be);
        double t = 0;
        char what[96];
        snprintf(what, sizeof what, "  %.*s", (int)(n < 80 ? n : 80), v);
        if (st == LLMEM_OK)
            st = bench_time_it(b, what, attn_run, c, &t);
        if (st == LLMEM_OK)
            bench_report_bw(b, what, t, bytes, NULL);
        llmem_status rs = sweep_apply(v, n, false, old);
        if (rs == LLMEM_OK)
            rs = llmem_backend_reload_env(b->be);
        st = st != LLMEM_OK ? st : rs;
        v += n + (v[n] == ';');
    }
    return st;
}

/* $LLMEM_BENCH_ATTN_HEADS="Q/KV[/bf16]": the decode attention figure at Q query and KV
 * key-value heads (KV divides Q, both 1..64; e.g. 16/8/bf16, the Bamba-2B layer's) and, with
 * /bf16, a bf16 pool, instead of 32/8 on f16; a malformed value keeps the default. */
static void attn_heads(kv_setup *s)
{
    const char *e = getenv("LLMEM_BENCH_ATTN_HEADS");
    int q = 0, kv = 0, n = 0;
    if (!e || sscanf(e, "%d/%d%n", &q, &kv, &n) != 2 || q < 1 || q > 64 || kv < 1 ||
        kv > 64 || q % kv != 0 || (e[n] != '\0' && strcmp(e + n, "/bf16") != 0)) {
        if (e)
            fprintf(stderr, "llmem bench: LLMEM_BENCH_ATTN_HEADS='%s' is not Q/KV[/bf16] "
                            "(1..64, KV divides Q): 32/8 on f16\n", e);
        return;
    }
    s->n_heads = q;
    s->n_kv = kv;
    if (e[n] != '\0')
        s->dtype = LLMEM_DTYPE_BF16;
}

llmem_status bench_decode_attention(bench *b)
{
    kv_setup s = {64, 4096, 1, 16, 32, 8, 128, LLMEM_DTYPE_F16};
    attn_heads(&s);
    int64_t pool_elems = (int64_t)s.n_seq * s.ctx * s.n_kv * s.hd;
    size_t pool_bytes = (size_t)pool_elems * 2;
    llmem_buffer *kp = NULL, *vp = NULL, *qb = NULL, *ob = NULL;
    int64_t nq = (int64_t)s.n_seq * s.n_heads * s.hd;
    llmem_status st = attn_buffers(b, pool_elems, nq, s.dtype, &kp, &vp, &qb, &ob);
    static const int32_t sizes[3] = {1, 16, 64};
    double times[3] = {0, 0, 0};
    for (int i = 0; i < 3 && st == LLMEM_OK; i++) {
        s.ps = sizes[i];
        attn_ctx c;
        tables t = {0};
        llmem_buffer *idx = NULL;
        st = attn_prepare(b, &s, kp, vp, &c, &t, &idx);
        c.q = llmem_tensor_3d(qb, 0, LLMEM_DTYPE_F32, s.n_seq, s.n_heads, s.hd);
        c.out = llmem_tensor_3d(ob, 0, LLMEM_DTYPE_F32, s.n_seq, s.n_heads, s.hd);
        char what[64];
        snprintf(what, sizeof what, "decode attn, pages of %d", sizes[i]);
        if (st == LLMEM_OK)
            st = bench_time_it(b, what, attn_run, &c, &times[i]);
        double bytes = 2.0 * (double)pool_bytes + 2.0 * (double)nq * 4;
        if (st == LLMEM_OK)
            bench_report_bw(b, what, times[i], bytes, NULL);
        if (st == LLMEM_OK)
            st = attn_sweep(b, &c, bytes);
        llmem_buffer_free(idx);
        free(t.v);
    }
    if (st == LLMEM_OK) {
        double lo = fmin(times[0], fmin(times[1], times[2]));
        double hi = fmax(times[0], fmax(times[1], times[2]));
        printf("%-28s %9.1f%%  (slowest / fastest - 1; target <= 10%%)\n", "decode attn spread",
               100.0 * (hi / lo - 1.0));
    }
    llmem_buffer_free(kp);
    llmem_buffer_free(vp);
    llmem_buffer_free(qb);
    llmem_buffer_free(ob);
    return st;
}

/* Prefill: 8 x 2048 causal in one ubatch, on backend `be` of b (the fast
 * variant opens its own backend). */
static llmem_status prefill_once(bench *b, const char *label)
{
    kv_setup s = {8, 2048, 2048, 16, 32, 8, 128, LLMEM_DTYPE_F16};
    int64_t pool_elems = (int64_t)s.n_seq * s.ctx * s.n_kv * s.hd;
    int64_t nq = (int64_t)s.n_seq * s.ctx * s.n_heads * s.hd;
    llmem_buffer *kp = NULL, *vp = NULL, *qb = NULL, *ob = NULL, *idx = NULL;
    tables t = {0};
    llmem_status st = attn_buffers(b, pool_elems, nq, s.dtype, &kp, &vp, &qb, &ob);
    attn_ctx c;
    if (st == LLMEM_OK)
        st = attn_prepare(b, &s, kp, vp, &c, &t, &idx);
    double sec = 0;
    if (st == LLMEM_OK) {
        c.q = llmem_tensor_3d(qb, 0, LLMEM_DTYPE_F32, s.n_seq * s.ctx, s.n_heads, s.hd);
        c.out = llmem_tensor_3d(ob, 0, LLMEM_DTYPE_F32, s.n_seq * s.ctx, s.n_heads, s.hd);
        st = bench_time_it(b, label, attn_run, &c, &sec);
    }
    if (st == LLMEM_OK) {
        double flops = 4.0 * s.hd * s.n_heads * s.n_seq * ((double)s.ctx * (s.ctx + 1) / 2.0);
        printf("%-28s %9.3f ms  %8.1f TFLOP/s  (8 x 2048 causal, 32/8 heads, hd 128, f16 KV)\n",
               label, sec * 1e3, flops / sec / 1e12);
    }
    llmem_buffer_free(idx);
    free(t.v);
    llmem_buffer_free(kp);
    llmem_buffer_free(vp);
    llmem_buffer_free(qb);
    llmem_buffer_free(ob);
    return st;
}

llmem_status bench_prefill(bench *b, int32_t device)
{
    CHECK(prefill_once(b, "prefill attn"));
    if (strcmp(b->name, "cuda") != 0)
        return LLMEM_OK;
    /* the plugin reads LLMEM_CUDA_ATTN_FAST when a backend opens */
    setenv("LLMEM_CUDA_ATTN_FAST", "1", 1);
    bench f = *b;
    char err[256] = "";
    llmem_status st = llmem_backend_open("cuda", device, &f.be, err, sizeof err);
    unsetenv("LLMEM_CUDA_ATTN_FAST");
    if (st != LLMEM_OK) {
        fprintf(stderr, "llmem bench: %s\n", err);
        return st;
    }
    f.rnd = f.rnd_small = NULL;
    st = bench_new_buffer(&f, (size_t)RND_N * 4, &f.rnd);
    if (st == LLMEM_OK) {
        /* random source for the second backend: download once, upload */
        float *h = malloc((size_t)RND_N * 4);
        st = h ? llmem_buffer_download(b->rnd, 0, h, (size_t)RND_N * 4) : LLMEM_E_NO_MEMORY;
        if (st == LLMEM_OK)
            st = llmem_buffer_upload(f.rnd, 0, h, (size_t)RND_N * 4);
        free(h);
    }
    if (st == LLMEM_OK)
        st = prefill_once(&f, "prefill attn (fast mode)");
    llmem_buffer_free(f.rnd);
    llmem_backend_close(f.be);
    return st;
}

/* ---- Mamba-2 decode ---------------------------------------------------------------------------- */

typedef struct scan_ctx {
    llmem_backend *be;
    llmem_ssm_params p;
    llmem_view view;
    llmem_rs_view rs; /* view.desc */
    llmem_tensor xbc, dt, a_log, d, dt_bias, y;
} scan_ctx;

static llmem_status scan_run(void *vctx)
{
    scan_ctx *c = vctx;
    return llmem_op_ssm_scan(c->be, &c->p, &c->view, 0, &c->xbc, &c->dt, &c->a_log, &c->d,
                             &c->dt_bias, &c->y);
}

/* $LLMEM_BENCH_SCAN_PINGPONG=1: stream i reads slot i and writes slot B + i,
 * as a recurrent memory's decode step does (two slots per sequence), instead
 * of updating slot i in place. The same bytes are moved. */
static bool scan_pingpong(void)
{
    const char *e = getenv("LLMEM_BENCH_SCAN_PINGPONG");
    return e && atoi(e) != 0;
}

/* LLMEM_BENCH_MAMBA_SEQS=n (1..64): the Mamba-2 decode figure at n
 * sequences instead of 64 (the decode step's batch; other values: 64). */
static int32_t scan_seqs(void)
{
    const char *e = getenv("LLMEM_BENCH_MAMBA_SEQS");
    int n = e ? atoi(e) : 64;
    return n >= 1 && n <= 64 ? (int32_t)n : 64;
}

llmem_status bench_mamba(bench *b)
{
    const int32_t B = scan_seqs(), H = 128, P = 64, N = 128, G = 1;
    int64_t elems = (int64_t)H * P * N, cd = (int64_t)H * P + 2 * G * N;
    size_t state_bytes = (size_t)B * (size_t)elems * 4;
    bool pp = scan_pingpong();
    llmem_buffer *state = NULL, *act = NULL, *idx = NULL;
    size_t o_xbc = 0, o_dt = o_xbc + (size_t)B * cd * 4, o_par = o_dt + (size_t)B * H * 4;
    size_t o_y = o_par + 3 * (size_t)H * 4, act_bytes = o_y + (size_t)B * H * P * 4;
    llmem_status st = bench_new_filled(b, state_bytes * (pp ? 2 : 1), (int64_t)(state_bytes / 4),
                                       LLMEM_DTYPE_F32, false, &state);
    if (st == LLMEM_OK)
        st = bench_new_filled(b, act_bytes, (int64_t)(o_y / 4), LLMEM_DTYPE_F32, false, &act);
    int32_t *slots = malloc((size_t)B * 2 * sizeof *slots);
    tables t = {0};
    scan_ctx c;
    memset(&c, 0, sizeof c);
    llmem_state_desc desc = {"ssm", 3, {H, P, N}, LLMEM_DTYPE_F32};
    llmem_buffer *bufs[1] = {state};
    if (!slots && st == LLMEM_OK)
        st = LLMEM_E_NO_MEMORY;
    if (st == LLMEM_OK) {
        for (int32_t i = 0; i < B; i++) {
            slots[i] = i;
            slots[B + i] = pp ? B + i : i;
        }
        st = bench_rs_view(b, &c.view, &c.rs, &desc, bufs, B, 1, slots, slots + B, &t, &idx);
        c.rs.n_slots = pp ? 2 * B : B; /* the view points at c.rs */
    }
    double sec = 0;
    if (st == LLMEM_OK) {
        c.be = b->be;
        c.p = (llmem_ssm_params){H, P, N, G, 0.0f, INFINITY, 0};
        c.xbc = llmem_tensor_2d(act, o_xbc, LLMEM_DTYPE_F32, B, (int32_t)cd);
        c.dt = llmem_tensor_2d(act, o_dt, LLMEM_DTYPE_F32, B, H);
        c.a_log = llmem_tensor_1d(act, o_par, LLMEM_DTYPE_F32, H);
        c.d = llmem_tensor_1d(act, o_par + (size_t)H * 4, LLMEM_DTYPE_F32, H);
        c.dt_bias = llmem_tensor_1d(act, o_par + 2 * (size_t)H * 4, LLMEM_DTYPE_F32, H);
        c.y = llmem_tensor_2d(act, o_y, LLMEM_DTYPE_F32, B, H * P);
        st = bench_time_it(b, "mamba decode", scan_run, &c, &sec);
    }
    if (st == LLMEM_OK)
        bench_report_bw(b, "mamba decode (ssm_scan)", sec, 2.0 * (double)state_bytes + (double)act_bytes,
                  "(target >= 70%)");
    free(slots);
    free(t.v);
    llmem_buffer_free(idx);
    llmem_buffer_free(state);
    llmem_buffer_free(act);
    return st;
}
