/* llmem: CPU ops, basic family: get_rows, element-wise ops and
 * activations, RMS norms, log_softmax, argmax and copies.
 *
 * Element-wise ops split the elements into chunks over the thread pool;
 * row-wise ops split rows. Inner loops are plain indexed loops over
 * contiguous floats so that the compiler vectorizes them.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backends/cpu/cpu_ops.h"

#define EW_GRAIN 16384 /* elements per chunk of an element-wise op */

llmem_status cpu_param_f32(const llmem_tensor *t, const float **out, float **owned)
{
    *owned = NULL;
    *out = NULL;
    if (!t)
        return LLMEM_OK;
    if (t->dtype == LLMEM_DTYPE_F32) {
        *out = tensor_data(t);
        return LLMEM_OK;
    }
    int64_t n = llmem_tensor_nelements(t);
    float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
    if (!f)
        return LLMEM_E_NO_MEMORY;
    load_f32(tensor_data(t), t->dtype, n, f);
    *owned = f;
    *out = f;
    return LLMEM_OK;
}

/* Rows per chunk so that a chunk holds about EW_GRAIN elements. */
static int64_t row_grain(int64_t cols)
{
    int64_t g = cols > 0 ? EW_GRAIN / cols : 1;
    return g < 1 ? 1 : g;
}

/* ---- element-wise ----------------------------------------------------------------- */

typedef enum ew_kind {
    EW_ADD, EW_MUL, EW_SCALE, EW_SILU, EW_RELU2, EW_SOFTPLUS, EW_SWIGLU, EW_GEGLU, EW_SOFTCAP
} ew_kind;

typedef struct ew_ctx {
    ew_kind kind;
    const float *a, *b;
    float *out;
    int64_t b_cols; /* b broadcast as a row of b_cols, or 0: b has a's shape */
    float s;
} ew_ctx;

static inline float silu_f(float x)
{
    return x / (1.0f + expf(-x));
}

/* torch gelu(approximate="tanh"), in double (the reference backend), as
 * 0.5 (1 + tanh(z)) = 1 / (1 + e^(-2z)): no cancellation in the tail */
static inline float gelu_tanh_f(float x)
{
    double g = x;
    return (float)(g / (1.0 + exp(-1.5957691216057308 * (g + 0.044715 * g * g * g))));
}

static void ew_run(void *vctx, int64_t i0, int64_t i1, int32_t thread)
{
    const ew_ctx *c = vctx;
    const float *a = c->a, *b = c->b;
    float *o = c->out;
    switch (c->kind) {
    case EW_ADD:
    case EW_MUL:
        if (c->b_cols > 0) {
            /* walk a row at a time so b is indexed without a division per element */
            for (int64_t i = i0; i < i1;) {
                int64_t col = i % c->b_cols;
                int64_t n = c->b_cols - col < i1 - i ? c->b_cols - col : i1 - i;
                const float *br = b + col;
                if (c->kind == EW_ADD)
                    for (int64_t k = 0; k < n; k++)
                        o[i + k] = a[i + k] + br[k];
                else
                    for (int64_t k = 0; k < n; k++)
                        o[i + k] = a[i + k] * br[k];
                i += n;
            }
        } else if (c->kind == EW_ADD) {
            for (int64_t i = i0; i < i1; i++)
                o[i] = a[i] + b[i];
        } else {
            for (int64_t i = i0; i < i1; i++)
                o[i] = a[i] * b[i];
        }
        break;
    case EW_SCALE:
        for (int64_t i = i0; i < i1; i++)
            o[i] = a[i] * c->s;
        break;
    case EW_SILU:
        for (int64_t i = i0; i < i1; i++)
            o[i] = silu_f(a[i]);
        break;
    case EW_RELU2:
        for (int64_t i = i0; i < i1; i++) {
            float r = a[i] > 0.0f ? a[i] : 0.0f;
            o[i] = r * r;
        }
        break;
    case EW_SOFTPLUS:
        for (int64_t i = i0; i < i1; i++)
            o[i] = a[i] > 20.0f ? a[i] : log1pf(expf(a[i]));
        break;
    case EW_SWIGLU:
        for (int64_t i = i0; i < i1; i++)
            o[i] = silu_f(a[i]) * b[i];
        break;
    case EW_GEGLU:
        for (int64_t i = i0; i < i1; i++)
            o[i] = gelu_tanh_f(a[i]) * b[i];
        break;
    case EW_SOFTCAP:
        for (int64_t i = i0; i < i1; i++)
            o[i] = (float)(c->s * tanh((double)a[i] / c->s));
        break;
    }
}

