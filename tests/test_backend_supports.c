// ctest-labels: core
/* The capability query (issue 16): llmem_backend_supports answers per op
 * and operand dtype from the op contracts of <llmem/ops.h> and
 * <llmem/ops_gdn.h> (expected answers below are read off those contracts,
 * not off backends/op_info.c or backends/ops_gdn.c), a NULL ops-table slot
 * makes the op unsupported (unless its documented fallback runs), a missing
 * open-op implementation likewise, a backend's supports_op slot can refuse
 * a combination, ops refuse views of another kind with a message naming
 * both, and llmem_model_load refuses a backend that lacks an op the model
 * needs, naming the op and the backend. Open ops: the registry refuses
 * bad and clashing registrations and leaves itself unchanged, and an op
 * registered here, outside the library, with an implementation in a
 * backend's list, is found, queried and called like a built-in one.
 */
#include "support/run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/backend_impl.h"
#include "llmem/llmem.h"
#include "llmem/ops_gdn.h"
#include "llmem/ops_moe.h"
#include "llmem/ops_ssm1.h"
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

#define MAX_IMPLS 64

/* A CPU backend whose vtable, ops table and list of open-op
 * implementations are copies the test edits; the original vtable is put
 * back before closing. */
typedef struct patched {
    llmem_backend *be;
    const llmem_backend_i *orig;
    llmem_backend_i iface;
    struct llmem_ops_i ops;
    llmem_op_impl impls[MAX_IMPLS];
    const llmem_op_impl *impl_head;
    int n_impls;
} patched;

/* Rebuilds p's list from p->impls[0 .. n_impls). */
static void relink(patched *p)
{
    p->impl_head = NULL;
    for (int i = p->n_impls - 1; i >= 0; i--) {
        p->impls[i].next = p->impl_head;
        p->impl_head = &p->impls[i];
    }
}

/* Drops op from p's list. */
static void drop_impl(patched *p, llmem_op op)
{
    int k = 0;
    for (int i = 0; i < p->n_impls; i++)
        if (p->impls[i].op != op)
            p->impls[k++] = p->impls[i];
    ck_assert_int_lt(k, p->n_impls); /* it was there */
    p->n_impls = k;
    relink(p);
}

