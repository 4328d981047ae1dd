/* The Mamba-2 decode step around in_proj's held split-K sum, as
 * models/forward.c mamba() records it at one token a stream: in_proj (a
 * product of m rows), its three column copies z [m, W0], xBC [m, CD] and
 * dt [m, W2], and the causal conv of xBC with the conv state of the
 * recurrent view. Shared by test_vulkan_sum_conv.c (the conv inside the sum
 * pass) and test_vulkan_discard.c (the pass's dropped writes): their
 * buffers, the view, the recorded ops and the float64 step. Header-only,
 * after support/vk_test.h; each suite is its own program. */
#ifndef LLMEM_TESTS_VK_CONV_STEP_H
#define LLMEM_TESTS_VK_CONV_STEP_H

#include "support/vk_test.h"
#include "llmem/view.h"

#define K_IN 256 /* in_proj's input width */
#define W0 128   /* z */
#define CD 264   /* xBC: conv_dim */
#define W2 8     /* dt */
#define NIN (W0 + CD + W2)
#define MAX_M 64

/* The inputs of a step: m streams, the conv's d_conv, dtypes (weights
 * and bias in w_dt, the state in st_dt), whether the conv has a bias;
 * activations a [m, K_IN], in_proj win [NIN, K_IN] (bf16-exact), conv
 * weights cw [CD, dc] and bias cb [CD] (exact in w_dt), the state image
 * st [n_slots, dc - 1, CD] (exact in st_dt), stream s reading slot src[s]
 * (-1: zeros) and writing dst[s] (-1: nothing). The arrays belong to the
 * caller. */
typedef struct vcs_in {
    int32_t m, dc;
    llmem_dtype w_dt, st_dt;
    bool bias;
    float *a, *win, *cw, *cb, *st;
    int32_t n_slots, src[MAX_M], dst[MAX_M];
} vcs_in;

/* The step's tensors on one backend, each in a buffer of its own, and the
 * recurrent view of the conv state (rs points into this struct: it must
 * not move between vcs_make and vcs_free). */
typedef struct vcs_step {
    llmem_tensor a, win, zx, z, xb, dt, out, cw, cb, st;
    llmem_buffer *b[16], *idx, *state;
    int nb;
    llmem_state_desc desc;
    llmem_rs_view rs;
    llmem_view view;
} vcs_step;

/* Elements of in's state image. */
static inline size_t vcs_st_elems(const vcs_in *in)
{
    return (size_t)in->n_slots * (size_t)(in->dc - 1) * CD;
}

/* A tensor of dtype dt [n0, n1] holding v (exact in dt) in a new buffer *keep. */
static inline llmem_tensor vcs_up(llmem_backend *be, llmem_buffer **keep, const float *v,
                                  llmem_dtype dt, int32_t n0, int32_t n1)
{
    return dt == F32 ? vk_up_f32_2d(be, keep, v, n0, n1) : vk_up_bf16_2d(be, keep, v, n0, n1);
}

/* Uploads in's inputs to be and makes the view (tables: src [m] then
 * dst [m]; no checkpoints); z, xBC, dt, in_proj's output and the conv's
 * output are left unwritten. vcs_free releases everything. */
static inline void vcs_make(llmem_backend *be, const vcs_in *in, vcs_step *s)
{
    int32_t m = in->m;
    s->nb = 0;
    s->a = vk_up_f32_2d(be, &s->b[s->nb++], in->a, m, K_IN);
    s->win = vk_up_bf16_2d(be, &s->b[s->nb++], in->win, NIN, K_IN);
    s->zx = vk_up_f32_2d(be, &s->b[s->nb++], NULL, m, NIN);
    s->z = vk_up_f32_2d(be, &s->b[s->nb++], NULL, m, W0);
    s->xb = vk_up_f32_2d(be, &s->b[s->nb++], NULL, m, CD);
    s->dt = vk_up_f32_2d(be, &s->b[s->nb++], NULL, m, W2);
    s->out = vk_up_f32_2d(be, &s->b[s->nb++], NULL, m, CD);
    s->cw = vcs_up(be, &s->b[s->nb++], in->cw, in->w_dt, CD, in->dc);
    s->cw.n_dims = 3; /* [CD, 1, dc], HF's layout */
    s->cw.ne[2] = s->cw.ne[1];
    s->cw.ne[1] = 1;
    llmem_tensor cb = vcs_up(be, &s->b[s->nb++], in->cb, in->w_dt, 1, CD);
    s->cb = (llmem_tensor){cb.buf, 0, cb.dtype, 1, {CD, 1, 1, 1}}; /* [CD] */
    s->st = vcs_up(be, &s->b[s->nb++], in->st, in->st_dt, in->n_slots * (in->dc - 1), CD);
    s->state = s->st.buf;
    int32_t tab[2 * MAX_M];
    memcpy(tab, in->src, (size_t)m * 4);
    memcpy(tab + m, in->dst, (size_t)m * 4);
    OK(llmem_buffer_alloc(be, sizeof tab, &s->idx));
    OK(llmem_buffer_upload(s->idx, 0, tab, sizeof tab));
    s->desc = (llmem_state_desc){"conv", 2, {in->dc - 1, CD}, in->st_dt};
    s->rs = (llmem_rs_view){.n_states = 1, .desc = &s->desc, .state = &s->state,
                            .n_slots = in->n_slots, .n_seqs = m, .n_seq_tokens = 1, .n_ckpt = 0,
                            .src_slot = {in->src, 0, m}, .dst_slot = {in->dst, (size_t)m * 4, m}};
    s->view = llmem_view_make(LLMEM_VIEW_RECURRENT, &s->rs, sizeof s->rs, s->idx);
}

