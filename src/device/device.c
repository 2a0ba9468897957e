/* device.c - cudaMalloc and cudaFree served from a pool per GPU.
 *
 * Where the driver supports virtual-memory management the pool is made of
 * 2 MiB physical pieces (cuMemCreate) mapped into address space reserved
 * once per device (vmpool.c decides which, pieces.c makes the calls);
 * elsewhere, of chunks taken with cudaMalloc (pool.c).  The rules that keep
 * it as safe as the driver, each kept in one file:
 *  - quarantine.c: a freed block is quarantined until a device
 *    synchronisation that began after the free; pieces are unmapped and
 *    released only once idle, after that synchronisation;
 *  - growth.c: grow before waiting; what was grown beyond
 *    FORGEALLOC_DEVICE_POOL_SIZE goes back after an idle spell;
 *  - capture.c: no synchronisation of the pool's while a stream capture is
 *    in progress, and a capture begins only after the pool's syncs under
 *    way have returned; its other calls cannot invalidate one;
 *  - errors.c: a free the runtime would refuse is refused alike, and the
 *    pool's failed internal calls leave the thread's last error as the
 *    program left it;
 *  - room.c: when the driver runs out of memory, idle pieces or chunks go
 *    back to it and the request is retried; the final error is the
 *    driver's own;
 *  - meminfo.c: cudaMemGetInfo counts as free what the pool would give
 *    back to the driver, never free space a live block pins.
 * This file holds the table of devices, the entry points and the pool's
 * own setting up (reservation, reset, fork).
 * Locks: one per device (its pool and numbers), one for the map of
 * driver-served blocks; never both, never across a synchronisation. */
#define _GNU_SOURCE
#include "device.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/log.h"
#include "../core/options.h"
#include "devstate.h"

#define RESERVE_WAIT_S 2 /* the longest a first call waits for another thread's reservation */

devstate fa_devs[FA_MAX_DEVICES] = {
    [0 ... FA_MAX_DEVICES - 1] = {.lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP, .settled = PTHREAD_COND_INITIALIZER}};
static fa_ptrmap fallback;
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER; /* fallback */
static uint64_t passthrough[FA_PT_COUNT];
static int cuda_seen;
static int warned_missing, warned_ipc, warned_chunk;

void fa_dev_sync_stats(devstate *d)
{
    uint64_t bytes, taken, requested, quarantined;
    if (d->kind == KIND_VMM) {
        const fa_vm *v = &d->vm;
        bytes = v->mapped, taken = v->in_use, requested = v->requested, quarantined = v->quarantined;
        ST_SET(d, pieces_mapped, v->pieces_mapped);
        ST_SET(d, pieces_idle, v->pieces_idle);
        ST_SET(d, idle_bytes, v->idle);
        ST_SET(d, largest_free_bytes, v->zone ? fa_vm_largest_free(v) : 0);
    } else {
        const fa_pool *p = &d->pool;
        bytes = p->bytes, taken = p->in_use, requested = p->requested, quarantined = p->quarantined;
        ST_SET(d, pool_chunks, (uint64_t)p->nchunks);
        ST_SET(d, idle_bytes, fa_pool_idle(p));
    }
    uint64_t in_use = requested + d->fallback_bytes;
    uint64_t waste = taken - requested;
    ST_SET(d, vmm, d->kind == KIND_VMM);
    ST_SET(d, pool_bytes, bytes);
    ST_SET(d, in_use_bytes, in_use);
    ST_SET(d, pool_in_use_bytes, taken);
    ST_SET(d, requested_bytes, requested);
    ST_SET(d, quarantine_bytes, quarantined);
    ST_SET(d, waste_bytes, waste);
    if (in_use > d->st.peak_in_use_bytes)
        ST_SET(d, peak_in_use_bytes, in_use);
    if (waste > d->st.peak_waste_bytes)
        ST_SET(d, peak_waste_bytes, waste);
}

/* ---- the runtime ---------------------------------------------------------------- */

