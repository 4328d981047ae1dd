/* llmem: what each op declares about itself: its name, where a backend
 * keeps it (an ops-table slot, and the fallback its wrapper runs without
 * one; or, for an open op, the backend's list of implementations), the
 * view kind it accepts, and the dtypes each operand may have. The numbered
 * ops of <llmem/ops.h> have a line in the table below; open ops
 * (<llmem/ops_impl.h>, "Open ops") register an llmem_op_info from their
 * own files into the registry below, so a new op touches neither. The op
 * wrappers check view kinds against it; llmem_backend_supports (modelled
 * on ggml's supports_op) answers from it and the backend's optional
 * supports_op slot.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backends/ops_internal.h"

#define F DT_F32
#define W DT_FLOAT
#define I DT_I32
#define KVD (DT_FLOAT | (1u << LLMEM_DTYPE_I8) | (1u << LLMEM_DTYPE_F8E4M3)) /* KV pools */
#define RSD DT_FLOAT                                   /* recurrent states */
#define RSQ (DT_FLOAT | (1u << LLMEM_DTYPE_I8))          /* states an op reads as int8 too */

#define MAX_OPERANDS LLMEM_OP_MAX_OPERANDS

/* What runs when the op's own slot is missing. */
enum fallback { FB_NONE, FB_MATMUL, FB_ADD_NORM, FB_COPY };

typedef struct op_info {
    const char *name;
    size_t off, size; /* the slot in llmem_ops_i; size 0: no slot of its own */
    enum fallback fb;
    llmem_view_kind view;
    int32_t n;
    unsigned dt[MAX_OPERANDS];
} op_info;

#define SLOT_OF(s) offsetof(struct llmem_ops_i, s), sizeof(((struct llmem_ops_i *)0)->s)

