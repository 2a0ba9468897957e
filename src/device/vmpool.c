/* vmpool.c - physical pieces behind reserved address space: placement,
 * backing, quarantine and idle pieces (see vmpool.h). */
#include "vmpool.h"

#include <string.h>
#include <sys/mman.h>

#include "bits.h"

enum { SMALL = 0, LARGE = 1 };

#define MIN_ZONE ((size_t)128 << 20)
#define MAX_ZONE ((size_t)1 << 40) /* 2^31 units of 512 B: the buddy's limit */

size_t fa_vm_zone_for(uint64_t total)
{
    uint64_t want = total > MAX_ZONE / 2 ? MAX_ZONE : total * 2;
    size_t z = MIN_ZONE;
    while (z < want && z < MAX_ZONE)
        z <<= 1;
    return z;
}

bool fa_vm_init(fa_vm *v, uintptr_t base, size_t zone)
{
    memset(v, 0, sizeof *v);
    if (zone < MIN_ZONE || zone > MAX_ZONE || (zone & (zone - 1)) || (base & (FA_VM_GRANULE - 1)))
        return false;
    unsigned zshift = (unsigned)__builtin_ctzll((unsigned long long)zone);
    if (!fa_buddy_init(&v->small, base, FA_VM_UNIT_SHIFT, zshift - FA_VM_UNIT_SHIFT))
        return false;
    if (!fa_buddy_init(&v->large, base + zone, FA_VM_GRANULE_SHIFT, zshift - FA_VM_GRANULE_SHIFT)) {
        fa_buddy_destroy(&v->small);
        return false;
    }
    v->ngran = (uint32_t)((2 * zone) >> FA_VM_GRANULE_SHIFT);
    /* Zero-filled on demand: gran_piece holds piece index + 1 (0: none),
     * so nothing is touched here whatever the reservation's size. */
    size_t bytes = (size_t)v->ngran * (sizeof(uint32_t) + sizeof(fa_vm_gran) + sizeof(fa_vm_piece));
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fa_buddy_destroy(&v->small);
        fa_buddy_destroy(&v->large);
        return false;
    }
    v->meta_bytes = bytes;
    v->pieces = m; /* first, then gran: 8-byte aligned */
    v->gran = (fa_vm_gran *)(v->pieces + v->ngran);
    v->gran_piece = (uint32_t *)(v->gran + v->ngran);
    v->base = base;
    v->zone = zone;
    v->free_slot = v->idle_head[SMALL] = v->idle_head[LARGE] = v->idle_tail[SMALL] = v->idle_tail[LARGE] = FA_VM_NIL;
    v->q_head[SMALL] = v->q_head[LARGE] = v->q_tail[SMALL] = v->q_tail[LARGE] = FA_VM_NIL;
    for (unsigned k = 0; k <= FA_BUDDY_MAX_ORDER; k++)
        v->cache[k] = FA_BUDDY_NIL;
    return true;
}

void fa_vm_destroy(fa_vm *v)
{
    if (v->pieces)
        munmap(v->pieces, v->meta_bytes);
    fa_buddy_destroy(&v->small);
    fa_buddy_destroy(&v->large);
    memset(v, 0, sizeof *v);
}

/* ---- granules and pieces ------------------------------------------------- */

static uint32_t gran_of(const fa_vm *v, uintptr_t a) { return (uint32_t)((a - v->base) >> FA_VM_GRANULE_SHIFT); }
static uintptr_t gran_addr(const fa_vm *v, uint32_t g) { return v->base + ((uintptr_t)g << FA_VM_GRANULE_SHIFT); }
static uint32_t piece_at(const fa_vm *v, uint32_t g) { return v->gran_piece[g] - 1; /* 0 - 1 = FA_VM_NIL */ }
static int zone_of_piece(const fa_vm *v, const fa_vm_piece *p) { return p->first >= v->ngran / 2; }
static uint64_t piece_bytes(const fa_vm_piece *p) { return (uint64_t)p->count << FA_VM_GRANULE_SHIFT; }

static void idle_push(fa_vm *v, uint32_t i)
{
    fa_vm_piece *p = &v->pieces[i];
    int z = zone_of_piece(v, p);
    p->idle = true;
    p->next = FA_VM_NIL;
    p->prev = v->idle_tail[z];
    if (p->prev == FA_VM_NIL)
        v->idle_head[z] = i;
    else
        v->pieces[p->prev].next = i;
    v->idle_tail[z] = i;
    v->idle += piece_bytes(p);
    v->pieces_idle++;
}

