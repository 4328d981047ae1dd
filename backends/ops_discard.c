/* llmem: discard of <llmem/ops_discard.h> (llmem_op_discard), an open op
 * (<llmem/ops_impl.h>, "Open ops"): its metadata, registered when libllmem
 * loads, and its wrapper.
 *
 * Unlike the other open ops, a backend without an implementation is no
 * error: dropping nothing is a correct discard. The debug poison
 * (LLMEM_DISCARD_POISON=1) runs after the implementation, through the
 * stream-ordered llmem_buffer_fill, so on a backend that holds work back
 * (Vulkan's held sums) it lands after whatever the discard let through.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base_internal.h"
#include "backends/ops_internal.h"
#include "llmem/ops_discard.h"

#define DT_ALL ((1u << LLMEM_DTYPE_COUNT) - 1u)

/* discard: {t} */
static llmem_op_info discard_info = {
    .struct_size = sizeof(llmem_op_info),
    .op = LLMEM_OP_DISCARD,
    .name = "discard",
    .view = LLMEM_VIEW_NONE,
    .n_operands = 1,
    .dtypes = {DT_ALL},
    .layout = LLMEM_OP_DISCARD_LAYOUT,
};
LLMEM_OP_DEFINE(discard_info);

/* LLMEM_DISCARD_POISON=1, read at each call: a debug switch, and a model
 * discards a few tensors a layer, so the scan of the environment is cheap
 * beside the step (and a test may flip it between steps). */
static bool poison_on(void)
{
    const char *e = getenv("LLMEM_DISCARD_POISON");
    return e && strcmp(e, "1") == 0;
}

llmem_status llmem_op_discard(llmem_backend *be, const llmem_tensor *t)
{
    if (!be || !t || !tensor_ok(be, t, DT_ALL))
        return LLMEM_E_INVALID;
    size_t bytes = llmem_tensor_nbytes(t);
    if (bytes == 0)
        return LLMEM_OK;
    llmem_op_discard_fn fn = (llmem_op_discard_fn)llmem_backend_op_impl(be, &discard_info);
    llmem_status st = fn ? fn(be, t) : LLMEM_OK;
    if (st != LLMEM_OK || !poison_on())
        return st;
    /* the whole words inside t: NaN in every float dtype */
    size_t lo = (t->offset + 3) & ~(size_t)3, hi = (t->offset + bytes) & ~(size_t)3;
    return hi > lo ? llmem_buffer_fill(t->buf, lo, hi - lo, 0xffffffffu) : LLMEM_OK;
}
