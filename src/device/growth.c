/* growth.c - grow before waiting, give back what was grown.  When ready
 * memory cannot serve, idle pieces are moved and new ones created while the
 * driver has room (unless a sync is the cheaper way); what was grown beyond
 * FORGEALLOC_DEVICE_POOL_SIZE goes back after an idle spell (from the
 * process's background thread) and at once when the driver runs short.
 * The chunk pool grows only back to its size (chunks it gave back), then
 * waits: it has no way to give back growth but a whole idle chunk's
 * synchronising cudaFree, and never holds more than its size. */
#include "devstate.h"
#include "device.h"

#define IDLE_SPELL_MS 10000 /* grown pieces go back after this long without growth */

/* Some pool may have something to give back (it grew beyond its size, or
 * a free left idle what it grew): the background thread looks. */
static int background_wanted;
static bool (*waker)(void);

/* Ask the background thread to look.  Where none can run now, nothing
 * stays asked: the next growth or free asks again (and with it the
 * thread's start is tried again). */
static void want_background(void)
{
    if (__atomic_load_n(&background_wanted, __ATOMIC_ACQUIRE) ||
        __atomic_exchange_n(&background_wanted, 1, __ATOMIC_ACQ_REL))
        return;
    bool (*w)(void) = __atomic_load_n(&waker, __ATOMIC_ACQUIRE);
    if (w && !w())
        __atomic_store_n(&background_wanted, 0, __ATOMIC_RELEASE);
}

void fa_grow_freed(void) { want_background(); }

void fa_device_set_waker(bool (*wake)(void)) { __atomic_store_n(&waker, wake, __ATOMIC_RELEASE); }

/* Pre: d->lock held, d a ready piece pool.  One try at n bytes: calls says
 * whether driver calls are allowed (idle pieces moved), create whether new
 * pieces may be made too; what creating and moving pieces took is counted
 * (grow_ns, piece_ns). */
static fa_vm_result vm_try(devstate *d, int dev, size_t n, bool calls, bool create, void **out)
{
    fa_vmctx x = {calls ? fa_cudrv_get(fa_cudart_get()) : NULL, d, dev};
    uintptr_t a = 0;
    unsigned created = 0;
    uint64_t stolen = d->vm.stolen, t0 = calls ? fa_dev_now_ns() : 0;
    fa_vm_result r = fa_vm_alloc(&d->vm, n, create, calls && x.drv ? &fa_pieces_driver : NULL, &x, &a, &created);
    uint64_t moved = d->vm.stolen - stolen;
    ST_ADD(d, pieces_reused, moved);
    if (created + moved) {
        uint64_t spent = fa_dev_now_ns() - t0, each = spent / (created + moved);
        d->grow_ns += spent;
        d->piece_ns = d->retime ? each : fa_dev_follow(d->piece_ns, each);
        d->retime = false;
        d->synced_ns = 0;
    }
    if (created && d->vm.mapped > d->target) {
        ST_ADD(d, pieces_grown, created);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        d->last_grow_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
        want_background();
    }
    if (r == FA_VM_OK) {
        ST_ADD(d, pool_allocs, 1);
        *out = (void *)a;
    }
    return r;
}

uint32_t fa_grow_release_idle(devstate *d, int dev, uint64_t keep, bool small_too)
{
    fa_vmctx x = {fa_cudrv_get(fa_cudart_get()), d, dev};
    return x.drv ? fa_vm_release_idle(&d->vm, keep, small_too, &fa_pieces_driver, &x) : 0;
}

/* What a sync is taken to cost before one was timed: about a kernel's
 * worth of queued work. */
#define SYNC_GUESS_NS 1000000u

/* Syncs chosen over growing, in growths at the estimated price, after
 * which the pool grows once to time pieces again (sync_pays). */
#define RETIME_GROWTHS 4u

/* Pre: d->lock held.  Whether to synchronise (making the quarantined
 * blocks reusable) rather than grow for n bytes.  Growing maps pieces,
 * tens of microseconds each on a GPU (cuMemCreate, cuMemMap and
 * cuMemSetAccess); a sync waits for the queued work: microseconds on an
 * idle device, milliseconds behind a kernel.  The pool grows while what
 * growing cost since the last sync, this request included, stays below
 * what syncs cost lately, then syncs: never more than about twice the
 * cheaper way, an idle device reuses the blocks it freed instead of
 * taking the whole device, and a busy one grows a bounded amount between
 * syncs.  Nothing to go on (no piece grown yet): grow.
 *
 * Pieces are timed only when the pool grows, so an estimate that came out
 * high (the first pieces paid the driver's one-time set-up, or the thread
 * was descheduled while they were timed) would have the pool sync from
 * then on, behind every kernel.  Once the syncs made since pieces were last
 * timed have cost RETIME_GROWTHS growths at the estimated price, the pool
 * grows once instead and that growth's timing replaces the estimate: where
 * the estimate was right, that costs at most 1/RETIME_GROWTHS more than
 * syncing alone (and the memory grown serves the requests after it). */
