/* pool.c - chunks, buddy arenas and the quarantine (see pool.h). */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

#include "bits.h"

void fa_pool_init(fa_pool *p, size_t chunk_size)
{
    /* Only the header: chunks[] beyond nchunks is never read, and not
     * touching its 32 KiB keeps fork and start-up cheap.  chunk_size is
     * also read without the pool's lock (device.c, cudaMalloc's fast
     * path): it is stored atomically. */
    __atomic_store_n(&p->chunk_size, chunk_size, __ATOMIC_RELEASE);
    p->nchunks = 0;
    p->epoch = 0;
    p->busy_chunks = 0;
    p->bytes = p->in_use = p->requested = p->quarantined = p->cached = 0;
}

void fa_pool_clear(fa_pool *p)
{
    for (int i = 0; i < p->nchunks; i++) {
        fa_buddy_destroy(&p->chunks[i]->buddy);
        free(p->chunks[i]);
    }
    fa_pool_init(p, p->chunk_size);
}

static unsigned log2_exact(size_t v) { return (unsigned)__builtin_ctzll((unsigned long long)v); }

bool fa_pool_add_chunk(fa_pool *p, uintptr_t base)
{
    if (p->nchunks == FA_POOL_MAX_CHUNKS || p->chunk_size < ((size_t)2 << FA_POOL_UNIT_SHIFT))
        return false;
    fa_chunk *c = calloc(1, sizeof *c);
    if (!c)
        return false;
    if (!fa_buddy_init(&c->buddy, base, FA_POOL_UNIT_SHIFT, log2_exact(p->chunk_size) - FA_POOL_UNIT_SHIFT)) {
        free(c);
        return false;
    }
    c->q_head = FA_BUDDY_NIL;
    for (unsigned k = 0; k <= FA_BUDDY_MAX_ORDER; k++)
        c->cache[k] = FA_BUDDY_NIL;
    int i = p->nchunks++;
    while (i > 0 && p->chunks[i - 1]->buddy.base > base) {
        p->chunks[i] = p->chunks[i - 1];
        i--;
    }
    p->chunks[i] = c;
    p->bytes += p->chunk_size;
    return true;
}

static fa_chunk *chunk_of(const fa_pool *p, uintptr_t a)
{
    int lo = 0, hi = p->nchunks - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        fa_chunk *c = p->chunks[mid];
        if (a < c->buddy.base)
            hi = mid - 1;
        else if (a - c->buddy.base >= p->chunk_size)
            lo = mid + 1;
        else
            return c;
    }
    return NULL;
}

bool fa_pool_owns(const fa_pool *p, uintptr_t a) { return chunk_of(p, a) != NULL; }

/* Take a cached block of exactly `units` units from chunk c (the first few
 * of its order are looked at). */
static bool cache_take(fa_chunk *c, unsigned k, uint32_t units, uint32_t *out)
{
    uint32_t *link = &c->cache[k];
    for (int looked = 0; *link != FA_BUDDY_NIL && looked < 8; looked++) {
        uint32_t u = *link;
        if (c->buddy.u[u].units == units) {
            *link = c->buddy.u[u].next;
            c->c_count--;
            *out = u;
            return true;
        }
        link = &c->buddy.u[u].next;
    }
    return false;
}

static void cache_flush(fa_pool *p)
{
    for (int i = 0; i < p->nchunks && p->cached; i++) {
        fa_chunk *c = p->chunks[i];
        for (unsigned k = 0; k <= FA_BUDDY_MAX_ORDER && c->c_count; k++) {
            while (c->cache[k] != FA_BUDDY_NIL) {
                uint32_t u = c->cache[k];
                c->cache[k] = c->buddy.u[u].next;
                c->c_count--;
                p->cached -= fa_buddy_alloc_bytes(&c->buddy, u);
                fa_buddy_free_unit(&c->buddy, u);
            }
        }
    }
}

/* Live allocations took / gave back `bytes` of chunk c. */
static void take(fa_pool *p, fa_chunk *c, uint64_t bytes)
{
    p->busy_chunks += c->live == 0;
    c->live += bytes;
    p->in_use += bytes;
}

static void give(fa_pool *p, fa_chunk *c, uint64_t bytes)
{
    c->live -= bytes;
    p->busy_chunks -= c->live == 0;
    p->in_use -= bytes;
}

