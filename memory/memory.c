/* llmem memory/: the public memory API over the llmem_memory_i vtable —
 * one-plan-at-a-time rule, argument checks, sequence operations over every
 * sequence, and state-stream framing (docs/state-format.md). */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "memory/internal.h"

#define STATE_MAGIC 0x534d4c4cu /* "LLMS" little-endian */
#define STATE_VERSION 2u /* 2: KV entries carry page sharing (issue 13) */
#define STATE_HEADER 16u  /* magic, version, seq, n_sections */
#define SECTION_HEADER 16u /* u64 size, u64 xxh3 */

llmem_status llmem_memory_iface_check(const llmem_memory_i *i, char *err, size_t err_len)
{
    if (!i || !i->type) {
        llmem_errf(err, err_len, "memory vtable: %s is NULL", i ? "type" : "iface");
        return LLMEM_E_INVALID;
    }
    if (i->struct_size < LLMEM_MEMORY_I_MIN_SIZE) {
        llmem_errf(err, err_len,
                   "%s: struct_size %zu is smaller than the first llmem_memory_i (%zu bytes)",
                   i->type, i->struct_size, (size_t)LLMEM_MEMORY_I_MIN_SIZE);
        return LLMEM_E_ABI;
    }
    if (i->struct_size > sizeof(llmem_memory_i)) {
        llmem_errf(err, err_len,
                   "%s: struct_size %zu is larger than this llmem's llmem_memory_i (%zu bytes): "
                   "built against a newer llmem",
                   i->type, i->struct_size, sizeof(llmem_memory_i));
        return LLMEM_E_ABI;
    }
    const char *missing = !i->destroy       ? "destroy"
                          : !i->reserve     ? "reserve"
                          : !i->apply       ? "apply"
                          : !i->view        ? "view"
                          : !i->commit      ? "commit"
                          : !i->release     ? "release"
                          : !i->seq_rm      ? "seq_rm"
                          : !i->seq_cp      ? "seq_cp"
                          : !i->seq_keep    ? "seq_keep"
                          : !i->seq_pos_min ? "seq_pos_min"
                          : !i->seq_pos_max ? "seq_pos_max"
                          : !i->seq_tokens  ? "seq_tokens"
                          : !i->clear       ? "clear"
                          : !i->get_stats   ? "get_stats"
                          : i->state_read_prepare && (!i->state_read_apply || !i->state_read_abort)
                              ? "state_read_apply or state_read_abort (state_read_prepare is set)"
                              : NULL;
    if (missing) {
        llmem_errf(err, err_len, "%s: required slot %s is NULL", i->type, missing);
        return LLMEM_E_INVALID;
    }
    return LLMEM_OK;
}

llmem_status llmem_memory_init(llmem_memory *mem, const llmem_memory_i *iface, llmem_backend *be,
                               int32_t n_layers, int32_t n_seq_max, llmem_split split,
                               bool can_shift)
{
    if (!mem)
        return LLMEM_E_INVALID;
    memset(mem, 0, sizeof *mem);
    llmem_status st = llmem_memory_iface_check(iface, NULL, 0);
    if (st != LLMEM_OK)
        return st;
    if (n_layers < 1 || n_seq_max < 1 || split < LLMEM_SPLIT_SIMPLE || split > LLMEM_SPLIT_SEQ)
        return LLMEM_E_INVALID;
    mem->iface = iface;
    mem->backend = be;
    mem->n_layers = n_layers;
    mem->n_seq_max = n_seq_max;
    mem->split = split;
    mem->can_shift = can_shift;
    return LLMEM_OK;
}

const char *llmem_split_name(llmem_split s)
{
    switch (s) {
    case LLMEM_SPLIT_AUTO: return "auto";
    case LLMEM_SPLIT_SIMPLE: return "simple";
    case LLMEM_SPLIT_EQUAL: return "equal";
    case LLMEM_SPLIT_SEQ: return "seq";
    }
    return "?";
}

