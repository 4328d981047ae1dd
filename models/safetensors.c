/* llmem models/: safetensors loader.
 *
 * Format (huggingface/safetensors, README "Format"): an 8-byte
 * little-endian unsigned header length N, N bytes of JSON (an object
 * mapping tensor names to {"dtype", "shape", "data_offsets": [begin, end]},
 * plus an optional "__metadata__" object of strings, padded with spaces),
 * then the data section; offsets are relative to the data section.
 *
 * Every file is mapped read-only and checked in full before any tensor is
 * handed out: nothing here reads outside the mapping, and every size is
 * computed with overflow checks.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "llmem/model.h"
#include "models/hf_internal.h"

#define ST_MAX_HEADER ((uint64_t)100 * 1024 * 1024) /* the format's own limit */
#define ST_INDEX_NAME "model.safetensors.index.json"

typedef struct st_file {
    char *path;
    const unsigned char *map;
    size_t size;     /* bytes in the file (and the mapping) */
    size_t data_off; /* 8 + header length */
} st_file;

typedef struct st_tensor {
    char *name;
    char st_dtype[16];
    llmem_dtype dtype; /* LLMEM_DTYPE_COUNT: known to the format, not to llmem */
    int32_t file;
    int32_t n_dims;
    int64_t shape[LLMEM_SAFETENSORS_MAX_DIMS];
    int64_t n_elements;
    uint64_t begin, end; /* relative to the file's data section */
} st_tensor;

struct llmem_safetensors {
    char *path;
    st_file *files;
    int32_t n_files;
    st_tensor *t;
    int32_t n, cap;
};

/* Element sizes of the dtypes the format defines with whole-byte elements. */
static const struct {
    const char *name;
    uint32_t size;
    llmem_dtype dtype;
} dtypes[] = {
    {"F32", 4, LLMEM_DTYPE_F32},     {"F16", 2, LLMEM_DTYPE_F16},
    {"BF16", 2, LLMEM_DTYPE_BF16},   {"F64", 8, LLMEM_DTYPE_COUNT},
    {"I64", 8, LLMEM_DTYPE_COUNT},   {"I32", 4, LLMEM_DTYPE_COUNT},
    {"I16", 2, LLMEM_DTYPE_COUNT},   {"I8", 1, LLMEM_DTYPE_COUNT},
    {"U64", 8, LLMEM_DTYPE_COUNT},   {"U32", 4, LLMEM_DTYPE_COUNT},
    {"U16", 2, LLMEM_DTYPE_COUNT},   {"U8", 1, LLMEM_DTYPE_COUNT},
    {"BOOL", 1, LLMEM_DTYPE_COUNT},  {"F8_E4M3", 1, LLMEM_DTYPE_COUNT},
    {"F8_E5M2", 1, LLMEM_DTYPE_COUNT}, {"F8_E8M0", 1, LLMEM_DTYPE_COUNT},
    {"C64", 8, LLMEM_DTYPE_COUNT},
};

static char *join_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/')
        p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* "[2, 3, 4]" into buf. */
static void fmt_shape(char *buf, size_t len, const int64_t *shape, int32_t n_dims)
{
    size_t k = 0;
    buf[0] = '\0';
    k += (size_t)snprintf(buf, len, "[");
    for (int32_t i = 0; i < n_dims && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < len)
        snprintf(buf + k, len - k, "]");
}

/* A JSON number that is a non-negative integer held exactly by a double. */
static bool json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v))
        return false;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > HF_JSON_INT_MAX || (double)(uint64_t)d != d)
        return false;
    *out = (uint64_t)d;
    return true;
}

static llmem_status push_tensor(llmem_safetensors *st, st_tensor **out)
{
    if (st->n == st->cap) {
        int32_t ncap = st->cap ? st->cap * 2 : 64;
        if (ncap < st->cap)
            return LLMEM_E_NO_MEMORY;
        st_tensor *nt = realloc(st->t, (size_t)ncap * sizeof *nt);
        if (!nt)
            return LLMEM_E_NO_MEMORY;
        st->t = nt;
        st->cap = ncap;
    }
    *out = &st->t[st->n++];
    memset(*out, 0, sizeof **out);
    return LLMEM_OK;
}

