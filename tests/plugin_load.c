/* Plugins that load anywhere (issue 12): every backend plugin calls llmem
 * only through the host table its entry point receives (<llmem/plugin.h>),
 * so it loads into a host that opened libllmem with RTLD_LOCAL, as Python
 * ctypes does, where no llmem_* symbol is global.
 *
 * This program does NOT link libllmem (tests/extra.cmake builds it apart
 * from the test_*.c suites): it dlopens libllmem.so with RTLD_LOCAL and
 * reaches the API through dlsym only. Checks:
 *   - every plugin module that was built (the backend plugins in the build's
 *     lib folder, the test plugins) dlopens alone with RTLD_NOW |
 *     RTLD_LOCAL: no undefined symbol is left for a host to provide;
 *   - the test plugin opens through the RTLD_LOCAL libllmem, moves bytes,
 *     and formats its error through the host table; plugins built for
 *     another ABI version or struct layout are refused with LLMEM_E_ABI;
 *   - the vulkan and cuda plugins, when built, open or fail only for lack
 *     of a device or driver (never "cannot load" / "undefined symbol"); an
 *     opened one moves bytes and runs an op whose expected result the test
 *     computes itself.
 *
 * Paths: the build's layout (bin/, lib/, lib/llmem/, tests/plugins/) is
 * found from this binary's own place (/proc/self/exe), so a build copied
 * elsewhere with that layout (a GPU machine runs a copy) tests its copy;
 * the build's absolute paths are the fallback. Where the layout is found,
 * the libllmem this test dlopens must be the copy's (tests/
 * plugin_load_copy.sh runs a copy).
 */
// ctest-labels: core
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/ops.h"

/* The build folder this binary runs from: the folder /proc/self/exe lies
 * in, less its LLMEM_EXE_SUBDIR ("bin") part; "" where that does not hold
 * (then every path is the build's absolute one). */
static char build_root[4096];

static void find_build_root(void)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash)
        return;
    *slash = '\0'; /* the binary's folder */
    size_t dl = strlen(exe), sl = strlen(LLMEM_EXE_SUBDIR);
    if (sl == 0 || dl <= sl + 1 || exe[dl - sl - 1] != '/' ||
        strcmp(exe + dl - sl, LLMEM_EXE_SUBDIR) != 0)
        return;
    exe[dl - sl - 1] = '\0';
    snprintf(build_root, sizeof build_root, "%s", exe);
}

/* `path`, an absolute path of the build (under LLMEM_BUILD_ROOT), in the
 * build folder this binary runs from when that file exists there; else
 * `path` itself. The result lives in buf or is path. */
static const char *in_build(const char *path, char *buf, size_t size)
{
    size_t bl = strlen(LLMEM_BUILD_ROOT);
    if (!build_root[0] || strncmp(path, LLMEM_BUILD_ROOT, bl) != 0 ||
        (path[bl] != '/' && path[bl] != '\0'))
        return path;
    int n = snprintf(buf, size, "%s%s", build_root, path + bl);
    return n > 0 && (size_t)n < size && access(buf, F_OK) == 0 ? buf : path;
}

/* The build's folders and libllmem as this run finds them (main fills them). */
static char lib_path[4096], plugin_dir[4096], test_plugin_dir[4096], test_plugin_alt[4096];

typedef struct api {
    void *lib;
    llmem_status (*backend_open)(const char *, int32_t, llmem_backend **, char *, size_t);
    void (*backend_close)(llmem_backend *);
    llmem_status (*buffer_alloc)(llmem_backend *, size_t, llmem_buffer **);
    void (*buffer_free)(llmem_buffer *);
    llmem_status (*buffer_upload)(llmem_buffer *, size_t, const void *, size_t);
    llmem_status (*buffer_download)(llmem_buffer *, size_t, void *, size_t);
    llmem_status (*op_add)(llmem_backend *, const llmem_tensor *, const llmem_tensor *,
                           const llmem_tensor *);
} api;

/* dlsym into a function pointer (POSIX guarantees the representations). */
static void sym(void *lib, const char *name, void *fn_ptr, size_t fn_size)
{
    void *p = dlsym(lib, name);
    ck_assert_msg(p != NULL, "dlsym %s: %s", name, dlerror());
    ck_assert_uint_eq(fn_size, sizeof p);
    memcpy(fn_ptr, &p, sizeof p);
}

