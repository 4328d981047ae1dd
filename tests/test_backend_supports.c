// ctest-labels: core
/* The capability query (issue 16): llmem_backend_supports answers per op
 * and operand dtype from the op contracts of <llmem/ops.h> (expected
 * answers below are read off those contracts, not off backends/op_info.c),
 * a NULL ops-table slot makes the op unsupported (unless its documented
 * fallback runs), a backend's supports_op slot can refuse a combination,
 * ops refuse views of another kind with a message naming both, and
 * llmem_model_load refuses a backend that lacks an op the model needs,
 * naming the op and the backend.
 */
#include "support/run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/backend_impl.h"
#include "llmem/llmem.h"
#include "llmem/ops_impl.h"
#include "llmem/runtime.h"

#define F32 LLMEM_DTYPE_F32
#define F16 LLMEM_DTYPE_F16
#define BF16 LLMEM_DTYPE_BF16
#define I32 LLMEM_DTYPE_I32
#define I8 LLMEM_DTYPE_I8

static llmem_backend *cpu(void)
{
    llmem_backend *be = NULL;
    char err[256];
    ck_assert_msg(llmem_backend_open("cpu", -1, &be, err, sizeof err) == LLMEM_OK, "%s", err);
    return be;
}

/* A CPU backend whose vtable and ops table are copies the test edits; the
 * original vtable is put back before closing. */
typedef struct patched {
    llmem_backend *be;
    const llmem_backend_i *orig;
    llmem_backend_i iface;
    struct llmem_ops_i ops;
} patched;

static void patch(patched *p)
{
    p->be = cpu();
    p->orig = p->be->iface;
    p->iface = *p->orig;
    p->ops = *p->orig->ops;
    p->iface.ops = &p->ops;
    p->be->iface = &p->iface;
}

static void unpatch(patched *p)
{
    p->be->iface = p->orig;
    llmem_backend_close(p->be);
}

START_TEST(test_supports_per_dtype)
{
    llmem_backend *be = cpu();
    /* matmul(a f32, w f32|f16|bf16, out f32) */
    ck_assert(llmem_backend_supports(be, LLMEM_OP_MATMUL, (llmem_dtype[]){F32, BF16, F32}, 3));
    ck_assert(llmem_backend_supports(be, LLMEM_OP_MATMUL, (llmem_dtype[]){F32, F16, F32}, 3));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_MATMUL, (llmem_dtype[]){F32, I32, F32}, 3));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_MATMUL, (llmem_dtype[]){BF16, BF16, F32}, 3));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_MATMUL, (llmem_dtype[]){F32, F32, F16}, 3));
    /* a prefix of the operands, or none */
    ck_assert(llmem_backend_supports(be, LLMEM_OP_MATMUL, (llmem_dtype[]){F32}, 1));
    ck_assert(llmem_backend_supports(be, LLMEM_OP_MATMUL, NULL, 0));
    /* get_rows(src f32|f16|bf16, idx i32, out f32) */
    ck_assert(llmem_backend_supports(be, LLMEM_OP_GET_ROWS, (llmem_dtype[]){F16, I32, F32}, 3));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_GET_ROWS, (llmem_dtype[]){F16, F32, F32}, 3));
    /* argmax(x f32, out i32) */
    ck_assert(llmem_backend_supports(be, LLMEM_OP_ARGMAX, (llmem_dtype[]){F32, I32}, 2));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_ARGMAX, (llmem_dtype[]){F32, F32}, 2));
    /* KV pools: f32, f16, bf16 and the scaled int8 / fp8 (cpu has them) */
    ck_assert(llmem_backend_supports(be, LLMEM_OP_KV_STORE, (llmem_dtype[]){BF16, F32, F32}, 3));
    ck_assert(llmem_backend_supports(be, LLMEM_OP_KV_STORE, (llmem_dtype[]){I8, F32, F32}, 3));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_KV_STORE, (llmem_dtype[]){I32, F32, F32}, 3));
    /* int8 states: read by ssm_scan, not by the conv */
    ck_assert(llmem_backend_supports(be, LLMEM_OP_SSM_SCAN, (llmem_dtype[]){I8}, 1));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_SSM_CONV, (llmem_dtype[]){I8}, 1));
    /* bad questions */
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_ARGMAX, (llmem_dtype[]){F32, I32, I32}, 3));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_ARGMAX, NULL, 1));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_ARGMAX, (llmem_dtype[]){F32}, -1));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_ARGMAX, (llmem_dtype[]){LLMEM_DTYPE_COUNT}, 1));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_COUNT, NULL, 0));
    ck_assert(!llmem_backend_supports(be, (llmem_op)-1, NULL, 0));
    ck_assert(!llmem_backend_supports(NULL, LLMEM_OP_MATMUL, NULL, 0));
    /* the CPU reference has every op */
    for (int op = 0; op < LLMEM_OP_COUNT; op++)
        ck_assert_msg(llmem_backend_supports(be, (llmem_op)op, NULL, 0), "cpu lacks %s",
                      llmem_op_name((llmem_op)op));
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_null_slots)
{
    patched p;
    patch(&p);
    p.ops.attention_paged = NULL;
    p.ops.matmul_swiglu = NULL;
    p.ops.matmul_fast = NULL;  /* falls back to matmul */
    p.ops.add_rms_norm = NULL; /* falls back to add + rms_norm */
    p.ops.copy_blocks = NULL;  /* falls back to buffer copies */
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_ATTENTION_PAGED, NULL, 0));
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_MATMUL_SWIGLU, NULL, 0));
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_MATMUL_FAST, NULL, 0));
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_ADD_RMS_NORM, NULL, 0));
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_COPY_BLOCKS, NULL, 0));
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_KV_PAGE_COPY, NULL, 0));
    p.ops.matmul = NULL; /* now matmul_fast has nothing to fall back to */
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_MATMUL_FAST, NULL, 0));
    p.ops.rms_norm = NULL;
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_ADD_RMS_NORM, NULL, 0));
    /* an older, shorter table: slots past struct_size are absent */
    p.ops = *p.orig->ops;
    p.ops.struct_size = offsetof(struct llmem_ops_i, gdn);
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_GDN, NULL, 0));
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_SSM_SCAN1, NULL, 0));
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_ADD_RMS_NORM, NULL, 0));
    /* no ops table at all */
    p.iface.ops = NULL;
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_ADD, NULL, 0));
    unpatch(&p);
}
END_TEST

