/* llmem serve: the continuous-batching engine (see engine.h). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "examples/cli/engine.h"
#include "examples/cli/prefix_probe.h"

typedef struct cand {
    float logit;
    int32_t id;
    double w; /* exp((logit - max) / temperature) */
} cand;

struct engine {
    llmem_model *m;
    llmem_memory *mem;
    const srv_text *text;
    int32_t n_seq, n_ubatch, max_queue, V;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stopping, joined;

    /* under lock: requests waiting for admission (a ring) and the counters */
    eng_req **wait;
    int32_t wait_cap, wait_head, wait_n;
    eng_stats st;

    /* engine thread only */
    eng_req **running; /* [n_seq] in admission order */
    int32_t n_running;
    int32_t *free_seq, n_free;
    eng_req **row_req; /* [n_seq] request of each output row */
    float *logits;     /* [n_seq][V] */
    int32_t *ids, *ctr; /* [n_seq] each: device sampling's tokens and counters */
    float *lp;         /* [n_seq]: their log-probabilities (finite unless the logits are not) */
    cand *cbuf;        /* [V] */
    llmem_batch_buf *bb;
    llmem_batch_buf *probe; /* [n_ctx] a new request's tokens, to ask the prefix cache */
};

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s)
{
    return (double)(splitmix64(s) >> 11) / 9007199254740992.0;
}

/* ---- requests ------------------------------------------------------------------------------ */

eng_req *eng_req_create(int32_t *prompt, int32_t n_prompt, int32_t max_tokens,
                        const eng_sampling *sp)
{
    eng_req *r = calloc(1, sizeof *r);
    pthread_condattr_t ca;
    if (!r)
        return NULL;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_cond_init(&r->cond, &ca)) {
        pthread_condattr_destroy(&ca);
        free(r);
        return NULL;
    }
    pthread_condattr_destroy(&ca);
    r->prompt = prompt;
    r->n_prompt = n_prompt;
    r->max_tokens = max_tokens;
    r->sp = *sp;
    r->rng = sp->seed;
    r->seq = -1;
    r->refs = 1;
    return r;
}

bool eng_req_add_stop(eng_req *r, const char *s)
{
    char **ns = realloc(r->stop, (size_t)(r->n_stop + 1) * sizeof *ns);
    if (!ns)
        return false;
    r->stop = ns;
    size_t n = strlen(s);
    if (!(ns[r->n_stop] = malloc(n + 1)))
        return false;
    memcpy(ns[r->n_stop++], s, n + 1);
    return true;
}

static void req_free(eng_req *r)
{
    for (int32_t i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->prompt);
    free(r->gen);
    free(r->out);
    free(r->text);
    srv_detok_destroy(r->detok);
    pthread_cond_destroy(&r->cond);
    free(r);
}

/* Drops one reference; call with the lock held. */
static void unref_locked(eng_req *r)
{
    if (--r->refs == 0)
        req_free(r);
}

void eng_req_release(engine *e, eng_req *r)
{
    if (!r)
        return;
    if (!e) { /* never submitted: nobody else holds it */
        unref_locked(r);
        return;
    }
    pthread_mutex_lock(&e->lock);
    unref_locked(r);
    pthread_mutex_unlock(&e->lock);
}

/* Appends out[out_pub, upto) to the published text and, when finish is set,
 * finishes the request (the engine drops its reference when it lets the
 * request go: unref_locked). Lock held. */
