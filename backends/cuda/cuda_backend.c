/* llmem cuda plugin: plugin entry, device discovery, the backend vtable and
 * buffers.
 *
 * The plugin links the CUDA runtime statically and cuBLAS dynamically; the
 * static runtime loads the driver (libcuda.so.1) only when first called, so
 * the module loads on machines without one and `open` reports why there is
 * no device: "cuda: no CUDA driver (cudaGetDeviceCount: ...)". Transfers
 * run on the backend's stream; downloads wait for it, and uploads either
 * wait for it or copy the host data into a page-locked staging ring first
 * (small ones), so host memory may be reused on return (<llmem/backend.h>).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"
#include "kernels/copy.h"
#include "kernels/kernels.h"

static void cuda_destroy(llmem_backend *be);
static void cuda_reload_env(llmem_backend *be);
static void cuda_get_info(llmem_backend *be, llmem_backend_info *info);
static llmem_status cuda_buffer_alloc(llmem_backend *be, size_t size, llmem_buffer **out);
static void cuda_buffer_free(llmem_backend *be, llmem_buffer *buf);
static llmem_status cuda_buffer_upload(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                       const void *src, size_t size);
static llmem_status cuda_buffer_download(llmem_backend *be, llmem_buffer *src, size_t offset,
                                         void *dst, size_t size);
static llmem_status cuda_buffer_copy(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                                     llmem_buffer *src, size_t src_offset, size_t size);
static llmem_status cuda_buffer_fill(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                     size_t size, uint32_t pattern);
static llmem_status cuda_synchronize(llmem_backend *be);
static llmem_status cuda_buffer_copy_ranges(llmem_backend *be, const llmem_copy_range *ranges,
                                            int32_t n);
static llmem_status cuda_host_alloc(llmem_backend *be, size_t size, void **out);
static void cuda_host_free(llmem_backend *be, void *ptr);
static llmem_status cuda_upload_async(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                      const void *src, size_t size);
static llmem_status cuda_download_async(llmem_backend *be, llmem_buffer *src, size_t offset,
                                        void *dst, size_t size);

/* The open ops this plugin implements: each cuda_ops_*.c file adds its own
 * (LLMEM_OP_IMPL, <llmem/backend_impl.h>). */
LLMEM_OP_IMPL_LIST(cuda_op_impls);

static const llmem_backend_i cuda_iface = {
    .struct_size = sizeof(llmem_backend_i),
    .destroy = cuda_destroy,
    .get_info = cuda_get_info,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .buffer_upload = cuda_buffer_upload,
    .buffer_download = cuda_buffer_download,
    .buffer_copy = cuda_buffer_copy,
    .buffer_fill = cuda_buffer_fill,
    .synchronize = cuda_synchronize,
    .ops = &cuda_ops, /* constant, defined in cuda_ops.c */
    .record_begin = cuda_record_begin,
    .record_end = cuda_record_end,
    .graph_replay = cuda_graph_replay,
    .graph_free = cuda_graph_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .buffer_upload_async = cuda_upload_async,
    .buffer_download_async = cuda_download_async,
    .comm_group = cuda_comm_group, /* NCCL (cuda_comm.c) */
    .op_impls = &cuda_op_impls,
    .buffer_copy_ranges = cuda_buffer_copy_ranges,
    .reload_env = cuda_reload_env,
};

static bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* $LLMEM_CUDA_GDN_E: 0, 16 or 32 (unset: 32); another value is reported on
 * stderr and taken as 32. */
static int gdn_split_env(void)
{
    const char *e = getenv("LLMEM_CUDA_GDN_E");
    if (!e || !*e || !strcmp(e, "32"))
        return 32;
    if (!strcmp(e, "0") || !strcmp(e, "16"))
        return atoi(e);
    fprintf(stderr, "llmem cuda: LLMEM_CUDA_GDN_E=%s is not 0, 16 or 32; using 32\n", e);
    return 32;
}

/* llmem_backend_reload_env: $LLMEM_CUDA_GDN_E again (tests and
 * measurements run both kernels on one backend); the other settings stay
 * as the backend opened with them. */
static void cuda_reload_env(llmem_backend *be)
{
    cuda_from(be)->gdn_split = gdn_split_env();
}

/* ---- helpers shared with cuda_ops.c -------------------------------------------------------- */