#define SYM(a, field, name) sym((a)->lib, name, &(a)->field, sizeof (a)->field)

static void api_load(api *a)
{
    memset(a, 0, sizeof *a);
    a->lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(a->lib != NULL, "dlopen %s: %s", lib_path, dlerror());
    /* RTLD_LOCAL really keeps the library's symbols out of the global scope. */
    ck_assert_ptr_null(dlsym(RTLD_DEFAULT, "llmem_status_str"));
    SYM(a, backend_open, "llmem_backend_open");
    SYM(a, backend_close, "llmem_backend_close");
    SYM(a, buffer_alloc, "llmem_buffer_alloc");
    SYM(a, buffer_free, "llmem_buffer_free");
    SYM(a, buffer_upload, "llmem_buffer_upload");
    SYM(a, buffer_download, "llmem_buffer_download");
    SYM(a, op_add, "llmem_op_add");
    /* a build run from a copy tests the copy's library, not the original's */
    Dl_info info;
    ck_assert(dladdr(dlsym(a->lib, "llmem_backend_open"), &info) != 0 && info.dli_fname);
    ck_assert_msg(!build_root[0] || strncmp(info.dli_fname, build_root, strlen(build_root)) == 0,
                  "libllmem came from %s, not from the build at %s", info.dli_fname, build_root);
}

/* Calls fn(path) for every libllmem-*.so in dir; returns how many. */
static int for_each_plugin(const char *dir, void (*fn)(const char *path))
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "libllmem-", 9) != 0 || len < 4 ||
            strcmp(e->d_name + len - 3, ".so") != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        fn(path);
        n++;
    }
    closedir(d);
    return n;
}

static void dlopen_alone(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(h != NULL, "%s does not load on its own: %s", path, dlerror());
    bool entry = dlsym(h, "llmem_backend_plugin_entry") != NULL;
    ck_assert_msg(entry || strstr(path, "noentry"), "%s exports no entry point", path);
    ck_assert_msg(!entry || !strstr(path, "noentry"), "%s should have no entry point", path);
    dlclose(h);
}

START_TEST(test_every_plugin_resolves_alone)
{
    /* libllmem is not loaded at all here: a plugin that needs any of its
     * symbols fails this dlopen with "undefined symbol". */
    int n = for_each_plugin(test_plugin_dir, dlopen_alone);
    n += for_each_plugin(test_plugin_alt, dlopen_alone);
    ck_assert_int_ge(n, 6); /* testplug, alt, badabi, badvtable, noentry, badlayout */
    for_each_plugin(plugin_dir, dlopen_alone);
}
END_TEST

START_TEST(test_testplug_through_local_lib)
{
    setenv("LLMEM_BACKEND_PATH", test_plugin_dir, 1);
    api a;
    api_load(&a);
    char err[512] = "";
    llmem_backend *be = NULL;
    ck_assert_int_eq(a.backend_open("testplug", -1, &be, err, sizeof err), LLMEM_OK);
    llmem_buffer *buf = NULL;
    ck_assert_int_eq(a.buffer_alloc(be, 64, &buf), LLMEM_OK);
    uint8_t in[64], out[64];
    for (int i = 0; i < 64; i++)
        in[i] = (uint8_t)(i * 7 + 3);
    memset(out, 0, sizeof out);
    ck_assert_int_eq(a.buffer_upload(buf, 0, in, sizeof in), LLMEM_OK);
    ck_assert_int_eq(a.buffer_download(buf, 0, out, sizeof out), LLMEM_OK);
    ck_assert_mem_eq(in, out, sizeof in);
    a.buffer_free(buf);
    a.backend_close(be);

    /* The plugin's own message, formatted by the host's llmem_errf. */
    be = NULL;
    ck_assert_int_eq(a.backend_open("testplug", 3, &be, err, sizeof err), LLMEM_E_NOT_FOUND);
    ck_assert_ptr_null(be);
    ck_assert_str_eq(err, "testplug: no device 3");

    ck_assert_int_eq(a.backend_open("badlayout", -1, &be, err, sizeof err), LLMEM_E_ABI);
    ck_assert_msg(strstr(err, "layout") != NULL, "reason: %s", err);
    ck_assert_int_eq(a.backend_open("badabi", -1, &be, err, sizeof err), LLMEM_E_ABI);
    ck_assert_msg(strstr(err, "ABI") != NULL, "reason: %s", err);
    dlclose(a.lib);
}
END_TEST