static void idle_unlink(fa_vm *v, uint32_t i)
{
    fa_vm_piece *p = &v->pieces[i];
    int z = zone_of_piece(v, p);
    if (p->prev == FA_VM_NIL)
        v->idle_head[z] = p->next;
    else
        v->pieces[p->prev].next = p->next;
    if (p->next == FA_VM_NIL)
        v->idle_tail[z] = p->prev;
    else
        v->pieces[p->next].prev = p->prev;
    p->idle = false;
    v->idle -= piece_bytes(p);
    v->pieces_idle--;
}

/* Pre: the granules [first, first+count) are mapped to handle and have no
 * piece.  busy: some block uses them (else the piece joins the idle list). */
static void piece_add(fa_vm *v, uint32_t first, uint32_t count, uint64_t handle, bool busy)
{
    uint32_t i = v->free_slot;
    if (i != FA_VM_NIL)
        v->free_slot = v->pieces[i].next;
    else
        i = v->slots_used++; /* never more pieces than granules */
    v->pieces[i] = (fa_vm_piece){.handle = handle, .first = first, .count = count};
    for (uint32_t g = first; g < first + count; g++)
        v->gran_piece[g] = i + 1;
    v->mapped += piece_bytes(&v->pieces[i]);
    v->pieces_mapped++;
    if (!busy)
        idle_push(v, i);
}

/* Forget piece i (its mapping is gone).  Returns its handle. */
static uint64_t piece_forget(fa_vm *v, uint32_t i)
{
    fa_vm_piece *p = &v->pieces[i];
    if (p->idle)
        idle_unlink(v, i);
    for (uint32_t g = p->first; g < p->first + p->count; g++)
        v->gran_piece[g] = 0;
    v->mapped -= piece_bytes(p);
    v->pieces_mapped--;
    uint64_t h = p->handle;
    p->count = 0; /* a free slot */
    p->next = v->free_slot;
    v->free_slot = i;
    return h;
}

/* Unmap piece i and release its handle.  False (nothing changed) if the
 * unmap failed, unless force. */
static bool piece_drop(fa_vm *v, uint32_t i, const fa_vm_driver *drv, void *ctx, bool force)
{
    fa_vm_piece *p = &v->pieces[i];
    if (drv->unmap(ctx, gran_addr(v, p->first), (size_t)piece_bytes(p)) != 0 && !force)
        return false;
    drv->release(ctx, piece_forget(v, i));
    return true;
}

/* An idle 2 MiB piece, unmapped from its granule: its handle can back
 * another.  Oldest first. */
static bool steal(fa_vm *v, const fa_vm_driver *drv, void *ctx, uint64_t *handle)
{
    uint32_t i = v->idle_head[SMALL];
    if (i == FA_VM_NIL || drv->unmap(ctx, gran_addr(v, v->pieces[i].first), FA_VM_GRANULE) != 0)
        return false;
    *handle = piece_forget(v, i);
    v->stolen++;
    return true;
}

/* ---- use of granules ----------------------------------------------------- */

/* A small-zone granule whose taken bytes are all quarantined: its piece
 * goes idle at the next synchronisation. */
static bool whole_quarantine(const fa_vm_gran *x) { return x->use && x->use == x->quar; }

enum small_change { TAKE, UNTAKE, QUARANTINE, UNQUARANTINE };

/* Small zone: the bytes of [a, a+bytes) are taken by a live block (TAKE),
 * given back by one (UNTAKE), quarantined by its free (QUARANTINE), or
 * given back from the quarantine (UNQUARANTINE).  Pieces whose granule
 * changes between unused and used leave or join the idle list, and
 * `reclaimable` follows the granules that are wholly quarantined: the
 * live bytes a change adds or removes make a granule stop or start being
 * one, and quarantined bytes leaving empty it.  Inlined: `how` is a
 * constant at every call (cudaMalloc and cudaFree run through here). */
