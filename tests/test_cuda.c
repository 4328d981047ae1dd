// ctest-labels: cuda
/* The cuda plugin: its status without a GPU, and on a GPU the launch paths
 * the conformance suites (test_ops*.c) do not reach.
 *
 * Without a driver or device, opening "cuda" must give LLMEM_E_NOT_FOUND
 * with a one-line reason, and `llmem info`'s listing must say why; that is
 * all this suite checks on such a machine. With a GPU it compares the cuda
 * backend with the cpu backend (the reference) on:
 *   - attention: the tensor-core prefill (long same-stream token runs, a
 *     tile shared by two streams, windows, soft-capping, GQA groups of 1, 2,
 *     4 and 16 heads), in the default precise mode (f32 tolerance) and the
 *     fast mode (LLMEM_CUDA_ATTN_FAST=1, one rounding of the f16/bf16
 *     operands); split-K decode over thousands of keys with pages of 1, 16,
 *     64 and head dims 64, 128, 256; the generic kernel (head dim 96);
 *   - the Mamba-2 scan with the decode-benchmark state shape (N = 128, f32)
 *     and an f16 state with N = 256, both with a stream reading a slot
 *     another stream writes (the snapshot path);
 *   - cuBLAS matmuls at M = 64 for f32, f16 and bf16 weights;
 *   - the kernel profile ($LLMEM_CUDA_PROFILE=1, CUPTI): the kernel calls it
 *     counts outside graphs and per graph launch are the ones this test made;
 *   - a device allocation that cannot succeed (LLMEM_E_NO_MEMORY, and the
 *     backend keeps working).
 *
 * CUDA cannot be used in a process forked after CUDA was initialised, so
 * main() never opens "cuda": every test opens it in its own (forked)
 * process, and skips when it is missing.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/llmem.h"
#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16

static llmem_backend *open_cpu(void)
{
    llmem_backend *be = NULL;
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &be, NULL, 0), LLMEM_OK);
    return be;
}

/* ---- without a GPU: a clear status ------------------------------------------------------------ */

START_TEST(test_open_status)
{
    char err[512] = "";
    llmem_backend *be = NULL;
    llmem_status st = llmem_backend_open("cuda", -1, &be, err, sizeof err);
    if (st == LLMEM_OK) {
        llmem_backend_info info;
        ck_assert_int_eq(llmem_backend_get_info(be, &info), LLMEM_OK);
        ck_assert_str_eq(info.backend, "cuda");
        ck_assert(strlen(info.device_name) > 0);
        ck_assert(info.memory_total > 0 && info.memory_free <= info.memory_total);
        ck_assert(!info.host_visible);
        printf("cuda: opened %s (%.1f GiB)\n", info.device_name,
               (double)info.memory_total / (1 << 30));
        llmem_backend_close(be);
        /* a device index past the last one is "not found" */
        ck_assert_int_eq(llmem_backend_open("cuda", 4096, &be, err, sizeof err),
                         LLMEM_E_NOT_FOUND);
        ck_assert_msg(strstr(err, "no device 4096") != NULL, "message: %s", err);
        return;
    }
    ck_assert_msg(st == LLMEM_E_NOT_FOUND, "open cuda without a GPU: %s (%s)",
                  llmem_status_str(st), err);
    ck_assert_ptr_null(be);
    printf("cuda: %s\n", err);
    ck_assert_msg(strncmp(err, "cuda: ", 6) == 0, "message lacks the backend name: %s", err);
    /* the plugin says what is missing, or the registry says the plugin is */
    bool clear = strstr(err, "no CUDA driver (cudaGetDeviceCount: ") ||
                 strstr(err, "no CUDA device") || strstr(err, "plugin libllmem-cuda.so not found") ||
                 strstr(err, "cannot load");
    ck_assert_msg(clear, "unclear reason: %s", err);
    /* a built plugin is the one found here, so the reason must be its own */
    FILE *f = getenv("LLMEM_BACKEND_PATH") ? NULL : fopen(LLMEM_BUILD_DIR "/lib/llmem/libllmem-cuda.so", "rb");
    if (f) {
        fclose(f);
        ck_assert_msg(strstr(err, "no CUDA driver") || strstr(err, "no CUDA device") ||
                          strstr(err, "cannot load"),
                      "plugin built but not the one reporting: %s", err);
    }
}
END_TEST

