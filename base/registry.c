/* llmem base: the backend registry.
 *
 * "cpu" is built in; every other name is a plugin module
 * libllmem-<name>.so, loaded with dlopen(RTLD_NOW | RTLD_LOCAL) from the
 * first folder that has it: each folder of $LLMEM_BACKEND_PATH, then the
 * folder llmem/ beside the loaded libllmem itself (<prefix>/lib/llmem once
 * installed, build/lib/llmem in a build tree; found with dladdr, so a moved
 * prefix works and no path is compiled in). A plugin file that another user
 * owns, or that others can write (the file, or its folder without the
 * sticky bit), is refused (docs/backends.md). A plugin exports
 * one entry symbol; its ABI version and vtable are checked before the
 * backend is used; the entry point receives the host table (llmem_host_api),
 * the only way a plugin calls llmem. Each backend holds its own dlopen handle, released after
 * the backend's destroy, so a plugin stays loaded while any object it made
 * (the backend or one of its buffers) is alive.
 *
 * The plugin scheme follows ggml's backend registry (ggml-backend-reg.cpp)
 * and SQLite's loadable extensions: one well-known entry point, a version
 * check, then calls through a vtable only.
 */
#define _GNU_SOURCE /* dladdr */
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base_internal.h"
#include "llmem/ops.h"


#define NAME_MAX_LEN 64
#define REASON_LEN 512
#define PATH_LEN 4096

/* Every member of the ABI-1 vtable, `ops` included (it may be NULL, but it
 * is read directly). Slots appended later are optional and must be checked
 * against struct_size before use. */
#define BACKEND_I_MIN_SIZE (offsetof(llmem_backend_i, ops) + sizeof(((llmem_backend_i *)0)->ops))

/* What plugins may call (<llmem/plugin.h>). */
const llmem_host_api llmem_host_table = {
    .struct_size = sizeof(llmem_host_api),
    .status_str = llmem_status_str,
    .errf = llmem_errf,
    .dtype_size = llmem_dtype_size,
    .dtype_name = llmem_dtype_name,
    .nan_pattern = llmem_nan_pattern,
    .buffer_size = llmem_buffer_size,
    .buffer_backend = llmem_buffer_backend,
    .buffer_host_ptr = llmem_buffer_host_ptr,
    .tensor_nelements = llmem_tensor_nelements,
    .tensor_nbytes = llmem_tensor_nbytes,
};

struct llmem_plugin_handle {
    void *dl;
    const llmem_plugin *plugin;
    char name[NAME_MAX_LEN + 1];
    char path[PATH_LEN];
};

/* Names become file names: allow only [A-Za-z0-9_-], so a name can never
 * climb out of a search folder. */
static bool name_valid(const char *name)
{
    size_t n = 0;
    for (const char *p = name; *p; p++, n++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-';
        if (!ok || n >= NAME_MAX_LEN)
            return false;
    }
    return n > 0;
}

/* Any object of this library: dladdr on its address names the loaded file. */
static const char lib_anchor = 0;

bool llmem_lib_relative_path(const char *rel, char *out, size_t cap)
{
    Dl_info info;
    if (!dladdr(&lib_anchor, &info) || !info.dli_fname || !info.dli_fname[0])
        return false;
    const char *slash = strrchr(info.dli_fname, '/');
    int n = slash ? snprintf(out, cap, "%.*s/%s", (int)(slash - info.dli_fname),
                             info.dli_fname, rel)
                  : snprintf(out, cap, "./%s", rel);
    return n > 0 && (size_t)n < cap;
}

/* Calls fn(dir, ctx) for each search folder in order until it returns true:
 * the folders of $LLMEM_BACKEND_PATH, then llmem/ beside libllmem.
 * Returns whether some call returned true. */
static bool for_each_dir(bool (*fn)(const char *dir, void *ctx), void *ctx)
{
    const char *env = getenv("LLMEM_BACKEND_PATH");
    if (env) {
        const char *p = env;
        while (*p) {
            size_t n = strcspn(p, ":");
            if (n > 0 && n < PATH_LEN) {
                char dir[PATH_LEN];
                memcpy(dir, p, n);
                dir[n] = '\0';
                if (fn(dir, ctx))
                    return true;
            }
            p += n;
            if (*p == ':')
                p++;
        }
    }
    char dir[PATH_LEN];
    return llmem_lib_relative_path("llmem", dir, sizeof dir) && fn(dir, ctx);
}

