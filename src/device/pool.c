/* pool.c - chunks, buddy arenas and the quarantine (see pool.h). */
#include "pool.h"

#include <stdlib.h>
#include <string.h>

void fa_pool_init(fa_pool *p, size_t chunk_size)
{
    /* Only the header: chunks[] beyond nchunks is never read, and not
     * touching its 32 KiB keeps fork and start-up cheap. */
    p->chunk_size = chunk_size;
    p->nchunks = 0;
    p->epoch = 0;
    p->bytes = p->in_use = p->requested = p->quarantined = 0;
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

bool fa_pool_alloc(fa_pool *p, size_t n, uintptr_t *addr)
{
    if (n == 0 || n > p->chunk_size)
        return false;
    for (int i = 0; i < p->nchunks; i++) {
        fa_buddy *b = &p->chunks[i]->buddy;
        if (fa_buddy_alloc(b, n, addr)) {
            uint32_t u = fa_buddy_find(b, *addr);
            p->in_use += fa_buddy_alloc_bytes(b, u);
            p->requested += n;
            return true;
        }
    }
    return false;
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
    c->buddy.next[u] = c->q_head;
    c->buddy.prev[u] = p->epoch;
    c->q_head = u;
    c->q_count++;
    p->in_use -= *taken;
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
            if ((int32_t)(c->buddy.prev[u] - e) <= 0) {
                *link = c->buddy.next[u];
                uint64_t bytes = fa_buddy_alloc_bytes(&c->buddy, u);
                fa_buddy_free_unit(&c->buddy, u);
                c->q_count--;
                p->quarantined -= bytes;
                released += bytes;
            } else {
                link = &c->buddy.next[u];
            }
        }
    }
    return released;
}

bool fa_pool_take_idle_chunk(fa_pool *p, uintptr_t *base)
{
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