const struct fa_cudart *fa_device_runtime(const char *fn)
{
    if (!__atomic_load_n(&cuda_seen, __ATOMIC_RELAXED))
        __atomic_store_n(&cuda_seen, 1, __ATOMIC_RELAXED);
    const fa_cudart *rt = fa_cudart_get();
    if (!rt->cudaMalloc && !__atomic_exchange_n(&warned_missing, 1, __ATOMIC_RELAXED))
        fa_error("%s was called but no CUDA runtime (libcudart) is loaded in this process; such calls fail with "
                 "cudaErrorInitializationError",
                 fn);
    return rt;
}

fa_cuda_error fa_dev_drv_malloc(const fa_cudart *rt, devstate *d, void **p, size_t n)
{
    uint64_t t0 = fa_dev_now_ns();
    fa_cuda_error r = rt->cudaMalloc(p, n);
    ST_ADD(d, driver_ns, fa_dev_now_ns() - t0);
    ST_ADD(d, driver_malloc_calls, 1);
    return r;
}

fa_cuda_error fa_dev_drv_free(const fa_cudart *rt, devstate *d, void *p, fa_cuda_error (*async)(void *, fa_cuda_stream),
                              fa_cuda_stream s)
{
    uint64_t t0 = fa_dev_now_ns();
    fa_cuda_error r = async ? async(p, s) : rt->cudaFree(p);
    ST_ADD(d, driver_ns, fa_dev_now_ns() - t0);
    ST_ADD(d, driver_free_calls, 1);
    return r;
}

int fa_dev_thread_device(const fa_cudart *rt)
{
    int dev = -1;
    if (!rt->cudaGetDevice || rt->cudaGetDevice(&dev) != 0)
        return -1;
    return dev;
}

int fa_dev_current_device(const fa_cudart *rt)
{
    int dev = -1;
    if (!rt->cudaGetDevice || rt->cudaGetDevice(&dev) != 0 || dev < 0 || dev >= FA_MAX_DEVICES)
        return -1;
    return dev;
}

/* The device stream s belongs to (-1 if unknown), asked while s exists (a
 * cudaDeviceReset destroys the streams of one device) and before its
 * capture begins: asking a capturing stream invalidates its capture (seen
 * on CUDA 13.0).  The runtime says where it can (cudaStreamGetDevice, CUDA
 * 12.8 and later); else the thread's device, which is that of NULL and the
 * per-thread stream, and of a created stream when it is captured with its
 * device current, as programs do (work is launched into it there). */
int fa_dev_stream_device(const fa_cudart *rt, fa_cuda_stream s)
{
    int dev = -1;
    fa_cuda_error before = fa_err_peek(rt);
    if (!rt->cudaStreamGetDevice || rt->cudaStreamGetDevice(s, &dev) != 0)
        dev = fa_dev_thread_device(rt);
    fa_err_absorb(rt, before);
    return dev;
}

int fa_dev_pool_device(const fa_cudart *rt)
{
    int dev = fa_dev_current_device(rt);
    return dev >= 0 && fa_dev_state(&fa_devs[dev]) == READY ? dev : -1;
}

bool fa_dev_track(void *p, int dev, size_t n)
{
    pthread_mutex_lock(&map_lock);
    bool ok = fa_ptrmap_put(&fallback, (uintptr_t)p, dev, n);
    pthread_mutex_unlock(&map_lock);
    return ok;
}

/* ---- the pool's size ---------------------------------------------------------- */

static size_t chunk_bytes(void)
{
    uint64_t c = fa_opt_u64(FA_OPT_DEVICE_CHUNK_SIZE);
    const uint64_t dflt = 64ull << 20;
    if (c >= (1u << 20) && c <= (1ull << 40) && (c & (c - 1)) == 0)
        return (size_t)c;
    if (!__atomic_exchange_n(&warned_chunk, 1, __ATOMIC_RELAXED))
        fa_warn("FORGEALLOC_DEVICE_CHUNK_SIZE must be a power of two from 1M to 1T; using 64 MiB");
    return (size_t)dflt;
}

static uint64_t pool_target(const fa_cudart *rt)
{
    const fa_optval *v = fa_opt(FA_OPT_DEVICE_POOL_SIZE);
    if (!v->is_pct)
        return v->u;
    size_t f = 0, t = 0;
    fa_cuda_error before = fa_err_peek(rt);
    if (!rt->cudaMemGetInfo || rt->cudaMemGetInfo(&f, &t) != 0) {
        fa_err_absorb(rt, before);
        return 0;
    }
    return (uint64_t)((double)t * v->d / 100.0);
}

