/* llmem models/: the one reader of the small files of a checkpoint folder
 * (config.json, model.safetensors.index.json, tokenizer.json,
 * tokenizer_config.json, chat_template.jinja), so that each fault gets one
 * status and one message wherever it happens (hf_internal.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/hf_internal.h"

llmem_status hf_read_file(const char *path, size_t max, const char *what, char **out,
                          size_t *len, char *err, size_t err_len)
{
    *out = NULL;
    if (len)
        *len = 0;
    if (!max || max > SIZE_MAX / 2)
        max = SIZE_MAX / 2;
    llmem_status s = LLMEM_OK;
    char *buf = NULL;
    size_t n = 0, cap;
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR) {
            llmem_errf(err, err_len, "%s: no such file", path);
            return LLMEM_E_NOT_FOUND;
        }
        llmem_errf(err, err_len, "%s: cannot open: %s", path, strerror(e));
        return e == ENOMEM ? LLMEM_E_NO_MEMORY : LLMEM_E_IO;
    }
    if (fstat(fd, &sb) != 0) {
        llmem_errf(err, err_len, "%s: cannot stat: %s", path, strerror(errno));
        s = LLMEM_E_IO;
        goto fail;
    }
    if (S_ISDIR(sb.st_mode)) {
        llmem_errf(err, err_len, "%s: is a folder, not a file", path);
        s = LLMEM_E_IO;
        goto fail;
    }
    /* a regular file's size is a hint only (it may change while read); one
     * byte more than it finds the end in the same pass */
    cap = S_ISREG(sb.st_mode) && sb.st_size > 0
              ? (size_t)((uint64_t)sb.st_size < max ? (uint64_t)sb.st_size : max) + 1
              : 4096;
    for (;;) {
        if (!buf || n == cap) {
            if (n > max)
                break; /* max + 1 bytes read: too large */
            size_t ncap = !buf ? cap : cap > max / 2 ? max + 1 : cap * 2;
            char *nb = realloc(buf, ncap + 1); /* + 1: the NUL */
            if (!nb) {
                llmem_errf(err, err_len, "%s: out of memory", path);
                s = LLMEM_E_NO_MEMORY;
                goto fail;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            llmem_errf(err, err_len, "%s: read error: %s", path, strerror(errno));
            s = LLMEM_E_IO;
            goto fail;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (n > max) {
        llmem_errf(err, err_len, "%s: larger than %zu MiB%s%s", path, max >> 20,
                   what ? "; not a " : "", what ? what : "");
        s = LLMEM_E_CORRUPT;
        goto fail;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    if (len)
        *len = n;
    return LLMEM_OK;
fail:
    close(fd);
    free(buf);
    return s;
}
