/* llmem Vulkan backend: the Mamba-2 ops over many tokens per stream
 * (prefill, checkpoints). shaders/ssm_scan_pre.comp is the recurrent scan
 * with lanes over d_state and token blocks staged in shared memory;
 * shaders/ssm_conv_pre.comp the causal conv1d with one invocation per
 * (stream, block of tokens, channel). Semantics are those of
 * vk_ops_mamba.c's shaders (HF transformers Mamba2Mixer.torch_forward
 * applied token by token; Dao & Gu, ICML 2024, Sec. 3), with the same slot
 * discipline: sources read before any write, a state_gather snapshot when
 * another stream writes a stream's source (vk_rs_prepare).
 *
 * Measurement switches, read once when the backend opens (vk_scan_config,
 * v->scan): LLMEM_VULKAN_SCAN_PRE=0 keeps
 * ssm_scan.comp and ssm_conv.comp for every multi-token ubatch;
 * LLMEM_VULKAN_SCAN_PRE_RPL (1..8; default 4, 8 for 32 tokens a stream or
 * fewer) sets the scan's state rows per lane group, LLMEM_VULKAN_SCAN_PRE_T
 * (1..64; default 4, 2 for 32 tokens or fewer) its tokens per
 * staged block, LLMEM_VULKAN_SCAN_PRE_WG (32..1024; default 256) its
 * invocations; LLMEM_VULKAN_SCAN_PRE_WIDE=0 keeps those defaults where
 * the wide layout (below) would replace them; LLMEM_VULKAN_SCAN_PRE_VAR=
 * rolled keeps the token loop of full blocks rolled (shader
 * ssm_scan_pre_rolled), =nopf stages each block without prefetching it
 * (ssm_scan_pre_nopf).
 */
#include "llmem/view.h"
#include "vk_internal.h"
#include "vk_rs.h"

#define PRE_WG 256   /* ssm_scan_pre.comp: invocations (at least d_state / 4) */
/* State rows per lane group and tokens per staged block: the best of the
 * H200 sweep at the 9B shape (docs/benchmarks.md, "Vulkan Mamba-2
 * prefill"), 4 x 4 at 512 tokens a stream, 8 x 2 at 32 and 8 (many
 * streams: fewer, wider workgroups per state). */
#define PRE_RPL 4
#define PRE_T 4
#define PRE_SHORT 32 /* tokens a stream up to which PRE_RPL_SHORT x PRE_T_SHORT */
#define PRE_RPL_SHORT 8
#define PRE_T_SHORT 2
/* The wide layout (issue 12, Vulkan prefill at the Bamba-2B shape): where
 * the default layout's grid has fewer workgroups than the device has
 * compute units (2B: 64 heads x 2 row blocks = 128 on the H200's 132),
 * each SM holds one workgroup of 8 subgroups, and the global loads of the
 * next block, issued one block ahead, are waited for at the next block's
 * staging. PRE_WG_WIDE invocations of PRE_RPL_WIDE rows a lane group
 * (the same 32 rows a workgroup at d_state 128: more subgroups an SM, fewer
 * rows each) over blocks of PRE_T_WIDE tokens (the loads issued twice as
 * far ahead, and the reduction of a block's shares spread over every
 * invocation). The shares are added in the same order whatever the
 * layout: the same bits. */
#define PRE_RPL_WIDE 2
#define PRE_T_WIDE 8
#define PRE_WG_WIDE 512
#define CONV_PRE_WG 128
#define CONV_PRE_TB 16 /* ssm_conv_pre.comp: tokens per invocation */

/* The scan's layout for d_state n and head_dim hd, n_seqs streams of n_tok
 * tokens and n_heads heads: lane groups *lg of n / 4 lanes, *rpl rows each,
 * *t tokens per block; false when the shader cannot take the shape (then
 * ssm_scan.comp runs). */
