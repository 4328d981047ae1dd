/* llmem Vulkan backend: the plugin entry, the Vulkan loader, device listing
 * and selection, and the backend object.
 *
 * The Vulkan loader (libvulkan.so.1, or $LLMEM_VULKAN_LOADER) is opened
 * with dlopen at the first open or listing and handed to volk, so the
 * plugin loads on machines without Vulkan and says why it cannot open.
 * Device order, which is also the order of the device indices: discrete
 * GPUs, integrated GPUs, virtual GPUs, CPU implementations (lavapipe),
 * others; within a kind, the driver's order. Devices that lack what the
 * shaders need are listed last, with the reason.
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
#include "vk_presplit.h"
#include "vk_sum.h"

#define VALIDATION_LAYER "VK_LAYER_KHRONOS_validation"
#define MAX_DEVICES 16
#define REQ_BINDINGS VK_MAX_BINDINGS

/* The host's one error formatter (<llmem/plugin.h>). */
#define fmt llmem_errf

/* ---- loader ------------------------------------------------------------------------------ */

static void *g_loader; /* kept open: drivers do not all survive being unloaded */
static char g_loader_name[256];

/* Opens the loader once (under g_lock, instance_open). The plugin stays
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
    vk_backend *v = user; /* NULL: an instance's creation (instance_get) */
    const char *msg = d && d->pMessage ? d->pMessage : "(no message)";
    /* GENERAL messages come from the loader, VALIDATION ones from layers */
    const char *who = (type & VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT) ? "validation" : "loader";
    if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT) {
        if (v)
            v->validation_errors++;
        fprintf(stderr, "vulkan: %s error: %s\n", who, msg);
        if (v)
            vk_log(v, "validation error (%s): %s", who, msg);
    } else if (v) {
        vk_log(v, "validation warning (%s): %s", who, msg);
    }
    return VK_FALSE;
}

/* The Vulkan version the instance asks for: 1.3 where the loader has it
 * and $LLMEM_VULKAN_CM2 is not 0 (VK_NV_cooperative_matrix2's modules
 * are SPIR-V 1.6, which needs Vulkan 1.3 on instance and device), else
 * 1.2. */
static uint32_t instance_api(void)
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
 * file descriptors and resident memory flat; docs/vulkan.md, "Instances"),
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

/* Whether a new instance is kept for later opens: $LLMEM_VULKAN_KEEP_INSTANCE
 * 0 / 1, unset where one of its devices is NVIDIA's (vendor 0x10de). */
static bool keep_instance(VkInstance inst)
{
    const char *k = getenv("LLMEM_VULKAN_KEEP_INSTANCE");
    if (k && *k)
        return strcmp(k, "0") != 0;
    volkLoadInstanceOnly(inst);
    VkPhysicalDevice pd[MAX_DEVICES];
    uint32_t n = MAX_DEVICES;
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
    uint32_t api = instance_api();
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
    volkLoadInstanceOnly(*out);
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
 * so, FORK_HINT). The lock is held across
 * fork so that the child's copy is consistent. */
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
static llmem_status instance_open(vk_backend *v, VkInstance *out, bool *owned, char *why,
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

/* ---- devices ----------------------------------------------------------------------------- */

typedef struct dev_entry {
    VkPhysicalDevice pd;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceSubgroupProperties sg;
    VkPhysicalDeviceMaintenance3Properties m3;
    int rank;
    uint32_t queue_family;
    char why[160]; /* empty when usable */
} dev_entry;

static int type_rank(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 3;
    default: return 4;
    }
}

static const char *type_name(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
    }
}

/* Memory type with all of `want`, preferring `prefer` and avoiding
 * `avoid`; UINT32_MAX when none. */