/* From the free lists of the lowest chunk that can serve. */
static bool buddy_alloc(fa_pool *p, size_t n, uintptr_t *addr)
{
    for (int i = 0; i < p->nchunks; i++) {
        fa_chunk *c = p->chunks[i];
        if (fa_buddy_alloc_fit(&c->buddy, n, addr)) {
            take(p, c, fa_buddy_alloc_bytes(&c->buddy, fa_buddy_find(&c->buddy, *addr)));
            return true;
        }
    }
    return false;
}

bool fa_pool_alloc(fa_pool *p, size_t n, uintptr_t *addr)
{
    if (n == 0 || n > p->chunk_size)
        return false;
    if (p->cached) {
        uint64_t units = ((uint64_t)n + ((uint64_t)1 << FA_POOL_UNIT_SHIFT) - 1) >> FA_POOL_UNIT_SHIFT;
        unsigned k = fa_ceil_log2(units);
        for (int i = 0; i < p->nchunks; i++) {
            fa_chunk *c = p->chunks[i];
            uint32_t u;
            if (c->c_count && cache_take(c, k, (uint32_t)units, &u)) {
                fa_buddy_reuse(&c->buddy, u, n);
                uint64_t bytes = fa_buddy_alloc_bytes(&c->buddy, u);
                p->cached -= bytes;
                take(p, c, bytes);
                p->requested += n;
                *addr = c->buddy.base + ((uintptr_t)u << FA_POOL_UNIT_SHIFT);
                return true;
            }
        }
    }
    bool ok = buddy_alloc(p, n, addr);
    if (!ok && p->cached) { /* sizes changed: merge the cache and look again */
        cache_flush(p);
        ok = buddy_alloc(p, n, addr);
    }
    if (ok)
        p->requested += n;
    return ok;
}

fa_pool_free_result fa_pool_free(fa_pool *p, uintptr_t a, size_t *taken, size_t *requested)
{
    fa_chunk *c = chunk_of(p, a);
    if (!c)
        return FA_POOL_NOT_OURS;
    uint32_t u = fa_buddy_find(&c->buddy, a);
    if (u == FA_BUDDY_NIL)
        return FA_POOL_BAD_POINTER;
    *taken = fa_buddy_alloc_bytes(&c->buddy, u);
    *requested = fa_buddy_requested(&c->buddy, u);
    fa_buddy_hold(&c->buddy, u);
    c->buddy.u[u].next = c->q_head;
    c->buddy.u[u].prev = p->epoch;
    c->q_head = u;
    c->q_count++;
    give(p, c, *taken);
    p->requested -= *requested;
    p->quarantined += *taken;
    return FA_POOL_FREED;
}

uint32_t fa_pool_sync_begin(fa_pool *p) { return p->epoch++; }

uint64_t fa_pool_sync_end(fa_pool *p, uint32_t e)
{
    uint64_t released = 0;
    for (int i = 0; i < p->nchunks; i++) {
        fa_chunk *c = p->chunks[i];
        uint32_t *link = &c->q_head;
        while (*link != FA_BUDDY_NIL) {
            uint32_t u = *link;
            /* Wrap-safe "freed at or before epoch e". */
            if ((int32_t)(c->buddy.u[u].prev - e) <= 0) {
                *link = c->buddy.u[u].next;
                uint64_t bytes = fa_buddy_alloc_bytes(&c->buddy, u);
                unsigned k = fa_ceil_log2(c->buddy.u[u].units);
                c->buddy.u[u].next = c->cache[k]; /* into the reuse cache */
                c->cache[k] = u;
                c->c_count++;
                c->q_count--;
                p->quarantined -= bytes;
                p->cached += bytes;
                released += bytes;
            } else {
                link = &c->buddy.u[u].next;
            }
        }
    }
    return released;
}

uint64_t fa_pool_idle_now(const fa_pool *p)
{
    uint64_t n = 0;
    for (int i = 0; i < p->nchunks; i++)
        n += !p->chunks[i]->live && !p->chunks[i]->q_count;
    return n * p->chunk_size;
}

bool fa_pool_take_idle_chunk(fa_pool *p, uintptr_t *base)
{
    cache_flush(p);
    for (int i = p->nchunks - 1; i >= 0; i--) {
        fa_chunk *c = p->chunks[i];
        if (!fa_buddy_idle(&c->buddy) || c->q_count)
            continue;
        *base = c->buddy.base;
        fa_buddy_destroy(&c->buddy);
        free(c);
        memmove(&p->chunks[i], &p->chunks[i + 1], sizeof p->chunks[0] * (size_t)(p->nchunks - 1 - i));
        p->nchunks--;
        p->bytes -= p->chunk_size;
        return true;
    }
    return false;
}