/* Reserve the chunks of a chunk pool: false if none could be had. */
static bool chunks_reserve(const fa_cudart *rt, devstate *d, int dev, uint64_t target)
{
    size_t chunk = chunk_bytes();
    while (chunk > target && chunk > (1u << 20))
        chunk >>= 1;
    size_t want = chunk && target >= chunk ? (size_t)(target / chunk) : 0;
    if (want > FA_POOL_MAX_CHUNKS)
        want = FA_POOL_MAX_CHUNKS;
    void **got = want ? calloc(want, sizeof *got) : NULL;
    size_t n = 0;
    fa_cuda_error before = fa_err_peek(rt);
    fa_cudart_mode mode = fa_cudart_relax(rt); /* the pool's own calls: never a capture's concern */
    while (got && n < want) {
        if (fa_dev_drv_malloc(rt, d, &got[n], chunk) != 0) {
            fa_err_absorb(rt, before); /* the driver has less than the pool wants */
            break;
        }
        n++;
    }
    pthread_mutex_lock(&d->lock);
    fa_pool_init(&d->pool, chunk);
    d->target = (uint64_t)want * chunk;
    size_t added = 0;
    for (size_t i = 0; i < n; i++) {
        if (fa_pool_add_chunk(&d->pool, (uintptr_t)got[i]))
            added++;
        else
            fa_dev_drv_free(rt, d, got[i], NULL, NULL);
    }
    pthread_mutex_unlock(&d->lock);
    fa_cudart_unrelax(rt, mode);
    fa_err_absorb(rt, before);
    free(got);
    if (want)
        fa_info("device %d: pool of %zu MiB in %zu chunks (%zu MiB wanted)", dev, added * (chunk >> 20), added,
                want * (chunk >> 20));
    return added > 0;
}

/* Set up the pool of device `dev` if it is still untouched.  Driver calls
 * are made without the lock; meanwhile other threads use the driver, and a
 * cudaDeviceReset waits for the pool to be READY (fa_device_reset). */
static void ensure_pool(const fa_cudart *rt, devstate *d, int dev)
{
    int st = fa_dev_state(d);
    if (st == READY || st == PASSTHROUGH)
        return;
    pthread_mutex_lock(&d->lock);
    if (d->state == RESERVING && !fa_capturing()) {
        /* Another thread's first call is reserving (the context is being
         * made, a second or more on a GPU): wait for the pool instead of
         * going to the driver, as its own calls would wait for the context.
         * Bounded: the reserving thread may need the loader lock that this
         * thread holds (a cudaMalloc in a library constructor). */
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += RESERVE_WAIT_S;
        while (d->state == RESERVING &&
               pthread_cond_clockwait(&d->settled, &d->lock, CLOCK_MONOTONIC, &until) != ETIMEDOUT)
            ;
    }
    if (d->state != UNTOUCHED || fa_capturing()) { /* during a capture: try again later */
        pthread_mutex_unlock(&d->lock);
        return;
    }
    __atomic_store_n(&d->state, RESERVING, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&d->lock);

    uint64_t target = fa_blind() ? 0 : pool_target(rt);
    int kind = KIND_NONE;
    if (target && fa_pieces_reserve(rt, d, dev))
        kind = KIND_VMM;
    else if (target && chunks_reserve(rt, d, dev, target))
        kind = KIND_CHUNKS;
    fa_cuda_stream probe = NULL; /* for asking about a sticky error (errors.c) */
    if (kind != KIND_NONE && rt->cudaStreamCreateWithFlags) {
        fa_cuda_error before = fa_err_peek(rt);
        if (rt->cudaStreamCreateWithFlags(&probe, FA_CUDA_STREAM_NON_BLOCKING) != 0)
            probe = NULL;
        fa_err_absorb(rt, before);
    }
    pthread_mutex_lock(&d->lock);
    d->probe = probe;
    __atomic_store_n(&d->sticky, 0, __ATOMIC_RELAXED);
    if (kind == KIND_VMM) {
        d->target = target;
        __atomic_store_n(&d->vm_bytes, 2 * d->vm.zone, __ATOMIC_RELEASE);
        __atomic_store_n(&d->vm_base, d->vm.base, __ATOMIC_RELEASE);
    }
    d->covered = 0; /* no device covered the new pool's quarantine yet */
    __atomic_store_n(&d->reach_async, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&d->kind, kind, __ATOMIC_RELEASE);
    __atomic_store_n(&d->state, kind != KIND_NONE ? READY : PASSTHROUGH, __ATOMIC_RELEASE);
    fa_dev_sync_stats(d);
    pthread_cond_broadcast(&d->settled);
    pthread_mutex_unlock(&d->lock);
}


