// ctest-labels: core vulkan
/* What a Vulkan dispatch may hand a shader, without a device
 * (backends/vulkan/vk_spirv.c, compiled in here):
 *  - the SPIR-V reader on modules built here word by word from the SPIR-V
 *    specification (expected specialization-constant counts and push-block
 *    sizes worked out by hand), damaged modules refused;
 *  - every module the vulkan plugin embeds (the generated vk_shaders.c of
 *    this build, cooperative-matrix shaders included, which CI's lavapipe
 *    cannot run): readable, specialization constant ids below VK_MAX_SPEC
 *    and a push-constant block within VK_MAX_PUSH, so an op feeding them
 *    fits the pipeline layout on any device;
 *  - the same reader against spirv-dis (an independent disassembler) on
 *    every embedded module: tests/spirv_oracle.py runs this program with
 *    --dump;
 *  - vk_op_args_check: an op asking for more constants, push bytes or
 *    bindings than the layout takes is refused with one line naming the
 *    shader, the count asked and the limit (it used to surface only at
 *    dispatch on the GPU, as if a tensor exceeded a device limit). */
#include "support/run.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/vulkan/vk_spirv.c"
#ifdef LLMEM_VK_SHADERS
#include "vk_shaders.c" /* the plugin's embedded modules (tests/extra.cmake) */
#endif

/* ---- hand-built modules ---------------------------------------------------- */

typedef struct spv {
    uint32_t w[256];
    size_t n;
} spv;

static void spv_begin(spv *s, uint32_t bound)
{
    const uint32_t head[5] = {0x07230203u, 0x00010300u, 0, bound, 0};
    memcpy(s->w, head, sizeof head);
    s->n = 5;
}

/* One instruction: opcode and its operands (n words). */
static void ins(spv *s, uint32_t op, const uint32_t *ops, uint32_t n)
{
    s->w[s->n++] = ((n + 1) << 16) | op;
    for (uint32_t i = 0; i < n; i++)
        s->w[s->n++] = ops[i];
}

#define INS(s, op, ...)                                                             \
    do {                                                                            \
        const uint32_t o_[] = {__VA_ARGS__};                                        \
        ins(s, op, o_, (uint32_t)(sizeof o_ / sizeof o_[0]));                       \
    } while (0)

/* A module with SpecIds 0 and spec_hi, and the push block
 *   struct { uint a (offset 0); vec4 b (16); float c[3] (32, stride 4);
 *            mat2 d (48: two vec2 columns) }
 * : 48 + 2 * 8 = 64 bytes. Ids: 1 uint, 2 float, 3 vec4, 4 const 3,
 * 5 float[3], 6 vec2, 7 mat2, 8 struct, 9 pointer, 10 variable, 11 and 12
 * spec constants. */
static void module_push64(spv *s, uint32_t spec_hi)
{
    spv_begin(s, 13);
    INS(s, OP_DECORATE, 11, DEC_SPEC_ID, 0);
    INS(s, OP_DECORATE, 12, DEC_SPEC_ID, spec_hi);
    INS(s, OP_DECORATE, 5, DEC_ARRAY_STRIDE, 4);
    INS(s, OP_MEMBER_DECORATE, 8, 0, DEC_OFFSET, 0);
    INS(s, OP_MEMBER_DECORATE, 8, 1, DEC_OFFSET, 16);
    INS(s, OP_MEMBER_DECORATE, 8, 2, DEC_OFFSET, 32);
    INS(s, OP_MEMBER_DECORATE, 8, 3, DEC_OFFSET, 48);
    INS(s, OP_TYPE_INT, 1, 32, 0);
    INS(s, OP_TYPE_FLOAT, 2, 32);
    INS(s, OP_TYPE_VECTOR, 3, 2, 4);
    INS(s, OP_CONSTANT, 1, 4, 3);
    INS(s, OP_TYPE_ARRAY, 5, 2, 4);
    INS(s, OP_TYPE_VECTOR, 6, 2, 2);
    INS(s, OP_TYPE_MATRIX, 7, 6, 2);
    INS(s, OP_TYPE_STRUCT, 8, 1, 3, 5, 7);
    INS(s, OP_TYPE_POINTER, 9, SC_PUSH_CONSTANT, 8);
    INS(s, OP_VARIABLE, 9, 10, SC_PUSH_CONSTANT);
}

