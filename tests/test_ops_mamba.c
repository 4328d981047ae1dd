// ctest-labels: core
/* Op conformance suite, part 3: Mamba-2 conv1d and selective scan with
 * state slots and checkpoints, and state slot copies (see test_ops.c for
 * the conventions).
 *
 * The reference is a float64 step-by-step recurrence (ref64_conv_token,
 * ref64_ssm_token: HF Mamba2Mixer.torch_forward's cached single step)
 * over each stream of an EQUAL ubatch. Recurrent views are built by hand:
 * free slots hold NaN, sources may be -1 (zero state), the stream's own
 * destination (in place), another stream's destination (copy-on-write) or
 * a checkpoint (rollback). Conv states are past inputs, so their bytes
 * must match exactly; ssm states within the state dtype's threshold; slots
 * nobody writes keep their bytes.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/ops.h"
#include "llmem/recurrent.h"
#include "support/ops_harness.h"
#include "support/ref64.h"
#include "support/rs_harness.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16

/* ---- conv ------------------------------------------------------------------------------------ */

typedef struct conv_in {
    int32_t conv_dim, d_conv;
    llmem_dtype wt;
    const double *x, *w, *b; /* b may be NULL */
} conv_in;

static void conv_step(void *vctx, double *state, int32_t tok, double *out_row)
{
    const conv_in *in = vctx;
    ref64_conv_token(state, in->x + (int64_t)tok * in->conv_dim, in->w, in->b, in->conv_dim,
                     in->d_conv, out_row);
}

static void conv_run(llmem_backend *be, const rs_setup *rs, const llmem_state_desc *d,
                     const conv_in *in, const unsigned char *init, double *out,
                     unsigned char *state_after)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_view view;
    llmem_rs_view rsd;
    llmem_buffer *bufs[1];
    rs_build(&c, &view, &rsd, rs, 1, d, bufs, &init);
    int32_t n_tok = rs->n_seqs * rs->n_tok;
    llmem_tensor x = th_tensor(&c, F32, 2, n_tok, in->conv_dim, 1);
    llmem_tensor w = th_tensor(&c, in->wt, 3, in->conv_dim, 1, in->d_conv); /* HF layout */
    llmem_tensor b = th_tensor(&c, in->wt, 1, in->conv_dim, 1, 1);
    llmem_tensor o = th_tensor(&c, F32, 2, n_tok, in->conv_dim, 1);
    th_set(&x, in->x);
    th_set(&w, in->w);
    if (in->b)
        th_set(&b, in->b);
    ck_assert_int_eq(llmem_op_ssm_conv(be, &view, 0, &x, &w, in->b ? &b : NULL, &o), LLMEM_OK);
    th_get(&o, out);
    size_t bytes = llmem_buffer_size(bufs[0]);
    ck_assert_int_eq(llmem_buffer_download(bufs[0], 0, state_after, bytes), LLMEM_OK);
    th_end(&c);
}

typedef struct conv_case {
    rs_setup rs;
    int32_t conv_dim, d_conv;
    llmem_dtype st, wt;
    bool bias;
} conv_case;

static const conv_case conv_cases[] = {
    /* decode step, f32 */
    {{1, 1, 0, 3, {2}, {2}, {0}}, 67, 4, F32, F32, true},
    /* decode steps on cuda's 4-channel kernel (f32 state, conv_dim % 4 == 0,
     * d_conv 4): zero start, in place, and reading stream 0's dst (snapshot) */
    {{3, 1, 0, 6, {-1, 4, 1}, {1, 4, 5}, {0}}, 64, 4, F32, BF16, true},
    /* the same kernel with checkpoints before (-1) and after the token */
    {{2, 1, 2, 8, {3, 6}, {3, 5}, {0, 1, 2, 7}}, 128, 4, F32, F32, true},
    /* 3 streams: zero start, in place, and reading stream 0's dst (which
     * stream 0 overwrites: copy-on-write); 2 checkpoints each */
    {{3, 5, 2, 12, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9}}, 200, 4, F16, BF16, false},
    /* more checkpoints than tokens: token -2 (none), -1 (initial), 0, 1;
     * the last checkpoint equals dst (dst wins, same value) */
    {{2, 2, 4, 10, {3, 6}, {3, 5}, {-1, 0, 1, 3, -1, 6, 8, 9}}, 129, 2, BF16, F16, true},
    /* rollback: stream 1 resumes from its own checkpoint slot, written again */
    {{4, 7, 3, 16, {-1, 9, 2, 15}, {0, 1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -1}},
     96, 3, F32, BF16, true},
    /* prefill chunks longer than cuda's 16 tokens per thread: windows across
     * chunk edges, in place with checkpoints; the widest window (d_conv 16) */
    {{2, 40, 2, 6, {-1, 3}, {0, 3}, {1, 2, 4, 5}}, 70, 4, F32, BF16, true},
    {{1, 33, 0, 2, {1}, {1}, {0}}, 64, 16, BF16, F32, false},
    /* snapshots inside the ubatch (llmem_rs_view.snap_tok / snap_slot): after
     * token 17 (chunk-internal), after token 0 (its window still half in the
     * source state), none for the third stream; two tokens, after token 0 */
    {{3, 40, 2, 12, {-1, 3, 6}, {0, 3, 7}, {1, 2, 4, 5, 8, 9}, true, {17, 0, 5}, {10, 11, -1}},
     70, 4, F32, BF16, true},
    {{2, 2, 0, 6, {1, -1}, {1, 2}, {0}, true, {0, 0}, {4, 5}}, 64, 4, F16, F32, false},
    /* a prompt of 300 tokens published after token 255 (a 64-token chunk edge) */
    {{1, 300, 0, 3, {-1}, {0}, {0}, true, {255}, {2}}, 128, 4, BF16, BF16, true},
};

