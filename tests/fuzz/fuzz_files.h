/* Helpers of the libFuzzer harnesses whose code under test reads files
 * (safetensors, tokenizer.json): a private scratch folder, made once, and
 * whole-file writes into it. A failure to write is the machine's fault, not
 * the input's: it prints why and aborts. */
#ifndef LLMEM_FUZZ_FILES_H
#define LLMEM_FUZZ_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

static inline void fzf_die(const char *what, const char *path)
{
    fprintf(stderr, "fuzz: %s %s\n", what, path);
    abort();
}

static char fzf_dir_path[512];

/* Removes the scratch folder and the files in it (atexit). */
static inline void fzf_cleanup(void)
{
    DIR *d = opendir(fzf_dir_path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[1024];
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", fzf_dir_path, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(fzf_dir_path);
}

/* A folder of its own under $TMPDIR (else /tmp), removed at exit. */
static inline const char *fzf_dir(void)
{
    if (!fzf_dir_path[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(fzf_dir_path, sizeof fzf_dir_path, "%s/llmem-fuzz-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(fzf_dir_path))
            fzf_die("cannot make the scratch folder", fzf_dir_path);
        atexit(fzf_cleanup);
    }
    return fzf_dir_path;
}

static inline void fzf_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", fzf_dir(), name);
}

/* Writes n bytes as file `name` of the scratch folder. */
static inline void fzf_write(const char *name, const void *data, size_t n)
{
    char path[640];
    fzf_path(path, sizeof path, name);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0)
        fzf_die("cannot write", path);
}

static inline void fzf_remove(const char *name)
{
    char path[640];
    fzf_path(path, sizeof path, name);
    unlink(path);
}

/* Splits data[0, n) at its first `k` NUL bytes into at most k + 1 parts;
 * returns the number of parts. The last part keeps any further NULs. */
static inline int fzf_split(const uint8_t *data, size_t n, int k, const uint8_t **part, size_t *len)
{
    int np = 0;
    size_t start = 0;
    for (size_t i = 0; i < n && np < k; i++) {
        if (data[i] == 0) {
            part[np] = data + start;
            len[np++] = i - start;
            start = i + 1;
        }
    }
    part[np] = data + start;
    len[np++] = n - start;
    return np;
}

#endif