llmem_status cuda_check(cuda_backend *cb, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return LLMEM_OK;
    (void)cudaGetLastError(); /* clears the error unless it is sticky */
    if (cb && cb->debug)
        fprintf(stderr, "llmem cuda: %s: %s (%s)\n", what, cudaGetErrorString(e),
                cudaGetErrorName(e));
    return e == cudaErrorMemoryAllocation ? LLMEM_E_NO_MEMORY : LLMEM_E_BACKEND;
}

llmem_status cuda_check_blas(cuda_backend *cb, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return LLMEM_OK;
    if (cb && cb->debug)
        fprintf(stderr, "llmem cuda: %s: cuBLAS status %d\n", what, (int)s);
    return s == CUBLAS_STATUS_ALLOC_FAILED ? LLMEM_E_NO_MEMORY : LLMEM_E_BACKEND;
}

llmem_status cuda_enter(cuda_backend *cb)
{
    cb->b16_key = NULL; /* whatever comes now may write the shadow's source */
    /* cudaGetDevice reads a thread-local: cheaper than setting it per op */
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == cb->device)
        return LLMEM_OK;
    return cuda_check(cb, cudaSetDevice(cb->device), "cudaSetDevice");
}

llmem_status cuda_scratch(cuda_backend *cb, size_t bytes, void **out)
{
    if (bytes == 0)
        bytes = 256;
    if (bytes > cb->scratch_size) {
        if (cb->recording)
            return LLMEM_E_UNSUPPORTED; /* no sync under capture: warm up eagerly first */
        cb->scratch_gen++;
        llmem_status st = cuda_check(cb, cudaStreamSynchronize(cb->stream), "scratch sync");
        if (st != LLMEM_OK)
            return st;
        if (cb->scratch) {
            cudaFree(cb->scratch);
            cb->scratch = NULL;
            cb->scratch_size = 0;
        }
        /* grow geometrically so alternating sizes settle */
        size_t want = bytes + bytes / 2;
        void *p = NULL;
        if (cudaMalloc(&p, want) != cudaSuccess) {
            (void)cudaGetLastError();
            want = bytes;
            st = cuda_check(cb, cudaMalloc(&p, want), "cudaMalloc (scratch)");
            if (st != LLMEM_OK)
                return st;
        }
        cb->scratch = p;
        cb->scratch_size = want;
    }
    *out = cb->scratch;
    return LLMEM_OK;
}

/* ---- plugin --------------------------------------------------------------------------------- */

/* Device count, or a one-line reason (LLMEM_E_NOT_FOUND) when there is none. */
static llmem_status device_count(int *count, char *why, size_t why_len)
{
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        llmem_errf(why, why_len, "%s (cudaGetDeviceCount: %s)",
                   e == cudaErrorNoDevice ? "no CUDA device" : "no CUDA driver",
                   cudaGetErrorString(e));
        *count = 0;
        return LLMEM_E_NOT_FOUND;
    }
    if (*count < 1) {
        llmem_errf(why, why_len, "no CUDA device (cudaGetDeviceCount returned 0)");
        return LLMEM_E_NOT_FOUND;
    }
    return LLMEM_OK;
}

