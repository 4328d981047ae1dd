// ctest-labels: vulkan
/* Vulkan backend plugin tests, op side (test_vulkan.c covers devices,
 * buffers, chunks and submit batching; the ops themselves are covered by
 * the conformance suites test_ops*.c, which compare vulkan with cpu):
 *   - validation: a VK_EXT_debug_utils messenger of this test catches a
 *     deliberate error (so the layer works), then a workload over every op
 *     family through the plugin, with the Khronos validation layer on, must
 *     log zero errors;
 *   - vulkan against cpu where the conformance shapes stop: positions near
 *     2^24 for RoPE, 16 query heads per KV head and head_dim 256 in paged
 *     attention, and the subgroup and shared-memory variants of the
 *     reductions (the matmul's tiles and cooperative-matrix paths:
 *     test_vulkan_matmul.c).
 * Run on lavapipe: VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json.
 * Without a usable Vulkan device the suite is skipped.
 */
#include "support/run.h"
#include "support/ref64.h"
#include "support/vk_ops_test.h"
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llmem/ops.h"
#include "llmem/recurrent.h"

/* ---- workloads shared by the validation and comparison tests ------------------------------ */

/* Paged attention over one stream of L keys (pages handed out in reverse,
 * two extra free pages, every unwritten slot NaN), queries for its last T
 * tokens; with shift > 0 the first `shift` keys get a K-shift of +7
 * positions first. */
typedef struct attn_cfg {
    int32_t n_kv, n_heads, hd, ps, L, T, shift;
    llmem_dtype dt;
    float softcap;
    int32_t window;
} attn_cfg;

static void run_attention(llmem_backend *be, const attn_cfg *c, const float *q, const float *k,
                          const float *v, float *out)
{
    int32_t max_pages = llmem_pages_for(0, c->L, c->ps), n_pages = max_pages + 2;
    int32_t row = c->n_kv * c->hd;
    size_t pool_bytes = (size_t)n_pages * c->ps * row * llmem_dtype_size(c->dt);
    llmem_buffer *kp, *vp, *idx, *bk, *bv, *bq, *bo;
    OK(llmem_buffer_alloc(be, pool_bytes, &kp));
    OK(llmem_buffer_alloc(be, pool_bytes, &vp));
    OK(llmem_buffer_fill(kp, 0, pool_bytes / 4 * 4, llmem_nan_pattern(c->dt)));
    OK(llmem_buffer_fill(vp, 0, pool_bytes / 4 * 4, llmem_nan_pattern(c->dt)));
    int32_t n_idx = 3 * c->L + max_pages + 1 + 2 * c->T + 2 * c->shift;
    int32_t *t = calloc((size_t)n_idx, sizeof *t);
    int32_t *store_tok = t, *store_slot = t + c->L, *pt = store_slot + c->L;
    int32_t *seq_len = pt + max_pages, *kv_len = seq_len + 1, *tok_seq = kv_len + c->T;
    int32_t *sh_slot = tok_seq + c->T, *sh_delta = sh_slot + c->shift;
    for (int32_t j = 0; j < max_pages; j++)
        pt[j] = n_pages - 1 - j;
    for (int32_t j = 0; j < c->L; j++) {
        store_tok[j] = j;
        store_slot[j] = pt[j / c->ps] * c->ps + j % c->ps;
    }
    seq_len[0] = c->L;
    for (int32_t i = 0; i < c->T; i++) {
        kv_len[i] = c->L - c->T + i + 1;
        tok_seq[i] = 0;
    }
    for (int32_t j = 0; j < c->shift; j++) {
        sh_slot[j] = store_slot[j];
        sh_delta[j] = 7;
    }
    OK(llmem_buffer_alloc(be, (size_t)n_idx * 4, &idx));
    OK(llmem_buffer_upload(idx, 0, t, (size_t)n_idx * 4));
#define TAB(ptr, cnt) ((llmem_i32_table){(ptr), (size_t)((ptr) - t) * 4, (cnt)})
    llmem_kv_view kvd = (llmem_kv_view){
        .k = kp, .v = vp, .dtype = c->dt, .n_pages = n_pages, .page_size = c->ps,
        .n_kv_heads = c->n_kv, .head_dim = c->hd,
        .store_tok = TAB(store_tok, c->L), .store_slot = TAB(store_slot, c->L),
        .max_pages = max_pages, .page_table = TAB(pt, max_pages), .seq_len = TAB(seq_len, 1),
        .tok_kv_len = TAB(kv_len, c->T), .tok_seq = TAB(tok_seq, c->T),
        .shift_slot = TAB(sh_slot, c->shift), .shift_delta = TAB(sh_delta, c->shift),
    };
    llmem_view view = llmem_view_make(LLMEM_VIEW_KV, &kvd, sizeof kvd, idx);
#undef TAB
    llmem_tensor tk = up_f32(be, &bk, k, 3, c->L, c->n_kv, c->hd);
    llmem_tensor tv = up_f32(be, &bv, v, 3, c->L, c->n_kv, c->hd);
    llmem_tensor tq = up_f32(be, &bq, q, 3, c->T, c->n_heads, c->hd);
    llmem_tensor to = up_f32(be, &bo, NULL, 3, c->T, c->n_heads, c->hd);
    OK(llmem_op_kv_store(be, &view, &tk, &tv));
    if (c->shift > 0) {
        llmem_rope_params rp = {LLMEM_ROPE_NEOX, c->hd / 2, 10000.0f, 1.0f};
        OK(llmem_op_rope_shift(be, &rp, &view));
    }
    llmem_attn_params ap = {.scale = 1.0f / sqrtf((float)c->hd), .softcap = c->softcap,
                            .window = c->window};
    OK(llmem_op_attention_paged(be, &ap, &view, &tq, &to));
    get_f32(&to, out);
    llmem_buffer *all[] = {kp, vp, idx, bk, bv, bq, bo};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        llmem_buffer_free(all[i]);
    free(t);
}