START_TEST(test_ssm_conv)
{
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t ci = 0; ci < sizeof conv_cases / sizeof conv_cases[0]; ci++) {
        const conv_case *k = &conv_cases[ci];
        const rs_setup *rs = &k->rs;
        ref64_rng r = ref64_rng_make(ref64_seed(), 4000 + ci);
        th_ctx h;
        th_begin(&h, NULL);
        llmem_state_desc d = {"conv", 2, {k->d_conv - 1, k->conv_dim}, k->st};
        unsigned char *init = rs_source_image(&h, &r, &d, rs, -2, 2);
        int64_t n_tok = (int64_t)rs->n_seqs * rs->n_tok;
        double *x = th_rand(&h, &r, n_tok * k->conv_dim, -2, 2, F32);
        double *w = th_rand(&h, &r, (int64_t)k->conv_dim * k->d_conv, -1, 1, k->wt);
        double *b = th_rand(&h, &r, k->conv_dim, -0.5, 0.5, k->wt);
        conv_in in = {k->conv_dim, k->d_conv, k->wt, x, w, k->bias ? b : NULL};
        rs_case_bufs cb;
        rs_case_bufs_make(&h, rs, &d, n_tok * k->conv_dim, &cb);
        conv_run(be, rs, &d, &in, init, cb.out, cb.after);
        rs_reference_ubatch(rs, &d, init, conv_step, &in, k->conv_dim, cb.ref, cb.want, cb.written);
        if (cpu)
            conv_run(cpu, rs, &d, &in, init, cb.ref, cb.after_cpu);
        char what[64];
        snprintf(what, sizeof what, "ssm_conv case %zu", ci);
        th_expect_close(cb.out, cb.ref, n_tok * k->conv_dim, ref64_tol(F32, cpu != NULL), what);
        /* conv states are past inputs: exact bytes on every backend */
        rs_check_slots(rs, &d, init, cb.after, cb.want, cb.written, true, cpu != NULL, what);
        th_end(&h);
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* ---- scan ------------------------------------------------------------------------------------ */

typedef struct scan_case {
    rs_setup rs;
    llmem_ssm_params p;
    llmem_dtype st, pt;
    bool has_d, has_bias;
} scan_case;

static const scan_case scan_cases[] = {
    {{3, 5, 2, 12, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9}},
     {4, 16, 16, 2, 0.0f, INFINITY, 0}, F32, F32, true, true},
    {{1, 1, 0, 2, {1}, {1}, {0}}, {3, 5, 7, 1, 0.01f, 0.1f, 0}, F16, BF16, false, false},
    {{1, 3, 1, 3, {0}, {2}, {1}}, {8, 64, 128, 1, 0.0f, INFINITY, 0}, BF16, F32, true, true},
    {{2, 9, 4, 10, {3, 6}, {3, 5}, {-1, 0, 1, 3, 2, 6, 8, 9}},
     {6, 8, 32, 3, 0.001f, 0.5f, 0}, F32, F16, true, false},
    {{4, 2, 3, 16, {-1, 9, 2, 15}, {0, 1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, -1}},
     {2, 3, 5, 2, 0.0f, INFINITY, 0}, F16, F32, false, true},
    /* one token, no checkpoints (ssm_scan_decode.comp on vulkan): src == dst,
     * a fresh stream, a stream reading another's dst (snapshot), no dst,
     * 16-bit states, d_state 4 (one lane per row) */
    {{3, 1, 0, 8, {-1, 4, 1}, {1, 4, 7}, {0}}, {4, 16, 128, 2, 0.0f, INFINITY, 0}, F32, F32, true,
     true},
    {{4, 1, 0, 8, {2, 0, 5, -1}, {0, 1, -1, 3}, {0}}, {6, 8, 32, 3, 0.001f, 0.5f, 0}, BF16, F16,
     true, false},
    {{2, 1, 0, 4, {1, -1}, {1, 2}, {0}}, {3, 5, 64, 1, 0.0f, INFINITY, 0}, F16, F32, false, true},
    {{2, 1, 0, 3, {0, 1}, {0, 1}, {0}}, {2, 3, 4, 1, 0.0f, INFINITY, 0}, F32, F32, true, true},
    /* one token at the shapes of cuda's decode scan (d_state = 32 x 2, 4 or
     * 8 columns per lane), each with more items per warp than ring stages:
     * a snapshot source, no dst and a fresh stream in bf16; f16; f32 256 */
    {{4, 1, 0, 8, {2, 0, 5, -1}, {0, 1, -1, 3}, {0}}, {4, 16, 128, 2, 0.0f, INFINITY, 0}, BF16, F32,
     true, true},
    {{2, 1, 0, 4, {1, -1}, {1, 2}, {0}}, {3, 8, 64, 1, 0.001f, 0.5f, 0}, F16, BF16, true, false},
    {{3, 1, 0, 6, {0, 1, 2}, {0, 1, 2}, {0}}, {2, 6, 256, 1, 0.0f, INFINITY, 0}, F32, F32, false,
     true},
    /* a long prefill chunk: 256 steps of decay and accumulation */
    {{2, 256, 2, 6, {-1, 3}, {0, 3}, {1, 2, 4, 5}}, {8, 16, 32, 2, 0.0f, INFINITY, 0}, F32, BF16,
     true, true},
    /* long streams for cuda's chunked SSD (kernels/ssd.cu, 64-token chunks):
     * 300 tokens = 4 chunks + 44 at the 9B head shape (head_dim 64, d_state
     * 128, one group): a fresh stream, one in place, one reading stream 0's
     * dst (copy-on-write), 3 checkpoints each in the partial last chunk */
    {{3, 300, 3, 13, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9, 10, 11, 12}},
     {4, 64, 128, 1, 0.0f, INFINITY, 0}, F32, F32, true, true},
    /* 333 tokens (5 chunks + 13) at the fixtures' shape, bf16 state, dt
     * limits; stream 1 rolls back onto its own source slot (6) */
    {{2, 333, 5, 13, {3, 6}, {3, 5}, {0, 1, 2, 4, -1, 6, 8, 9, 10, 11}},
     {8, 16, 16, 2, 0.001f, 0.5f, 0}, BF16, F16, true, false},
    /* 14 checkpoints across the edge of chunks 0 and 1 (tokens 56..69), f16 */
    {{1, 70, 14, 16, {0}, {0}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}},
     {4, 32, 64, 2, 0.0f, INFINITY, 0}, F16, F32, false, true},
    /* snapshots inside the ubatch (llmem_rs_view.snap_tok / snap_slot):
     * short streams (after token 0 of 2; token 4 of 9 beside checkpoints);
     * cuda's chunked SSD at the 9B head shape: mid-chunk (token 100), on a
     * chunk's last token (63) and after the first token, beside checkpoints
     * and a copy-on-write source; one stream without one */
    {{2, 2, 0, 6, {1, -1}, {1, 2}, {0}, true, {0, 0}, {4, 5}}, {4, 16, 16, 2, 0.0f, INFINITY, 0},
     F32, F32, true, true},
    {{2, 9, 2, 10, {3, 6}, {3, 5}, {0, 1, 2, 7}, true, {4, 7}, {8, -1}},
     {6, 8, 32, 3, 0.001f, 0.5f, 0}, BF16, F16, true, false},
    {{3, 300, 3, 16, {-1, 4, 1}, {1, 4, 7}, {0, 2, 3, 5, 8, 9, 10, 11, 12}, true, {100, 63, 0},
      {13, 14, 15}},
     {4, 64, 128, 1, 0.0f, INFINITY, 0}, F32, F32, true, true},
    {{1, 200, 0, 3, {-1}, {0}, {0}, true, {191}, {2}}, {8, 16, 16, 2, 0.0f, INFINITY, 0}, F16,
     BF16, true, true},
    /* a snapshot where d_state % 4 != 0 (vulkan's ssm_scan.comp, not the
     * lane-group prefill shader; cuda's per-token kernel, one column a lane):
     * mid-stream in place (its checkpoint after the last token), and after
     * token 0 of a fresh stream */
    {{2, 12, 1, 8, {0, -1}, {0, 1}, {2, -1}, true, {6, 0}, {3, 4}},
     {3, 5, 7, 1, 0.0f, INFINITY, 0}, BF16, F32, true, true},
    /* shapes that pad the tiles: head_dim 40, d_state 100 */
    {{2, 100, 2, 8, {-1, 1}, {0, 1}, {2, 3, 4, -1}}, {3, 40, 100, 1, 0.0f, INFINITY, 0}, F32, BF16,
     true, true},
};