/* Parses one header entry `e` (named e->string) of file `fi` into a new
 * tensor, checking dtype, shape and offsets against the data size. */
static llmem_status parse_entry(llmem_safetensors *st, int32_t fi, const cJSON *e, char *err,
                                size_t err_len)
{
    const st_file *f = &st->files[fi];
    const char *name = e->string;
    uint64_t data_size = f->size - f->data_off;
    if (!cJSON_IsObject(e)) {
        llmem_errf(err, err_len, "%s: header entry '%s' is not an object", f->path, name);
        return LLMEM_E_CORRUPT;
    }
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd) || !cJSON_IsArray(js) || !cJSON_IsArray(jo)) {
        llmem_errf(err, err_len, "%s: tensor '%s' lacks a string \"dtype\", an array \"shape\" "
                "or an array \"data_offsets\"", f->path, name);
        return LLMEM_E_CORRUPT;
    }
    uint32_t esize = 0;
    llmem_dtype dt = LLMEM_DTYPE_COUNT;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        if (strcmp(jd->valuestring, dtypes[i].name) == 0) {
            esize = dtypes[i].size;
            dt = dtypes[i].dtype;
        }
    }
    if (!esize) {
        llmem_errf(err, err_len, "%s: tensor '%s' has dtype '%.32s', which llmem does not know "
                "(it reads F32, F16 and BF16)", f->path, name, jd->valuestring);
        return LLMEM_E_UNSUPPORTED;
    }
    int n_dims = cJSON_GetArraySize(js);
    if (n_dims > LLMEM_SAFETENSORS_MAX_DIMS) {
        llmem_errf(err, err_len, "%s: tensor '%s' has %d dimensions (at most %d supported)",
                f->path, name, n_dims, LLMEM_SAFETENSORS_MAX_DIMS);
        return LLMEM_E_UNSUPPORTED;
    }
    st_tensor tmp = {0};
    tmp.dtype = dt;
    snprintf(tmp.st_dtype, sizeof tmp.st_dtype, "%s", jd->valuestring);
    tmp.file = fi;
    tmp.n_dims = n_dims;
    uint64_t n_el = 1;
    bool overflow = false;
    for (int i = 0; i < n_dims; i++) {
        uint64_t d;
        if (!json_u64(cJSON_GetArrayItem(js, i), &d)) {
            llmem_errf(err, err_len, "%s: tensor '%s' shape[%d] is not a non-negative integer",
                    f->path, name, i);
            return LLMEM_E_CORRUPT;
        }
        tmp.shape[i] = (int64_t)d;
        if (d && n_el > (uint64_t)INT64_MAX / d)
            overflow = true;
        else
            n_el *= d;
    }
    char sh[160];
    fmt_shape(sh, sizeof sh, tmp.shape, tmp.n_dims);
    if (overflow || n_el > UINT64_MAX / esize) {
        llmem_errf(err, err_len, "%s: tensor '%s' shape %s is too large", f->path, name, sh);
        return LLMEM_E_CORRUPT;
    }
    tmp.n_elements = (int64_t)n_el;
    uint64_t b, en;
    if (cJSON_GetArraySize(jo) != 2 || !json_u64(cJSON_GetArrayItem(jo, 0), &b) ||
        !json_u64(cJSON_GetArrayItem(jo, 1), &en)) {
        llmem_errf(err, err_len, "%s: tensor '%s' data_offsets is not two non-negative integers",
                f->path, name);
        return LLMEM_E_CORRUPT;
    }
    if (b > en) {
        llmem_errf(err, err_len, "%s: tensor '%s' data_offsets [%llu, %llu) end before they begin",
                f->path, name, (unsigned long long)b, (unsigned long long)en);
        return LLMEM_E_CORRUPT;
    }
    if (en > data_size) {
        llmem_errf(err, err_len, "%s: tensor '%s' bytes [%llu, %llu) past end of file (%zu bytes)",
                f->path, name, (unsigned long long)(b + f->data_off),
                (unsigned long long)(en + f->data_off), f->size);
        return LLMEM_E_CORRUPT;
    }
    if (en - b != n_el * esize) {
        llmem_errf(err, err_len, "%s: tensor '%s' of shape %s and dtype %s needs %llu bytes, but "
                "data_offsets [%llu, %llu) hold %llu", f->path, name, sh, tmp.st_dtype,
                (unsigned long long)(n_el * esize), (unsigned long long)b,
                (unsigned long long)en, (unsigned long long)(en - b));
        return LLMEM_E_CORRUPT;
    }
    tmp.begin = b;
    tmp.end = en;
    st_tensor *t;
    if (push_tensor(st, &t) != LLMEM_OK)
        return LLMEM_E_NO_MEMORY;
    *t = tmp;
    t->name = strdup(name);
    if (!t->name) {
        st->n--;
        return LLMEM_E_NO_MEMORY;
    }
    return LLMEM_OK;
}

