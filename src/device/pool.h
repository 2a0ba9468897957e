/* pool.h - one device's pool: power-of-two chunks of device memory, each a
 * buddy arena, with a quarantine for freed blocks.
 *
 * Pure C over addresses: the caller (device.c) gets chunks from the driver
 * and gives them back; the pool decides which bytes are free.  A freed
 * block is quarantined with the pool's current epoch and only returns to
 * the free lists after a device synchronisation that began later
 * (fa_pool_sync_begin/end): work queued before a cudaFree may still write
 * to it, and the real cudaFree would have waited for that work.
 *
 * Blocks leaving the quarantine go to a reuse cache, by order, without
 * merging: a request for the same number of units takes one back in O(1)
 * (PyTorch asks for the same segment sizes again and again), so the buddy
 * lists split and merge only when sizes change.  The cache is merged back
 * into the buddy lists when a request finds no block, and before chunks
 * are given back. */
#ifndef FA_POOL_H
#define FA_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buddy.h"

#define FA_POOL_UNIT_SHIFT 9 /* 512 B: the alignment cudaMalloc gives */
#define FA_POOL_MAX_CHUNKS 4096

typedef struct fa_chunk {
    fa_buddy buddy;
    uint32_t q_head; /* quarantined allocations, linked through buddy.u[].next; epoch in .prev */
    uint32_t q_count;
    uint32_t cache[FA_BUDDY_MAX_ORDER + 1]; /* reuse cache by order, linked through .next */
    uint32_t c_count;
    uint64_t live; /* bytes taken by live allocations */
} fa_chunk;

typedef struct fa_pool {
    size_t chunk_size;                   /* power of two; stored atomically, read atomically without the lock */
    fa_chunk *chunks[FA_POOL_MAX_CHUNKS]; /* sorted by address */
    int nchunks;
    int busy_chunks; /* chunks holding a live allocation */
    uint32_t epoch;
    uint64_t bytes;       /* held from the driver */
    uint64_t in_use;      /* taken by live allocations (whole units) */
    uint64_t requested;   /* asked for by live allocations */
    uint64_t quarantined; /* freed, waiting for a synchronisation */
    uint64_t cached;      /* in the reuse cache: free, not yet merged */
} fa_pool;

typedef enum {
    FA_POOL_FREED,       /* quarantined */
    FA_POOL_NOT_OURS,    /* outside every chunk */
    FA_POOL_BAD_POINTER, /* inside a chunk but not a live allocation's start */
} fa_pool_free_result;

void fa_pool_init(fa_pool *p, size_t chunk_size);
/* Forget every chunk (metadata only; the device memory is the caller's). */
void fa_pool_clear(fa_pool *p);
/* Add a chunk of chunk_size bytes at base.  False if out of metadata. */
bool fa_pool_add_chunk(fa_pool *p, uintptr_t base);
/* Allocate n > 0 bytes from the lowest chunk that can: true and *addr, or
 * false when no ready block fits (quarantined ones do not count).  Within
 * a chunk, fa_buddy_alloc_fit places it. */
bool fa_pool_alloc(fa_pool *p, size_t n, uintptr_t *addr);
/* Quarantine the allocation at a.  *taken / *requested get its sizes. */
fa_pool_free_result fa_pool_free(fa_pool *p, uintptr_t a, size_t *taken, size_t *requested);
bool fa_pool_owns(const fa_pool *p, uintptr_t a);
/* Start of a synchronisation: returns the epoch it covers. */
uint32_t fa_pool_sync_begin(fa_pool *p);
/* The synchronisation begun at epoch e finished: everything quarantined up
 * to e is free again.  Returns the bytes released. */
uint64_t fa_pool_sync_end(fa_pool *p, uint32_t e);
/* Remove the highest-addressed chunk with nothing live or quarantined;
 * true and *base for the caller to give back to the driver. */
bool fa_pool_take_idle_chunk(fa_pool *p, uintptr_t *base);
/* Bytes of the chunks that hold no live allocation: what the pool gives
 * back to a driver that runs short (quarantined blocks included: they are
 * free once the device catches up, as with the driver's cudaFree).  Free
 * space in a chunk that still holds a live block is not counted: it serves
 * only requests that fit in it, never a larger one from the driver. */
static inline uint64_t fa_pool_idle(const fa_pool *p)
{
    return (uint64_t)(p->nchunks - p->busy_chunks) * p->chunk_size;
}

/* Bytes of the chunks that hold nothing live or quarantined: what goes
 * back to the driver without a synchronisation (during a stream capture,
 * which forbids one). */
uint64_t fa_pool_idle_now(const fa_pool *p);

#endif
