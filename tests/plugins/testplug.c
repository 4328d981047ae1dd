/* A backend plugin for the registry tests (tests/test_backend.c).
 *
 * Buffers are malloc'ed memory reported as not host visible, so every
 * transfer goes through the vtable. tests/extra.cmake builds this file
 * several times with these definitions:
 *   TESTPLUG_NAME="..."     the plugin's name (libllmem-<name>.so)
 *   TESTPLUG_ABI_DELTA=1    claim ABI LLMEM_BACKEND_ABI_VERSION + 1 (rejected)
 *   TESTPLUG_BAD_VTABLE=1   leave the required buffer_copy slot NULL (rejected)
 *   TESTPLUG_NO_ENTRY=1     export no entry symbol (rejected)
 *   TESTPLUG_LAYOUT_DELTA=1 report another struct layout fingerprint (rejected)
 *   TESTPLUG_ALT=1          report another device name (search-order test)
 * Like a real plugin it calls llmem only through the host table
 * (<llmem/plugin.h>) and links nothing of libllmem.
 * The plugin checks the core's lifetime rules itself: it aborts when its
 * backend is destroyed while buffers are alive or when a buffer it did not
 * make is freed; a test run in fork mode then fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/plugin.h"

#ifndef TESTPLUG_NAME
#define TESTPLUG_NAME "testplug"
#endif
#ifndef TESTPLUG_ABI_DELTA
#define TESTPLUG_ABI_DELTA 0
#endif
#ifndef TESTPLUG_LAYOUT_DELTA
#define TESTPLUG_LAYOUT_DELTA 0
#endif
#ifdef TESTPLUG_ALT
#define TESTPLUG_DEVICE "testplug alt device"
#else
#define TESTPLUG_DEVICE "testplug malloc device"
#endif

#define BUFFER_MAGIC 0x7e57b0ffu

typedef struct tp_backend {
    llmem_backend base;
    long live_buffers;
} tp_backend;

typedef struct tp_buffer {
    llmem_buffer base;
    unsigned magic;
    unsigned char *data;
} tp_buffer;

static void tp_destroy(llmem_backend *be);
static void tp_get_info(llmem_backend *be, llmem_backend_info *info);
static llmem_status tp_alloc(llmem_backend *be, size_t size, llmem_buffer **out);
static void tp_free(llmem_backend *be, llmem_buffer *buf);
static llmem_status tp_upload(llmem_backend *be, llmem_buffer *dst, size_t offset,
                              const void *src, size_t size);
static llmem_status tp_download(llmem_backend *be, llmem_buffer *src, size_t offset, void *dst,
                                size_t size);
static llmem_status tp_copy(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                            llmem_buffer *src, size_t src_offset, size_t size);
static llmem_status tp_fill(llmem_backend *be, llmem_buffer *dst, size_t offset, size_t size,
                            uint32_t pattern);
static llmem_status tp_synchronize(llmem_backend *be);

/* The plugin's vtable, its buffer_copy slot given (TESTPLUG_BAD_VTABLE's
 * table leaves that required slot NULL). */
#define TP_IFACE(copy)                                                         \
    {                                                                          \
        .struct_size = sizeof(llmem_backend_i),                                \
        .destroy = tp_destroy,                                                 \
        .get_info = tp_get_info,                                               \
        .buffer_alloc = tp_alloc,                                              \
        .buffer_free = tp_free,                                                \
        .buffer_upload = tp_upload,                                            \
        .buffer_download = tp_download,                                        \
        .buffer_copy = (copy),                                                 \
        .buffer_fill = tp_fill,                                                \
        .synchronize = tp_synchronize,                                         \
        .ops = NULL,                                                           \
    }

static const llmem_backend_i tp_iface = TP_IFACE(tp_copy);

static void die(const char *what)
{
    fprintf(stderr, TESTPLUG_NAME ": lifetime violation: %s\n", what);
    abort();
}

static tp_backend *tp_from(llmem_backend *be)
{
    /* Checks destroy rather than the vtable address: the badvtable build
     * hands out a modified copy of tp_iface. */
    tp_backend *tp = be && be->iface && be->iface->destroy == tp_destroy
                         ? (tp_backend *)(void *)be
                         : NULL;
    if (!tp)
        die("not a " TESTPLUG_NAME " backend");
    return tp;
}

static tp_buffer *tp_buf(llmem_buffer *buf)
{
    tp_buffer *b = (tp_buffer *)(void *)buf;
    if (!b || b->magic != BUFFER_MAGIC)
        die("not a " TESTPLUG_NAME " buffer");
    return b;
}