/* ---- allocation ------------------------------------------------------------------ */

bool fa_dev_pool_alloc(devstate *d, int dev, size_t n, void **out)
{
    (void)dev;
    uintptr_t a;
    unsigned created;
    pthread_mutex_lock(&d->lock);
    bool ok = d->state == READY &&
              (d->kind == KIND_VMM ? fa_vm_alloc(&d->vm, n, false, NULL, NULL, &a, &created) == FA_VM_OK
                                   : d->kind == KIND_CHUNKS && fa_pool_alloc(&d->pool, n, &a));
    if (ok) {
        ST_ADD(d, pool_allocs, 1);
        *out = (void *)a;
        fa_dev_sync_stats(d);
    }
    pthread_mutex_unlock(&d->lock);
    return ok;
}

fa_cuda_error fa_device_malloc(void **out, size_t n)
{
    const fa_cudart *rt = fa_device_runtime("cudaMalloc");
    if (!rt->cudaMalloc)
        return FA_CUDA_ERROR_INITIALIZATION;
    int dev = fa_dev_current_device(rt);
    if (!out || dev < 0)
        return rt->cudaMalloc(out, n); /* nothing we could do better: the driver answers */
    devstate *d = &fa_devs[dev];
    if (!__atomic_load_n(&d->used, __ATOMIC_RELAXED))
        __atomic_store_n(&d->used, 1, __ATOMIC_RELAXED);
    bool captured = fa_capturing(); /* as the call entered */
    if (n > 0 && fa_capture_may_serve(rt)) {
        ensure_pool(rt, d, dev);
        int kind = fa_dev_state(d) == READY ? fa_dev_kind(d) : KIND_NONE;
        fa_cuda_error sticky = kind != KIND_NONE ? fa_err_sticky(rt, d) : 0;
        if (sticky) { /* the runtime's cudaMalloc returns it and sets it as the last error */
            ST_ADD(d, failed_allocs, 1);
            fa_err_raise_sticky(rt, d);
            return sticky;
        }
        /* Ready memory first, the common case: no driver call. */
        if (kind == KIND_VMM && (fa_dev_pool_alloc(d, dev, n, out) || fa_grow_vm_alloc(rt, d, dev, n, out)))
            return 0;
        /* The chunk pool grows back to its size (chunks it gave back)
         * before it waits for its freed blocks.  Beyond its size it waits:
         * a block from the driver would cost a synchronising cudaFree each. */
        if (kind == KIND_CHUNKS && n <= __atomic_load_n(&d->pool.chunk_size, __ATOMIC_ACQUIRE) &&
            (fa_dev_pool_alloc(d, dev, n, out) || (fa_grow_chunk(rt, d) && fa_dev_pool_alloc(d, dev, n, out)) ||
             (fa_quar_sync(rt, d, dev) && fa_dev_pool_alloc(d, dev, n, out))))
            return 0;
    }
    return fa_room_driver_alloc(rt, d, dev, out, n, !captured && fa_capturing());
}

/* ---- free -------------------------------------------------------------------------- */

/* The owning pool's context has a sticky error: nothing is freed. */
#define POOL_STICKY 3

/* Quarantine p if a pool owns it: FA_VM_FREED / FA_VM_BAD_POINTER,
 * POOL_STICKY (*owner: the pool's device), or FA_VM_NOT_OURS.  from: the
 * device of the stream a cudaFreeAsync named (-1: cudaFree), which the
 * quarantine then waits for too.  *full: the device whose quarantine
 * reached FA_QUARANTINE_MAX_BLOCKS with this free, and no sync for it is
 * under way (-1: none); the caller syncs it, then calls
 * fa_quar_bound_done. */
