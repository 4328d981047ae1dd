/* llmem Vulkan backend: the sampling ops (sample, logprob_gather,
 * top_logprobs; contract in <llmem/ops.h>, shaders/sample.comp, and
 * shaders/logprob_gather.comp for logprob_gather). The core
 * (backends/sample.c) has checked dtypes, shapes, overlaps and the
 * parameters. Greedy rows are argmax.comp, the same as llmem_op_argmax.
 * The ids land in a device tensor, so a forward pass and its sampling are
 * one submit and only the ids cross to the host.
 */
#include <stdlib.h>

#include "vk_internal.h"

#define SAMPLE_WG 128
#define ARGMAX_SPLIT 64           /* $LLMEM_VULKAN_ARGMAX_SPLIT: workgroups of one long row */
#define ARGMAX_SPLIT_COLS 16384   /* the columns from which a row is split */

uint32_t vk_argmax_split(llmem_backend *be, vk_backend *v, uint64_t cols)
{
    long split = VK_KNOB(v, argmax_split, ARGMAX_SPLIT);
    if (split < 2 || cols < ARGMAX_SPLIT_COLS || cols / 4 < (uint64_t)split)
        return 0;
    if (!v->argmax_part) {
        size_t bytes = (4 + 2 * (size_t)VK_ARGMAX_SPLIT_MAX) * 4;
        llmem_buffer *b = NULL;
        if (vk_buffer_alloc(be, bytes, &b) != LLMEM_OK)
            return 0;
        b->size = bytes;
        if (vk_buffer_fill(be, b, 0, bytes, 0) != LLMEM_OK) { /* the counter starts at zero */
            vk_buffer_free(be, b);
            return 0;
        }
        v->argmax_part = b;
    }
    return (uint32_t)split;
}


static uint32_t cols_of(const llmem_tensor *t)
{
    return (uint32_t)t->ne[t->n_dims - 1];
}

static uint64_t rows_of(const llmem_tensor *t)
{
    uint64_t r = 1;
    for (int32_t d = 0; d + 1 < t->n_dims; d++)
        r *= (uint64_t)t->ne[d];
    return r;
}

/* Records one sample.comp dispatch (one workgroup per row). */
static llmem_status run_mode(vk_backend *v, uint32_t mode, const llmem_sample_params *sp,
                             llmem_ct *logits, llmem_ct *in, llmem_ct *out, llmem_ct *out2,
                             uint32_t n_top)
{
    vk_op op;
    vk_op_init(&op, v->subgroup ? VK_SH_SAMPLE_SG : VK_SH_SAMPLE, SAMPLE_WG);
    vk_op_spec(&op, mode);
    uint64_t rows = rows_of(logits);
    uint32_t xo = vk_op_tensor(v, &op, logits, false);
    uint32_t io = vk_op_tensor(v, &op, in, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    uint32_t o2 = vk_op_tensor(v, &op, out2, true);
    vk_op_u32(&op, (uint32_t)rows);
    vk_op_u32(&op, cols_of(logits));
    vk_op_u32(&op, xo);
    vk_op_u32(&op, io);
    vk_op_u32(&op, oo);
    vk_op_u32(&op, o2);
    vk_op_u32(&op, in != NULL);
    vk_op_u32(&op, sp && sp->top_k > 0 ? (uint32_t)sp->top_k : 0u);
    vk_op_f32(&op, sp ? sp->temperature : 1.0f);
    vk_op_f32(&op, sp ? sp->top_p : 1.0f);
    vk_op_f32(&op, sp ? sp->min_p : 0.0f);
    vk_op_u32(&op, sp ? (uint32_t)sp->seed : 0u);
    vk_op_u32(&op, sp ? (uint32_t)(sp->seed >> 32) : 0u);
    vk_op_u32(&op, n_top);
    return vk_op_run(v, &op, rows);
}

llmem_status vk_op_sample(llmem_backend *be, const llmem_sample_params *p, llmem_ct *logits,
                          llmem_ct *ctr, llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    if (!(p->temperature > 0.0f))
        return vk_op_argmax(be, logits, out);
    return run_mode(v, 0, p, logits, ctr, out, NULL, 0);
}

/* logprob_gather.comp (one pass, online softmax normaliser), one
 * workgroup of GATHER_WG invocations per row (ROW 256 where the device
 * allows fewer), vec4 loads where the rows are 16-byte aligned;
 * $LLMEM_VULKAN_GATHER_OLD=1: sample.comp's two-pass MODE 2 (128
 * invocations, one scalar load at a time), for comparison. */
#define GATHER_WG 1024

llmem_status vk_op_logprob_gather(llmem_backend *be, llmem_ct *logits, llmem_ct *ids,
                                  llmem_ct *out)
{
    vk_backend *v = vk_from(be);
    if (v->knobs.gather_old == '1') /* $LLMEM_VULKAN_GATHER_OLD */
        return run_mode(v, 2, NULL, logits, ids, out, NULL, 0);
    uint32_t wg = GATHER_WG <= v->props.limits.maxComputeWorkGroupInvocations ? GATHER_WG : 256;
    uint64_t rows = rows_of(logits);
    uint32_t cols = cols_of(logits);
    vk_op op;
    vk_op_init(&op, VK_SH_LOGPROB_GATHER, wg);
    uint32_t xo = vk_op_tensor(v, &op, logits, false);
    uint32_t io = vk_op_tensor(v, &op, ids, false);
    uint32_t oo = vk_op_tensor(v, &op, out, true);
    uint32_t xv = vk_op_tensor(v, &op, logits, false); /* the same bytes, read as vec4 */
    vk_op_spec(&op, xo % 4 == 0 && xv == xo && cols % 4 == 0);
    vk_op_u32(&op, (uint32_t)rows);
    vk_op_u32(&op, cols);
    vk_op_u32(&op, xo);
    vk_op_u32(&op, io);
    vk_op_u32(&op, oo);
    return vk_op_run(v, &op, rows);
}

llmem_status vk_op_top_logprobs(llmem_backend *be, llmem_ct *logits, int32_t n, llmem_ct *top_ids,
                                llmem_ct *top_lp)
{
    return run_mode(vk_from(be), 1, NULL, logits, NULL, top_ids, top_lp, (uint32_t)n);
}