static llmem_status tp_open(int32_t device, llmem_backend **out, char *err, size_t err_len)
{
    if (device > 0) {
        if (err && err_len)
            llmem_errf(err, err_len, TESTPLUG_NAME ": no device %d", (int)device);
        return LLMEM_E_NOT_FOUND;
    }
    tp_backend *tp = calloc(1, sizeof *tp);
    if (!tp)
        return LLMEM_E_NO_MEMORY;
    tp->base.iface = &tp_iface;
    *out = &tp->base;
    return LLMEM_OK;
}

static void tp_list(void (*fn)(const char *line, void *ctx), void *ctx)
{
    fn("available, device 0: " TESTPLUG_DEVICE, ctx);
}

static void tp_destroy(llmem_backend *be)
{
    tp_backend *tp = tp_from(be);
    if (tp->live_buffers != 0)
        die("backend destroyed while buffers are alive");
    if (tp->base.refcount != 0)
        die("backend destroyed with a non-zero reference count");
    free(tp);
}

static void tp_get_info(llmem_backend *be, llmem_backend_info *info)
{
    (void)tp_from(be);
    info->backend = TESTPLUG_NAME;
    info->device_name = TESTPLUG_DEVICE;
    info->device = 0;
    info->memory_total = 1u << 30;
    info->memory_free = 1u << 29;
    info->host_visible = false;
}

static llmem_status tp_alloc(llmem_backend *be, size_t size, llmem_buffer **out)
{
    tp_backend *tp = tp_from(be);
    tp_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return LLMEM_E_NO_MEMORY;
    b->data = malloc(size);
    if (!b->data) {
        free(b);
        return LLMEM_E_NO_MEMORY;
    }
    b->magic = BUFFER_MAGIC;
    b->base.backend = be;
    b->base.size = size;
    tp->live_buffers++;
    *out = &b->base;
    return LLMEM_OK;
}

static void tp_free(llmem_backend *be, llmem_buffer *buf)
{
    tp_backend *tp = tp_from(be);
    tp_buffer *b = tp_buf(buf);
    if (b->base.backend != be)
        die("buffer freed through another backend");
    b->magic = 0;
    free(b->data);
    free(b);
    tp->live_buffers--;
}

static llmem_status tp_upload(llmem_backend *be, llmem_buffer *dst, size_t offset,
                              const void *src, size_t size)
{
    memcpy(tp_buf(dst)->data + offset, src, size);
    return LLMEM_OK;
}

static llmem_status tp_download(llmem_backend *be, llmem_buffer *src, size_t offset, void *dst,
                                size_t size)
{
    memcpy(dst, tp_buf(src)->data + offset, size);
    return LLMEM_OK;
}

static llmem_status tp_copy(llmem_backend *be, llmem_buffer *dst, size_t dst_offset,
                            llmem_buffer *src, size_t src_offset, size_t size)
{
    memcpy(tp_buf(dst)->data + dst_offset, tp_buf(src)->data + src_offset, size);
    return LLMEM_OK;
}

static llmem_status tp_fill(llmem_backend *be, llmem_buffer *dst, size_t offset, size_t size,
                            uint32_t pattern)
{
    unsigned char *p = tp_buf(dst)->data + offset;
    for (size_t i = 0; i < size; i += 4)
        memcpy(p + i, &pattern, 4);
    return LLMEM_OK;
}

static llmem_status tp_synchronize(llmem_backend *be)
{
    (void)tp_from(be);
    return LLMEM_OK;
}

static llmem_status tp_open_checked(int32_t device, llmem_backend **out, char *err,
                                    size_t err_len)
{
#ifdef TESTPLUG_BAD_VTABLE
    /* A vtable without the required buffer_copy slot. */
    static const llmem_backend_i broken = TP_IFACE(NULL);
    llmem_status st = tp_open(device, out, err, err_len);
    if (st == LLMEM_OK)
        (*out)->iface = &broken;
    return st;
#else
    return tp_open(device, out, err, err_len);
#endif
}

static const llmem_plugin tp_plugin = {
    .abi_version = LLMEM_BACKEND_ABI_VERSION + TESTPLUG_ABI_DELTA,
    .layout = LLMEM_BACKEND_ABI_LAYOUT + TESTPLUG_LAYOUT_DELTA,
    .name = TESTPLUG_NAME,
    .open = tp_open_checked,
    .list_devices = tp_list,
};

#ifdef TESTPLUG_NO_ENTRY
LLMEM_PLUGIN_HIDDEN const llmem_host_api *llmem_plugin_host;
const llmem_plugin *testplug_not_the_entry(void);
const llmem_plugin *testplug_not_the_entry(void)
{
    return &tp_plugin;
}
#else
LLMEM_PLUGIN_DEFINE(tp_plugin)
#endif