static int pool_free(uintptr_t p, int from, int *full, int *owner)
{
    *full = -1;
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &fa_devs[dev];
        if (fa_dev_state(d) != READY)
            continue;
        int kind = fa_dev_kind(d);
        if (kind == KIND_VMM && p - __atomic_load_n(&d->vm_base, __ATOMIC_ACQUIRE) >=
                                    __atomic_load_n(&d->vm_bytes, __ATOMIC_ACQUIRE))
            continue; /* a range check, no lock: cudaFree costs the same with many devices */
        size_t taken, requested;
        int res = FA_VM_NOT_OURS;
        bool ask = false; /* the background has something to give back */
        pthread_mutex_lock(&d->lock);
        if (__atomic_load_n(&d->sticky, __ATOMIC_RELAXED) && d->state == READY &&
            (d->kind == KIND_VMM ? fa_vm_contains(&d->vm, p) : fa_pool_owns(&d->pool, p))) {
            res = POOL_STICKY;
            *owner = dev;
        } else if (d->state == READY && d->kind == KIND_VMM) {
            res = fa_vm_free(&d->vm, p, &taken, &requested);
            uint32_t q = d->vm.quarantined_blocks;
            if (res == FA_VM_FREED && q >= FA_QUARANTINE_MAX_BLOCKS && q >= d->bound_retry && !d->bound_sync) {
                d->bound_sync = true;
                *full = dev;
            }
            ask = res == FA_VM_FREED && d->vm.mapped > d->target && d->vm.reclaimable;
        } else if (d->state == READY && d->kind == KIND_CHUNKS) {
            fa_pool_free_result c = fa_pool_free(&d->pool, p, &taken, &requested);
            res = c == FA_POOL_FREED ? FA_VM_FREED : c == FA_POOL_NOT_OURS ? FA_VM_NOT_OURS : FA_VM_BAD_POINTER;
        }
        if (res == FA_VM_FREED) {
            if (from >= 0 && from != dev)
                fa_quar_reach_add(d, from);
            ST_ADD(d, frees, 1);
            fa_dev_sync_stats(d);
        }
        pthread_mutex_unlock(&d->lock);
        if (ask)
            fa_grow_freed();
        if (res != FA_VM_NOT_OURS)
            return res;
    }
    return FA_VM_NOT_OURS;
}

/* Whether p lies inside some device's pool (a block of it or not). */
static bool in_a_pool(uintptr_t p)
{
    bool pooled = false;
    for (int dev = 0; dev < FA_MAX_DEVICES && !pooled; dev++) {
        devstate *d = &fa_devs[dev];
        if (fa_dev_state(d) != READY)
            continue;
        pthread_mutex_lock(&d->lock);
        pooled = d->state == READY && (d->kind == KIND_VMM ? fa_vm_contains(&d->vm, p) : fa_pool_owns(&d->pool, p));
        pthread_mutex_unlock(&d->lock);
    }
    return pooled;
}

/* cudaFree (async NULL) or cudaFreeAsync of p (not NULL).  A pool block
 * waits in quarantine until the next synchronisation of the devices that
 * reach it, which covers the work any stream queued before the free, so
 * both are served alike (a cudaFreeAsync once its stream passed
 * fa_err_async_free_refused, its stream's device then among those, a
 * cudaFree during a capture once it passed fa_err_free_refused). */