static llmem_status ew(ew_kind kind, llmem_ct *a, llmem_ct *b, float s, llmem_ct *out)
{
    ew_ctx c = {
        .kind = kind,
        .a = tensor_data(a),
        .b = b ? tensor_data(b) : NULL,
        .out = tensor_data(out),
        .s = s,
    };
    int64_t n = llmem_tensor_nelements(a);
    if (b && llmem_tensor_nelements(b) != n)
        c.b_cols = llmem_tensor_nelements(b); /* broadcast row (checked by the wrapper) */
    llmem_tp_run(cpu_threads_for(n), n, EW_GRAIN, ew_run, &c);
    return LLMEM_OK;
}

llmem_status cpu_op_add(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out)
{
    return ew(EW_ADD, a, b, 0.0f, out);
}

llmem_status cpu_op_mul(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out)
{
    return ew(EW_MUL, a, b, 0.0f, out);
}

llmem_status cpu_op_scale(llmem_backend *be, llmem_ct *a, float s, llmem_ct *out)
{
    return ew(EW_SCALE, a, NULL, s, out);
}

llmem_status cpu_op_silu(llmem_backend *be, llmem_ct *a, llmem_ct *out)
{
    return ew(EW_SILU, a, NULL, 0.0f, out);
}

llmem_status cpu_op_relu2(llmem_backend *be, llmem_ct *a, llmem_ct *out)
{
    return ew(EW_RELU2, a, NULL, 0.0f, out);
}

llmem_status cpu_op_softplus(llmem_backend *be, llmem_ct *a, llmem_ct *out)
{
    return ew(EW_SOFTPLUS, a, NULL, 0.0f, out);
}

llmem_status cpu_op_swiglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out)
{
    return ew(EW_SWIGLU, gate, up, 0.0f, out);
}

llmem_status cpu_op_geglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out)
{
    return ew(EW_GEGLU, gate, up, 0.0f, out);
}

llmem_status cpu_op_softcap(llmem_backend *be, llmem_ct *a, float cap, llmem_ct *out)
{
    return ew(EW_SOFTCAP, a, NULL, cap, out);
}

/* ---- get_rows ------------------------------------------------------------------------ */

typedef struct rows_ctx {
    const char *src;
    llmem_dtype dtype;
    int64_t n_rows, cols;
    const int32_t *idx;
    float *out;
    atomic_int bad;
} rows_ctx;

static void get_rows_run(void *vctx, int64_t i0, int64_t i1, int32_t thread)
{
    rows_ctx *c = vctx;
    size_t row_bytes = (size_t)c->cols * llmem_dtype_size(c->dtype);
    for (int64_t i = i0; i < i1; i++) {
        int32_t r = c->idx[i];
        if (r < 0 || r >= c->n_rows) {
            atomic_store(&c->bad, 1);
            continue;
        }
        load_f32(c->src + (size_t)r * row_bytes, c->dtype, c->cols, c->out + i * c->cols);
    }
}

llmem_status cpu_op_get_rows(llmem_backend *be, llmem_ct *src, llmem_ct *idx, llmem_ct *out)
{
    rows_ctx c = {
        .src = tensor_data(src),
        .dtype = src->dtype,
        .n_rows = src->ne[0],
        .cols = src->ne[1],
        .idx = tensor_data(idx),
        .out = tensor_data(out),
    };
    atomic_init(&c.bad, 0);
    int64_t n = idx->ne[0];
    llmem_tp_run(cpu_threads_for(n * c.cols), n, row_grain(c.cols), get_rows_run, &c);
    return atomic_load(&c.bad) ? LLMEM_E_INVALID : LLMEM_OK;
}

