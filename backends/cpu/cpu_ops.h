/* llmem: shared helpers of the CPU ops (internal; backends/cpu/ops_*.c).
 *
 * f16/bf16 <-> f32 conversions (round to nearest even, NaN kept quiet),
 * row loads/stores in any float dtype, host pointers of tensors and view
 * tables, and a dot product written so that compilers vectorize it
 * without -ffast-math (eight independent partial sums).
 */
#ifndef LLMEM_CPU_OPS_H
#define LLMEM_CPU_OPS_H

#include <stdint.h>
#include <string.h>

#include "backends/cpu/threadpool.h"
#include "llmem/ops_impl.h"

/* ---- scalar conversions --------------------------------------------------------- */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float bf16_to_f32(uint16_t h)
{
    return f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u);            /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u) /* inf, NaN */
        return f32_from_bits(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em >= 0x0400u) /* normal: rebias the exponent by 127 - 15 */
        return f32_from_bits(sign | ((em + (112u << 10)) << 13));
    /* zero or subnormal: em * 2^-24 is exact in f32 */
    float f = (float)em * 0x1p-24f;
    return f32_from_bits(f32_bits(f) | sign);
}

static inline uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top payload bits kept */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal f16 (>= 2^-14) */
        uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    /* subnormal or zero: adding 0.5 leaves the value rounded (to nearest
     * even) to a multiple of 2^-24 in the low mantissa bits. */
    float t = f32_from_bits(a) + 0.5f;
    return (uint16_t)(sign | (f32_bits(t) - 0x3f000000u));
}

/* Branch-free f16 -> f32 for vector loops (same results as f16_to_f32):
 * a subnormal m * 2^-24 is formed as (1 + m/1024) * 2^-14 - 2^-14, exactly. */
static inline float f16_to_f32_nb(uint16_t h)
{
    uint32_t u = h & 0x7fffu;
    uint32_t o = u << 13;
    uint32_t e = u & 0x7c00u;
    uint32_t normal = o + 0x38000000u;  /* rebias 15 -> 127 */
    uint32_t special = o + 0x70000000u; /* exponent 31 -> 255: inf, NaN */
    uint32_t sub = f32_bits(f32_from_bits(o + 0x38800000u) - 0x1p-14f);
    /* selects as masks: GCC does not if-convert the ternaries here */
    uint32_t is_special = 0u - (uint32_t)(e == 0x7c00u), is_sub = 0u - (uint32_t)(e == 0u);
    uint32_t bits = (special & is_special) | (normal & ~is_special);
    bits = (sub & is_sub) | (bits & ~is_sub);
    return f32_from_bits(bits | ((uint32_t)(h & 0x8000u) << 16));
}

/* Branch-free f32 -> bf16 (same results as f32_to_bf16). */
static inline uint16_t f32_to_bf16_nb(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x0040u;
    uint32_t is_nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    return (uint16_t)((quiet & is_nan) | (rounded & ~is_nan));
}

/* ---- rows ---------------------------------------------------------------------------- */

/* dst[0..n) = src[0..n) of dtype t (f32, f16, bf16) as f32. */
static inline void load_f32(const void *src, llmem_dtype t, int64_t n, float *dst)
{
    if (t == LLMEM_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
    } else if (t == LLMEM_DTYPE_F16) {
        const uint16_t *s = src;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++)
                dst[i + k] = f16_to_f32_nb(s[i + k]);
        for (; i < n; i++)
            dst[i] = f16_to_f32(s[i]);
    } else {
        const uint16_t *s = src;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++)
                dst[i + k] = bf16_to_f32(s[i + k]);
        for (; i < n; i++)
            dst[i] = bf16_to_f32(s[i]);
    }
}

/* dst[0..n) of dtype t = src[0..n) rounded to nearest even. */
static inline void store_f32(const float *src, llmem_dtype t, int64_t n, void *dst)
{
    if (t == LLMEM_DTYPE_F32) {
        memmove(dst, src, (size_t)n * sizeof *src);
    } else if (t == LLMEM_DTYPE_F16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = f32_to_f16(src[i]);
    } else {
        uint16_t *d = dst;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++)
                d[i + k] = f32_to_bf16_nb(src[i + k]);
        for (; i < n; i++)
            d[i] = f32_to_bf16(src[i]);
    }
}

/* ---- scaled 8-bit codes (int8, FP8 E4M3; <llmem/backend.h>) -------------------------- */

/* The value of an E4M3 code, exact (NaN for 0x7f / 0xff). */
static inline float e4m3_value(uint8_t c)
{
    uint32_t e = (c >> 3) & 15u, m = c & 7u;
    float v;
    if (e == 0) {
        v = (float)m * (1.0f / 512.0f);
    } else {
        uint32_t u = ((e + 120u) << 23) | (m << 20);
        if (e == 15 && m == 7)
            u = 0x7fc00000u;
        memcpy(&v, &u, 4);
    }
    return (c & 0x80u) ? -v : v;
}

