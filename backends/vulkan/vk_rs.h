/* llmem Vulkan backend: what the recurrent-state ops share (vk_ops_mamba.c,
 * vk_ops_scan_pre.c, vk_ops_quant.c, vk_ops_ssm1.c, vk_ops_gdn.c): source
 * snapshots for copy-on-write, the view's bindings and table words, and the
 * conv and scan recordings the Mamba-2, Mamba-1, short-conv and gated
 * delta rule ops build on. Kept apart from vk_internal.h, which the other
 * ops include. */
#ifndef LLMEM_VK_RS_H
#define LLMEM_VK_RS_H

#include "llmem/view.h"
#include "vk_internal.h"

/* Recurrent views (vk_ops_mamba.c): when a stream reads a slot another
 * stream writes, records a gather of every stream's source state into a
 * new f32 scratch snapshot *snap ([n_seqs][slot elements]) and sets
 * *use_snap; the caller releases *snap after recording its op. */
llmem_status vk_rs_prepare(vk_backend *v, const llmem_view *view, int32_t state,
                           vk_alloc *snap, bool *use_snap);
/* Whether a stream of rs reads a source slot that another stream writes
 * (its destination or a checkpoint), from the host copies of the tables:
 * then the sources must be read from a snapshot (copy-on-write of a shared
 * state). Out-of-range slots count as no slot (the ops validate them).
 * Errors: LLMEM_E_NO_MEMORY (host scratch; *out is false). */
llmem_status vk_rs_needs_snapshot(const llmem_rs_view *rs, bool *out);
/* Binds a recurrent op's view buffers in the order the shaders declare
 * them: the index buffer (read), state buffer `state` (read-write), then
 * the snapshot snap (read) or, when snap is NULL, a dummy binding. */
void vk_rs_bind(vk_backend *v, vk_op *op, const llmem_view *view, int32_t state,
                const vk_alloc *snap);
/* Pushes the words of rs's src, dst and ckpt slot tables (in that order). */
void vk_rs_tables(vk_op *op, const llmem_rs_view *rs);
/* Pushes the words of view's snap_tok and snap_slot tables (<llmem/view.h>,
 * the snapshot inside the ubatch), 0xffffffff twice when no stream has one
 * (llmem_rs_view_snap_used): the last two push words of the recurrent
 * shaders that take a multi-token view (ssm_conv, ssm_conv_pre, ssm_scan,
 * ssm_scan_pre, ssm_scan_q, short_conv, ssm_scan1, gdn), whose last
 * specialization constant SNAPSHOT says whether one is used (0 compiles
 * the snapshot out). */
void vk_rs_snap_words(vk_op *op, const llmem_view *view);
/* Records a causal depthwise conv with conv state `state` of view
 * ([d_conv - 1, conv_dim] past rows; shader ssm_conv.comp for Mamba-2 or
 * short_conv.comp for LFM2, which share their bindings and push words):
 * x [T, cols] f32, w [conv_dim, 1, d_conv], b [conv_dim] or NULL, out
 * [T, conv_dim] f32, checked by the backends/ops wrappers. Snapshots the
 * sources first when needed (vk_rs_prepare). Errors: those of
 * vk_rs_prepare, vk_op_tensor and vk_op_run. */
llmem_status vk_rs_conv(vk_backend *v, vk_shader_id shader, const llmem_view *view,
                        int32_t state, llmem_ct *x, llmem_ct *w, llmem_ct *b, llmem_ct *out);
/* vk_rs_conv_blocks: the same bindings and push words run by a shader that
 * takes blocks of tb tokens per invocation (ssm_conv_pre.comp: one more
 * specialization constant, tb, and one more push word, the block count;
 * ceil(T / tb) * n_seqs * conv_dim invocations in workgroups of wg). tb = 0
 * is vk_rs_conv's one-token-loop shader (no extra constant or word).
 * Errors: LLMEM_E_UNSUPPORTED when d_conv - 1 > tb > 0 (a block's history
 * must come from one block or the state), then those of vk_rs_conv. */
llmem_status vk_rs_conv_blocks(vk_backend *v, vk_shader_id shader, uint32_t wg, uint32_t tb,
                               const llmem_view *view, int32_t state, llmem_ct *x, llmem_ct *w,
                               llmem_ct *b, llmem_ct *out);
/* Records one Mamba-2 selective scan over the recurrent view (shaders
 * ssm_scan.comp, ssm_scan_decode.comp and ssm_scan_pre.comp share their
 * bindings and push words): l->shader in workgroups of l->wg, the six
 * common specialization constants (d_state, the state, A_log, D and dt_bias
 * dtypes, snapshot on/off) followed by l->spec[0..n_spec), the shader's
 * chunk count as push word 8, l->groups workgroups. Tensors as
 * vk_op_ssm_scan (HF Mamba2Mixer.torch_forward token by token). Snapshots
 * the sources first when needed (vk_rs_prepare). Errors: those of
 * vk_rs_prepare, vk_op_tensor and vk_op_run. */
typedef struct vk_scan_launch {
    vk_shader_id shader;
    uint32_t wg;
    uint32_t spec[3]; /* the shader's own specialization constants */
    uint32_t n_spec;
    uint32_t n_chunks; /* row chunks (blocks) per head */
    uint64_t groups;   /* workgroups dispatched */
    /* ssm_scan_decode.comp only, else NULL: the held-back conv whose input
     * xbc is, folded in (its CONV constant, bindings 8-11, four more push
     * words; the caller took it from v->fold) */
    const struct vk_conv_fold *fold;
} vk_scan_launch;
llmem_status vk_rs_scan(vk_backend *v, const vk_scan_launch *l, const llmem_ssm_params *p,
                        const llmem_view *view, int32_t state, llmem_ct *xbc, llmem_ct *dt,
                        llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y);
/* Multi-token Mamba-2 ops (vk_ops_scan_pre.c; shaders ssm_scan_pre.comp,
 * ssm_conv_pre.comp). vk_scan_pre_takes: whether vk_op_ssm_scan hands the
 * ubatch to vk_scan_pre (2+ tokens per stream, d_state % 4 == 0, the
 * shader's shared arrays within the device limit; not with
 * LLMEM_VULKAN_SCAN_PRE=0). vk_scan_pre: vk_op_ssm_scan's semantics and
 * arguments (f32/f16/bf16 states); errors: LLMEM_E_UNSUPPORTED (a shape
 * vk_scan_pre_takes refuses), those of vk_rs_prepare, vk_op_tensor and
 * vk_op_run. vk_conv_pre_takes / vk_conv_pre: the same for vk_op_ssm_conv
 * (d_conv - 1 <= 16). */
bool vk_scan_pre_takes(const vk_backend *v, const llmem_ssm_params *p, const llmem_rs_view *rs);
llmem_status vk_scan_pre(vk_backend *v, const llmem_ssm_params *p, const llmem_view *view,
                         int32_t state, llmem_ct *xbc, llmem_ct *dt, llmem_ct *a_log,
                         llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y);
bool vk_conv_pre_takes(const vk_backend *v, const llmem_view *view, int32_t state);
llmem_status vk_conv_pre(vk_backend *v, const llmem_view *view, int32_t state, llmem_ct *x,
                         llmem_ct *w, llmem_ct *b, llmem_ct *out);

#endif