static int32_t asked_op = -1, asked_n = -1;

/* A backend whose kernels refuse int8 states in ssm_scan. */
static bool no_i8_scan(llmem_backend *be, int32_t op, const llmem_dtype *dt, int32_t n)
{
    (void)be;
    asked_op = op;
    asked_n = n;
    return !(op == LLMEM_OP_SSM_SCAN && n >= 1 && dt[0] == I8);
}

START_TEST(test_backend_query_slot)
{
    patched p;
    patch(&p);
    p.iface.supports_op = no_i8_scan;
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_SSM_SCAN, (llmem_dtype[]){I8}, 1));
    ck_assert_int_eq(asked_op, LLMEM_OP_SSM_SCAN);
    ck_assert_int_eq(asked_n, 1);
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_SSM_SCAN, (llmem_dtype[]){F32}, 1));
    /* the core's own refusals come first: the slot is not asked */
    asked_op = -1;
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_SSM_CONV, (llmem_dtype[]){I32}, 1));
    ck_assert_int_eq(asked_op, -1);
    /* a vtable too old to have the slot: not asked */
    p.iface.struct_size = offsetof(llmem_backend_i, supports_op);
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_SSM_SCAN, (llmem_dtype[]){I8}, 1));
    unpatch(&p);
}
END_TEST