static bool seq_ok(const llmem_memory *mem, int32_t s)
{
    return s >= 0 && s < mem->n_seq_max;
}

llmem_status llmem_memory_plan(llmem_memory *mem, const llmem_batch *batch, llmem_split split,
                               int32_t n_ubatch, llmem_plan **out, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    if (!mem || !batch || !out) {
        llmem_errf(err, err_len, "NULL argument");
        return LLMEM_E_INVALID;
    }
    if (mem->is_child) {
        llmem_errf(err, err_len, "this memory is a child of a composition; plan on the parent");
        return LLMEM_E_INVALID;
    }
    if (mem->plan) {
        llmem_errf(err, err_len, "a plan is already in flight; release it first");
        return LLMEM_E_BUSY;
    }
    if (n_ubatch < 1) {
        llmem_errf(err, err_len, "n_ubatch must be >= 1 (got %d)", n_ubatch);
        return LLMEM_E_INVALID;
    }
    if (split == LLMEM_SPLIT_AUTO)
        split = mem->split;
    if (split < LLMEM_SPLIT_SIMPLE || split > LLMEM_SPLIT_SEQ || split < mem->split) {
        llmem_errf(err, err_len, "split '%s' is weaker than the '%s' split this memory needs",
                   llmem_split_name(split), llmem_split_name(mem->split));
        return LLMEM_E_INVALID;
    }
    llmem_plan *p = NULL;
    llmem_status st = llmem_plan_build_internal(mem, batch, split, n_ubatch, &p, err, err_len);
    if (st != LLMEM_OK)
        return st;
    if (LLMEM_MEMORY_SLOT(mem, reserve_prepare))
        st = LLMEM_MEMORY_SLOT(mem, reserve_prepare)(mem, p, err, err_len);
    if (st == LLMEM_OK)
        st = mem->iface->reserve(mem, p, &p->res, err, err_len);
    if (st != LLMEM_OK) {
        llmem_plan_free_internal(p);
        return st;
    }
    mem->plan = p;
    *out = p;
    return LLMEM_OK;
}

int32_t llmem_plan_n_ubatch(const llmem_plan *plan)
{
    return plan ? plan->n_ubatch : 0;
}

void llmem_plan_get_info(const llmem_plan *plan, llmem_plan_info *info)
{
    if (plan && info)
        *info = plan->info;
}

int32_t llmem_plan_n_cached(const llmem_plan *plan, int32_t seq_id)
{
    if (!plan || seq_id < 0 || seq_id >= plan->n_seq_max)
        return 0;
    const llmem_plan_seq *e = llmem_plan_seq_find(plan, seq_id);
    return e ? e->n_cached : 0;
}

const llmem_ubatch *llmem_plan_ubatch(const llmem_plan *plan, int32_t i)
{
    if (!plan || i < 0 || i >= plan->n_ubatch)
        return NULL;
    return &plan->ubatch[i];
}

llmem_status llmem_memory_apply(llmem_memory *mem, llmem_plan *plan, int32_t i,
                                const llmem_ubatch **ub)
{
    if (!mem || !plan || plan != mem->plan || i < 0 || i >= plan->n_ubatch)
        return LLMEM_E_INVALID;
    if (i != plan->n_committed || plan->n_applied != plan->n_committed)
        return LLMEM_E_STATE;
    llmem_status st = mem->iface->apply(mem, plan, plan->res, i);
    if (st != LLMEM_OK)
        return st;
    plan->n_applied = i + 1;
    if (ub)
        *ub = &plan->ubatch[i];
    return LLMEM_OK;
}

llmem_status llmem_memory_view(llmem_memory *mem, int32_t il, llmem_view *view)
{
    if (!mem || !view || il < 0 || il >= mem->n_layers)
        return LLMEM_E_INVALID;
    memset(view, 0, sizeof *view);
    if (!mem->plan || mem->plan->n_applied == mem->plan->n_committed)
        return LLMEM_E_STATE;
    return mem->iface->view(mem, mem->plan->res, il, view);
}