static void publish_locked(engine *e, eng_req *r, size_t upto, eng_finish finish, const char *msg)
{
    if (upto > r->out_pub) {
        size_t n = upto - r->out_pub, need = r->text_len + n + 1;
        if (need > r->text_cap) {
            size_t c = r->text_cap ? r->text_cap : 256;
            while (c < need)
                c *= 2;
            char *nt = realloc(r->text, c);
            if (!nt) {
                finish = ENG_ERROR;
                msg = "out of memory";
                n = 0;
            } else {
                r->text = nt;
                r->text_cap = c;
            }
        }
        memcpy(r->text + r->text_len, r->out + r->out_pub, n);
        r->text_len += n;
        r->out_pub += n;
    }
    r->n_completion = r->n_gen;
    if (finish != ENG_RUNNING && r->finish == ENG_RUNNING) {
        r->finish = finish;
        if (msg)
            snprintf(r->err, sizeof r->err, "%s", msg);
        e->st.finished++;
        e->st.cancelled += finish == ENG_CANCELLED;
        e->st.errors += finish == ENG_ERROR;
        e->st.completion_tokens += r->n_gen;
    }
    pthread_cond_broadcast(&r->cond);
}

/* ---- the queue (lock held) ----------------------------------------------------------------- */

static void wait_push_front(engine *e, eng_req *r)
{
    e->wait_head = (e->wait_head + e->wait_cap - 1) % e->wait_cap;
    e->wait[e->wait_head] = r;
    e->wait_n++;
}

static eng_req *wait_pop_front(engine *e)
{
    eng_req *r = e->wait[e->wait_head];
    e->wait_head = (e->wait_head + 1) % e->wait_cap;
    e->wait_n--;
    return r;
}

/* Finishes every waiting request that was cancelled (or all of them when
 * the engine stops), keeping the order of the others. */
static void drop_waiting(engine *e, bool all)
{
    int32_t n = e->wait_n;
    for (int32_t k = 0; k < n; k++) {
        eng_req *r = wait_pop_front(e);
        if (all || r->cancel) {
            publish_locked(e, r, r->out_pub, all ? ENG_ERROR : ENG_CANCELLED,
                           all ? "the server is shutting down" : NULL);
            unref_locked(r);
        } else {
            e->wait[(e->wait_head + e->wait_n++) % e->wait_cap] = r;
        }
    }
}

/* ---- the step (engine thread) -------------------------------------------------------------- */

static int32_t req_token(const eng_req *r, int32_t p)
{
    return p < r->n_prompt ? r->prompt[p] : r->gen[p - r->n_prompt];
}

static int32_t left_of(const eng_req *r)
{
    return r->n_prompt + r->n_gen - r->n_fed;
}

/* Removes running[i]'s sequence and takes it off the running list. */
static void retire(engine *e, int32_t i)
{
    eng_req *r = e->running[i];
    llmem_status st = llmem_memory_seq_rm(e->mem, r->seq, -1, -1);
    if (st != LLMEM_OK) /* removing a whole sequence does not fail; say so if it does */
        fprintf(stderr, "llmem serve: seq_rm(%d): %s\n", r->seq, llmem_status_str(st));
    e->free_seq[e->n_free++] = r->seq;
    r->seq = -1;
    r->n_fed = 0;
    e->n_running--;
    memmove(e->running + i, e->running + i + 1, (size_t)(e->n_running - i) * sizeof *e->running);
}

static int32_t probe_token(const void *ctx, int32_t p)
{
    return req_token(ctx, p);
}

static void add_chunk(engine *e, eng_req *r, int32_t k, int32_t *rows)
{
    int32_t len = r->n_prompt + r->n_gen;
    for (int32_t t = 0; t < k; t++) {
        int32_t p = r->n_fed + t;
        llmem_batch_buf_add(e->bb, req_token(r, p), p, &r->seq, 1, p == len - 1);
    }
    if (r->n_fed + k == len)
        e->row_req[(*rows)++] = r;
    r->chunk = k;
}

/* One token per decoding request, then prefill chunks (admission order, then
 * newly admitted requests) within n_ubatch tokens. */
