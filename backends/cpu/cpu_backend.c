/* llmem: the built-in CPU backend.
 *
 * Buffers are plain host memory (aligned_alloc, 256-byte aligned, size
 * rounded up to a multiple of 256), so llmem_buffer_host_ptr works and every
 * transfer is a memcpy. It is the reference backend: other backends' ops are
 * checked against its results.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/cpu/cpu_backend.h"

#define CPU_ALIGN 256

typedef struct cpu_backend {
    llmem_backend base;
    char device_name[128];
    /* $LLMEM_NORM_MATMUL_CPU_MAX_K, read at open and at
     * llmem_backend_reload_env, not per call (getenv scans the
     * environment): -1 unset */
    int64_t nm_max_k;
    /* llmem_backend_set_copy_hook (fault injection for tests) */
    llmem_copy_hook copy_hook;
    void *copy_hook_ctx;
} cpu_backend;

typedef struct cpu_buffer {
    llmem_buffer base;
} cpu_buffer;

static llmem_status cpu_open(int32_t device, llmem_backend **out, char *err, size_t err_len);
static void cpu_list_devices(void (*fn)(const char *line, void *ctx), void *ctx);
static void cpu_destroy(llmem_backend *be);
static void cpu_get_info(llmem_backend *be, llmem_backend_info *info);
static llmem_status cpu_buffer_alloc(llmem_backend *be, size_t size, llmem_buffer **out);
static void cpu_buffer_free(llmem_backend *be, llmem_buffer *buf);
static llmem_status cpu_buffer_upload(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                      const void *src, size_t size);
static llmem_status cpu_buffer_download(llmem_backend *be, llmem_buffer *src, size_t offset,
                                        void *dst, size_t size);
static llmem_status cpu_buffer_copy(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                                    llmem_buffer *src, size_t src_offset, size_t size);
static llmem_status cpu_buffer_fill(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                    size_t size, uint32_t pattern);
static llmem_status cpu_buffer_copy_ranges(llmem_backend *be, const llmem_copy_range *ranges,
                                           int32_t n);
static llmem_status cpu_synchronize(llmem_backend *be);
static void cpu_reload_env(llmem_backend *be);

/* The open ops the cpu backend implements: each ops_*.c file adds its own
 * (LLMEM_OP_IMPL, <llmem/backend_impl.h>). */
LLMEM_OP_IMPL_LIST(cpu_op_impls);

static const llmem_backend_i cpu_iface = {
    .struct_size = sizeof(llmem_backend_i),
    .destroy = cpu_destroy,
    .get_info = cpu_get_info,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_upload = cpu_buffer_upload,
    .buffer_download = cpu_buffer_download,
    .buffer_copy = cpu_buffer_copy,
    .buffer_fill = cpu_buffer_fill,
    .buffer_copy_ranges = cpu_buffer_copy_ranges,
    .synchronize = cpu_synchronize,
    .reload_env = cpu_reload_env,
    .ops = &llmem_cpu_ops,
    .op_impls = &cpu_op_impls,
};

const llmem_plugin llmem_cpu_plugin = {
    .abi_version = LLMEM_BACKEND_ABI_VERSION,
    .layout = 0, /* built into libllmem: no layout to compare */
    .name = "cpu",
    .open = cpu_open,
    .list_devices = cpu_list_devices,
};

static cpu_backend *cpu_from(llmem_backend *be)
{
    return LLMEM_BACKEND_CAST(cpu_backend, be, &cpu_iface);
}

/* First "model name" of /proc/cpuinfo (x86; most ARM kernels lack it),
 * else "cpu". */
static void read_cpu_model(char *out, size_t len)
{
    snprintf(out, len, "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        size_t n = strcspn(v, "\r\n");
        while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
            n--;
        if (n > 0)
            snprintf(out, len, "%.*s", (int)n, v);
        break;
    }
    fclose(f);
}

static long online_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

static void cpu_list_devices(void (*fn)(const char *line, void *ctx), void *ctx)
{
    char line[320];
    char model[128];
    read_cpu_model(model, sizeof model);
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long psz = sysconf(_SC_PAGESIZE);
    double gib = 1024.0 * 1024.0 * 1024.0;
    snprintf(line, sizeof line, "available, %ld threads, %s, %.1f GiB memory (%.1f GiB free)",
             online_threads(), model, pages > 0 && psz > 0 ? (double)pages * (double)psz / gib : 0.0,
             avail > 0 && psz > 0 ? (double)avail * (double)psz / gib : 0.0);
    fn(line, ctx);
}

static llmem_status cpu_open(int32_t device, llmem_backend **out, char *err, size_t err_len)
{
    if (device > 0) {
        llmem_errf(err, err_len, "cpu: no device %d (the CPU backend has only device 0)",
                   (int)device);
        return LLMEM_E_NOT_FOUND;
    }
    cpu_backend *cpu = calloc(1, sizeof *cpu);
    if (!cpu) {
        llmem_errf(err, err_len, "cpu: out of host memory");
        return LLMEM_E_NO_MEMORY;
    }
    cpu->base.iface = &cpu_iface;
    read_cpu_model(cpu->device_name, sizeof cpu->device_name);
    cpu_reload_env(&cpu->base);
    *out = &cpu->base;
    return LLMEM_OK;
}