static int cmp_begin(const void *a, const void *b)
{
    const st_tensor *x = *(st_tensor *const *)a, *y = *(st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* A malloc'd array of pointers to tensors [first, first + n), sorted by cmp;
 * NULL when out of memory. */
static st_tensor **sorted_view(llmem_safetensors *st, int32_t first, int32_t n,
                               int (*cmp)(const void *, const void *))
{
    st_tensor **v = malloc((size_t)n * sizeof *v);
    if (!v)
        return NULL;
    for (int32_t i = 0; i < n; i++)
        v[i] = &st->t[first + i];
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v;
}

/* Tensors [first, st->n) all belong to one file: none may overlap. */
static llmem_status check_overlap(llmem_safetensors *st, int32_t first, char *err, size_t err_len)
{
    int32_t n = st->n - first;
    if (n < 2)
        return LLMEM_OK;
    st_tensor **v = sorted_view(st, first, n, cmp_begin);
    if (!v)
        return LLMEM_E_NO_MEMORY;
    llmem_status s = LLMEM_OK;
    const st_tensor *prev = v[0];
    for (int32_t i = 1; i < n; i++) {
        if (v[i]->begin < prev->end) {
            const st_file *f = &st->files[v[i]->file];
            llmem_errf(err, err_len, "%s: tensor '%s' bytes [%llu, %llu) overlap tensor '%s' "
                    "bytes [%llu, %llu)", f->path, v[i]->name,
                    (unsigned long long)(v[i]->begin + f->data_off),
                    (unsigned long long)(v[i]->end + f->data_off), prev->name,
                    (unsigned long long)(prev->begin + f->data_off),
                    (unsigned long long)(prev->end + f->data_off));
            s = LLMEM_E_CORRUPT;
            break;
        }
        if (v[i]->end > prev->end)
            prev = v[i];
    }
    free(v);
    return s;
}

static llmem_status map_file(st_file *f, char *err, size_t err_len)
{
    int fd = open(f->path, O_RDONLY);
    if (fd < 0) {
        int e = errno;
        llmem_errf(err, err_len, "%s: cannot open: %s", f->path, strerror(e));
        return e == ENOENT || e == ENOTDIR ? LLMEM_E_NOT_FOUND : LLMEM_E_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        llmem_errf(err, err_len, "%s: not a regular file", f->path);
        close(fd);
        return LLMEM_E_IO;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        llmem_errf(err, err_len, "%s: file too large to map", f->path);
        close(fd);
        return LLMEM_E_IO;
    }
    f->size = (size_t)sb.st_size;
    if (f->size < 8) {
        llmem_errf(err, err_len, "%s: file is %zu bytes, too short for the 8-byte header length",
                f->path, f->size);
        close(fd);
        return LLMEM_E_CORRUPT;
    }
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        llmem_errf(err, err_len, "%s: mmap failed: %s", f->path, strerror(e));
        return LLMEM_E_IO;
    }
    f->map = m;
    return LLMEM_OK;
}

/* Maps file `fi` and appends its tensors. */
static llmem_status load_file(llmem_safetensors *st, int32_t fi, char *err, size_t err_len)
{
    st_file *f = &st->files[fi];
    llmem_status s = map_file(f, err, err_len);
    if (s != LLMEM_OK)
        return s;
    if (memcmp(f->map, "GGUF", 4) == 0) { /* ggml's format (magic "GGUF", then its version) */
        llmem_errf(err, err_len,
                   "%s: a GGUF file, not safetensors: llmem loads Hugging Face checkpoints "
                   "(config.json + *.safetensors)", f->path);
        return LLMEM_E_CORRUPT;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | f->map[i];
    if (hlen > f->size - 8) {
        llmem_errf(err, err_len, "%s: header length %llu past end of file (%zu bytes)", f->path,
                (unsigned long long)hlen, f->size);
        return LLMEM_E_CORRUPT;
    }
    if (hlen > ST_MAX_HEADER) {
        llmem_errf(err, err_len, "%s: header length %llu exceeds the format's 100 MB limit",
                f->path, (unsigned long long)hlen);
        return LLMEM_E_CORRUPT;
    }
    f->data_off = 8 + (size_t)hlen;
    const char *h = (const char *)f->map + 8;
    cJSON *root = NULL;
    hf_json_where w;
    hf_json_fault jf = hf_json_read(h, (size_t)hlen, &root, &w);
    if (jf != HF_JSON_OK) { /* a name cut at a \u0000 could pass for another tensor's */
        char why[128];
        llmem_errf(err, err_len, "%s: header: %s", f->path, hf_json_describe(jf, &w, why, sizeof why));
        return jf == HF_JSON_NO_MEMORY ? LLMEM_E_NO_MEMORY : LLMEM_E_CORRUPT;
    }
    s = LLMEM_OK;
    if (!cJSON_IsObject(root)) {
        llmem_errf(err, err_len, "%s: header is JSON but not an object", f->path);
        s = LLMEM_E_CORRUPT;
        goto out;
    }
    int32_t first = st->n;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            bool ok = cJSON_IsObject(e);
            for (const cJSON *m = ok ? e->child : NULL; m; m = m->next)
                ok = ok && cJSON_IsString(m);
            if (!ok) {
                llmem_errf(err, err_len, "%s: \"__metadata__\" is not an object of strings",
                        f->path);
                s = LLMEM_E_CORRUPT;
                goto out;
            }
            continue;
        }
        s = parse_entry(st, fi, e, err, err_len);
        if (s != LLMEM_OK)
            goto out;
    }
    s = check_overlap(st, first, err, err_len); /* names given twice: hf_json_read */
out:
    cJSON_Delete(root);
    return s;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static llmem_status add_file(llmem_safetensors *st, char *path)
{
    st_file *nf = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *nf);
    if (!nf) {
        free(path);
        return LLMEM_E_NO_MEMORY;
    }
    st->files = nf;
    memset(&nf[st->n_files], 0, sizeof *nf);
    nf[st->n_files++].path = path;
    return LLMEM_OK;
}