static int32_t build(engine *e, bool admit, int32_t *admitted)
{
    int32_t budget = e->n_ubatch, rows = 0;
    llmem_batch_buf_clear(e->bb);
    for (int32_t i = 0; i < e->n_running; i++)
        e->running[i]->chunk = 0;
    for (int32_t i = 0; i < e->n_running; i++)
        if (left_of(e->running[i]) == 1) {
            add_chunk(e, e->running[i], 1, &rows);
            budget--;
        }
    for (int32_t i = 0; i < e->n_running && budget > 0; i++) {
        int32_t left = left_of(e->running[i]);
        if (left > 1) {
            int32_t k = left < budget ? left : budget;
            add_chunk(e, e->running[i], k, &rows);
            budget -= k;
        }
    }
    pthread_mutex_lock(&e->lock);
    while (admit && budget > 0 && e->n_free > 0 && e->wait_n > 0) {
        eng_req *r = wait_pop_front(e);
        if (r->cancel) {
            publish_locked(e, r, r->out_pub, ENG_CANCELLED, NULL);
            unref_locked(r);
            continue;
        }
        r->seq = e->free_seq[--e->n_free];
        r->n_fed = 0;
        e->running[e->n_running++] = r;
        (*admitted)++;
        /* the first chunk covers the cached prefix plus the budget (prefix_probe.h) */
        int32_t cost, k = prefix_first_chunk(e->mem, e->probe, e->n_ubatch, r->seq, left_of(r),
                                             budget, probe_token, r, &cost);
        add_chunk(e, r, k, &rows);
        budget -= cost;
    }
    pthread_mutex_unlock(&e->lock);
    return rows;
}

static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Samples one id from a row of logits (engine.h, eng_sampling); -1 when the
 * row holds a NaN or an infinity. */
static int32_t sample(engine *e, eng_req *r, const float *row)
{
    int32_t V = e->V, best = 0;
    for (int32_t i = 0; i < V; i++) {
        if (!isfinite(row[i]))
            return -1;
        if (row[i] > row[best])
            best = i;
    }
    const eng_sampling *sp = &r->sp;
    if (sp->temperature <= 0)
        return best;
    int32_t n = 0;
    for (int32_t i = 0; i < V; i++) {
        double w = exp((double)(row[i] - row[best]) / sp->temperature);
        if (w >= sp->min_p) /* the largest has w = 1 */
            e->cbuf[n++] = (cand){row[i], i, w};
    }
    if ((sp->top_k > 0 && sp->top_k < n) || sp->top_p < 1)
        qsort(e->cbuf, (size_t)n, sizeof *e->cbuf, cmp_cand);
    if (sp->top_k > 0 && sp->top_k < n)
        n = sp->top_k;
    double total = 0;
    for (int32_t i = 0; i < n; i++)
        total += e->cbuf[i].w;
    if (sp->top_p < 1) {
        double acc = 0;
        for (int32_t i = 0; i < n; i++) {
            acc += e->cbuf[i].w;
            if (acc >= sp->top_p * total) {
                n = i + 1;
                total = acc;
                break;
            }
        }
    }
    double u = rng_uniform(&r->rng) * total;
    for (int32_t i = 0; i < n; i++) {
        u -= e->cbuf[i].w;
        if (u < 0)
            return e->cbuf[i].id;
    }
    return e->cbuf[n - 1].id;
}

/* Naive search of needle (m bytes) in hay (n bytes). */
static size_t find(const char *hay, size_t n, const char *needle, size_t m)
{
    for (size_t i = 0; m <= n && i <= n - m; i++)
        if (!memcmp(hay + i, needle, m))
            return i;
    return SIZE_MAX;
}

/* Applies the stop strings to r->out after its text grew from old_len:
 * truncates at the first stop string and returns true, or sets *keep to the
 * length that may be published (the rest may start a stop string). */
