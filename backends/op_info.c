/* llmem: what each op of <llmem/ops.h> declares about itself: its name,
 * its ops-table slot (and the fallback its wrapper runs without one), the
 * view kind it accepts, and the dtypes each operand may have. The op
 * wrappers check view kinds against it; llmem_backend_supports (modelled on
 * ggml's supports_op) answers from it and the backend's optional
 * supports_op slot. A new op appends one line here and one id in ops.h.
 */
#include <string.h>

#include "backends/ops_internal.h"

#define F DT_F32
#define W DT_FLOAT
#define I DT_I32
#define KVD (DT_FLOAT | (1u << LLMEM_DTYPE_I8) | (1u << LLMEM_DTYPE_F8E4M3)) /* KV pools */
#define RSD DT_FLOAT                                   /* recurrent states */
#define RSQ (DT_FLOAT | (1u << LLMEM_DTYPE_I8))          /* states an op reads as int8 too */

#define MAX_OPERANDS 10

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
    [LLMEM_OP_MOE_ROUTE] = {"moe_route", SLOT_OF(moe_route), FB_NONE, LLMEM_VIEW_NONE, 4,
                            {F, W, I, F}},
    [LLMEM_OP_MOE_FFN] = {"moe_ffn", SLOT_OF(moe_ffn), FB_NONE, LLMEM_VIEW_NONE, 6,
                          {F, I, F, W, W, F}},
    [LLMEM_OP_MATMUL_SWIGLU] = {"matmul_swiglu", SLOT_OF(matmul_swiglu), FB_NONE,
                                LLMEM_VIEW_NONE, 4, {F, W, W, F}},
    [LLMEM_OP_ADD_RMS_NORM] = {"add_rms_norm", SLOT_OF(add_rms_norm), FB_ADD_NORM,
                               LLMEM_VIEW_NONE, 4, {F, F, W, F}},
    [LLMEM_OP_GDN] = {"gdn", SLOT_OF(gdn), FB_NONE, LLMEM_VIEW_RECURRENT, 7,
                      {RSD, F, F, F, W, W, F}},
    [LLMEM_OP_SIGMOID_MUL] = {"sigmoid_mul", SLOT_OF(sigmoid_mul), FB_NONE, LLMEM_VIEW_NONE, 3,
                              {F, F, F}},
    [LLMEM_OP_GEGLU] = {"geglu", SLOT_OF(geglu), FB_NONE, LLMEM_VIEW_NONE, 3, {F, F, F}},
    [LLMEM_OP_SOFTCAP] = {"softcap", SLOT_OF(softcap), FB_NONE, LLMEM_VIEW_NONE, 2, {F, F}},
    [LLMEM_OP_SHORT_CONV] = {"short_conv", SLOT_OF(short_conv), FB_NONE, LLMEM_VIEW_RECURRENT, 5,
                             {RSD, F, W, W, F}},
    [LLMEM_OP_SSM_SCAN1] = {"ssm_scan1", SLOT_OF(ssm_scan1), FB_NONE, LLMEM_VIEW_RECURRENT, 10,
                            {RSD, F, F, F, F, W, W, W, F, F}},
    [LLMEM_OP_KV_PAGE_COPY] = {"kv_page_copy", 0, 0, FB_COPY, LLMEM_VIEW_KV, 1, {KVD}},
    [LLMEM_OP_STATE_SLOT_COPY] = {"state_slot_copy", 0, 0, FB_COPY, LLMEM_VIEW_RECURRENT, 1,
                                  {RSQ}},
};

static const op_info *info_of(llmem_op op)
{
    return (int)op >= 0 && op < LLMEM_OP_COUNT && ops[op].name ? &ops[op] : NULL;
}

const char *llmem_op_name(llmem_op op)
{
    const op_info *i = info_of(op);
    return i ? i->name : "unknown";
}

llmem_view_kind llmem_op_view_kind(llmem_op op)
{
    const op_info *i = info_of(op);
    return i ? i->view : LLMEM_VIEW_NONE;
}

int32_t llmem_op_n_operands(llmem_op op)
{
    const op_info *i = info_of(op);
    return i ? i->n : 0;
}

/* Minimum description size of the well-known kinds; an out-of-tree kind
 * (no op of this table accepts one) has none. */
static size_t desc_min(llmem_view_kind k)
{
    return k == LLMEM_VIEW_KV ? sizeof(llmem_kv_view)
           : k == LLMEM_VIEW_RECURRENT ? sizeof(llmem_rs_view) : 0;
}

llmem_status llmem_op_check_view(llmem_op op, const llmem_view *view, char *err,
                                 size_t err_len)
{
    const op_info *i = info_of(op);
    char want[12], got[12];
    if (!i || i->view == LLMEM_VIEW_NONE) {
        llmem_errf(err, err_len, "op %s takes no view", llmem_op_name(op));
        return LLMEM_E_INVALID;
    }
    if (!view) {
        llmem_errf(err, err_len, "op %s: NULL view", i->name);
        return LLMEM_E_INVALID;
    }
    if (view->kind != i->view) {
        llmem_errf(err, err_len, "op %s accepts views of kind %s, not %s", i->name,
                   llmem_view_kind_name(i->view, want), llmem_view_kind_name(view->kind, got));
        return LLMEM_E_INVALID;
    }
    if (!llmem_view_desc(view, i->view, desc_min(i->view))) {
        llmem_errf(err, err_len, "op %s: the %s view's description is missing or %u bytes, "
                   "smaller than %zu",
                   i->name, llmem_view_kind_name(i->view, want), (unsigned)view->desc_size,
                   desc_min(i->view));
        return LLMEM_E_INVALID;
    }
    return LLMEM_OK;
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

bool llmem_backend_supports(llmem_backend *be, llmem_op op, const llmem_dtype *dtypes,
                            int32_t n_dtypes)
{
    const op_info *i = info_of(op);
    if (!be || !be->iface || !i || n_dtypes < 0 || n_dtypes > i->n || (n_dtypes > 0 && !dtypes))
        return false;
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
    const llmem_backend_i *bi = be->iface;
    bool has_query = bi->struct_size >= offsetof(llmem_backend_i, supports_op) +
                                            sizeof(bi->supports_op) &&
                     bi->supports_op;
    return !has_query || bi->supports_op(be, (int32_t)op, dtypes, n_dtypes);
}
