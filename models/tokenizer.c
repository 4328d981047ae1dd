/* llmem: Hugging Face tokenizers (stub; the implementation lands next). */
#include <stdio.h>
#include <stdlib.h>

#include "llmem/tokenizer.h"

static void set_err(char *err, size_t err_len, const char *msg)
{
    if (err && err_len)
        snprintf(err, err_len, "%s", msg);
}

llmem_status llmem_tokenizer_load(const char *path, llmem_tokenizer **out,
                                  char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    if (!path || !out)
        return LLMEM_E_INVALID;
    set_err(err, err_len, "tokenizer: not implemented yet");
    return LLMEM_E_UNSUPPORTED;
}

void llmem_tokenizer_destroy(llmem_tokenizer *tok) { (void)tok; }

llmem_status llmem_tokenizer_encode(const llmem_tokenizer *tok, const char *text,
                                    size_t len, bool add_special, bool parse_special,
                                    int32_t **ids, int32_t *n_ids, char *err, size_t err_len)
{
    if (ids)
        *ids = NULL;
    if (n_ids)
        *n_ids = 0;
    return LLMEM_E_INVALID;
}

llmem_status llmem_tokenizer_decode(const llmem_tokenizer *tok, const int32_t *ids,
                                    int32_t n_ids, bool keep_special, char **text,
                                    size_t *len, char *err, size_t err_len)
{
    return LLMEM_E_INVALID;
}

int32_t llmem_tokenizer_n_vocab(const llmem_tokenizer *tok) { return 0; }
int32_t llmem_tokenizer_bos(const llmem_tokenizer *tok) { return -1; }
int32_t llmem_tokenizer_eos(const llmem_tokenizer *tok) { return -1; }
const char *llmem_tokenizer_piece(const llmem_tokenizer *tok, int32_t id) { return NULL; }
int32_t llmem_tokenizer_token_id(const llmem_tokenizer *tok, const char *piece) { return -1; }
bool llmem_tokenizer_is_special(const llmem_tokenizer *tok, int32_t id) { return false; }
bool llmem_tokenizer_is_eog(const llmem_tokenizer *tok, int32_t id) { return false; }
const char *llmem_tokenizer_chat_template(const llmem_tokenizer *tok) { return NULL; }
const char *llmem_tokenizer_bos_str(const llmem_tokenizer *tok) { return NULL; }
const char *llmem_tokenizer_eos_str(const llmem_tokenizer *tok) { return NULL; }

llmem_status llmem_detok_create(const llmem_tokenizer *tok, bool keep_special,
                                llmem_detok **out)
{
    if (out)
        *out = NULL;
    return LLMEM_E_INVALID;
}

llmem_status llmem_detok_push(llmem_detok *d, int32_t id, char *out, size_t cap,
                              size_t *n_out)
{
    return LLMEM_E_INVALID;
}

llmem_status llmem_detok_flush(llmem_detok *d, char *out, size_t cap, size_t *n_out)
{
    return LLMEM_E_INVALID;
}

void llmem_detok_destroy(llmem_detok *d) { (void)d; }