/* ---- norms --------------------------------------------------------------------------- */

typedef struct norm_ctx {
    const float *x, *z, *w;
    float *out;
    float *scratch; /* [threads][cols] for the gated norm */
    int64_t cols, group;
    float eps;
} norm_ctx;

static void rms_norm_run(void *vctx, int64_t r0, int64_t r1, int32_t thread)
{
    const norm_ctx *c = vctx;
    int64_t n = c->cols;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->x + r * n;
        float *o = c->out + r * n;
        float scale = 1.0f / sqrtf(dot_f32(x, x, n) / (float)n + c->eps);
        if (c->w)
            for (int64_t i = 0; i < n; i++)
                o[i] = x[i] * scale * c->w[i];
        else
            for (int64_t i = 0; i < n; i++)
                o[i] = x[i] * scale;
    }
}

llmem_status cpu_op_rms_norm(llmem_backend *be, llmem_ct *x, llmem_ct *w, float eps,
                             llmem_ct *out)
{
    float *owned;
    norm_ctx c = {.x = tensor_data(x), .out = tensor_data(out), .cols = tensor_cols(x), .eps = eps};
    llmem_status st = cpu_param_f32(w, &c.w, &owned);
    if (st != LLMEM_OK)
        return st;
    int64_t rows = tensor_rows(x);
    llmem_tp_run(cpu_threads_for(rows * c.cols), rows, row_grain(c.cols), rms_norm_run, &c);
    free(owned);
    return LLMEM_OK;
}

static void rms_norm_gated_run(void *vctx, int64_t r0, int64_t r1, int32_t thread)
{
    const norm_ctx *c = vctx;
    int64_t n = c->cols, gs = c->group;
    float *h = c->scratch + (int64_t)thread * n;
    for (int64_t r = r0; r < r1; r++) {
        const float *y = c->x + r * n, *z = c->z + r * n;
        float *o = c->out + r * n;
        for (int64_t i = 0; i < n; i++)
            h[i] = y[i] * silu_f(z[i]);
        for (int64_t g0 = 0; g0 < n; g0 += gs) {
            float scale = 1.0f / sqrtf(dot_f32(h + g0, h + g0, gs) / (float)gs + c->eps);
            for (int64_t i = g0; i < g0 + gs; i++)
                o[i] = h[i] * scale * c->w[i];
        }
    }
}

llmem_status cpu_op_rms_norm_gated(llmem_backend *be, llmem_ct *y, llmem_ct *z, llmem_ct *w,
                                   int32_t n_groups, float eps, llmem_ct *out)
{
    float *owned;
    norm_ctx c = {
        .x = tensor_data(y),
        .z = tensor_data(z),
        .out = tensor_data(out),
        .cols = tensor_cols(y),
        .eps = eps,
    };
    c.group = c.cols / n_groups;
    llmem_status st = cpu_param_f32(w, &c.w, &owned);
    if (st != LLMEM_OK)
        return st;
    int64_t rows = tensor_rows(y);
    int32_t nth = cpu_threads_for(rows * c.cols);
    c.scratch = malloc((size_t)nth * (size_t)c.cols * sizeof *c.scratch);
    if (!c.scratch) {
        free(owned);
        return LLMEM_E_NO_MEMORY;
    }
    llmem_tp_run(nth, rows, row_grain(c.cols), rms_norm_gated_run, &c);
    free(c.scratch);
    free(owned);
    return LLMEM_OK;
}

/* ---- log_softmax, argmax --------------------------------------------------------------- */

typedef struct row_ctx {
    const float *x;
    void *out;
    int64_t cols;
} row_ctx;

