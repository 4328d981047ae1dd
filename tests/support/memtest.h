/* Helpers for the memory unit tests: backend, batches, running plans. */
#ifndef LLMEM_TEST_MEMTEST_H
#define LLMEM_TEST_MEMTEST_H

#include <check.h>
#include "llmem/llmem.h"

/* Opens the cpu backend (fails the test otherwise). */
llmem_backend *mt_cpu(void);
/* Parameters of a KV cache with 1 layer, 1 head of head_dim 2, f32 (8
 * bytes of K and 8 of V per token), poisoned, with the given page size (in
 * tokens), pages and sequences; every other field at its default. */
llmem_kv_cache_params mt_kv_params(int32_t page_size, int32_t n_pages, int32_t n_seq_max);
/* llmem_kv_cache_create of p, which must succeed (a Check failure with the
 * library's message otherwise). */
llmem_memory *mt_kv_create(llmem_backend *be, const llmem_kv_cache_params *p);
/* KV cache with 1 layer, 1 head, head_dim 2, f32. */
llmem_memory *mt_kv(llmem_backend *be, int32_t page_size, int32_t n_pages, int32_t n_seq_max,
                    bool prefix, bool poison);
/* The same with a sliding window of `window` keys and `slack` tokens of
 * rollback room (llmem_kv_cache_params.window, .window_slack), poisoned. */
llmem_memory *mt_kv_window(llmem_backend *be, int32_t page_size, int32_t n_pages,
                           int32_t n_seq_max, int32_t window, int32_t slack, bool prefix);
/* Pages a sequence of len tokens must hold in a cache with that window
 * (brute force over the mask, independent of memory/swa.c): for every
 * query index qi = len - r it may append next (r in [0, slack]: after a
 * rollback of r tokens), the pages of the keys it sees (transformers:
 * kv_idx > q_idx - window), and the page it writes its own key into when
 * that page already holds earlier tokens. */
int32_t mt_window_pages_needed(int32_t len, int32_t ps, int32_t window, int32_t slack);
/* Pages seq holds now (its page table's entries >= 0; at most 512). */
int32_t mt_held_pages(llmem_memory *m, int32_t seq);
/* A batch buffer of 1024 tokens, 4 sequence ids each. */
llmem_batch_buf *mt_batch_new(void);
/* A batch buffer of n_tokens tokens with up to n_seq_id sequence ids each
 * (fails the test if it cannot be made). */
llmem_batch_buf *mt_batch(int32_t n_tokens, int32_t n_seq_id);
/* Destroys m and b and closes be, the end of most memory tests. */
void mt_free(llmem_memory *m, llmem_batch_buf *b, llmem_backend *be);
/* Parameters of a recurrent memory with 1 layer of one f32 state of 4
 * elements (16 bytes a slot), n_seq_max sequences and n_ckpt checkpoints;
 * every other field 0 (the caller may set them). The state descriptions
 * it points at are static. */
llmem_recurrent_params mt_rs_params(int32_t n_seq_max, int32_t n_ckpt);
/* llmem_recurrent_create of p, which must succeed (a Check failure with
 * the library's message otherwise). */
llmem_memory *mt_rs_create(llmem_backend *be, const llmem_recurrent_params *p);
/* Recurrent memory of mt_rs_params(n_seq_max, n_ckpt). */
llmem_memory *mt_rs(llmem_backend *be, int32_t n_seq_max, int32_t n_ckpt);
/* The hybrid of a recurrent layer then an attention layer: layer 0 is
 * child rs, layer 1 child kv (children {kv, rs}, map {1, 0}); it must be
 * created and owns both. */
llmem_memory *mt_hybrid_rs_kv(llmem_memory *kv, llmem_memory *rs);
/* The source state of stream s of a recurrent view whose state 0 holds 4
 * floats a slot (mt_rs): with fresh (the sequence holds no tokens) its
 * src_slot must be -1 and f stays as it was; otherwise src_slot >= 0 and
 * the slot's 4 floats are read into f. */
void mt_rs_src_state(const llmem_rs_view *r, int32_t s, bool fresh, float f[4]);
/* Appends n tokens (ids tok0, tok0+1, ...) to seq at positions from pos0. */
void mt_add(llmem_batch_buf *b, int32_t seq, int32_t pos0, int32_t n, int32_t tok0, bool out_last);
/* Plans, applies and commits every ubatch; `on_ubatch` (may be NULL) runs
 * after apply. Returns the plan status (the plan is released). */
typedef void (*mt_ubatch_fn)(llmem_memory *mem, const llmem_ubatch *ub, void *ctx);
llmem_status mt_run(llmem_memory *mem, const llmem_batch *b, int32_t n_ubatch, mt_ubatch_fn fn,
                    void *ctx, llmem_plan_info *info);
/* Snapshot of what a memory holds, for "unchanged" checks. */
typedef struct mt_snap {
    int32_t n_seq;
    int32_t len[16], pmin[16], pmax[16], tok[16][256];
    llmem_memory_stats stats;
} mt_snap;
void mt_snapshot(llmem_memory *mem, mt_snap *s);
void mt_assert_same(const mt_snap *a, const mt_snap *b);
void mt_assert_check(llmem_memory *mem);
/* Asserts that seq's token ids (llmem_memory_seq_tokens, at most 128) are
 * ref[0, n). */
void mt_expect_tokens(llmem_memory *m, int32_t seq, const int32_t *ref, int32_t n);
/* The decode read-back walk of the token-stage tests (test_kv_sharing,
 * test_recurrent): sequences 0-2 take 5-token prompts (ids 100 (s + 1) + i),
 * then decode 40 steps (id 7000 + 1000 s + 13 step), with the invariant
 * checker after each step. At steps 3, 8, 13, 14, 15, ... sequence 0 is
 * read by each reader in turn first (seq_tokens; a state write read into
 * sequence 2; seq_cp into 1), and every sequence's ids are checked against
 * what was submitted. On return ref[s][0, n[s]) are the ids each sequence
 * holds; b is a batch buffer of >= 15 tokens and 1 sequence id. */
void mt_decode_read_back(llmem_memory *m, llmem_batch_buf *b, int32_t ref[3][128], int32_t n[3]);
/* Sequence 1 (holding n1 tokens) decodes one more token (id 5000, still
 * staged), the memory is cleared, then sequence 1 takes a new 2-token
 * prompt (ids 60, 61): its ids must be just those, and the invariant
 * checker passes after the clear and after the prompt. */
void mt_clear_staged_then_prompt(llmem_memory *m, llmem_batch_buf *b, int32_t n1);
/* Decodes `steps` tokens onto sequence 0, one a batch (ids tok0, tok0 + 1,
 * ...; positions from *n on), each batch run through mt_run; appends the
 * ids to ref and advances *n. */
void mt_decode_steps(llmem_memory *m, llmem_batch_buf *b, int32_t *ref, int32_t *n, int32_t tok0,
                     int32_t steps);
/* Removes sequence 0's last token, decodes 3 more (ids tok0, tok0 + 1,
 * tok0 + 2), removes the last again, and checks its ids against ref[0, *n)
 * (ref and *n follow the changes). */
void mt_rm_last_and_on(llmem_memory *m, llmem_batch_buf *b, int32_t *ref, int32_t *n, int32_t tok0);

#endif