static void compare_attention(llmem_backend *be, llmem_backend *cpu, const attn_cfg *c, double tol)
{
    size_t nq = (size_t)c->T * c->n_heads * c->hd, nk = (size_t)c->L * c->n_kv * c->hd;
    float *q = rand_vec(nq, -1, 1), *k = rand_vec(nk, -1, 1), *v = rand_vec(nk, -1, 1);
    float *o = malloc(nq * 4), *ref = malloc(nq * 4);
    run_attention(be, c, q, k, v, o);
    run_attention(cpu, c, q, k, v, ref);
    double e = rel_err(o, ref, nq);
    ck_assert_msg(e <= tol, "attention H=%d kv=%d hd=%d L=%d %s: error %g", c->n_heads, c->n_kv,
                  c->hd, c->L, llmem_dtype_name(c->dt), e);
    free(q), free(k), free(v), free(o), free(ref);
}

/* Mamba-2 conv + scan over two streams whose sources are each other's
 * destinations (copy-on-write: the snapshot path), with checkpoints after
 * an inner and the last token, states in dtype st. Outputs: y, and every
 * slot of both state buffers converted to f32 on the device. */
static void run_mamba(llmem_backend *be, llmem_dtype st, const float *x, const float *w,
                      const float *dt, const float *alog, const float *init_conv,
                      const float *init_ssm, float *y, float *conv_out, float *ssm_out)
{
    enum { NS = 2, NT = 3, H = 4, P = 8, N = 16, G = 2, DC = 4, SLOTS = 4 };
    const int32_t cd = H * P + 2 * G * N;
    llmem_state_desc desc[2] = {{"conv", 2, {DC - 1, cd}, st}, {"ssm", 3, {H, P, N}, st}};
    size_t es = llmem_dtype_size(st);
    size_t conv_slot = (size_t)(DC - 1) * cd, ssm_slot = (size_t)H * P * N;
    llmem_buffer *sb[2], *idx, *bx, *bw, *bxc, *bdt, *ba, *by, *bc;
    OK(llmem_buffer_alloc(be, SLOTS * conv_slot * es, &sb[0]));
    OK(llmem_buffer_alloc(be, SLOTS * ssm_slot * es, &sb[1]));
    /* initial states in slots 0 and 1, converted on the device */
    llmem_buffer *bi;
    llmem_tensor ti = up_f32(be, &bi, init_conv, 2, 2, (int32_t)conv_slot, 1);
    llmem_tensor tsc = {sb[0], 0, st, 2, {2, (int32_t)conv_slot, 1, 1}};
    OK(llmem_op_copy(be, &ti, 0, &tsc));
    llmem_buffer *bi2;
    llmem_tensor ti2 = up_f32(be, &bi2, init_ssm, 2, 2, (int32_t)ssm_slot, 1);
    llmem_tensor tss = {sb[1], 0, st, 2, {2, (int32_t)ssm_slot, 1, 1}};
    OK(llmem_op_copy(be, &ti2, 0, &tss));
    int32_t tab[] = {1, 0, /* src */ 0, 1, /* dst */ 2, -1, -1, 3 /* ckpt [stream][2] */};
    OK(llmem_buffer_alloc(be, sizeof tab, &idx));
    OK(llmem_buffer_upload(idx, 0, tab, sizeof tab));
    llmem_rs_view rsd = (llmem_rs_view){
        .n_states = 2, .desc = desc, .state = sb, .n_slots = SLOTS, .n_seqs = NS,
        .n_seq_tokens = NT, .src_slot = {tab, 0, NS}, .dst_slot = {tab + 2, 8, NS},
        .ckpt_slot = {tab + 4, 16, 2 * NS}, .n_ckpt = 2,
    };
    llmem_view view = llmem_view_make(LLMEM_VIEW_RECURRENT, &rsd, sizeof rsd, idx);
    llmem_tensor tx = up_f32(be, &bx, x, 2, NS * NT, cd, 1);
    llmem_tensor tw = up_f32(be, &bw, w, 2, cd, DC, 1);
    llmem_tensor txc = up_f32(be, &bxc, NULL, 2, NS * NT, cd, 1);
    OK(llmem_op_ssm_conv(be, &view, 0, &tx, &tw, NULL, &txc));
    llmem_tensor tdt = up_f32(be, &bdt, dt, 2, NS * NT, H, 1);
    llmem_tensor ta = up_f32(be, &ba, alog, 1, H, 1, 1);
    llmem_tensor ty = up_f32(be, &by, NULL, 2, NS * NT, H * P, 1);
    llmem_ssm_params sp = {H, P, N, G, 0.0f, INFINITY, 0};
    OK(llmem_op_ssm_scan(be, &sp, &view, 1, &txc, &tdt, &ta, NULL, NULL, &ty));
    get_f32(&ty, y);
    /* slots 0..3 back to f32 */
    llmem_tensor fc = up_f32(be, &bc, NULL, 2, SLOTS, (int32_t)conv_slot, 1);
    llmem_tensor sc = {sb[0], 0, st, 2, {SLOTS, (int32_t)conv_slot, 1, 1}};
    OK(llmem_op_copy(be, &sc, 0, &fc));
    get_f32(&fc, conv_out);
    llmem_buffer_free(bc);
    llmem_tensor fs = up_f32(be, &bc, NULL, 2, SLOTS, (int32_t)ssm_slot, 1);
    llmem_tensor ss = {sb[1], 0, st, 2, {SLOTS, (int32_t)ssm_slot, 1, 1}};
    OK(llmem_op_copy(be, &ss, 0, &fs));
    get_f32(&fs, ssm_out);
    llmem_buffer *all[] = {sb[0], sb[1], idx, bx, bw, bxc, bdt, ba, by, bc, bi, bi2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        llmem_buffer_free(all[i]);
}

/* A little of every op family, for the validation run. */
static void workload(llmem_backend *be)
{
    llmem_buffer *b[5];
    float *a = rand_vec(64 * 96, -1, 1), *w = rand_vec(40 * 96, -1, 1), o[64 * 40];
    llmem_tensor ta = up_f32(be, &b[0], a, 2, 64, 96, 1), tw = up_f32(be, &b[1], w, 2, 40, 96, 1);
    llmem_tensor to = up_f32(be, &b[2], NULL, 2, 64, 40, 1);
    llmem_tensor tw16 = {b[1], 0, F16, 2, {40, 48, 1, 1}}; /* w's bytes as f16 */
    llmem_tensor a3 = {b[0], 0, F32, 2, {3, 96, 1, 1}}, o3 = {b[2], 0, F32, 2, {3, 40, 1, 1}};
    llmem_tensor a48 = {b[0], 0, F32, 2, {64, 48, 1, 1}}, a40 = {b[0], 0, F32, 2, {40, 96, 1, 1}};
    llmem_tensor row = {b[1], 0, F32, 1, {40, 1, 1, 1}}, w40 = {b[1], 0, BF16, 1, {40, 1, 1, 1}};
    OK(llmem_op_matmul(be, &ta, &tw, &to));
    OK(llmem_op_matmul(be, &a3, &tw, &o3));
    OK(llmem_op_copy(be, &a40, 5, &tw16)); /* f32 -> f16, a column slice */
    OK(llmem_op_matmul(be, &a48, &tw16, &to));
    OK(llmem_buffer_alloc(be, 64 * 4, &b[3]));
    OK(llmem_buffer_fill(b[3], 0, 64 * 4, 7u)); /* row ids and positions */
    llmem_tensor ids = {b[3], 0, I32, 1, {5, 1, 1, 1}}, pos = {b[3], 0, I32, 1, {8, 1, 1, 1}};
    llmem_tensor tg = up_f32(be, &b[4], NULL, 2, 5, 48, 1);
    OK(llmem_op_get_rows(be, &tw16, &ids, &tg));
    OK(llmem_op_add(be, &to, &row, &to));
    OK(llmem_op_mul(be, &to, &to, &to));
    OK(llmem_op_swiglu(be, &to, &to, &to));
    OK(llmem_op_scale(be, &to, 0.5f, &to));
    OK(llmem_op_relu2(be, &to, &to));
    OK(llmem_op_softplus(be, &to, &to));
    OK(llmem_op_rms_norm(be, &to, &w40, 1e-5f, &to));
    OK(llmem_op_rms_norm_gated(be, &to, &to, &w40, 4, 1e-5f, &to));
    llmem_tensor x3 = {b[2], 0, F32, 3, {8, 5, 64, 1}};
    llmem_rope_params rp = {LLMEM_ROPE_NORMAL, 32, 10000.0f, 1.0f};
    OK(llmem_op_rope(be, &rp, &x3, &pos, &x3));
    OK(llmem_op_log_softmax(be, &to, &to));
    llmem_tensor am = {b[3], 0, I32, 1, {64, 1, 1, 1}};
    OK(llmem_op_argmax(be, &to, &am));
    int32_t blk_src[2] = {0, 3}, blk_dst[2] = {5, 9};
    OK(llmem_op_copy_blocks(be, b[0], 96, 2, blk_src, blk_dst));
    get_f32(&to, o);
    for (int i = 0; i < 5; i++)
        llmem_buffer_free(b[i]);
    free(a), free(w);
    /* kv_store, K-shift, attention; ssm_conv and ssm_scan with snapshots */
    attn_cfg c = {2, 4, 64, 16, 40, 3, 5, F16, 0.0f, 0};
    float *q = rand_vec(3 * 4 * 64, -1, 1), *k = rand_vec(40 * 2 * 64, -1, 1), out[3 * 4 * 64];
    run_attention(be, &c, q, k, k, out);
    free(q), free(k);
    float *m = rand_vec(4096, -1, 1), y[256], conv[4 * 3 * 96], ssm[4 * 512];
    run_mamba(be, BF16, m, m, m, m, m, m, y, conv, ssm);
    free(m);
}

#ifdef HAVE_VULKAN_H
static VKAPI_ATTR VkBool32 VKAPI_CALL count_errors(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                                   VkDebugUtilsMessageTypeFlagsEXT type,
                                                   const VkDebugUtilsMessengerCallbackDataEXT *d,
                                                   void *user)
{
    if (sev & VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)
        (*(int *)user)++;
    return VK_FALSE;
}

#define LOAD(gipa, inst, T, name) T name = (T)(void (*)(void))gipa(inst, #name)

/* Positive control: with a messenger of our own, the validation layer
 * reports an invalid call (a messenger with no severity bits). Returns
 * false when the layer is not installed. */
static bool layer_reports_errors(void)
{
    void *lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    ck_assert_ptr_nonnull(lib);
    PFN_vkGetInstanceProcAddr gipa;
    void *sym = dlsym(lib, "vkGetInstanceProcAddr");
    memcpy(&gipa, &sym, sizeof gipa);
    LOAD(gipa, NULL, PFN_vkEnumerateInstanceLayerProperties, vkEnumerateInstanceLayerProperties);
    LOAD(gipa, NULL, PFN_vkCreateInstance, vkCreateInstance);
    VkLayerProperties lp[64];
    uint32_t n = 64;
    bool found = false;
    if (vkEnumerateInstanceLayerProperties(&n, lp) >= 0)
        for (uint32_t i = 0; i < n; i++)
            found |= strcmp(lp[i].layerName, "VK_LAYER_KHRONOS_validation") == 0;
    if (!found)
        return false;
    int errors = 0;
    VkDebugUtilsMessengerCreateInfoEXT mi = {
        .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
        .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                       VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT,
        .pfnUserCallback = count_errors,
        .pUserData = &errors,
    };
    const char *layer = "VK_LAYER_KHRONOS_validation", *ext = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
                             .apiVersion = VK_API_VERSION_1_1};
    VkInstanceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app,
        .enabledLayerCount = 1, .ppEnabledLayerNames = &layer,
        .enabledExtensionCount = 1, .ppEnabledExtensionNames = &ext,
    };
    VkInstance inst;
    ck_assert_int_eq(vkCreateInstance(&ci, NULL, &inst), VK_SUCCESS);
    LOAD(gipa, inst, PFN_vkCreateDebugUtilsMessengerEXT, vkCreateDebugUtilsMessengerEXT);
    LOAD(gipa, inst, PFN_vkDestroyDebugUtilsMessengerEXT, vkDestroyDebugUtilsMessengerEXT);
    LOAD(gipa, inst, PFN_vkDestroyInstance, vkDestroyInstance);
    VkDebugUtilsMessengerEXT msg, bad = VK_NULL_HANDLE;
    ck_assert_int_eq(vkCreateDebugUtilsMessengerEXT(inst, &mi, NULL, &msg), VK_SUCCESS);
    ck_assert_int_eq(errors, 0);
    VkDebugUtilsMessengerCreateInfoEXT invalid = mi;
    invalid.messageSeverity = 0; /* VUID-...-messageSeverity-requiredbitmask */
    if (vkCreateDebugUtilsMessengerEXT(inst, &invalid, NULL, &bad) == VK_SUCCESS)
        vkDestroyDebugUtilsMessengerEXT(inst, bad, NULL);
    ck_assert_int_ge(errors, 1);
    vkDestroyDebugUtilsMessengerEXT(inst, msg, NULL);
    vkDestroyInstance(inst, NULL);
    return true;
}