typedef struct list_ctx {
    char cuda_line[512];
    int n_cuda;
} list_ctx;

static void on_line(const char *line, void *vctx)
{
    list_ctx *c = vctx;
    if (strncmp(line, "cuda: ", 6) == 0) {
        snprintf(c->cuda_line, sizeof c->cuda_line, "%s", line);
        c->n_cuda++;
    }
}

START_TEST(test_list)
{
    list_ctx c = {"", 0};
    llmem_backend_list(on_line, &c);
    ck_assert_int_ge(c.n_cuda, 1);
    printf("list: %s\n", c.cuda_line);
    char err[256];
    llmem_backend *be = NULL;
    llmem_status st = llmem_backend_open("cuda", -1, &be, err, sizeof err);
    if (st == LLMEM_OK) {
        ck_assert_msg(strstr(c.cuda_line, "available") != NULL, "%s", c.cuda_line);
        llmem_backend_close(be);
    } else {
        ck_assert_msg(strstr(c.cuda_line, "unavailable: ") != NULL, "%s", c.cuda_line);
    }
}
END_TEST

/* ---- GPU: allocation failure ----------------------------------------------------------------------- */

START_TEST(test_alloc_failure)
{
    llmem_backend *be = test_open_or_skip("cuda");
    if (!be)
        return;
    llmem_buffer *huge = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, (size_t)1 << 52, &huge), LLMEM_E_NO_MEMORY);
    ck_assert_ptr_null(huge);
    llmem_buffer *buf = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, 4096, &buf), LLMEM_OK);
    unsigned char in[4096], out[4096];
    for (int i = 0; i < 4096; i++)
        in[i] = (unsigned char)(i * 7 + 3);
    ck_assert_int_eq(llmem_buffer_upload(buf, 0, in, sizeof in), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_fill(buf, 1024, 512, 0x7fc00000u), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_download(buf, 0, out, sizeof out), LLMEM_OK);
    for (int i = 0; i < 4096; i++) {
        uint32_t pat = 0x7fc00000u;
        unsigned char want = i >= 1024 && i < 1536 ? ((unsigned char *)&pat)[i % 4] : in[i];
        ck_assert_int_eq(out[i], want);
    }
    ck_assert_int_eq(llmem_backend_synchronize(be), LLMEM_OK);
    llmem_buffer_free(buf);
    llmem_backend_close(be);
}
END_TEST

/* ---- GPU: attention paths --------------------------------------------------------------------------- */

typedef struct acase {
    int32_t n_streams;
    int32_t len[4], nq[4]; /* stream length; its last nq tokens are queries, in stream order */
    int32_t ps, n_kv, n_heads, hd;
    llmem_dtype dt;
    float softcap;
    int32_t window;
    bool prefill; /* also run the fast mode (this case takes the tensor-core path) */
} acase;

static const acase acases[] = {
    /* prefill: a tile shared by two streams (300 % 16 tokens), GQA 4 */
    {2, {300, 77}, {300, 50}, 16, 2, 8, 128, F16, 0.0f, 0, true},
    /* prefill, pages of 1, window and soft-cap, GQA 2 */
    {1, {260}, {260}, 1, 4, 8, 64, BF16, 20.0f, 100, true},
    /* prefill, MHA (one head per tile row group), pages of 64 */
    {2, {129, 64}, {129, 64}, 64, 4, 4, 64, F16, 0.0f, 0, true},
    /* prefill, 16 heads per KV head, with history before the chunk */
    {1, {190}, {90}, 16, 1, 16, 128, BF16, 0.0f, 0, true},
    /* decode, split-K over up to 4096 keys */
    {4, {3000, 1, 2500, 4096}, {1, 1, 1, 1}, 16, 2, 8, 128, F16, 0.0f, 0, false},
    /* decode, f32 pool, head dim 256, 8 heads per KV head (two CTAs of 4) */
    {2, {2000, 700}, {1, 2}, 1, 1, 8, 256, F32, 0.0f, 0, false},
    /* decode, 6 heads per KV head, pages of 64, window */
    {1, {1500}, {3}, 64, 2, 12, 64, BF16, 30.0f, 300, false},
    /* generic kernel: head dim 96 */
    {2, {200, 50}, {2, 1}, 16, 2, 4, 96, F16, 0.0f, 0, false},
};

