/* llmem Vulkan backend: the Vulkan loader and the instances.
 *
 * The Vulkan loader (libvulkan.so.1, or $LLMEM_VULKAN_LOADER) is opened
 * with dlopen at the first open or listing and handed to volk, so the
 * plugin loads on machines without Vulkan and says why it cannot open.
 * Instances are kept for later opens on NVIDIA's driver (g_inst below).
 *
 * Validation: when a validation layer is active ($VK_INSTANCE_LAYERS, or
 * $LLMEM_VULKAN_VALIDATION=1 to enable VK_LAYER_KHRONOS_validation), a
 * VK_EXT_debug_utils messenger prints every error to stderr and counts it;
 * a counted error makes the next synchronize or download fail with
 * LLMEM_E_BACKEND, unless $LLMEM_VULKAN_VALIDATION=warn. $LLMEM_VULKAN_LOG
 * names a file that receives the messages and one line per submit.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vk_internal.h"

#define VALIDATION_LAYER "VK_LAYER_KHRONOS_validation"

/* The host's one error formatter (<llmem/plugin.h>). */
#define fmt llmem_errf

/* ---- loader ------------------------------------------------------------------------------ */

static void *g_loader; /* kept open: drivers do not all survive being unloaded */
static char g_loader_name[256];

/* Opens the loader once (under g_lock, vk_instance_open). The plugin stays
 * mapped (linked -z nodelete), so the loader, once open, serves every
 * later open of this process: a $LLMEM_VULKAN_LOADER that names another
 * library then gets LLMEM_E_NOT_FOUND with the reason, rather than being
 * ignored. */
static llmem_status loader_open(char *why, size_t len)
{
    const char *name = getenv("LLMEM_VULKAN_LOADER");
    if (!name || !*name)
        name = "libvulkan.so.1";
    if (g_loader && strcmp(name, g_loader_name) == 0)
        return LLMEM_OK;
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        fmt(why, len, "no Vulkan loader (%s: %s)", name, e ? e : "cannot open");
        return LLMEM_E_NOT_FOUND;
    }
    if (g_loader) { /* another name: the same library (dlopen's handle) or a refusal */
        dlclose(h);
        if (h == g_loader)
            return LLMEM_OK;
        fmt(why, len, "the Vulkan loader %s is in use in this process; %s cannot replace it",
            g_loader_name, name);
        return LLMEM_E_NOT_FOUND;
    }
    void *sym = dlsym(h, "vkGetInstanceProcAddr");
    if (!sym) {
        fmt(why, len, "no Vulkan loader (%s has no vkGetInstanceProcAddr)", name);
        dlclose(h);
        return LLMEM_E_NOT_FOUND;
    }
    PFN_vkGetInstanceProcAddr gipa;
    memcpy(&gipa, &sym, sizeof gipa);
    volkInitializeCustom(gipa);
    if (volkGetInstanceVersion() < VK_API_VERSION_1_1) {
        fmt(why, len, "the Vulkan loader %s supports only Vulkan 1.0 (1.1 needed)", name);
        dlclose(h);
        return LLMEM_E_NOT_FOUND;
    }
    g_loader = h;
    snprintf(g_loader_name, sizeof g_loader_name, "%s", name);
    return LLMEM_OK;
}

/* ---- instance ---------------------------------------------------------------------------- */

