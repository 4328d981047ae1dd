/* llmem: discard, the model's word that a tensor's contents are dead (issue
 * 12, the Vulkan decode step), an open op (<llmem/ops_impl.h>, "Open ops")
 * that no central table names. Layout of the header as <llmem/ops_gdn.h>:
 * op id, wrapper (the common rules of <llmem/ops.h> apply), then the
 * implementation type and argument layout for backend authors. Metadata
 * and wrapper: backends/ops_discard.c; implementations: backends/vulkan/
 * vk_ops_discard.c (through vk_sum.c's held pass) and
 * backends/cpu/ops_discard.c (nothing to drop: listed so that the
 * reference has every op). CUDA has none: there the op does nothing.
 */
#ifndef LLMEM_OPS_DISCARD_H
#define LLMEM_OPS_DISCARD_H

#include "llmem/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* Op id (llmem_backend_supports, llmem_op_name: "discard"). */
#define LLMEM_OP_DISCARD LLMEM_OP_TAG('d', 's', 'c', 'd')

/* Says that the contents of t (any dtype, dense, of this backend) are no
 * longer needed: no op the caller records later reads them before it
 * writes them again (a model records it after a scratch tensor's last
 * reader, e.g. in_proj's [T, d_in_proj] f32 output once z, xBC and dt are
 * copied out; models/forward.c). Afterwards t's contents are unspecified
 * until the next write: the values before the discard, those an earlier
 * op would have written, or anything else. A backend may use it to drop
 * a write it has not yet issued (Vulkan: the column of a held split-K sum
 * pass that writes t, vk_sum.c), and is free to ignore it; a backend
 * without an implementation does nothing and returns LLMEM_OK (not
 * LLMEM_E_UNSUPPORTED: the op never changes what a correct model
 * computes). Stream-ordered like every op; no host wait.
 * Debugging: with LLMEM_DISCARD_POISON=1 in the environment (read at each
 * call) the wrapper then fills t's 4-byte-aligned words with 0xffffffff
 * (NaN in f32, f16 and bf16) through llmem_buffer_fill, on every backend,
 * so a model that reads a discarded tensor shows up in its parity and
 * greedy tests instead of silently reading stale values.
 * Returns LLMEM_OK (a zero-element t too); LLMEM_E_INVALID for a NULL
 * backend or tensor, or a malformed one (not this backend's, outside its
 * buffer); the fill's errors with the poison on. */
llmem_status llmem_op_discard(llmem_backend *be, const llmem_tensor *t);

/* ---- for backend authors ---------------------------------------------------------- */

/* The implementation's type: called by the wrapper after its checks, never
 * with zero elements. It must not make t's later contents matter to any
 * correct caller, and may do nothing. */
typedef llmem_status (*llmem_op_discard_fn)(llmem_backend *be, const llmem_tensor *t);

/* Argument layout (LLMEM_OP_LAYOUT, <llmem/ops.h>): no parameter struct. */
#define LLMEM_OP_DISCARD_LAYOUT LLMEM_OP_LAYOUT(0, 1)

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif
