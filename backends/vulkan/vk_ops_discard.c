/* llmem Vulkan backend: llmem_op_discard (<llmem/ops_discard.h>), an open
 * op. A discarded tensor that a held split-K sum pass would still write
 * (in_proj's output and its xBC copy at the decode rows, models/forward.c)
 * is dropped from that pass (vk_sum_drop_dead, vk_sum.c); anything else
 * is left as it is, which the contract allows. $LLMEM_VULKAN_DISCARD
 * (unset: VK_DISCARD_DEFAULT, vk_sum.h) picks what may be dropped.
 */
#include "llmem/ops_discard.h"
#include "vk_internal.h"
#include "vk_sum.h"

static llmem_status vk_op_discard(llmem_backend *be, const llmem_tensor *t)
{
    vk_backend *v = vk_from(be);
    vk_sum_drop_dead(v, t, VK_KNOB(v, discard, VK_DISCARD_DEFAULT));
    return LLMEM_OK;
}
LLMEM_OP_IMPL(vk_op_impls, LLMEM_OP_DISCARD, LLMEM_OP_DISCARD_LAYOUT, llmem_op_discard_fn,
              vk_op_discard);
