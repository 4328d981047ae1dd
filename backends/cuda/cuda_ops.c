/* llmem cuda plugin: the ops table (<llmem/ops_impl.h>).
 *
 * Each slot turns tensor descriptors into device pointers and calls the
 * launchers of kernels/ (one .cu per op family) on the backend's stream; ops are asynchronous
 * (results are visible to llmem_buffer_download, which waits). The wrappers
 * of backends/ops.c have checked every argument; view tables are read by
 * the kernels from view->idx, and their host copies are used here only to
 * choose launch shapes (attention path, split count, snapshots).
 *
 * Matmul: M <= 4 (decode) runs the GEMV kernel, which reads the weights
 * once; larger M runs cuBLAS with f32 accumulation (CUBLAS_COMPUTE_32F):
 * f32 weights directly, bf16 weights as two bf16 GEMMs over the split
 * activations a = hi + lo (kernels/matmul.cu), f16 weights converted to f32
 * in row chunks (exact) and multiplied in f32.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_ops_quant.h"
#include "kernels/attention_q.h"
#include "kernels/kernels.h"
#include "kernels/prefill.h"
#include "kernels/ssd.h"
#include "llmem/view.h"

#define F16_CHUNK_BYTES ((size_t)64 << 20) /* f32 weight rows converted per GEMM */

static void *tptr(const llmem_tensor *t)
{
    return cuda_tensor_ptr(t);
}

static int64_t rows_of(const llmem_tensor *t)
{
    int64_t n = 1;
    for (int32_t i = 0; i + 1 < t->n_dims; i++)
        n *= t->ne[i];
    return n;
}

static int64_t cols_of(const llmem_tensor *t)
{
    return t->ne[t->n_dims - 1];
}

/* The plugin uses no symbol of libllmem: these mirror llmem_tensor_nelements
 * and llmem_dtype_size on descriptors the wrappers have validated. */
static int64_t nelements(const llmem_tensor *t)
{
    return rows_of(t) * cols_of(t);
}

/* int8 / fp8 pools (llmem_dtype_is_scaled: the plugin does not link the
 * core library). */
static bool dtype_scaled(llmem_dtype t)
{
    return t == LLMEM_DTYPE_I8 || t == LLMEM_DTYPE_F8E4M3;
}

llmem_status cuda_op_done(cuda_backend *cb, cudaError_t e, const char *what)
{
    cb->b16_key = NULL; /* the op may have written the shadow's source */
    llmem_status st = cuda_check(cb, e, what);
    if (st == LLMEM_OK && cb->sync_each_op && !cb->recording)
        st = cuda_check(cb, cudaStreamSynchronize(cb->stream), what);
    return st;
}

static llmem_status done(cuda_backend *cb, cudaError_t e, const char *what)
{
    return cuda_op_done(cb, e, what);
}

static llmem_status enter(llmem_backend *be, cuda_backend **out)
{
    *out = cuda_from(be);
    return cuda_enter(*out);
}

/* ---- bf16 shadow ---------------------------------------------------------------------------------
 * A fast-mode prefill GEMM rounds its f32 activations to bf16 before
 * cuBLAS reads them: a pass over [M, K] f32 and a launch per GEMM (2.7 ms of
 * a 9B pp512, docs/benchmarks.md "pp512 at batch 1"). The ops that produce
 * those activations (the RMS norms, swiglu) write the bf16 copy as they
 * write the f32 result (one rounding of the same value: the GEMM's input is
 * bit for bit what the rounding pass would give), and the GEMMs that read
 * the tensor next take the copy. Its validity is the key (device address
 * and element count of the f32 tensor): any later op or buffer call clears
 * it on entry, a GEMM that consumed it sets it again unless its output
 * overlaps the source. Only eager ubatches of more than CUK_GEMV_MAX_M rows
 * write it (never while recording), and only after a fast-mode GEMM of
 * that size has run on this backend (precise mode never reads it). */

/* The shadow to write a [rows, cols] output's bf16 copy into; NULL: none
 * (not wanted, or it cannot grow). */