static inline __attribute__((always_inline)) void small_change(fa_vm *v, uintptr_t a, size_t bytes,
                                                                enum small_change how)
{
    uint32_t g = gran_of(v, a), last = gran_of(v, a + bytes - 1);
    for (; g <= last; g++) {
        uintptr_t gs = gran_addr(v, g), ge = gs + FA_VM_GRANULE;
        uintptr_t lo = a > gs ? a : gs, hi = a + bytes < ge ? a + bytes : ge;
        uint32_t ov = (uint32_t)(hi - lo);
        fa_vm_gran *x = &v->gran[g];
        switch (how) {
        case TAKE:
            if (x->use == 0 && v->gran_piece[g] && v->pieces[piece_at(v, g)].idle)
                idle_unlink(v, piece_at(v, g));
            if (whole_quarantine(x))
                v->reclaimable -= FA_VM_GRANULE;
            x->use += ov;
            break;
        case QUARANTINE:
            x->quar += ov;
            if (x->quar == x->use)
                v->reclaimable += FA_VM_GRANULE;
            break;
        case UNQUARANTINE:
            if (x->use == ov && x->quar == ov)
                v->reclaimable -= FA_VM_GRANULE; /* the last of a wholly quarantined granule */
            x->quar -= ov;
            x->use -= ov;
            if (x->use == 0 && v->gran_piece[g])
                idle_push(v, piece_at(v, g));
            break;
        case UNTAKE:
            x->use -= ov;
            if (whole_quarantine(x))
                v->reclaimable += FA_VM_GRANULE;
            else if (x->use == 0 && v->gran_piece[g])
                idle_push(v, piece_at(v, g));
            break;
        }
    }
}

/* Is there a piece exactly over the large block at granule g0 (count ng)? */
static uint32_t exact_piece(const fa_vm *v, uint32_t g0, uint32_t ng)
{
    uint32_t i = piece_at(v, g0);
    return i != FA_VM_NIL && v->pieces[i].first == g0 && v->pieces[i].count == ng ? i : FA_VM_NIL;
}

/* ---- allocation ------------------------------------------------------------ */

/* Grant access to the pieces mapped at granules [run, end), or unmap them
 * if that fails.  False on failure. */
static bool finish_run(fa_vm *v, uint32_t run, uint32_t end, const fa_vm_driver *drv, void *ctx)
{
    if (run == end || drv->set_access(ctx, gran_addr(v, run), (size_t)(end - run) << FA_VM_GRANULE_SHIFT) == 0)
        return true;
    for (uint32_t g = run; g < end; g++)
        piece_drop(v, piece_at(v, g), drv, ctx, true);
    return false;
}

/* Is every granule of [a, a+bytes) backed?  (Placement prefers such runs:
 * no driver call, and idle pieces are not moved for nothing.) */
static bool backed(void *ctx, uintptr_t a, size_t bytes)
{
    const fa_vm *v = ctx;
    for (uint32_t g = gran_of(v, a), last = gran_of(v, a + bytes - 1); g <= last; g++)
        if (!v->gran_piece[g])
            return false;
    return true;
}

/* The reuse cache of the small zone: blocks out of the quarantine, kept
 * whole (held in the buddy, their bytes no longer counted as used) for the
 * next request of the same number of units; merged only when the buddy
 * cannot place a request. */
static void cache_put(fa_vm *v, uint32_t u)
{
    unsigned k = fa_ceil_log2(v->small.u[u].units);
    v->small.u[u].next = v->cache[k];
    v->cache[k] = u;
    v->cached += fa_buddy_alloc_bytes(&v->small, u);
}

static uintptr_t unit_addr(const fa_vm *v, uint32_t u) { return v->small.base + ((uintptr_t)u << FA_VM_UNIT_SHIFT); }

/* A cached block of exactly `units` (the first few of its order): the
 * first whose first granule is backed (idle pieces given back leave some
 * without; the usual first one has its pieces), else the first. */
static bool cache_take(fa_vm *v, uint32_t units, uint32_t *out)
{
    uint32_t *link = &v->cache[fa_ceil_log2(units)], *pick = NULL;
    for (int looked = 0; *link != FA_BUDDY_NIL && looked < 8; looked++) {
        uint32_t u = *link;
        if (v->small.u[u].units == units) {
            if (!pick)
                pick = link;
            if (v->gran_piece[gran_of(v, unit_addr(v, u))]) {
                pick = link;
                break;
            }
        }
        link = &v->small.u[u].next;
    }
    if (!pick)
        return false;
    uint32_t u = *pick;
    *pick = v->small.u[u].next;
    /* The next request of this size reads the new head: blocks cycle
     * through the whole pool between synchronisations, so it is rarely in
     * cache by then unless fetched now. */
    if (*pick != FA_BUDDY_NIL)
        __builtin_prefetch(&v->small.u[*pick]);
    v->cached -= fa_buddy_alloc_bytes(&v->small, u);
    *out = u;
    return true;
}