static void scan_inputs(th_ctx *h, ref64_rng *r, const scan_case *k, rs_scan_in *in)
{
    int64_t n_tok = (int64_t)k->rs.n_seqs * k->rs.n_tok, H = k->p.n_heads;
    double *xbc = th_rand(h, r, n_tok * rs_ssm_conv_dim(&k->p), -1, 1, F32);
    double *dt = th_rand(h, r, n_tok * H, -5, 3, F32);
    double *a = th_rand(h, r, H, -1, 2, k->pt), *d = th_rand(h, r, H, -1, 1, k->pt);
    double *bias = th_rand(h, r, H, -2, 1, k->pt);
    *in = (rs_scan_in){k->p, k->pt, xbc, dt, a, k->has_d ? d : NULL, k->has_bias ? bias : NULL};
}

START_TEST(test_ssm_scan)
{
    llmem_backend *be = th_open(_i);
    llmem_backend *cpu = th_is_cpu(_i) ? NULL : th_open_cpu();
    for (size_t ci = 0; ci < sizeof scan_cases / sizeof scan_cases[0]; ci++) {
        const scan_case *k = &scan_cases[ci];
        const rs_setup *rs = &k->rs;
        ref64_rng r = ref64_rng_make(ref64_seed(), 5000 + ci);
        th_ctx h;
        th_begin(&h, NULL);
        llmem_state_desc d = {"ssm", 3, {k->p.n_heads, k->p.head_dim, k->p.d_state}, k->st};
        unsigned char *init = rs_source_image(&h, &r, &d, rs, -1, 1);
        rs_scan_in in;
        scan_inputs(&h, &r, k, &in);
        int64_t n_tok = (int64_t)rs->n_seqs * rs->n_tok, e = rs_desc_elems(&d);
        int64_t ny = n_tok * k->p.n_heads * k->p.head_dim;
        rs_case_bufs cb;
        rs_case_bufs_make(&h, rs, &d, ny, &cb);
        rs_ssm_scan_run(be, rs, &d, &in, init, cb.out, cb.after);
        rs_reference_ubatch(rs, &d, init, rs_ssm_scan_step, &in, k->p.n_heads * k->p.head_dim,
                            cb.ref, cb.want, cb.written);
        if (cpu) {
            rs_ssm_scan_run(cpu, rs, &d, &in, init, cb.ref, cb.after_cpu);
            for (int32_t s = 0; s < rs->n_slots; s++)
                if (cb.written[s])
                    rs_decode_slot(cb.after_cpu, &d, s, cb.want + s * e);
        }
        char what[64];
        snprintf(what, sizeof what, "ssm_scan case %zu", ci);
        th_expect_close(cb.out, cb.ref, ny, ref64_tol(F32, cpu != NULL), what);
        rs_check_slots(rs, &d, init, cb.after, cb.want, cb.written, false, cpu != NULL, what);
        th_end(&h);
    }
    llmem_backend_close(cpu);
    llmem_backend_close(be);
}
END_TEST

/* The FAST precision mode (llmem_ssm_params.fast): the long-stream cases
 * (64 tokens and more: cuda's chunked SSD) with single bf16 products
 * allowed. y and every written state against the float64 reference within
 * 2e-2 normalized (bf16 operands: 2^-9 per product; measured 2e-3 to 5e-3
 * on cuda); backends without a fast path give the f32 result. */