static uint16_t *shadow_target(cuda_backend *cb, int64_t rows, int64_t cols)
{
    if (cb->b16_off || !cb->b16_want || cb->recording || rows <= CUK_GEMV_MAX_M)
        return NULL;
    size_t bytes = (size_t)rows * (size_t)cols * 2;
    if (bytes > cb->b16_size) {
        /* grow between ops: the stream may still read the old copy */
        if (cudaStreamSynchronize(cb->stream) != cudaSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        if (cb->b16)
            cudaFree(cb->b16);
        cb->b16 = NULL;
        cb->b16_size = 0;
        size_t want = bytes + bytes / 2;
        if (cudaMalloc(&cb->b16, want) != cudaSuccess) {
            (void)cudaGetLastError();
            cb->b16 = NULL;
            return NULL;
        }
        cb->b16_size = want;
    }
    return cb->b16;
}

/* After a producer's launch (status st): the shadow now mirrors out. */
static llmem_status shadow_made(cuda_backend *cb, llmem_status st, const void *out, int64_t n)
{
    if (st == LLMEM_OK) {
        cb->b16_key = out;
        cb->b16_n = n;
    }
    return st;
}

static bool ranges_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

/* ---- dense ---------------------------------------------------------------------------------- */

static llmem_status gemm(cuda_backend *cb, cudaDataType_t t, const void *w, int32_t n_rows,
                         int32_t ldc, const void *a, int32_t m, int32_t k, float beta, float *out)
{
    const float alpha = 1.0f;
    /* column-major: out^T [n_rows, m] = w [k, n_rows]^T * a^T [k, m] */
    return cuda_check_blas(cb,
                           cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_rows, m, k, &alpha,
                                        w, t, k, a, t, k, &beta, out, CUDA_R_32F, ldc,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                           "cublasGemmEx");
}

static llmem_status matmul_out(llmem_backend *be, llmem_ct *a, llmem_ct *w, float *o);

/* The activations a [M, K] f32 as two bf16 terms in scratch, hi = bf16(a)
 * and lo = bf16(a - hi) (matmul.cu's header explains the split). */
static llmem_status split_bf16(cuda_backend *cb, llmem_ct *a, uint16_t **hi, uint16_t **lo)
{
    size_t n = (size_t)a->ne[0] * a->ne[1], half = n * 2;
    void *s;
    llmem_status st = cuda_scratch(cb, 2 * half + 256, &s);
    if (st != LLMEM_OK)
        return st;
    *hi = s;
    *lo = (uint16_t *)((char *)s + (half + 255) / 256 * 256);
    return cuda_check(cb, cuk_split_bf16(tptr(a), *hi, *lo, (int64_t)n, cb->stream),
                      "split_bf16");
}

static llmem_status op_matmul(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out)
{
    return matmul_out(be, a, w, tptr(out));
}

/* op_matmul into the device pointer o ([M, N] f32). */
static llmem_status matmul_out(llmem_backend *be, llmem_ct *a, llmem_ct *w, float *o)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    int32_t m = a->ne[0], k = a->ne[1], n = w->ne[0];
    if (k == 0)
        return done(cb, cudaMemsetAsync(o, 0, (size_t)m * n * sizeof(float), cb->stream),
                    "matmul (K = 0)");
    if (m <= CUK_GEMV_MAX_M)
        return done(cb, cuk_gemv(tptr(a), tptr(w), w->dtype, o, m, n, k, cb->stream), "gemv");
    if (w->dtype == LLMEM_DTYPE_F32)
        st = gemm(cb, CUDA_R_32F, tptr(w), n, n, tptr(a), m, k, 0.0f, o);
    else if (w->dtype == LLMEM_DTYPE_BF16) {
        uint16_t *hi, *lo;
        if ((st = split_bf16(cb, a, &hi, &lo)) != LLMEM_OK)
            return st;
        st = gemm(cb, CUDA_R_16BF, tptr(w), n, n, hi, m, k, 0.0f, o);
        if (st == LLMEM_OK)
            st = gemm(cb, CUDA_R_16BF, tptr(w), n, n, lo, m, k, 1.0f, o);
    } else {
        int64_t chunk = (int64_t)(F16_CHUNK_BYTES / ((size_t)k * sizeof(float)));
        chunk = chunk < 1 ? 1 : chunk > n ? n : chunk;
        void *s;
        if ((st = cuda_scratch(cb, (size_t)chunk * k * sizeof(float), &s)) != LLMEM_OK)
            return st;
        const char *wp = tptr(w);
        for (int64_t n0 = 0; n0 < n && st == LLMEM_OK; n0 += chunk) {
            int32_t nc = (int32_t)(n - n0 < chunk ? n - n0 : chunk);
            st = cuda_check(cb,
                            cuk_copy(wp + (size_t)n0 * k * 2, LLMEM_DTYPE_F16, k, 0, s,
                                     LLMEM_DTYPE_F32, nc, k, cb->stream),
                            "f16 weights to f32");
            if (st == LLMEM_OK)
                st = gemm(cb, CUDA_R_32F, s, nc, n, tptr(a), m, k, 0.0f, o + n0);
        }
    }
    return st == LLMEM_OK ? done(cb, cudaSuccess, "matmul") : st;
}