static bool has_instance_ext(const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateInstanceExtensionProperties(NULL, &n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkExtensionProperties *e = calloc(n, sizeof *e);
    if (!e)
        return false;
    bool found = false;
    if (vkEnumerateInstanceExtensionProperties(NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(e[i].extensionName, name) == 0;
    free(e);
    return found;
}

static bool has_layer(const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkLayerProperties *l = calloc(n, sizeof *l);
    if (!l)
        return false;
    bool found = false;
    if (vkEnumerateInstanceLayerProperties(&n, l) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(l[i].layerName, name) == 0;
    free(l);
    return found;
}

static VKAPI_ATTR VkBool32 VKAPI_CALL on_debug(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                               VkDebugUtilsMessageTypeFlagsEXT type,
                                               const VkDebugUtilsMessengerCallbackDataEXT *d,
                                               void *user)
{
    vk_backend *v = user;
    const char *msg = d && d->pMessage ? d->pMessage : "(no message)";
    /* GENERAL messages come from the loader, VALIDATION ones from layers */
    const char *who = (type & VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT) ? "validation" : "loader";
    if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        v->validation_errors++;
        fprintf(stderr, "vulkan: %s error: %s\n", who, msg);
        vk_log(v, "validation error (%s): %s", who, msg);
    } else {
        vk_log(v, "validation warning (%s): %s", who, msg);
    }
    return VK_FALSE;
}

/* (vk_internal.h) VK_NV_cooperative_matrix2's modules are SPIR-V 1.6,
 * which needs Vulkan 1.3 on instance and device. */
uint32_t vk_instance_api(void)
{
    const char *cm2 = getenv("LLMEM_VULKAN_CM2");
    if (volkGetInstanceVersion() >= VK_API_VERSION_1_3 && !(cm2 && strcmp(cm2, "0") == 0))
        return VK_API_VERSION_1_3;
    return VK_API_VERSION_1_2;
}

/* The instances of this process, kept until it exits, on NVIDIA's driver:
 * it refuses vkCreateInstance with VK_ERROR_INCOMPATIBLE_DRIVER after
 * about 30 create / destroy cycles in one process (580 on the H200,
 * measured: the 30th open of a loop of llmem_backend_open / close, with
 * file descriptors and resident memory flat; docs/vulkan.md,
 * $LLMEM_VULKAN_KEEP_INSTANCE),
 * and other projects report it corrupting SubgroupLocalInvocationId after
 * about 11 (Genesis-Embodied-AI/quadrants pull request 465, whose fix, one
 * instance for the process, this follows). So there each open reuses the
 * instance made by an earlier one with the same settings, and only devices
 * are made and destroyed per open. The price: a child of fork() cannot
 * make an instance there while its parent keeps one (vkCreateInstance
 * -9 in every forked test of test_vulkan on the H200), as CUDA cannot be
 * used in a child forked after cuInit; such a program sets
 * $LLMEM_VULKAN_KEEP_INSTANCE=0. Elsewhere (unless
 * $LLMEM_VULKAN_KEEP_INSTANCE=1) each backend destroys its own instance,
 * which also unloads the driver: a child of fork() then finds no driver
 * threads of its parent's (lavapipe's would hang it). The settings are the
 * API version, the validation layer, the debug-utils extension and every
 * VK_* environment variable (the loader reads them at creation:
 * $VK_DRIVER_FILES, $VK_INSTANCE_LAYERS, ...); a fifth set of settings, or
 * one whose variables pass ENV_KEY bytes, gets an instance of its own.
 * Guarded by g_lock, which also guards loader_open. */
#define INSTANCE_CACHE 4
#define ENV_KEY 2048
typedef struct cached_instance {
    VkInstance inst;
    uint32_t api;
    bool layer, debug;
    char env[ENV_KEY];
} cached_instance;
static cached_instance g_inst[INSTANCE_CACHE];
static bool g_forked_keeping; /* a fork() child of a process that kept an instance */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
#define FORK_HINT                                                                                 \
    "; this process is a fork() child of one that kept a Vulkan instance, where NVIDIA's driver " \
    "makes none: set LLMEM_VULKAN_KEEP_INSTANCE=0 before the parent's first open"
extern char **environ;

/* The VK_* variables of the environment, one "NAME=value\n" after another
 * in environ's order, into key[ENV_KEY]; false when they do not fit. */
static bool env_key(char key[ENV_KEY])
{
    size_t n = 0;
    key[0] = 0;
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "VK_", 3) != 0)
            continue;
        size_t l = strlen(*e);
        if (n + l + 2 > ENV_KEY)
            return false;
        memcpy(key + n, *e, l);
        key[n + l] = '\n';
        n += l + 1;
        key[n] = 0;
    }
    return true;
}

/* Whether a new instance (volk loaded for it) is kept for later opens:
 * $LLMEM_VULKAN_KEEP_INSTANCE 0 / 1, unset where one of its devices is
 * NVIDIA's (vendor 0x10de). */
static bool keep_instance(VkInstance inst)
{
    const char *k = getenv("LLMEM_VULKAN_KEEP_INSTANCE");
    if (k && *k)
        return strcmp(k, "0") != 0;
    VkPhysicalDevice pd[VK_MAX_DEVICES];
    uint32_t n = VK_MAX_DEVICES;
    if (vkEnumeratePhysicalDevices(inst, &n, pd) < 0)
        return false;
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        vkGetPhysicalDeviceProperties(pd[i], &p);
        if (p.vendorID == 0x10de)
            return true;
    }
    return false;
}

/* Creates or reuses the instance (and, for a backend v, its messenger when
 * validation is on); *owned says whether the caller destroys it. v may be
 * NULL for a listing. */