static void log_softmax_run(void *vctx, int64_t r0, int64_t r1, int32_t thread)
{
    const row_ctx *c = vctx;
    int64_t n = c->cols;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->x + r * n;
        float *o = (float *)c->out + r * n;
        float m = -INFINITY;
        for (int64_t i = 0; i < n; i++)
            m = x[i] > m ? x[i] : m;
        /* The sum is of n terms in (0, 1]; double keeps it exact enough for
         * vocabularies of 10^5..10^6 at no cost next to expf. */
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            sum += expf(x[i] - m);
        float lse = m + (float)log(sum);
        for (int64_t i = 0; i < n; i++)
            o[i] = x[i] - lse;
    }
}

llmem_status cpu_op_log_softmax(llmem_backend *be, llmem_ct *x, llmem_ct *out)
{
    row_ctx c = {.x = tensor_data(x), .out = tensor_data(out), .cols = tensor_cols(x)};
    int64_t rows = tensor_rows(x);
    llmem_tp_run(cpu_threads_for(rows * c.cols), rows, row_grain(c.cols), log_softmax_run, &c);
    return LLMEM_OK;
}

static void argmax_run(void *vctx, int64_t r0, int64_t r1, int32_t thread)
{
    const row_ctx *c = vctx;
    int64_t n = c->cols;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->x + r * n;
        int64_t best = -1;
        for (int64_t i = 0; i < n; i++)
            if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
                best = i;
        ((int32_t *)c->out)[r] = best < 0 ? 0 : (int32_t)best;
    }
}

llmem_status cpu_op_argmax(llmem_backend *be, llmem_ct *x, llmem_ct *out)
{
    row_ctx c = {.x = tensor_data(x), .out = tensor_data(out), .cols = tensor_cols(x)};
    int64_t rows = tensor_rows(x);
    llmem_tp_run(cpu_threads_for(rows * c.cols), rows, row_grain(c.cols), argmax_run, &c);
    return LLMEM_OK;
}

/* ---- copies ------------------------------------------------------------------------------ */

typedef struct copy_ctx {
    const char *src;
    char *dst;
    llmem_dtype st, dt;
    int64_t src_cols, cols, col0;
} copy_ctx;

static void copy_run(void *vctx, int64_t r0, int64_t r1, int32_t thread)
{
    const copy_ctx *c = vctx;
    size_t ses = llmem_dtype_size(c->st), des = llmem_dtype_size(c->dt);
    float tmp[256];
    for (int64_t r = r0; r < r1; r++) {
        const char *s = c->src + ((size_t)r * (size_t)c->src_cols + (size_t)c->col0) * ses;
        char *d = c->dst + (size_t)r * (size_t)c->cols * des;
        if (c->st == c->dt) {
            memcpy(d, s, (size_t)c->cols * des);
            continue;
        }
        for (int64_t i = 0; i < c->cols; i += 256) {
            int64_t n = c->cols - i < 256 ? c->cols - i : 256;
            load_f32(s + (size_t)i * ses, c->st, n, tmp);
            store_f32(tmp, c->dt, n, d + (size_t)i * des);
        }
    }
}

llmem_status cpu_op_copy(llmem_backend *be, llmem_ct *src, int32_t col0, llmem_ct *dst)
{
    copy_ctx c = {
        .src = tensor_data(src),
        .dst = tensor_data(dst),
        .st = src->dtype,
        .dt = dst->dtype,
        .src_cols = tensor_cols(src),
        .cols = tensor_cols(dst),
        .col0 = col0,
    };
    int64_t rows = tensor_rows(dst);
    llmem_tp_run(cpu_threads_for(rows * c.cols), rows, row_grain(c.cols), copy_run, &c);
    return LLMEM_OK;
}

llmem_status cpu_op_copy_blocks(llmem_backend *be, llmem_buffer *buf, size_t block_bytes,
                                int32_t n, const int32_t *src, const int32_t *dst)
{
    char *base = llmem_buffer_host_ptr(buf);
    for (int32_t i = 0; i < n; i++)
        memcpy(base + (size_t)dst[i] * block_bytes, base + (size_t)src[i] * block_bytes,
               block_bytes);
    return LLMEM_OK;
}