static llmem_status cuda_open(int32_t device, llmem_backend **out, char *err, size_t err_len)
{
    char why[256];
    int count = 0;
    llmem_status st = device_count(&count, why, sizeof why);
    if (st != LLMEM_OK) {
        llmem_errf(err, err_len, "cuda: %s", why);
        return st;
    }
    int dev = device < 0 ? 0 : device;
    if (dev >= count) {
        llmem_errf(err, err_len, "cuda: no device %d (%d CUDA device%s)", (int)dev, count,
                   count == 1 ? "" : "s");
        return LLMEM_E_NOT_FOUND;
    }
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) {
        llmem_errf(err, err_len, "cuda: out of host memory");
        return LLMEM_E_NO_MEMORY;
    }
    cb->base.iface = &cuda_iface;
    cb->device = dev;
    cb->debug = env_on("LLMEM_CUDA_DEBUG");
    cb->sync_each_op = env_on("LLMEM_CUDA_SYNC");
    cb->stage_off = env_on("LLMEM_CUDA_SYNC_UPLOAD");
    const char *cm = getenv("LLMEM_CUDA_COPY_RANGES");
    cb->copy_mode = cm && !strcmp(cm, "loop") ? 1 : cm && !strcmp(cm, "api") ? 2 : 0;
    cb->attn_fast = env_on("LLMEM_CUDA_ATTN_FAST");
    const char *shadow_env = getenv("LLMEM_CUDA_B16_SHADOW");
    cb->b16_off = shadow_env && strcmp(shadow_env, "0") == 0;
    const char *dc = getenv("LLMEM_CUDA_DEC_CTAS");
    cb->dec_ctas = dc ? atoi(dc) : 2;
    cb->dec_ctas = cb->dec_ctas < 1 ? 2 : cb->dec_ctas > 256 ? 256 : cb->dec_ctas;
    cb->gdn_split = gdn_split_env();
    const char *what = "cudaSetDevice";
    cudaError_t e = cudaSetDevice(dev);
    struct cudaDeviceProp prop;
    if (e == cudaSuccess) {
        what = "cudaGetDeviceProperties";
        e = cudaGetDeviceProperties(&prop, dev);
    }
    if (e == cudaSuccess) {
        what = "cudaStreamCreateWithFlags";
        e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        llmem_errf(err, err_len, "cuda: device %d: %s failed: %s", dev, what,
                   cudaGetErrorString(e));
        free(cb);
        return e == cudaErrorMemoryAllocation ? LLMEM_E_NO_MEMORY : LLMEM_E_BACKEND;
    }
    snprintf(cb->device_name, sizeof cb->device_name, "%s", prop.name);
    cb->n_sms = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    cublasStatus_t bs = cublasCreate(&cb->blas);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetStream(cb->blas, cb->stream);
    /* No TF32: f32 GEMMs keep f32 products, as the ops contract says. */
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetMathMode(cb->blas, CUBLAS_DEFAULT_MATH);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        llmem_errf(err, err_len, "cuda: device %d: cuBLAS initialisation failed (status %d)",
                   dev, (int)bs);
        if (cb->blas)
            cublasDestroy(cb->blas);
        cudaStreamDestroy(cb->stream);
        free(cb);
        return bs == CUBLAS_STATUS_ALLOC_FAILED ? LLMEM_E_NO_MEMORY : LLMEM_E_BACKEND;
    }
    cuda_prof_init(cb);
    *out = &cb->base;
    return LLMEM_OK;
}

static void cuda_list_devices(void (*fn)(const char *line, void *ctx), void *ctx)
{
    char line[512], why[256];
    int count = 0;
    if (device_count(&count, why, sizeof why) != LLMEM_OK) {
        snprintf(line, sizeof line, "unavailable: %s", why);
        fn(line, ctx);
        return;
    }
    for (int d = 0; d < count; d++) {
        struct cudaDeviceProp prop;
        cudaError_t e = cudaGetDeviceProperties(&prop, d);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(line, sizeof line, "device %d: unavailable (cudaGetDeviceProperties: %s)",
                     d, cudaGetErrorString(e));
        } else {
            snprintf(line, sizeof line,
                     "available, device %d: %s, %.1f GiB, compute capability %d.%d, %d SMs", d,
                     prop.name, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
                     prop.major, prop.minor, prop.multiProcessorCount);
        }
        fn(line, ctx);
    }
}

static const llmem_plugin cuda_plugin = {
    .abi_version = LLMEM_BACKEND_ABI_VERSION,
    .layout = LLMEM_BACKEND_ABI_LAYOUT,
    .name = "cuda",
    .open = cuda_open,
    .list_devices = cuda_list_devices,
};

/* The entry point; every llmem call of this plugin goes through the host
 * table it receives (<llmem/plugin.h>). */
LLMEM_PLUGIN_DEFINE(cuda_plugin)

/* ---- vtable ---------------------------------------------------------------------------------- */

static void cuda_destroy(llmem_backend *be)
{
    cuda_backend *cb = cuda_from(be);
    if (!cb)
        return;
    cudaSetDevice(cb->device);
    cudaStreamSynchronize(cb->stream);
    cuda_prof_finish(cb);
    if (cb->stage)
        cudaFreeHost(cb->stage);
    if (cb->copy_tab)
        cudaFree(cb->copy_tab);
    cublasDestroy(cb->blas);
    if (cb->scratch)
        cudaFree(cb->scratch);
    if (cb->b16)
        cudaFree(cb->b16);
    cudaStreamDestroy(cb->stream);
    (void)cudaGetLastError();
    free(cb);
}