START_TEST(test_ssm_scan_fast)
{
    llmem_backend *be = th_open(_i);
    for (size_t ci = 0; ci < sizeof scan_cases / sizeof scan_cases[0]; ci++) {
        scan_case k = scan_cases[ci];
        const rs_setup *rs = &k.rs;
        if (rs->n_tok < 64)
            continue;
        k.p.fast = 1;
        ref64_rng r = ref64_rng_make(ref64_seed(), 5500 + ci);
        th_ctx h;
        th_begin(&h, NULL);
        llmem_state_desc d = {"ssm", 3, {k.p.n_heads, k.p.head_dim, k.p.d_state}, k.st};
        unsigned char *init = rs_source_image(&h, &r, &d, rs, -1, 1);
        rs_scan_in in;
        scan_inputs(&h, &r, &k, &in);
        int64_t n_tok = (int64_t)rs->n_seqs * rs->n_tok, e = rs_desc_elems(&d);
        int64_t ny = n_tok * k.p.n_heads * k.p.head_dim;
        rs_case_bufs cb;
        rs_case_bufs_make(&h, rs, &d, ny, &cb);
        double *got = th_vec(&h, e);
        rs_ssm_scan_run(be, rs, &d, &in, init, cb.out, cb.after);
        rs_reference_ubatch(rs, &d, init, rs_ssm_scan_step, &in, k.p.n_heads * k.p.head_dim,
                            cb.ref, cb.want, cb.written);
        char what[80];
        snprintf(what, sizeof what, "ssm_scan case %zu, fast", ci);
        th_expect_close(cb.out, cb.ref, ny, 2e-2, what);
        for (int32_t s = 0; s < rs->n_slots; s++) {
            if (!cb.written[s])
                continue;
            rs_decode_slot(cb.after, &d, s, got);
            snprintf(what, sizeof what, "ssm_scan case %zu, fast, state slot %d", ci, s);
            th_expect_close(got, cb.want + s * e, e, 2e-2, what);
        }
        th_end(&h);
    }
    llmem_backend_close(be);
}
END_TEST

/* ---- a layer over two ubatches: conv then scan, resuming from a checkpoint ------------------ */

/* Runs conv + scan of one ubatch over a 2-state view (conv, ssm) whose
 * buffers start as img[0], img[1] and are downloaded back into them. */
static void layer_run(llmem_backend *be, const rs_setup *rs, const llmem_state_desc *desc,
                      const conv_in *cin, const rs_scan_in *sin, unsigned char *const *img,
                      double *y)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_view view;
    llmem_rs_view rsd;
    llmem_buffer *bufs[2];
    const unsigned char *init[2] = {img[0], img[1]};
    rs_build(&c, &view, &rsd, rs, 2, desc, bufs, init);
    int32_t n_tok = rs->n_seqs * rs->n_tok, H = sin->p.n_heads;
    llmem_tensor x = th_tensor(&c, F32, 2, n_tok, cin->conv_dim, 1);
    llmem_tensor w = th_tensor(&c, cin->wt, 2, cin->conv_dim, cin->d_conv, 1);
    llmem_tensor xbc = th_tensor(&c, F32, 2, n_tok, cin->conv_dim, 1);
    llmem_tensor dt = th_tensor(&c, F32, 2, n_tok, H, 1);
    llmem_tensor a = th_tensor(&c, F32, 1, H, 1, 1), dd = th_tensor(&c, F32, 1, H, 1, 1);
    llmem_tensor bias = th_tensor(&c, F32, 1, H, 1, 1);
    llmem_tensor yt = th_tensor(&c, F32, 2, n_tok, H * sin->p.head_dim, 1);
    th_set(&x, cin->x);
    th_set(&w, cin->w);
    th_set(&dt, sin->dt);
    th_set(&a, sin->a_log);
    th_set(&dd, sin->d);
    th_set(&bias, sin->dt_bias);
    ck_assert_int_eq(llmem_op_ssm_conv(be, &view, 0, &x, &w, NULL, &xbc), LLMEM_OK);
    ck_assert_int_eq(llmem_op_ssm_scan(be, &sin->p, &view, 1, &xbc, &dt, &a, &dd, &bias, &yt),
                     LLMEM_OK);
    th_get(&yt, y);
    for (int j = 0; j < 2; j++)
        ck_assert_int_eq(llmem_buffer_download(bufs[j], 0, img[j], llmem_buffer_size(bufs[j])),
                         LLMEM_OK);
    th_end(&c);
}

