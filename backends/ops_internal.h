/* llmem backends/: what the op wrappers (ops.c, sample.c, ops_moe.c, ops_act.c, ...) share:
 * the tensor-descriptor and aliasing checks and the slot lookup. Internal;
 * not installed. */
#ifndef LLMEM_BACKENDS_OPS_INTERNAL_H
#define LLMEM_BACKENDS_OPS_INTERNAL_H

#include <stddef.h>

#include "base/base_internal.h"
#include "llmem/ops_impl.h"

#define DT_F32 (1u << LLMEM_DTYPE_F32)
#define DT_I32 (1u << LLMEM_DTYPE_I32)
#define DT_FLOAT ((1u << LLMEM_DTYPE_F32) | (1u << LLMEM_DTYPE_F16) | (1u << LLMEM_DTYPE_BF16))

static inline int64_t rows_of(const llmem_tensor *t)
{
    int64_t n = 1;
    for (int32_t i = 0; i + 1 < t->n_dims; i++)
        n *= t->ne[i];
    return n;
}

static inline int64_t cols_of(const llmem_tensor *t)
{
    return t->ne[t->n_dims - 1];
}

/* Exactly 2 dims, [rows, cols]. */
static inline bool is_matrix(const llmem_tensor *t, int64_t rows, int64_t cols)
{
    return t->n_dims == 2 && t->ne[0] == rows && t->ne[1] == cols;
}

/* A valid descriptor of this backend, with a dtype in `dtypes`, inside its
 * buffer. Element counts are capped at 2^48 so byte sizes never overflow. */
static inline bool tensor_ok(llmem_backend *be, const llmem_tensor *t, unsigned dtypes)
{
    if (!t || !t->buf || t->n_dims < 1 || t->n_dims > LLMEM_TENSOR_MAX_DIMS)
        return false;
    if ((unsigned)t->dtype >= LLMEM_DTYPE_COUNT || !(dtypes & (1u << t->dtype)))
        return false;
    if (llmem_buffer_backend(t->buf) != be)
        return false;
    for (int32_t i = 0; i < t->n_dims; i++)
        if (t->ne[i] < 0)
            return false;
    int64_t n = 1;
    for (int32_t i = 0; i < t->n_dims; i++) {
        n *= t->ne[i];
        if (n > ((int64_t)1 << 48))
            return false;
    }
    size_t es = llmem_dtype_size(t->dtype);
    size_t bytes = (size_t)n * es;
    size_t size = llmem_buffer_size(t->buf);
    return t->offset % es == 0 && t->offset <= size && bytes <= size - t->offset;
}

static inline bool overlaps(const llmem_tensor *a, const llmem_tensor *b)
{
    if (!a || !b || a->buf != b->buf)
        return false;
    size_t na = llmem_tensor_nbytes(a), nb = llmem_tensor_nbytes(b);
    if (na == 0 || nb == 0)
        return false;
    return a->offset < b->offset + nb && b->offset < a->offset + na;
}

static inline bool same_shape(const llmem_tensor *a, const llmem_tensor *b)
{
    if (a->n_dims != b->n_dims)
        return false;
    for (int32_t i = 0; i < a->n_dims; i++)
        if (a->ne[i] != b->ne[i])
            return false;
    return true;
}

static inline bool same_memory(const llmem_tensor *a, const llmem_tensor *b)
{
    return a->buf == b->buf && a->offset == b->offset &&
           llmem_tensor_nbytes(a) == llmem_tensor_nbytes(b);
}

/* out may be exactly `in` or apart from it. */
static inline bool alias_ok(const llmem_tensor *out, const llmem_tensor *in)
{
    return !overlaps(out, in) || same_memory(out, in);
}

/* A [rows, cols] matrix, or a tensor with rows outermost whose other
 * dimensions flatten to cols (e.g. [T, H, P] for [T, H * P]). */
static inline bool matrix_ok(const llmem_tensor *t, int64_t rows, int64_t cols)
{
    if (rows_of(t) == rows && cols_of(t) == cols)
        return true;
    return t->n_dims >= 2 && t->ne[0] == rows && llmem_tensor_nelements(t) == rows * cols;
}

/* A vector operand: a valid float tensor of this backend with n elements
 * (any shape). */
static inline bool vec_ok(llmem_backend *be, const llmem_tensor *t, int64_t n)
{
    return tensor_ok(be, t, DT_FLOAT) && llmem_tensor_nelements(t) == n;
}

/* An optional vector operand: NULL, or as vec_ok. */
static inline bool optional_vec_ok(llmem_backend *be, const llmem_tensor *t, int64_t n)
{
    return !t || vec_ok(be, t, n);
}

/* Whether t lies (partly) in buffer buf (a pool, a state buffer, the index
 * buffer); a NULL or empty tensor does not. */
static inline bool in_buffer(const llmem_tensor *t, const llmem_buffer *buf)
{
    return t && t->buf == buf && llmem_tensor_nbytes(t) > 0;
}

/* The start of an open op's wrapper on a recurrent view (<llmem/ops_impl.h>,
 * "Open ops"): view is of the kind info declares, be is given, be
 * implements the op (its llmem_backend_op_impl into *fn) and the view's
 * state `state` is valid (llmem_view_check_rs). LLMEM_OK, or
 * LLMEM_E_INVALID (view, be), LLMEM_E_UNSUPPORTED (no implementation) or
 * llmem_view_check_rs's status. */
static inline llmem_status open_rs_op_begin(llmem_backend *be, const llmem_op_info *info,
                                            const llmem_view *view, int32_t state,
                                            llmem_op_fn *fn)
{
    if (llmem_op_check_view(info->op, view, NULL, 0) != LLMEM_OK || !be)
        return LLMEM_E_INVALID;
    *fn = llmem_backend_op_impl(be, info);
    if (!*fn)
        return LLMEM_E_UNSUPPORTED;
    return llmem_view_check_rs(be, view, state);
}

static inline const struct llmem_ops_i *ops_of(llmem_backend *be)
{
    return be && be->iface ? be->iface->ops : NULL;
}

static inline bool ops_has(const struct llmem_ops_i *ops, size_t offset, size_t size)
{
    return ops && ops->struct_size >= offset + size;
}

/* The slot `name` of be's ops table, or NULL when the table lacks it. */
#define SLOT(be, name)                                                                 \
    (ops_has(ops_of(be), offsetof(struct llmem_ops_i, name),                           \
             sizeof(((const struct llmem_ops_i *)0)->name))                            \
         ? ops_of(be)->name                                                            \
         : NULL)

#endif