static llmem_status instance_get(vk_backend *v, VkInstance *out, bool *owned, char *why,
                                 size_t len)
{
    const char *val = getenv("LLMEM_VULKAN_VALIDATION");
    bool want_layer = val && strcmp(val, "1") == 0;
    const char *env_layers = getenv("VK_INSTANCE_LAYERS");
    bool debug = v && (want_layer || (env_layers && *env_layers) || (val && *val)) &&
                 has_instance_ext(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    const char *layers[1] = {VALIDATION_LAYER};
    bool use_layer = v && want_layer && has_layer(VALIDATION_LAYER);
    const char *exts[1] = {VK_EXT_DEBUG_UTILS_EXTENSION_NAME};
    uint32_t api = vk_instance_api();
    VkDebugUtilsMessengerCreateInfoEXT mi = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        .pfnUserCallback = on_debug,
        .pUserData = v, /* creation's (and a destroy's: only while v lives) messages */
    };
    *owned = false;
    *out = VK_NULL_HANDLE;
    int slot = -1;
    char key[ENV_KEY];
    bool cacheable = env_key(key);
    for (int i = 0; cacheable && i < INSTANCE_CACHE && !*out; i++) {
        cached_instance *c = &g_inst[i];
        if (!c->inst) {
            if (slot < 0)
                slot = i;
        } else if (c->api == api && c->layer == use_layer && c->debug == debug &&
                   strcmp(c->env, key) == 0) {
            *out = c->inst;
            volkLoadInstanceOnly(*out);
        }
    }
    if (!*out) {
        VkApplicationInfo app = {
            .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
            .pApplicationName = "llmem",
            .pEngineName = "llmem",
            .apiVersion = api,
        };
        VkInstanceCreateInfo ci = {
            .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
            .pNext = debug ? &mi : NULL,
            .pApplicationInfo = &app,
            .enabledLayerCount = use_layer ? 1 : 0,
            .ppEnabledLayerNames = layers,
            .enabledExtensionCount = debug ? 1 : 0,
            .ppEnabledExtensionNames = exts,
        };
        VkResult r = vkCreateInstance(&ci, NULL, out);
        if (r != VK_SUCCESS) {
            *out = VK_NULL_HANDLE;
            const char *hint = g_forked_keeping ? FORK_HINT : "";
            if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED) {
                fmt(why, len, "no Vulkan driver found (vkCreateInstance: %d)%s", (int)r, hint);
                return LLMEM_E_NOT_FOUND;
            }
            fmt(why, len, "vkCreateInstance failed (%d)%s", (int)r, hint);
            return vk_status(r);
        }
        volkLoadInstanceOnly(*out);
        if (cacheable && slot >= 0 && keep_instance(*out)) {
            cached_instance *c = &g_inst[slot];
            c->inst = *out;
            c->api = api;
            c->layer = use_layer;
            c->debug = debug;
            memcpy(c->env, key, sizeof key);
        } else {
            *owned = true;
        }
    }
    if (debug) {
        if (vkCreateDebugUtilsMessengerEXT(*out, &mi, NULL, &v->messenger) != VK_SUCCESS)
            v->messenger = VK_NULL_HANDLE;
    }
    return LLMEM_OK;
}

/* A child of fork() must not touch the parent's instances: the driver's
 * threads behind them did not come along (lavapipe's hang the first
 * submit). It forgets them (never destroyed there) and tries to make its
 * own (which NVIDIA's driver refuses: see g_inst; the error then says
 * so, FORK_HINT). The lock is held across fork so that the child's copy
 * is consistent. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&g_lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&g_lock);
}

static void fork_child(void)
{
    for (int i = 0; i < INSTANCE_CACHE; i++)
        g_forked_keeping |= g_inst[i].inst != VK_NULL_HANDLE;
    memset(g_inst, 0, sizeof g_inst);
    pthread_mutex_unlock(&g_lock);
}

static void fork_handlers(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* loader_open, then instance_get, under g_lock (opens and listings may
 * come from several threads). */
llmem_status vk_instance_open(vk_backend *v, VkInstance *out, bool *owned, char *why,
                              size_t len)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fork_handlers);
    pthread_mutex_lock(&g_lock);
    llmem_status st = loader_open(why, len);
    if (st == LLMEM_OK)
        st = instance_get(v, out, owned, why, len);
    pthread_mutex_unlock(&g_lock);
    return st;
}