llmem_status llmem_memory_commit(llmem_memory *mem, llmem_plan *plan, int32_t i)
{
    if (!mem || !plan || plan != mem->plan || i < 0 || i >= plan->n_ubatch)
        return LLMEM_E_INVALID;
    if (plan->n_applied != i + 1 || plan->n_committed != i)
        return LLMEM_E_STATE;
    /* the fallible device work first (all of it, in a composition): a
     * failure there leaves the memory as it was */
    llmem_status st = LLMEM_MEMORY_SLOT(mem, commit_prepare)
                          ? LLMEM_MEMORY_SLOT(mem, commit_prepare)(mem, plan, plan->res, i)
                          : LLMEM_OK;
    if (st == LLMEM_OK)
        st = mem->iface->commit(mem, plan, plan->res, i);
    if (st != LLMEM_OK)
        return st;
    plan->n_committed = i + 1;
    return LLMEM_OK;
}

void llmem_memory_release(llmem_memory *mem, llmem_plan *plan)
{
    if (!mem || !plan || plan != mem->plan)
        return;
    mem->iface->release(mem, plan, plan->res);
    mem->plan = NULL;
    llmem_plan_free_internal(plan);
}

/* --- sequences ------------------------------------------------------------- */

static llmem_status seq_guard(llmem_memory *mem, int32_t seq, bool allow_all)
{
    if (!mem)
        return LLMEM_E_INVALID;
    if (mem->plan)
        return LLMEM_E_BUSY;
    if (!(seq_ok(mem, seq) || (allow_all && seq == -1)))
        return LLMEM_E_INVALID;
    return LLMEM_OK;
}

static void norm_range(int32_t *p0, int32_t *p1)
{
    if (*p0 < 0)
        *p0 = 0;
    if (*p1 < 0)
        *p1 = INT32_MAX;
}

llmem_status llmem_memory_seq_rm(llmem_memory *mem, int32_t seq_id, int32_t p0, int32_t p1)
{
    llmem_status st = seq_guard(mem, seq_id, true);
    if (st != LLMEM_OK)
        return st;
    norm_range(&p0, &p1);
    if (seq_id >= 0)
        return mem->iface->seq_rm(mem, seq_id, p0, p1, false);
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        if ((st = mem->iface->seq_rm(mem, s, p0, p1, true)) != LLMEM_OK)
            return st;
    for (int32_t s = 0; s < mem->n_seq_max; s++)
        if ((st = mem->iface->seq_rm(mem, s, p0, p1, false)) != LLMEM_OK)
            return st;
    return LLMEM_OK;
}

llmem_status llmem_memory_seq_cp(llmem_memory *mem, int32_t src, int32_t dst, int32_t p0,
                                 int32_t p1)
{
    llmem_status st = seq_guard(mem, src, false);
    if (st != LLMEM_OK)
        return st;
    if (!seq_ok(mem, dst))
        return LLMEM_E_INVALID;
    norm_range(&p0, &p1);
    if (src == dst)
        return LLMEM_OK;
    return mem->iface->seq_cp(mem, src, dst, p0, p1, false);
}

llmem_status llmem_memory_seq_keep(llmem_memory *mem, int32_t seq_id)
{
    llmem_status st = seq_guard(mem, seq_id, false);
    return st != LLMEM_OK ? st : mem->iface->seq_keep(mem, seq_id, false);
}

llmem_status llmem_memory_seq_add(llmem_memory *mem, int32_t seq_id, int32_t p0, int32_t p1,
                                  int32_t delta)
{
    llmem_status st = seq_guard(mem, seq_id, false);
    if (st != LLMEM_OK)
        return st;
    if (!mem->iface->seq_add || !mem->can_shift)
        return LLMEM_E_UNSUPPORTED;
    norm_range(&p0, &p1);
    if (delta == 0 || p0 >= p1)
        return LLMEM_OK;
    return mem->iface->seq_add(mem, seq_id, p0, p1, delta, false);
}