START_TEST(test_validation)
{
    if (!layer_reports_errors()) {
        printf("test_validation: VK_LAYER_KHRONOS_validation not installed; skipped\n");
        return;
    }
    char path[] = "/tmp/llmem_vk_valXXXXXX";
    log_to_temp(path);
    setenv("VK_INSTANCE_LAYERS", "VK_LAYER_KHRONOS_validation", 1);
    llmem_backend *be = test_open("vulkan");
    workload(be);
    OK(llmem_backend_synchronize(be));
    llmem_backend_close(be);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[8192];
    int errors = 0, layer_lines = 0, submits = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "validation error", 16) == 0) {
            errors++;
            fprintf(stderr, "%s", line);
        }
        layer_lines += strstr(line, "VK_LAYER_KHRONOS_validation") != NULL;
        submits += strncmp(line, "submit ", 7) == 0;
    }
    fclose(f);
    unlink(path);
    ck_assert_msg(layer_lines > 0, "the validation layer was not active in the plugin");
    ck_assert_int_gt(submits, 0);
    ck_assert_int_eq(errors, 0);
}
END_TEST
#endif

/* ---- vulkan against cpu beyond the conformance shapes ------------------------------------ */

START_TEST(test_rope_large_positions)
{
    static const int32_t pos[] = {0, 1, -1, 65535, 16777215, -16777216, 16777259, 123456789,
                                  INT32_MAX, INT32_MIN};
    enum { T = sizeof pos / sizeof pos[0], H = 2, HD = 128 };
    llmem_backend *vk = test_open("vulkan"), *cpu = test_open("cpu");
    float *x = rand_vec(T * H * HD, -1, 1), out[2][T * H * HD];
    for (int mode = 0; mode < 2; mode++) {
        llmem_rope_params p = {mode ? LLMEM_ROPE_NEOX : LLMEM_ROPE_NORMAL, 96, 500000.0f, 1.0f};
        for (int bi = 0; bi < 2; bi++) {
            llmem_backend *be = bi ? cpu : vk;
            llmem_buffer *bx, *bp;
            llmem_tensor tx = up_f32(be, &bx, x, 3, T, H, HD);
            OK(llmem_buffer_alloc(be, sizeof pos, &bp));
            OK(llmem_buffer_upload(bp, 0, pos, sizeof pos));
            llmem_tensor tp = {bp, 0, I32, 1, {T, 1, 1, 1}};
            OK(llmem_op_rope(be, &p, &tx, &tp, &tx));
            get_f32(&tx, out[bi]);
            llmem_buffer_free(bx);
            llmem_buffer_free(bp);
        }
        /* exact integer range reduction: as close as f32 rounding allows */
        double e = rel_err(out[0], out[1], T * H * HD);
        ck_assert_msg(e <= 2e-6, "rope mode %d at large positions: error %g", mode, e);
    }
    free(x);
    llmem_backend_close(vk);
    llmem_backend_close(cpu);
}
END_TEST