static bool has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Directory with an index: the files its weight_map names, in name order. */
static llmem_status list_from_index(llmem_safetensors *st, const char *dir, cJSON **map_out,
                                    char *err, size_t err_len)
{
    char *ipath = join_path(dir, ST_INDEX_NAME), *text = NULL;
    char **names = NULL;
    size_t len = 0, n = 0;
    cJSON *root = NULL;
    if (!ipath)
        return LLMEM_E_NO_MEMORY;
    llmem_status s =
        hf_read_file(ipath, ST_MAX_HEADER, "safetensors index", &text, &len, err, err_len);
    if (s != LLMEM_OK)
        goto out;
    hf_json_where w;
    hf_json_fault jf = hf_json_read(text, len, &root, &w);
    cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (jf != HF_JSON_OK) {
        char why[128];
        llmem_errf(err, err_len, "%s: %s", ipath, hf_json_describe(jf, &w, why, sizeof why));
        s = jf == HF_JSON_NO_MEMORY ? LLMEM_E_NO_MEMORY : LLMEM_E_CORRUPT;
        goto out;
    }
    if (!cJSON_IsObject(wm)) {
        llmem_errf(err, err_len, "%s: not JSON with a \"weight_map\" object", ipath);
        s = LLMEM_E_CORRUPT;
        goto out;
    }
    size_t cnt = (size_t)cJSON_GetArraySize(wm);
    names = calloc(cnt ? cnt : 1, sizeof *names);
    if (!names) {
        s = LLMEM_E_NO_MEMORY;
        goto out;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strchr(e->valuestring, '/') ||
            strcmp(e->valuestring, "..") == 0) {
            llmem_errf(err, err_len, "%s: weight_map entry '%s' is not a file name in the "
                    "directory", ipath, e->string);
            s = LLMEM_E_CORRUPT;
            goto out;
        }
        names[n++] = e->valuestring;
    }
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && s == LLMEM_OK; i++) {
        if (i && strcmp(names[i], names[i - 1]) == 0)
            continue;
        char *p = join_path(dir, names[i]);
        s = p ? add_file(st, p) : LLMEM_E_NO_MEMORY;
    }