static void patch(patched *p)
{
    p->be = cpu();
    p->orig = p->be->iface;
    p->iface = *p->orig;
    p->ops = *p->orig->ops;
    p->iface.ops = &p->ops;
    p->n_impls = 0;
    ck_assert_ptr_nonnull(p->orig->op_impls);
    for (const llmem_op_impl *i = *p->orig->op_impls; i; i = i->next) {
        ck_assert_int_lt(p->n_impls, MAX_IMPLS);
        p->impls[p->n_impls++] = *i;
    }
    relink(p);
    p->iface.op_impls = &p->impl_head;
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
    /* open ops: gdn(view f32|f16|bf16, qkv, a, b f32, a_log, dt_bias f32|f16|bf16,
     * out f32); sigmoid_mul(x, gate, out f32) */
    ck_assert(llmem_backend_supports(be, LLMEM_OP_GDN,
                                     (llmem_dtype[]){BF16, F32, F32, F32, BF16, F16, F32}, 7));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_GDN,
                                      (llmem_dtype[]){F32, F16, F32, F32, F32, F32, F32}, 7));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_GDN, (llmem_dtype[]){I8}, 1));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_GDN, (llmem_dtype[8]){F32}, 8));
    ck_assert(llmem_backend_supports(be, LLMEM_OP_SIGMOID_MUL, (llmem_dtype[]){F32, F32, F32}, 3));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_SIGMOID_MUL, (llmem_dtype[]){F32, BF16}, 2));
    /* an unregistered tag; the numbers gdn and sigmoid_mul had before */
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_TAG('n', 'o', 'n', 'e'), NULL, 0));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_RESERVED_29_, NULL, 0));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_RESERVED_30_, NULL, 0));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_RESERVED_33_, NULL, 0));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_RESERVED_34_, NULL, 0));
    /* short_conv(view f32|f16|bf16, bcx f32, w, b f32|f16|bf16, out f32);
     * ssm_scan1(view, x, dt, b, c f32, a_log, d, dt_bias f32|f16|bf16, z, y f32) */
    ck_assert(llmem_backend_supports(be, LLMEM_OP_SHORT_CONV,
                                     (llmem_dtype[]){F16, F32, BF16, F16, F32}, 5));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_SHORT_CONV, (llmem_dtype[]){F32, BF16}, 2));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_SHORT_CONV, (llmem_dtype[]){I8}, 1));
    ck_assert(llmem_backend_supports(
        be, LLMEM_OP_SSM_SCAN1,
        (llmem_dtype[]){F32, F32, F32, F32, F32, BF16, F16, F32, F32, F32}, 10));
    ck_assert(!llmem_backend_supports(
        be, LLMEM_OP_SSM_SCAN1,
        (llmem_dtype[]){F32, F32, F32, F32, F32, BF16, F16, F32, F16, F32}, 10));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_SSM_SCAN1, (llmem_dtype[]){I8}, 1));
    /* moe_route(logits f32, bias f32|f16|bf16, ids i32, weights f32);
     * moe_ffn(x f32, ids i32, weights f32, w_up, w_down f32|f16|bf16, out f32) */
    ck_assert(llmem_backend_supports(be, LLMEM_OP_MOE_ROUTE, (llmem_dtype[]){F32, BF16, I32, F32},
                                     4));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_MOE_ROUTE, (llmem_dtype[]){F32, F32, F32}, 3));
    ck_assert(llmem_backend_supports(be, LLMEM_OP_MOE_FFN,
                                     (llmem_dtype[]){F32, I32, F32, F16, F16, F32}, 6));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_MOE_FFN, (llmem_dtype[]){F32, I32, F32, I32},
                                      4));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_RESERVED_25_, NULL, 0));
    ck_assert(!llmem_backend_supports(be, LLMEM_OP_RESERVED_26_, NULL, 0));
    /* the CPU reference has every op, numbered or open */
    llmem_op ids[256];
    int32_t n = llmem_op_list(ids, 256);
    ck_assert_int_gt(n, 2);
    ck_assert_int_le(n, 256);
    for (int32_t k = 0; k < n; k++)
        ck_assert_msg(llmem_backend_supports(be, ids[k], NULL, 0), "cpu lacks %s",
                      llmem_op_name(ids[k]));
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
    p.ops.struct_size = offsetof(struct llmem_ops_i, geglu);
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_GEGLU, NULL, 0));
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_SOFTCAP, NULL, 0));
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_ADD_RMS_NORM, NULL, 0));
    /* open ops: absent from the list, no list, or a vtable older than the list */
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_GDN, NULL, 0));
    drop_impl(&p, LLMEM_OP_GDN);
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_GDN, NULL, 0));
    ck_assert(llmem_backend_supports(p.be, LLMEM_OP_SIGMOID_MUL, NULL, 0));
    p.iface.struct_size = offsetof(llmem_backend_i, op_impls);
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_SIGMOID_MUL, NULL, 0));
    p.iface.struct_size = sizeof(llmem_backend_i);
    p.iface.op_impls = NULL;
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_SIGMOID_MUL, NULL, 0));
    /* the wrapper says so too, after its own checks */
    ck_assert_int_eq(llmem_op_sigmoid_mul(p.be, NULL, NULL, NULL), LLMEM_E_UNSUPPORTED);
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
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_SHORT_CONV), "short_conv");
    ck_assert_uint_eq(llmem_op_view_kind(LLMEM_OP_SHORT_CONV), LLMEM_VIEW_RECURRENT);
    ck_assert_int_eq(llmem_op_n_operands(LLMEM_OP_SSM_SCAN1), 10);
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_COUNT), "unknown");
    ck_assert_uint_eq(llmem_op_view_kind(LLMEM_OP_ATTENTION_PAGED), LLMEM_VIEW_KV);
    ck_assert_uint_eq(llmem_op_view_kind(LLMEM_OP_GDN), LLMEM_VIEW_RECURRENT);
    ck_assert_uint_eq(llmem_op_view_kind(LLMEM_OP_SIGMOID_MUL), LLMEM_VIEW_NONE);
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_GDN), "gdn");
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_SIGMOID_MUL), "sigmoid_mul");
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_RESERVED_29_), "unknown");
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_TAG('n', 'o', 'n', 'e')), "unknown");
    ck_assert_int_eq(llmem_op_n_operands(LLMEM_OP_GDN), 7);
    ck_assert_int_eq(llmem_op_n_operands(LLMEM_OP_SIGMOID_MUL), 3);
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
    ck_assert_int_eq(llmem_op_check_view(LLMEM_OP_GDN, &v, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_str_eq(err, "op gdn accepts views of kind recurrent, not kv");
    ck_assert_int_eq(llmem_op_check_view(LLMEM_OP_SIGMOID_MUL, &v, err, sizeof err),
                     LLMEM_E_INVALID);
    ck_assert_str_eq(err, "op sigmoid_mul takes no view");
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

static int count_of(const llmem_op *ids, int32_t n, llmem_op op)
{
    int c = 0;
    for (int32_t k = 0; k < n; k++)
        c += ids[k] == op;
    return c;
}

/* Every op id the process knows: the numbered ones ascending, then the
 * open ones by ascending tag; no id or name twice; every in-tree
 * registration succeeded. */
START_TEST(test_op_list)
{
    char err[256] = "";
    ck_assert_msg(llmem_op_registry_check(err, sizeof err) == LLMEM_OK, "%s", err);
    int32_t n = llmem_op_list(NULL, 0);
    ck_assert_int_gt(n, 0);
    llmem_op *ids = calloc((size_t)n + 1, sizeof *ids);
    ck_assert_ptr_nonnull(ids);
    ids[n] = -7;
    ck_assert_int_eq(llmem_op_list(ids, n), n);
    ck_assert_int_eq(ids[n], -7); /* nothing past cap */
    bool gdn = false, smul = false;
    int32_t numbered = 0;
    for (int32_t k = 0; k < n; k++) {
        ck_assert_str_ne(llmem_op_name(ids[k]), "unknown");
        if (k > 0)
            ck_assert_uint_lt((uint32_t)ids[k - 1], (uint32_t)ids[k]);
        for (int32_t j = 0; j < k; j++)
            ck_assert_str_ne(llmem_op_name(ids[j]), llmem_op_name(ids[k]));
        numbered += ids[k] < LLMEM_OP_COUNT;
        gdn |= ids[k] == LLMEM_OP_GDN;
        smul |= ids[k] == LLMEM_OP_SIGMOID_MUL;
    }
    ck_assert(gdn && smul);
    ck_assert_int_eq(count_of(ids, n, LLMEM_OP_SHORT_CONV), 1);
    ck_assert_int_eq(count_of(ids, n, LLMEM_OP_SSM_SCAN1), 1);
    /* the numbered ops of ops.h: every id below LLMEM_OP_COUNT but the six reserved ones */
    ck_assert_int_eq(numbered, LLMEM_OP_COUNT - 6);
    ck_assert_int_eq(count_of(ids, n, LLMEM_OP_MOE_ROUTE), 1);
    ck_assert_int_eq(count_of(ids, n, LLMEM_OP_MOE_FFN), 1);
    /* a short array gets a prefix, and the total */
    llmem_op two[2] = {-1, -1};
    ck_assert_int_eq(llmem_op_list(two, 2), n);
    ck_assert_int_eq(two[0], ids[0]);
    ck_assert_int_eq(two[1], ids[1]);
    ck_assert_int_eq(llmem_op_list(NULL, 1), -1);
    ck_assert_int_eq(llmem_op_list(two, -1), -1);
    /* the registered infos are the ops' own */
    const llmem_op_info *gi = llmem_op_info_find(LLMEM_OP_GDN);
    ck_assert_ptr_nonnull(gi);
    ck_assert_str_eq(gi->name, "gdn");
    ck_assert_uint_eq(gi->layout, LLMEM_OP_GDN_LAYOUT);
    ck_assert_ptr_null(llmem_op_info_find(LLMEM_OP_MATMUL)); /* numbered: no info */
    free(ids);
}
END_TEST

/* ---- an op registered outside the library: out = a * 2 + (optional) b ---- */

#define TST_OP LLMEM_OP_TAG('t', 's', 't', '2')
#define TST_LAYOUT LLMEM_OP_LAYOUT(0, 1)
typedef llmem_status (*tst_fn)(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *out);

static llmem_op_info tst_info = {
    .struct_size = sizeof(llmem_op_info),
    .op = TST_OP,
    .name = "test_twice",
    .view = LLMEM_VIEW_NONE,
    .n_operands = 2,
    .dtypes = {1u << F32, (1u << F32) | (1u << F16)},
    .layout = TST_LAYOUT,
};

static int tst_calls;

/* The "kernel": counts its calls (the test only checks dispatch). */
static llmem_status tst_impl(llmem_backend *be, const llmem_tensor *a, const llmem_tensor *out)
{
    (void)be;
    (void)a;
    (void)out;
    tst_calls++;
    return LLMEM_OK;
}

/* A list filled by the macro backends use, at load (constructor). */
LLMEM_OP_IMPL_LIST(tst_impls);
LLMEM_OP_IMPL(tst_impls, TST_OP, TST_LAYOUT, tst_fn, tst_impl);

/* Which ops take a recurrent view with a snapshot inside the ubatch
 * (llmem_rs_view.snap_slot): Mamba-2's conv and scan, and open ops that
 * declare LLMEM_OP_WRITES_SNAPSHOT (gdn, short_conv, ssm_scan1); every
 * other recurrent op refuses it with LLMEM_E_UNSUPPORTED, among them an
 * open op registered without the flag or with an info from before it
 * (LLMEM_OP_INFO_V1_SIZE, which still registers). */
static llmem_op_info snap_yes = {
    .struct_size = sizeof(llmem_op_info),
    .op = LLMEM_OP_TAG('t', 's', 'n', 'y'),
    .name = "test_snap_yes",
    .view = LLMEM_VIEW_RECURRENT,
    .view_desc_min = LLMEM_RS_VIEW_V1_SIZE,
    .n_operands = 1,
    .dtypes = {1u << F32},
    .flags = LLMEM_OP_WRITES_SNAPSHOT,
};
static llmem_op_info snap_old; /* snap_yes as an info from before `flags` */

START_TEST(test_snapshot_views)
{
    snap_old = snap_yes; /* its flags lie past its struct_size: not read */
    snap_old.struct_size = LLMEM_OP_INFO_V1_SIZE;
    snap_old.op = LLMEM_OP_TAG('t', 's', 'n', 'o');
    snap_old.name = "test_snap_old";
    ck_assert_int_eq(llmem_op_register(&snap_yes), LLMEM_OK);
    ck_assert_int_eq(llmem_op_register(&snap_old), LLMEM_OK);
    int32_t tok = 0, slot = 1;
    llmem_rs_view rs = {0}, plain = {0};
    rs.snap_tok = (llmem_i32_table){&tok, 0, 1};
    rs.snap_slot = (llmem_i32_table){&slot, 4, 1};
    llmem_view with = llmem_view_make(LLMEM_VIEW_RECURRENT, &rs, sizeof rs, NULL);
    llmem_view without = llmem_view_make(LLMEM_VIEW_RECURRENT, &plain, sizeof plain, NULL);
    llmem_view v1 = llmem_view_make(LLMEM_VIEW_RECURRENT, &rs, LLMEM_RS_VIEW_V1_SIZE, NULL);
    const llmem_op takes[] = {LLMEM_OP_SSM_CONV, LLMEM_OP_SSM_SCAN, LLMEM_OP_GDN,
                              LLMEM_OP_SHORT_CONV, LLMEM_OP_SSM_SCAN1, snap_yes.op};
    const llmem_op refuses[] = {LLMEM_OP_STATE_SLOT_COPY, snap_old.op};
    char err[160];
    for (size_t i = 0; i < sizeof takes / sizeof takes[0]; i++) {
        ck_assert_int_eq(llmem_op_check_view(takes[i], &with, NULL, 0), LLMEM_OK);
        ck_assert_int_eq(llmem_op_check_view(takes[i], &without, NULL, 0), LLMEM_OK);
    }
    for (size_t i = 0; i < sizeof refuses / sizeof refuses[0]; i++) {
        err[0] = 0;
        ck_assert_int_eq(llmem_op_check_view(refuses[i], &with, err, sizeof err),
                         LLMEM_E_UNSUPPORTED);
        ck_assert_msg(strstr(err, "snapshot inside the ubatch"), "%s", err);
        ck_assert_int_eq(llmem_op_check_view(refuses[i], &without, NULL, 0), LLMEM_OK);
        /* a description from before the tables has no snapshot */
        ck_assert_int_eq(llmem_op_check_view(refuses[i], &v1, NULL, 0), LLMEM_OK);
    }
}
END_TEST

START_TEST(test_out_of_tree_op)
{
    char err[256] = "";
    ck_assert_msg(llmem_op_registry_check(err, sizeof err) == LLMEM_OK, "%s", err);
    int32_t n0 = llmem_op_list(NULL, 0);
    /* unknown before registration */
    ck_assert_str_eq(llmem_op_name(TST_OP), "unknown");
    ck_assert_ptr_null(llmem_op_info_find(TST_OP));

    /* refused registrations change nothing */
    llmem_op_info bad = tst_info;
    bad.op = LLMEM_OP_MATMUL; /* a numbered id */
    ck_assert_int_eq(llmem_op_register(&bad), LLMEM_E_INVALID);
    bad.op = LLMEM_OP_TAG('t', 's', ' ', '2'); /* a space is not a tag character */
    ck_assert_int_eq(llmem_op_register(&bad), LLMEM_E_INVALID);
    bad = tst_info;
    bad.struct_size = offsetof(llmem_op_info, next);
    ck_assert_int_eq(llmem_op_register(&bad), LLMEM_E_ABI);
    bad = tst_info;
    bad.n_operands = LLMEM_OP_MAX_OPERANDS + 1;
    ck_assert_int_eq(llmem_op_register(&bad), LLMEM_E_INVALID);
    bad = tst_info;
    bad.name = NULL;
    ck_assert_int_eq(llmem_op_register(&bad), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_register(NULL), LLMEM_E_INVALID);
    bad = tst_info;
    bad.op = LLMEM_OP_GDN; /* gdn's tag */
    ck_assert_int_eq(llmem_op_register(&bad), LLMEM_E_STATE);
    bad = tst_info;
    bad.name = "gdn"; /* an open op's name */
    ck_assert_int_eq(llmem_op_register(&bad), LLMEM_E_STATE);
    bad.name = "matmul"; /* a numbered op's name */
    ck_assert_int_eq(llmem_op_register(&bad), LLMEM_E_STATE);
    ck_assert_int_eq(llmem_op_list(NULL, 0), n0);
    ck_assert_str_eq(llmem_op_name(TST_OP), "unknown");
    ck_assert_str_eq(llmem_op_name(LLMEM_OP_GDN), "gdn");
    /* the first failure is reported */
    ck_assert_int_eq(llmem_op_registry_check(err, sizeof err), LLMEM_E_INVALID);
    ck_assert_msg(strstr(err, "test_twice") && strstr(err, "not a four-character tag"), "%s",
                  err);

    /* registered: named, listed, and asked like a built-in op */
    ck_assert_int_eq(llmem_op_register(&tst_info), LLMEM_OK);
    ck_assert_int_eq(llmem_op_register(&tst_info), LLMEM_E_STATE); /* twice */
    ck_assert_str_eq(llmem_op_name(TST_OP), "test_twice");
    ck_assert_int_eq(llmem_op_n_operands(TST_OP), 2);
    ck_assert_int_eq(llmem_op_list(NULL, 0), n0 + 1);
    ck_assert_ptr_eq(llmem_op_info_find(TST_OP), &tst_info);

    /* the cpu backend has no implementation of it */
    patched p;
    patch(&p);
    ck_assert(!llmem_backend_supports(p.be, TST_OP, NULL, 0));
    ck_assert(llmem_backend_op_impl(p.be, &tst_info) == NULL);
    /* a backend whose list has it (the list the macro filled) */
    p.iface.op_impls = &tst_impls;
    ck_assert_ptr_nonnull(tst_impls);
    ck_assert(llmem_backend_supports(p.be, TST_OP, NULL, 0));
    ck_assert(llmem_backend_supports(p.be, TST_OP, (llmem_dtype[]){F32, F16}, 2));
    ck_assert(!llmem_backend_supports(p.be, TST_OP, (llmem_dtype[]){F32, BF16}, 2));
    ck_assert(!llmem_backend_supports(p.be, TST_OP, (llmem_dtype[]){F16}, 1));
    ck_assert(!llmem_backend_supports(p.be, TST_OP, (llmem_dtype[]){F32, F32, F32}, 3));
    ck_assert(!llmem_backend_supports(p.be, LLMEM_OP_GDN, NULL, 0)); /* not in this list */
    tst_fn fn = (tst_fn)llmem_backend_op_impl(p.be, &tst_info);
    ck_assert(fn != NULL);
    tst_calls = 0;
    ck_assert_int_eq(fn(p.be, NULL, NULL), LLMEM_OK);
    ck_assert_int_eq(tst_calls, 1);
    /* an implementation built against another layout counts as absent */
    llmem_op_impl other = {TST_OP, TST_LAYOUT + 1, (llmem_op_fn)tst_impl, NULL};
    const llmem_op_impl *other_head = &other;
    p.iface.op_impls = &other_head;
    ck_assert(!llmem_backend_supports(p.be, TST_OP, NULL, 0));
    ck_assert(llmem_backend_op_impl(p.be, &tst_info) == NULL);
    /* the backend's own query is asked last, with the tag */
    other.layout = TST_LAYOUT;
    p.iface.supports_op = no_i8_scan;
    asked_op = -1;
    ck_assert(llmem_backend_supports(p.be, TST_OP, (llmem_dtype[]){F32}, 1));
    ck_assert_int_eq(asked_op, TST_OP);
    unpatch(&p);

    /* an implementation for the built-in cpu backend, added from outside it */
    llmem_backend *be = cpu();
    ck_assert(!llmem_backend_supports(be, TST_OP, NULL, 0));
    static llmem_op_impl host = {TST_OP, TST_LAYOUT, NULL, NULL};
    host.fn = (llmem_op_fn)tst_impl;
    ck_assert_int_eq(llmem_op_impl_register(NULL, &host), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_impl_register("cpu", NULL), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_impl_register("a-backend-name-of-32-characters!", &host),
                     LLMEM_E_INVALID);
    static llmem_op_impl numbered = {LLMEM_OP_MATMUL, 0, NULL, NULL};
    numbered.fn = (llmem_op_fn)tst_impl;
    ck_assert_int_eq(llmem_op_impl_register("cpu", &numbered), LLMEM_E_INVALID);
    ck_assert(!llmem_backend_supports(be, TST_OP, NULL, 0));
    ck_assert_int_eq(llmem_op_impl_register("cpu", &host), LLMEM_OK);
    ck_assert_int_eq(llmem_op_impl_register("cpu", &host), LLMEM_E_STATE); /* twice */
    ck_assert(llmem_backend_supports(be, TST_OP, (llmem_dtype[]){F32, F16}, 2));
    fn = (tst_fn)llmem_backend_op_impl(be, &tst_info);
    ck_assert(fn == tst_impl);
    /* another name does not get it; the backend's own list wins */
    patch(&p);
    const char *name = p.be->name;
    p.be->name = "cpu2";
    ck_assert(!llmem_backend_supports(p.be, TST_OP, NULL, 0));
    p.be->name = name;
    ck_assert(llmem_backend_supports(p.be, TST_OP, NULL, 0));
    other.layout = TST_LAYOUT + 1; /* the own list's entry, built for another layout */
    p.iface.op_impls = &other_head;
    ck_assert(!llmem_backend_supports(p.be, TST_OP, NULL, 0));
    unpatch(&p);
    llmem_backend_close(be);
}
END_TEST

/* Loads fixture `name` on a CPU backend whose ops table lacks one slot
 * (cleared by clear()) and expects the load to fail naming op and backend. */
static void load_without(const char *name, void (*clear)(patched *), const char *op)
{
    patched p;
    patch(&p);
    clear(&p);
    llmem_model_params mp = llmem_model_default_params();
    mp.n_seq_max = 1;
    mp.n_ctx = 32;
    mp.n_ubatch = 8;
    llmem_model *m = (llmem_model *)&p; /* must be reset to NULL */
    char err[512] = "";
    ck_assert_int_eq(llmem_model_load(test_fixture(name), p.be, &mp, &m, err, sizeof err),
                     LLMEM_E_UNSUPPORTED);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(err, op) && strstr(err, "the cpu backend does not support op"),
                  "%s", err);
    unpatch(&p);
    /* the complete backend loads the same model */
    llmem_backend *be = cpu();
    ck_assert_msg(llmem_model_load(test_fixture(name), be, &mp, &m, err, sizeof err) == LLMEM_OK, "%s",
                  err);
    llmem_model_free(m);
    llmem_backend_close(be);
}

static void no_attention(patched *p) { p->ops.attention_paged = NULL; }
static void no_gdn(patched *p) { drop_impl(p, LLMEM_OP_GDN); }
static void no_swiglu(patched *p) { p->ops.swiglu = NULL; }
static void no_short_conv(patched *p) { drop_impl(p, LLMEM_OP_SHORT_CONV); }

START_TEST(test_model_load_refuses_missing_op)
{
    load_without("llama", no_attention, "op attention_paged (operand dtypes f32, f32, f32)");
    load_without("llama", no_swiglu, "op swiglu");
    load_without("qwen3_next", no_gdn,
                 "op gdn, which this qwen3_next model needs for layer 0 (gdn)");
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
    tcase_add_test(tc, test_op_list);
    tcase_add_test(tc, test_model_load_refuses_missing_op);
    tcase_add_test(tc, test_snapshot_views); /* registers two ops */
    tcase_add_test(tc, test_out_of_tree_op); /* last: it registers an op */
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