static const op_info ops[LLMEM_OP_COUNT] = {
    [LLMEM_OP_MATMUL] = {"matmul", SLOT_OF(matmul), FB_NONE, LLMEM_VIEW_NONE, 3, {F, W, F}},
    [LLMEM_OP_GET_ROWS] = {"get_rows", SLOT_OF(get_rows), FB_NONE, LLMEM_VIEW_NONE, 3, {W, I, F}},
    [LLMEM_OP_ADD] = {"add", SLOT_OF(add), FB_NONE, LLMEM_VIEW_NONE, 3, {F, F, F}},
    [LLMEM_OP_MUL] = {"mul", SLOT_OF(mul), FB_NONE, LLMEM_VIEW_NONE, 3, {F, F, F}},
    [LLMEM_OP_SCALE] = {"scale", SLOT_OF(scale), FB_NONE, LLMEM_VIEW_NONE, 2, {F, F}},
    [LLMEM_OP_SILU] = {"silu", SLOT_OF(silu), FB_NONE, LLMEM_VIEW_NONE, 2, {F, F}},
    [LLMEM_OP_RELU2] = {"relu2", SLOT_OF(relu2), FB_NONE, LLMEM_VIEW_NONE, 2, {F, F}},
    [LLMEM_OP_SOFTPLUS] = {"softplus", SLOT_OF(softplus), FB_NONE, LLMEM_VIEW_NONE, 2, {F, F}},
    [LLMEM_OP_SWIGLU] = {"swiglu", SLOT_OF(swiglu), FB_NONE, LLMEM_VIEW_NONE, 3, {F, F, F}},
    [LLMEM_OP_RMS_NORM] = {"rms_norm", SLOT_OF(rms_norm), FB_NONE, LLMEM_VIEW_NONE, 3, {F, W, F}},
    [LLMEM_OP_RMS_NORM_GATED] = {"rms_norm_gated", SLOT_OF(rms_norm_gated), FB_NONE,
                                 LLMEM_VIEW_NONE, 4, {F, F, W, F}},
    [LLMEM_OP_ROPE] = {"rope", SLOT_OF(rope), FB_NONE, LLMEM_VIEW_NONE, 3, {F, I, F}},
    [LLMEM_OP_ROPE_SHIFT] = {"rope_shift", SLOT_OF(rope_shift), FB_NONE, LLMEM_VIEW_KV, 1, {KVD}},
    [LLMEM_OP_KV_STORE] = {"kv_store", SLOT_OF(kv_store), FB_NONE, LLMEM_VIEW_KV, 3,
                           {KVD, F, F}},
    [LLMEM_OP_ATTENTION_PAGED] = {"attention_paged", SLOT_OF(attention_paged), FB_NONE,
                                  LLMEM_VIEW_KV, 3, {KVD, F, F}},
    [LLMEM_OP_SSM_CONV] = {"ssm_conv", SLOT_OF(ssm_conv), FB_NONE, LLMEM_VIEW_RECURRENT, 5,
                           {RSD, F, W, W, F}},
    [LLMEM_OP_SSM_SCAN] = {"ssm_scan", SLOT_OF(ssm_scan), FB_NONE, LLMEM_VIEW_RECURRENT, 7,
                           {RSQ, F, F, W, W, W, F}},
    [LLMEM_OP_COPY] = {"copy", SLOT_OF(copy), FB_NONE, LLMEM_VIEW_NONE, 2, {W, W}},
    [LLMEM_OP_COPY_BLOCKS] = {"copy_blocks", SLOT_OF(copy_blocks), FB_COPY, LLMEM_VIEW_NONE, 0,
                              {0}},
    [LLMEM_OP_LOG_SOFTMAX] = {"log_softmax", SLOT_OF(log_softmax), FB_NONE, LLMEM_VIEW_NONE, 2,
                              {F, F}},
    [LLMEM_OP_ARGMAX] = {"argmax", SLOT_OF(argmax), FB_NONE, LLMEM_VIEW_NONE, 2, {F, I}},
    [LLMEM_OP_SAMPLE] = {"sample", SLOT_OF(sample), FB_NONE, LLMEM_VIEW_NONE, 3, {F, I, I}},
    [LLMEM_OP_LOGPROB_GATHER] = {"logprob_gather", SLOT_OF(logprob_gather), FB_NONE,
                                 LLMEM_VIEW_NONE, 3, {F, I, F}},
    [LLMEM_OP_TOP_LOGPROBS] = {"top_logprobs", SLOT_OF(top_logprobs), FB_NONE, LLMEM_VIEW_NONE,
                               3, {F, I, F}},
    [LLMEM_OP_MATMUL_FAST] = {"matmul_fast", SLOT_OF(matmul_fast), FB_MATMUL, LLMEM_VIEW_NONE, 3,
                              {F, W, F}},
    [LLMEM_OP_MATMUL_SWIGLU] = {"matmul_swiglu", SLOT_OF(matmul_swiglu), FB_NONE,
                                LLMEM_VIEW_NONE, 4, {F, W, W, F}},
    [LLMEM_OP_ADD_RMS_NORM] = {"add_rms_norm", SLOT_OF(add_rms_norm), FB_ADD_NORM,
                               LLMEM_VIEW_NONE, 4, {F, F, W, F}},
    [LLMEM_OP_GEGLU] = {"geglu", SLOT_OF(geglu), FB_NONE, LLMEM_VIEW_NONE, 3, {F, F, F}},
    [LLMEM_OP_SOFTCAP] = {"softcap", SLOT_OF(softcap), FB_NONE, LLMEM_VIEW_NONE, 2, {F, F}},
    [LLMEM_OP_KV_PAGE_COPY] = {"kv_page_copy", 0, 0, FB_COPY, LLMEM_VIEW_KV, 1, {KVD}},
    [LLMEM_OP_STATE_SLOT_COPY] = {"state_slot_copy", 0, 0, FB_COPY, LLMEM_VIEW_RECURRENT, 1,
                                  {RSQ}},
};

/* ---- the registry of open ops ---- */

/* Newest first; prepended under reg_lock, read without it (acquire). */
static _Atomic(const llmem_op_info *) reg_head;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
/* The first failed registration, for llmem_op_registry_check. */
static llmem_status reg_error = LLMEM_OK;
static char reg_error_msg[160];

static bool is_tag(llmem_op op)
{
    uint32_t u = (uint32_t)op;
    for (int i = 0; i < 4; i++, u >>= 8)
        if ((u & 0xffu) < 0x21 || (u & 0xffu) > 0x7e)
            return false;
    return true;
}