static bool stop_check(eng_req *r, size_t old_len, size_t *keep)
{
    size_t first = SIZE_MAX, hold = 0;
    for (int32_t s = 0; s < r->n_stop; s++) {
        size_t m = strlen(r->stop[s]), from = old_len >= m ? old_len - m + 1 : 0;
        size_t at = find(r->out + from, r->out_len - from, r->stop[s], m);
        if (at != SIZE_MAX && from + at < first)
            first = from + at;
        for (size_t k = m - 1 < r->out_len ? m - 1 : r->out_len; k > hold; k--)
            if (!memcmp(r->out + r->out_len - k, r->stop[s], k)) {
                hold = k;
                break;
            }
    }
    if (first != SIZE_MAX) {
        r->out_len = first > r->out_pub ? first : r->out_pub;
        return true;
    }
    *keep = r->out_len - hold > r->out_pub ? r->out_len - hold : r->out_pub;
    return false;
}

/* Takes sampled id t for r: text, stop strings, max_tokens, publishing. */
static void accept_token(engine *e, eng_req *r, int32_t t)
{
    eng_finish fin = ENG_RUNNING;
    const char *msg = NULL;
    size_t old = r->out_len, keep = r->out_len;
    r->gen[r->n_gen++] = t;
    bool eog = srv_text_is_eog(e->text, t);
    llmem_status st = LLMEM_OK;
    if (!eog)
        st = srv_detok_push(r->detok, t, &r->out, &r->out_len, &r->out_cap);
    if (st == LLMEM_OK && (eog || r->n_gen == r->max_tokens))
        st = srv_detok_flush(r->detok, &r->out, &r->out_len, &r->out_cap);
    if (st != LLMEM_OK) {
        fin = ENG_ERROR;
        msg = st == LLMEM_E_NO_MEMORY ? "out of memory" : "the model produced an id outside "
                                                          "the tokenizer's vocabulary";
    } else if (stop_check(r, old, &keep) || eog) {
        fin = ENG_STOP;
    } else if (r->n_gen == r->max_tokens) {
        fin = ENG_LENGTH;
    }
    if (fin != ENG_RUNNING)
        keep = r->out_len;
    pthread_mutex_lock(&e->lock);
    publish_locked(e, r, keep, fin, msg);
    pthread_mutex_unlock(&e->lock);
}

/* Retires every running request whose finish is set or whose client left;
 * all of them when `all` (with msg). */
static void sweep_running(engine *e, bool all, const char *msg)
{
    for (int32_t i = e->n_running - 1; i >= 0; i--) {
        eng_req *r = e->running[i];
        pthread_mutex_lock(&e->lock);
        bool done = r->finish != ENG_RUNNING, gone = all || r->cancel;
        if (!done && gone)
            publish_locked(e, r, r->out_pub, all ? ENG_ERROR : ENG_CANCELLED, msg);
        pthread_mutex_unlock(&e->lock);
        if (!done && !gone)
            continue;
        retire(e, i);
        pthread_mutex_lock(&e->lock);
        unref_locked(r);
        pthread_mutex_unlock(&e->lock);
    }
}

/* Whether every output row of this step can be sampled on the device with one
 * set of parameters (then *p gets them and e->ctr each row's counter: the
 * request's seed hashed, plus its generated-token count, so that a request's
 * draws do not depend on its batch). */
static bool device_params(engine *e, int32_t rows, llmem_sample_params *p)
{
    for (int32_t o = 0; o < rows; o++) {
        const eng_sampling *a = &e->row_req[o]->sp, *b = &e->row_req[0]->sp;
        bool greedy = a->temperature <= 0 && b->temperature <= 0;
        if (a->temperature > 0 && !(a->top_p > 0))
            return false; /* top_p 0: the host's sort keeps the top token */
        if (!greedy && (a->temperature != b->temperature || a->top_k != b->top_k ||
                        a->top_p != b->top_p || a->min_p != b->min_p))
            return false;
        uint64_t seed = e->row_req[o]->sp.seed;
        uint32_t h = llmem_sample_mix32((uint32_t)seed ^ llmem_sample_mix32((uint32_t)(seed >> 32)));
        e->ctr[o] = (int32_t)(h + (uint32_t)e->row_req[o]->n_gen);
    }
    const eng_sampling *b = &e->row_req[0]->sp;
    *p = (llmem_sample_params){.temperature = (float)b->temperature, .top_k = b->top_k,
                               .top_p = b->top_p < 1 ? (float)b->top_p : 1.0f,
                               .min_p = (float)b->min_p, .seed = 0};
    return true;
}