/* Whether a plugin file may be loaded: a regular file owned by root or by
 * this user, not writable by others, in a folder that others cannot write
 * (or whose sticky bit keeps them from replacing the file), so no other
 * user can put code into this process. Else writes why. */
static bool plugin_safe(const char *dir, const char *path, char *why, size_t why_len)
{
    struct stat fs, ds;
    uid_t me = geteuid();
    if (stat(path, &fs) != 0 || stat(dir, &ds) != 0) {
        snprintf(why, why_len, "cannot stat it");
        return false;
    }
    if (!S_ISREG(fs.st_mode))
        snprintf(why, why_len, "not a regular file");
    else if (fs.st_uid != 0 && fs.st_uid != me)
        snprintf(why, why_len, "owned by another user (uid %u)", (unsigned)fs.st_uid);
    else if (fs.st_mode & S_IWOTH)
        snprintf(why, why_len, "the file is writable by others");
    else if (ds.st_uid != 0 && ds.st_uid != me)
        snprintf(why, why_len, "its folder is owned by another user (uid %u)", (unsigned)ds.st_uid);
    else if ((ds.st_mode & S_IWOTH) && !(ds.st_mode & S_ISVTX))
        snprintf(why, why_len, "its folder is writable by others");
    else
        return true;
    return false;
}

typedef struct find_ctx {
    const char *name;
    char *path;       /* [PATH_LEN] result */
    char searched[1024];
    size_t searched_len;
    bool refused; /* the file found is unsafe; why says so */
    char why[160];
} find_ctx;

static void add_searched(find_ctx *f, const char *what)
{
    size_t room = sizeof f->searched - f->searched_len;
    int w = snprintf(f->searched + f->searched_len, room, "%s%s", f->searched_len ? ", " : "",
                     what);
    if (w > 0)
        f->searched_len += (size_t)w < room ? (size_t)w : room - 1;
}

static bool find_in_dir(const char *dir, void *arg)
{
    find_ctx *f = arg;
    int n = snprintf(f->path, PATH_LEN, "%s/libllmem-%s.so", dir, f->name);
    if (n <= 0 || n >= PATH_LEN || access(f->path, F_OK) != 0) {
        add_searched(f, dir);
        return false;
    }
    /* first file wins, as for a file that fails to load: an unsafe one
     * stops the search with its reason rather than falling through */
    f->refused = !plugin_safe(dir, f->path, f->why, sizeof f->why);
    return true;
}

static void plugin_unload(struct llmem_plugin_handle *h)
{
    if (!h)
        return;
    if (h->dl)
        dlclose(h->dl);
    free(h);
}

/* Finds and loads libllmem-<name>.so and checks its entry point and ABI.
 * On failure writes the reason (without the "<name>: " prefix). */
static llmem_status plugin_load(const char *name, struct llmem_plugin_handle **out, char *why,
                                size_t why_len)
{
    struct llmem_plugin_handle *h = calloc(1, sizeof *h);
    if (!h) {
        llmem_errf(why, why_len, "out of host memory");
        return LLMEM_E_NO_MEMORY;
    }
    llmem_status st;
    snprintf(h->name, sizeof h->name, "%s", name);
    find_ctx f = {.name = name, .path = h->path};
    if (!for_each_dir(find_in_dir, &f)) {
        llmem_errf(why, why_len, "plugin libllmem-%s.so not found (searched: %s)", name,
            f.searched_len ? f.searched : "no folders; set LLMEM_BACKEND_PATH");
        st = LLMEM_E_NOT_FOUND;
        goto fail;
    }
    if (f.refused) {
        llmem_errf(why, why_len, "refused %s: %s (a plugin must be owned by this user or "
                   "root and writable by no one else)", h->path, f.why);
        st = LLMEM_E_NOT_FOUND;
        goto fail;
    }
    h->dl = dlopen(h->path, RTLD_NOW | RTLD_LOCAL);
    if (!h->dl) {
        /* Usually a missing driver library the plugin links (libcuda.so.1). */
        const char *e = dlerror();
        llmem_errf(why, why_len, "cannot load %s: %s", h->path, e ? e : "unknown dlopen error");
        st = LLMEM_E_NOT_FOUND;
        goto fail;
    }
    void *sym = dlsym(h->dl, LLMEM_PLUGIN_ENTRY_SYMBOL);
    if (!sym) {
        llmem_errf(why, why_len, "%s is not an llmem plugin (no symbol %s)", h->path,
            LLMEM_PLUGIN_ENTRY_SYMBOL);
        st = LLMEM_E_ABI;
        goto fail;
    }
    /* ISO C has no object-to-function pointer cast; POSIX guarantees the
     * representations agree. */
    llmem_plugin_entry_fn entry;
    _Static_assert(sizeof entry == sizeof sym, "function and object pointers differ in size");
    memcpy(&entry, &sym, sizeof entry);
    h->plugin = entry(&llmem_host_table);
    if (!h->plugin) {
        llmem_errf(why, why_len, "%s: entry point returned NULL (host table too old for it?)",
                   h->path);
        st = LLMEM_E_ABI;
        goto fail;
    }
    if (h->plugin->abi_version != LLMEM_BACKEND_ABI_VERSION) {
        llmem_errf(why, why_len, "%s was built for backend ABI %u, this llmem uses ABI %d; rebuild it",
            h->path, (unsigned)h->plugin->abi_version, LLMEM_BACKEND_ABI_VERSION);
        st = LLMEM_E_ABI;
        goto fail;
    }
    if (h->plugin->layout != (uint64_t)LLMEM_BACKEND_ABI_LAYOUT) {
        llmem_errf(why, why_len, "%s was built with other layouts of the structs it reads "
                   "(view, tensor or base objects: fingerprint %016llx, this llmem %016llx); "
                   "rebuild it", h->path, (unsigned long long)h->plugin->layout,
                   (unsigned long long)LLMEM_BACKEND_ABI_LAYOUT);
        st = LLMEM_E_ABI;
        goto fail;
    }
    if (!h->plugin->open) {
        llmem_errf(why, why_len, "%s has no open function", h->path);
        st = LLMEM_E_ABI;
        goto fail;
    }
    *out = h;
    return LLMEM_OK;
fail:
    plugin_unload(h);
    return st;
}