llmem_status llmem_memory_seq_div(llmem_memory *mem, int32_t seq_id, int32_t p0, int32_t p1,
                                  int32_t d)
{
    llmem_status st = seq_guard(mem, seq_id, false);
    if (st != LLMEM_OK)
        return st;
    if (!mem->iface->seq_div || !mem->can_shift)
        return LLMEM_E_UNSUPPORTED;
    if (d <= 0)
        return LLMEM_E_INVALID;
    norm_range(&p0, &p1);
    if (d == 1 || p0 >= p1)
        return LLMEM_OK;
    return mem->iface->seq_div(mem, seq_id, p0, p1, d, false);
}

int32_t llmem_memory_seq_pos_min(llmem_memory *mem, int32_t seq_id)
{
    return mem && seq_ok(mem, seq_id) ? mem->iface->seq_pos_min(mem, seq_id) : -1;
}

int32_t llmem_memory_seq_pos_max(llmem_memory *mem, int32_t seq_id)
{
    return mem && seq_ok(mem, seq_id) ? mem->iface->seq_pos_max(mem, seq_id) : -1;
}

int32_t llmem_memory_seq_len(llmem_memory *mem, int32_t seq_id)
{
    int32_t n = llmem_memory_seq_tokens(mem, seq_id, NULL, 0);
    return n < 0 ? 0 : n;
}

int32_t llmem_memory_seq_tokens(llmem_memory *mem, int32_t seq_id, int32_t *out, int32_t cap)
{
    if (!mem || !seq_ok(mem, seq_id) || cap < 0)
        return -1;
    return mem->iface->seq_tokens(mem, seq_id, out, out ? cap : 0);
}

bool llmem_memory_can_shift(llmem_memory *mem)
{
    return mem && mem->can_shift;
}

llmem_status llmem_memory_clear(llmem_memory *mem, bool data)
{
    if (!mem)
        return LLMEM_E_INVALID;
    if (mem->plan)
        return LLMEM_E_BUSY;
    return mem->iface->clear(mem, data);
}