out:
    free(names);
    free(text);
    free(ipath);
    if (s == LLMEM_OK)
        *map_out = root;
    else
        cJSON_Delete(root);
    return s;
}

/* Directory without an index: every *.safetensors file, in name order. */
static llmem_status list_dir(llmem_safetensors *st, const char *dir, char *err, size_t err_len)
{
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno; /* ENOMEM: opendir's buffer */
        llmem_errf(err, err_len, "%s: cannot read directory: %s", dir, strerror(e));
        return e == ENOMEM ? LLMEM_E_NO_MEMORY : LLMEM_E_IO;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    llmem_status s = LLMEM_OK;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (de->d_name[0] == '.' || !has_suffix(de->d_name, ".safetensors"))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                s = LLMEM_E_NO_MEMORY;
                break;
            }
            names = nn;
        }
        names[n] = strdup(de->d_name);
        if (!names[n]) {
            s = LLMEM_E_NO_MEMORY;
            break;
        }
        n++;
    }
    closedir(d);
    if (s == LLMEM_OK && n == 0) {
        llmem_errf(err, err_len, "%s: no *.safetensors file in the directory", dir);
        s = LLMEM_E_NOT_FOUND;
    }
    if (s == LLMEM_OK)
        qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        if (s == LLMEM_OK) {
            char *p = join_path(dir, names[i]);
            s = p ? add_file(st, p) : LLMEM_E_NO_MEMORY;
        }
        free(names[i]);
    }
    free(names);
    return s;
}

static const st_tensor *lookup(const llmem_safetensors *st, const char *name)
{
    st_tensor key;
    key.name = (char *)name;
    return st->n ? bsearch(&key, st->t, (size_t)st->n, sizeof key, cmp_name) : NULL;
}