START_TEST(test_inspect_hand_built)
{
    spv s;
    vk_spirv_info info;
    char why[256] = "";
    module_push64(&s, 5);
    ck_assert_msg(vk_spirv_inspect(s.w, s.n * 4, &info, why, sizeof why), "%s", why);
    ck_assert_int_eq(info.n_spec, 6);
    ck_assert_uint_eq(info.push_bytes, 64);
    vk_op_asked none = {0};
    ck_assert_int_eq(vk_op_args_check("hand", &info, &none, why, sizeof why), LLMEM_OK);

    /* a constant id the layout cannot set: refused, by name and id */
    module_push64(&s, VK_MAX_SPEC);
    ck_assert(vk_spirv_inspect(s.w, s.n * 4, &info, why, sizeof why));
    ck_assert_int_eq(info.n_spec, VK_MAX_SPEC + 1);
    ck_assert_int_eq(vk_op_args_check("hand", &info, &none, why, sizeof why), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(why, "shader hand declares specialization constant id 12"));
    ck_assert_ptr_nonnull(strstr(why, "not a device limit"));

    /* a push block past 128 bytes: float[3] at offset 120 ends at 132 */
    module_push64(&s, 1);
    for (size_t i = 5; i < s.n; i += s.w[i] >> 16)
        if ((s.w[i] & 0xffffu) == OP_MEMBER_DECORATE && s.w[i + 2] == 2)
            s.w[i + 4] = 120;
    ck_assert(vk_spirv_inspect(s.w, s.n * 4, &info, why, sizeof why));
    ck_assert_uint_eq(info.push_bytes, 132);
    ck_assert_int_eq(vk_op_args_check("hand", &info, &none, why, sizeof why), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(why, "declares 132 bytes of push constants"));

    /* no push block, no constants */
    spv_begin(&s, 3);
    INS(&s, OP_TYPE_INT, 1, 32, 0);
    ck_assert(vk_spirv_inspect(s.w, s.n * 4, &info, why, sizeof why));
    ck_assert_int_eq(info.n_spec, 0);
    ck_assert_uint_eq(info.push_bytes, 0);
}
END_TEST

START_TEST(test_inspect_damaged)
{
    spv s;
    vk_spirv_info info;
    char why[256] = "";
    module_push64(&s, 1);
    uint32_t bad[256];
    memcpy(bad, s.w, s.n * 4);
    bad[0] = 0x12345678u; /* magic */
    ck_assert(!vk_spirv_inspect(bad, s.n * 4, &info, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "not a SPIR-V module"));
    ck_assert(!vk_spirv_inspect(s.w, s.n * 4 - 2, &info, why, sizeof why)); /* not words */
    ck_assert(!vk_spirv_inspect(s.w, 16, &info, why, sizeof why));          /* no header */
    ck_assert(!vk_spirv_inspect(NULL, 64, &info, why, sizeof why));
    /* the last instruction claims more words than the module has */
    memcpy(bad, s.w, s.n * 4);
    bad[s.n - 4] = (9u << 16) | OP_VARIABLE;
    ck_assert(!vk_spirv_inspect(bad, s.n * 4, &info, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "runs past the module"));
    /* a push member of a type it cannot size (an undefined id) */
    memcpy(bad, s.w, s.n * 4);
    for (size_t i = 5; i < s.n; i += bad[i] >> 16)
        if ((bad[i] & 0xffffu) == OP_TYPE_STRUCT)
            bad[i + 2] = 12; /* member 0: a spec constant, not a type */
    ck_assert(!vk_spirv_inspect(bad, s.n * 4, &info, why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "push constants"));
    /* an id bound of 0 */
    memcpy(bad, s.w, s.n * 4);
    bad[3] = 0;
    ck_assert(!vk_spirv_inspect(bad, s.n * 4, &info, why, sizeof why));
}
END_TEST

/* ---- the dispatch check ----------------------------------------------------------- */