static fa_cuda_error free_block(const fa_cudart *rt, void *p, fa_cuda_error (*async)(void *, fa_cuda_stream),
                                fa_cuda_stream s)
{
    int from = -1; /* the freeing stream's device */
    if (async && in_a_pool((uintptr_t)p)) {
        bool ptsz = async == rt->cudaFreeAsync_ptsz;
        fa_cuda_error r = fa_err_async_free_refused(rt, s, ptsz);
        if (r != 0)
            return r;
        from = fa_dev_stream_device(rt, ptsz && !s ? FA_CUDA_STREAM_PER_THREAD : s);
    } else if (!async && fa_capturing() && in_a_pool((uintptr_t)p)) {
        fa_cuda_error r = fa_err_free_refused(rt);
        if (r != 0)
            return r;
    }
    int full, owner = -1;
    int res = pool_free((uintptr_t)p, from, &full, &owner);
    if (full >= 0) /* leaves no error behind, succeeds or not */
        fa_quar_bound_done(&fa_devs[full], fa_quar_sync(rt, &fa_devs[full], full));
    if (res == POOL_STICKY) { /* the runtime's cudaFree returns it and leaves it as the last error */
        fa_err_raise_sticky(rt, &fa_devs[owner]);
        return __atomic_load_n(&fa_devs[owner].sticky, __ATOMIC_RELAXED);
    }
    /* Inside the pool but not a live block: the driver must never see it,
     * it would free a chunk or refuse. */
    if (res != FA_VM_NOT_OURS)
        return res == FA_VM_FREED ? 0 : fa_err_refuse(rt);
    int dev;
    size_t size;
    pthread_mutex_lock(&map_lock);
    bool ours = fa_ptrmap_take(&fallback, (uintptr_t)p, &dev, &size);
    pthread_mutex_unlock(&map_lock);
    if (!ours) { /* not from cudaMalloc through us: unchanged */
        if (!async)
            return rt->cudaFree(p);
        fa_device_count(FA_PT_cudaFreeAsync);
        return async(p, s);
    }
    devstate *d = &fa_devs[dev];
    fa_cuda_error r = fa_dev_drv_free(rt, d, p, async, s);
    fa_err_note(rt, dev, r);
    if (r != 0) {
        fa_dev_track(p, dev, size);
        return r;
    }
    pthread_mutex_lock(&d->lock);
    d->fallback_bytes -= size;
    ST_ADD(d, frees, 1);
    fa_dev_sync_stats(d);
    pthread_mutex_unlock(&d->lock);
    return r;
}

fa_cuda_error fa_device_free(void *p)
{
    const fa_cudart *rt = fa_device_runtime("cudaFree");
    if (!rt->cudaFree)
        return FA_CUDA_ERROR_INITIALIZATION;
    if (!p)
        return rt->cudaFree(p); /* cudaFree(NULL) creates the context: the driver's business */
    return free_block(rt, p, NULL, NULL);
}

fa_cuda_error fa_device_free_async(void *p, fa_cuda_stream s, bool ptsz)
{
    const fa_cudart *rt = fa_device_runtime(ptsz ? "cudaFreeAsync_ptsz" : "cudaFreeAsync");
    fa_cuda_error (*async)(void *, fa_cuda_stream) = ptsz ? rt->cudaFreeAsync_ptsz : rt->cudaFreeAsync;
    if (!async)
        return FA_CUDA_ERROR_INITIALIZATION;
    if (!p) {
        fa_device_count(FA_PT_cudaFreeAsync);
        return async(p, s);
    }
    return free_block(rt, p, async, s);
}

