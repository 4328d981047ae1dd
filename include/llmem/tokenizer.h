/* llmem: Hugging Face tokenizers -- text to token ids and back.
 *
 * Loads a `tokenizer.json` (the serialization of the Hugging Face
 * `tokenizers` library) and the `tokenizer_config.json` beside it, and
 * encodes and decodes the way `tokenizers` does for the kinds of tokenizer
 * the model families llmem runs use:
 *
 *   - byte-level BPE (GPT-2 byte-to-unicode map) with the GPT-2, Llama-3
 *     and Qwen2 pre-tokenizer regexes (Split / ByteLevel pre-tokenizers);
 *   - NFC / NFKC / NFD / NFKD normalization, Prepend and Replace
 *     normalizers, alone or in a Sequence;
 *   - the Split (every behavior, invert honoured), Digits, Punctuation,
 *     Whitespace and WhitespaceSplit pre-tokenizers (Falcon- and
 *     BERT-style word splits);
 *   - Metaspace / SentencePiece-style BPE ("▁" for spaces, Prepend/Replace
 *     normalizers) with byte fallback (<0xXX> tokens);
 *   - added tokens, special or not, which are split out of the text before
 *     normalization and pre-tokenization (single_word / lstrip / rstrip /
 *     normalized flags honoured as `tokenizers` does);
 *   - BOS/EOS from the TemplateProcessing post-processor or, failing that,
 *     add_bos_token / add_eos_token of tokenizer_config.json.
 *
 * Token ids are int32 indices into the vocabulary. Text is UTF-8 bytes;
 * input that is not valid UTF-8 is accepted: each maximal ill-formed
 * subsequence becomes U+FFFD before encoding (Unicode 15 section 3.9, the
 * replacement Python's `bytes.decode("utf-8", "replace")` makes), so
 * results equal those of `tokenizers` on the same decoded string.
 *
 * Regexes run on PCRE2 (UTF + UCP), normalization on utf8proc, JSON on
 * cJSON; the BPE merge loop is llmem's (a rank lookup by hash and a
 * linked-list min-heap merge, O(n log n) per pre-token).
 *
 * Verified against `tokenizers` 0.23.3 on 15,400 committed strings
 * (tests/test_tokenizer.c) and on fresh random strings in CI
 * (tests/tokenizer/live.py).
 *
 * Threads: a loaded tokenizer is immutable; any number of threads may
 * encode and decode with it at once. A detokenizer is used by one thread at
 * a time.
 *
 * Reference: huggingface/tokenizers (tokenizers/src: models/bpe,
 * pre_tokenizers/byte_level.rs, normalizers, decoders, processors,
 * tokenizer/added_vocabulary.rs); Sennrich et al., "Neural Machine
 * Translation of Rare Words with Subword Units", ACL 2016 (BPE);
 * Radford et al. 2019 (GPT-2 byte-level BPE).
 */
#ifndef LLMEM_TOKENIZER_H
#define LLMEM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* A loaded tokenizer. Opaque and immutable once loaded. */
typedef struct llmem_tokenizer llmem_tokenizer;

/* Loads a tokenizer. `path` is a tokenizer.json file or a folder holding
 * one; tokenizer_config.json in the same folder is read when present (for
 * bos_token / eos_token / add_bos_token / add_eos_token / chat_template).
 * On success *out owns everything; free it with llmem_tokenizer_destroy.
 * Returns LLMEM_OK; LLMEM_E_INVALID (path or out NULL); LLMEM_E_NOT_FOUND
 * (no such file, or a folder without tokenizer.json; err names the path);
 * LLMEM_E_IO (tokenizer.json, tokenizer_config.json or chat_template.jinja
 * is a folder, unreadable, or a read failed); LLMEM_E_CORRUPT (not UTF-8,
 * not one JSON object with only
 * whitespace after it, a name given twice in one object (e.g. a vocabulary
 * token listed twice: Hugging Face tokenizers keeps the last, so the file
 * is ambiguous), a string holding \u0000 (llmem's pieces are C strings)
 * or a control character written raw (tokenizers refuses those), a
 * chat_template.jinja holding a NUL byte or bytes that are not UTF-8,
 * a field of the wrong type, a decoder setting tokenizers refuses too
 * (Strip or Metaspace given more than one character, a negative count),
 * or a post-processor id with no token, with the field in err);
 * LLMEM_E_UNSUPPORTED (a model, normalizer, pre-tokenizer, decoder or
 * post-processor type llmem does not implement, named in err, e.g.
 * "tokenizer.json: model type 'Unigram' is not supported"; a Replace with
 * a regex or an empty pattern; or ids far sparser than the tokens listed:
 * the largest must stay below 2 x their count + 1024); LLMEM_E_NO_MEMORY
 * (also when cJSON ran out of memory parsing a file).
 * Nothing is allocated on failure. */
