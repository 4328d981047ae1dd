/* llmem base: the tensor description helpers of <llmem/ops.h>. They are
 * part of the host table plugins receive (base/registry.c), so they live
 * here, below the op wrappers of backends/. */
#include "llmem/ops.h"

int64_t llmem_tensor_nelements(const llmem_tensor *t)
{
    if (!t || t->n_dims < 1 || t->n_dims > LLMEM_TENSOR_MAX_DIMS)
        return 0;
    int64_t n = 1;
    for (int32_t i = 0; i < t->n_dims; i++) {
        if (t->ne[i] < 0)
            return 0;
        n *= t->ne[i]; /* capped below, so the next product cannot overflow */
        if (n > ((int64_t)1 << 48))
            return 0;
    }
    return n;
}

size_t llmem_tensor_nbytes(const llmem_tensor *t)
{
    if (!t)
        return 0;
    return (size_t)llmem_tensor_nelements(t) * llmem_dtype_size(t->dtype);
}