/* The tag's four characters and a NUL into out (>= 5 bytes). */
static const char *tag_str(llmem_op op, char *out)
{
    for (int i = 0; i < 4; i++)
        out[i] = (char)(((uint32_t)op >> (24 - 8 * i)) & 0xffu);
    out[4] = 0;
    return out;
}

const llmem_op_info *llmem_op_info_find(llmem_op op)
{
    if (!is_tag(op))
        return NULL;
    for (const llmem_op_info *i = atomic_load_explicit(&reg_head, memory_order_acquire); i;
         i = i->next)
        if (i->op == op)
            return i;
    return NULL;
}

static llmem_status reg_fail(llmem_status st, const llmem_op_info *info, const char *why)
{
    if (reg_error == LLMEM_OK) {
        char t[12];
        reg_error = st;
        if (!info)
            llmem_errf(reg_error_msg, sizeof reg_error_msg, "op registration: %s", why);
        else {
            if (is_tag(info->op))
                tag_str(info->op, t);
            else
                snprintf(t, sizeof t, "0x%08x", (unsigned)info->op);
            llmem_errf(reg_error_msg, sizeof reg_error_msg, "op %s (id %s): %s",
                       info->name ? info->name : "(no name)", t, why);
        }
    }
    return st;
}

llmem_status llmem_op_register(llmem_op_info *info)
{
    llmem_status st = LLMEM_OK;
    pthread_mutex_lock(&reg_lock);
    if (!info || !info->name) {
        st = reg_fail(LLMEM_E_INVALID, info, "NULL info or name");
        goto out;
    }
    if (info->struct_size < LLMEM_OP_INFO_V1_SIZE) {
        st = reg_fail(LLMEM_E_ABI, info, "llmem_op_info from an older llmem");
        goto out;
    }
    if (!is_tag(info->op)) {
        st = reg_fail(LLMEM_E_INVALID, info, "the id is not a four-character tag");
        goto out;
    }
    if (info->n_operands < 0 || info->n_operands > LLMEM_OP_MAX_OPERANDS) {
        st = reg_fail(LLMEM_E_INVALID, info, "operand count out of range");
        goto out;
    }
    const llmem_op_info *head = atomic_load_explicit(&reg_head, memory_order_relaxed);
    for (const llmem_op_info *i = head; i; i = i->next) {
        if (i == info || i->op == info->op || strcmp(i->name, info->name) == 0) {
            st = reg_fail(LLMEM_E_STATE, info, "another op has its tag or name");
            goto out;
        }
    }
    for (int k = 0; k < LLMEM_OP_COUNT; k++) {
        if (ops[k].name && strcmp(ops[k].name, info->name) == 0) {
            st = reg_fail(LLMEM_E_STATE, info, "a numbered op has its name");
            goto out;
        }
    }
    info->next = head;
    atomic_store_explicit(&reg_head, (const llmem_op_info *)info, memory_order_release);
out:
    pthread_mutex_unlock(&reg_lock);
    return st;
}

llmem_status llmem_op_registry_check(char *err, size_t err_len)
{
    pthread_mutex_lock(&reg_lock);
    llmem_status st = reg_error;
    if (st != LLMEM_OK)
        llmem_errf(err, err_len, "%s", reg_error_msg);
    pthread_mutex_unlock(&reg_lock);
    return st;
}

int32_t llmem_op_list(llmem_op *ids, int32_t cap)
{
    if (cap < 0 || (cap > 0 && !ids))
        return -1;
    int32_t n = 0;
    for (int k = 0; k < LLMEM_OP_COUNT; k++) {
        if (!ops[k].name)
            continue;
        if (n < cap)
            ids[n] = (llmem_op)k;
        n++;
    }
    /* open ops in ascending tag order: each round takes the smallest tag
     * above the last one (a handful of ops; no allocation) */
    const llmem_op_info *head = atomic_load_explicit(&reg_head, memory_order_acquire);
    uint32_t last = 0;
    for (;;) {
        const llmem_op_info *best = NULL;
        for (const llmem_op_info *i = head; i; i = i->next)
            if ((uint32_t)i->op > last && (!best || (uint32_t)i->op < (uint32_t)best->op))
                best = i;
        if (!best)
            break;
        if (n < cap)
            ids[n] = best->op;
        n++;
        last = (uint32_t)best->op;
    }
    return n;
}

/* ---- lookups over both kinds of op ---- */