static void step(engine *e)
{
    int32_t admitted = 0, rows, n_out = 0;
    bool admit = true, dev = false;
    char err[512] = "";
    llmem_status st;
    for (;;) {
        rows = build(e, admit, &admitted);
        if (e->n_running == 0)
            return;
        llmem_model_sampling smp = {.ctr = e->ctr, .ids = e->ids, .logprob = e->lp};
        dev = rows > 0 && device_params(e, rows, &smp.params);
        if (dev)
            st = llmem_model_decode_sample(e->m, llmem_batch_buf_get(e->bb), &smp, e->n_seq,
                                           &n_out, err, sizeof err);
        else
            st = llmem_model_decode(e->m, llmem_batch_buf_get(e->bb), false, e->logits, e->n_seq,
                                    &n_out, err, sizeof err);
        if (st != LLMEM_E_NO_SPACE || e->n_running == 1)
            break;
        pthread_mutex_lock(&e->lock);
        if (admitted > 0) {
            admitted--;
            e->st.deferrals++;
        } else {
            e->st.preemptions++;
        }
        eng_req *r = e->running[e->n_running - 1];
        pthread_mutex_unlock(&e->lock);
        admit = false;
        r->n_fed = 0;
        retire(e, e->n_running - 1);
        pthread_mutex_lock(&e->lock);
        wait_push_front(e, r);
        pthread_mutex_unlock(&e->lock);
    }
    if (st != LLMEM_OK || n_out != rows) {
        char msg[600];
        if (st == LLMEM_OK)
            snprintf(msg, sizeof msg, "%d output rows, expected %d", n_out, rows);
        else
            snprintf(msg, sizeof msg, "%s%s (%s)", st == LLMEM_E_NO_SPACE ?
                     "the request does not fit the KV cache alone: " : "", err,
                     llmem_status_str(st));
        fprintf(stderr, "llmem serve: decode: %s\n", msg);
        sweep_running(e, true, msg);
        return;
    }
    pthread_mutex_lock(&e->lock);
    e->st.steps++;
    pthread_mutex_unlock(&e->lock);
    for (int32_t i = 0; i < e->n_running; i++)
        e->running[i]->n_fed += e->running[i]->chunk;
    for (int32_t o = 0; o < rows; o++) {
        eng_req *r = e->row_req[o];
        int32_t t = !dev ? sample(e, r, e->logits + (size_t)o * (size_t)e->V)
                    : isfinite(e->lp[o]) ? e->ids[o] : -1;
        if (t < 0) {
            pthread_mutex_lock(&e->lock);
            publish_locked(e, r, r->out_pub, ENG_ERROR, "the model produced non-finite logits");
            pthread_mutex_unlock(&e->lock);
            continue;
        }
        accept_token(e, r, t);
    }
    sweep_running(e, false, NULL);
}

static void refresh_stats(engine *e)
{
    llmem_memory_stats ms;
    llmem_model_stats mst;
    llmem_memory_get_stats(e->mem, &ms);
    llmem_model_get_stats(e->m, &mst);
    pthread_mutex_lock(&e->lock);
    e->st.running = e->n_running;
    e->st.waiting = e->wait_n;
    e->st.seqs_live = ms.n_seqs_live;
    e->st.pages_used = ms.pages_used;
    e->st.pages_total = ms.pages_total;
    e->st.prefix_hit_tokens = ms.prefix_hit_tokens;
    e->st.tokens_computed = mst.n_tokens;
    e->st.prefix_cache_bytes = ms.prefix_cache_bytes;
    e->st.cached_kv_bytes = ms.cached_kv_bytes;
    e->st.snapshots = ms.snapshots;
    e->st.snapshot_bytes = ms.snapshot_bytes;
    e->st.prefix_evictions = ms.prefix_evictions;
    e->st.snapshot_evictions = ms.snapshot_evictions;
    pthread_mutex_unlock(&e->lock);
}

