/* llmem: the CPU backend's discard (<llmem/ops_discard.h>): nothing to do.
 * Every CPU op writes its output when it is called, so no write is ever
 * pending that a discard could drop; the op is listed here so that the
 * reference backend has every op (llmem_backend_supports, tests/
 * test_backend_supports.c). The debug poison is the wrapper's
 * (backends/ops_discard.c). */
#include "backends/cpu/cpu_ops.h"
#include "llmem/ops_discard.h"

static llmem_status cpu_op_discard(llmem_backend *be, const llmem_tensor *t)
{
    (void)be;
    (void)t;
    return LLMEM_OK;
}

LLMEM_OP_IMPL(cpu_op_impls, LLMEM_OP_DISCARD, LLMEM_OP_DISCARD_LAYOUT, llmem_op_discard_fn,
              cpu_op_discard);
