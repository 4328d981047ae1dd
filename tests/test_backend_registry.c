// ctest-labels: core
/* The backend registry and plugin loading (the buffer API: test_backend.c).
 *
 * Opening by name and device (bad names, missing plugins, "auto"), the
 * list of backends, and the plugins tests/extra.cmake builds from
 * tests/plugins/testplug.c, found through LLMEM_BACKEND_PATH: the search
 * order, plugins refused for their ABI, vtable, entry symbol or op layout,
 * and a plugin kept loaded while a backend or one of its buffers lives
 * (whether the module is mapped: dlopen RTLD_NOLOAD).
 * LLMEM_TEST_SEED=<n> changes the random seed (default fixed).
 */
#include "support/run.h"
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmem/backend.h"
#include "llmem/backend_impl.h"
#include "support/backend_test.h"

START_TEST(test_open_errors)
{
    use_test_plugins();
    char err[512];
    llmem_backend *be = (llmem_backend *)(void *)err;
    ck_assert_int_eq(llmem_backend_open("nosuch-backend", -1, &be, err, sizeof err),
                     LLMEM_E_NOT_FOUND);
    ck_assert_ptr_null(be);
    ck_assert_msg(strncmp(err, "nosuch-backend: ", 16) == 0, "%s", err);
    ck_assert_msg(strstr(err, "libllmem-nosuch-backend.so not found"), "%s", err);
    ck_assert_msg(strstr(err, test_plugin_dir(NULL)), "search path missing: %s", err);
    ck_assert_ptr_null(strchr(err, '\n'));

    char long_name[66];
    memset(long_name, 'a', 65); /* one past the 64-character limit */
    long_name[65] = '\0';
    const char *bad_names[] = {"", "../cpu", "a/b", "x y", "cpu.so", long_name};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        err[0] = '\0';
        ck_assert_int_eq(llmem_backend_open(bad_names[i], -1, &be, err, sizeof err),
                         LLMEM_E_INVALID);
        ck_assert_msg(strlen(err) > 0, "no message for \"%s\"", bad_names[i]);
    }
    ck_assert_int_eq(llmem_backend_open(NULL, -1, &be, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_backend_open("cpu", -1, NULL, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_backend_open("cpu", -2, &be, err, sizeof err), LLMEM_E_INVALID);
    ck_assert_int_eq(llmem_backend_open("cpu", 1, &be, err, sizeof err), LLMEM_E_NOT_FOUND);
    ck_assert_msg(strncmp(err, "cpu: ", 5) == 0 && strstr(err, "device 1"), "%s", err);
    ck_assert_int_eq(llmem_backend_open("nosuch", -1, &be, NULL, 0), LLMEM_E_NOT_FOUND);
    char tiny[8];
    memset(tiny, 'x', sizeof tiny);
    ck_assert_int_eq(llmem_backend_open("nosuch", -1, &be, tiny, sizeof tiny), LLMEM_E_NOT_FOUND);
    ck_assert_uint_eq(strnlen(tiny, sizeof tiny), sizeof tiny - 1);

    be = test_open("cpu");
    llmem_backend *dev0 = NULL;
    ck_assert_int_eq(llmem_backend_open("cpu", 0, &dev0, err, sizeof err), LLMEM_OK);
    llmem_backend_close(dev0);
    llmem_backend_close(be);
}
END_TEST

START_TEST(test_open_auto)
{
    llmem_backend *be = test_open("auto");
    const char *name = llmem_backend_name(be);
    ck_assert_msg(!strcmp(name, "cpu") || !strcmp(name, "cuda") || !strcmp(name, "vulkan"),
                  "auto opened \"%s\"", name);
    llmem_backend_info info;
    ck_assert_int_eq(llmem_backend_get_info(be, &info), LLMEM_OK);
    ck_assert_str_eq(info.backend, name);
    llmem_buffer *buf = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, 64, &buf), LLMEM_OK);
    llmem_buffer_free(buf);
    llmem_backend_close(be);
}
END_TEST

typedef struct lines {
    int n;
    char text[32][600];
} lines;

static void collect(const char *line, void *ctx)
{
    lines *l = ctx;
    ck_assert_ptr_nonnull(line);
    ck_assert_int_lt(l->n, 32);
    snprintf(l->text[l->n++], sizeof l->text[0], "%s", line);
}

static const char *find_line(const lines *l, const char *prefix)
{
    for (int i = 0; i < l->n; i++)
        if (strncmp(l->text[i], prefix, strlen(prefix)) == 0)
            return l->text[i];
    return NULL;
}