static void cache_flush(fa_vm *v)
{
    for (unsigned k = 0; k <= FA_BUDDY_MAX_ORDER && v->cached; k++)
        while (v->cache[k] != FA_BUDDY_NIL) {
            uint32_t u = v->cache[k];
            v->cache[k] = v->small.u[u].next;
            v->cached -= fa_buddy_alloc_bytes(&v->small, u);
            fa_buddy_free_unit(&v->small, u);
        }
}

/* Undo a small placement that could not be backed. */
static void unplace_small(fa_vm *v, uint32_t u, uintptr_t a, size_t taken, bool from_cache)
{
    small_change(v, a, taken, UNTAKE); /* what was mapped stays, idle */
    if (from_cache) {
        fa_buddy_hold(&v->small, u);
        cache_put(v, u);
    } else {
        fa_buddy_free_unit(&v->small, u);
    }
}

static fa_vm_result alloc_small(fa_vm *v, size_t n, bool may_create, const fa_vm_driver *drv, void *ctx,
                                uintptr_t *addr, unsigned *created)
{
    uintptr_t a;
    uint32_t u;
    uint32_t units = (uint32_t)((n + ((size_t)1 << FA_VM_UNIT_SHIFT) - 1) >> FA_VM_UNIT_SHIFT);
    bool from_cache = v->cached && cache_take(v, units, &u);
    if (from_cache) {
        fa_buddy_reuse(&v->small, u, n);
        a = unit_addr(v, u);
    } else {
        if (!fa_buddy_alloc_pref(&v->small, n, backed, v, &a)) {
            if (!v->cached)
                return FA_VM_NO_SPACE;
            cache_flush(v); /* sizes changed: merge the cache and look again */
            if (!fa_buddy_alloc_pref(&v->small, n, backed, v, &a))
                return FA_VM_NO_SPACE;
        }
        u = fa_buddy_find(&v->small, a);
    }
    size_t taken = fa_buddy_alloc_bytes(&v->small, u);
    small_change(v, a, taken, TAKE);
    uint32_t last = gran_of(v, a + taken - 1);
    for (uint32_t g = gran_of(v, a); g <= last;) {
        if (piece_at(v, g) != FA_VM_NIL) {
            g++; /* the common case: backed already */
            continue;
        }
        if (!drv) { /* ready memory only */
            unplace_small(v, u, a, taken, from_cache);
            return FA_VM_NO_MEMORY;
        }
        /* A run of unbacked granules: a piece for each, access once. */
        uint32_t run = g;
        bool ok = true;
        for (; g <= last && piece_at(v, g) == FA_VM_NIL; g++) {
            uint64_t h;
            if (!steal(v, drv, ctx, &h)) {
                if (!may_create || drv->create(ctx, FA_VM_GRANULE, &h) != 0) {
                    ok = false;
                    break;
                }
                v->created++;
                ++*created;
            }
            if (drv->map(ctx, gran_addr(v, g), FA_VM_GRANULE, h) != 0) {
                drv->release(ctx, h);
                ok = false;
                break;
            }
            piece_add(v, g, 1, h, true);
        }
        if (!finish_run(v, run, g, drv, ctx) || !ok) {
            unplace_small(v, u, a, taken, from_cache);
            return FA_VM_NO_MEMORY;
        }
    }
    v->in_use += taken;
    v->requested += n;
    *addr = a;
    return FA_VM_OK;
}

