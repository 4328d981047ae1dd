/* llmem models/: falcon_h1's scratch and muP vector (transformers
 * FalconH1DecoderLayer, FalconH1Mixer, compute_mup_vector).
 *
 * A Falcon-H1 layer runs attention and Mamba-2 side by side on one normed
 * input h:  x += ssm_out * mamba(ssm_in * h) + attn_out * attn(attn_in * h),
 * then x += down_mult * down(silu(gate_mult * gate(h')) * up(h')). The
 * Mamba-2 in_proj output is multiplied by the muP vector: ssm_multipliers
 * [z, x, B, C, dt] over the segments [d_inner, d_inner, G*N, G*N, heads];
 * without mamba_rms_norm the scan output is gated as y * silu(z) with no
 * norm. The runtime keeps h and the Mamba-2 branch here while the other
 * branch runs.
 */
#include <stdlib.h>

#include "llmem/model.h"
#include "llmem/ops.h"
#include "models/hf_internal.h"

struct hf_falcon {
    llmem_buffer *buf;
    int32_t n_ubatch, hidden, in_proj;
    size_t off_save, off_sum, off_mup;
};

static size_t up256(size_t n)
{
    return (n + 255) / 256 * 256;
}

llmem_status hf_falcon_create(llmem_backend *be, const llmem_model_config *cfg, int32_t n_ubatch,
                              hf_falcon **out)
{
    *out = NULL;
    if (cfg->arch != LLMEM_ARCH_FALCON_H1)
        return LLMEM_OK;
    hf_falcon *f = calloc(1, sizeof *f);
    float *mup = malloc((size_t)cfg->ssm_in_proj_dim * sizeof *mup);
    llmem_status s = LLMEM_E_NO_MEMORY;
    if (!f || !mup)
        goto fail;
    f->n_ubatch = n_ubatch;
    f->hidden = cfg->hidden_size;
    f->in_proj = cfg->ssm_in_proj_dim;
    size_t act = up256((size_t)n_ubatch * (size_t)cfg->hidden_size * 4);
    f->off_save = 0;
    f->off_sum = act;
    f->off_mup = 2 * act;
    int32_t din = cfg->ssm_d_inner, gn = cfg->ssm_n_groups * cfg->ssm_d_state;
    int32_t ends[5] = {din, 2 * din, 2 * din + gn, 2 * din + 2 * gn, cfg->ssm_in_proj_dim};
    for (int32_t i = 0, seg = 0; i < cfg->ssm_in_proj_dim; i++) {
        while (i >= ends[seg])
            seg++;
        mup[i] = (float)cfg->ssm_multipliers[seg];
    }
    if ((s = llmem_buffer_alloc(be, f->off_mup + up256((size_t)f->in_proj * 4), &f->buf)) !=
        LLMEM_OK)
        goto fail;
    if ((s = llmem_buffer_upload(f->buf, f->off_mup, mup, (size_t)f->in_proj * 4)) != LLMEM_OK)
        goto fail;
    free(mup);
    *out = f;
    return LLMEM_OK;
fail:
    free(mup);
    hf_falcon_destroy(f);
    return s;
}

void hf_falcon_destroy(hf_falcon *f)
{
    if (!f)
        return;
    llmem_buffer_free(f->buf);
    free(f);
}

void hf_falcon_tensors(const hf_falcon *f, int32_t T, llmem_tensor *save, llmem_tensor *sum,
                       llmem_tensor *mup)
{
    *save = llmem_tensor_2d(f->buf, f->off_save, LLMEM_DTYPE_F32, T, f->hidden);
    *sum = llmem_tensor_2d(f->buf, f->off_sum, LLMEM_DTYPE_F32, T, f->hidden);
    *mup = llmem_tensor_1d(f->buf, f->off_mup, LLMEM_DTYPE_F32, f->in_proj);
}