START_TEST(test_list)
{
    use_test_plugins();
    lines *l = calloc(1, sizeof *l);
    ck_assert_ptr_nonnull(l);
    llmem_backend_list(collect, l);
    ck_assert_int_ge(l->n, 3);
    ck_assert_msg(strncmp(l->text[0], "cpu: available, ", 16) == 0, "%s", l->text[0]);
    ck_assert_ptr_nonnull(strstr(l->text[0], " threads, "));
    ck_assert_ptr_nonnull(find_line(l, "cuda: "));
    ck_assert_ptr_nonnull(find_line(l, "vulkan: "));
    ck_assert_ptr_nonnull(find_line(l, "testplug: available, device 0: testplug malloc device"));
    ck_assert_ptr_null(find_line(l, "testplug: available, device 0: testplug alt device"));
    const char *bad = find_line(l, "badabi: unavailable: ");
    ck_assert_ptr_nonnull(bad);
    ck_assert_ptr_nonnull(strstr(bad, "ABI"));
    /* badvtable lists its device itself; its vtable is checked at open. */
    ck_assert_ptr_nonnull(find_line(l, "badvtable: available, "));
    ck_assert_ptr_nonnull(find_line(l, "noentry: unavailable: "));
    for (int i = 0; i < l->n; i++)
        ck_assert_ptr_null(strchr(l->text[i], '\n'));
    llmem_backend_list(NULL, NULL); /* must not crash */
    free(l);
    ck_assert(!plugin_loaded("libllmem-testplug.so"));
    ck_assert(!plugin_loaded("libllmem-badabi.so"));
}
END_TEST

START_TEST(test_plugin_open)
{
    use_test_plugins();
    ck_assert(!plugin_loaded("libllmem-testplug.so"));
    llmem_backend *be = test_open("testplug");
    ck_assert(plugin_loaded("libllmem-testplug.so"));
    ck_assert_str_eq(llmem_backend_name(be), "testplug");
    llmem_backend_info info;
    ck_assert_int_eq(llmem_backend_get_info(be, &info), LLMEM_OK);
    ck_assert_str_eq(info.backend, "testplug");
    ck_assert_str_eq(info.device_name, "testplug malloc device");
    ck_assert(!info.host_visible);
    ck_assert_ptr_null(be->iface->ops);

    llmem_backend *be2 = test_open("testplug"); /* two backends of one plugin */
    llmem_buffer *buf = NULL;
    ck_assert_int_eq(llmem_buffer_alloc(be, 333, &buf), LLMEM_OK);
    ck_assert_ptr_null(llmem_buffer_host_ptr(buf));
    unsigned char data[333], back[333];
    rng_seed(11);
    rng_bytes(data, sizeof data);
    ck_assert_int_eq(llmem_buffer_upload(buf, 0, data, sizeof data), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_download(buf, 0, back, sizeof back), LLMEM_OK);
    ck_assert_int_eq(memcmp(data, back, sizeof data), 0);
    llmem_buffer_free(buf);
    llmem_backend_close(be);
    ck_assert(plugin_loaded("libllmem-testplug.so")); /* be2 still holds it */
    llmem_backend_close(be2);
    ck_assert(!plugin_loaded("libllmem-testplug.so"));
}
END_TEST

START_TEST(test_plugin_search_order)
{
    char main_dir[1024], alt_dir[1024];
    snprintf(main_dir, sizeof main_dir, "%s", test_plugin_dir(NULL));
    snprintf(alt_dir, sizeof alt_dir, "%s", test_plugin_dir("/alt"));
    const struct {
        const char *first, *second, *device;
    } order[] = {{alt_dir, main_dir, "testplug alt device"},
                 {main_dir, alt_dir, "testplug malloc device"}};
    for (int k = 0; k < 2; k++) {
        char path[2100];
        snprintf(path, sizeof path, "%s:%s", order[k].first, order[k].second);
        ck_assert_int_eq(setenv("LLMEM_BACKEND_PATH", path, 1), 0);
        llmem_backend *be = test_open("testplug");
        llmem_backend_info info;
        ck_assert_int_eq(llmem_backend_get_info(be, &info), LLMEM_OK);
        ck_assert_str_eq(info.device_name, order[k].device);
        llmem_backend_close(be);
    }
    /* Without LLMEM_BACKEND_PATH the test plugins are not found. */
    ck_assert_int_eq(unsetenv("LLMEM_BACKEND_PATH"), 0);
    llmem_backend *be = NULL;
    char err[512];
    ck_assert_int_eq(llmem_backend_open("testplug", -1, &be, err, sizeof err), LLMEM_E_NOT_FOUND);
}
END_TEST