/* FAST mode: bf16 weights take one tensor-core GEMM over bf16(a) instead
 * of the hi + lo pair; everything else (the GEMV of M <= CUK_GEMV_MAX_M,
 * f32 and f16 weights) runs as op_matmul, which the contract allows. */
static llmem_status op_matmul_fast(llmem_backend *be, llmem_ct *a, llmem_ct *w, llmem_ct *out)
{
    int32_t m = a->ne[0], k = a->ne[1], n = w->ne[0];
    if (w->dtype != LLMEM_DTYPE_BF16 || m <= CUK_GEMV_MAX_M || k == 0)
        return op_matmul(be, a, w, out);
    cuda_backend *cb = cuda_from(be);
    /* read before enter() clears it: the producer's bf16 copy of a */
    bool shadow = cb->b16_key != NULL && cb->b16_key == tptr(a) && cb->b16_n == (int64_t)m * k;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    cb->b16_want = true;
    void *hi = cb->b16;
    if (!shadow) { /* bf16(a) only: the lo term is not used here */
        if ((st = cuda_scratch(cb, (size_t)m * k * 2, &hi)) != LLMEM_OK)
            return st;
        st = cuda_check(cb, cuk_split_bf16(tptr(a), hi, NULL, (int64_t)m * k, cb->stream),
                        "bf16 activations");
    }
    if (st == LLMEM_OK)
        st = gemm(cb, CUDA_R_16BF, tptr(w), n, n, hi, m, k, 0.0f, tptr(out));
    if (st == LLMEM_OK)
        st = done(cb, cudaSuccess, "matmul_fast");
    /* the next GEMM over a (q, k and v; gate and up) takes the copy too */
    if (st == LLMEM_OK && shadow &&
        !ranges_overlap(tptr(out), (size_t)m * n * 4, tptr(a), (size_t)m * k * 4))
        shadow_made(cb, st, tptr(a), (int64_t)m * k);
    return st;
}

/* Gate/up + SwiGLU: one fused GEMV launch for M <= CUK_GEMV_MAX_M with
 * 16-byte-aligned operands; otherwise the two matmuls (the up product in a
 * stream-ordered temporary, as op_matmul uses the scratch) and swiglu. */