fa_cuda_error fa_device_reset(void)
{
    const fa_cudart *rt = fa_device_runtime("cudaDeviceReset");
    if (!rt->cudaDeviceReset)
        return FA_CUDA_ERROR_INITIALIZATION;
    int cur = fa_dev_thread_device(rt); /* the device reset, also beyond those the pool serves */
    int dev = cur < FA_MAX_DEVICES ? cur : -1;
    if (dev < 0) {
        fa_cuda_error r = rt->cudaDeviceReset();
        fa_captures_forget(cur);
        return r;
    }
    /* The reset frees every allocation of the device: the pool lets go of
     * its pieces and address space first, chunks go with the reset.
     * ensure_pool reserves without the lock, so a reset while it is
     * RESERVING would free what it reserves and leave it a pool of freed
     * memory: the reset waits for it (the wait releases the lock) and
     * tears down the complete pool.  RESETTING, until the driver's reset
     * returns, keeps a new pool from being reserved before the driver
     * frees everything, and a second reset waits its turn. */
    devstate *d = &fa_devs[dev];
    /* The driver's reset waits for the device's queued work; unmapping the
     * pieces does not: the work lands first, as it would without the pool.
     * A failed sync (a sticky error) is the reset's to clear.  Not while a
     * stream captures (a sync would invalidate it): the pieces then stay
     * mapped through the driver's reset, which waits for the work, and are
     * let go after it. */
    bool synced = false;
    if (fa_dev_state(d) == READY && __atomic_load_n(&d->kind, __ATOMIC_ACQUIRE) == KIND_VMM &&
        rt->cudaDeviceSynchronize && fa_section_enter()) {
        fa_cuda_error before = fa_err_peek(rt);
        synced = fa_quar_drv_sync(rt, d) == 0;
        if (!synced)
            fa_err_absorb(rt, before);
        fa_section_leave();
    }
    fa_vm late;
    bool tear_late = false;
    fa_vmctx x = {NULL, d, dev};
    pthread_mutex_lock(&d->lock);
    while (d->state == RESERVING || d->state == RESETTING)
        pthread_cond_wait(&d->settled, &d->lock);
    if (d->state == READY && d->kind == KIND_VMM) {
        x.drv = fa_cudrv_get(rt);
        late = d->vm;
        memset(&d->vm, 0, sizeof d->vm);
        tear_late = !synced;
        if (!tear_late)
            fa_pieces_teardown(&x, &late);
        __atomic_store_n(&d->vm_base, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&d->vm_bytes, 0, __ATOMIC_RELEASE);
    } else if (d->kind == KIND_CHUNKS) {
        fa_pool_clear(&d->pool);
    }
    d->fallback_bytes = 0;
    d->bound_retry = 0; /* the new pool's quarantine starts empty (bound_sync is its syncing thread's) */
    d->probe = NULL;    /* destroyed with the device's streams */
    __atomic_store_n(&d->sticky, 0, __ATOMIC_RELAXED); /* a new context is asked afresh */
    d->generation++;
    __atomic_store_n(&d->kind, KIND_NONE, __ATOMIC_RELEASE);
    __atomic_store_n(&d->state, RESETTING, __ATOMIC_RELEASE);
    fa_dev_sync_stats(d);
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_lock(&map_lock);
    fa_ptrmap_drop_device(&fallback, dev);
    pthread_mutex_unlock(&map_lock);
    /* The reset waits for the device's work: it covers the quarantines of
     * the other pools the device reaches, as a sync does. */
    fa_sync_mark m;
    fa_quar_begin(dev, &m);
    fa_cuda_error r = rt->cudaDeviceReset(); /* its only documented errors are earlier launches' */
    if (r == 0)
        fa_quar_end(dev, &m, 0);
    if (tear_late)
        fa_pieces_teardown(&x, &late); /* its calls' errors are the driver's own: the runtime's stays */
    fa_captures_forget(dev);
    pthread_mutex_lock(&d->lock);
    __atomic_store_n(&d->state, UNTOUCHED, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&d->settled);
    pthread_mutex_unlock(&d->lock);
    return r;
}

fa_cuda_error fa_device_ipc_get_handle(fa_cuda_ipc_handle *h, void *p)
{
    const fa_cudart *rt = fa_device_runtime("cudaIpcGetMemHandle");
    if (!rt->cudaIpcGetMemHandle)
        return FA_CUDA_ERROR_INITIALIZATION;
    if (!in_a_pool((uintptr_t)p))
        return rt->cudaIpcGetMemHandle(h, p);
    /* A handle names a whole driver allocation; the receiver would map our
     * chunk or nothing, not this block. */
    if (!__atomic_exchange_n(&warned_ipc, 1, __ATOMIC_RELAXED))
        fa_warn("cudaIpcGetMemHandle cannot share memory from the device pool between processes; set "
                "FORGEALLOC_DEVICE_POOL_SIZE=0 for programs that do (e.g. torch.multiprocessing with CUDA tensors)");
    return fa_err_refuse(rt); /* the thread's last error says so too, as the runtime's refusal would */
}

/* The current device may now access `peer`'s memory.  The driver grants
 * that for cudaMalloc memory only: the peer's mapped pieces get it from
 * cuMemSetAccess, now for those mapped and at mapping time for the rest. */