static void cpu_reload_env(llmem_backend *be)
{
    const char *mk = getenv("LLMEM_NORM_MATMUL_CPU_MAX_K");
    cpu_from(be)->nm_max_k = mk && *mk ? strtoll(mk, NULL, 10) : -1;
}

int64_t cpu_norm_matmul_max_k(llmem_backend *be)
{
    cpu_backend *cpu = cpu_from(be);
    return cpu ? cpu->nm_max_k : -1;
}

static void cpu_destroy(llmem_backend *be)
{
    free(cpu_from(be));
}

static void cpu_get_info(llmem_backend *be, llmem_backend_info *info)
{
    cpu_backend *cpu = cpu_from(be);
    long pages = sysconf(_SC_PHYS_PAGES);
    long avail = sysconf(_SC_AVPHYS_PAGES);
    long page_size = sysconf(_SC_PAGESIZE);
    info->backend = "cpu";
    info->device_name = cpu ? cpu->device_name : "cpu";
    info->device = 0;
    info->memory_total = pages > 0 && page_size > 0 ? (uint64_t)pages * (uint64_t)page_size : 0;
    info->memory_free = avail > 0 && page_size > 0 ? (uint64_t)avail * (uint64_t)page_size : 0;
    info->host_visible = true;
}

static llmem_status cpu_buffer_alloc(llmem_backend *be, size_t size, llmem_buffer **out)
{
    /* aligned_alloc wants a multiple of the alignment. */
    if (size > SIZE_MAX - (CPU_ALIGN - 1))
        return LLMEM_E_NO_MEMORY;
    size_t rounded = (size + (CPU_ALIGN - 1)) / CPU_ALIGN * CPU_ALIGN;
    cpu_buffer *buf = calloc(1, sizeof *buf);
    if (!buf)
        return LLMEM_E_NO_MEMORY;
    buf->base.host = aligned_alloc(CPU_ALIGN, rounded);
    if (!buf->base.host) {
        free(buf);
        return LLMEM_E_NO_MEMORY;
    }
    buf->base.backend = be;
    buf->base.size = size;
    *out = &buf->base;
    return LLMEM_OK;
}

static void cpu_buffer_free(llmem_backend *be, llmem_buffer *buf)
{
    free(buf->host);
    free(buf);
}

static llmem_status cpu_buffer_upload(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                      const void *src, size_t size)
{
    memcpy((char *)dst->host + offset, src, size);
    return LLMEM_OK;
}

static llmem_status cpu_buffer_download(llmem_backend *be, llmem_buffer *src, size_t offset,
                                        void *dst, size_t size)
{
    memcpy(dst, (const char *)src->host + offset, size);
    return LLMEM_OK;
}

llmem_status llmem_backend_set_copy_hook(llmem_backend *be, llmem_copy_hook hook, void *ctx)
{
    if (!be)
        return LLMEM_E_INVALID;
    cpu_backend *cpu = be->iface == &cpu_iface ? cpu_from(be) : NULL;
    if (!cpu)
        return LLMEM_E_UNSUPPORTED;
    cpu->copy_hook = hook;
    cpu->copy_hook_ctx = hook ? ctx : NULL;
    return LLMEM_OK;
}

/* The copy hook's verdict on a copy of `bytes` (true: go on). */
static bool copy_allowed(llmem_backend *be, size_t bytes)
{
    cpu_backend *cpu = cpu_from(be);
    return !cpu->copy_hook || cpu->copy_hook(bytes, cpu->copy_hook_ctx);
}

static llmem_status cpu_buffer_copy(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                                    llmem_buffer *src, size_t src_offset, size_t size)
{
    if (!copy_allowed(be, size))
        return LLMEM_E_BACKEND;
    /* The core has rejected overlapping ranges of one buffer. */
    memcpy((char *)dst->host + dst_offset, (const char *)src->host + src_offset, size);
    return LLMEM_OK;
}

/* The core has checked the batch: no destination overlaps anything else,
 * so the order of the memcpys does not matter. */
static llmem_status cpu_buffer_copy_ranges(llmem_backend *be, const llmem_copy_range *ranges,
                                           int32_t n)
{
    size_t bytes = 0;
    for (int32_t j = 0; j < n; j++)
        bytes += ranges[j].size; /* only what the hook is told */
    if (!copy_allowed(be, bytes))
        return LLMEM_E_BACKEND;
    for (int32_t j = 0; j < n; j++) {
        const llmem_copy_range *r = &ranges[j];
        if (r->size > 0)
            memcpy((char *)r->dst->host + r->dst_offset, (const char *)r->src->host + r->src_offset,
                   r->size);
    }
    return LLMEM_OK;
}

static llmem_status cpu_buffer_fill(llmem_backend *be, llmem_buffer *dst, size_t offset,
                                    size_t size, uint32_t pattern)
{
    unsigned char *p = (unsigned char *)dst->host + offset;
    /* memcpy keeps the host byte order, the same as an upload of uint32s. */
    for (size_t i = 0; i < size; i += 4)
        memcpy(p + i, &pattern, 4);
    return LLMEM_OK;
}

static llmem_status cpu_synchronize(llmem_backend *be)
{
    return LLMEM_OK; /* every CPU transfer is synchronous */
}