static llmem_status op_matmul_swiglu(llmem_backend *be, llmem_ct *a, llmem_ct *gate, llmem_ct *up,
                                     llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    int32_t m = a->ne[0], k = a->ne[1], n = gate->ne[0];
    if (m <= CUK_GEMV_MAX_M && k > 0) {
        cudaError_t e = cuk_gemv_swiglu(tptr(a), tptr(gate), tptr(up), gate->dtype, tptr(out), m,
                                        n, k, cb->stream);
        if (e != cudaErrorNotSupported)
            return done(cb, e, "gemv_swiglu");
        (void)cudaGetLastError();
    }
    size_t bytes = (size_t)m * n * sizeof(float);
    void *tmp = NULL;
    st = cuda_check(cb, cudaMallocAsync(&tmp, bytes, cb->stream), "cudaMallocAsync (swiglu)");
    if (st != LLMEM_OK)
        return st;
    st = op_matmul(be, a, gate, out);
    if (st == LLMEM_OK)
        st = matmul_out(be, a, up, tmp);
    if (st == LLMEM_OK)
        st = cuda_check(cb,
                        cuk_elementwise(CUK_EW_SWIGLU, tptr(out), tmp, 0, 0.0f, tptr(out),
                                        (int64_t)m * n, cb->stream),
                        "swiglu");
    cudaError_t fe = cudaFreeAsync(tmp, cb->stream);
    if (st == LLMEM_OK)
        st = cuda_check(cb, fe, "cudaFreeAsync (swiglu)");
    return st == LLMEM_OK ? done(cb, cudaSuccess, "matmul_swiglu") : st;
}

static llmem_status op_get_rows(llmem_backend *be, llmem_ct *src, llmem_ct *idx, llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    return done(cb,
                cuk_get_rows(tptr(src), src->dtype, src->ne[0], src->ne[1], tptr(idx), idx->ne[0],
                             tptr(out), cb->stream),
                "get_rows");
}

static llmem_status ew(llmem_backend *be, cuk_ew_kind kind, llmem_ct *a, llmem_ct *b, float s,
                       llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    int64_t n = nelements(a), b_cols = 0;
    if (b && nelements(b) != n)
        b_cols = nelements(b); /* one broadcast row (checked by the wrapper) */
    return done(cb, cuk_elementwise(kind, tptr(a), tptr(b), b_cols, s, tptr(out), n, cb->stream),
                "elementwise");
}

static llmem_status op_add(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out)
{
    return ew(be, CUK_EW_ADD, a, b, 0.0f, out);
}

static llmem_status op_mul(llmem_backend *be, llmem_ct *a, llmem_ct *b, llmem_ct *out)
{
    return ew(be, CUK_EW_MUL, a, b, 0.0f, out);
}

static llmem_status op_scale(llmem_backend *be, llmem_ct *a, float s, llmem_ct *out)
{
    return ew(be, CUK_EW_SCALE, a, NULL, s, out);
}

static llmem_status op_silu(llmem_backend *be, llmem_ct *a, llmem_ct *out)
{
    return ew(be, CUK_EW_SILU, a, NULL, 0.0f, out);
}

static llmem_status op_relu2(llmem_backend *be, llmem_ct *a, llmem_ct *out)
{
    return ew(be, CUK_EW_RELU2, a, NULL, 0.0f, out);
}

static llmem_status op_softplus(llmem_backend *be, llmem_ct *a, llmem_ct *out)
{
    return ew(be, CUK_EW_SOFTPLUS, a, NULL, 0.0f, out);
}

/* Four elements per thread when aligned (kernels/prefill.cu), with the
 * bf16 shadow of out for the down projection of a fast-mode prefill. */
static llmem_status op_swiglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    int64_t n = nelements(gate);
    uint16_t *o16 = shadow_target(cb, rows_of(out), cols_of(out));
    cudaError_t e = cuk_swiglu4(tptr(gate), tptr(up), tptr(out), o16, n, cb->stream);
    if (e != cudaErrorNotSupported)
        return o16 ? shadow_made(cb, done(cb, e, "swiglu"), tptr(out), n) : done(cb, e, "swiglu");
    return ew(be, CUK_EW_SWIGLU, gate, up, 0.0f, out);
}

static llmem_status op_geglu(llmem_backend *be, llmem_ct *gate, llmem_ct *up, llmem_ct *out)
{
    return ew(be, CUK_EW_GEGLU, gate, up, 0.0f, out);
}