/* Names the first required slot that is missing, or NULL when the vtable
 * is complete. */
static const char *vtable_problem(const llmem_backend_i *i)
{
    if (!i)
        return "iface is NULL";
    if (i->struct_size < BACKEND_I_MIN_SIZE)
        return "struct_size is smaller than the ABI-1 vtable";
    if (!i->destroy) return "destroy is NULL";
    if (!i->get_info) return "get_info is NULL";
    if (!i->buffer_alloc) return "buffer_alloc is NULL";
    if (!i->buffer_free) return "buffer_free is NULL";
    if (!i->buffer_upload) return "buffer_upload is NULL";
    if (!i->buffer_download) return "buffer_download is NULL";
    if (!i->buffer_copy) return "buffer_copy is NULL";
    if (!i->buffer_fill) return "buffer_fill is NULL";
    if (!i->synchronize) return "synchronize is NULL";
    return NULL;
}

/* A plugin may or may not start its message with "<name>: "; drop it so
 * the caller sees the prefix exactly once. */
static const char *strip_prefix(const char *msg, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(msg, name, n) == 0 && msg[n] == ':') {
        msg += n + 1;
        while (*msg == ' ')
            msg++;
    }
    return msg;
}

static void backend_init_base(llmem_backend *be, const char *name,
                              struct llmem_plugin_handle *plugin)
{
    be->name = name;
    be->plugin = plugin;
    be->refcount = 1;
    be->closed = false;
    be->alloc_hook = NULL;
    be->alloc_hook_ctx = NULL;
    be->view_checks = NULL;
}

static llmem_status open_plugin(const char *name, int32_t device, llmem_backend **out,
                                char *why, size_t why_len)
{
    struct llmem_plugin_handle *h = NULL;
    llmem_status st = plugin_load(name, &h, why, why_len);
    if (st != LLMEM_OK)
        return st;
    llmem_backend *be = NULL;
    char msg[REASON_LEN] = "";
    st = h->plugin->open(device, &be, msg, sizeof msg);
    if (st != LLMEM_OK) {
        msg[sizeof msg - 1] = '\0';
        llmem_errf(why, why_len, "%s", msg[0] ? strip_prefix(msg, name) : llmem_status_str(st));
        goto fail;
    }
    if (!be) {
        llmem_errf(why, why_len, "plugin %s reported success but returned no backend", h->path);
        st = LLMEM_E_ABI;
        goto fail;
    }
    const char *problem = vtable_problem(be->iface);
    if (problem) {
        llmem_errf(why, why_len, "plugin %s has a bad backend vtable: %s", h->path, problem);
        /* Free what we can; a vtable without destroy leaks its backend. */
        if (be->iface && be->iface->struct_size >= offsetof(llmem_backend_i, destroy) +
                                                       sizeof be->iface->destroy &&
            be->iface->destroy)
            be->iface->destroy(be);
        st = LLMEM_E_ABI;
        goto fail;
    }
    backend_init_base(be, h->name, h);
    *out = be;
    return LLMEM_OK;
fail:
    plugin_unload(h);
    return st;
}