START_TEST(test_mamba_resume)
{
    llmem_backend *be = th_open(_i);
    bool vs_cpu = !th_is_cpu(_i);
    for (int variant = 0; variant < 2; variant++) {
        llmem_dtype st = variant ? BF16 : F32;
        ref64_rng r = ref64_rng_make(ref64_seed(), 6000 + variant);
        th_ctx h;
        th_begin(&h, NULL);
        llmem_ssm_params p = {4, 8, 16, 2, 0.0f, INFINITY, 0};
        int32_t cd = (int32_t)rs_ssm_conv_dim(&p), d_conv = 4, H = p.n_heads, dy = H * p.head_dim;
        llmem_state_desc desc[2] = {{"conv", 2, {d_conv - 1, cd}, st},
                                    {"ssm", 3, {p.n_heads, p.head_dim, p.d_state}, st}};
        /* two streams, 6 + 4 tokens; 3 checkpoints in ubatch 1 */
        enum { T1 = 6, T2 = 4, NS = 2, SLOTS = 10 };
        int32_t total = T1 + T2;
        double *x = th_rand(&h, &r, (int64_t)NS * total * cd, -2, 2, F32);
        double *w = th_rand(&h, &r, (int64_t)cd * d_conv, -1, 1, F32);
        double *dt = th_rand(&h, &r, (int64_t)NS * total * H, -4, 2, F32);
        double *pa = th_vec(&h, (int64_t)H * 3);
        ref64_fill(&r, pa, H, -1, 1.5, F32);
        ref64_fill(&r, pa + H, 2 * H, -1, 1, F32);
        bool live[SLOTS] = {0};
        unsigned char *img[2] = {rs_state_image(&h, &r, &desc[0], SLOTS, live, 0, 0),
                                 rs_state_image(&h, &r, &desc[1], SLOTS, live, 0, 0)};
        /* ubatch 1: stream-major rows of tokens [0, T1) of both streams */
        double *x1 = th_alloc(&h, sizeof(double) * NS * T1 * cd), *dt1 = th_alloc(&h, sizeof(double) * NS * T1 * H);
        double *x2 = th_alloc(&h, sizeof(double) * NS * T2 * cd), *dt2 = th_alloc(&h, sizeof(double) * NS * T2 * H);
        for (int s = 0; s < NS; s++) {
            memcpy(x1 + s * T1 * cd, x + s * total * cd, sizeof(double) * T1 * cd);
            memcpy(dt1 + s * T1 * H, dt + s * total * H, sizeof(double) * T1 * H);
        }
        rs_setup u1 = {NS, T1, 3, SLOTS, {-1, -1}, {0, 1}, {2, 3, 4, 5, 6, 7}};
        double *y1 = th_alloc(&h, sizeof(double) * NS * T1 * dy);
        conv_in cin = {cd, d_conv, F32, x1, w, NULL};
        rs_scan_in sin = {p, F32, NULL, dt1, pa, pa + H, pa + 2 * H};
        layer_run(be, &u1, desc, &cin, &sin, img, y1);
        /* ubatch 2: stream 0 rolls back to its checkpoint after token 3
         * (slot 2, tokens 4 and 5 are dropped); stream 1 continues from
         * its dst. Stream 0's tokens of ubatch 2 are therefore positions
         * 4..7 of its own history: take them from x at T1 - 2. */
        int32_t start[NS] = {T1 - 2, T1};
        for (int s = 0; s < NS; s++) {
            memcpy(x2 + s * T2 * cd, x + (s * total + start[s]) * cd, sizeof(double) * T2 * cd);
            memcpy(dt2 + s * T2 * H, dt + (s * total + start[s]) * H, sizeof(double) * T2 * H);
        }
        rs_setup u2 = {NS, T2, 0, SLOTS, {2, 1}, {8, 1}, {0}};
        double *y2 = th_alloc(&h, sizeof(double) * NS * T2 * dy);
        cin.x = x2;
        sin.dt = dt2;
        layer_run(be, &u2, desc, &cin, &sin, img, y2);
        /* float64 reference: each stream's history in one pass */
        double *cst = th_alloc(&h, sizeof(double) * (size_t)((d_conv - 1) * cd));
        double *sst = th_alloc(&h, sizeof(double) * (size_t)(dy * p.d_state));
        double *xr = th_alloc(&h, sizeof(double) * (size_t)cd), *yr = th_alloc(&h, sizeof(double) * (size_t)dy);
        double *ref1 = th_alloc(&h, sizeof(double) * NS * T1 * dy), *ref2 = th_alloc(&h, sizeof(double) * NS * T2 * dy);
        for (int s = 0; s < NS; s++) {
            memset(cst, 0, sizeof(double) * (size_t)((d_conv - 1) * cd));
            memset(sst, 0, sizeof(double) * (size_t)(dy * p.d_state));
            int32_t n_hist = start[s] + T2;
            for (int32_t t = 0; t < n_hist; t++) {
                ref64_conv_token(cst, x + (s * total + t) * cd, w, NULL, cd, d_conv, xr);
                for (int32_t j = 0; j < cd; j++) /* the op's conv output is f32 */
                    xr[j] = ref64_round(xr[j], F32);
                ref64_ssm_token(sst, xr, dt + (s * total + t) * H, pa, pa + H, pa + 2 * H, &p, yr);
                if (t >= start[s])
                    memcpy(ref2 + (s * T2 + t - start[s]) * dy, yr, sizeof(double) * (size_t)dy);
                if (t < T1 && (s == 1 || t < start[s]))
                    memcpy(ref1 + (s * T1 + t) * dy, yr, sizeof(double) * (size_t)dy);
            }
        }
        /* stream 0's rows of ubatch 1 after the rollback point were not
         * recomputed in the reference loop above: redo them */
        memset(cst, 0, sizeof(double) * (size_t)((d_conv - 1) * cd));
        memset(sst, 0, sizeof(double) * (size_t)(dy * p.d_state));
        for (int32_t t = 0; t < T1; t++) {
            ref64_conv_token(cst, x + t * cd, w, NULL, cd, d_conv, xr);
            for (int32_t j = 0; j < cd; j++)
                xr[j] = ref64_round(xr[j], F32);
            ref64_ssm_token(sst, xr, dt + t * H, pa, pa + H, pa + 2 * H, &p, yr);
            memcpy(ref1 + t * dy, yr, sizeof(double) * (size_t)dy);
        }
        char what[64];
        snprintf(what, sizeof what, "mamba ubatch 1, %s states", llmem_dtype_name(st));
        th_expect_close(y1, ref1, (int64_t)NS * T1 * dy, ref64_tol(F32, vs_cpu), what);
        snprintf(what, sizeof what, "mamba ubatch 2 (resumed), %s states", llmem_dtype_name(st));
        /* resumed from states stored in st: one rounding of st */
        th_expect_close(y2, ref2, (int64_t)NS * T2 * dy, ref64_tol(st, vs_cpu), what);
        th_end(&h);
    }
    llmem_backend_close(be);
}
END_TEST

/* ---- decode steps with the conv output and y in one buffer (the conv folded into the scan) ---- */

/* One decode step of a layer as the model runs it: conv then scan, one
 * token per stream, the conv output and y in one activation buffer (where
 * the Vulkan backend folds the conv into the decode scan); states from and
 * back into img; the conv output and y to xo, y. */
static void fold_step(llmem_backend *be, const rs_setup *rs, const llmem_state_desc *desc,
                      const llmem_ssm_params *p, const double *x, const double *w,
                      const double *dt, const double *pa, unsigned char *const *img, double *xo,
                      double *y)
{
    th_ctx c;
    th_begin(&c, be);
    llmem_view view;
    llmem_rs_view rsd;
    llmem_buffer *bufs[2];
    const unsigned char *init[2] = {img[0], img[1]};
    rs_build(&c, &view, &rsd, rs, 2, desc, bufs, init);
    int32_t ns = rs->n_seqs, H = p->n_heads, cd = (int32_t)rs_ssm_conv_dim(p), dy = H * p->head_dim;
    llmem_tensor xt = th_tensor(&c, F32, 2, ns, cd, 1), wt = th_tensor(&c, F32, 2, cd, 4, 1);
    llmem_tensor bt = th_tensor(&c, F32, 1, cd, 1, 1), dtt = th_tensor(&c, F32, 2, ns, H, 1);
    llmem_tensor a = th_tensor(&c, F32, 1, H, 1, 1), dd = th_tensor(&c, F32, 1, H, 1, 1);
    llmem_tensor bias = th_tensor(&c, F32, 1, H, 1, 1);
    llmem_tensor act = th_tensor(&c, F32, 1, ns * (cd + dy), 1, 1);
    llmem_tensor xbc = act, yt = act;
    xbc.n_dims = yt.n_dims = 2;
    xbc.ne[0] = yt.ne[0] = ns;
    xbc.ne[1] = cd;
    yt.ne[1] = dy;
    yt.offset += (size_t)ns * cd * 4;
    th_set(&xt, x);
    th_set(&wt, w);
    th_set(&bt, w + 4 * cd);
    th_set(&dtt, dt);
    th_set(&a, pa);
    th_set(&dd, pa + H);
    th_set(&bias, pa + 2 * H);
    ck_assert_int_eq(llmem_op_ssm_conv(be, &view, 0, &xt, &wt, &bt, &xbc), LLMEM_OK);
    ck_assert_int_eq(llmem_op_ssm_scan(be, p, &view, 1, &xbc, &dtt, &a, &dd, &bias, &yt), LLMEM_OK);
    th_get(&xbc, xo);
    th_get(&yt, y);
    for (int j = 0; j < 2; j++)
        ck_assert_int_eq(llmem_buffer_download(bufs[j], 0, img[j], llmem_buffer_size(bufs[j])),
                         LLMEM_OK);
    th_end(&c);
}