static llmem_status op_softcap(llmem_backend *be, llmem_ct *a, float cap, llmem_ct *out)
{
    return ew(be, CUK_EW_SOFTCAP, a, NULL, cap, out);
}

static llmem_status op_rms_norm(llmem_backend *be, llmem_ct *x, llmem_ct *w, float eps,
                                llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    uint16_t *o16 = shadow_target(cb, rows_of(x), cols_of(x));
    if (o16) {
        cudaError_t e = cuk_rms_norm_b16(tptr(x), NULL, tptr(w), w ? (int)w->dtype : 0,
                                         rows_of(x), cols_of(x), eps, tptr(out), o16, cb->stream);
        if (e != cudaErrorNotSupported)
            return shadow_made(cb, done(cb, e, "rms_norm"), tptr(out), nelements(x));
    }
    return done(cb,
                cuk_rms_norm(tptr(x), tptr(w), w ? (int)w->dtype : 0, rows_of(x), cols_of(x), eps,
                             tptr(out), cb->stream),
                "rms_norm");
}

static llmem_status op_add_rms_norm(llmem_backend *be, llmem_ct *x, llmem_ct *r, llmem_ct *w,
                                    float eps, llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    uint16_t *o16 = shadow_target(cb, rows_of(x), cols_of(x));
    if (o16) {
        cudaError_t e = cuk_rms_norm_b16(tptr(x), tptr(r), tptr(w), w ? (int)w->dtype : 0,
                                         rows_of(x), cols_of(x), eps, tptr(out), o16, cb->stream);
        if (e != cudaErrorNotSupported)
            return shadow_made(cb, done(cb, e, "add_rms_norm"), tptr(out), nelements(x));
    }
    return done(cb,
                cuk_add_rms_norm((float *)tptr(x), tptr(r), tptr(w), w ? (int)w->dtype : 0,
                                 rows_of(x), cols_of(x), eps, tptr(out), cb->stream),
                "add_rms_norm");
}

static llmem_status op_rms_norm_gated(llmem_backend *be, llmem_ct *y, llmem_ct *z, llmem_ct *w,
                                      int32_t n_groups, float eps, llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    uint16_t *o16 = shadow_target(cb, rows_of(y), cols_of(y));
    if (o16) {
        cudaError_t e = cuk_rms_norm_gated_b16(tptr(y), tptr(z), tptr(w), w->dtype, rows_of(y),
                                               cols_of(y), n_groups, eps, tptr(out), o16,
                                               cb->stream);
        if (e != cudaErrorNotSupported)
            return shadow_made(cb, done(cb, e, "rms_norm_gated"), tptr(out), nelements(y));
    }
    return done(cb,
                cuk_rms_norm_gated(tptr(y), tptr(z), tptr(w), w->dtype, rows_of(y), cols_of(y),
                                   n_groups, eps, tptr(out), cb->stream),
                "rms_norm_gated");
}

/* ---- rope ------------------------------------------------------------------------------------ */

static cuk_rope_args rope_args(const llmem_rope_params *p)
{
    cuk_rope_args r = {p->mode == LLMEM_ROPE_NEOX ? 1 : 0, p->n_rot, p->theta_base,
                       p->freq_scale};
    return r;
}

static llmem_status op_rope(llmem_backend *be, const llmem_rope_params *p, llmem_ct *x,
                            llmem_ct *pos, llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    cuk_rope_args r = rope_args(p);
    return done(cb,
                cuk_rope(&r, tptr(x), tptr(pos), tptr(out), x->ne[0], x->ne[1], x->ne[2],
                         cb->stream),
                "rope");
}

static llmem_status op_rope_shift(llmem_backend *be, const llmem_rope_params *p,
                                  const llmem_view *view)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    const llmem_kv_view *kv = llmem_view_kv(view);
    cuk_rope_args r = rope_args(p);
    return done(cb,
                cuk_rope_shift(&r, cuda_dev(kv->k), kv->dtype, cuda_view_table(view, &kv->shift_slot),
                               cuda_view_table(view, &kv->shift_delta), kv->shift_slot.n,
                               (int64_t)kv->n_pages * kv->page_size, kv->n_kv_heads,
                               kv->head_dim, cb->stream),
                "rope_shift");
}