/* Large blocks: whole granules; gran[].use at the first holds slack + 1. */
static fa_vm_result alloc_large(fa_vm *v, size_t n, bool may_create, const fa_vm_driver *drv, void *ctx,
                                uintptr_t *addr, unsigned *created)
{
    if (n > SIZE_MAX - FA_VM_GRANULE)
        return FA_VM_NO_SPACE;
    size_t bytes = (n + FA_VM_GRANULE - 1) & ~(FA_VM_GRANULE - 1);
    uintptr_t a;
    if (!fa_buddy_alloc(&v->large, bytes, &a))
        return FA_VM_NO_SPACE;
    uint32_t g0 = gran_of(v, a), ng = (uint32_t)(bytes >> FA_VM_GRANULE_SHIFT);
    uint32_t i = exact_piece(v, g0, ng);
    if (i != FA_VM_NIL) {
        idle_unlink(v, i); /* a block of the same size was here: no driver call */
    } else if (!drv) {
        fa_buddy_free_unit(&v->large, fa_buddy_find(&v->large, a));
        return FA_VM_NO_MEMORY;
    } else {
        /* Idle pieces in the way (pieces here are whole blocks or idle) go. */
        bool ok = true;
        for (uint32_t g = g0; g < g0 + ng && ok;) {
            uint32_t q = piece_at(v, g);
            if (q == FA_VM_NIL) {
                g++;
                continue;
            }
            g = v->pieces[q].first + v->pieces[q].count;
            ok = piece_drop(v, q, drv, ctx, false);
        }
        uint64_t h = 0;
        bool made = ok && may_create && drv->create(ctx, bytes, &h) == 0;
        bool mapped = made && drv->map(ctx, a, bytes, h) == 0;
        bool access = mapped && drv->set_access(ctx, a, bytes) == 0;
        if (!access) {
            if (mapped)
                drv->unmap(ctx, a, bytes);
            if (made)
                drv->release(ctx, h);
            fa_buddy_free_unit(&v->large, fa_buddy_find(&v->large, a));
            return FA_VM_NO_MEMORY;
        }
        v->created++;
        ++*created;
        piece_add(v, g0, ng, h, true);
    }
    v->gran[g0].use = (uint32_t)(bytes - n) + 1;
    v->in_use += bytes;
    v->requested += n;
    *addr = a;
    return FA_VM_OK;
}

fa_vm_result fa_vm_alloc(fa_vm *v, size_t n, bool may_create, const fa_vm_driver *drv, void *ctx,
                         uintptr_t *addr, unsigned *created)
{
    *created = 0;
    if (n == 0)
        return FA_VM_NO_SPACE;
    return n < FA_VM_LARGE_MIN ? alloc_small(v, n, may_create, drv, ctx, addr, created)
                               : alloc_large(v, n, may_create, drv, ctx, addr, created);
}

/* ---- free and the quarantine ------------------------------------------------ */

fa_vm_free_result fa_vm_free(fa_vm *v, uintptr_t a, size_t *taken, size_t *requested)
{
    if (!fa_vm_contains(v, a))
        return FA_VM_NOT_OURS;
    int z = a - v->base >= v->zone;
    fa_buddy *b = z == LARGE ? &v->large : &v->small;
    uint32_t u = fa_buddy_find(b, a);
    if (u == FA_BUDDY_NIL)
        return FA_VM_BAD_POINTER;
    *taken = fa_buddy_alloc_bytes(b, u);
    *requested = z == LARGE ? *taken - (v->gran[gran_of(v, a)].use - 1) : fa_buddy_requested(b, u);
    fa_buddy_hold(b, u);
    if (z == SMALL)
        small_change(v, a, *taken, QUARANTINE);
    else
        v->reclaimable += *taken; /* its piece, exactly */
    b->u[u].next = FA_BUDDY_NIL;
    b->u[u].prev = v->epoch;
    if (v->q_tail[z] == FA_VM_NIL)
        v->q_head[z] = u;
    else
        b->u[v->q_tail[z]].next = u;
    v->q_tail[z] = u;
    v->in_use -= *taken;
    v->requested -= *requested;
    v->quarantined += *taken;
    v->quarantined_blocks++;
    return FA_VM_FREED;
}

uint32_t fa_vm_sync_begin(fa_vm *v) { return v->epoch++; }

uint64_t fa_vm_sync_end(fa_vm *v, uint32_t e)
{
    uint64_t released = 0;
    for (int z = SMALL; z <= LARGE; z++) {
        fa_buddy *b = z == LARGE ? &v->large : &v->small;
        /* Epochs grow along the list: stop at the first freed after e. */
        while (v->q_head[z] != FA_VM_NIL && (int32_t)(b->u[v->q_head[z]].prev - e) <= 0) {
            uint32_t u = v->q_head[z];
            v->q_head[z] = b->u[u].next;
            if (v->q_head[z] == FA_VM_NIL)
                v->q_tail[z] = FA_VM_NIL;
            else
                __builtin_prefetch(&b->u[v->q_head[z]]); /* fetched while this one is released */
            uintptr_t a = b->base + ((uintptr_t)u << b->min_shift);
            size_t bytes = fa_buddy_alloc_bytes(b, u);
            if (z == SMALL) {
                small_change(v, a, bytes, UNQUARANTINE);
                cache_put(v, u); /* whole, for the next request of its size */
            } else {
                fa_buddy_free_unit(b, u);
                uint32_t g0 = gran_of(v, a), i = exact_piece(v, g0, (uint32_t)(bytes >> FA_VM_GRANULE_SHIFT));
                v->gran[g0].use = 0;
                v->reclaimable -= bytes;
                if (i != FA_VM_NIL)
                    idle_push(v, i);
            }
            v->quarantined -= bytes;
            v->quarantined_blocks--;
            released += bytes;
        }
    }
    return released;
}