static void *engine_main(void *arg)
{
    engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->lock);
        bool stop = e->stopping;
        drop_waiting(e, stop);
        pthread_mutex_unlock(&e->lock);
        sweep_running(e, stop, "the server is shutting down");
        refresh_stats(e);
        if (stop)
            break;
        pthread_mutex_lock(&e->lock);
        if (e->n_running == 0 && e->wait_n == 0 && !e->stopping) {
            pthread_cond_wait(&e->wake, &e->lock);
            pthread_mutex_unlock(&e->lock);
            continue;
        }
        pthread_mutex_unlock(&e->lock);
        step(e);
    }
    return NULL;
}

/* Frees what eng_create allocated besides the thread, lock and condition variable. */
static void free_engine(engine *e)
{
    llmem_batch_buf_destroy(e->bb);
    llmem_batch_buf_destroy(e->probe);
    free(e->cbuf);
    free(e->logits);
    free(e->ids);
    free(e->lp);
    free(e->free_seq);
    free(e->row_req);
    free(e->running);
    free(e->wait);
    free(e);
}

/* ---- the public side ----------------------------------------------------------------------- */

llmem_status eng_create(llmem_model *m, const srv_text *text, int32_t n_seq, int32_t n_ubatch,
                        int32_t n_ctx, int32_t max_queue, engine **out)
{
    engine *e = calloc(1, sizeof *e);
    *out = NULL;
    if (!e)
        return LLMEM_E_NO_MEMORY;
    e->m = m;
    e->mem = llmem_model_memory(m);
    e->text = text;
    e->n_seq = n_seq;
    e->n_ubatch = n_ubatch;
    e->max_queue = max_queue;
    e->V = llmem_model_n_vocab(m);
    /* a step holds one token per decoding request, n_ubatch computed tokens,
     * and each new request's cached prefix (at most n_ctx tokens each) */
    int64_t cap = (int64_t)n_seq + n_ubatch + (int64_t)n_seq * n_ctx;
    if (cap > INT32_MAX || n_ctx < 1) {
        free(e);
        return LLMEM_E_NO_MEMORY;
    }
    e->wait_cap = max_queue + n_seq + 1; /* preempted requests come back on top of the bound */
    e->wait = calloc((size_t)e->wait_cap, sizeof *e->wait);
    e->running = calloc((size_t)n_seq, sizeof *e->running);
    e->row_req = calloc((size_t)n_seq, sizeof *e->row_req);
    e->free_seq = calloc((size_t)n_seq, sizeof *e->free_seq);
    e->logits = malloc((size_t)n_seq * (size_t)e->V * sizeof *e->logits);
    e->cbuf = malloc((size_t)e->V * sizeof *e->cbuf);
    e->ids = malloc((size_t)n_seq * 2 * sizeof *e->ids);
    e->ctr = e->ids ? e->ids + n_seq : NULL;
    e->lp = malloc((size_t)n_seq * sizeof *e->lp);
    if (!e->wait || !e->running || !e->row_req || !e->free_seq || !e->logits || !e->cbuf ||
        !e->ids || !e->lp ||
        llmem_batch_buf_create((int32_t)cap, 1, &e->bb) != LLMEM_OK ||
        llmem_batch_buf_create(n_ctx, 1, &e->probe) != LLMEM_OK)
        goto fail_alloc;
    for (int32_t q = 0; q < n_seq; q++)
        e->free_seq[q] = n_seq - 1 - q;
    e->n_free = n_seq;
    if (pthread_mutex_init(&e->lock, NULL))
        goto fail_alloc;
    if (pthread_cond_init(&e->wake, NULL))
        goto fail_mutex;
    if (pthread_create(&e->thread, NULL, engine_main, e))
        goto fail_cond;
    *out = e;
    return LLMEM_OK;
fail_cond:
    pthread_cond_destroy(&e->wake);
fail_mutex:
    pthread_mutex_destroy(&e->lock);
    free_engine(e);
    return LLMEM_E_BACKEND;
fail_alloc:
    free_engine(e);
    return LLMEM_E_NO_MEMORY;
}