/* ---- attention ----------------------------------------------------------------------------------- */

static llmem_status op_kv_store(llmem_backend *be, const llmem_view *view, llmem_ct *k,
                                llmem_ct *v)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (dtype_scaled(kv->dtype)) { /* kernels/attention_q.cu */
        if ((size_t)kv->page_size * 5 > 48 * 1024)
            return LLMEM_E_UNSUPPORTED;
        return done(cb,
                    cuk_kv_store_q(tptr(k), tptr(v), cuda_dev(kv->k), cuda_dev(kv->v), kv->dtype,
                                   cuda_view_table(view, &kv->store_tok), cuda_view_table(view, &kv->store_slot),
                                   kv->store_slot.n, (int32_t)k->ne[0], kv->page_size,
                                   kv->n_pages, kv->n_kv_heads, kv->head_dim, cb->stream),
                    "kv_store (scaled)");
    }
    return done(cb,
                cuk_kv_store(tptr(k), tptr(v), cuda_dev(kv->k), cuda_dev(kv->v), kv->dtype,
                             cuda_view_table(view, &kv->store_tok), cuda_view_table(view, &kv->store_slot),
                             kv->store_slot.n, k->ne[0], (int64_t)kv->n_pages * kv->page_size,
                             (int64_t)kv->n_kv_heads * kv->head_dim, cb->stream),
                "kv_store");
}

/* The kernel arguments of one paged attention call: device pointers of q,
 * out, the pools and the index tables of `view`, the shape and `p`'s
 * scale, softcap and window (`precise` left 0). */
static cuk_attn_args attn_args(const llmem_attn_params *p, const llmem_view *view,
                               llmem_ct *q, llmem_ct *out)
{
    const llmem_kv_view *kv = llmem_view_kv(view);
    return (cuk_attn_args){
        .q = tptr(q),
        .out = tptr(out),
        .k = cuda_dev(kv->k),
        .v = cuda_dev(kv->v),
        .dtype = kv->dtype,
        .page_table = cuda_view_table(view, &kv->page_table),
        .page_off = cuda_view_table(view, &kv->page_off),
        .seq_len = cuda_view_table(view, &kv->seq_len),
        .tok_kv_len = cuda_view_table(view, &kv->tok_kv_len),
        .tok_seq = cuda_view_table(view, &kv->tok_seq),
        .n_tok = q->ne[0],
        .n_heads = q->ne[1],
        .n_kv_heads = kv->n_kv_heads,
        .head_dim = kv->head_dim,
        .n_streams = kv->seq_len.n,
        /* with page rows (page_off) max_pages only bounds seq_len, which the
         * core checked against it on the host (llmem_view_check_attention):
         * the kernels get no bound then, so a recorded decode step
         * (models/decode_graph.c) stays valid while sequences grow */
        .max_pages = kv->page_off.n > 0 ? INT32_MAX : kv->max_pages,
        .page_size = kv->page_size,
        .n_pages = kv->n_pages,
        .scale = p->scale,
        .softcap = p->softcap,
        .window = p->window,
    };
}

/* The longest key range any of the first n_tok tokens attends over: its
 * kv length (host copy), capped at p->window when a window is set. */
static int32_t max_key_range(const llmem_attn_params *p, const llmem_kv_view *kv, int32_t n_tok)
{
    const int32_t *tl = kv->tok_kv_len.host;
    int32_t max_range = 0;
    for (int32_t i = 0; i < n_tok; i++) {
        int32_t range = p->window > 0 && tl[i] > p->window ? p->window : tl[i];
        max_range = range > max_range ? range : max_range;
    }
    return max_range;
}

/* How many parts the keys of one call are split into (1..64): enough for
 * `ctas` CTAs over the (token, kv head, group of 4 query heads) items, at
 * least 256 keys per part. */
