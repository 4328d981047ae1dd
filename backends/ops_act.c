/* llmem: the Gemma activation op wrappers of <llmem/ops.h> (llmem_op_geglu,
 * llmem_op_softcap).
 *
 * Same contract as backends/ops.c: descriptors, shapes and aliasing are
 * checked on the host, then the backend's slot runs (LLMEM_E_UNSUPPORTED
 * when its table lacks it).
 */
#include <math.h>

#include "base/base_internal.h"
#include "backends/ops_internal.h"

llmem_status llmem_op_geglu(llmem_backend *be, const llmem_tensor *gate, const llmem_tensor *up,
                            const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, llmem_ct *, llmem_ct *) = SLOT(be, geglu);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!tensor_ok(be, gate, DT_F32) || !tensor_ok(be, up, DT_F32) ||
        !tensor_ok(be, out, DT_F32) || !same_shape(gate, up) || !same_shape(gate, out) ||
        !alias_ok(out, gate) || !alias_ok(out, up))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, gate, up, out);
}

llmem_status llmem_op_softcap(llmem_backend *be, const llmem_tensor *a, float cap,
                              const llmem_tensor *out)
{
    if (!be)
        return LLMEM_E_INVALID;
    llmem_status (*fn)(llmem_backend *, llmem_ct *, float, llmem_ct *) = SLOT(be, softcap);
    if (!fn)
        return LLMEM_E_UNSUPPORTED;
    if (!(cap > 0.0f) || !isfinite(cap) || !tensor_ok(be, a, DT_F32) ||
        !tensor_ok(be, out, DT_F32) || !same_shape(a, out) || !alias_ok(out, a))
        return LLMEM_E_INVALID;
    if (llmem_tensor_nelements(out) == 0)
        return LLMEM_OK;
    return fn(be, a, cap, out);
}