/* --- state I/O ---------------------------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int k = 0; k < 4; k++)
        v |= (uint32_t)p[k] << (8 * k);
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int k = 0; k < 8; k++)
        v |= (uint64_t)p[k] << (8 * k);
    return v;
}

llmem_status llmem_state_write_section(llmem_memory *m, int32_t seq, llmem_state_writer *w)
{
    if (!m->iface->state_write)
        return LLMEM_E_UNSUPPORTED;
    size_t at = w->len;
    llmem_state_reserve(w, SECTION_HEADER);
    llmem_status st = m->iface->state_write(m, seq, w);
    if (st != LLMEM_OK)
        return st;
    if (w->buf && w->len <= w->cap) {
        size_t n = w->len - at - SECTION_HEADER;
        put_u64(w->buf + at, n);
        put_u64(w->buf + at + 8, XXH3_64bits(w->buf + at + SECTION_HEADER, n));
    }
    return LLMEM_OK;
}

static llmem_status state_write(llmem_memory *mem, int32_t seq, llmem_state_writer *w)
{
    uint8_t *h = llmem_state_reserve(w, STATE_HEADER);
    int32_t ns = 1;
    llmem_status st = LLMEM_MEMORY_SLOT(mem, state_write_sections)
                          ? LLMEM_MEMORY_SLOT(mem, state_write_sections)(mem, seq, w, &ns)
                          : llmem_state_write_section(mem, seq, w);
    if (st != LLMEM_OK)
        return st;
    if (h) {
        put_u32(h, STATE_MAGIC);
        put_u32(h + 4, STATE_VERSION);
        put_u32(h + 8, (uint32_t)seq);
        put_u32(h + 12, (uint32_t)ns);
    }
    uint8_t *t = llmem_state_reserve(w, 8);
    if (t)
        put_u64(t, XXH3_64bits(w->buf, w->len - 8));
    return LLMEM_OK;
}

llmem_status llmem_memory_state_size(llmem_memory *mem, int32_t seq_id, size_t *size)
{
    llmem_status st = seq_guard(mem, seq_id, true);
    if (st != LLMEM_OK || !size)
        return st != LLMEM_OK ? st : LLMEM_E_INVALID;
    llmem_state_writer w = {0};
    st = state_write(mem, seq_id, &w);
    *size = w.len;
    return st;
}

llmem_status llmem_memory_state_write(llmem_memory *mem, int32_t seq_id, void *buf, size_t cap,
                                      size_t *written)
{
    llmem_status st = seq_guard(mem, seq_id, true);
    if (st != LLMEM_OK)
        return st;
    if (!buf)
        return LLMEM_E_INVALID;
    llmem_state_writer w = {.buf = buf, .cap = cap};
    st = state_write(mem, seq_id, &w);
    if (written)
        *written = w.len;
    if (st == LLMEM_OK && w.len > cap)
        return LLMEM_E_NO_SPACE;
    return st;
}

llmem_status llmem_memory_state_read(llmem_memory *mem, int32_t seq_id, const void *buf,
                                     size_t size, char *err, size_t err_len)
{
    llmem_status st = seq_guard(mem, seq_id, true);
    if (st != LLMEM_OK)
        return st;
    const uint8_t *b = buf;
    if (!b || size < STATE_HEADER + 8) {
        llmem_errf(err, err_len, "state stream too short (%zu bytes)", size);
        return LLMEM_E_CORRUPT;
    }
    if (get_u32(b) != STATE_MAGIC) {
        llmem_errf(err, err_len, "not an llmem state stream (bad magic)");
        return LLMEM_E_CORRUPT;
    }
    if (get_u32(b + 4) != STATE_VERSION) {
        llmem_errf(err, err_len, "state stream version %u, this build reads %u", get_u32(b + 4),
                   STATE_VERSION);
        return LLMEM_E_ABI;
    }
    if (XXH3_64bits(b, size - 8) != get_u64(b + size - 8)) {
        llmem_errf(err, err_len, "state stream checksum mismatch (truncated or corrupted)");
        return LLMEM_E_CORRUPT;
    }
    int32_t wseq = (int32_t)get_u32(b + 8);
    int32_t ns = (int32_t)get_u32(b + 12);
    if ((wseq == -1) != (seq_id == -1)) {
        llmem_errf(err, err_len, "stream holds %s, asked to read %s",
                   wseq == -1 ? "every sequence" : "one sequence",
                   seq_id == -1 ? "every sequence" : "one sequence");
        return LLMEM_E_INVALID;
    }
    if (ns < 1 || (size_t)ns > (size - STATE_HEADER - 8) / SECTION_HEADER) {
        llmem_errf(err, err_len, "state stream: bad section count %d", ns);
        return LLMEM_E_CORRUPT;
    }
    if (ns != 1 && !LLMEM_MEMORY_SLOT(mem, state_read_sections)) {
        llmem_errf(err, err_len, "stream has %d sections, this memory has 1", ns);
        return LLMEM_E_INVALID;
    }
    llmem_state_section *sec = calloc((size_t)ns, sizeof *sec);
    if (!sec)
        return LLMEM_E_NO_MEMORY;
    size_t pos = STATE_HEADER, end = size - 8;
    for (int32_t i = 0; i < ns && st == LLMEM_OK; i++) {
        if (end - pos < SECTION_HEADER) {
            llmem_errf(err, err_len, "section %d header truncated", i);
            st = LLMEM_E_CORRUPT;
            break;
        }
        uint64_t n = get_u64(b + pos), h = get_u64(b + pos + 8);
        pos += SECTION_HEADER;
        if (n > end - pos || XXH3_64bits(b + pos, (size_t)n) != h) {
            llmem_errf(err, err_len, "section %d: size or checksum mismatch", i);
            st = LLMEM_E_CORRUPT;
            break;
        }
        sec[i] = (llmem_state_section){b + pos, (size_t)n};
        pos += (size_t)n;
    }
    if (st == LLMEM_OK && pos != end) {
        llmem_errf(err, err_len, "trailing bytes after the last section");
        st = LLMEM_E_CORRUPT;
    }
    if (st == LLMEM_OK && LLMEM_MEMORY_SLOT(mem, state_read_sections)) {
        st = LLMEM_MEMORY_SLOT(mem, state_read_sections)(mem, seq_id, sec, ns, err, err_len);
    } else if (st == LLMEM_OK) {
        void *tmp = NULL;
        st = llmem_state_prepare_section(mem, seq_id, &sec[0], 0, &tmp, err, err_len);
        if (st == LLMEM_OK)
            st = mem->iface->state_read_apply(mem, seq_id, tmp);
    }
    free(sec);
    return st;
}

llmem_status llmem_state_prepare_section(llmem_memory *m, int32_t seq,
                                         const llmem_state_section *sec, int32_t i, void **tmp,
                                         char *err, size_t err_len)
{
    *tmp = NULL;
    if (!m->iface->state_read_prepare)
        return LLMEM_E_UNSUPPORTED;
    llmem_state_reader r = {.buf = sec->data, .len = sec->size};
    llmem_status st = m->iface->state_read_prepare(m, seq, &r, tmp, err, err_len);
    if (st == LLMEM_OK && (r.failed || r.pos != r.len)) {
        m->iface->state_read_abort(m, *tmp);
        *tmp = NULL;
        llmem_errf(err, err_len, "section %d: payload length does not match its content", i);
        st = LLMEM_E_CORRUPT;
    }
    if (st != LLMEM_OK)
        *tmp = NULL; /* a failed prepare keeps nothing */
    return st;
}