/* ---- giving pieces back ------------------------------------------------------- */

uint32_t fa_vm_release_idle(fa_vm *v, uint64_t keep, bool small_too, const fa_vm_driver *drv, void *ctx)
{
    uint32_t n = 0;
    while (v->mapped > keep) {
        uint32_t i = v->idle_head[LARGE] != FA_VM_NIL ? v->idle_head[LARGE] : small_too ? v->idle_head[SMALL] : FA_VM_NIL;
        if (i == FA_VM_NIL || !piece_drop(v, i, drv, ctx, false))
            break;
        n++;
    }
    return n;
}

int fa_vm_grant_all(fa_vm *v, const fa_vm_driver *drv, void *ctx)
{
    int failed = 0;
    for (uint32_t i = 0; i < v->slots_used; i++)
        if (v->pieces[i].count)
            failed += drv->set_access(ctx, gran_addr(v, v->pieces[i].first), (size_t)piece_bytes(&v->pieces[i])) != 0;
    return failed;
}

void fa_vm_release_all(fa_vm *v, const fa_vm_driver *drv, void *ctx)
{
    for (uint32_t i = 0; i < v->slots_used; i++)
        if (v->pieces[i].count)
            piece_drop(v, i, drv, ctx, true);
}

bool fa_vm_zone_quarantined(const fa_vm *v, size_t n) { return v->q_head[n >= FA_VM_LARGE_MIN] != FA_VM_NIL; }

size_t fa_vm_largest_free(const fa_vm *v)
{
    /* Cached blocks are not counted: conservative until they merge. */
    size_t s = fa_buddy_largest(&v->small), l = fa_buddy_largest(&v->large);
    return s > l ? s : l;
}

int fa_vm_check(const fa_vm *v)
{
    int problems = fa_buddy_check(&v->small) + fa_buddy_check(&v->large);
    uint64_t mapped = 0, idle = 0;
    uint32_t npieces = 0, nidle = 0;
    for (uint32_t i = 0; i < v->slots_used; i++) {
        const fa_vm_piece *p = &v->pieces[i];
        if (!p->count)
            continue;
        npieces++;
        mapped += piece_bytes(p);
        for (uint32_t g = p->first; g < p->first + p->count; g++)
            problems += piece_at(v, g) != i;
        bool unused = v->gran[p->first].use == 0; /* small: the granule; large: the block's start */
        problems += unused != p->idle;
        if (p->idle) {
            idle += piece_bytes(p);
            nidle++;
        }
    }
    problems += nidle != v->pieces_idle;
    for (int z = SMALL; z <= LARGE; z++) {
        uint32_t prev = FA_VM_NIL;
        for (uint32_t i = v->idle_head[z]; i != FA_VM_NIL; prev = i, i = v->pieces[i].next) {
            problems += !v->pieces[i].idle || v->pieces[i].prev != prev || zone_of_piece(v, &v->pieces[i]) != z;
            nidle--;
        }
        problems += v->idle_tail[z] != prev;
    }
    problems += mapped != v->mapped || idle != v->idle || npieces != v->pieces_mapped || nidle != 0;
    uint32_t queued = 0;
    for (int z = SMALL; z <= LARGE; z++) {
        const fa_buddy *b = z == LARGE ? &v->large : &v->small;
        for (uint32_t u = v->q_head[z]; u != FA_BUDDY_NIL && queued <= v->quarantined_blocks; u = b->u[u].next)
            queued++;
    }
    problems += queued != v->quarantined_blocks;
    /* What the next synchronisation makes idle, counted afresh. */
    uint64_t reclaimable = 0;
    for (uint32_t g = 0; g < v->ngran / 2; g++) {
        problems += v->gran[g].quar > v->gran[g].use;
        reclaimable += whole_quarantine(&v->gran[g]) ? FA_VM_GRANULE : 0;
    }
    uint32_t walked = 0;
    for (uint32_t u = v->q_head[LARGE]; u != FA_BUDDY_NIL && walked++ <= v->quarantined_blocks; u = v->large.u[u].next)
        reclaimable += fa_buddy_alloc_bytes(&v->large, u);
    problems += reclaimable != v->reclaimable;
    return problems;
}