START_TEST(test_attention_wide_groups)
{
    llmem_backend *vk = test_open("vulkan"), *cpu = test_open("cpu");
    /* 16 query heads per KV head (two workgroup chunks), head_dim 256,
     * several key blocks; then a window, soft-cap and a K-shift */
    attn_cfg a = {1, 16, 256, 16, 300, 5, 0, F16, 0.0f, 0};
    attn_cfg b = {2, 32, 64, 32, 257, 4, 40, BF16, 20.0f, 100};
    attn_cfg c = {4, 4, 96, 8, 130, 2, 9, F32, 0.0f, 0};
    compare_attention(vk, cpu, &a, 1e-4);
    compare_attention(vk, cpu, &b, 1e-4);
    compare_attention(vk, cpu, &c, 1e-4);
    /* decode over long histories: the keys are split over workgroups and
     * merged (with a window, and with a K-shift of the first pages) */
    attn_cfg dsplit = {2, 8, 128, 16, 3000, 2, 0, F16, 0.0f, 0};
    attn_cfg dwin = {1, 4, 64, 64, 2500, 1, 70, BF16, 30.0f, 1300};
    compare_attention(vk, cpu, &dsplit, 1e-4);
    compare_attention(vk, cpu, &dwin, 1e-4);
    llmem_backend_close(vk);
    llmem_backend_close(cpu);
}
END_TEST