START_TEST(test_op_names_and_view_kinds)
{
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_KV_STORE), "kv_store");
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_SSM_SCAN1), "ssm_scan1");
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_COUNT), "unknown");
    /* every id has a table line */
    for (int op = 0; op < LLMEM_OP_COUNT; op++)
        ck_assert_str_ne(llmem_op_name((llmem_op)op), "unknown");
    ck_assert_uint_eq(llmem_op_view_kind(LLMEM_OP_ATTENTION_PAGED), LLMEM_VIEW_KV);
    ck_assert_uint_eq(llmem_op_view_kind(LLMEM_OP_GDN), LLMEM_VIEW_RECURRENT);
    ck_assert_uint_eq(llmem_op_view_kind(LLMEM_OP_MATMUL), LLMEM_VIEW_NONE);
    ck_assert_int_eq(llmem_op_n_operands(LLMEM_OP_MATMUL), 3);
    ck_assert_int_eq(llmem_op_n_operands(LLMEM_OP_SSM_SCAN), 7);

    char err[256];
    llmem_kv_view kv = {0};
    llmem_view v = llmem_view_make(LLMEM_VIEW_KV, &kv, sizeof kv, NULL);
    ck_assert_int_eq(llmem_op_check_view(LLMEM_OP_KV_STORE, &v, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_op_check_view(LLMEM_OP_SSM_SCAN, &v, err, sizeof err),
                     LLMEM_E_INVALID);
    ck_assert_str_eq(err, "op ssm_scan accepts views of kind recurrent, not kv");
    llmem_view tag = llmem_view_make(LLMEM_VIEW_KIND_TAG('m', 'l', 'a', '0'), &kv, sizeof kv,
                                     NULL);
    ck_assert_int_eq(llmem_op_check_view(LLMEM_OP_ATTENTION_PAGED, &tag, err, sizeof err),
                     LLMEM_E_INVALID);
    ck_assert_str_eq(err, "op attention_paged accepts views of kind kv, not mla0");
    llmem_view small = llmem_view_make(LLMEM_VIEW_KV, &kv, 8, NULL);
    ck_assert_int_eq(llmem_op_check_view(LLMEM_OP_KV_STORE, &small, err, sizeof err),
                     LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_check_view(LLMEM_OP_MATMUL, &v, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_check_view(LLMEM_OP_KV_STORE, NULL, err, sizeof err),
                     LLMEM_E_INVALID);
    /* the wrapper refuses the out-of-tree kind before anything else */
    llmem_backend *be = cpu();
    ck_assert_int_eq(llmem_op_kv_page_copy(be, &tag, 0, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_rope_shift(be, &(llmem_rope_params){LLMEM_ROPE_NEOX, 2, 1e4f, 1.0f},
                                         &tag),
                     LLMEM_E_INVALID);
    llmem_backend_close(be);
}
END_TEST

static const char *fixture(const char *name)
{
    static char p[4096];
    snprintf(p, sizeof p, "%s/tests/fixtures/%s", LLMEM_SOURCE_DIR, name);
    return p;
}

/* Loads fixture `name` on a CPU backend whose ops table lacks one slot
 * (cleared by clear()) and expects the load to fail naming op and backend. */
static void load_without(const char *name, void (*clear)(struct llmem_ops_i *), const char *op)
{
    patched p;
    patch(&p);
    clear(&p.ops);
    llmem_model_params mp = llmem_model_default_params();
    mp.n_seq_max = 1;
    mp.n_ctx = 32;
    mp.n_ubatch = 8;
    llmem_model *m = (llmem_model *)&p; /* must be reset to NULL */
    char err[512] = "";
    ck_assert_int_eq(llmem_model_load(fixture(name), p.be, &mp, &m, err, sizeof err),
                     LLMEM_E_UNSUPPORTED);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, op) && strstr(err, "the cpu backend does not support op"),
                  "%s", err);
    unpatch(&p);
    /* the complete backend loads the same model */
    llmem_backend *be = cpu();
    ck_assert_msg(llmem_model_load(fixture(name), be, &mp, &m, err, sizeof err) == LLMEM_OK, "%s",
                  err);
    llmem_model_free(m);
    llmem_backend_close(be);
}

static void no_attention(struct llmem_ops_i *o) { o->attention_paged = NULL; }
static void no_gdn(struct llmem_ops_i *o) { o->gdn = NULL; }
static void no_swiglu(struct llmem_ops_i *o) { o->swiglu = NULL; }
static void no_short_conv(struct llmem_ops_i *o) { o->short_conv = NULL; }

START_TEST(test_model_load_refuses_missing_op)
{
    load_without("llama", no_attention, "op attention_paged (operand dtypes f32, f32, f32)");
    load_without("llama", no_swiglu, "op swiglu");
    load_without("qwen3_next", no_gdn, "op gdn, which this qwen3_next model needs for layer 0 (gdn)");
    load_without("lfm2", no_short_conv, "op short_conv");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backend_supports");
    TCase *tc = tcase_create("backend_supports");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_supports_per_dtype);
    tcase_add_test(tc, test_null_slots);
    tcase_add_test(tc, test_backend_query_slot);
    tcase_add_test(tc, test_op_names_and_view_kinds);
    tcase_add_test(tc, test_model_load_refuses_missing_op);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