START_TEST(test_args_check)
{
    char why[256] = "";
    vk_op_asked at_max = {VK_MAX_SPEC, VK_MAX_PUSH, VK_MAX_BINDINGS};
    ck_assert_int_eq(vk_op_args_check("matmul_cm", NULL, &at_max, why, sizeof why), LLMEM_OK);
    vk_op_asked spec = at_max;
    spec.n_spec = VK_MAX_SPEC + 2;
    ck_assert_int_eq(vk_op_args_check("matmul_cm", NULL, &spec, why, sizeof why),
                     LLMEM_E_INVALID);
    ck_assert_str_eq(why, "shader matmul_cm: the op asks for 14 specialization constants, a "
                          "pipeline takes at most 12 (VK_MAX_SPEC): a bug of llmem's vulkan "
                          "backend, not a device limit");
    vk_op_asked push = at_max;
    push.push_bytes = VK_MAX_PUSH + 4;
    ck_assert_int_eq(vk_op_args_check("rope_store", NULL, &push, why, sizeof why),
                     LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(why, "shader rope_store: the op asks for 132 bytes of push "
                                      "constants, the pipeline layout has 128"));
    vk_op_asked bind = at_max;
    bind.n_bind = VK_MAX_BINDINGS + 1;
    ck_assert_int_eq(vk_op_args_check("attn", NULL, &bind, why, sizeof why), LLMEM_E_INVALID);
    ck_assert_ptr_nonnull(strstr(why, "asks for 13 storage-buffer bindings"));
}
END_TEST

/* ---- the embedded modules --------------------------------------------------------- */

#ifdef LLMEM_VK_SHADERS
START_TEST(test_embedded_modules)
{
    int32_t n_read = 0, most_spec = 0;
    uint32_t most_push = 0;
    for (int32_t i = 0; i < VK_SH_COUNT; i++) {
        const vk_shader_code *c = &vk_shader_codes[i];
        if (c->size <= 4)
            continue; /* a KHR module left out (stale or not built): never used */
        vk_spirv_info info;
        char why[256] = "";
        ck_assert_msg(vk_spirv_inspect(c->code, c->size, &info, why, sizeof why), "%s: %s",
                      c->name, why);
        vk_op_asked none = {0};
        ck_assert_msg(vk_op_args_check(c->name, &info, &none, why, sizeof why) == LLMEM_OK,
                      "%s", why);
        /* every shader takes its workgroup size as constant 0 (vk_op_init) */
        ck_assert_msg(info.n_spec >= 1, "%s declares no specialization constant", c->name);
        most_spec = info.n_spec > most_spec ? info.n_spec : most_spec;
        most_push = info.push_bytes > most_push ? info.push_bytes : most_push;
        n_read++;
    }
    ck_assert_int_gt(n_read, 20);
    ck_assert_int_le(most_spec, VK_MAX_SPEC);
    ck_assert_uint_le(most_push, VK_MAX_PUSH);
    ck_assert_uint_gt(most_push, 0);
}
END_TEST
#endif

/* --dump DIR: writes every embedded module to DIR/<name>.spv and prints
 * "<name> <n_spec> <push_bytes>" per module as vk_spirv_inspect reads it,
 * for tests/spirv_oracle.py to compare with spirv-dis. */
static int dump(const char *dir)
{
#ifdef LLMEM_VK_SHADERS
    for (int32_t i = 0; i < VK_SH_COUNT; i++) {
        const vk_shader_code *c = &vk_shader_codes[i];
        vk_spirv_info info;
        char why[256] = "", path[4096];
        if (c->size <= 4 || !vk_spirv_inspect(c->code, c->size, &info, why, sizeof why))
            continue;
        snprintf(path, sizeof path, "%s/%s.spv", dir, c->name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(c->code, 1, c->size, f) != c->size || fclose(f) != 0) {
            fprintf(stderr, "%s: cannot write\n", path);
            return EXIT_FAILURE;
        }
        printf("%s %d %u\n", c->name, info.n_spec, info.push_bytes);
    }
    return EXIT_SUCCESS;
#else
    (void)dir;
    puts("vulkan_spirv: the vulkan plugin is not built; skipped");
    return 77;
#endif
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--dump") == 0)
        return dump(argv[2]);
    Suite *s = suite_create("vulkan_spirv");
    TCase *tc = tcase_create("spirv");
    tcase_add_test(tc, test_inspect_hand_built);
    tcase_add_test(tc, test_inspect_damaged);
    tcase_add_test(tc, test_args_check);
#ifdef LLMEM_VK_SHADERS
    tcase_add_test(tc, test_embedded_modules);
#endif
    suite_add_tcase(s, tc);
    return test_run_suite(s) ? EXIT_FAILURE : EXIT_SUCCESS;
}