/* The subgroup and the shared-memory variants of the reductions agree
 * with the cpu (both are the shared-memory one where the device has no
 * subgroup arithmetic). */
START_TEST(test_reduction_variants)
{
    llmem_backend *cpu = test_open("cpu");
    enum { R = 3, D = 5000 };
    float *x = rand_vec(R * D, -8, 8), *w = rand_vec(D, -1, 1);
    float out[3][2][R * D];
    for (int variant = 0; variant < 3; variant++) {
        if (variant == 1)
            setenv("LLMEM_VULKAN_NO_SUBGROUP", "1", 1);
        llmem_backend *be = variant == 2 ? cpu : test_open("vulkan");
        llmem_buffer *bx, *bw, *bo, *bo2;
        llmem_tensor tx = up_f32(be, &bx, x, 2, R, D, 1);
        llmem_tensor tw = up_f32(be, &bw, w, 1, D, 1, 1);
        llmem_tensor to = up_f32(be, &bo, NULL, 2, R, D, 1);
        llmem_tensor to2 = up_f32(be, &bo2, NULL, 2, R, D, 1);
        OK(llmem_op_rms_norm(be, &tx, &tw, 1e-6f, &to));
        OK(llmem_op_log_softmax(be, &tx, &to2));
        get_f32(&to, out[variant][0]);
        get_f32(&to2, out[variant][1]);
        llmem_buffer_free(bx), llmem_buffer_free(bw), llmem_buffer_free(bo), llmem_buffer_free(bo2);
        if (variant == 0 || variant == 1) {
            compare_matmul(be, cpu, 3, 777, 40, F32);
            attn_cfg a = {2, 8, 64, 16, 150, 3, 0, F16, 0.0f, 0};
            compare_attention(be, cpu, &a, 1e-4);
            llmem_backend_close(be);
        }
    }
    for (int variant = 0; variant < 2; variant++)
        for (int o = 0; o < 2; o++) {
            double e = rel_err(out[variant][o], out[2][o], R * D);
            ck_assert_msg(e <= 1e-5, "variant %d output %d: error %g", variant, o, e);
        }
    free(x), free(w);
    llmem_backend_close(cpu);
}
END_TEST

