/* llmem memory/: one device byte budget and one LRU for the cached prefix
 * data of a memory or a hybrid's children (KV pages and recurrent
 * snapshots; prefix_budget.h). */
#include <stdlib.h>

#include "memory/kv_internal.h"
#include "memory/prefix_budget.h"
#include "memory/rs_internal.h"

prefix_budget *prefix_budget_create(int64_t bytes)
{
    prefix_budget *pb = calloc(1, sizeof *pb);
    if (!pb)
        return NULL;
    pb->refs = 1;
    pb->bytes = bytes;
    return pb;
}

void prefix_budget_unref(prefix_budget *pb)
{
    if (pb && --pb->refs == 0)
        free(pb);
}

/* Where mem's entries take their LRU stamps from, and its own clock. */
static uint64_t **clock_of(llmem_memory *mem, uint64_t **own)
{
    if (mem->iface == &kv_cache_iface) {
        *own = &kv_of(mem)->pool.own_clock;
        return &kv_of(mem)->pool.clock;
    }
    if (mem->iface == &recurrent_iface) {
        *own = &rs_of(mem)->snap_clock;
        return &rs_of(mem)->clock;
    }
    return NULL;
}

bool prefix_budget_join(prefix_budget *pb, llmem_memory *mem)
{
    uint64_t *own = NULL, **clock = clock_of(mem, &own);
    if (!clock || pb->n_member == PREFIX_BUDGET_MAX_MEMBERS)
        return false;
    /* stamps taken so far stay older than every later one */
    if (**clock > pb->clock)
        pb->clock = **clock;
    *clock = &pb->clock;
    pb->member[pb->n_member++] = mem;
    pb->refs++;
    return true;
}

void prefix_budget_leave(prefix_budget *pb, llmem_memory *mem)
{
    if (!pb)
        return;
    for (int32_t i = 0; i < pb->n_member; i++)
        if (pb->member[i] == mem) {
            pb->member[i] = pb->member[--pb->n_member];
            /* its stamps go on from its own clock, never below the shared one */
            uint64_t *own = NULL, **clock = clock_of(mem, &own);
            if (clock) {
                *own = pb->clock;
                *clock = own;
            }
            break;
        }
    prefix_budget_unref(pb);
}

/* --- a KV cache as a member: its cached pages (kv_cache.c evicts them) ---- */

int64_t kv_budget_bytes(llmem_memory *mem)
{
    kv_cache *kv = kv_of(mem);
    return (int64_t)kv->pool.n_cached * kv_entry_bytes(kv);
}

bool kv_budget_oldest(llmem_memory *mem, uint64_t *stamp)
{
    const page_pool *pp = &kv_of(mem)->pool;
    if (pp->lru_head < 0)
        return false;
    *stamp = pp->stamp[pp->lru_head];
    return true;
}

static int64_t member_bytes(llmem_memory *m)
{
    return m->iface == &kv_cache_iface ? kv_budget_bytes(m) : rs_budget_bytes(m);
}

int64_t prefix_budget_used(const prefix_budget *pb)
{
    int64_t used = 0;
    for (int32_t i = 0; i < pb->n_member; i++)
        used += member_bytes(pb->member[i]);
    return used;
}

bool prefix_budget_make_room(prefix_budget *pb, int64_t extra)
{
    if (!pb)
        return true;
    if (pb->busy)
        return false;
    pb->busy = true;
    int64_t used = prefix_budget_used(pb);
    while (used + extra > pb->bytes) {
        /* the least recently used unpinned entry of any member */
        llmem_memory *victim = NULL;
        uint64_t oldest = 0;
        for (int32_t i = 0; i < pb->n_member; i++) {
            llmem_memory *m = pb->member[i];
            uint64_t stamp;
            bool any = m->iface == &kv_cache_iface ? kv_budget_oldest(m, &stamp)
                                                   : rs_budget_oldest(m, &stamp);
            if (any && (!victim || stamp < oldest)) {
                victim = m;
                oldest = stamp;
            }
        }
        if (!victim)
            break;
        int64_t before = member_bytes(victim);
        if (victim->iface == &kv_cache_iface)
            kv_budget_evict(victim);
        else
            rs_budget_evict(victim);
        int64_t after = member_bytes(victim);
        if (after >= before)
            break; /* no progress: never loop */
        used -= before - after;
    }
    pb->busy = false;
    return used + extra <= pb->bytes;
}

bool prefix_budget_check(const prefix_budget *pb, const llmem_memory *mem, char *err,
                         size_t err_len)
{
    if (!pb)
        return true;
    bool member = false;
    for (int32_t i = 0; i < pb->n_member; i++)
        member |= pb->member[i] == mem;
    if (!member || pb->refs != pb->n_member) {
        llmem_errf(err, err_len, "prefix budget: %d members, %d references%s", pb->n_member,
                   pb->refs, member ? "" : ", and this memory is not one of them");
        return false;
    }
    int64_t used = prefix_budget_used(pb);
    if (mem->plan == NULL && used > pb->bytes) {
        llmem_errf(err, err_len, "prefix budget: %lld bytes cached with no plan in flight, "
                                 "budget %lld",
                   (long long)used, (long long)pb->bytes);
        return false;
    }
    return true;
}