llmem_status llmem_tokenizer_load(const char *path, llmem_tokenizer **out,
                                  char *err, size_t err_len);

/* Frees a tokenizer. Accepts NULL. Detokenizers made from it must be
 * destroyed first. */
void llmem_tokenizer_destroy(llmem_tokenizer *tok);

/* Encodes `len` bytes of `text` (not NUL-terminated necessarily; invalid
 * UTF-8 allowed, see above) into token ids.
 *   add_special:   add BOS/EOS (and whatever else) as the post-processor
 *                  or tokenizer_config.json says (`add_special_tokens=True`
 *                  in `tokenizers`);
 *   parse_special: recognise special added tokens written inside the text
 *                  ("<|eot_id|>") as single tokens; when false they are
 *                  encoded as plain text. Non-special added tokens are
 *                  always recognised, as in `tokenizers`.
 * On success *ids is a malloc'd array of *n_ids int32 ids (the caller
 * frees it; an empty text gives n_ids 0 and may give *ids NULL).
 * A character with no id, no byte-fallback tokens and no unk token is
 * dropped, as `tokenizers` drops it.
 * Returns LLMEM_OK; LLMEM_E_INVALID (tok, ids or n_ids NULL, or text NULL
 * with len > 0); LLMEM_E_NO_MEMORY. Leaves *ids NULL and *n_ids 0 on
 * failure. */
llmem_status llmem_tokenizer_encode(const llmem_tokenizer *tok, const char *text,
                                    size_t len, bool add_special, bool parse_special,
                                    int32_t **ids, int32_t *n_ids,
                                    char *err, size_t err_len);

/* Decodes `n_ids` ids into UTF-8 text the way `tokenizers`' decode does
 * (decoder chain of tokenizer.json: ByteLevel, Metaspace, ByteFallback,
 * Fuse, Strip, Replace). keep_special=false drops special tokens
 * (`skip_special_tokens=True`). Byte sequences that are not valid UTF-8
 * become U+FFFD as `tokenizers` does (byte-level: one per maximal invalid
 * subsequence; byte fallback: one per byte of an invalid run).
 * On success *text is a malloc'd NUL-terminated string of *len bytes (the
 * caller frees it). Returns LLMEM_OK; LLMEM_E_INVALID (NULL arguments, or
 * an id outside [0, n_vocab), named in err); LLMEM_E_NO_MEMORY. */
llmem_status llmem_tokenizer_decode(const llmem_tokenizer *tok, const int32_t *ids,
                                    int32_t n_ids, bool keep_special,
                                    char **text, size_t *len,
                                    char *err, size_t err_len);

/* Number of ids: max(id) + 1 over the model vocabulary and added tokens.
 * (May be below a model's vocab_size, whose extra rows have no text.) */
int32_t llmem_tokenizer_n_vocab(const llmem_tokenizer *tok);

/* BOS / EOS ids, or -1 if the tokenizer has none. BOS is the token the
 * post-processor (or add_bos_token) prepends, else tokenizer_config.json's
 * bos_token; EOS is tokenizer_config.json's eos_token, else the one the
 * post-processor appends. */