static const op_info *info_of(llmem_op op)
{
    return op >= 0 && op < LLMEM_OP_COUNT && ops[op].name ? &ops[op] : NULL;
}

const char *llmem_op_name(llmem_op op)
{
    const op_info *i = info_of(op);
    const llmem_op_info *o = i ? NULL : llmem_op_info_find(op);
    return i ? i->name : o ? o->name : "unknown";
}

llmem_view_kind llmem_op_view_kind(llmem_op op)
{
    const op_info *i = info_of(op);
    const llmem_op_info *o = i ? NULL : llmem_op_info_find(op);
    return i ? i->view : o ? o->view : LLMEM_VIEW_NONE;
}

int32_t llmem_op_n_operands(llmem_op op)
{
    const op_info *i = info_of(op);
    const llmem_op_info *o = i ? NULL : llmem_op_info_find(op);
    return i ? i->n : o ? o->n_operands : 0;
}

/* Minimum description size of the well-known kinds; an out-of-tree kind
 * (no op of this table accepts one) has none. */
static size_t desc_min(llmem_view_kind k)
{
    return k == LLMEM_VIEW_KV ? sizeof(llmem_kv_view)
           : k == LLMEM_VIEW_RECURRENT ? LLMEM_RS_VIEW_V1_SIZE : 0;
}

llmem_status llmem_op_check_view(llmem_op op, const llmem_view *view, char *err,
                                 size_t err_len)
{
    const op_info *i = info_of(op);
    const llmem_op_info *o = i ? NULL : llmem_op_info_find(op);
    const char *name = i ? i->name : o ? o->name : "unknown";
    llmem_view_kind kind = i ? i->view : o ? o->view : LLMEM_VIEW_NONE;
    size_t min = i ? desc_min(i->view) : o ? o->view_desc_min : 0;
    char want[12], got[12];
    if (kind == LLMEM_VIEW_NONE) {
        llmem_errf(err, err_len, "op %s takes no view", name);
        return LLMEM_E_INVALID;
    }
    if (!view) {
        llmem_errf(err, err_len, "op %s: NULL view", name);
        return LLMEM_E_INVALID;
    }
    if (view->kind != kind) {
        llmem_errf(err, err_len, "op %s accepts views of kind %s, not %s", name,
                   llmem_view_kind_name(kind, want), llmem_view_kind_name(view->kind, got));
        return LLMEM_E_INVALID;
    }
    if (!llmem_view_desc(view, kind, min)) {
        llmem_errf(err, err_len, "op %s: the %s view's description is missing or %u bytes, "
                   "smaller than %zu",
                   name, llmem_view_kind_name(kind, want), (unsigned)view->desc_size, min);
        return LLMEM_E_INVALID;
    }
    /* a snapshot inside the ubatch: written by Mamba-2's conv and scan and
     * by the open ops that say so (LLMEM_OP_WRITES_SNAPSHOT); refused by the
     * others (state_slot_copy, ...) */
    bool snaps = op == LLMEM_OP_SSM_CONV || op == LLMEM_OP_SSM_SCAN ||
                 (o && o->struct_size >= offsetof(llmem_op_info, flags) + sizeof o->flags &&
                  (o->flags & LLMEM_OP_WRITES_SNAPSHOT));
    if (kind == LLMEM_VIEW_RECURRENT && !snaps && llmem_rs_view_snap(view)) {
        llmem_errf(err, err_len, "op %s cannot write a snapshot inside the ubatch "
                   "(llmem_rs_view.snap_slot)", name);
        return LLMEM_E_UNSUPPORTED;
    }
    return LLMEM_OK;
}

/* Implementations added from outside a backend (llmem_op_impl_register):
 * entries [0, n_extra) are complete (published with release order). */
#define MAX_EXTRA 256
static struct extra_impl {
    char backend[32];
    const llmem_op_impl *impl;
} extra[MAX_EXTRA];
static _Atomic int n_extra;

