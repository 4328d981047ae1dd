// ctest-labels: core
/* Op conformance suite: the one-token attention prologue, rope of q and k
 * in place then kv_store of k and v, as models/forward.c calls it at
 * decode (see test_ops.c for the conventions). The Vulkan backend runs
 * the three calls as one dispatch (shaders/rope_store.comp, held back
 * until the store; LLMEM_VULKAN_ROPE_STORE=0 turns that off): every case
 * is checked against float64 RoPE (RoFormer, Su et al. 2021, eq. 34) and
 * the pools' rounding, and bit for bit against the same calls with the
 * fusion off, on every backend. Slots the store does not name keep their
 * bytes; v is never written.
 */
#include "support/run.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/backend.h"
#include "llmem/ops.h"
#include "support/ops_harness.h"
#include "support/ref64.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16
#define I32 LLMEM_DTYPE_I32
#define N_SLOTS 12

/* How the calls are made: q and k apart (two ropes), q and k adjacent in
 * one rope over both, or the two ropes with a download of k before the
 * store (nothing may fold across it). */
enum { SPLIT, JOINED, READ_BETWEEN, N_MODES };

typedef struct rs_case {
    int32_t hq, hk, hd, n_rot, neox;
} rs_case;

typedef struct rs_out {
    unsigned char *scratch, *kp, *vp; /* host copies after the calls */
} rs_out;

/* Runs the calls on be with the scratch [q | pad | k | pad | v] f32 and
 * the pools of t, from the host values given; fills *o. */
static void rs_run(llmem_backend *be, th_ctx *c, const rs_case *k, llmem_dtype t, int mode,
                   const double *q0, const double *k0, const double *v0, const unsigned char *pool0,
                   int32_t pos, const int32_t *slots, int32_t n_store, rs_out *o)
{
    size_t nq = (size_t)k->hq * k->hd, nk = (size_t)k->hk * k->hd;
    size_t qo = 0, ko = mode == JOINED ? nq * 4 : nq * 4 + 256, vo = ko + nk * 4 + 64;
    size_t bytes = vo + nk * 4 + 128;
    llmem_buffer *s = th_pool(c, bytes, F32);
    llmem_tensor q = llmem_tensor_3d(s, qo, F32, 1, k->hq, k->hd);
    llmem_tensor kt = llmem_tensor_3d(s, ko, F32, 1, k->hk, k->hd);
    llmem_tensor vt = llmem_tensor_3d(s, vo, F32, 1, k->hk, k->hd);
    llmem_tensor qk = llmem_tensor_3d(s, qo, F32, 1, k->hq + k->hk, k->hd);
    th_set(&q, q0);
    th_set(&kt, k0);
    th_set(&vt, v0);
    llmem_tensor pt = th_tensor(c, I32, 1, 1, 0, 0);
    th_set_i32(&pt, &pos);
    size_t es = llmem_dtype_size(t), pool_bytes = (size_t)N_SLOTS * nk * es;
    llmem_kv_view kvd = {0};
    llmem_kv_view *kv = &kvd;
    llmem_view view = llmem_view_make(LLMEM_VIEW_KV, kv, sizeof *kv, NULL);
    kv->dtype = t;
    kv->n_pages = N_SLOTS / 4;
    kv->page_size = 4;
    kv->n_kv_heads = k->hk;
    kv->head_dim = k->hd;
    kv->k = th_pool(c, pool_bytes, t);
    kv->v = th_pool(c, pool_bytes, t);
    ck_assert_int_eq(llmem_buffer_upload(kv->k, 0, pool0, pool_bytes), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(kv->v, 0, pool0 + pool_bytes, pool_bytes), LLMEM_OK);
    int32_t toks[4] = {0, 0, 0, 0};
    th_idx b = {0};
    kv->store_tok = th_idx_add(&b, toks, n_store);
    kv->store_slot = th_idx_add(&b, slots, n_store);
    llmem_i32_table *tabs[] = {&kv->store_tok, &kv->store_slot};
    view.idx = th_idx_finish(c, &b, tabs, 2);
    llmem_rope_params p = {k->neox ? LLMEM_ROPE_NEOX : LLMEM_ROPE_NORMAL, k->n_rot, 10000.0f, 1.0f};
    if (mode == JOINED) {
        ck_assert_int_eq(llmem_op_rope(be, &p, &qk, &pt, &qk), LLMEM_OK);
    } else {
        ck_assert_int_eq(llmem_op_rope(be, &p, &q, &pt, &q), LLMEM_OK);
        ck_assert_int_eq(llmem_op_rope(be, &p, &kt, &pt, &kt), LLMEM_OK);
    }
    if (mode == READ_BETWEEN)
        th_snapshot(c, s);
    ck_assert_int_eq(llmem_op_kv_store(be, &view, &kt, &vt), LLMEM_OK);
    o->scratch = th_snapshot(c, s);
    o->kp = th_snapshot(c, kv->k);
    o->vp = th_snapshot(c, kv->v);
}

static void set_fusion(llmem_backend *be, int on)
{
    ck_assert_int_eq(setenv("LLMEM_VULKAN_ROPE_STORE", on ? "1" : "0", 1), 0);
    ck_assert_int_eq(llmem_backend_reload_env(be), LLMEM_OK);
}