static bool scan_layout(const vk_backend *v, uint32_t n, uint32_t hd, uint32_t n_tok,
                        uint32_t n_seqs, uint32_t n_heads, uint32_t *lg, uint32_t *rpl,
                        uint32_t *t)
{
    if (n % 4 != 0 || n / 4 > PRE_WG || hd == 0)
        return false;
    uint32_t L = n / 4;
    bool few = n_tok <= PRE_SHORT;
    /* the knobs: read when the backend opens (vk_scan_config) */
    *rpl = v->scan.pre_rpl ? v->scan.pre_rpl : few ? PRE_RPL_SHORT : PRE_RPL;
    *t = v->scan.pre_t ? v->scan.pre_t : few ? PRE_T_SHORT : PRE_T;
    uint32_t wg = v->scan.pre_wg ? v->scan.pre_wg : PRE_WG;
    if (!few && v->scan.pre_wide) {
        /* the default layout's grid (its lane groups shrunk as below) */
        uint32_t lg0 = PRE_WG / L, rpl0 = *rpl;
        while (lg0 > 1 && (lg0 / 2) * rpl0 >= hd)
            lg0 /= 2;
        uint64_t blocks = vk_div_up((uint64_t)hd, (uint64_t)lg0 * rpl0);
        if ((uint64_t)n_seqs * n_heads * blocks < v->mm.n_sm) {
            *rpl = v->scan.pre_rpl ? v->scan.pre_rpl : PRE_RPL_WIDE;
            *t = v->scan.pre_t ? v->scan.pre_t : PRE_T_WIDE;
            wg = v->scan.pre_wg ? v->scan.pre_wg : PRE_WG_WIDE;
        }
    }
    *lg = wg / L > 0 ? wg / L : 1;
    /* no more rows per workgroup than the head has (short heads, small d_state) */
    while (*lg > 1 && (*lg / 2) * *rpl >= hd)
        *lg /= 2;
    uint32_t rw = *lg * *rpl;
    wg = *lg * L;
    for (;;) {
        /* bsh, csh, xsh, dtsh, dash, part, and common.glsl's red_f[WG] */
        uint64_t bytes = 4ull * (2ull * *t * n + (uint64_t)*t * rw * (L + 1) + (uint64_t)*t * rw +
                                 2ull * *t + wg);
        if (bytes <= v->props.limits.maxComputeSharedMemorySize)
            break;
        if (*t == 1)
            return false;
        *t /= 2;
    }
    return wg <= v->props.limits.maxComputeWorkGroupInvocations;
}

bool vk_scan_pre_takes(const vk_backend *v, const llmem_ssm_params *p, const llmem_rs_view *rs)
{
    uint32_t lg, rpl, t;
    if (!v->scan.pre || rs->n_seq_tokens < 2)
        return false;
    return scan_layout(v, (uint32_t)p->d_state, (uint32_t)p->head_dim,
                       (uint32_t)rs->n_seq_tokens, (uint32_t)rs->n_seqs, (uint32_t)p->n_heads,
                       &lg, &rpl, &t);
}

llmem_status vk_scan_pre(vk_backend *v, const llmem_ssm_params *p, const llmem_view *view,
                         int32_t state, llmem_ct *xbc, llmem_ct *dt, llmem_ct *a_log,
                         llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    uint32_t lg, rpl, t;
    if (!scan_layout(v, (uint32_t)p->d_state, (uint32_t)p->head_dim,
                     (uint32_t)rs->n_seq_tokens, (uint32_t)rs->n_seqs, (uint32_t)p->n_heads,
                     &lg, &rpl, &t))
        return LLMEM_E_UNSUPPORTED;
    uint32_t n_blocks = (uint32_t)vk_div_up((uint64_t)p->head_dim, (uint64_t)lg * rpl);
    vk_scan_launch l = {.shader = v->scan.pre_shader, .wg = lg * ((uint32_t)p->d_state / 4),
                        .spec = {rpl, t, lg}, .n_spec = 3, .n_chunks = n_blocks,
                        .groups = (uint64_t)rs->n_seqs * (uint64_t)p->n_heads * n_blocks};
    return vk_rs_scan(v, &l, p, view, state, xbc, dt, a_log, d, dt_bias, y);
}

bool vk_conv_pre_takes(const vk_backend *v, const llmem_view *view, int32_t state)
{
    const llmem_rs_view *rs = llmem_view_rs(view);
    /* a block's first DC - 1 inputs must come from x or, in block 0, the state */
    return v->scan.pre && rs->n_seq_tokens >= 2 && rs->desc[state].shape[0] + 1 <= CONV_PRE_TB;
}

llmem_status vk_conv_pre(vk_backend *v, const llmem_view *view, int32_t state, llmem_ct *x,
                         llmem_ct *w, llmem_ct *b, llmem_ct *out)
{
    return vk_rs_conv_blocks(v, VK_SH_SSM_CONV_PRE, CONV_PRE_WG, CONV_PRE_TB, view, state, x, w,
                             b, out);
}