static bool sync_pays(devstate *d, size_t n)
{
    if (d->vm.quarantined < n || !d->piece_ns)
        return false;
    /* A large block is one piece of its own size, which costs about what a
     * 2 MiB piece does; a smaller one takes a piece per 2 MiB granule. */
    uint64_t pieces = n > FA_VM_GRANULE && n < FA_VM_LARGE_MIN ? (n + FA_VM_GRANULE - 1) / FA_VM_GRANULE : 1;
    uint64_t growth = pieces * d->piece_ns;
    if (d->synced_ns >= RETIME_GROWTHS * growth) {
        /* One try per RETIME_GROWTHS: where the driver has no room for it,
         * the requests after it sync at once again. */
        d->synced_ns = 0;
        d->retime = true;
        return false;
    }
    return d->grow_ns + growth >= (d->sync_ns ? d->sync_ns : SYNC_GUESS_NS);
}

/* Pre: d->lock held, no capture under way.  Whether growing by n would
 * leave the driver less room than the quarantine holds.  A capture forbids
 * the sync that frees the quarantine: what it can have then is the idle
 * pieces and the driver's room.  However dear syncs are (a long kernel
 * queued), the pool syncs before its quarantine outgrows that room, so a
 * capture begun at any moment finds at least as much memory as the
 * quarantine keeps from it, and other processes on the device are left
 * room.  False when the driver cannot say. */
static bool quarantine_crowds(const fa_cudart *rt, const devstate *d, size_t n)
{
    return d->vm.quarantined >= n && fa_meminfo_beyond(rt, d->vm.quarantined + n, d->vm.idle);
}

/* Ready memory, else (when a sync is the cheaper way: sync_pays, or the
 * quarantine would outgrow the driver's room: quarantine_crowds) the
 * quarantined blocks after a synchronisation, else idle pieces moved and
 * new ones created, else every idle piece released and created again (the
 * driver ran short), else the same after a synchronisation.
 *  - During a stream capture: ready memory and idle pieces moved only (the
 *    virtual-memory calls neither are refused nor invalidate a capture, in
 *    any mode and from any thread, on an H200 with CUDA 13.0), no sync.
 *    Pieces created then would wait in quarantine until the capture ends,
 *    while a block from the driver goes back at its cudaFree: the driver
 *    serves, and gets the idle pieces when it runs short (room.c).
 *  - Out of address space (no place for the block, however much memory):
 *    releasing idle pieces does not help, a sync only where freed blocks
 *    hold address space of the block's zone. */
bool fa_grow_vm_alloc(const fa_cudart *rt, devstate *d, int dev, size_t n, void **out)
{
    bool waited = false;    /* the sync chosen over growing was made */
    bool last_sync = false; /* the sync made when nothing else served */
    fa_pieces_bind(rt, dev);
    for (;;) {
        bool syncs = !fa_capturing();
        pthread_mutex_lock(&d->lock);
        if (d->state != READY || d->kind != KIND_VMM) {
            pthread_mutex_unlock(&d->lock);
            return false;
        }
        fa_vm_result r = vm_try(d, dev, n, false, false, out); /* ready memory: no driver call */
        bool wait = r == FA_VM_NO_MEMORY && syncs && !waited && (sync_pays(d, n) || quarantine_crowds(rt, d, n));
        bool hopeless = false;
        if (r == FA_VM_NO_MEMORY && !wait) {
            r = vm_try(d, dev, n, true, syncs, out);
            hopeless = r == FA_VM_NO_MEMORY && fa_meminfo_beyond(rt, n, fa_meminfo_reach(d));
            if (r == FA_VM_NO_MEMORY && !hopeless && syncs) {
                /* A small block moves idle 2 MiB pieces itself; releasing
                 * them helps only a large one, or once freed blocks are back. */
                uint32_t released = fa_grow_release_idle(d, dev, 0, n >= FA_VM_LARGE_MIN || last_sync);
                ST_ADD(d, pieces_released, released);
                if (released)
                    r = vm_try(d, dev, n, true, true, out);
            }
        }
        bool quarantined = r == FA_VM_NO_SPACE ? fa_vm_zone_quarantined(&d->vm, n) : d->vm.quarantined > 0 && !hopeless;
        fa_dev_sync_stats(d);
        pthread_mutex_unlock(&d->lock);
        if (r == FA_VM_OK)
            return true;
        if (wait) {
            waited = true; /* whatever it gave, growing comes next */
            fa_quar_sync(rt, d, dev);
            continue;
        }
        if (!syncs || !quarantined || last_sync || !fa_quar_sync(rt, d, dev))
            return false;
        last_sync = true;
    }
}

/* A chunk given back (gone already after a reset, which is no error), in
 * relaxed capture mode: a cudaFree of the pool's own is never refused for
 * a capture under way, nor invalidates it.  The chunk holds nothing live
 * or quarantined: no queued work can touch it. */
static void chunk_free(const fa_cudart *rt, devstate *d, void *p)
{
    fa_cuda_error before = fa_err_peek(rt);
    fa_cudart_mode mode = fa_cudart_relax(rt);
    fa_dev_drv_free(rt, d, p, NULL, NULL);
    fa_cudart_unrelax(rt, mode);
    fa_err_absorb(rt, before);
}