START_TEST(test_rope_store)
{
    static const rs_case cases[] = {
        {4, 2, 64, 64, 1}, {3, 1, 80, 40, 1}, {2, 2, 128, 128, 0}, {2, 1, 32, 2, 0}, {1, 1, 256, 128, 1},
    };
    llmem_backend *be = th_open(_i);
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        for (int dt = 0; dt < 3; dt++) {
            for (int mode = 0; mode < N_MODES; mode++) {
                const rs_case *k = &cases[ci];
                llmem_dtype t = (llmem_dtype[]){F32, F16, BF16}[dt];
                ref64_rng r = ref64_rng_make(ref64_seed(), 4000 + ci * 16 + dt * 4 + mode);
                th_ctx c;
                th_begin(&c, be);
                int64_t nq = (int64_t)k->hq * k->hd, nk = (int64_t)k->hk * k->hd;
                double *q0 = th_vec(&c, nq), *k0 = th_vec(&c, nk), *v0 = th_vec(&c, nk);
                ref64_fill(&r, q0, nq, -2, 2, F32);
                ref64_fill(&r, k0, nk, -2, 2, F32);
                ref64_fill(&r, v0, nk, -2, 2, F32);
                size_t es = llmem_dtype_size(t), pool_bytes = (size_t)N_SLOTS * (size_t)nk * es;
                unsigned char *pool0 = th_alloc(&c, 2 * pool_bytes);
                for (size_t i = 0; i < 2 * pool_bytes; i++) /* finite values: any byte of a word */
                    pool0[i] = (unsigned char)(ref64_next(&r) & 0x3f);
                int32_t pos = ref64_int(&r, 0, 70000);
                int32_t slots[2] = {ref64_int(&r, 0, N_SLOTS / 2 - 1),
                                    ref64_int(&r, N_SLOTS / 2, N_SLOTS - 1)};
                int32_t n_store = 1 + (int32_t)(ci % 2); /* one token in 1 or 2 sequences */
                rs_out on, off;
                set_fusion(be, 1);
                rs_run(be, &c, k, t, mode, q0, k0, v0, pool0, pos, slots, n_store, &on);
                set_fusion(be, 0);
                rs_run(be, &c, k, t, mode, q0, k0, v0, pool0, pos, slots, n_store, &off);
                set_fusion(be, 1);
                char what[128];
                snprintf(what, sizeof what, "rope_store hq=%d hk=%d hd=%d n_rot=%d %s mode %d",
                         k->hq, k->hk, k->hd, k->n_rot, llmem_dtype_name(t), mode);
                size_t ko = mode == JOINED ? (size_t)nq * 4 : (size_t)nq * 4 + 256;
                size_t vo = ko + (size_t)nk * 4 + 64, bytes = vo + (size_t)nk * 4 + 128;
                /* fused and unfused: the same bytes everywhere */
                th_expect_same_bytes(on.scratch, off.scratch, bytes, what);
                th_expect_same_bytes(on.kp, off.kp, pool_bytes, what);
                th_expect_same_bytes(on.vp, off.vp, pool_bytes, what);
                /* against float64 */
                llmem_rope_params p = {k->neox ? LLMEM_ROPE_NEOX : LLMEM_ROPE_NORMAL, k->n_rot,
                                       10000.0f, 1.0f};
                double *qr = th_vec(&c, nq), *kr = th_vec(&c, nk), *got = th_vec(&c, nq);
                for (int32_t h = 0; h < k->hq; h++)
                    ref64_rope(&p, k->hd, pos, q0 + h * k->hd, qr + h * k->hd);
                for (int32_t h = 0; h < k->hk; h++)
                    ref64_rope(&p, k->hd, pos, k0 + h * k->hd, kr + h * k->hd);
                for (int64_t e = 0; e < nq; e++)
                    got[e] = ref64_decode(on.scratch + e * 4, F32);
                th_expect_close(got, qr, nq, 1e-5, what);
                for (int64_t e = 0; e < nk; e++)
                    got[e] = ref64_decode(on.scratch + ko + e * 4, F32);
                th_expect_close(got, kr, nk, 1e-5, what);
                for (int64_t e = 0; e < nk; e++) /* v unchanged */
                    if (ref64_decode(on.scratch + vo + e * 4, F32) != v0[e])
                        ck_abort_msg("%s: v element %lld changed", what, (long long)e);
                double *kp = th_vec(&c, nk), *vp = th_vec(&c, nk);
                for (int32_t sl = 0; sl < N_SLOTS; sl++) {
                    size_t at = (size_t)sl * (size_t)nk * es;
                    bool stored = sl == slots[0] || (n_store > 1 && sl == slots[1]);
                    if (!stored) {
                        th_expect_same_bytes(on.kp + at, pool0 + at, (size_t)nk * es, what);
                        th_expect_same_bytes(on.vp + at, pool0 + pool_bytes + at, (size_t)nk * es,
                                             what);
                        continue;
                    }
                    for (int64_t e = 0; e < nk; e++) {
                        kp[e] = ref64_decode(on.kp + at + e * es, t);
                        vp[e] = ref64_decode(on.vp + at + e * es, t);
                    }
                    th_expect_close(kp, kr, nk, ref64_tol(t, false) + 1e-5, what);
                    th_expect_close(vp, v0, nk, ref64_tol(t, false), what);
                }
                th_end(&c);
            }
        }
    }
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    printf("test_ops_rope_store: seed %llu (LLMEM_TEST_SEED=<n> repeats a run)\n",
           (unsigned long long)ref64_seed());
    int n = th_backends_probe();
    Suite *s = suite_create("ops_rope_store");
    TCase *tc = tcase_create("rope_store");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_rope_store, 0, n);
    suite_add_tcase(s, tc);
    int failed = test_run_suite(s);
    return n > 0 && failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