/* Four decode steps of three streams against a float64 recurrence
 * (ref64_conv_token, the conv output rounded to f32, ref64_ssm_token;
 * each stream's source read before any destination is written): steps 1-3
 * in place from random states, step 4 with stream 2 reading stream 0's
 * source slot and writing it (copy-on-write: the Vulkan backend records
 * the conv alone there). The conv output and y within an f32 product's
 * error, conv states (past inputs) exactly, ssm states within f32's
 * threshold. On Vulkan with the fold (LLMEM_VULKAN_CONV_FOLD=1), with it
 * and LLMEM_VULKAN_SCAN_WG=64, LLMEM_VULKAN_SCAN_RPI=1 (16 rows a
 * workgroup: each group's B and C channels read by 4 workgroups, their
 * conv states written by the last to arrive), and without it (the
 * default). */
START_TEST(test_mamba_decode_fold)
{
    static const char *cfgs[3][6] = {{"LLMEM_VULKAN_CONV_FOLD", "1", NULL, NULL, NULL, NULL},
                                     {"LLMEM_VULKAN_CONV_FOLD", "1", "LLMEM_VULKAN_SCAN_WG", "64",
                                      "LLMEM_VULKAN_SCAN_RPI", "1"},
                                     {NULL, NULL, NULL, NULL, NULL, NULL}};
    bool vs_cpu = !th_is_cpu(_i);
    for (int ci = 0; ci < (vs_cpu ? 3 : 1); ci++) {
        test_env k0 = test_env_save("LLMEM_VULKAN_SCAN_WG"), k1 = test_env_save("LLMEM_VULKAN_SCAN_RPI");
        test_env k2 = test_env_save("LLMEM_VULKAN_CONV_FOLD");
        for (int e = 0; e < 6 && cfgs[ci][e]; e += 2)
            test_env_put(cfgs[ci][e], cfgs[ci][e + 1]);
        llmem_backend *be = th_open(_i);
        test_env_restore(&k2);
        test_env_restore(&k1);
        test_env_restore(&k0);
        ref64_rng r = ref64_rng_make(ref64_seed(), 8000 + ci);
        th_ctx h;
        th_begin(&h, NULL);
        llmem_ssm_params p = {8, 16, 16, 2, 0.0f, INFINITY, 0};
        enum { NS = 3, SLOTS = 6, STEPS = 4, DC = 4 };
        int32_t cd = (int32_t)rs_ssm_conv_dim(&p), H = p.n_heads, dy = H * p.head_dim;
        int64_t ce = (int64_t)(DC - 1) * cd, se = (int64_t)dy * p.d_state;
        llmem_state_desc desc[2] = {{"conv", 2, {DC - 1, cd}, F32},
                                    {"ssm", 3, {H, p.head_dim, p.d_state}, F32}};
        double *x = th_rand(&h, &r, (int64_t)STEPS * NS * cd, -2, 2, F32);
        /* w: the weights, then the bias */
        double *w = th_rand(&h, &r, (int64_t)cd * (DC + 1), -1, 1, F32);
        double *dt = th_rand(&h, &r, (int64_t)STEPS * NS * H, -4, 2, F32), *pa = th_vec(&h, 3 * H);
        ref64_fill(&r, pa, H, -1, 1.5, F32);
        ref64_fill(&r, pa + H, 2 * H, -1, 1, F32);
        bool live[SLOTS] = {1, 1, 1, 0, 0, 0};
        unsigned char *img[2] = {rs_state_image(&h, &r, &desc[0], SLOTS, live, -1, 1),
                                 rs_state_image(&h, &r, &desc[1], SLOTS, live, -1, 1)};
        double *cst = th_vec(&h, SLOTS * ce), *sst = th_vec(&h, SLOTS * se);
        for (int32_t sl = 0; sl < SLOTS; sl++) {
            rs_decode_slot(img[0], &desc[0], sl, cst + sl * ce);
            rs_decode_slot(img[1], &desc[1], sl, sst + sl * se);
        }
        double *nc = th_vec(&h, NS * ce), *nss = th_vec(&h, NS * se), *xo = th_vec(&h, NS * cd);
        double *y = th_vec(&h, NS * dy), *xr = th_vec(&h, NS * cd), *yr = th_vec(&h, NS * dy);
        double *got = th_vec(&h, se > ce ? se : ce);
        for (int step = 0; step < STEPS; step++) {
            rs_setup rs = {NS, 1, 0, SLOTS, {0, 1, 2}, {0, 1, 2}, {0}};
            if (step == STEPS - 1) /* stream 2 reads and writes stream 0's source */
                rs = (rs_setup){NS, 1, 0, SLOTS, {0, 1, 0}, {3, 4, 0}, {0}};
            const double *xs = x + (int64_t)step * NS * cd, *dts = dt + (int64_t)step * NS * H;
            fold_step(be, &rs, desc, &p, xs, w, dts, pa, img, xo, y);
            for (int s = 0; s < NS; s++) {
                memcpy(nc + s * ce, cst + rs.src[s] * ce, sizeof(double) * (size_t)ce);
                memcpy(nss + s * se, sst + rs.src[s] * se, sizeof(double) * (size_t)se);
                ref64_conv_token(nc + s * ce, xs + s * cd, w, w + DC * cd, cd, DC, xr + s * cd);
                for (int32_t j = 0; j < cd; j++) /* the op's conv output is f32 */
                    xr[s * cd + j] = ref64_round(xr[s * cd + j], F32);
                ref64_ssm_token(nss + s * se, xr + s * cd, dts + s * H, pa, pa + H, pa + 2 * H, &p,
                                yr + s * dy);
            }
            for (int s = 0; s < NS; s++) {
                memcpy(cst + rs.dst[s] * ce, nc + s * ce, sizeof(double) * (size_t)ce);
                memcpy(sst + rs.dst[s] * se, nss + s * se, sizeof(double) * (size_t)se);
            }
            char what[96];
            snprintf(what, sizeof what, "decode fold cfg %d step %d: conv output", ci, step);
            th_expect_close(xo, xr, NS * cd, ref64_tol(F32, vs_cpu), what);
            snprintf(what, sizeof what, "decode fold cfg %d step %d: y", ci, step);
            th_expect_close(y, yr, NS * dy, ref64_tol(F32, vs_cpu), what);
            for (int s = 0; s < NS; s++) {
                int32_t sl = rs.dst[s];
                rs_decode_slot(img[0], &desc[0], sl, got);
                for (int64_t i = 0; i < ce; i++)
                    ck_assert_msg(got[i] == cst[sl * ce + i], "cfg %d step %d slot %d: conv state %lld",
                                  ci, step, sl, (long long)i);
                rs_decode_slot(img[1], &desc[1], sl, got);
                snprintf(what, sizeof what, "decode fold cfg %d step %d: ssm state slot %d", ci,
                         step, sl);
                th_expect_close(got, sst + sl * se, se, ref64_tol(F32, vs_cpu), what);
            }
        }
        th_end(&h);
        llmem_backend_close(be);
    }
}
END_TEST