typedef struct adata {
    int32_t n_tok, n_pages, max_pages, row;
    int32_t *pt, *seq_len, *tok_kv_len, *tok_seq;
    unsigned char *kpool, *vpool; /* host images: written slots random, the rest NaN */
    size_t pool_bytes;
    double *q;
} adata;

static void amake(th_ctx *h, const acase *k, uint64_t stream, adata *d)
{
    ref64_rng r = ref64_rng_make(ref64_seed(), stream);
    memset(d, 0, sizeof *d);
    d->row = k->n_kv * k->hd;
    int32_t used = 0;
    for (int32_t s = 0; s < k->n_streams; s++) {
        int32_t pages = llmem_pages_for(0, k->len[s], k->ps);
        used += pages;
        d->max_pages = pages + 1 > d->max_pages ? pages + 1 : d->max_pages;
        d->n_tok += k->nq[s];
    }
    d->n_pages = used + 2;
    int32_t *perm = th_alloc(h, (size_t)d->n_pages * sizeof *perm);
    ref64_shuffle(&r, perm, d->n_pages);
    d->pt = th_alloc(h, (size_t)k->n_streams * d->max_pages * sizeof(int32_t));
    d->seq_len = th_alloc(h, (size_t)k->n_streams * sizeof(int32_t));
    d->tok_kv_len = th_alloc(h, (size_t)d->n_tok * sizeof(int32_t));
    d->tok_seq = th_alloc(h, (size_t)d->n_tok * sizeof(int32_t));
    size_t es = llmem_dtype_size(k->dt);
    d->pool_bytes = (size_t)d->n_pages * k->ps * d->row * es;
    d->kpool = th_alloc(h, d->pool_bytes);
    d->vpool = th_alloc(h, d->pool_bytes);
    double nan = NAN;
    for (size_t i = 0; i < d->pool_bytes / es; i++) {
        ref64_encode(nan, k->dt, d->kpool + i * es);
        ref64_encode(nan, k->dt, d->vpool + i * es);
    }
    double *kv = th_alloc(h, (size_t)d->row * 2 * sizeof(double));
    int32_t next = 0, t = 0;
    for (int32_t s = 0; s < k->n_streams; s++) {
        int32_t pages = llmem_pages_for(0, k->len[s], k->ps);
        d->seq_len[s] = k->len[s];
        for (int32_t p = 0; p < d->max_pages; p++)
            d->pt[s * d->max_pages + p] = p < pages ? perm[next++] : -1;
        for (int32_t j = 0; j < k->len[s]; j++) {
            int32_t slot = d->pt[s * d->max_pages + j / k->ps] * k->ps + j % k->ps;
            ref64_fill(&r, kv, 2 * d->row, -1, 1, k->dt);
            for (int32_t e = 0; e < d->row; e++) {
                ref64_encode(kv[e], k->dt, d->kpool + ((size_t)slot * d->row + e) * es);
                ref64_encode(kv[d->row + e], k->dt, d->vpool + ((size_t)slot * d->row + e) * es);
            }
        }
        for (int32_t i = 0; i < k->nq[s]; i++, t++) {
            d->tok_seq[t] = s;
            d->tok_kv_len[t] = k->len[s] - k->nq[s] + 1 + i;
        }
    }
    int64_t nq = (int64_t)d->n_tok * k->n_heads * k->hd;
    d->q = th_alloc(h, (size_t)nq * sizeof(double));
    ref64_fill(&r, d->q, nq, -3, 3, F32);
}

