// ctest-labels: core
/* The open memory interface (issue 16): memory vtables are checked when a
 * memory is initialised (struct_size, required slots), appended slots are
 * reached through LLMEM_MEMORY_SLOT, views carry an open kind with typed
 * accessors, and the one page count agrees with a brute-force count.
 */
#include "support/run.h"
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/kv_cache.h"
#include "llmem/memory_impl.h"
#include "llmem/runtime.h"
#include "llmem/ops.h"
#include "llmem/recurrent.h"
#include "support/memtest.h"

/* A copy of the KV cache's vtable, to damage. */
static llmem_memory_i kv_table(llmem_backend *be, llmem_memory **keep)
{
    *keep = mt_kv(be, 4, 8, 2, false, false);
    return *(*keep)->iface;
}

START_TEST(test_iface_check_struct_size)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv;
    llmem_memory_i t = kv_table(be, &kv);
    char err[256] = "";
    ck_assert_int_eq(llmem_memory_iface_check(&t, err, sizeof err), LLMEM_OK);

    t.struct_size = LLMEM_MEMORY_I_MIN_SIZE - sizeof(void *);
    ck_assert_int_eq(llmem_memory_iface_check(&t, err, sizeof err), LLMEM_E_ABI);
    ck_assert_ptr_nonnull(strstr(err, "smaller"));
    llmem_memory m;
    ck_assert_int_eq(llmem_memory_init(&m, &t, be, 1, 1, LLMEM_SPLIT_SIMPLE, false), LLMEM_E_ABI);
    ck_assert_ptr_null(m.iface);

    t.struct_size = sizeof(llmem_memory_i) + 8; /* built against a newer llmem */
    ck_assert_int_eq(llmem_memory_iface_check(&t, err, sizeof err), LLMEM_E_ABI);
    ck_assert_ptr_nonnull(strstr(err, "newer"));

    /* the first version of the table is accepted; its appended slots read as
     * absent even when the bytes past struct_size hold a pointer */
    t.struct_size = LLMEM_MEMORY_I_MIN_SIZE;
    ck_assert_int_eq(llmem_memory_iface_check(&t, err, sizeof err), LLMEM_OK);
    ck_assert_int_eq(llmem_memory_init(&m, &t, be, 2, 3, LLMEM_SPLIT_EQUAL, true), LLMEM_OK);
    ck_assert(t.reserve_prepare != NULL);
    ck_assert(LLMEM_MEMORY_SLOT(&m, reserve_prepare) == NULL);
    ck_assert(LLMEM_MEMORY_SLOT(&m, prefix_cut) == NULL);
    ck_assert(LLMEM_MEMORY_SLOT(&m, seq_rm) == t.seq_rm);
    ck_assert_int_eq(m.n_layers, 2);
    ck_assert_int_eq(m.n_seq_max, 3);
    ck_assert_int_eq(m.split, LLMEM_SPLIT_EQUAL);
    llmem_memory_destroy(kv);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_iface_check_required_slots)
{
    llmem_backend *be = mt_cpu();
    llmem_memory *kv;
    llmem_memory_i good = kv_table(be, &kv);
    char err[256];
    llmem_memory_i t = good;
    t.view = NULL;
    ck_assert_int_eq(llmem_memory_iface_check(&t, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "view"));
    ck_assert_ptr_nonnull(strstr(err, "kv_cache"));
    t = good;
    t.seq_keep = NULL;
    ck_assert_int_eq(llmem_memory_iface_check(&t, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "seq_keep"));
    t = good;
    t.state_read_abort = NULL; /* state_read_prepare set: the three go together */
    ck_assert_int_eq(llmem_memory_iface_check(&t, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(err, "state_read_abort"));
    t = good;
    t.type = NULL;
    ck_assert_int_eq(llmem_memory_iface_check(&t, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_memory_iface_check(NULL, err, sizeof err), LLMEM_E_INVALID);
    /* optional slots may be NULL */
    t = good;
    t.seq_add = t.seq_div = NULL;
    t.prefix_match = NULL;
    t.check = NULL;
    ck_assert_int_eq(llmem_memory_iface_check(&t, err, sizeof err), LLMEM_OK);
    /* bad numbers */
    llmem_memory m;
    ck_assert_int_eq(llmem_memory_init(&m, &good, be, 0, 1, LLMEM_SPLIT_SIMPLE, false),
                     LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_memory_init(&m, &good, be, 1, 0, LLMEM_SPLIT_SIMPLE, false),
                     LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_memory_init(&m, &good, be, 1, 1, LLMEM_SPLIT_AUTO, false),
                     LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_memory_init(NULL, &good, be, 1, 1, LLMEM_SPLIT_SIMPLE, false),
                     LLMEM_E_INVALID);
    llmem_memory_destroy(kv);
    llmem_backend_close(be);
}
END_TEST

/* Views of every layer of one ubatch stay valid together, and each is
 * read through its kind's accessor only. */
START_TEST(test_views_typed_and_coexisting)
{
    llmem_backend *be = mt_cpu();
    llmem_kv_cache_params p = llmem_kv_cache_default_params();
    p.n_layers = 3;
    p.n_kv_heads = 1;
    p.head_dim = 2;
    p.dtype = LLMEM_DTYPE_F32;
    p.page_size = 4;
    p.n_pages = 8;
    p.n_seq_max = 2;
    llmem_memory *mem;
    char err[256];
    ck_assert_int_eq(llmem_kv_cache_create(be, &p, &mem, err, sizeof err), LLMEM_OK);
    llmem_batch_buf *b;
    ck_assert_int_eq(llmem_batch_buf_create(16, 1, &b), LLMEM_OK);
    mt_add(b, 0, 0, 6, 100, true);
    llmem_plan *plan;
    ck_assert_int_eq(llmem_memory_plan(mem, llmem_batch_buf_get(b), LLMEM_SPLIT_AUTO, 16, &plan,
                                       err, sizeof err),
                     LLMEM_OK);
    const llmem_ubatch *ub;
    ck_assert_int_eq(llmem_memory_apply(mem, plan, 0, &ub), LLMEM_OK);
    llmem_view v[3];
    for (int32_t il = 0; il < 3; il++)
        ck_assert_int_eq(llmem_memory_view(mem, il, &v[il]), LLMEM_OK);
    for (int32_t il = 0; il < 3; il++) {
        ck_assert_uint_eq(v[il].kind, LLMEM_VIEW_KV);
        ck_assert_uint_eq(v[il].desc_size, sizeof(llmem_kv_view));
        const llmem_kv_view *kv = llmem_view_kv(&v[il]);
        ck_assert_ptr_nonnull(kv);
        ck_assert_ptr_null(llmem_view_rs(&v[il]));
        ck_assert_int_eq(kv->store_slot.n, 6);
        ck_assert_int_eq(kv->page_size, 4);
        for (int32_t jl = 0; jl < il; jl++) /* an earlier layer's view still names its pools */
            ck_assert_ptr_ne(llmem_view_kv(&v[jl])->k, kv->k);
    }
    /* a description smaller than the struct is refused */
    llmem_view small = v[0];
    small.desc_size = sizeof(llmem_kv_view) - 4;
    ck_assert_ptr_null(llmem_view_kv(&small));
    ck_assert_ptr_null(llmem_view_kv(NULL));
    /* an op refuses a view of the wrong kind */
    llmem_view wrong = v[0];
    wrong.kind = LLMEM_VIEW_RECURRENT;
    ck_assert_int_eq(llmem_op_kv_page_copy(be, &wrong, 0, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_op_state_slot_copy(be, &v[0], 0, 1), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_memory_commit(mem, plan, 0), LLMEM_OK);
    llmem_memory_release(mem, plan);
    mt_free(mem, b, be);
}
END_TEST

START_TEST(test_view_kind_names)
{
    char buf[12];
    ck_assert_str_eq(llmem_view_kind_name(LLMEM_VIEW_NONE, buf), "none");
    ck_assert_str_eq(llmem_view_kind_name(LLMEM_VIEW_KV, buf), "kv");
    ck_assert_str_eq(llmem_view_kind_name(LLMEM_VIEW_RECURRENT, buf), "recurrent");
    llmem_view_kind tag = LLMEM_VIEW_KIND_TAG('s', 'w', 'a', 'k');
    ck_assert_uint_eq(tag, 0x7377616bu); /* 's' 'w' 'a' 'k' in ASCII, first byte highest */
    ck_assert_str_eq(llmem_view_kind_name(tag, buf), "swak");
    ck_assert_str_eq(llmem_view_kind_name(0x00000105u, buf), "0x00000105");
    ck_assert_str_eq(llmem_view_kind_name(0x7f414141u, buf), "0x7f414141");
    /* a tag never equals a well-known id */
    ck_assert_uint_gt(LLMEM_VIEW_KIND_TAG('!', '!', '!', '!'), LLMEM_VIEW_RECURRENT);
    /* typed access to an out-of-tree kind */
    struct mine { int32_t a, b; } d = {3, 4};
    llmem_view v = llmem_view_make(tag, &d, sizeof d, NULL);
    const struct mine *m = llmem_view_desc(&v, tag, sizeof(struct mine));
    ck_assert_ptr_eq(m, &d);
    ck_assert_ptr_null(llmem_view_desc(&v, LLMEM_VIEW_KIND_TAG('s', 'w', 'a', 'x'), sizeof d));
    ck_assert_ptr_null(llmem_view_kv(&v));
}
END_TEST

/* llmem_pages_for against counting pages token by token: the pages that
 * hold tokens [len, len + n) and none of [0, len). */
START_TEST(test_pages_for_brute_force)
{
    for (int32_t ps = 1; ps <= 9; ps++)
        for (int32_t len = 0; len <= 40; len++)
            for (int32_t n = 1; n <= 40; n++) {
                int32_t want = 0;
                for (int32_t t = len; t < len + n; t++)
                    want += t % ps == 0; /* token t opens a new page */
                ck_assert_int_eq(llmem_pages_for(len, n, ps), want);
            }
    ck_assert_int_eq(llmem_pages_for(0, 0, 4), 0);
    ck_assert_int_eq(llmem_pages_for(-1, 4, 4), 0);
    ck_assert_int_eq(llmem_pages_for(0, 4, 0), 0);
    /* no int32 overflow: INT32_MAX tokens in pages of 2^30 */
    ck_assert_int_eq(llmem_pages_for(0, INT32_MAX, 1 << 30), 2);
    ck_assert_int_eq(llmem_pages_for(INT32_MAX - 1, 1, 1), 1);
}
END_TEST

/* Every destroy accepts NULL (STYLE.md, "Names"): the ones no other suite
 * calls with NULL. A crash fails the test (fork mode). */
START_TEST(test_destroy_accepts_null)
{
    llmem_memory_destroy(NULL);
    llmem_batch_buf_destroy(NULL);
    llmem_model_free(NULL);
    llmem_i32vec_free(NULL);
    llmem_i32vec empty = {0};
    llmem_i32vec_free(&empty);
    ck_assert_ptr_null(empty.v);
    llmem_backend_host_free(NULL, NULL);
    llmem_backend *be = NULL;
    ck_assert_int_eq(llmem_backend_open("cpu", -1, &be, NULL, 0), LLMEM_OK);
    llmem_backend_host_free(be, NULL);
    llmem_backend_close(be);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("memory_iface");
    TCase *tc = tcase_create("memory_iface");
    tcase_add_test(tc, test_iface_check_struct_size);
    tcase_add_test(tc, test_iface_check_required_slots);
    tcase_add_test(tc, test_views_typed_and_coexisting);
    tcase_add_test(tc, test_view_kind_names);
    tcase_add_test(tc, test_pages_for_brute_force);
    tcase_add_test(tc, test_destroy_accepts_null);
    suite_add_tcase(s, tc);
    return test_run_suite(s) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