llmem_status llmem_safetensors_open(const char *path, llmem_safetensors **out, char *err,
                                    size_t err_len)
{
    if (!path || !out) {
        llmem_errf(err, err_len, "llmem_safetensors_open: NULL argument");
        return LLMEM_E_INVALID;
    }
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        llmem_errf(err, err_len, "%s: %s", path, strerror(e));
        return e == ENOENT || e == ENOTDIR ? LLMEM_E_NOT_FOUND : LLMEM_E_IO;
    }
    llmem_safetensors *st = calloc(1, sizeof *st);
    cJSON *index = NULL;
    llmem_status s = LLMEM_E_NO_MEMORY;
    if (!st || !(st->path = strdup(path)))
        goto fail;
    if (S_ISDIR(sb.st_mode)) {
        char *ipath = join_path(path, ST_INDEX_NAME);
        if (!ipath)
            goto fail;
        struct stat ib;
        bool has_index = stat(ipath, &ib) == 0;
        free(ipath);
        s = has_index ? list_from_index(st, path, &index, err, err_len)
                      : list_dir(st, path, err, err_len);
    } else {
        char *p = strdup(path);
        s = p ? add_file(st, p) : LLMEM_E_NO_MEMORY;
    }
    if (s != LLMEM_OK)
        goto fail;
    for (int32_t i = 0; i < st->n_files; i++) {
        s = load_file(st, i, err, err_len);
        if (s != LLMEM_OK)
            goto fail;
    }
    if (st->n > 1)
        qsort(st->t, (size_t)st->n, sizeof *st->t, cmp_name);
    for (int32_t i = 1; i < st->n; i++) {
        if (strcmp(st->t[i].name, st->t[i - 1].name) == 0) {
            const char *fa = st->files[st->t[i - 1].file].path;
            const char *fb = st->files[st->t[i].file].path;
            if (strcmp(fa, fb) == 0)
                llmem_errf(err, err_len, "%s: tensor '%s' appears twice", fa, st->t[i].name);
            else
                llmem_errf(err, err_len, "%s: tensor '%s' appears in both %s and %s", path,
                        st->t[i].name, fa, fb);
            s = LLMEM_E_CORRUPT;
            goto fail;
        }
    }
    if (index) {
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
        for (const cJSON *e = wm->child; e; e = e->next) {
            const st_tensor *t = lookup(st, e->string);
            const char *tf = t ? st->files[t->file].path : NULL;
            if (!t || !has_suffix(tf, e->valuestring) ||
                tf[strlen(tf) - strlen(e->valuestring) - 1] != '/') {
                llmem_errf(err, err_len, "%s: %s names tensor '%s' in %s, which does not hold it",
                        path, ST_INDEX_NAME, e->string, e->valuestring);
                s = LLMEM_E_CORRUPT;
                goto fail;
            }
        }
        cJSON_Delete(index);
    }
    *out = st;
    return LLMEM_OK;
fail:
    cJSON_Delete(index);
    if (s == LLMEM_E_NO_MEMORY)
        llmem_errf(err, err_len, "%s: out of memory", path);
    llmem_safetensors_close(st);
    return s;
}

void llmem_safetensors_close(llmem_safetensors *st)
{
    if (!st)
        return;
    for (int32_t i = 0; i < st->n; i++)
        free(st->t[i].name);
    for (int32_t i = 0; i < st->n_files; i++) {
        if (st->files[i].map)
            munmap((void *)st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->files);
    free(st->t);
    free(st->path);
    free(st);
}

int32_t llmem_safetensors_count(const llmem_safetensors *st)
{
    return st ? st->n : 0;
}

static void fill_info(const llmem_safetensors *st, const st_tensor *t, llmem_tensor_info *out)
{
    const st_file *f = &st->files[t->file];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->file = f->path;
    out->st_dtype = t->st_dtype;
    out->dtype = t->dtype;
    out->n_dims = t->n_dims;
    for (int32_t i = 0; i < t->n_dims; i++)
        out->shape[i] = t->shape[i];
    out->n_elements = t->n_elements;
    out->data = f->map + f->data_off + t->begin;
    out->n_bytes = (size_t)(t->end - t->begin);
}

llmem_status llmem_safetensors_get(const llmem_safetensors *st, int32_t i, llmem_tensor_info *out)
{
    if (!st || !out || i < 0 || i >= st->n)
        return LLMEM_E_INVALID;
    fill_info(st, &st->t[i], out);
    return LLMEM_OK;
}

llmem_status llmem_safetensors_find(const llmem_safetensors *st, const char *name,
                                    llmem_tensor_info *out, char *err, size_t err_len)
{
    if (!st || !name || !out) {
        llmem_errf(err, err_len, "llmem_safetensors_find: NULL argument");
        return LLMEM_E_INVALID;
    }
    const st_tensor *t = lookup(st, name);
    if (!t) {
        llmem_errf(err, err_len, "no tensor '%s' in %s", name, st->path);
        return LLMEM_E_NOT_FOUND;
    }
    fill_info(st, t, out);
    if (t->dtype == LLMEM_DTYPE_COUNT) {
        llmem_errf(err, err_len, "%s: tensor '%s' has dtype %s; llmem reads F32, F16 and BF16",
                st->files[t->file].path, name, t->st_dtype);
        return LLMEM_E_UNSUPPORTED;
    }
    return LLMEM_OK;
}
