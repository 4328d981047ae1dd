/* llmem serve: the engine -- continuous batching of requests that arrive
 * at any time, on one thread that owns the model.
 *
 * Every step batches one token per decoding request and prefill chunks of
 * newly admitted ones within n_ubatch tokens (continuous batching, Yu et
 * al., "Orca", OSDI 2022; chunked prefill as in Sarathi, Agrawal et al.
 * 2023). Admission is the memory's plan, as in `llmem replay`: a request is
 * admitted when a sequence id is free and the step's plan fits; when a plan
 * fails with LLMEM_E_NO_SPACE the most recently admitted request is put
 * back at the head of the queue (a deferral if it held nothing yet, else a
 * preemption that recomputes it later from its prompt and the tokens it
 * generated; vLLM's recompute preemption, Kwon et al., SOSP 2023). Prompts
 * start at position 0 of a fresh sequence, so the memory's prefix cache
 * reuses pages (and recurrent snapshots) across requests.
 *
 * Threads: eng_* functions may be called from any thread; the model and its
 * memory are touched only by the engine thread. */
#ifndef LLMEM_CLI_ENGINE_H
#define LLMEM_CLI_ENGINE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "examples/cli/serve_text.h"
#include "llmem/runtime.h"

typedef enum eng_finish {
    ENG_RUNNING = 0,
    ENG_LENGTH,    /* max_tokens reached */
    ENG_STOP,      /* end-of-generation token or a stop string */
    ENG_CANCELLED, /* eng_cancel (the client went away) */
    ENG_ERROR,     /* err says why */
} eng_finish;

/* Sampling: temperature 0 is greedy (the first id of the largest logit, as
 * `llmem generate --temp 0`); else softmax(logits / temperature) kept to
 * the top_k largest (0: all), to ids of probability >= min_p * the largest
 * one (min-p sampling, Nguyen et al. 2024), and to the smallest set of mass
 * >= top_p (nucleus sampling, Holtzman et al. 2020), renormalized. */
typedef struct eng_sampling {
    double temperature, top_p, min_p;
    int32_t top_k;
    uint64_t seed;
} eng_sampling;

typedef struct eng_req {
    /* set before eng_submit, read-only afterwards */
    int32_t *prompt, n_prompt; /* owned by the request */
    int32_t max_tokens;
    eng_sampling sp;
    char **stop; /* [n_stop] non-empty strings, owned by the request */
    int32_t n_stop;

    /* engine thread only */
    int32_t *gen, n_gen;        /* [max_tokens] generated ids */
    int32_t n_fed;              /* tokens in its sequence */
    int32_t seq, chunk;         /* sequence id (-1: none); tokens in this step */
    uint64_t rng;
    srv_detok *detok;
    char *out;                  /* generated text (complete UTF-8) */
    size_t out_len, out_cap, out_pub;

    /* shared: under the engine's lock */
    char *text;                 /* published text, text_len bytes */
    size_t text_len, text_cap;
    int32_t n_completion;       /* tokens generated so far */
    eng_finish finish;
    bool cancel;
    char err[256];
    int refs;
    pthread_cond_t cond;        /* signalled on new text and on finish */
} eng_req;

typedef struct eng_stats {
    int32_t running, waiting, seqs_live;
    int64_t pages_used, pages_total, prefix_hit_tokens, tokens_computed;
    int64_t requests, finished, cancelled, rejected, errors, preemptions, deferrals, steps;
    int64_t prompt_tokens, completion_tokens;
    /* the prefix cache on the device (llmem_memory_stats, issue 13) */
    int64_t prefix_cache_bytes, cached_kv_bytes, snapshots, snapshot_bytes;
    int64_t prefix_evictions, snapshot_evictions;
} eng_stats;

typedef struct engine engine;

/* Creates the engine over model m (which must outlive it) and starts its
 * thread. n_seq: sequences in flight (the model's n_seq_max); n_ubatch:
 * tokens computed per step; n_ctx: the longest request (prompt plus
 * completion; a new request's first chunk may also cover its cached prefix,
 * prefix_probe.h); max_queue: requests that may wait for admission.
 * Returns LLMEM_OK, LLMEM_E_NO_MEMORY (also when n_seq * n_ctx is too large
 * for a batch) or LLMEM_E_BACKEND (no thread). */
llmem_status eng_create(llmem_model *m, const srv_text *text, int32_t n_seq, int32_t n_ubatch,
                        int32_t n_ctx, int32_t max_queue, engine **out);
/* Stops the thread: every request still queued or running finishes with
 * ENG_ERROR "the server is shutting down", and later submits fail. The
 * engine stays valid for eng_poll / eng_req_release. Idempotent; one
 * thread at a time. */
void eng_stop(engine *e);
/* eng_stop, then frees the engine; no eng_* call on it may follow (requests
 * still referenced by their owners must be released before). Accepts NULL. */
void eng_destroy(engine *e);

/* A new request with one reference (the caller's), or NULL. Takes
 * ownership of prompt (malloc'd, n_prompt ids). */
eng_req *eng_req_create(int32_t *prompt, int32_t n_prompt, int32_t max_tokens,
                        const eng_sampling *sp);
/* Adds a stop string (copied). false when out of memory. */
bool eng_req_add_stop(eng_req *r, const char *s);
/* Drops the caller's reference. Accepts NULL; e may be NULL for a request
 * that was never submitted. */
void eng_req_release(engine *e, eng_req *r);

/* Queues r. Returns LLMEM_OK; LLMEM_E_NO_SPACE (max_queue requests wait
 * already: answer 429); LLMEM_E_INVALID (shutting down); LLMEM_E_NO_MEMORY.
 * A request with max_tokens 0 finishes at once (ENG_LENGTH). */
llmem_status eng_submit(engine *e, eng_req *r);
/* Asks the engine to drop r; its sequence is removed at the next step. */
void eng_cancel(engine *e, eng_req *r);
/* Waits up to timeout_ms for text beyond `have` bytes or for the finish.
 * Copies the new text [have, text_len) into a malloc'd *delta (NULL when
 * none) of *n_delta bytes and returns the finish state. */
eng_finish eng_poll(engine *e, eng_req *r, size_t have, int timeout_ms, char **delta,
                    size_t *n_delta, int32_t *n_completion, char *err, size_t err_len);
void eng_get_stats(engine *e, eng_stats *out);

#endif