/* A dispatch of more workgroups than one grid dimension takes
 * (maxComputeWorkGroupCount: 65535 on lavapipe and on NVIDIA's y) is
 * split over x and y, which launches up to x - 1 workgroups more than
 * asked (vk_op.c); every shader maps (x, y) to one flat id and returns
 * past its count (docs/vulkan.md). rms_norm runs one workgroup a row:
 * 65535 + 9 rows launch 65535 x 2 workgroups, and every row must equal
 * the float64 reference (a row computed twice, or never, or a wrong
 * flat id, fails). */
START_TEST(test_grid_over_two_dims)
{
    enum { R = 65535 + 9, D = 8 };
    llmem_backend *vk = test_open("vulkan");
    float *x = rand_vec((size_t)R * D, -4, 4), *w = rand_vec(D, -1, 1);
    float *got = malloc((size_t)R * D * sizeof *got);
    ck_assert_ptr_nonnull(got);
    llmem_buffer *bx, *bw, *bo;
    llmem_tensor tx = up_f32(vk, &bx, x, 2, R, D, 1);
    llmem_tensor tw = up_f32(vk, &bw, w, 1, D, 1, 1);
    llmem_tensor to = up_f32(vk, &bo, NULL, 2, R, D, 1);
    OK(llmem_buffer_fill(bo, 0, llmem_buffer_size(bo), 0x7fc00000u)); /* NaN: rows never written */
    OK(llmem_op_rms_norm(vk, &tx, &tw, 1e-6f, &to));
    get_f32(&to, got);
    for (int32_t r = 0; r < R; r++) {
        double ss = 0;
        for (int32_t c = 0; c < D; c++)
            ss += (double)x[r * D + c] * x[r * D + c];
        double inv = 1.0 / sqrt(ss / D + 1e-6);
        for (int32_t c = 0; c < D; c++) {
            double want = x[r * D + c] * inv * w[c];
            ck_assert_msg(fabs(got[r * D + c] - want) <= 1e-5 * (1 + fabs(want)),
                          "row %d col %d: %g, float64 %g", r, c, (double)got[r * D + c], want);
        }
    }
    llmem_buffer_free(bx), llmem_buffer_free(bw), llmem_buffer_free(bo);
    free(x), free(w), free(got);
    llmem_backend_close(vk);
}
END_TEST