static void cuda_get_info(llmem_backend *be, llmem_backend_info *info)
{
    cuda_backend *cb = cuda_from(be);
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(cb->device) != cudaSuccess ||
        cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        free_b = total_b = 0;
    }
    info->backend = "cuda";
    info->device_name = cb->device_name;
    info->device = cb->device;
    info->memory_total = total_b;
    info->memory_free = free_b;
    info->host_visible = false;
}

static llmem_status cuda_buffer_alloc(llmem_backend *be, size_t size, llmem_buffer **out)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    cuda_buffer *buf = calloc(1, sizeof *buf);
    if (!buf)
        return LLMEM_E_NO_MEMORY;
    cudaError_t e = cudaMalloc(&buf->dev, size);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(buf);
        /* Any failure to get device memory is "no memory" to the caller. */
        if (cb->debug)
            fprintf(stderr, "llmem cuda: cudaMalloc(%zu): %s\n", size, cudaGetErrorString(e));
        return e == cudaErrorMemoryAllocation || e == cudaErrorInvalidValue ? LLMEM_E_NO_MEMORY
                                                                            : LLMEM_E_BACKEND;
    }
    *out = &buf->base;
    return LLMEM_OK;
}

static void cuda_buffer_free(llmem_backend *be, llmem_buffer *buf)
{
    cuda_backend *cb = cuda_from(be);
    cuda_buffer *b = (cuda_buffer *)(void *)buf;
    cudaSetDevice(cb->device);
    /* cudaFree waits for the device; pending ops may still use the buffer. */
    cudaFree(b->dev);
    (void)cudaGetLastError();
    free(b);
}

/* Staged uploads: an upload of at most STAGE_MAX bytes is copied into the
 * page-locked ring cb->stage and queued with cudaMemcpyAsync, so it returns
 * without waiting for the queued ops (a decode step makes a few to a few
 * dozen small index-table uploads, each of which used to be a round trip
 * with the GPU idle). The ring is reused from its start after each stream
 * synchronize, when every copy from it has run; a full ring synchronizes.
 * Under stream capture the plain path runs (a captured copy would re-read
 * the ring at every replay; the synchronize invalidates the capture). */
#define STAGE_BYTES ((size_t)4 << 20)
#define STAGE_MAX ((size_t)64 << 10)

static llmem_status stream_sync(cuda_backend *cb, const char *what)
{
    llmem_status st = cuda_check(cb, cudaStreamSynchronize(cb->stream), what);
    if (st == LLMEM_OK)
        cb->stage_pos = 0;
    return st;
}

static bool stage_ready(cuda_backend *cb)
{
    if (cb->stage || cb->stage_off)
        return cb->stage != NULL;
    void *p = NULL;
    if (cudaHostAlloc(&p, STAGE_BYTES, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        cb->stage_off = true;
        return false;
    }
    cb->stage = p;
    cb->stage_pos = 0;
    return true;
}

static llmem_status cuda_buffer_upload(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                       const void *src, size_t size)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    char *d = (char *)cuda_dev(dst) + offset;
    if (size <= STAGE_MAX && !cb->recording && stage_ready(cb)) {
        if (cb->stage_pos + size > STAGE_BYTES &&
            (st = stream_sync(cb, "cudaStreamSynchronize (upload stage)")) != LLMEM_OK)
            return st;
        unsigned char *s = cb->stage + cb->stage_pos;
        memcpy(s, src, size);
        cb->stage_pos += (size + 63) & ~(size_t)63;
        return cuda_check(cb, cudaMemcpyAsync(d, s, size, cudaMemcpyHostToDevice, cb->stream),
                          "cudaMemcpyAsync (staged upload)");
    }
    st = cuda_check(cb, cudaMemcpyAsync(d, src, size, cudaMemcpyHostToDevice, cb->stream),
                    "cudaMemcpyAsync (upload)");
    if (st == LLMEM_OK)
        st = stream_sync(cb, "cudaStreamSynchronize (upload)");
    return st;
}