/* Opens a built device plugin through the RTLD_LOCAL libllmem. */
static void check_device_plugin(const char *name)
{
    char path[sizeof plugin_dir + 64];
    snprintf(path, sizeof path, "%s/libllmem-%s.so", plugin_dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return; /* not built here */
    fclose(f);
    setenv("LLMEM_BACKEND_PATH", plugin_dir, 1);
    api a;
    api_load(&a);
    char err[512] = "";
    llmem_backend *be = NULL;
    llmem_status st = a.backend_open(name, -1, &be, err, sizeof err);
    if (st != LLMEM_OK) {
        /* Only a missing device or driver may stop it. */
        ck_assert_msg(st == LLMEM_E_NOT_FOUND, "%s: status %d: %s", name, (int)st, err);
        ck_assert_msg(!strstr(err, "undefined symbol") && !strstr(err, "cannot load"),
                      "%s: %s", name, err);
        printf("plugin_load: %s not opened here: %s\n", name, err);
        dlclose(a.lib);
        return;
    }
    printf("plugin_load: %s opened through the RTLD_LOCAL libllmem\n", name);
    enum { N = 256 };
    float x[N], y[N], sum[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)i * 0.5f - 3.0f;
        y[i] = (float)(N - i) * 0.25f;
    }
    llmem_buffer *buf = NULL;
    ck_assert_int_eq(a.buffer_alloc(be, 3 * sizeof x, &buf), LLMEM_OK);
    ck_assert_int_eq(a.buffer_upload(buf, 0, x, sizeof x), LLMEM_OK);
    ck_assert_int_eq(a.buffer_upload(buf, sizeof x, y, sizeof y), LLMEM_OK);
    llmem_tensor tx = llmem_tensor_1d(buf, 0, LLMEM_DTYPE_F32, N);
    llmem_tensor ty = llmem_tensor_1d(buf, sizeof x, LLMEM_DTYPE_F32, N);
    llmem_tensor ts = llmem_tensor_1d(buf, 2 * sizeof x, LLMEM_DTYPE_F32, N);
    ck_assert_int_eq(a.op_add(be, &tx, &ty, &ts), LLMEM_OK);
    ck_assert_int_eq(a.buffer_download(buf, 2 * sizeof x, sum, sizeof sum), LLMEM_OK);
    /* Halves and quarters of small integers: every sum is exact in f32. */
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(sum[i], (float)((double)i * 0.5 - 3.0 + (double)(N - i) * 0.25));
    a.buffer_free(buf);
    a.backend_close(be);
    dlclose(a.lib);
}

START_TEST(test_vulkan_through_local_lib)
{
    check_device_plugin("vulkan");
}
END_TEST

START_TEST(test_cuda_through_local_lib)
{
    check_device_plugin("cuda");
}
END_TEST

int main(void)
{
    find_build_root();
    char buf[4096];
    snprintf(lib_path, sizeof lib_path, "%s", in_build(LLMEM_LIB_PATH, buf, sizeof buf));
    snprintf(plugin_dir, sizeof plugin_dir, "%s", in_build(LLMEM_PLUGIN_BUILD_DIR, buf, sizeof buf));
    snprintf(test_plugin_dir, sizeof test_plugin_dir, "%s",
             in_build(LLMEM_TEST_PLUGIN_DIR, buf, sizeof buf));
    snprintf(test_plugin_alt, sizeof test_plugin_alt, "%s",
             in_build(LLMEM_TEST_PLUGIN_DIR "/alt", buf, sizeof buf));
    printf("plugin_load: libllmem %s, plugins %s\n", lib_path, plugin_dir);
    Suite *s = suite_create("plugin_load");
    TCase *tc = tcase_create("plugin_load");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_every_plugin_resolves_alone);
    tcase_add_test(tc, test_testplug_through_local_lib);
    tcase_add_test(tc, test_vulkan_through_local_lib);
    tcase_add_test(tc, test_cuda_through_local_lib);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