START_TEST(test_mamba_copy_on_write)
{
    enum { NS = 2, NT = 3, H = 4, P = 8, N = 16, G = 2, DC = 4, CD = H * P + 2 * G * N };
    llmem_backend *vk = test_open("vulkan"), *cpu = test_open("cpu");
    float *x = rand_vec(NS * NT * CD, -1, 1), *w = rand_vec(CD * DC, -0.5f, 0.5f);
    float *dt = rand_vec(NS * NT * H, -2, 1), *alog = rand_vec(H, -1, 1);
    float *ic = rand_vec(2 * (DC - 1) * CD, -1, 1), *is = rand_vec(2 * H * P * N, -1, 1);
    static const llmem_dtype st[3] = {F32, F16, BF16};
    for (int d = 0; d < 3; d++) {
        float y[2][NS * NT * H * P], conv[2][4 * (DC - 1) * CD], ssm[2][4 * H * P * N];
        run_mamba(vk, st[d], x, w, dt, alog, ic, is, y[0], conv[0], ssm[0]);
        run_mamba(cpu, st[d], x, w, dt, alog, ic, is, y[1], conv[1], ssm[1]);
        double tol = st[d] == F32 ? 1e-5 : st[d] == F16 ? 2e-3 : 1.6e-2;
        ck_assert_msg(rel_err(y[0], y[1], NS * NT * H * P) <= 1e-4, "y, state %s",
                      llmem_dtype_name(st[d]));
        /* conv states are past inputs: equal after the same rounding */
        ck_assert_msg(memcmp(conv[0], conv[1], sizeof conv[0]) == 0, "conv states, %s",
                      llmem_dtype_name(st[d]));
        ck_assert_msg(rel_err(ssm[0], ssm[1], 4 * H * P * N) <= tol, "ssm states, %s",
                      llmem_dtype_name(st[d]));
    }
    free(x), free(w), free(dt), free(alog), free(ic), free(is);
    llmem_backend_close(vk);
    llmem_backend_close(cpu);
}
END_TEST

/* The decode rows' row-wise ops split over workgroups ($LLMEM_VULKAN_ROW_SPLIT,
 * vk_row_split: each workgroup recomputes the row's sum of squares or
 * largest element and writes its part), at 12 rows, with the f16 terms of
 * their outputs written too ($LLMEM_VULKAN_PRESPLIT=2, as at these rows on
 * tensor cores): one chain without a wait, so that the residual's copies
 * (vk_sum.h) live from op to op:
 *   o0 = norm(x) (x's copy written), the gated norm (1 group of 4096, 2 of
 *   260; output apart from y and z), the SwiGLU (output apart from gate
 *   and up), x += r; o3 = norm(x) and again o4 (r apart from x and out:
 *   x read from its copy), x *= 2 (a write of x: the copy forgotten),
 *   x += r; o5 = norm(x), then x += r; r = norm(x) in place;
 * unsplit (1), the default (unset), 3, 8 and 64 parts (at 520 columns the
 * last 12 empty): against float64 (after the f32 adds the device makes),
 * and bit for bit equal to one workgroup a row. */
static void ref_glu(const float *g, const float *u, size_t n, double *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = ref64_silu(g[i]) * u[i];
}

/* want = norm of the f32 x [m, d] (float64), weights wd */
static void ref_norm_f32(const float *x, const double *wd, int32_t m, int32_t d, double *want)
{
    size_t n = (size_t)m * d;
    double *xd = malloc(n * sizeof *xd);
    ck_assert_ptr_nonnull(xd);
    for (size_t i = 0; i < n; i++)
        xd[i] = x[i];
    ref64_rms_norm(xd, wd, m, d, 1e-5, want);
    free(xd);
}

enum { RS_M = 12, RS_OUT = 8 };

/* One backend's chain (see above) into got[RS_OUT] (malloc'd). */
static void row_split_run(int32_t d, int32_t groups, const float *x, const float *r,
                          const float *y, const float *z, const float *w, float **got)
{
    llmem_backend *vk = test_open("vulkan");
    llmem_buffer *b[11];
    llmem_tensor tx = up_f32(vk, &b[0], x, 2, RS_M, d, 1);
    llmem_tensor tr = up_f32(vk, &b[1], r, 2, RS_M, d, 1);
    llmem_tensor ty = up_f32(vk, &b[2], y, 2, RS_M, d, 1);
    llmem_tensor tz = up_f32(vk, &b[3], z, 2, RS_M, d, 1);
    llmem_tensor tw = up_f32(vk, &b[4], w, 1, d, 1, 1);
    llmem_tensor to[6];
    for (int o = 0; o < 6; o++)
        to[o] = up_f32(vk, &b[5 + o], NULL, 2, RS_M, d, 1);
    OK(llmem_op_rms_norm(vk, &tx, &tw, 1e-5f, &to[0]));
    OK(llmem_op_rms_norm_gated(vk, &ty, &tz, &tw, groups, 1e-5f, &to[1]));
    OK(llmem_op_swiglu(vk, &ty, &tz, &to[2]));
    OK(llmem_op_add_rms_norm(vk, &tx, &tr, &tw, 1e-5f, &to[3]));
    OK(llmem_op_add_rms_norm(vk, &tx, &tr, &tw, 1e-5f, &to[4]));
    OK(llmem_op_scale(vk, &tx, 2.0f, &tx));
    OK(llmem_op_add_rms_norm(vk, &tx, &tr, &tw, 1e-5f, &to[5]));
    OK(llmem_op_add_rms_norm(vk, &tx, &tr, &tw, 1e-5f, &tr));
    size_t n = (size_t)RS_M * d;
    for (int o = 0; o < RS_OUT; o++)
        ck_assert_ptr_nonnull(got[o] = malloc(n * sizeof(float)));
    for (int o = 0; o < 6; o++)
        get_f32(&to[o], got[o]);
    get_f32(&tr, got[6]);
    get_f32(&tx, got[7]);
    for (int o = 0; o < 11; o++)
        llmem_buffer_free(b[o]);
    llmem_backend_close(vk);
}