/* --- introspection ---------------------------------------------------------- */

llmem_status llmem_memory_get_stats(llmem_memory *mem, llmem_memory_stats *stats)
{
    if (!mem || !stats)
        return LLMEM_E_INVALID;
    memset(stats, 0, sizeof *stats);
    mem->iface->get_stats(mem, stats);
    return LLMEM_OK;
}

int32_t llmem_memory_n_children(llmem_memory *mem)
{
    return mem && mem->iface->n_children ? mem->iface->n_children(mem) : 0;
}

llmem_memory *llmem_memory_child(llmem_memory *mem, int32_t i)
{
    if (i < 0 || i >= llmem_memory_n_children(mem))
        return NULL;
    return mem->iface->child(mem, i);
}

int32_t llmem_memory_n_layers(llmem_memory *mem)
{
    return mem ? mem->n_layers : 0;
}

llmem_split llmem_memory_split(llmem_memory *mem)
{
    return mem ? mem->split : LLMEM_SPLIT_SIMPLE;
}

int32_t llmem_memory_n_seq_max(llmem_memory *mem)
{
    return mem ? mem->n_seq_max : 0;
}

const char *llmem_memory_type(llmem_memory *mem)
{
    return mem ? mem->iface->type : "";
}

llmem_status llmem_memory_check(llmem_memory *mem, char *err, size_t err_len)
{
    if (!mem)
        return LLMEM_E_INVALID;
    return mem->iface->check ? mem->iface->check(mem, err, err_len) : LLMEM_OK;
}

void llmem_memory_destroy(llmem_memory *mem)
{
    if (!mem)
        return;
    if (mem->plan)
        llmem_memory_release(mem, mem->plan);
    mem->iface->destroy(mem);
}
