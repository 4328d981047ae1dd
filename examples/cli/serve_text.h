/* llmem serve: text in and out -- prompt encoding, chat rendering and
 * streaming detokenization, for byte-level models (the built-in one: ids
 * are bytes) and for models with a Hugging Face tokenizer.json.
 *
 * Threads: a srv_text is immutable once opened and may be used by any
 * number of threads at once; a srv_detok is used by one thread at a time. */
#ifndef LLMEM_CLI_SERVE_TEXT_H
#define LLMEM_CLI_SERVE_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

typedef struct srv_text srv_text;
typedef struct srv_detok srv_detok;

/* One chat message, as parsed from a request (strings owned by the caller). */
typedef struct srv_msg {
    const char *role, *content;
} srv_msg;

/* Opens the text side of the model in `model_dir` with `n_vocab` ids: its
 * tokenizer.json (and tokenizer_config.json) when the folder has one, else
 * byte-level ids when n_vocab is 256. A chat template in
 * tokenizer_config.json that llmem's Jinja subset cannot parse is not an
 * error here: chat requests then fail with its message (srv_text_chat).
 * Returns LLMEM_OK; LLMEM_E_UNSUPPORTED (no tokenizer and not a byte
 * model); LLMEM_E_INVALID (the tokenizer has more ids than the model); the
 * tokenizer loader's errors; LLMEM_E_NO_MEMORY. err gets one
 * line. */
llmem_status srv_text_open(const char *model_dir, int32_t n_vocab, srv_text **out, char *err,
                           size_t err_len);
void srv_text_close(srv_text *t); /* accepts NULL */

/* "tokenizer.json" or "bytes": what encodes the text. */
const char *srv_text_kind(const srv_text *t);

/* Encodes a completion prompt (`len` bytes of UTF-8) into a malloc'd array
 * *ids of *n ids, adding BOS as the tokenizer says. Returns LLMEM_OK;
 * LLMEM_E_NO_MEMORY; the tokenizer's errors (message in err). */
llmem_status srv_text_encode(const srv_text *t, const char *text, size_t len, bool add_special,
                             int32_t **ids, int32_t *n, char *err, size_t err_len);

/* Renders a conversation with the model's chat template (generation prompt
 * added) and encodes it without adding special tokens again, as
 * transformers' apply_chat_template(tokenize=True) does. A model without a
 * template (the built-in one) gets llmem's default template, documented in
 * docs/serve.md: "ROLE:\ncontent\n\n" per message, role upper-cased, then
 * "ASSISTANT:\n". Returns LLMEM_OK; LLMEM_E_UNSUPPORTED or
 * LLMEM_E_INVALID (the template cannot render this conversation, or
 * raise_exception; message in err); LLMEM_E_NO_MEMORY. */
llmem_status srv_text_chat(const srv_text *t, const srv_msg *msgs, size_t n_msgs, int32_t **ids,
                           int32_t *n, char *err, size_t err_len);

/* True when id ends generation (EOS / end-of-turn special tokens). Byte
 * models have none. */
bool srv_text_is_eog(const srv_text *t, int32_t id);

/* A streaming detokenizer: push ids, get only complete UTF-8 back (bytes of
 * a character split across tokens are held until it is complete; bytes
 * that cannot form one become U+FFFD). Returns LLMEM_OK or
 * LLMEM_E_NO_MEMORY. */
llmem_status srv_detok_create(const srv_text *t, srv_detok **out);
void srv_detok_destroy(srv_detok *d); /* accepts NULL */
/* Appends the text completed by `id` to the growable buffer (*buf, *len,
 * *cap; realloc'd as needed). flush emits what is held (an incomplete
 * character as U+FFFD). Returns LLMEM_OK, LLMEM_E_INVALID (id out of
 * range) or LLMEM_E_NO_MEMORY. */
llmem_status srv_detok_push(srv_detok *d, int32_t id, char **buf, size_t *len, size_t *cap);
llmem_status srv_detok_flush(srv_detok *d, char **buf, size_t *len, size_t *cap);

/* Length of the longest prefix of s[0..n) made of complete, valid UTF-8
 * characters (what may be sent without splitting a character). */
size_t srv_utf8_valid_prefix(const char *s, size_t n);

/* Grows a malloc'd buffer *buf of *cap bytes (0: none yet, then `first`
 * bytes) by doubling until it holds need bytes. false when realloc fails:
 * *buf and *cap are then as they were. */
bool srv_buf_reserve(char **buf, size_t *cap, size_t need, size_t first);

#endif