START_TEST(test_row_split)
{
    static const int32_t widths[] = {520, 4096};
    static const char *splits[] = {"1", NULL, "3", "8", "64"};
    static const char *names[RS_OUT] = {"norm", "gated norm", "swiglu", "add + norm",
                                        "add + norm 2", "add + norm after x *= 2",
                                        "add + norm in place", "x"};
    setenv("LLMEM_VULKAN_PRESPLIT", "2", 1);
    for (int wi = 0; wi < 2; wi++) {
        int32_t d = widths[wi], groups = d == 520 ? 2 : 1;
        size_t n = (size_t)RS_M * d;
        float *x = rand_vec(n, -3, 3), *r = rand_vec(n, -1, 1), *y = rand_vec(n, -2, 2);
        float *z = rand_vec(n, -4, 4), *w = rand_vec((size_t)d, 0.5f, 1.5f);
        float *xs = malloc(n * sizeof *xs), *got[5][RS_OUT];
        double *want[RS_OUT], *wd = malloc((size_t)d * sizeof *wd);
        double *yd = malloc(n * sizeof *yd), *zd = malloc(n * sizeof *zd);
        ck_assert(xs && wd && yd && zd);
        for (int o = 0; o < RS_OUT; o++)
            ck_assert_ptr_nonnull(want[o] = malloc(n * sizeof(double)));
        /* float64 after the device's f32 adds (and the exact doubling) */
        for (int32_t c = 0; c < d; c++)
            wd[c] = w[c];
        for (size_t i = 0; i < n; i++)
            xs[i] = x[i], yd[i] = y[i], zd[i] = z[i];
        ref_norm_f32(xs, wd, RS_M, d, want[0]);
        ref64_rms_norm_gated(yd, zd, wd, RS_M, d, groups, 1e-5, want[1]);
        ref_glu(y, z, n, want[2]);
        for (int o = 3; o < 7; o++) {
            for (size_t i = 0; i < n; i++)
                xs[i] = (o == 5 ? 2.0f * xs[i] : xs[i]) + r[i];
            ref_norm_f32(xs, wd, RS_M, d, want[o]);
        }
        for (size_t i = 0; i < n; i++)
            want[7][i] = xs[i];
        for (int si = 0; si < 5; si++) {
            if (splits[si])
                setenv("LLMEM_VULKAN_ROW_SPLIT", splits[si], 1);
            else
                unsetenv("LLMEM_VULKAN_ROW_SPLIT");
            row_split_run(d, groups, x, r, y, z, w, got[si]);
            const char *sn = splits[si] ? splits[si] : "unset";
            for (int o = 0; o < RS_OUT; o++) {
                for (size_t i = 0; i < n; i++) {
                    double e = fabs(got[si][o][i] - want[o][i]);
                    ck_assert_msg(e <= 1e-5 * (1 + fabs(want[o][i])),
                                  "%s, %d wide, split %s, at %zu: %g, float64 %g", names[o], d,
                                  sn, i, (double)got[si][o][i], want[o][i]);
                }
                ck_assert_msg(memcmp(got[si][o], got[0][o], n * sizeof(float)) == 0,
                              "%s, %d wide, split %s: not the bits of one workgroup a row",
                              names[o], d, sn);
            }
        }
        for (int si = 0; si < 5; si++)
            for (int o = 0; o < RS_OUT; o++)
                free(got[si][o]);
        for (int o = 0; o < RS_OUT; o++)
            free(want[o]);
        free(x), free(r), free(y), free(z), free(w), free(xs), free(wd), free(yd), free(zd);
    }
    unsetenv("LLMEM_VULKAN_ROW_SPLIT");
    unsetenv("LLMEM_VULKAN_PRESPLIT");
}
END_TEST

int main(void)
{
    vk_test_seed();
    /* without a device nothing here can run: ctest shows "skipped" (SKIP_RETURN_CODE 77) */
    if (!vulkan_opens("test_vulkan_ops", "skipped"))
        return 77;
    Suite *s = suite_create("vulkan_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
#ifdef HAVE_VULKAN_H
    tcase_add_test(tc, test_validation);
#endif
    tcase_add_test(tc, test_rope_large_positions);
    tcase_add_test(tc, test_attention_wide_groups);
    tcase_add_test(tc, test_reduction_variants);
    tcase_add_test(tc, test_grid_over_two_dims);
    tcase_add_test(tc, test_mamba_copy_on_write);
    tcase_add_test(tc, test_row_split);
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