static void arun(llmem_backend *be, const acase *k, const adata *d, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_buffer *kp = th_pool(&c, d->pool_bytes, k->dt), *vp = th_pool(&c, d->pool_bytes, k->dt);
    ck_assert_int_eq(llmem_buffer_upload(kp, 0, d->kpool, d->pool_bytes), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(vp, 0, d->vpool, d->pool_bytes), LLMEM_OK);
    llmem_kv_view kvd;
    memset(&kvd, 0, sizeof kvd);
    llmem_kv_view *kv = &kvd;
    llmem_view v = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, NULL);
    kv->k = kp;
    kv->v = vp;
    kv->dtype = k->dt;
    kv->n_pages = d->n_pages;
    kv->page_size = k->ps;
    kv->n_kv_heads = k->n_kv;
    kv->head_dim = k->hd;
    kv->max_pages = d->max_pages;
    th_idx b = {0};
    kv->page_table = th_idx_add(&b, d->pt, k->n_streams * d->max_pages);
    kv->seq_len = th_idx_add(&b, d->seq_len, k->n_streams);
    kv->tok_kv_len = th_idx_add(&b, d->tok_kv_len, d->n_tok);
    kv->tok_seq = th_idx_add(&b, d->tok_seq, d->n_tok);
    llmem_i32_table *tabs[] = {&kv->page_table, &kv->seq_len, &kv->tok_kv_len, &kv->tok_seq};
    v.idx = th_idx_finish(&c, &b, tabs, 4);
    llmem_tensor q = th_tensor(&c, F32, 3, d->n_tok, k->n_heads, k->hd);
    llmem_tensor o = th_tensor(&c, F32, 3, d->n_tok, k->n_heads, k->hd);
    th_set(&q, d->q);
    llmem_attn_params p = {.scale = 1.0f / sqrtf((float)k->hd), .softcap = k->softcap,
                           .window = k->window};
    ck_assert_int_eq(llmem_op_attention_paged(be, &p, &v, &q, &o), LLMEM_OK);
    th_get(&o, out);
    th_end(&c);
}

START_TEST(test_attention_paths)
{
    llmem_backend *be = test_open_or_skip("cuda");
    if (!be)
        return;
    llmem_backend *cpu = open_cpu();
    setenv("LLMEM_CUDA_ATTN_FAST", "1", 1);
    llmem_backend *fast = test_open_or_skip("cuda");
    unsetenv("LLMEM_CUDA_ATTN_FAST");
    for (size_t ci = 0; ci < sizeof acases / sizeof acases[0]; ci++) {
        const acase *k = &acases[ci];
        th_ctx h;
        th_begin(&h, NULL);
        adata d;
        amake(&h, k, 4000 + ci, &d);
        int64_t n = (int64_t)d.n_tok * k->n_heads * k->hd;
        double *out = th_alloc(&h, (size_t)n * sizeof *out);
        double *ref = th_alloc(&h, (size_t)n * sizeof *ref);
        arun(cpu, k, &d, ref);
        arun(be, k, &d, out);
        char what[128];
        snprintf(what, sizeof what, "attention case %zu (%s, ps %d, hd %d, %d/%d heads)", ci,
                 llmem_dtype_name(k->dt), k->ps, k->hd, k->n_heads, k->n_kv);
        th_expect_close(out, ref, n, ref64_tol(F32, true), what);
        if (k->prefill) {
            /* one rounding of q and p to the pool dtype: its precision */
            arun(fast, k, &d, out);
            snprintf(what, sizeof what, "attention case %zu, fast mode", ci);
            th_expect_close(out, ref, n, k->dt == F16 ? 4e-3 : 3e-2, what);
        }
        th_end(&h);
    }
    llmem_backend_close(fast);
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- GPU: Mamba-2 scan shapes ------------------------------------------------------------------------ */

typedef struct scase {
    int32_t n_seqs, n_tok, n_ckpt, n_slots;
    int32_t src[3], dst[3], ckpt[6];
    llmem_ssm_params p;
    llmem_dtype st;
} scase;

static const scase scases[] = {
    /* the decode benchmark's head shape, f32 state (16-byte accesses);
     * stream 2 reads slot 1, which stream 0 writes */
    {3, 2, 2, 12, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9}, {8, 64, 128, 2, 0.0f, INFINITY, 0}, F32},
    /* f16 state, N = 256, rows not a multiple of 32 */
    {2, 3, 1, 6, {2, 0}, {0, 2}, {4, 5}, {4, 40, 256, 1, 0.0f, INFINITY, 0}, F16},
};