fa_cuda_error fa_device_enable_peer_access(int peer, unsigned flags)
{
    const fa_cudart *rt = fa_device_runtime("cudaDeviceEnablePeerAccess");
    if (!rt->cudaDeviceEnablePeerAccess)
        return FA_CUDA_ERROR_INITIALIZATION;
    fa_cuda_error r = rt->cudaDeviceEnablePeerAccess(peer, flags);
    int cur = fa_dev_current_device(rt);
    if ((r != 0 && r != FA_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) || cur < 0 || peer < 0 || peer >= FA_MAX_DEVICES)
        return r;
    devstate *d = &fa_devs[peer];
    unsigned bit = 1u << cur;
    if (__atomic_fetch_or(&d->peers, bit, __ATOMIC_ACQ_REL) & bit)
        return r;
    pthread_mutex_lock(&d->lock);
    if (d->state == READY && d->kind == KIND_VMM) {
        fa_vmctx x = {fa_cudrv_get(rt), d, peer};
        if (x.drv && fa_vm_grant_all(&d->vm, &fa_pieces_driver, &x))
            fa_warn("device %d: access to the pool's memory could not be granted to device %d; blocks may fault "
                    "there; set FORGEALLOC_DEVICE_VMM=0 to use the chunk pool",
                    peer, cur);
    }
    pthread_mutex_unlock(&d->lock);
    return r;
}

/* ---- pass-through and capture tracking ------------------------------------------------ */

void fa_device_count(enum fa_cuda_pt which) { __atomic_fetch_add(&passthrough[which], 1, __ATOMIC_RELAXED); }


/* ---- reports and fork ------------------------------------------------------------------ */

void fa_device_fill(struct fa_snapshot *s)
{
    s->cuda_seen = __atomic_load_n(&cuda_seen, __ATOMIC_RELAXED);
    s->blind_reason = fa_blind_reason();
    s->device_blind = s->blind_reason != NULL;
    for (int i = 0; i < FA_PT_COUNT; i++)
        s->passthrough[i] = __atomic_load_n(&passthrough[i], __ATOMIC_RELAXED);
    s->ndevices = 0;
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &fa_devs[dev];
        if (!__atomic_load_n(&d->used, __ATOMIC_RELAXED))
            continue;
        fa_device_stats *o = &s->dev[s->ndevices++];
        o->device = dev;
#define FA_DEV_COPY(name, unit, doc) o->name = __atomic_load_n(&d->st.name, __ATOMIC_RELAXED);
        FA_DEVICE_FIELDS(FA_DEV_COPY)
#undef FA_DEV_COPY
        /* A snapshot taken while other threads allocate adds up: allocs
         * is the sum of what was read, not a count of its own. */
        o->allocs = o->pool_allocs + o->fallback_allocs;
        if (o->peak_in_use_bytes < o->in_use_bytes) /* the peak is raised just after the count */
            o->peak_in_use_bytes = o->in_use_bytes;
        if (o->peak_waste_bytes < o->waste_bytes)
            o->peak_waste_bytes = o->waste_bytes;
    }
}

/* No lock is taken before fork: the shim holds a device's lock while it
 * calls the runtime (a pool growing), and a runtime loaded after the shim
 * (dlopen, as Python loads torch) holds its own lock across fork, in a
 * handler that runs before ours: waiting here for a device's lock would
 * deadlock with the thread inside.  The child needs no consistent state:
 * CUDA cannot be used across fork, so it starts with no pools and leaves
 * the parent's tables untouched (what another thread may have been
 * changing is never walked or freed; the pages stay shared with the
 * parent). */
void fa_device_fork_child(void)
{
    fa_cudart_fork_child();
    map_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &fa_devs[dev];
        d->lock = (pthread_mutex_t)PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;
        d->settled = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
        if (!d->used && d->state == UNTOUCHED)
            continue;
        memset(&d->vm, 0, sizeof d->vm);
        fa_pool_init(&d->pool, d->pool.chunk_size);
        d->state = UNTOUCHED;
        d->kind = KIND_NONE;
        d->vm_base = d->vm_bytes = 0;
        d->target = d->fallback_bytes = d->last_grow_ms = 0;
        d->peers = d->reach_async = d->covered = 0;
        d->probe = NULL;
        d->sticky = 0;
        d->used = 0;
        d->bound_sync = false; /* its syncing thread was the parent's */
        d->bound_retry = 0;
        memset(&d->st, 0, sizeof d->st);
    }
    fallback = (fa_ptrmap){0};
    memset(passthrough, 0, sizeof passthrough);
    fa_capture_fork_child();
    fa_grow_fork_child();
    cuda_seen = 0;
}