/* dst[0..n) = code[i] * scale of scaled dtype t (I8, F8E4M3). */
static inline void load_scaled(const void *src, llmem_dtype t, int64_t n, float scale, float *dst)
{
    if (t == LLMEM_DTYPE_I8) {
        const int8_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)s[i] * scale;
    } else {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = e4m3_value(s[i]) * scale;
    }
}

/* The code of x / scale in scaled dtype t (scale 0: code 0). */
static inline uint8_t quant_one(float x, llmem_dtype t, float scale)
{
    if (t == LLMEM_DTYPE_I8)
        return (uint8_t)llmem_f32_to_i8(x, scale);
    return scale > 0.0f ? llmem_f32_to_e4m3(x / scale) : 0;
}

/* sum a[i] * b[i] in f32, eight partial sums. */
static inline float dot_f32(const float *restrict a, const float *restrict b, int64_t n)
{
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* GCC's -O2 cost model vectorizes only loops whose trip count the vector
 * code covers exactly, hence the fixed blocks of 8 below. */

/* y[i] += a * x[i] */
static inline void axpy_f32(float *restrict y, const float *restrict x, float a, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            y[i + k] += a * x[i + k];
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* y[i] *= a */
static inline void scal_f32(float *y, float a, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            y[i + k] *= a;
    for (; i < n; i++)
        y[i] *= a;
}

/* y[i] += w[i] * x[i] */
static inline void fma_f32(float *restrict y, const float *restrict w, const float *restrict x,
                           int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            y[i + k] += w[i + k] * x[i + k];
    for (; i < n; i++)
        y[i] += w[i] * x[i];
}

/* s[i] = s[i] * a + x * b[i] */
static inline void decay_add_f32(float *restrict s, const float *restrict b, float a, float x,
                                 int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[i + k] = s[i + k] * a + x * b[i + k];
    for (; i < n; i++)
        s[i] = s[i] * a + x * b[i];
}

/* ---- tensors and views ------------------------------------------------------------------ */

static inline void *tensor_data(const llmem_tensor *t)
{
    return (char *)llmem_buffer_host_ptr(t->buf) + t->offset;
}

static inline int64_t tensor_rows(const llmem_tensor *t)
{
    int64_t n = 1;
    for (int32_t i = 0; i + 1 < t->n_dims; i++)
        n *= t->ne[i];
    return n;
}

static inline int64_t tensor_cols(const llmem_tensor *t)
{
    return t->ne[t->n_dims - 1];
}

/* The device copy of a view index table (what a GPU kernel would read). */
static inline const int32_t *view_table(const llmem_view *v, const llmem_i32_table *t)
{
    if (t->n == 0)
        return NULL;
    return (const int32_t *)(const void *)((const char *)llmem_buffer_host_ptr(v->idx) +
                                           t->offset);
}

/* A small f32|f16|bf16 parameter vector as f32: points at the tensor when
 * it is f32, else converts into a new array stored in *owned (free it).
 * NULL tensor gives NULL. Returns LLMEM_E_NO_MEMORY. */
llmem_status cpu_param_f32(const llmem_tensor *t, const float **out, float **owned);

/* Threads for the next run, and whether n items are worth several. */
static inline int32_t cpu_threads_for(int64_t work)
{
    return work < 4096 ? 1 : llmem_tp_threads();
}

/* ---- recurrent state slots (ops_mamba.c; used by ops_ssm1.c too) ---------------------- */

/* One state of a recurrent view as the ops read and write it: every
 * stream's source resolved (a source another stream writes is snapshotted
 * first, so a stream's own slots may alias). */
typedef struct rs_io {
    char *base;         /* state buffer */
    size_t slot_bytes;  /* bytes of one slot of this state */
    size_t scale_off;   /* I8: byte offset of the per-head f32 scales in a slot */
    llmem_dtype dtype;
    int64_t elems;      /* elements of one slot */
    const int32_t *src, *dst, *ckpt;
    int32_t n_seqs, n_tok, n_ckpt;
    const char **src_ptr; /* [n_seqs] where stream s reads, NULL = zeros */
    char *src_copy;       /* copies of sources written by other streams */
    /* the snapshot inside the ubatch (llmem_rs_view.snap_tok / snap_slot):
     * NULL when the view has none */
    const int32_t *snap_tok, *snap_slot;
} rs_io;

/* Slot `slot` (0 <= slot < n_slots) of io's state buffer. */
static inline char *cpu_rs_slot(const rs_io *io, int32_t slot)
{
    return io->base + (size_t)slot * io->slot_bytes;
}

/* Slot of stream s's snapshot inside the ubatch, -1 when none; its token
 * is io->snap_tok[s]. */
static inline int32_t cpu_rs_snap_slot(const rs_io *io, int64_t s)
{
    return io->snap_slot ? io->snap_slot[s] : -1;
}

/* The token (0-based, within a stream) after which checkpoint c of a
 * stream is taken; -1: the state before the first token, below -1: none. */
static inline int32_t cpu_rs_ckpt_token(const rs_io *io, int32_t c)
{
    return io->n_tok - io->n_ckpt + c;
}

/* Reads the view's tables (the device copies), re-checks them (slots in
 * range, no slot written by two streams) and resolves every stream's
 * source. LLMEM_E_INVALID, LLMEM_E_NO_MEMORY; nothing to finish then. */
llmem_status cpu_rs_io_init(rs_io *io, const llmem_view *view, int32_t state);
void cpu_rs_io_finish(rs_io *io);

/* ---- the ops (one file per family) -------------------------------------------------------- */

llmem_status cpu_op_matmul(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out);
llmem_status cpu_op_matmul_fast(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out);
llmem_status cpu_op_matmul_swiglu(llmem_backend *be, llmem_ct *a, llmem_ct *gate, llmem_ct *up,
                                  llmem_ct *out);
llmem_status cpu_op_get_rows(llmem_backend *be, llmem_ct *src, llmem_ct *idx, llmem_ct *out);
llmem_status cpu_op_add(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out);
llmem_status cpu_op_mul(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out);
llmem_status cpu_op_scale(llmem_backend *be, llmem_ct *a, float s, llmem_ct *out);
llmem_status cpu_op_silu(llmem_backend *be, llmem_ct *a, llmem_ct *out);
llmem_status cpu_op_relu2(llmem_backend *be, llmem_ct *a, llmem_ct *out);
llmem_status cpu_op_softplus(llmem_backend *be, llmem_ct *a, llmem_ct *out);
llmem_status cpu_op_swiglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out);
llmem_status cpu_op_geglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out);
llmem_status cpu_op_softcap(llmem_backend *be, llmem_ct *a, float cap, llmem_ct *out);
llmem_status cpu_op_rms_norm(llmem_backend *be, llmem_ct *x, llmem_ct *w, float eps,
                             llmem_ct *out);