static void srun(llmem_backend *be, const scase *k, const unsigned char *init, size_t state_bytes,
                 const double *xbc, const double *dt, const double *par, double *y,
                 unsigned char *after)
{
    th_ctx c;
    th_begin(&c, be);
    const llmem_ssm_params *p = &k->p;
    llmem_state_desc desc = {"ssm", 3, {p->n_heads, p->head_dim, p->d_state}, k->st};
    llmem_buffer *state = th_pool(&c, state_bytes, k->st);
    ck_assert_int_eq(llmem_buffer_upload(state, 0, init, state_bytes), LLMEM_OK);
    llmem_rs_view rsd;
    memset(&rsd, 0, sizeof rsd);
    llmem_rs_view *rs = &rsd;
    llmem_view v = llmem_view_make(LLMEM_VIEW_RECURRENT, rs, sizeof *rs, NULL);
    rs->n_states = 1;
    rs->desc = &desc;
    rs->state = &state;
    rs->n_slots = k->n_slots;
    rs->n_seqs = k->n_seqs;
    rs->n_seq_tokens = k->n_tok;
    rs->n_ckpt = k->n_ckpt;
    th_idx b = {0};
    rs->src_slot = th_idx_add(&b, k->src, k->n_seqs);
    rs->dst_slot = th_idx_add(&b, k->dst, k->n_seqs);
    rs->ckpt_slot = th_idx_add(&b, k->ckpt, k->n_seqs * k->n_ckpt);
    llmem_i32_table *tabs[] = {&rs->src_slot, &rs->dst_slot, &rs->ckpt_slot};
    v.idx = th_idx_finish(&c, &b, tabs, 3);
    int32_t T = k->n_seqs * k->n_tok, H = p->n_heads;
    int32_t cd = H * p->head_dim + 2 * p->n_groups * p->d_state;
    llmem_tensor tx = th_tensor(&c, F32, 2, T, cd, 1), tdt = th_tensor(&c, F32, 2, T, H, 1);
    llmem_tensor ta = th_tensor(&c, F32, 1, H, 1, 1), td = th_tensor(&c, BF16, 1, H, 1, 1);
    llmem_tensor tb = th_tensor(&c, F16, 1, H, 1, 1);
    llmem_tensor ty = th_tensor(&c, F32, 3, T, H, p->head_dim);
    th_set(&tx, xbc);
    th_set(&tdt, dt);
    th_set(&ta, par);
    th_set(&td, par + H);
    th_set(&tb, par + 2 * H);
    ck_assert_int_eq(llmem_op_ssm_scan(be, p, &v, 0, &tx, &tdt, &ta, &td, &tb, &ty), LLMEM_OK);
    th_get(&ty, y);
    ck_assert_int_eq(llmem_buffer_download(state, 0, after, state_bytes), LLMEM_OK);
    th_end(&c);
}

