/* libFuzzer harness: bytes -> llmem_safetensors_open (the header and the
 * tensor table of safetensors files, and model.safetensors.index.json).
 *
 * Input: byte 0 picks the layout (modulo 3):
 *   0  one file, m.safetensors = bytes [1, n);
 *   1  a folder of two files: bytes 1-2 (little-endian) are the length of
 *      a.safetensors (clamped), which follows; b.safetensors is the rest;
 *   2  a folder with model.safetensors.index.json = bytes [1, first NUL),
 *      then the two files as in 1.
 * The files are written to a scratch folder and opened from there.
 *
 * Contract checked: open never crashes, leaks or hits undefined behaviour;
 * a failure returns a negative status, leaves *out NULL and says why. A
 * success gives a table sorted by name without repeats; every tensor's
 * element count is the product of its shape and its byte count that times
 * the element size of its dtype (the format's table, here); its bytes are
 * the ones its header entry's data_offsets name (the header parsed again
 * here, independently of the loader's checks); tensors of one file do not
 * overlap; llmem_safetensors_find returns the same tensor, and
 * LLMEM_E_UNSUPPORTED exactly for dtypes other than F32, F16 and BF16;
 * with an index, every tensor it names is in the file it names.
 *
 * Seeds: tests/fuzz/corpus/fuzz_safetensors (shrunken copies of the
 * fixtures' checkpoints, tests/fuzz/make_corpus.py). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_files.h"
#include "llmem/model.h"

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_safetensors: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

/* The format's element sizes (huggingface/safetensors, Dtype). */
static uint64_t esize(const char *d)
{
    static const struct {
        const char *name;
        uint64_t size;
    } t[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
             {"I16", 2}, {"I8", 1}, {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},
             {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"C64", 8}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(d, t[i].name))
            return t[i].size;
    return 0;
}

typedef struct part {
    const char *name;
    const uint8_t *p;
    size_t n;
} part;

static const part *part_of(const part *parts, int np, const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    for (int i = 0; i < np; i++)
        if (!strcmp(parts[i].name, base))
            return &parts[i];
    die("a tensor of a file that was not written", path);
    return NULL;
}

/* The bytes tensor `ti` must have: its header entry's data_offsets in `f`. */
static void check_bytes(const part *f, const llmem_tensor_info *ti)
{
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | f->p[i];
    cJSON *root = cJSON_ParseWithLength((const char *)f->p + 8, (size_t)hlen);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, ti->name);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsArray(o) || cJSON_GetArraySize(o) != 2)
        die("a tensor whose header entry has no data_offsets", ti->name);
    double b = cJSON_GetArrayItem(o, 0)->valuedouble, en = cJSON_GetArrayItem(o, 1)->valuedouble;
    if (en - b != (double)ti->n_bytes || 8 + hlen + (uint64_t)en > f->n)
        die("a tensor's byte count is not its data_offsets' span", ti->name);
    if (ti->n_bytes && memcmp(ti->data, f->p + 8 + hlen + (uint64_t)b, ti->n_bytes))
        die("a tensor's bytes are not the ones its data_offsets name", ti->name);
    cJSON_Delete(root);
}

static int cmp_span(const void *a, const void *b)
{
    const llmem_tensor_info *x = a, *y = b;
    int f = strcmp(x->file, y->file);
    if (f)
        return f;
    return x->data < y->data ? -1 : x->data > y->data;
}