void eng_stop(engine *e)
{
    pthread_mutex_lock(&e->lock);
    bool joined = e->joined;
    e->stopping = true;
    e->joined = true;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
    if (!joined)
        pthread_join(e->thread, NULL);
}

void eng_destroy(engine *e)
{
    if (!e)
        return;
    eng_stop(e);
    pthread_cond_destroy(&e->wake);
    pthread_mutex_destroy(&e->lock);
    free_engine(e);
}

llmem_status eng_submit(engine *e, eng_req *r)
{
    if (r->max_tokens > 0 &&
        (!(r->gen = malloc((size_t)r->max_tokens * sizeof *r->gen)) ||
         srv_detok_create(e->text, &r->detok) != LLMEM_OK))
        return LLMEM_E_NO_MEMORY;
    llmem_status st = LLMEM_OK;
    pthread_mutex_lock(&e->lock);
    if (e->stopping) {
        st = LLMEM_E_INVALID;
    } else if (e->wait_n >= e->max_queue) {
        e->st.rejected++;
        st = LLMEM_E_NO_SPACE;
    } else {
        e->st.requests++;
        e->st.prompt_tokens += r->n_prompt;
        if (r->max_tokens == 0) {
            publish_locked(e, r, 0, ENG_LENGTH, NULL);
        } else {
            r->refs++; /* the engine's, dropped when it lets the request go */
            e->wait[(e->wait_head + e->wait_n++) % e->wait_cap] = r;
            e->st.waiting = e->wait_n;
            pthread_cond_signal(&e->wake);
        }
    }
    pthread_mutex_unlock(&e->lock);
    return st;
}

void eng_cancel(engine *e, eng_req *r)
{
    pthread_mutex_lock(&e->lock);
    if (r->finish == ENG_RUNNING) {
        r->cancel = true;
        pthread_cond_signal(&e->wake);
    }
    pthread_mutex_unlock(&e->lock);
}

eng_finish eng_poll(engine *e, eng_req *r, size_t have, int timeout_ms, char **delta,
                    size_t *n_delta, int32_t *n_completion, char *err, size_t err_len)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    *delta = NULL;
    *n_delta = 0;
    pthread_mutex_lock(&e->lock);
    while (r->text_len <= have && r->finish == ENG_RUNNING &&
           pthread_cond_timedwait(&r->cond, &e->lock, &until) == 0)
        ;
    if (r->text_len > have && (*delta = malloc(r->text_len - have + 1))) {
        *n_delta = r->text_len - have;
        memcpy(*delta, r->text + have, *n_delta);
        (*delta)[*n_delta] = '\0';
    }
    eng_finish f = *delta || r->text_len <= have ? r->finish : ENG_ERROR;
    if (n_completion)
        *n_completion = r->n_completion;
    if (err && err_len)
        snprintf(err, err_len, "%s", f == ENG_ERROR && !r->err[0] ? "out of memory" : r->err);
    pthread_mutex_unlock(&e->lock);
    return f;
}

void eng_get_stats(engine *e, eng_stats *out)
{
    pthread_mutex_lock(&e->lock);
    *out = e->st;
    out->waiting = e->wait_n;
    pthread_mutex_unlock(&e->lock);
}