llmem_status cpu_op_rms_norm_gated(llmem_backend *be, llmem_ct *y, llmem_ct *z, llmem_ct *w,
                                   int32_t n_groups, float eps, llmem_ct *out);
llmem_status cpu_op_rope(llmem_backend *be, const llmem_rope_params *p, llmem_ct *x,
                         llmem_ct *pos, llmem_ct *out);
llmem_status cpu_op_rope_shift(llmem_backend *be, const llmem_rope_params *p,
                               const llmem_view *view);
llmem_status cpu_op_kv_store(llmem_backend *be, const llmem_view *view, llmem_ct *k,
                             llmem_ct *v);
llmem_status cpu_op_attention_paged(llmem_backend *be, const llmem_attn_params *p,
                                    const llmem_view *view, llmem_ct *q, llmem_ct *out);
llmem_status cpu_op_ssm_conv(llmem_backend *be, const llmem_view *view, int32_t state,
                             llmem_ct *x, llmem_ct *w, llmem_ct *b, llmem_ct *out);
llmem_status cpu_op_ssm_scan(llmem_backend *be, const llmem_ssm_params *p,
                             const llmem_view *view, int32_t state, llmem_ct *xbc, llmem_ct *dt,
                             llmem_ct *a_log, llmem_ct *d, llmem_ct *dt_bias, llmem_ct *y);
llmem_status cpu_op_copy(llmem_backend *be, llmem_ct *src, int32_t col0, llmem_ct *dst);
llmem_status cpu_op_copy_blocks(llmem_backend *be, llmem_buffer *buf, size_t block_bytes,
                                int32_t n, const int32_t *src, const int32_t *dst);
llmem_status cpu_op_log_softmax(llmem_backend *be, llmem_ct *x, llmem_ct *out);
llmem_status cpu_op_argmax(llmem_backend *be, llmem_ct *x, llmem_ct *out);
llmem_status cpu_op_sample(llmem_backend *be, const llmem_sample_params *p, llmem_ct *logits,
                           llmem_ct *ctr, llmem_ct *out);
llmem_status cpu_op_logprob_gather(llmem_backend *be, llmem_ct *logits, llmem_ct *ids,
                                   llmem_ct *out);
llmem_status cpu_op_top_logprobs(llmem_backend *be, llmem_ct *logits, int32_t n,
                                 llmem_ct *top_ids, llmem_ct *top_lp);

#endif