static llmem_status cuda_buffer_download(llmem_backend *be, llmem_buffer *src, size_t offset,
                                         void *dst, size_t size)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st == LLMEM_OK)
        st = cuda_check(cb,
                        cudaMemcpyAsync(dst, (const char *)cuda_dev(src) + offset, size,
                                        cudaMemcpyDeviceToHost, cb->stream),
                        "cudaMemcpyAsync (download)");
    if (st == LLMEM_OK)
        st = stream_sync(cb, "cudaStreamSynchronize (download)");
    return st;
}

static llmem_status cuda_buffer_copy(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                                     llmem_buffer *src, size_t src_offset, size_t size)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    return cuda_check(cb,
                      cudaMemcpyAsync((char *)cuda_dev(dst) + dst_offset,
                                      (const char *)cuda_dev(src) + src_offset, size,
                                      cudaMemcpyDeviceToDevice, cb->stream),
                      "cudaMemcpyAsync (copy)");
}

/* The batch as a loop of cudaMemcpyAsync (under capture: memcpy nodes). */
static llmem_status copy_loop(cuda_backend *cb, const llmem_copy_range *r, int32_t n)
{
    for (int32_t j = 0; j < n; j++) {
        if (r[j].size == 0)
            continue;
        llmem_status st = cuda_check(
            cb,
            cudaMemcpyAsync((char *)cuda_dev(r[j].dst) + r[j].dst_offset,
                            (const char *)cuda_dev(r[j].src) + r[j].src_offset, r[j].size,
                            cudaMemcpyDeviceToDevice, cb->stream),
            "cudaMemcpyAsync (copy_ranges loop)");
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

/* The batch through the runtime's own batched copy (CUDA 12.8+), to
 * compare with the kernel ($LLMEM_CUDA_COPY_RANGES=api). */
static llmem_status copy_api(cuda_backend *cb, const llmem_copy_range *r, int32_t n)
{
#if CUDART_VERSION >= 13000
    void **dst = malloc((size_t)n * sizeof *dst);
    const void **src = malloc((size_t)n * sizeof *src);
    size_t *size = malloc((size_t)n * sizeof *size);
    llmem_status st = LLMEM_E_NO_MEMORY;
    if (!dst || !src || !size)
        goto out;
    size_t m = 0;
    for (int32_t j = 0; j < n; j++) {
        if (r[j].size == 0)
            continue;
        dst[m] = (char *)cuda_dev(r[j].dst) + r[j].dst_offset;
        src[m] = (const char *)cuda_dev(r[j].src) + r[j].src_offset;
        size[m++] = r[j].size;
    }
    struct cudaMemcpyAttributes attr = {.srcAccessOrder = cudaMemcpySrcAccessOrderStream};
    size_t attr_idx = 0;
    st = cuda_check(cb,
                    cudaMemcpyBatchAsync((void *const *)dst, (const void *const *)src, size, m,
                                         &attr, &attr_idx, 1, cb->stream),
                    "cudaMemcpyBatchAsync");
out:
    free(dst);
    free(src);
    free(size);
    return st;
#else
    return copy_loop(cb, r, n);
#endif
}

/* Ranges per launch: the table of one launch fits the staging ring with
 * room to spare (32 bytes a range: 1 MiB). */
#define COPY_TAB_MAX 32768

/* buffer_copy_ranges: the range table is written into the staging ring,
 * queued to a device table (stream order keeps it from overwriting a table
 * an earlier launch still reads) and copied by one kernel launch
 * (kernels/copy.cu). Under capture the ring cannot be used (a replay would
 * re-read it): the loop of memcpy nodes is recorded instead. */
static llmem_status cuda_buffer_copy_ranges(llmem_backend *be, const llmem_copy_range *ranges,
                                            int32_t n)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    if (cb->copy_mode == 1 || cb->recording || !stage_ready(cb))
        return copy_loop(cb, ranges, n);
    if (cb->copy_mode == 2)
        return copy_api(cb, ranges, n);
    for (int32_t j0 = 0; j0 < n;) {
        int32_t m = n - j0 < COPY_TAB_MAX ? n - j0 : COPY_TAB_MAX;
        size_t bytes = (size_t)m * sizeof(cuk_copy_range);
        if (cb->stage_pos + bytes > STAGE_BYTES &&
            (st = stream_sync(cb, "cudaStreamSynchronize (copy_ranges stage)")) != LLMEM_OK)
            return st;
        if (bytes > cb->copy_tab_size) {
            if (cb->copy_tab) { /* cudaFree waits for the launches that read it */
                cudaFree(cb->copy_tab);
                cb->copy_tab = NULL;
                cb->copy_tab_size = 0;
            }
            size_t want = (size_t)COPY_TAB_MAX * sizeof(cuk_copy_range);
            if ((st = cuda_check(cb, cudaMalloc(&cb->copy_tab, want), "cudaMalloc (copy table)")) !=
                LLMEM_OK) {
                cb->copy_tab = NULL;
                return st;
            }
            cb->copy_tab_size = want;
        }
        cuk_copy_range *t = (cuk_copy_range *)(void *)(cb->stage + cb->stage_pos);
        int32_t k = 0;
        uint64_t chunks = 0;
        for (int32_t j = j0; j < j0 + m; j++) {
            const llmem_copy_range *r = &ranges[j];
            if (r->size == 0)
                continue;
            t[k].src = (uint64_t)(uintptr_t)((const char *)cuda_dev(r->src) + r->src_offset);
            t[k].dst = (uint64_t)(uintptr_t)((char *)cuda_dev(r->dst) + r->dst_offset);
            t[k].size = r->size;
            t[k].first = chunks;
            chunks += (r->size + CUK_COPY_CHUNK - 1) / CUK_COPY_CHUNK;
            k++;
        }
        j0 += m;
        if (k == 0)
            continue;
        size_t used = (size_t)k * sizeof *t;
        cb->stage_pos += (used + 63) & ~(size_t)63;
        st = cuda_check(cb,
                        cudaMemcpyAsync(cb->copy_tab, t, used, cudaMemcpyHostToDevice, cb->stream),
                        "cudaMemcpyAsync (copy table)");
        if (st == LLMEM_OK)
            st = cuda_check(cb,
                            cuk_copy_ranges((const cuk_copy_range *)cb->copy_tab, k, chunks,
                                            cb->n_sms, cb->stream),
                            "copy_ranges");
        if (st != LLMEM_OK)
            return st;
    }
    return LLMEM_OK;
}

static llmem_status cuda_buffer_fill(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                     size_t size, uint32_t pattern)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    return cuda_check(cb,
                      cuk_fill32((char *)cuda_dev(dst) + offset, (int64_t)(size / 4), pattern,
                                 cb->stream),
                      "fill");
}