static uint32_t pick_memory(const VkPhysicalDeviceMemoryProperties *mp, VkMemoryPropertyFlags want,
                            VkMemoryPropertyFlags prefer, VkMemoryPropertyFlags avoid)
{
    uint32_t best = UINT32_MAX;
    int best_score = -1;
    for (uint32_t i = 0; i < mp->memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp->memoryTypes[i].propertyFlags;
        if ((f & want) != want)
            continue;
        int score = ((f & prefer) == prefer ? 2 : 0) + ((f & avoid) ? 0 : 1);
        if (score > best_score) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

static void check_device(dev_entry *e)
{
    const VkPhysicalDeviceLimits *l = &e->props.limits;
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(e->pd, &mp);
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(e->pd, &nq, NULL);
    VkQueueFamilyProperties q[32];
    if (nq > 32)
        nq = 32;
    vkGetPhysicalDeviceQueueFamilyProperties(e->pd, &nq, q);
    e->queue_family = UINT32_MAX;
    for (uint32_t i = 0; i < nq && e->queue_family == UINT32_MAX; i++)
        if (q[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            e->queue_family = i;
    e->why[0] = '\0';
    if (e->props.apiVersion < VK_API_VERSION_1_1)
        fmt(e->why, sizeof e->why, "Vulkan 1.0 device (1.1 needed)");
    else if (e->queue_family == UINT32_MAX)
        fmt(e->why, sizeof e->why, "no compute queue");
    else if (l->maxPerStageDescriptorStorageBuffers < REQ_BINDINGS ||
             l->maxDescriptorSetStorageBuffers < REQ_BINDINGS)
        fmt(e->why, sizeof e->why, "fewer than %d storage buffers per stage", REQ_BINDINGS);
    else if (l->maxPushConstantsSize < VK_MAX_PUSH || l->maxComputeWorkGroupInvocations < 256 ||
             l->maxComputeWorkGroupSize[0] < 256 || l->maxComputeSharedMemorySize < 16384)
        fmt(e->why, sizeof e->why, "compute limits too small");
    else if (l->minStorageBufferOffsetAlignment > VK_ALIGN)
        fmt(e->why, sizeof e->why, "minStorageBufferOffsetAlignment %llu > %d",
            (unsigned long long)l->minStorageBufferOffsetAlignment, VK_ALIGN);
    else if (pick_memory(&mp, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                         0, 0) == UINT32_MAX)
        fmt(e->why, sizeof e->why, "no host-coherent memory for staging");
}

/* Enumerates the devices of an instance in llmem's order. */
static uint32_t list_sorted(VkInstance inst, dev_entry *out, uint32_t cap)
{
    uint32_t n = 0;
    if (vkEnumeratePhysicalDevices(inst, &n, NULL) != VK_SUCCESS || n == 0)
        return 0;
    VkPhysicalDevice pd[MAX_DEVICES];
    if (n > MAX_DEVICES)
        n = MAX_DEVICES;
    VkResult r = vkEnumeratePhysicalDevices(inst, &n, pd);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
        return 0;
    if (n > cap)
        n = cap;
    for (uint32_t i = 0; i < n; i++) {
        dev_entry *e = &out[i];
        memset(e, 0, sizeof *e);
        e->pd = pd[i];
        e->m3.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES;
        e->sg.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
        e->sg.pNext = &e->m3;
        VkPhysicalDeviceProperties2 p2 = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
            .pNext = &e->sg,
        };
        vkGetPhysicalDeviceProperties(pd[i], &e->props);
        if (e->props.apiVersion >= VK_API_VERSION_1_1) {
            vkGetPhysicalDeviceProperties2(pd[i], &p2);
            e->props = p2.properties;
        }
        e->sg.pNext = NULL;
        e->m3.pNext = NULL;
        check_device(e);
        e->rank = type_rank(e->props.deviceType) + (e->why[0] ? 8 : 0);
    }
    /* stable insertion sort by rank */
    for (uint32_t i = 1; i < n; i++) {
        dev_entry t = out[i];
        uint32_t j = i;
        while (j > 0 && out[j - 1].rank > t.rank) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = t;
    }
    return n;
}

static bool subgroup_usable(const dev_entry *e)
{
    const char *off = getenv("LLMEM_VULKAN_NO_SUBGROUP");
    if (off && *off && strcmp(off, "0") != 0)
        return false;
    VkSubgroupFeatureFlags need = VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT;
    return (e->sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
           (e->sg.supportedOperations & need) == need && e->sg.subgroupSize >= 1 &&
           e->sg.subgroupSize <= 128;
}

static void describe(const dev_entry *e, int32_t index, char *line, size_t len)
{
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(e->pd, &mp);
    VkDeviceSize heap = 0;
    for (uint32_t i = 0; i < mp.memoryHeapCount; i++)
        if ((mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[i].size > heap)
            heap = mp.memoryHeaps[i].size;
    uint32_t api = e->props.apiVersion;
    if (e->why[0]) {
        fmt(line, len, "device %d: %s (%s, Vulkan %u.%u.%u) unusable: %s", (int)index,
            e->props.deviceName, type_name(e->props.deviceType), VK_API_VERSION_MAJOR(api),
            VK_API_VERSION_MINOR(api), VK_API_VERSION_PATCH(api), e->why);
        return;
    }
    fmt(line, len, "device %d: %s (%s, Vulkan %u.%u.%u, %.1f GiB, subgroup %u%s)%s", (int)index,
        e->props.deviceName, type_name(e->props.deviceType), VK_API_VERSION_MAJOR(api),
        VK_API_VERSION_MINOR(api), VK_API_VERSION_PATCH(api), (double)heap / (1u << 30),
        e->sg.subgroupSize, subgroup_usable(e) ? "" : ", no subgroup arithmetic",
        index == 0 ? " [default]" : "");
}

static void list_devices(void (*fn)(const char *line, void *ctx), void *ctx)
{
    char why[256], line[512];
    VkInstance inst;
    bool owned;
    if (instance_open(NULL, &inst, &owned, why, sizeof why) != LLMEM_OK) {
        fmt(line, sizeof line, "unavailable: %s", why);
        fn(line, ctx);
        return;
    }
    dev_entry e[MAX_DEVICES];
    uint32_t n = list_sorted(inst, e, MAX_DEVICES);
    if (n == 0)
        fn("unavailable: no Vulkan device (the loader found no driver; see VK_DRIVER_FILES)", ctx);
    for (uint32_t i = 0; i < n; i++) {
        describe(&e[i], (int32_t)i, line, sizeof line);
        fn(line, ctx);
    }
    if (owned)
        vkDestroyInstance(inst, NULL);
}

/* ---- the backend object ---------------------------------------------------------------------- */

static void vk_destroy(llmem_backend *be)
{
    vk_backend *v = vk_from(be);
    if (!v)
        return;
    if (v->dev) {
        if (v->cm_ctr)
            vk_buffer_free(be, v->cm_ctr);
        if (v->argmax_part)
            vk_buffer_free(be, v->argmax_part);
        vk_sum_finish(v);
        vk_rope_finish(v);
        vk_nm_conv_finish(v);
        vk_conv_fold_finish(be, v);
        vk_presplit_finish(be, v);
        vk_cmd_finish(v);
        v->vk.vkDestroyDevice(v->dev, NULL);
    }
    if (v->messenger)
        vkDestroyDebugUtilsMessengerEXT(v->instance, v->messenger, NULL);
    if (v->instance && v->instance_owned) /* else kept for later opens (instance_get) */
        vkDestroyInstance(v->instance, NULL);
    if (v->log)
        fclose(v->log);
    free(v);
}

static void vk_get_info(llmem_backend *be, llmem_backend_info *info)
{
    vk_backend *v = vk_from(be);
    info->backend = "vulkan";
    info->device_name = v->device_name;
    info->device = v->device_index;
    info->host_visible = false;
    uint32_t heap = v->mem_props.memoryTypes[v->mem_type_device].heapIndex;
    info->memory_total = v->mem_props.memoryHeaps[heap].size;
    info->memory_free = info->memory_total > v->bytes_device ? info->memory_total - v->bytes_device : 0;
    if (v->has_budget) {
        VkPhysicalDeviceMemoryBudgetPropertiesEXT b = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT,
        };
        VkPhysicalDeviceMemoryProperties2 mp = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2,
            .pNext = &b,
        };
        vkGetPhysicalDeviceMemoryProperties2(v->phys, &mp);
        if (b.heapBudget[heap] > 0)
            info->memory_free = b.heapBudget[heap] > b.heapUsage[heap]
                                    ? b.heapBudget[heap] - b.heapUsage[heap]
                                    : 0;
    }
}

bool vk_has_device_ext(VkPhysicalDevice pd, const char *name)
{
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkExtensionProperties *e = calloc(n, sizeof *e);
    if (!e)
        return false;
    bool found = false;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(e[i].extensionName, name) == 0;
    free(e);
    return found;
}

/* Whether matmul_cm.comp may run (tensor cores): VK_NV_cooperative_matrix
 * with its feature, shaderFloat16 and the Vulkan memory model (glslang
 * emits that model for NV cooperative matrices), and a 16 x 16 x 16 shape
 * of f16 A/B and f32 C/D at subgroup scope among
 * vkGetPhysicalDeviceCooperativeMatrixPropertiesNV's (vk_cm_usable decides,
 * with the subgroup size and shared memory). $LLMEM_VULKAN_COOPMAT=0 turns
 * it off, and the extension is then not enabled. The KHR extension would
 * do as well, but Debian 12's glslang 12 cannot compile its GLSL. */
static bool coopmat_usable(const dev_entry *e)
{
    const char *off = getenv("LLMEM_VULKAN_COOPMAT");
    if ((off && strcmp(off, "0") == 0) || e->props.apiVersion < VK_API_VERSION_1_2 ||
        !vkGetPhysicalDeviceCooperativeMatrixPropertiesNV ||
        !vk_has_device_ext(e->pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME))
        return false;
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
    };
    VkPhysicalDeviceVulkanMemoryModelFeatures mf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES,
        .pNext = &cf,
    };
    VkPhysicalDeviceShaderFloat16Int8Features hf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
        .pNext = &mf,
    };
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &hf};
    vkGetPhysicalDeviceFeatures2(e->pd, &f2);
    if (!cf.cooperativeMatrix || !hf.shaderFloat16 || !mf.vulkanMemoryModel)
        return false;
    uint32_t n = 0;
    if (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(e->pd, &n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkCooperativeMatrixPropertiesNV *p = calloc(n, sizeof *p);
    vk_cm_shape *sh = calloc(n, sizeof *sh);
    bool ok = false;
    if (p && sh) {
        for (uint32_t i = 0; i < n; i++)
            p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
        if (vkGetPhysicalDeviceCooperativeMatrixPropertiesNV(e->pd, &n, p) == VK_SUCCESS) {
            for (uint32_t i = 0; i < n; i++)
                sh[i] = (vk_cm_shape){
                    .m = p[i].MSize,
                    .n = p[i].NSize,
                    .k = p[i].KSize,
                    .ab_f16 = p[i].AType == VK_COMPONENT_TYPE_FLOAT16_NV &&
                              p[i].BType == VK_COMPONENT_TYPE_FLOAT16_NV,
                    .cd_f32 = p[i].CType == VK_COMPONENT_TYPE_FLOAT32_NV &&
                              p[i].DType == VK_COMPONENT_TYPE_FLOAT32_NV,
                    .subgroup_scope = p[i].scope == VK_SCOPE_SUBGROUP_NV,
                };
            ok = vk_cm_usable(sh, n, e->sg.subgroupSize,
                              e->props.limits.maxComputeSharedMemorySize);
        }
    }
    free(p);
    free(sh);
    return ok;
}

static llmem_status device_create(vk_backend *v, const dev_entry *e, char *err, size_t len)
{
    v->phys = e->pd;
    v->props = e->props;
    v->queue_family = e->queue_family;
    vkGetPhysicalDeviceMemoryProperties(v->phys, &v->mem_props);
    v->has_budget = vk_has_device_ext(v->phys, VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
    v->coopmat = coopmat_usable(e);
    /* VK_NV_cooperative_matrix2 (vk_cm2.c) needs the KHR extension under it */
    bool khr_want = vk_khr_modules_wanted();
    bool cm2 = v->coopmat && instance_api() >= VK_API_VERSION_1_3 &&
               e->props.apiVersion >= VK_API_VERSION_1_3 &&
               vk_cm2_query(v->instance, e->pd, &v->cm2);
    bool khr = v->coopmat && (khr_want || cm2) &&
               vk_khr_cm_usable(v->instance, e->pd, e->sg.subgroupSize,
                                e->props.limits.maxComputeSharedMemorySize);
    v->coopmat_khr = khr && khr_want;
    v->coopmat2 = khr && cm2;
    /* bf16 matrices for the fast-mode decode modules (vk_khr_bf16_usable) */
    v->coopmat_bf16 = v->coopmat_khr && vk_khr_bf16_usable(v->instance, e->pd);
    const char *exts[5];
    uint32_t n_exts = 0;
    if (v->has_budget)
        exts[n_exts++] = VK_EXT_MEMORY_BUDGET_EXTENSION_NAME;
    if (v->coopmat)
        exts[n_exts++] = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
    if (khr)
        exts[n_exts++] = VK_KHR_CM_NAME;
    if (v->coopmat2)
        exts[n_exts++] = VK_CM2_NAME;
    if (v->coopmat_bf16)
        exts[n_exts++] = VK_KHR_BF16_NAME;
    /* features of matmul_cm.comp (and the KHR and coopmat2 modules), chained
     * only when they may run */
    VkPhysicalDeviceBufferDeviceAddressFeatures bda;
    if (!v->coopmat2)
        v->cm2.usable = false;
    vk_khr_bf16_features bf = {.sType = VK_KHR_BF16_STYPE_FEATURES,
                               .pNext = vk_cm2_chain(&v->cm2, &bda, NULL),
                               .shaderBFloat16Type = VK_TRUE,
                               .shaderBFloat16CooperativeMatrix = VK_TRUE};
    vk_khr_cm_features kf = {.sType = VK_KHR_CM_STYPE_FEATURES,
                          .pNext = v->coopmat_bf16 ? (void *)&bf : bf.pNext,
                          .cooperativeMatrix = VK_TRUE};
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV,
        .pNext = khr ? &kf : NULL,
        .cooperativeMatrix = VK_TRUE,
    };
    VkPhysicalDeviceVulkanMemoryModelFeatures mf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES,
        .pNext = &cf,
        .vulkanMemoryModel = VK_TRUE,
    };
    VkPhysicalDeviceShaderFloat16Int8Features hf = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
        .pNext = &mf,
        .shaderFloat16 = VK_TRUE,
    };
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = v->queue_family,
        .queueCount = 1,
        .pQueuePriorities = &prio,
    };
    VkDeviceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
        .pNext = v->coopmat ? &hf : NULL,
        .queueCreateInfoCount = 1,
        .pQueueCreateInfos = &qi,
        .enabledExtensionCount = n_exts,
        .ppEnabledExtensionNames = exts,
    };
    VkResult r = vkCreateDevice(v->phys, &ci, NULL, &v->dev);
    if (r != VK_SUCCESS) {
        v->dev = VK_NULL_HANDLE;
        fmt(err, len, "vulkan: vkCreateDevice failed on %s (%d)", e->props.deviceName, (int)r);
        return vk_status(r);
    }
    volkLoadDeviceTable(&v->vk, v->dev);
    v->vk.vkGetDeviceQueue(v->dev, v->queue_family, 0, &v->queue);

    const VkPhysicalDeviceLimits *l = &v->props.limits;
    v->mem_type_device = pick_memory(&v->mem_props, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0,
                                     VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
    if (v->mem_type_device == UINT32_MAX)
        v->mem_type_device = pick_memory(&v->mem_props, 0, 0, 0);
    v->mem_type_host = pick_memory(&v->mem_props,
                                   VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                       VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                   VK_MEMORY_PROPERTY_HOST_CACHED_BIT,
                                   VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    v->storage_align = l->minStorageBufferOffsetAlignment < 4 ? 4 : l->minStorageBufferOffsetAlignment;
    v->max_range = l->maxStorageBufferRange;
    v->max_alloc = e->m3.maxMemoryAllocationSize ? e->m3.maxMemoryAllocationSize : ((VkDeviceSize)1 << 30);
    vk_alloc_limits(v);
    v->max_groups = l->maxComputeWorkGroupCount[0] < l->maxComputeWorkGroupCount[1]
                        ? l->maxComputeWorkGroupCount[0]
                        : l->maxComputeWorkGroupCount[1];
    v->subgroup = subgroup_usable(e);
    v->subgroup_size = e->sg.subgroupSize;
    llmem_status st = vk_cmd_init(v);
    if (st != LLMEM_OK)
        fmt(err, len, "vulkan: cannot set up %s (%s)", e->props.deviceName, llmem_status_str(st));
    else {
        vk_prof_init(v);
        vk_steptime_init(v);
        vk_knobs_read(&v->knobs);
        vk_matmul_config(v);
        vk_scan_config(v);
        vk_conv_fold_config(v);
    }
    return st;
}

static llmem_status vk_open(int32_t device, llmem_backend **out, char *err, size_t err_len)
{
    char why[512] = "";
    llmem_status st;
    vk_backend *v = calloc(1, sizeof *v);
    if (!v) {
        fmt(err, err_len, "vulkan: out of host memory");
        return LLMEM_E_NO_MEMORY;
    }
    v->base.iface = &vk_iface;
    v->error = LLMEM_OK;
    const char *val = getenv("LLMEM_VULKAN_VALIDATION");
    v->validation_fatal = !(val && strcmp(val, "warn") == 0);
    const char *log = getenv("LLMEM_VULKAN_LOG");
    if (log && *log)
        v->log = fopen(log, "a");
    if ((st = instance_open(v, &v->instance, &v->instance_owned, why, sizeof why)) != LLMEM_OK) {
        fmt(err, err_len, "vulkan: %s", why);
        goto fail;
    }
    dev_entry e[MAX_DEVICES];
    uint32_t n = list_sorted(v->instance, e, MAX_DEVICES);
    if (n == 0) {
        fmt(err, err_len, "vulkan: no Vulkan device (the loader found no driver; see VK_DRIVER_FILES)");
        st = LLMEM_E_NOT_FOUND;
        goto fail;
    }
    uint32_t pick = device < 0 ? 0 : (uint32_t)device;
    if (pick >= n) {
        fmt(err, err_len, "vulkan: no device %d (%u device%s)", (int)device, n, n == 1 ? "" : "s");
        st = LLMEM_E_NOT_FOUND;
        goto fail;
    }
    if (e[pick].why[0]) {
        fmt(err, err_len, "vulkan: device %u (%s) is unusable: %s", pick, e[pick].props.deviceName,
            e[pick].why);
        st = LLMEM_E_NOT_FOUND;
        goto fail;
    }
    v->device_index = (int32_t)pick;
    snprintf(v->device_name, sizeof v->device_name, "%s", e[pick].props.deviceName);
    if ((st = device_create(v, &e[pick], err, err_len)) != LLMEM_OK)
        goto fail;
    vk_log(v, "opened device %u: %s (subgroup arithmetic %s, size %u; cooperative matrices %s%s)",
           pick, v->device_name, v->subgroup ? "on" : "off", v->subgroup_size,
           v->coopmat_bf16  ? "on, KHR and bf16 too"
           : v->coopmat_khr ? "on, KHR too"
           : v->coopmat     ? "on"
                            : "off",
           v->coopmat2 ? "; coopmat2 on" : "");
    if (v->coopmat2)
        vk_log(v, "coopmat2: workgroup scope up to %u invocations, flexible dimensions up to %u, "
                  "%u bytes of shared memory reserved, f16 -> f32 granularity %u x %u x %u at %u",
               v->cm2.wg_max, v->cm2.flex_max, v->cm2.smem_reserved, v->cm2.gran_m,
               v->cm2.gran_n, v->cm2.gran_k, VK_CM2_WG);
    *out = &v->base;
    return LLMEM_OK;
fail:
    vk_destroy(&v->base);
    return st;
}

/* Operand dtypes the Vulkan kernels refuse (llmem_backend_supports): none
 * at present (int8 Mamba-2 states: vk_ops_quant.c; a head whose f32 state
 * exceeds the device's shared memory still gets LLMEM_E_UNSUPPORTED from
 * the op itself). */
static bool vk_supports_op(llmem_backend *be, int32_t op, const llmem_dtype *dtypes,
                           int32_t n_dtypes)
{
    (void)be;
    (void)op;
    (void)dtypes;
    (void)n_dtypes;
    return true;
}

/* The open ops this backend implements: each vk_ops_*.c file adds its own
 * (LLMEM_OP_IMPL, <llmem/backend_impl.h>). */
LLMEM_OP_IMPL_LIST(vk_op_impls);

const llmem_backend_i vk_iface = {
    .struct_size = sizeof(llmem_backend_i),
    .destroy = vk_destroy,
    .get_info = vk_get_info,
    .buffer_alloc = vk_buffer_alloc,
    .buffer_free = vk_buffer_free,
    .buffer_upload = vk_buffer_upload,
    .buffer_download = vk_buffer_download,
    .buffer_copy = vk_buffer_copy,
    .buffer_fill = vk_buffer_fill,
    .synchronize = vk_synchronize,
    .ops = &vk_ops,
    .record_begin = vk_record_begin,
    .record_end = vk_record_end,
    .graph_replay = vk_graph_replay,
    .graph_free = vk_graph_free,
    .supports_op = vk_supports_op,
    .op_impls = &vk_op_impls,
    .buffer_copy_ranges = vk_buffer_copy_ranges,
    .reload_env = vk_reload_env,
};

static const llmem_plugin vk_plugin = {
    .abi_version = LLMEM_BACKEND_ABI_VERSION,
    .layout = LLMEM_BACKEND_ABI_LAYOUT,
    .name = "vulkan",
    .open = vk_open,
    .list_devices = list_devices,
};

/* The entry point; every llmem call of this plugin goes through the host
 * table it receives (<llmem/plugin.h>). */
LLMEM_PLUGIN_DEFINE(vk_plugin)