START_TEST(test_scan_shapes)
{
    llmem_backend *be = test_open_or_skip("cuda");
    if (!be)
        return;
    llmem_backend *cpu = open_cpu();
    for (size_t ci = 0; ci < sizeof scases / sizeof scases[0]; ci++) {
        const scase *k = &scases[ci];
        const llmem_ssm_params *p = &k->p;
        ref64_rng r = ref64_rng_make(ref64_seed(), 5000 + ci);
        int64_t elems = (int64_t)p->n_heads * p->head_dim * p->d_state;
        size_t es = llmem_dtype_size(k->st), state_bytes = (size_t)k->n_slots * elems * es;
        int32_t T = k->n_seqs * k->n_tok, H = p->n_heads;
        int64_t cd = (int64_t)H * p->head_dim + 2 * p->n_groups * p->d_state;
        int64_t ny = (int64_t)T * H * p->head_dim;
        th_ctx h;
        th_begin(&h, NULL);
        unsigned char *init = th_alloc(&h, state_bytes);
        double *vals = th_alloc(&h, (size_t)elems * k->n_slots * sizeof(double));
        ref64_fill(&r, vals, elems * k->n_slots, -1, 1, k->st);
        for (int64_t i = 0; i < elems * k->n_slots; i++)
            ref64_encode(vals[i], k->st, init + i * es);
        double *xbc = th_alloc(&h, (size_t)T * cd * sizeof(double));
        double *dt = th_alloc(&h, (size_t)T * H * sizeof(double));
        double *par = th_alloc(&h, 3 * (size_t)H * sizeof(double));
        ref64_fill(&r, xbc, T * cd, -1, 1, F32);
        ref64_fill(&r, dt, (int64_t)T * H, -4, 2, F32);
        ref64_fill(&r, par, H, -1, 1.5, F32);
        ref64_fill(&r, par + H, H, -1, 1, BF16);
        ref64_fill(&r, par + 2 * H, H, -2, 1, F16);
        double *y = th_alloc(&h, (size_t)ny * sizeof(double));
        double *yref = th_alloc(&h, (size_t)ny * sizeof(double));
        unsigned char *got = th_alloc(&h, state_bytes), *want = th_alloc(&h, state_bytes);
        srun(cpu, k, init, state_bytes, xbc, dt, par, yref, want);
        srun(be, k, init, state_bytes, xbc, dt, par, y, got);
        char what[96];
        snprintf(what, sizeof what, "scan case %zu y", ci);
        th_expect_close(y, yref, ny, ref64_tol(F32, true), what);
        /* every slot: written ones close to the cpu's, the others untouched */
        double *g = th_alloc(&h, (size_t)elems * sizeof(double));
        double *w = th_alloc(&h, (size_t)elems * sizeof(double));
        for (int32_t s = 0; s < k->n_slots; s++) {
            bool written = false;
            for (int32_t i = 0; i < k->n_seqs; i++)
                written |= k->dst[i] == s;
            for (int32_t i = 0; i < k->n_seqs * k->n_ckpt; i++)
                written |= k->ckpt[i] == s;
            snprintf(what, sizeof what, "scan case %zu slot %d", ci, s);
            if (!written) {
                th_expect_same_bytes(got + s * elems * es, init + s * elems * es,
                                     (size_t)elems * es, what);
                continue;
            }
            for (int64_t i = 0; i < elems; i++) {
                g[i] = ref64_decode(got + (s * elems + i) * es, k->st);
                w[i] = ref64_decode(want + (s * elems + i) * es, k->st);
            }
            th_expect_close(g, w, elems, ref64_tol(k->st, true), what);
        }
        th_end(&h);
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- GPU: cuBLAS matmuls -------------------------------------------------------------------------------- */

static void mrun(llmem_backend *be, int32_t m, int32_t k, int32_t n, llmem_dtype wt,
                 const double *a, const double *w, double *out)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_tensor ta = th_tensor(&c, F32, 2, m, k, 1), tw = th_tensor(&c, wt, 2, n, k, 1);
    llmem_tensor to = th_tensor(&c, F32, 2, m, n, 1);
    th_set(&ta, a);
    th_set(&tw, w);
    ck_assert_int_eq(llmem_op_matmul(be, &ta, &tw, &to), LLMEM_OK);
    th_get(&to, out);
    th_end(&c);
}

START_TEST(test_matmul_gemm)
{
    llmem_backend *be = test_open_or_skip("cuda");
    if (!be)
        return;
    llmem_backend *cpu = open_cpu();
    static const llmem_dtype types[3] = {F32, F16, BF16};
    int32_t m = 64, k = 1000, n = 300;
    for (int t = 0; t < 3; t++) {
        ref64_rng r = ref64_rng_make(ref64_seed(), 6000 + t);
        th_ctx h;
        th_begin(&h, NULL);
        double *a = th_alloc(&h, (size_t)m * k * sizeof(double));
        double *w = th_alloc(&h, (size_t)n * k * sizeof(double));
        double *out = th_alloc(&h, (size_t)m * n * sizeof(double));
        double *ref = th_alloc(&h, (size_t)m * n * sizeof(double));
        /* activations over several binades: the bf16 hi/lo split must hold */
        ref64_fill(&r, a, (int64_t)m * k, -1, 1, F32);
        for (int64_t i = 0; i < (int64_t)m * k; i += 7)
            a[i] = ref64_round(a[i] * 300.0, F32);
        ref64_fill(&r, w, (int64_t)n * k, -1, 1, types[t]);
        mrun(cpu, m, k, n, types[t], a, w, ref);
        mrun(be, m, k, n, types[t], a, w, out);
        char what[64];
        snprintf(what, sizeof what, "matmul 64x1000x300 w=%s", llmem_dtype_name(types[t]));
        th_expect_close(out, ref, (int64_t)m * n, ref64_tol(F32, true), what);
        th_end(&h);
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- GPU: the kernel profile ($LLMEM_CUDA_PROFILE=1) ------------------------------------------------ */

typedef struct prof_ctx {
    llmem_backend *be;
    const llmem_tensor *a, *w, *o;
    int n;
} prof_ctx;

static llmem_status prof_ops(void *vctx)
{
    prof_ctx *p = vctx;
    for (int i = 0; i < p->n; i++) {
        llmem_status st = llmem_op_matmul(p->be, p->a, p->w, p->o);
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

/* Sums the "calls" column of the rows naming `kernel` in the table that
 * follows the header line containing `header`. */
static double prof_calls(const char *text, const char *header, const char *kernel)
{
    const char *t = strstr(text, header);
    if (!t)
        return -1.0;
    t = strchr(t, '\n');
    double sum = 0.0;
    while (t && t[1] == ' ') {
        const char *line = t + 1;
        t = strchr(line, '\n');
        double us, share, calls;
        char rest[256] = "";
        if (sscanf(line, "%lf %lf%% %lf %255[^\n]", &us, &share, &calls, rest) == 4 &&
            strstr(rest, kernel))
            sum += calls;
    }
    return sum;
}

START_TEST(test_profile)
{
    char path[] = "/tmp/llmem_cuda_profile_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_eq(dup2(fd, 2), 2);
    setenv("LLMEM_CUDA_PROFILE", "1", 1);
    llmem_backend *be = test_open_or_skip("cuda");
    unsetenv("LLMEM_CUDA_PROFILE");
    if (be) {
        th_ctx c;
        th_begin(&c, be);
        /* M = 1: the GEMV, one kernel per matmul */
        llmem_tensor ta = th_tensor(&c, F32, 2, 1, 512, 1), tw = th_tensor(&c, BF16, 2, 96, 512, 1);
        llmem_tensor to = th_tensor(&c, F32, 2, 1, 96, 1);
        double *v = th_vec(&c, 96 * 512);
        th_set(&ta, v);
        th_set(&tw, v);
        prof_ctx p = {be, &ta, &tw, &to, 5};
        ck_assert_int_eq(prof_ops(&p), LLMEM_OK); /* 5 calls outside graphs */
        p.n = 3;
        llmem_recording *rec = NULL;
        ck_assert_int_eq(llmem_backend_record(be, prof_ops, &p, &rec), LLMEM_OK);
        ck_assert(llmem_recording_is_native(rec));
        for (int i = 0; i < 4; i++) /* 4 launches of 3 calls */
            ck_assert_int_eq(llmem_recording_replay(rec), LLMEM_OK);
        ck_assert_int_eq(llmem_backend_synchronize(be), LLMEM_OK);
        llmem_recording_free(rec);
        th_end(&c);
        llmem_backend_close(be); /* prints the profile */
    }
    fflush(stderr);
    ck_assert_int_eq(dup2(saved, 2), 2);
    close(saved);
    FILE *f = fdopen(fd, "r");
    ck_assert_ptr_nonnull(f);
    rewind(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    unlink(path);
    if (!be)
        return;
    if (strstr(text, "profile off")) {
        printf("cuda profile: skipped (%s)\n", strstr(text, "profile off"));
        return;
    }
    printf("%s", text);
    ck_assert_msg(strstr(text, "4 launches") != NULL, "no graph of 4 launches:\n%s", text);
    ck_assert_msg(prof_calls(text, "kernels outside graphs", "gemv") == 5.0,
                  "gemv calls outside graphs:\n%s", text);
    ck_assert_msg(prof_calls(text, "4 launches", "gemv") == 3.0,
                  "gemv calls per launch:\n%s", text);
}
END_TEST

int main(void)
{
    printf("test_cuda: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("cuda");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_open_status);
    tcase_add_test(tc, test_list);
    tcase_add_test(tc, test_alloc_failure);
    tcase_add_test(tc, test_attention_paths);
    tcase_add_test(tc, test_scan_shapes);
    tcase_add_test(tc, test_matmul_gemm);
    tcase_add_test(tc, test_profile);
    suite_add_tcase(s, tc);
    /* without a usable cuda backend only the checks that need no device ran:
     * skipped (77), not passed */
    return test_exit_status(test_run_suite(s), "cuda", "test_cuda");
}