static int32_t key_splits(const cuk_attn_args *a, int64_t ctas, int32_t max_range)
{
    int32_t n_rep = a->n_heads / a->n_kv_heads;
    int64_t items = (int64_t)a->n_tok * a->n_kv_heads * ((n_rep + 3) / 4);
    int64_t want = (ctas + items - 1) / items;
    int64_t cap = (max_range + 255) / 256;
    int32_t n_split = (int32_t)(want < cap ? want : cap);
    return n_split < 1 ? 1 : n_split > 64 ? 64 : n_split;
}

/* Scaled pools (int8, fp8): one kernel for decode and prefill
 * (kernels/attention_q.cu), split over keys like the decode kernel. */
static llmem_status attention_scaled(llmem_backend *be, const llmem_attn_params *p,
                                     const llmem_view *view, llmem_ct *q, llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    const llmem_kv_view *kv = llmem_view_kv(view);
    if (!cuk_attn_q_supported(kv->head_dim))
        return LLMEM_E_UNSUPPORTED;
    cuk_attn_args a = attn_args(p, view, q, out);
    int32_t n_split = key_splits(&a, (int64_t)cb->n_sms * 8, max_key_range(p, kv, a.n_tok));
    float *part = NULL;
    if (n_split > 1) {
        void *s;
        if ((st = cuda_scratch(cb, cuk_attn_q_scratch(&a, n_split) * sizeof(float), &s)) !=
            LLMEM_OK)
            return st;
        part = s;
    }
    return done(cb, cuk_attn_q(&a, n_split, part, cb->stream), "attention (scaled)");
}

static llmem_status op_attention_paged(llmem_backend *be, const llmem_attn_params *p,
                                       const llmem_view *view, llmem_ct *q, llmem_ct *out)
{
    if (dtype_scaled(llmem_view_kv(view)->dtype))
        return attention_scaled(be, p, view, q, out);
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    const llmem_kv_view *kv = llmem_view_kv(view);
    cuk_attn_args a = attn_args(p, view, q, out);
    a.precise = !cb->attn_fast && !p->fast; /* $LLMEM_CUDA_ATTN_FAST or the FAST mode */
    /* Launch shape from the host copies: runs of same-stream tokens (long
     * runs: prefill tiles) and the longest key range (split count). */
    const int32_t *ts = kv->tok_seq.host;
    int64_t runs = 0;
    for (int32_t i = 0; i < a.n_tok; i++)
        if (i == 0 || ts[i] != ts[i - 1])
            runs++;
    int32_t max_range = max_key_range(p, kv, a.n_tok);
    if (max_range == 0)
        return done(cb, cudaMemsetAsync(a.out, 0, (size_t)nelements(out) * sizeof(float), cb->stream),
                    "attention (no keys)");
    bool aligned = (uintptr_t)a.q % 16 == 0 && (uintptr_t)a.out % 8 == 0;
    if (cuk_attn_prefill_supported(a.head_dim, a.dtype) && aligned && a.n_tok >= 16 * runs) {
        if (!a.precise) /* kernels/attention_prefill_tc.cuh */
            return done(cb, cuk_attn_prefill_fast(&a, cb->stream), "attention (prefill, fast)");
        return done(cb, cuk_attn_prefill(&a, cb->stream), "attention (prefill)");
    }
    if (!cuk_attn_decode_supported(a.head_dim, a.dtype))
        return done(cb, cuk_attn_generic(&a, cb->stream), "attention (generic)");
    int32_t n_split = key_splits(&a, (int64_t)cb->n_sms * cb->dec_ctas, max_range);
    float *part = NULL;
    if (n_split > 1) {
        void *s;
        size_t bytes = cuk_attn_decode_scratch(&a, n_split) * sizeof(float);
        if ((st = cuda_scratch(cb, bytes, &s)) != LLMEM_OK)
            return st;
        part = s;
    }
    return done(cb, cuk_attn_decode(&a, n_split, max_range, part, cb->stream),
                "attention (decode)");
}