static llmem_status cuda_synchronize(llmem_backend *be)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    return stream_sync(cb, "cudaStreamSynchronize");
}

/* Page-locked host memory (cudaHostAlloc): copies between it and device
 * memory run as DMA without a staging copy, so cudaMemcpyAsync returns at
 * once (CUDA C Programming Guide, "Page-Locked Host Memory"). */
static llmem_status cuda_host_alloc(llmem_backend *be, size_t size, void **out)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    cudaError_t e = cudaHostAlloc(out, size, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        *out = NULL;
        return LLMEM_E_NO_MEMORY;
    }
    return cuda_check(cb, e, "cudaHostAlloc");
}

static void cuda_host_free(llmem_backend *be, void *ptr)
{
    cuda_backend *cb = cuda_from(be);
    if (cuda_enter(cb) == LLMEM_OK)
        cudaFreeHost(ptr);
    (void)cudaGetLastError();
}

/* Queued on the backend's stream, in order with ops; no wait (the caller
 * keeps the host memory until a synchronize). */
static llmem_status cuda_upload_async(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                      const void *src, size_t size)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    return cuda_check(cb,
                      cudaMemcpyAsync((char *)cuda_dev(dst) + offset, src, size,
                                      cudaMemcpyHostToDevice, cb->stream),
                      "cudaMemcpyAsync (upload_async)");
}

static llmem_status cuda_download_async(llmem_backend *be, llmem_buffer *src, size_t offset,
                                        void *dst, size_t size)
{
    cuda_backend *cb = cuda_from(be);
    llmem_status st = cuda_enter(cb);
    if (st != LLMEM_OK)
        return st;
    return cuda_check(cb,
                      cudaMemcpyAsync(dst, (const char *)cuda_dev(src) + offset, size,
                                      cudaMemcpyDeviceToHost, cb->stream),
                      "cudaMemcpyAsync (download_async)");
}