/* Opens one named backend; the reason of a failure has no name prefix. */
static llmem_status open_named(const char *name, int32_t device, llmem_backend **out,
                               char *why, size_t why_len)
{
    if (strcmp(name, "cpu") == 0) {
        char msg[REASON_LEN] = "";
        llmem_status st = llmem_cpu_plugin.open(device, out, msg, sizeof msg);
        if (st != LLMEM_OK) {
            llmem_errf(why, why_len, "%s", strip_prefix(msg, "cpu"));
            return st;
        }
        backend_init_base(*out, "cpu", NULL);
        return LLMEM_OK;
    }
    return open_plugin(name, device, out, why, why_len);
}

/* Software Vulkan drivers run on the CPU; "auto" does not prefer them. */
static bool is_software_gpu(const char *device_name)
{
    return device_name && (strstr(device_name, "llvmpipe") || strstr(device_name, "lavapipe") ||
                           strstr(device_name, "SwiftShader"));
}

/* "auto": CUDA, then a discrete Vulkan GPU, then the CPU. A Vulkan device
 * counts as a discrete GPU when its buffers are not host visible and it is
 * not a software rasteriser; this needs nothing beyond llmem_backend_info. */
static llmem_status open_auto(int32_t device, llmem_backend **out, char *err, size_t err_len)
{
    char why_cuda[REASON_LEN] = "", why_vk[REASON_LEN] = "", why_cpu[REASON_LEN] = "";
    llmem_backend *be = NULL;
    if (open_named("cuda", device, &be, why_cuda, sizeof why_cuda) == LLMEM_OK) {
        *out = be;
        return LLMEM_OK;
    }
    if (open_named("vulkan", device, &be, why_vk, sizeof why_vk) == LLMEM_OK) {
        llmem_backend_info info = {0};
        if (llmem_backend_get_info(be, &info) == LLMEM_OK && !info.host_visible &&
            !is_software_gpu(info.device_name)) {
            *out = be;
            return LLMEM_OK;
        }
        llmem_errf(why_vk, sizeof why_vk, "%s is not a discrete GPU",
            info.device_name ? info.device_name : "the device");
        llmem_backend_close(be);
    }
    llmem_status st = open_named("cpu", device, &be, why_cpu, sizeof why_cpu);
    if (st == LLMEM_OK) {
        *out = be;
        return LLMEM_OK;
    }
    llmem_errf(err, err_len, "auto: no backend opened (cuda: %s; vulkan: %s; cpu: %s)", why_cuda,
        why_vk, why_cpu);
    return st;
}

llmem_status llmem_backend_open(const char *name, int32_t device, llmem_backend **out,
                                char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if (!out || !name) {
        llmem_errf(err, err_len, "backend_open: NULL %s", out ? "name" : "out");
        return LLMEM_E_INVALID;
    }
    *out = NULL;
    if (!name_valid(name)) {
        llmem_errf(err, err_len, "backend_open: invalid backend name \"%.64s\" (use letters, digits, "
                          "'-' and '_', at most %d)", name, NAME_MAX_LEN);
        return LLMEM_E_INVALID;
    }
    if (device < -1) {
        llmem_errf(err, err_len, "%s: invalid device index %d (>= 0, or -1 for the default)", name,
            (int)device);
        return LLMEM_E_INVALID;
    }
    if (strcmp(name, "auto") == 0)
        return open_auto(device, out, err, err_len);
    char why[REASON_LEN] = "";
    llmem_status st = open_named(name, device, out, why, sizeof why);
    if (st != LLMEM_OK)
        llmem_errf(err, err_len, "%s: %s", name, why);
    return st;
}

llmem_status llmem_backend_retain(llmem_backend *be)
{
    if (be->refcount == INT32_MAX)
        return LLMEM_E_NO_MEMORY;
    be->refcount++;
    return LLMEM_OK;
}

void llmem_backend_release(llmem_backend *be)
{
    if (--be->refcount > 0)
        return;
    /* destroy frees `be`; the plugin's code must stay mapped until then. */
    struct llmem_plugin_handle *h = be->plugin;
    llmem_view_checks_free(be->view_checks);
    be->view_checks = NULL;
    be->iface->destroy(be);
    plugin_unload(h);
}