static void check_table(const llmem_safetensors *st, const part *parts, int np,
                        const uint8_t *index, size_t index_n)
{
    int32_t n = llmem_safetensors_count(st);
    llmem_tensor_info *all = calloc((size_t)n + 1, sizeof *all);
    for (int32_t i = 0; i < n; i++) {
        llmem_tensor_info *t = &all[i], f;
        char err[256] = "";
        if (llmem_safetensors_get(st, i, t) != LLMEM_OK)
            die("get failed for an index below the count", NULL);
        if (i && strcmp(all[i - 1].name, t->name) >= 0)
            die("the table is not sorted by name, or repeats a name", t->name);
        uint64_t el = 1, es = esize(t->st_dtype);
        for (int32_t d = 0; d < t->n_dims; d++)
            el *= (uint64_t)t->shape[d];
        if (!es || t->n_dims < 0 || t->n_dims > LLMEM_SAFETENSORS_MAX_DIMS ||
            (uint64_t)t->n_elements != el || t->n_bytes != el * es)
            die("a tensor's element or byte count does not match its shape and dtype", t->name);
        bool known = !strcmp(t->st_dtype, "F32") || !strcmp(t->st_dtype, "F16") ||
                     !strcmp(t->st_dtype, "BF16");
        if (known != (t->dtype != LLMEM_DTYPE_COUNT))
            die("a dtype mapped wrongly", t->st_dtype);
        llmem_status fs = llmem_safetensors_find(st, t->name, &f, err, sizeof err);
        if (fs != (known ? LLMEM_OK : LLMEM_E_UNSUPPORTED) || f.data != t->data ||
            f.n_bytes != t->n_bytes)
            die("find does not return the tensor get returns", t->name);
        check_bytes(part_of(parts, np, t->file), t);
    }
    qsort(all, (size_t)n, sizeof *all, cmp_span);
    for (int32_t i = 1; i < n; i++)
        if (!strcmp(all[i].file, all[i - 1].file) &&
            (const uint8_t *)all[i - 1].data + all[i - 1].n_bytes > (const uint8_t *)all[i].data)
            die("two tensors of one file overlap", all[i].name);
    free(all);
    if (!index)
        return;
    cJSON *root = cJSON_ParseWithLength((const char *)index, index_n);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    for (const cJSON *e = wm ? wm->child : NULL; e; e = e->next) {
        llmem_tensor_info t;
        char err[256];
        llmem_status fs = llmem_safetensors_find(st, e->string, &t, err, sizeof err);
        const char *slash = t.file ? strrchr(t.file, '/') : NULL;
        if ((fs != LLMEM_OK && fs != LLMEM_E_UNSUPPORTED) || !slash ||
            !cJSON_IsString(e) || strcmp(slash + 1, e->valuestring))
            die("the index names a tensor that is not in the file it names", e->string);
    }
    cJSON_Delete(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1 << 20))
        return 0;
    int mode = data[0] % 3;
    const uint8_t *p = data + 1, *index = NULL;
    size_t n = size - 1, index_n = 0;
    part parts[3];
    int np;
    if (mode == 2) {
        const uint8_t *z = memchr(p, 0, n);
        index = p;
        index_n = z ? (size_t)(z - p) : n;
        p += z ? index_n + 1 : n;
        n -= z ? index_n + 1 : n;
    }
    if (mode == 0) {
        parts[0] = (part){"m.safetensors", p, n};
        np = 1;
    } else {
        size_t la = n >= 2 ? (size_t)(p[0] | p[1] << 8) : 0;
        const uint8_t *q = p + (n >= 2 ? 2 : n);
        size_t rest = n >= 2 ? n - 2 : 0;
        if (la > rest)
            la = rest;
        parts[0] = (part){"a.safetensors", q, la};
        parts[1] = (part){"b.safetensors", q + la, rest - la};
        np = 2;
    }
    if (index) /* a part too, in case the index names itself */
        parts[np++] = (part){"model.safetensors.index.json", index, index_n};
    for (int i = 0; i < np; i++)
        fzf_write(parts[i].name, parts[i].p, parts[i].n);
    char path[640], err[512] = "";
    if (mode == 0)
        fzf_path(path, sizeof path, "m.safetensors");
    else
        snprintf(path, sizeof path, "%s", fzf_dir());
    llmem_safetensors *st = (llmem_safetensors *)&path; /* must be overwritten */
    llmem_status s = llmem_safetensors_open(path, &st, err, sizeof err);
    if (s != LLMEM_OK) {
        if (s > 0 || st || !err[0])
            die("a failed open without a negative status, with an object or without a message",
                err);
    } else {
        check_table(st, parts, np, index, index_n);
        llmem_safetensors_close(st);
    }
    for (int i = 0; i < np; i++)
        fzf_remove(parts[i].name);
    return 0;
}