llmem_status llmem_op_impl_register(const char *backend, const llmem_op_impl *impl)
{
    if (!backend || !impl || !impl->fn || !is_tag(impl->op) ||
        strlen(backend) >= sizeof extra[0].backend)
        return LLMEM_E_INVALID;
    llmem_status st = LLMEM_OK;
    pthread_mutex_lock(&reg_lock);
    int n = atomic_load_explicit(&n_extra, memory_order_relaxed);
    for (int k = 0; k < n; k++)
        if (extra[k].impl->op == impl->op && strcmp(extra[k].backend, backend) == 0)
            st = LLMEM_E_STATE;
    if (st == LLMEM_OK && n == MAX_EXTRA)
        st = LLMEM_E_NO_MEMORY;
    if (st == LLMEM_OK) {
        snprintf(extra[n].backend, sizeof extra[n].backend, "%s", backend);
        extra[n].impl = impl;
        atomic_store_explicit(&n_extra, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&reg_lock);
    return st;
}

llmem_op_fn llmem_backend_op_impl(llmem_backend *be, const llmem_op_info *info)
{
    if (!be || !be->iface || !info)
        return NULL;
    const llmem_backend_i *bi = be->iface;
    if (bi->struct_size >= offsetof(llmem_backend_i, op_impls) + sizeof(bi->op_impls) &&
        bi->op_impls) {
        /* bounded, so a damaged list cannot hang the caller */
        int n = 0;
        for (const llmem_op_impl *i = *bi->op_impls; i && n < 4096; i = i->next, n++)
            if (i->op == info->op)
                return i->layout == info->layout ? i->fn : NULL;
    }
    int n = atomic_load_explicit(&n_extra, memory_order_acquire);
    for (int k = 0; k < n && be->name; k++)
        if (extra[k].impl->op == info->op && strcmp(extra[k].backend, be->name) == 0)
            return extra[k].impl->layout == info->layout ? extra[k].impl->fn : NULL;
    return NULL;
}

/* Whether be's ops table has the slot at [off, off + size), non-NULL. */
static bool has_slot(llmem_backend *be, size_t off, size_t size)
{
    const struct llmem_ops_i *t = ops_of(be);
    if (!ops_has(t, off, size))
        return false;
    void (*fn)(void);
    memcpy(&fn, (const char *)t + off, sizeof fn);
    return fn != NULL;
}

#define HAS(be, s) has_slot(be, SLOT_OF(s))

/* The backend's optional supports_op slot, asked last; true without one. */
static bool backend_query(llmem_backend *be, llmem_op op, const llmem_dtype *dtypes,
                          int32_t n_dtypes)
{
    const llmem_backend_i *bi = be->iface;
    bool has_query = bi->struct_size >= offsetof(llmem_backend_i, supports_op) +
                                            sizeof(bi->supports_op) &&
                     bi->supports_op;
    return !has_query || bi->supports_op(be, (int32_t)op, dtypes, n_dtypes);
}

bool llmem_backend_supports(llmem_backend *be, llmem_op op, const llmem_dtype *dtypes,
                            int32_t n_dtypes)
{
    const op_info *i = info_of(op);
    const llmem_op_info *o = i ? NULL : llmem_op_info_find(op);
    int32_t n = i ? i->n : o ? o->n_operands : -1;
    if (!be || !be->iface || n < 0 || n_dtypes < 0 || n_dtypes > n || (n_dtypes > 0 && !dtypes))
        return false;
    if (o) {
        if (!llmem_backend_op_impl(be, o))
            return false;
        for (int32_t k = 0; k < n_dtypes; k++)
            if ((unsigned)dtypes[k] >= LLMEM_DTYPE_COUNT || !(o->dtypes[k] & (1u << dtypes[k])))
                return false;
        return backend_query(be, op, dtypes, n_dtypes);
    }
    bool slot = i->size > 0 && has_slot(be, i->off, i->size);
    if (!slot) {
        switch (i->fb) {
        case FB_MATMUL: slot = HAS(be, matmul); break;
        case FB_ADD_NORM: slot = HAS(be, add) && HAS(be, rms_norm); break;
        case FB_COPY: slot = true; break; /* llmem_buffer_copy: every backend */
        case FB_NONE: break;
        }
    }
    if (!slot)
        return false;
    for (int32_t k = 0; k < n_dtypes; k++)
        if ((unsigned)dtypes[k] >= LLMEM_DTYPE_COUNT || !(i->dt[k] & (1u << dtypes[k])))
            return false;
    return backend_query(be, op, dtypes, n_dtypes);
}