/* Records in_proj (precise or fast) and the z / xBC / dt copies. */
static inline void vcs_in_proj(llmem_backend *be, vcs_step *s, bool fast)
{
    OK((fast ? llmem_op_matmul_fast : llmem_op_matmul)(be, &s->a, &s->win, &s->zx));
    OK(llmem_op_copy(be, &s->zx, 0, &s->z));
    OK(llmem_op_copy(be, &s->zx, W0, &s->xb));
    OK(llmem_op_copy(be, &s->zx, W0 + CD, &s->dt));
}

/* Records the conv of xBC with the state (with in's bias or none). */
static inline void vcs_conv(llmem_backend *be, vcs_step *s, const vcs_in *in)
{
    OK(llmem_op_ssm_conv(be, &s->view, 0, &s->xb, &s->cw, in->bias ? &s->cb : NULL, &s->out));
}

static inline void vcs_free(vcs_step *s)
{
    llmem_buffer_free(s->idx);
    for (int i = 0; i < s->nb; i++)
        llmem_buffer_free(s->b[i]);
}

/* What a run gives back: the conv's output [m, CD], the copies z [m,
 * W0], xBC [m, CD], dt [m, W2], the state image (as f32), in that order;
 * a suite may add its own results from VCS_N_R on. */
enum { R_OUT, R_Z, R_XB, R_DT, R_ST, VCS_N_R };

/* After a synchronize: r[R_OUT .. R_ST] = new f32 copies (malloc'd: the
 * caller frees them) of the step's results. */
static inline void vcs_download(const vcs_step *s, float *r[VCS_N_R])
{
    r[R_OUT] = vk_download_f32(&s->out);
    r[R_Z] = vk_download_f32(&s->z);
    r[R_XB] = vk_download_f32(&s->xb);
    r[R_DT] = vk_download_f32(&s->dt);
    r[R_ST] = vk_download_f32(&s->st);
}

/* The float64 step: zx = a · winᵀ [m, NIN]; for stream s, channel c: u =
 * the source slot's dc - 1 rows (zeros for src -1), then x = zx[s, W0 +
 * c]; out[s, c] = silu(b + sum_k w[c, k] u_k) (HF transformers
 * Mamba2Mixer.torch_forward at one token); the destination slot gets
 * u[1..] (shifted by one, the token last). want_st: the expected state
 * image (the initial values where nothing writes), written[i]: whether a
 * destination writes element i. Every source is read before any
 * destination is written. */
static inline void vcs_reference(const vcs_in *in, double *zx, double *out, double *want_st,
                                 bool *written)
{
    int32_t m = in->m, dc = in->dc;
    vk_ref_mm_f32(in->a, in->win, m, K_IN, NIN, zx);
    size_t n_st = vcs_st_elems(in);
    for (size_t i = 0; i < n_st; i++) {
        want_st[i] = in->st[i];
        written[i] = false;
    }
    size_t slot = (size_t)(dc - 1) * CD;
    double *u = malloc((size_t)dc * sizeof *u);
    ck_assert_ptr_nonnull(u);
    for (int32_t s = 0; s < m; s++)
        for (int32_t c = 0; c < CD; c++) {
            for (int32_t j = 0; j + 1 < dc; j++)
                u[j] = in->src[s] < 0 ? 0.0 : in->st[(size_t)in->src[s] * slot + (size_t)j * CD + c];
            u[dc - 1] = zx[(size_t)s * NIN + W0 + c];
            double acc = in->bias ? in->cb[c] : 0.0;
            for (int32_t j = 0; j < dc; j++)
                acc += (double)in->cw[(size_t)c * dc + j] * u[j];
            out[(size_t)s * CD + c] = vk_silu(acc);
            if (in->dst[s] >= 0)
                for (int32_t j = 0; j + 1 < dc; j++) {
                    size_t at = (size_t)in->dst[s] * slot + (size_t)j * CD + c;
                    want_st[at] = u[j + 1];
                    written[at] = true;
                }
        }
    free(u);
}

#endif