bool fa_grow_chunk(const fa_cudart *rt, devstate *d)
{
    pthread_mutex_lock(&d->lock);
    bool may = d->state == READY && d->kind == KIND_CHUNKS && d->pool.bytes < d->target;
    size_t chunk = d->pool.chunk_size;
    unsigned generation = d->generation;
    pthread_mutex_unlock(&d->lock);
    if (!may)
        return false;
    void *p = NULL;
    fa_cuda_error before = fa_err_peek(rt);
    fa_cudart_mode mode = fa_cudart_relax(rt); /* as chunk_free */
    fa_cuda_error r = fa_dev_drv_malloc(rt, d, &p, chunk);
    fa_cudart_unrelax(rt, mode);
    if (r != 0) {
        fa_err_absorb(rt, before);
        return false;
    }
    /* A reset while the driver was asked (and perhaps a new pool since)
     * freed p or made it another pool's: only the same pool takes it. */
    pthread_mutex_lock(&d->lock);
    bool same = d->generation == generation && d->state == READY && d->kind == KIND_CHUNKS;
    bool ok = same && fa_pool_add_chunk(&d->pool, (uintptr_t)p);
    fa_dev_sync_stats(d);
    pthread_mutex_unlock(&d->lock);
    if (!ok)
        chunk_free(rt, d, p);
    return ok;
}

bool fa_grow_give_back(const fa_cudart *rt, devstate *d, int dev)
{
    uintptr_t base;
    pthread_mutex_lock(&d->lock);
    bool chunk = false, any = false;
    if (d->state == READY && d->kind == KIND_CHUNKS && fa_pool_take_idle_chunk(&d->pool, &base)) {
        ST_ADD(d, chunks_returned, 1);
        chunk = any = true;
    } else if (d->state == READY && d->kind == KIND_VMM) {
        uint32_t released = fa_grow_release_idle(d, dev, 0, true);
        ST_ADD(d, pieces_released, released);
        any = released > 0;
    }
    fa_dev_sync_stats(d);
    pthread_mutex_unlock(&d->lock);
    if (chunk)
        chunk_free(rt, d, (void *)base);
    return any;
}

/* ---- giving back what was grown, from the background thread ------------------------- */

bool fa_device_background_wanted(void) { return __atomic_load_n(&background_wanted, __ATOMIC_ACQUIRE); }

/* While a capture keeps the pool from the sync that frees its
 * quarantine, it looks again this often. */
#define CAPTURE_RETRY_MS 1000

static uint64_t earliest(uint64_t a, uint64_t b) { return !a ? b : !b ? a : a < b ? a : b; }

/* Per pool: what it grew beyond its size and holds idle goes back once no
 * growth happened for IDLE_SPELL_MS, and what a sync would make idle after
 * that sync.  Nothing of the kind (the live blocks are above the pool's
 * size, say): nothing is due, and the thread sleeps until a free or a
 * growth asks again. */
uint64_t fa_device_background(uint64_t now_ms)
{
    if (!__atomic_exchange_n(&background_wanted, 0, __ATOMIC_ACQ_REL))
        return 0;
    const fa_cudart *rt = fa_cudart_get();
    uint64_t due = 0;
    int cur = -1;
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &fa_devs[dev];
        if (fa_dev_state(d) != READY || fa_dev_kind(d) != KIND_VMM)
            continue;
        for (int round = 0; round < 2; round++) {
            pthread_mutex_lock(&d->lock);
            bool ready = d->state == READY && d->kind == KIND_VMM;
            bool excess = ready && d->vm.mapped > d->target && (d->vm.idle || d->vm.reclaimable);
            uint64_t at = d->last_grow_ms + IDLE_SPELL_MS;
            bool waiting = excess && now_ms < at;
            if (waiting)
                due = earliest(due, at);
            if (excess && !waiting) {
                /* The driver calls need the device's context on this thread. */
                if (cur < 0)
                    cur = fa_dev_thread_device(rt);
                fa_cuda_error before = fa_err_peek(rt);
                if (rt->cudaSetDevice && rt->cudaSetDevice(dev) != 0)
                    fa_err_absorb(rt, before);
                ST_ADD(d, pieces_given_back, fa_grow_release_idle(d, dev, d->target, true));
                fa_dev_sync_stats(d);
            }
            /* Freed blocks keep their pieces until the device caught up. */
            bool sync = excess && !waiting && d->vm.mapped > d->target && d->vm.reclaimable;
            pthread_mutex_unlock(&d->lock);
            if (!sync || round == 1)
                break;
            if (!fa_quar_sync(rt, d, dev)) {
                if (fa_capturing()) /* no sync during a capture: look again after it */
                    due = earliest(due, now_ms + CAPTURE_RETRY_MS);
                break;
            }
        }
    }
    if (cur >= 0 && rt->cudaSetDevice)
        rt->cudaSetDevice(cur); /* the thread's device as it was */
    if (due)
        __atomic_store_n(&background_wanted, 1, __ATOMIC_RELEASE);
    return due;
}

void fa_grow_fork_child(void) { background_wanted = 0; }