/* ---- argument and slot-table checks ---------------------------------------------------------- */

START_TEST(test_mamba_tables)
{
    llmem_backend *be = th_open(_i);
    th_ctx c;
    th_begin(&c, be);
    llmem_ssm_params p = {2, 4, 8, 1, 0.0f, INFINITY, 0};
    int32_t cd = (int32_t)rs_ssm_conv_dim(&p);
    llmem_state_desc desc[2] = {{"conv", 2, {3, cd}, F32}, {"ssm", 3, {2, 4, 8}, F32}};
    unsigned char *img[2] = {th_alloc(&c, (size_t)(3 * cd * 4 * 6)), th_alloc(&c, 64 * 4 * 6)};
    llmem_tensor x = th_tensor(&c, F32, 2, 4, cd, 1), o = th_tensor(&c, F32, 2, 4, cd, 1);
    llmem_tensor w = th_tensor(&c, F32, 2, cd, 4, 1), dt = th_tensor(&c, F32, 2, 4, 2, 1);
    llmem_tensor a = th_tensor(&c, F32, 1, 2, 1, 1), y = th_tensor(&c, F32, 2, 4, 8, 1);
    double zeros[4 * 40] = {0};
    th_set(&x, zeros);
    th_set(&w, zeros);
    th_set(&dt, zeros);
    th_set(&a, zeros);
    struct {
        rs_setup rs;
        llmem_status want;
        const char *why;
    } cases[] = {
        {{2, 2, 1, 6, {0, 1}, {2, 3}, {4, 5}}, LLMEM_OK, "valid"},
        {{2, 2, 1, 6, {0, 1}, {2, 2}, {4, 5}}, LLMEM_E_INVALID, "two streams write one dst"},
        {{2, 2, 1, 6, {0, 1}, {2, 3}, {4, 2}}, LLMEM_E_INVALID, "a ckpt is another stream's dst"},
        {{2, 2, 1, 6, {0, 6}, {2, 3}, {4, 5}}, LLMEM_E_INVALID, "src out of range"},
        {{2, 2, 1, 6, {0, -2}, {2, 3}, {4, 5}}, LLMEM_E_INVALID, "src below -1"},
        {{2, 2, 4, 6, {0, 1}, {2, 3}, {4, -1, -1, -1, -1, -1, -1, -1}}, LLMEM_E_INVALID,
         "ckpt before the state before the ubatch"},
        {{1, 4, 0, 6, {0}, {1}, {0}}, LLMEM_OK, "one stream of 4"},
        {{4, 1, 0, 6, {-1, -1, -1, -1}, {0, 1, 2, -1}, {0}}, LLMEM_OK, "4 streams, no dst for one"},
        {{1, 3, 0, 6, {0}, {1}, {0}}, LLMEM_E_INVALID, "rows != n_seqs * n_seq_tokens"},
        {{2, 2, 1, 6, {0, 1}, {2, 3}, {4, -1}, true, {0, 0}, {5, -1}}, LLMEM_OK, "a snapshot"},
        {{2, 2, 0, 6, {0, 1}, {2, 3}, {0}, true, {1, 0}, {4, -1}}, LLMEM_E_INVALID,
         "a snapshot after the last token (dst's)"},
        {{2, 2, 0, 6, {0, 1}, {2, 3}, {0}, true, {-1, 0}, {4, -1}}, LLMEM_E_INVALID,
         "a snapshot before the first token"},
        {{2, 2, 0, 6, {0, 1}, {2, 3}, {0}, true, {0, 0}, {3, -1}}, LLMEM_E_INVALID,
         "a snapshot into another stream's dst"},
        {{2, 2, 0, 6, {0, 1}, {2, 3}, {0}, true, {0, 0}, {2, -1}}, LLMEM_E_INVALID,
         "a snapshot into its own dst"},
        {{2, 2, 1, 6, {0, 1}, {2, 3}, {4, 5}, true, {0, 0}, {4, -1}}, LLMEM_E_INVALID,
         "a snapshot into its own checkpoint"},
        {{2, 2, 0, 6, {0, 1}, {2, 3}, {0}, true, {0, 0}, {1, -1}}, LLMEM_E_INVALID,
         "a snapshot into another stream's source"},
        {{2, 2, 0, 6, {0, 1}, {2, 3}, {0}, true, {0, 0}, {4, 4}}, LLMEM_E_INVALID,
         "two snapshots into one slot"},
        {{2, 2, 0, 6, {0, 1}, {2, 3}, {0}, true, {0, 0}, {6, -1}}, LLMEM_E_INVALID,
         "a snapshot slot out of range"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmem_view view;
        llmem_rs_view rsd;
        llmem_buffer *bufs[2];
        const unsigned char *init[2] = {img[0], img[1]};
        rs_build(&c, &view, &rsd, &cases[i].rs, 2, desc, bufs, init);
        llmem_status s1 = llmem_op_ssm_conv(be, &view, 0, &x, &w, NULL, &o);
        llmem_status s2 = llmem_op_ssm_scan(be, &p, &view, 1, &x, &dt, &a, NULL, NULL, &y);
        ck_assert_msg(s1 == cases[i].want && s2 == cases[i].want, "%s: conv %d, scan %d",
                      cases[i].why, s1, s2);
    }
    /* wrong state index or shape for the op, overlapping output, bad params */
    llmem_view view;
    llmem_rs_view rsd;
    llmem_buffer *bufs[2];
    const unsigned char *init[2] = {img[0], img[1]};
    rs_setup ok = {2, 2, 0, 6, {0, 1}, {2, 3}, {0}};
    rs_build(&c, &view, &rsd, &ok, 2, desc, bufs, init);
    ck_assert_int_eq(llmem_op_ssm_conv(be, &view, 1, &x, &w, NULL, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_scan(be, &p, &view, 0, &x, &dt, &a, NULL, NULL, &y), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_conv(be, &view, 2, &x, &w, NULL, &o), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_conv(be, &view, 0, &x, &w, NULL, &x), LLMEM_E_INVALID);
    llmem_ssm_params bad = p;
    bad.n_groups = 3;
    ck_assert_int_eq(llmem_op_ssm_scan(be, &bad, &view, 1, &x, &dt, &a, NULL, NULL, &y), LLMEM_E_INVALID);
    bad = p;
    bad.dt_min = 1.0f;
    bad.dt_max = 0.5f;
    ck_assert_int_eq(llmem_op_ssm_scan(be, &bad, &view, 1, &x, &dt, &a, NULL, NULL, &y), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_ssm_scan(be, &p, &view, 1, &x, &dt, NULL, NULL, NULL, &y), LLMEM_E_INVALID);
    if (th_is_cpu(_i)) {
        /* the device copy disagrees with the host: the CPU kernel refuses */
        int32_t evil = 99;
        ck_assert_int_eq(llmem_buffer_upload(view.idx, llmem_view_rs(&view)->dst_slot.offset, &evil, 4), LLMEM_OK);
        ck_assert_int_eq(llmem_op_ssm_conv(be, &view, 0, &x, &w, NULL, &o), LLMEM_E_INVALID);
        ck_assert_int_eq(llmem_op_ssm_scan(be, &p, &view, 1, &x, &dt, &a, NULL, NULL, &y),
                         LLMEM_E_INVALID);
    }
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_state_slot_copy)
{
    llmem_backend *be = th_open(_i);
    ref64_rng r = ref64_rng_make(ref64_seed(), 7000);
    th_ctx c;
    th_begin(&c, be);
    llmem_state_desc desc[2] = {{"conv", 2, {3, 13}, BF16}, {"ssm", 3, {2, 3, 5}, F32}};
    bool live[5] = {1, 1, 1, 1, 1};
    unsigned char *img[2] = {rs_state_image(&c, &r, &desc[0], 5, live, -1, 1),
                             rs_state_image(&c, &r, &desc[1], 5, live, -1, 1)};
    llmem_view view;
    llmem_rs_view rsd;
    llmem_buffer *bufs[2];
    const unsigned char *init[2] = {img[0], img[1]};
    rs_setup rs = {1, 1, 0, 5, {0}, {1}, {0}};
    rs_build(&c, &view, &rsd, &rs, 2, desc, bufs, init);
    ck_assert_int_eq(llmem_op_state_slot_copy(be, &view, 3, 1), LLMEM_OK);
    for (int j = 0; j < 2; j++) {
        size_t slot = (size_t)rs_desc_elems(&desc[j]) * llmem_dtype_size(desc[j].dtype);
        memcpy(img[j] + slot, img[j] + 3 * slot, slot);
        th_expect_same_bytes(th_snapshot(&c, bufs[j]), img[j], 5 * slot, "state after slot copy");
    }
    ck_assert_int_eq(llmem_op_state_slot_copy(be, &view, 3, 3), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_state_slot_copy(be, &view, 5, 0), LLMEM_E_INVALID);
    /* a bad second state refuses the whole copy: the first one's slot 2
     * stays as it was (every state is checked before any is copied) */
    llmem_dtype keep = desc[1].dtype;
    desc[1].dtype = LLMEM_DTYPE_COUNT;
    ck_assert_int_eq(llmem_op_state_slot_copy(be, &view, 4, 2), LLMEM_E_INVALID);
    desc[1].dtype = keep;
    for (int j = 0; j < 2; j++) {
        size_t slot = (size_t)rs_desc_elems(&desc[j]) * llmem_dtype_size(desc[j].dtype);
        th_expect_same_bytes(th_snapshot(&c, bufs[j]), img[j], 5 * slot,
                             "state after a refused slot copy");
    }
    th_end(&c);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_mamba: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_mamba");
    TCase *tc = tcase_create("mamba");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_ssm_conv, 0, n);
    tcase_add_loop_test(tc, test_ssm_scan, 0, n);
    tcase_add_loop_test(tc, test_ssm_scan_fast, 0, n);
    tcase_add_loop_test(tc, test_mamba_resume, 0, n);
    tcase_add_loop_test(tc, test_mamba_decode_fold, 0, n);
    tcase_add_loop_test(tc, test_mamba_tables, 0, n);
    tcase_add_loop_test(tc, test_state_slot_copy, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return n > 0 && failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