void llmem_backend_close(llmem_backend *be)
{
    if (!be || be->closed)
        return;
    be->closed = true;
    llmem_backend_release(be);
}

llmem_status llmem_backend_get_info(llmem_backend *be, llmem_backend_info *info)
{
    if (!be || !info)
        return LLMEM_E_INVALID;
    memset(info, 0, sizeof *info);
    be->iface->get_info(be, info);
    if (!info->backend)
        info->backend = be->name;
    if (!info->device_name)
        info->device_name = "";
    return LLMEM_OK;
}

const char *llmem_backend_name(const llmem_backend *be)
{
    return be && be->name ? be->name : "";
}

/* --- llmem_backend_list ------------------------------------------------- */

typedef struct list_ctx {
    void (*fn)(const char *line, void *ctx);
    void *ctx;
    const char *name;
    int n_lines;
} list_ctx;

static void list_prefixed(const char *line, void *arg)
{
    list_ctx *l = arg;
    char buf[REASON_LEN + NAME_MAX_LEN + 4];
    snprintf(buf, sizeof buf, "%s: %s", l->name, line ? strip_prefix(line, l->name) : "");
    l->fn(buf, l->ctx);
    l->n_lines++;
}

static void list_plugin(const char *name, void (*fn)(const char *, void *), void *ctx)
{
    list_ctx l = {.fn = fn, .ctx = ctx, .name = name};
    char why[REASON_LEN] = "";
    struct llmem_plugin_handle *h = NULL;
    if (plugin_load(name, &h, why, sizeof why) != LLMEM_OK) {
        char line[REASON_LEN + 32];
        snprintf(line, sizeof line, "unavailable: %s", why);
        list_prefixed(line, &l);
        return;
    }
    if (h->plugin->list_devices)
        h->plugin->list_devices(list_prefixed, &l);
    if (l.n_lines == 0) {
        /* No device listing: an open of the default device tells. */
        char line[REASON_LEN + 32];
        llmem_backend *be = NULL;
        if (open_plugin(name, -1, &be, why, sizeof why) == LLMEM_OK) {
            llmem_backend_info info;
            llmem_backend_get_info(be, &info);
            snprintf(line, sizeof line, "available, %s", info.device_name);
            llmem_backend_close(be);
        } else {
            snprintf(line, sizeof line, "unavailable: %s", why);
        }
        list_prefixed(line, &l);
    }
    plugin_unload(h);
}

#define LIST_MAX_EXTRA 32

typedef struct scan_ctx {
    char names[LIST_MAX_EXTRA][NAME_MAX_LEN + 1];
    int n;
} scan_ctx;

/* Collects the names of the libllmem-<name>.so files of one folder. */
static bool scan_dir(const char *dir, void *arg)
{
    scan_ctx *s = arg;
    DIR *d = opendir(dir);
    if (!d)
        return false;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && s->n < LIST_MAX_EXTRA) {
        const char *fname = e->d_name;
        size_t len = strlen(fname);
        if (strncmp(fname, "libllmem-", 9) != 0 || len <= 12 || strcmp(fname + len - 3, ".so"))
            continue;
        char name[NAME_MAX_LEN + 1];
        size_t n = len - 12;
        if (n > NAME_MAX_LEN)
            continue;
        memcpy(name, fname + 9, n);
        name[n] = '\0';
        if (!name_valid(name) || !strcmp(name, "cpu") || !strcmp(name, "cuda") ||
            !strcmp(name, "vulkan") || !strcmp(name, "auto"))
            continue;
        bool seen = false;
        for (int i = 0; i < s->n && !seen; i++)
            seen = strcmp(s->names[i], name) == 0;
        if (!seen)
            memcpy(s->names[s->n++], name, n + 1);
    }
    closedir(d);
    return false;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

void llmem_backend_list(void (*fn)(const char *line, void *ctx), void *ctx)
{
    if (!fn)
        return;
    list_ctx cpu = {.fn = fn, .ctx = ctx, .name = "cpu"};
    llmem_cpu_plugin.list_devices(list_prefixed, &cpu);
    list_plugin("cuda", fn, ctx);
    list_plugin("vulkan", fn, ctx);
    scan_ctx *s = calloc(1, sizeof *s);
    if (!s)
        return;
    for_each_dir(scan_dir, s);
    qsort(s->names, (size_t)s->n, sizeof s->names[0], cmp_names);
    for (int i = 0; i < s->n; i++)
        list_plugin(s->names[i], fn, ctx);
    free(s);
}
