/* buddy.h - a binary buddy allocator over an opaque address range.
 *
 * Pure C: the range is never dereferenced (it is device memory), all
 * metadata lives in host arrays indexed by unit (the minimum block).
 * Blocks are powers of two and aligned to their size; an allocation of n
 * units takes the smallest free block of 2^k >= n units and hands the
 * unused tail straight back to the free lists in buddy pieces, so a 20 MiB
 * request costs 20 MiB, not 32 (PyTorch's segment sizes).  The allocation
 * is then the run of pieces given by the binary digits of n; freeing
 * returns each piece and merges with free buddies.
 *
 * Trimmed tails serve smaller requests only, unless an allocation may
 * start inside them: fa_buddy_alloc_fit places a request at a run of
 * adjacent free blocks, aligned to the unit only, so 20 MiB requests fill
 * a 64 MiB range three times, not twice.  Such an allocation is freed as
 * the largest aligned pieces that tile it. */
#ifndef FA_BUDDY_H
#define FA_BUDDY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FA_BUDDY_NIL UINT32_MAX
#define FA_BUDDY_MAX_ORDER 40

/* Per-unit metadata, one 16-byte record so an operation touches one cache
 * line.  Meaningful only at the first unit of a block:
 *   state  FREE: a free block of `order`, linked by next/prev
 *          ALLOC or HELD: an allocation of `units` units, `slack` bytes of
 *          its last unit unrequested; next/prev are the owner's (the pool
 *          keeps its quarantine list and epoch there) */
typedef struct fa_buddy_unit {
    uint32_t next, prev;
    uint32_t units;
    uint16_t slack;
    uint8_t state;
    uint8_t order;
} fa_buddy_unit;

typedef struct fa_buddy {
    uintptr_t base;     /* first address of the range */
    unsigned min_shift; /* log2 of the unit (minimum block) in bytes */
    unsigned max_order; /* the range is 2^max_order units */
    uint64_t free_units;
    uint64_t nonempty;  /* bit k set: heads[k] has a block */
    uint32_t heads[FA_BUDDY_MAX_ORDER + 1];
    fa_buddy_unit *u;   /* mmap'd; pages are touched only where blocks start */
    size_t meta_bytes;
} fa_buddy;

/* HELD: allocated, released by its owner but not yet given back (the
 * pool's quarantine): fa_buddy_find no longer returns it. */
enum { FA_BUDDY_NONE = 0, FA_BUDDY_FREE = 1, FA_BUDDY_ALLOC = 2, FA_BUDDY_HELD = 3 };

/* Range [base, base + 2^(min_shift + max_order)), 4 <= min_shift <= 21,
 * max_order <= 31.  With units above 64 KiB, fa_buddy_alloc takes only
 * sizes whose last unit is short by less than 64 KiB (the slack field is
 * 16 bits): the device pool asks such a buddy for whole units.  Returns false for other shapes or if the metadata
 * could not be mapped. */
bool fa_buddy_init(fa_buddy *b, uintptr_t base, unsigned min_shift, unsigned max_order);
void fa_buddy_destroy(fa_buddy *b);

static inline size_t fa_buddy_size(const fa_buddy *b) { return (size_t)1 << (b->min_shift + b->max_order); }
static inline bool fa_buddy_contains(const fa_buddy *b, uintptr_t a)
{
    return a >= b->base && a - b->base < fa_buddy_size(b);
}
static inline bool fa_buddy_idle(const fa_buddy *b) { return b->free_units == (uint64_t)1 << b->max_order; }

/* Allocate `bytes` (> 0).  Returns true and sets *addr, or false when no
 * free block is large enough.  The allocation is aligned to the unit at
 * least, and to the largest power of two <= its size. */
bool fa_buddy_alloc(fa_buddy *b, size_t bytes, uintptr_t *addr);

/* Allocate `bytes` (> 0), aligned to the unit: the block fa_buddy_alloc
 * would take, unless the request is not a power of two of units and a run
 * of adjacent free blocks that holds it starts lower, among runs starting
 * at the first FA_BUDDY_FIT_LOOK free blocks of each smaller order (each
 * run of at most as many blocks).  Where no block is large enough, the
 * lowest run that holds it, found by walking every block of the range.
 * False if no run holds it. */
#define FA_BUDDY_FIT_LOOK 16
bool fa_buddy_alloc_fit(fa_buddy *b, size_t bytes, uintptr_t *addr);

/* Like fa_buddy_alloc, but a block whose first `bytes` (rounded to units)
 * pref accepts is taken if one is found among the first
 * FA_BUDDY_PREF_LOOK blocks of each order that fits, smallest order first;
 * else the block fa_buddy_alloc takes.  At most a constant number of pref
 * calls.  (The device pool prefers address runs already backed.) */
#define FA_BUDDY_PREF_LOOK 16
bool fa_buddy_alloc_pref(fa_buddy *b, size_t bytes, bool (*pref)(void *ctx, uintptr_t addr, size_t bytes), void *ctx,
                         uintptr_t *addr);

/* The unit index of the allocation starting at addr, or FA_BUDDY_NIL if
 * addr is not the start of a live allocation. */
uint32_t fa_buddy_find(const fa_buddy *b, uintptr_t addr);
static inline size_t fa_buddy_alloc_bytes(const fa_buddy *b, uint32_t u) { return (size_t)b->u[u].units << b->min_shift; }
static inline size_t fa_buddy_requested(const fa_buddy *b, uint32_t u)
{
    return fa_buddy_alloc_bytes(b, u) - b->u[u].slack;
}

/* Mark the allocation at unit u held (see FA_BUDDY_HELD). */
static inline void fa_buddy_hold(fa_buddy *b, uint32_t u) { b->u[u].state = FA_BUDDY_HELD; }

/* Hand a held allocation of u to a new request of `bytes` that needs the
 * same number of units (the pool's reuse cache). */
static inline void fa_buddy_reuse(fa_buddy *b, uint32_t u, size_t bytes)
{
    b->u[u].state = FA_BUDDY_ALLOC;
    b->u[u].slack = (uint16_t)(((size_t)b->u[u].units << b->min_shift) - bytes);
}

/* Free the allocation (live or held) at unit u, merging buddies. */
void fa_buddy_free_unit(fa_buddy *b, uint32_t u);

/* Largest block that could be allocated right now, in bytes (0 if none). */
size_t fa_buddy_largest(const fa_buddy *b);

/* Walk the free lists and the allocation marks and check every invariant;
 * returns the number of problems (0 = consistent).  For tests. */
int fa_buddy_check(const fa_buddy *b);

#endif