int32_t llmem_tokenizer_bos(const llmem_tokenizer *tok);
int32_t llmem_tokenizer_eos(const llmem_tokenizer *tok);

/* The stored string of id (the vocabulary key, e.g. "Ġthe", "▁the",
 * "<0x0A>", "<|eot_id|>"), or NULL when id is out of range or unused.
 * Owned by the tokenizer. */
const char *llmem_tokenizer_piece(const llmem_tokenizer *tok, int32_t id);

/* The id of a vocabulary or added-token string, or -1. */
int32_t llmem_tokenizer_token_id(const llmem_tokenizer *tok, const char *piece);

/* True when id is a special added token ("special": true). */
bool llmem_tokenizer_is_special(const llmem_tokenizer *tok, int32_t id);

/* True when id ends generation: EOS, or a special token named like one
 * ("<|eot_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>",
 * "</s>", "<|end|>", "<|eom_id|>"). */
bool llmem_tokenizer_is_eog(const llmem_tokenizer *tok, int32_t id);

/* The chat_template string of tokenizer_config.json (the one named
 * "default" when it is a list of named templates), or NULL when there is
 * none. Owned by the tokenizer. Render it with llmem_chat_template_*. */
const char *llmem_tokenizer_chat_template(const llmem_tokenizer *tok);

/* tokenizer_config.json's bos_token / eos_token strings (also when given as
 * {"content": ...} objects), or NULL. Owned by the tokenizer. */
const char *llmem_tokenizer_bos_str(const llmem_tokenizer *tok);
const char *llmem_tokenizer_eos_str(const llmem_tokenizer *tok);

/* ---- streaming detokenizer -------------------------------------------- */

/* Turns a stream of ids into text as it comes, emitting only complete
 * UTF-8. The concatenation of all outputs (pushes, then flush) equals
 * llmem_tokenizer_decode of the whole id sequence, for every decoder chain
 * llmem loads: text a later token may still change is held back until it
 * cannot (bytes of a character split across tokens; a run of byte-fallback
 * tokens, which decode turns into U+FFFDs when it ends ill-formed; a tail
 * that may begin a Replace pattern or be stripped by Strip at the end);
 * a ByteLevel or ByteFallback stage after a Fuse or ByteLevel sees the
 * whole text at once, so with such a chain everything waits for flush.
 * Reference: the decoder chain of huggingface/tokenizers (decoders/);
 * tokenizers' own DecodeStream fails where a later token rewrites text. */
typedef struct llmem_detok llmem_detok;

/* Creates a detokenizer over `tok` (which must outlive it). keep_special as
 * in llmem_tokenizer_decode. Returns LLMEM_OK, LLMEM_E_INVALID (NULL
 * arguments) or LLMEM_E_NO_MEMORY. */
llmem_status llmem_detok_create(const llmem_tokenizer *tok, bool keep_special,
                                llmem_detok **out);

/* Feeds one id and writes the text it completes to out[0..*n_out) (no NUL
 * terminator is written). `cap` is the size of out in bytes; text held back
 * (a byte run, see above) may come out at once, so callers grow the buffer
 * on LLMEM_E_NO_SPACE. Returns LLMEM_OK; LLMEM_E_INVALID
 * (NULL arguments or id out of range; nothing changes); LLMEM_E_NO_SPACE
 * (out too small: *n_out is set to the bytes needed, and the detokenizer
 * is unchanged, so the call may be repeated with a bigger buffer);
 * LLMEM_E_NO_MEMORY (nothing changes). */
llmem_status llmem_detok_push(llmem_detok *d, int32_t id, char *out, size_t cap,
                              size_t *n_out);

/* Emits what is held back (an incomplete character becomes U+FFFD) and
 * resets the detokenizer for a new stream. Same statuses as push. */
llmem_status llmem_detok_flush(llmem_detok *d, char *out, size_t cap, size_t *n_out);

/* Frees a detokenizer. Accepts NULL. */
void llmem_detok_destroy(llmem_detok *d);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif
