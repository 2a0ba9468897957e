/* buddy.c - binary buddy allocator with tail trimming and first-fit runs (see buddy.h). */
#include "buddy.h"

#include <string.h>
#include <sys/mman.h>

#include "bits.h"

static void push(fa_buddy *b, uint32_t u, unsigned k)
{
    b->u[u].state = FA_BUDDY_FREE;
    b->u[u].order = (uint8_t)k;
    b->u[u].prev = FA_BUDDY_NIL;
    b->u[u].next = b->heads[k];
    if (b->heads[k] != FA_BUDDY_NIL)
        b->u[b->heads[k]].prev = u;
    b->heads[k] = u;
    b->nonempty |= (uint64_t)1 << k;
    b->free_units += (uint64_t)1 << k;
}

static void unlink_block(fa_buddy *b, uint32_t u)
{
    unsigned k = b->u[u].order;
    if (b->u[u].prev != FA_BUDDY_NIL)
        b->u[b->u[u].prev].next = b->u[u].next;
    else
        b->heads[k] = b->u[u].next;
    if (b->u[u].next != FA_BUDDY_NIL)
        b->u[b->u[u].next].prev = b->u[u].prev;
    if (b->heads[k] == FA_BUDDY_NIL)
        b->nonempty &= ~((uint64_t)1 << k);
    b->u[u].state = FA_BUDDY_NONE;
    b->free_units -= (uint64_t)1 << k;
}

static void *map(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

bool fa_buddy_init(fa_buddy *b, uintptr_t base, unsigned min_shift, unsigned max_order)
{
    memset(b, 0, sizeof *b);
    if (max_order > FA_BUDDY_MAX_ORDER || min_shift < 4 || min_shift > 21 || max_order > 31)
        return false;
    size_t n = (size_t)1 << max_order;
    /* Pages are touched only where blocks start, so the cost follows the
     * number of blocks, not the size of the range. */
    size_t bytes = n * sizeof(fa_buddy_unit);
    void *m = map(bytes);
    if (!m)
        return false;
    b->meta_bytes = bytes;
    b->u = m;
    b->base = base;
    b->min_shift = min_shift;
    b->max_order = max_order;
    for (unsigned k = 0; k <= FA_BUDDY_MAX_ORDER; k++)
        b->heads[k] = FA_BUDDY_NIL;
    push(b, 0, max_order);
    return true;
}

void fa_buddy_destroy(fa_buddy *b)
{
    if (b->u)
        munmap(b->u, b->meta_bytes);
    memset(b, 0, sizeof *b);
}

static void free_block(fa_buddy *b, uint32_t u, unsigned k);

/* [pos, end) back to the free lists as the largest aligned pieces that
 * tile it; merge: each with its free buddies (a freed allocation), else
 * pushed as it is (the free tail of what an allocation took from free
 * blocks, end aligned to the last of them: each piece's buddy overlaps the
 * allocation or is part of a larger piece, so none could merge). */
static void put_range(fa_buddy *b, uint64_t pos, uint64_t end, bool merge)
{
    while (pos < end) {
        unsigned o = pos ? (unsigned)__builtin_ctzll(pos) : b->max_order;
        while (pos + ((uint64_t)1 << o) > end)
            o--;
        if (merge)
            free_block(b, (uint32_t)pos, o);
        else
            push(b, (uint32_t)pos, o);
        pos += (uint64_t)1 << o;
    }
}

/* The length in units of the block that starts at unit pos, free or
 * allocated; 0 if pos is not a block's start (never, with consistent
 * tables).  Blocks tile the range, so this walks it in address order. */
static uint64_t block_units(const fa_buddy *b, uint64_t pos)
{
    const fa_buddy_unit *r = &b->u[pos];
    if (r->state == FA_BUDDY_FREE)
        return (uint64_t)1 << r->order;
    return r->state == FA_BUDDY_ALLOC || r->state == FA_BUDDY_HELD ? r->units : 0;
}

static void mark(fa_buddy *b, uint32_t u, uint64_t n, size_t bytes, uintptr_t *addr)
{
    b->u[u].state = FA_BUDDY_ALLOC;
    b->u[u].units = (uint32_t)n;
    b->u[u].slack = (uint16_t)((n << b->min_shift) - bytes);
    *addr = b->base + ((uintptr_t)u << b->min_shift);
}

/* Allocate n units from the free block u of order j >= k = ceil_log2(n):
 * split down to 2^k, keeping the lower half, and trim the tail. */
static void take_block(fa_buddy *b, uint32_t u, unsigned j, unsigned k, uint64_t n, size_t bytes, uintptr_t *addr)
{
    unlink_block(b, u);
    while (j > k) { /* split: keep the lower half, free the upper */
        j--;
        push(b, u + ((uint32_t)1 << j), j);
    }
    put_range(b, u + n, (uint64_t)u + ((uint64_t)1 << k), false);
    mark(b, u, n, bytes, addr);
}

bool fa_buddy_alloc(fa_buddy *b, size_t bytes, uintptr_t *addr) { return fa_buddy_alloc_pref(b, bytes, NULL, NULL, addr); }

bool fa_buddy_alloc_pref(fa_buddy *b, size_t bytes, bool (*pref)(void *ctx, uintptr_t addr, size_t bytes), void *ctx,
                         uintptr_t *addr)
{
    if (bytes == 0)
        return false;
    uint64_t unit = (uint64_t)1 << b->min_shift;
    uint64_t n = ((uint64_t)bytes + unit - 1) >> b->min_shift;
    unsigned k = fa_ceil_log2(n);
    if (k > b->max_order || ((n << b->min_shift) - bytes) > UINT16_MAX) /* the slack must fit its field */
        return false;
    uint64_t avail = b->nonempty >> k;
    if (!avail)
        return false;
    unsigned j = k + (unsigned)__builtin_ctzll(avail); /* smallest order that has a block */
    uint32_t u = b->heads[j];
    if (pref && !pref(ctx, b->base + ((uintptr_t)u << b->min_shift), (size_t)(n << b->min_shift))) {
        /* A few candidates of each order, smallest first: the allocation
         * takes the start of the block it comes from. */
        bool found = false;
        for (unsigned o = j; o <= b->max_order && !found; o++) {
            if (!((b->nonempty >> o) & 1))
                continue;
            uint32_t c = b->heads[o];
            for (int looked = 0; c != FA_BUDDY_NIL && looked < FA_BUDDY_PREF_LOOK && !found; looked++, c = b->u[c].next)
                if (pref(ctx, b->base + ((uintptr_t)c << b->min_shift), (size_t)(n << b->min_shift))) {
                    u = c, j = o;
                    found = true;
                }
        }
    }
    take_block(b, u, j, k, n, bytes, addr);
    return true;
}

/* The end of the run of adjacent free blocks that starts with the free
 * block at s, once it holds n units; 0 if it ends sooner or has more than
 * `blocks` blocks. */
static uint64_t run_end(const fa_buddy *b, uint64_t s, uint64_t n, int blocks)
{
    uint64_t total = (uint64_t)1 << b->max_order, pos = s;
    while (pos < total && b->u[pos].state == FA_BUDDY_FREE && blocks-- > 0) {
        pos += (uint64_t)1 << b->u[pos].order;
        if (pos - s >= n)
            return pos;
    }
    return 0;
}

/* The lowest run of free blocks that holds n units, walking every block of
 * the range in address order (each starts with its record): its start and
 * end, or false. */
static bool first_run(const fa_buddy *b, uint64_t n, uint64_t *start, uint64_t *end)
{
    uint64_t total = (uint64_t)1 << b->max_order, pos = 0, run = 0;
    bool in_run = false;
    for (uint64_t len; pos < total; pos += len) {
        if (!(len = block_units(b, pos)))
            return false;
        bool is_free = b->u[pos].state == FA_BUDDY_FREE;
        if (is_free && !in_run)
            run = pos;
        in_run = is_free;
        if (is_free && pos + len - run >= n) {
            *start = run, *end = pos + len;
            return true;
        }
    }
    return false;
}

bool fa_buddy_alloc_fit(fa_buddy *b, size_t bytes, uintptr_t *addr)
{
    if (bytes == 0)
        return false;
    uint64_t unit = (uint64_t)1 << b->min_shift;
    uint64_t n = ((uint64_t)bytes + unit - 1) >> b->min_shift;
    unsigned k = fa_ceil_log2(n);
    if (n > b->free_units || ((n << b->min_shift) - bytes) > UINT16_MAX)
        return false;
    /* The block fa_buddy_alloc would take, if any. */
    uint64_t avail = k <= b->max_order ? b->nonempty >> k : 0;
    unsigned j = avail ? k + (unsigned)__builtin_ctzll(avail) : 0;
    uint64_t best = avail ? b->heads[j] : UINT64_MAX, best_end = 0;
    /* n is not a power of two: that block would strand its tail for every
     * larger request.  A run starting lower, in the free blocks such tails
     * left, is taken instead (a bounded look: the first blocks of each
     * smaller order). */
    if (n & (n - 1)) {
        for (unsigned o = 0; o < k && o <= b->max_order; o++) {
            if (!((b->nonempty >> o) & 1))
                continue;
            uint32_t c = b->heads[o];
            for (int looked = 0; c != FA_BUDDY_NIL && looked < FA_BUDDY_FIT_LOOK; looked++, c = b->u[c].next) {
                uint64_t e;
                if (c < best && (e = run_end(b, c, n, FA_BUDDY_FIT_LOOK)) != 0)
                    best = c, best_end = e;
            }
        }
    }
    if (best == UINT64_MAX && !first_run(b, n, &best, &best_end))
        return false;
    if (!best_end) { /* the aligned block */
        take_block(b, (uint32_t)best, j, k, n, bytes, addr);
        return true;
    }
    for (uint64_t q = best; q < best_end;) {
        uint64_t size = (uint64_t)1 << b->u[q].order;
        unlink_block(b, (uint32_t)q);
        q += size;
    }
    put_range(b, best + n, best_end, false);
    mark(b, (uint32_t)best, n, bytes, addr);
    return true;
}

uint32_t fa_buddy_find(const fa_buddy *b, uintptr_t addr)
{
    if (!fa_buddy_contains(b, addr))
        return FA_BUDDY_NIL;
    uintptr_t off = addr - b->base;
    if (off & (((uintptr_t)1 << b->min_shift) - 1))
        return FA_BUDDY_NIL;
    uint32_t u = (uint32_t)(off >> b->min_shift);
    return b->u[u].state == FA_BUDDY_ALLOC ? u : FA_BUDDY_NIL;
}

static void free_block(fa_buddy *b, uint32_t u, unsigned k)
{
    while (k < b->max_order) {
        uint32_t buddy = u ^ ((uint32_t)1 << k);
        if (b->u[buddy].state != FA_BUDDY_FREE || b->u[buddy].order != k)
            break;
        unlink_block(b, buddy);
        if (buddy < u)
            u = buddy;
        k++;
    }
    push(b, u, k);
}

void fa_buddy_free_unit(fa_buddy *b, uint32_t u)
{
    b->u[u].state = FA_BUDDY_NONE;
    /* For an allocation aligned to its size (fa_buddy_alloc), the pieces
     * are the binary digits of its units from the top. */
    put_range(b, u, (uint64_t)u + b->u[u].units, true);
}

size_t fa_buddy_largest(const fa_buddy *b)
{
    if (!b->nonempty)
        return 0;
    unsigned k = 63u - (unsigned)__builtin_clzll(b->nonempty);
    return (size_t)1 << (k + b->min_shift);
}

int fa_buddy_check(const fa_buddy *b)
{
    int problems = 0;
    uint64_t free_units = 0;
    for (unsigned k = 0; k <= b->max_order; k++) {
        uint32_t prev = FA_BUDDY_NIL;
        bool any = false;
        for (uint32_t u = b->heads[k]; u != FA_BUDDY_NIL; prev = u, u = b->u[u].next) {
            any = true;
            problems += b->u[u].state != FA_BUDDY_FREE || b->u[u].order != k || b->u[u].prev != prev;
            problems += (u & (((uint32_t)1 << k) - 1)) != 0; /* aligned to its size */
            /* a free block never has a free buddy of the same order (it would have merged) */
            if (k < b->max_order) {
                uint32_t buddy = u ^ ((uint32_t)1 << k);
                problems += b->u[buddy].state == FA_BUDDY_FREE && b->u[buddy].order == k;
            }
            free_units += (uint64_t)1 << k;
        }
        problems += any != ((b->nonempty >> k) & 1);
    }
    problems += free_units != b->free_units;
    /* The blocks, free and allocated, tile the range. */
    uint64_t pos = 0, total = (uint64_t)1 << b->max_order, walked_free = 0;
    for (uint64_t len; pos < total; pos += len) {
        if (!(len = block_units(b, pos)))
            return problems + 1;
        if (b->u[pos].state == FA_BUDDY_FREE)
            walked_free += len;
    }
    problems += pos != total || walked_free != free_units;
    return problems;
}