START_TEST(test_plugin_rejected)
{
    use_test_plugins();
    char err[512], want[64];
    llmem_backend *be = NULL;

    ck_assert_int_eq(llmem_backend_open("badabi", -1, &be, err, sizeof err), LLMEM_E_ABI);
    ck_assert_ptr_null(be);
    snprintf(want, sizeof want, "ABI %d", LLMEM_BACKEND_ABI_VERSION + 1);
    ck_assert_msg(strstr(err, want), "no \"%s\" in: %s", want, err);
    snprintf(want, sizeof want, "ABI %d", LLMEM_BACKEND_ABI_VERSION);
    ck_assert_msg(strstr(err, want), "no \"%s\" in: %s", want, err);
    ck_assert_msg(strncmp(err, "badabi: ", 8) == 0, "%s", err);
    ck_assert(!plugin_loaded("libllmem-badabi.so"));

    ck_assert_int_eq(llmem_backend_open("badvtable", -1, &be, err, sizeof err), LLMEM_E_ABI);
    ck_assert_ptr_null(be);
    ck_assert_msg(strstr(err, "buffer_copy"), "%s", err);
    ck_assert(!plugin_loaded("libllmem-badvtable.so"));

    ck_assert_int_eq(llmem_backend_open("noentry", -1, &be, err, sizeof err), LLMEM_E_ABI);
    ck_assert_msg(strstr(err, LLMEM_PLUGIN_ENTRY_SYMBOL), "%s", err);
    ck_assert(!plugin_loaded("libllmem-noentry.so"));

    /* The plugin's own reason comes back, with the name prefix once. */
    ck_assert_int_eq(llmem_backend_open("testplug", 3, &be, err, sizeof err), LLMEM_E_NOT_FOUND);
    ck_assert_str_eq(err, "testplug: no device 3");
    ck_assert(!plugin_loaded("libllmem-testplug.so"));
}
END_TEST

START_TEST(test_buffer_outlives_close)
{
    use_test_plugins();
    llmem_backend *be = test_open("testplug");
    llmem_buffer *buf = NULL, *second = NULL;
    unsigned char data[256], back[256];
    rng_seed(13);
    rng_bytes(data, sizeof data);
    ck_assert_int_eq(llmem_buffer_alloc(be, sizeof data, &buf), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_upload(buf, 0, data, sizeof data), LLMEM_OK);
    llmem_backend_close(be);

    /* The buffer keeps the backend and the plugin alive and working. */
    ck_assert(plugin_loaded("libllmem-testplug.so"));
    llmem_backend *owner = llmem_buffer_backend(buf);
    ck_assert_str_eq(llmem_backend_name(owner), "testplug");
    ck_assert_int_eq(llmem_buffer_download(buf, 0, back, sizeof back), LLMEM_OK);
    ck_assert_int_eq(memcmp(data, back, sizeof data), 0);
    ck_assert_int_eq(llmem_buffer_alloc(owner, 128, &second), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_copy(second, 0, buf, 128, 128), LLMEM_OK);
    ck_assert_int_eq(llmem_backend_synchronize(owner), LLMEM_OK);
    ck_assert_int_eq(llmem_buffer_download(second, 0, back, 128), LLMEM_OK);
    ck_assert_int_eq(memcmp(data + 128, back, 128), 0);

    llmem_buffer_free(buf);
    ck_assert(plugin_loaded("libllmem-testplug.so"));
    /* The last buffer destroys the backend (the plugin aborts if it still had
     * buffers) and unloads the plugin. */
    llmem_buffer_free(second);
    ck_assert(!plugin_loaded("libllmem-testplug.so"));
}
END_TEST

static Suite *registry_suite(void)
{
    Suite *s = suite_create("backend_registry");
    TCase *tc = tcase_create("registry");
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_open_auto);
    tcase_add_test(tc, test_list);
    tcase_add_test(tc, test_plugin_open);
    tcase_add_test(tc, test_plugin_search_order);
    tcase_add_test(tc, test_plugin_rejected);
    tcase_add_test(tc, test_buffer_outlives_close);
    /* auto and list may initialise a real Vulkan or CUDA driver. */
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    int failed = test_run_suite(registry_suite());
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