/* ---- copies, output ------------------------------------------------------------------------------- */

static llmem_status op_copy(llmem_backend *be, llmem_ct *src, int32_t col0, llmem_ct *dst)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    if (src->dtype == LLMEM_DTYPE_F32 && dst->dtype == LLMEM_DTYPE_F32) {
        /* column slices of a prefill's in_proj rows: 16 bytes per thread */
        cudaError_t e = cuk_copy_cols_f32(tptr(src), cols_of(src), col0, tptr(dst), rows_of(dst),
                                          cols_of(dst), cb->stream);
        if (e != cudaErrorNotSupported)
            return done(cb, e, "copy");
    }
    return done(cb,
                cuk_copy(tptr(src), src->dtype, cols_of(src), col0, tptr(dst), dst->dtype,
                         rows_of(dst), cols_of(dst), cb->stream),
                "copy");
}

static llmem_status op_log_softmax(llmem_backend *be, llmem_ct *x, llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    return done(cb, cuk_log_softmax(tptr(x), rows_of(x), cols_of(x), tptr(out), cb->stream),
                "log_softmax");
}

static llmem_status op_argmax(llmem_backend *be, llmem_ct *x, llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    return done(cb, cuk_argmax(tptr(x), rows_of(x), cols_of(x), tptr(out), cb->stream),
                "argmax");
}

/* ---- sampling (kernels/sample.cu) ----------------------------------------------------------- */

static llmem_status op_sample(llmem_backend *be, const llmem_sample_params *p, llmem_ct *logits,
                              llmem_ct *ctr, llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    return done(cb,
                cuk_sample(tptr(logits), rows_of(logits), cols_of(logits),
                           ctr ? tptr(ctr) : NULL, p->temperature, p->top_k, p->top_p,
                           p->min_p, p->seed, tptr(out), cb->stream),
                "sample");
}

static llmem_status op_logprob_gather(llmem_backend *be, llmem_ct *logits, llmem_ct *ids,
                                      llmem_ct *out)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    return done(cb,
                cuk_logprob_gather(tptr(logits), rows_of(logits), cols_of(logits), tptr(ids),
                                   tptr(out), cb->stream),
                "logprob_gather");
}

static llmem_status op_top_logprobs(llmem_backend *be, llmem_ct *logits, int32_t n,
                                    llmem_ct *top_ids, llmem_ct *top_lp)
{
    cuda_backend *cb;
    llmem_status st = enter(be, &cb);
    if (st != LLMEM_OK)
        return st;
    return done(cb,
                cuk_top_logprobs(tptr(logits), rows_of(logits), cols_of(logits), n,
                                 tptr(top_ids), tptr(top_lp), cb->stream),
                "top_logprobs");
}

const struct llmem_ops_i cuda_ops = {
    .struct_size = sizeof(struct llmem_ops_i),
    .matmul = op_matmul,
    .get_rows = op_get_rows,
    .add = op_add,
    .mul = op_mul,
    .scale = op_scale,
    .silu = op_silu,
    .relu2 = op_relu2,
    .softplus = op_softplus,
    .swiglu = op_swiglu,
    .rms_norm = op_rms_norm,
    .rms_norm_gated = op_rms_norm_gated,
    .rope = op_rope,
    .rope_shift = op_rope_shift,
    .kv_store = op_kv_store,
    .attention_paged = op_attention_paged,
    .ssm_conv = cuda_op_ssm_conv,
    .ssm_scan = cuda_op_ssm_scan,
    .copy = op_copy,
    .log_softmax = op_log_softmax,
    .argmax = op_argmax,
    .sample = op_sample,
    .logprob_gather = op_logprob_gather,
    .top_logprobs = op_top_logprobs,
    .matmul_fast = op_matmul_fast,
    .matmul_swiglu = op_matmul_swiglu,
    .add_rms_norm = op_add_rms_norm,
    .geglu = op_geglu,
    .softcap = op_softcap,
};

const struct llmem_ops_i *cuda_ops_table(void)
{
    return &cuda_ops;
}
