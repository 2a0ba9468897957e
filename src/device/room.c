/* room.c - when the driver runs out of memory, idle pieces or chunks go
 * back to it and the request is retried; the final error is the driver's
 * own.  During a stream capture too: giving back needs no synchronisation
 * (what a sync would free stays until the capture is over).  For the program's cudaMalloc that the pool passes on, and for the
 * device allocations the runtime serves itself (cudaMallocAsync,
 * cudaMallocPitch, cudaMallocManaged): memory cudaMemGetInfo counts free
 * serves them too. */
#include "devstate.h"
#include "device.h"

#include <string.h>

#include "../core/log.h"

/* The program's call is made in its own capture mode: the runtime refuses
 * it, and invalidates captures, as it would without the pool.  One it
 * answered out of memory was allowed; the pool's retries are that call
 * again and run in relaxed mode, so a capture another thread begins
 * meanwhile is not invalidated by them (nor the retries refused).  So is
 * the first call when a capture began after the program's call entered
 * (late): without the pool the call would have been made before it. */
fa_cuda_error fa_room_driver_alloc(const fa_cudart *rt, devstate *d, int dev, void **out, size_t n, bool late)
{
    fa_cuda_error before = fa_err_peek(rt);
    fa_cudart_mode mode = {0, false};
    bool relaxed = late, pooled = false;
    if (late)
        mode = fa_cudart_relax(rt);
    fa_cuda_error r = fa_dev_drv_malloc(rt, d, out, n);
    while (r == FA_CUDA_ERROR_MEMORY_ALLOCATION) {
        pthread_mutex_lock(&d->lock);
        uint64_t reach = fa_meminfo_reach(d);
        pthread_mutex_unlock(&d->lock);
        if (fa_meminfo_beyond(rt, n, reach))
            break;
        if (fa_quar_sync(rt, d, dev) && fa_dev_pool_alloc(d, dev, n, out)) {
            r = 0, pooled = true;
            fa_err_absorb(rt, before); /* served after all: no error remains */
            break;
        }
        if (!fa_grow_give_back(rt, d, dev))
            break;
        fa_err_absorb(rt, before); /* the error we are retrying past */
        if (!relaxed)
            mode = fa_cudart_relax(rt), relaxed = true;
        r = fa_dev_drv_malloc(rt, d, out, n);
    }
    if (relaxed)
        fa_cudart_unrelax(rt, mode);
    if (pooled)
        return 0; /* counted by the pool */
    fa_err_note(rt, dev, r);
    /* A block that could not be remembered is not counted at all: its
     * cudaFree goes to the runtime uncounted, and in_use_bytes stays exact. */
    bool tracked = r == 0 && *out && fa_dev_track(*out, dev, n);
    if (r == 0 && *out && !tracked)
        fa_debug("no memory to track a driver allocation; neither it nor its cudaFree is counted");
    pthread_mutex_lock(&d->lock);
    if (tracked) {
        d->fallback_bytes += n;
        ST_ADD(d, fallback_allocs, 1);
        fa_dev_sync_stats(d);
    } else if (r != 0) {
        ST_ADD(d, failed_allocs, 1);
    }
    pthread_mutex_unlock(&d->lock);
    return r;
}

fa_device_room fa_device_room_begin(void)
{
    fa_device_room room = {-1, fa_err_peek(fa_cudart_get()), false, false, 0};
    return room;
}

void fa_device_room_end(fa_device_room *room, fa_cuda_error r)
{
    if (room->relaxed)
        fa_cudart_unrelax(fa_cudart_get(), (fa_cudart_mode){room->mode, true});
    fa_device_error_seen(r);
}

bool fa_device_room_make(fa_device_room *room)
{
    const fa_cudart *rt = fa_cudart_get();
    int dev = room->dev < 0 ? fa_dev_pool_device(rt) : room->dev;
    if (dev < 0 || dev >= FA_MAX_DEVICES || fa_dev_state(&fa_devs[dev]) != READY)
        return false;
    devstate *d = &fa_devs[dev];
    bool more = fa_grow_give_back(rt, d, dev);
    if (!more && !room->synced) {
        room->synced = true;
        more = fa_quar_sync(rt, d, dev) && fa_grow_give_back(rt, d, dev);
    }
    if (more)
        fa_err_absorb(rt, room->before);
    if (more && !room->relaxed) {
        fa_cudart_mode m = fa_cudart_relax(rt);
        room->relaxed = m.changed, room->mode = m.mode;
    }
    return more;
}

/* ---- the driver API's allocations -------------------------------------------------------------
 * Libraries that allocate with the driver API (NCCL's buffers, offloaders
 * in the style of comfy-aimdo, PyTorch's expandable segments) reach it by
 * name (libcuda.so.1's cuMemAlloc_v2, ...) or through a lookup
 * (cuGetProcAddress, cudaGetDriverEntryPoint[ByVersion]); the runtime's
 * own allocations do neither (an H200 with CUDA 13.0 showed no such call
 * from PyTorch's allocator).  Each is served by the driver, retried after
 * the pool made room, as the runtime's own allocations are. */

enum { DRV_ALLOC, DRV_CREATE, DRV_ASYNC, DRV_ASYNC_PTSZ, DRV_PROC, DRV_COUNT };
static const struct {
    const char *sym;   /* libcuda's name */
    const char *entry; /* the name a lookup asks for */
    int since;         /* the CUDA version from which a lookup gives this ABI */
    bool ptsz;         /* the per-thread default stream variant */
} drv_fn[DRV_COUNT] = {
    {"cuMemAlloc_v2", "cuMemAlloc", 3020, false},
    {"cuMemCreate", "cuMemCreate", 10020, false},
    {"cuMemAllocAsync", "cuMemAllocAsync", 11020, false},
    {"cuMemAllocAsync_ptsz", "cuMemAllocAsync", 11020, true},
    {"cuGetProcAddress_v2", "cuGetProcAddress", 12000, false},
};
static void *drv_real[DRV_COUNT];

#define FA_CU_PER_THREAD_STREAM 2ull /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, cudaEnablePerThreadDefaultStream */

/* The driver's function for slot i: as a lookup found it, or by name. */
static void *real_of(int i)
{
    void *fn = __atomic_load_n(&drv_real[i], __ATOMIC_ACQUIRE);
    if (fn)
        return fn;
    fn = fa_cudart_next(drv_fn[i].sym);
    const fa_cudart *rt = fa_cudart_get();
    fa_cuda_entry_status st;
    if (!fn && rt->cudaGetDriverEntryPoint) {
        fa_cuda_error before = fa_err_peek(rt);
        if (rt->cudaGetDriverEntryPoint(drv_fn[i].entry, &fn, drv_fn[i].ptsz ? FA_CU_PER_THREAD_STREAM : 0, &st) != 0 ||
            st != FA_CUDA_ENTRY_POINT_SUCCESS)
            fn = NULL;
        fa_err_absorb(rt, before);
    }
    if (fn)
        __atomic_store_n(&drv_real[i], fn, __ATOMIC_RELEASE);
    return fn;
}

#define FA_CU_ERROR_NOT_FOUND 500 /* CUDA_ERROR_NOT_FOUND */

/* Try `call` until it is not out of memory or the pool has nothing more
 * to give back on device dev (-1: the thread's). */
#define FA_DRV_RETRY(counter, dev_, call)                                                \
    do {                                                                                 \
        fa_device_count(counter);                                                        \
        fa_device_room room = fa_device_room_begin();                                    \
        room.dev = (dev_);                                                               \
        fa_cu_result r;                                                                  \
        while ((r = (call)) == FA_CU_ERROR_OUT_OF_MEMORY && fa_device_room_make(&room)) \
            ;                                                                            \
        fa_device_room_end(&room, (fa_cuda_error)r);                                     \
        return r;                                                                        \
    } while (0)

fa_cu_result fa_device_cu_mem_alloc(fa_cu_ptr *p, size_t n)
{
    fa_cu_result (*fn)(fa_cu_ptr *, size_t) = (fa_cu_result(*)(fa_cu_ptr *, size_t))real_of(DRV_ALLOC);
    if (!fn)
        return FA_CU_ERROR_NOT_FOUND;
    FA_DRV_RETRY(FA_PT_cuMemAlloc, -1, fn(p, n));
}

fa_cu_result fa_device_cu_mem_create(fa_cu_handle *h, size_t n, const fa_cu_alloc_prop *prop, unsigned long long flags)
{
    fa_cu_result (*fn)(fa_cu_handle *, size_t, const fa_cu_alloc_prop *, unsigned long long) =
        (fa_cu_result(*)(fa_cu_handle *, size_t, const fa_cu_alloc_prop *, unsigned long long))real_of(DRV_CREATE);
    if (!fn)
        return FA_CU_ERROR_NOT_FOUND;
    int dev = prop && prop->location.type == FA_CU_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
    FA_DRV_RETRY(FA_PT_cuMemCreate, dev, fn(h, n, prop, flags));
}

fa_cu_result fa_device_cu_mem_alloc_async(fa_cu_ptr *p, size_t n, fa_cuda_stream s, bool ptsz)
{
    fa_cu_result (*fn)(fa_cu_ptr *, size_t, fa_cuda_stream) =
        (fa_cu_result(*)(fa_cu_ptr *, size_t, fa_cuda_stream))real_of(ptsz ? DRV_ASYNC_PTSZ : DRV_ASYNC);
    if (!fn)
        return FA_CU_ERROR_NOT_FOUND;
    FA_DRV_RETRY(FA_PT_cuMemAllocAsync, -1, fn(p, n, s));
}

/* The lookups' stand-ins: the pool's functions by slot (their ABI is the
 * driver's). */
static fa_cu_result async_legacy(fa_cu_ptr *p, size_t n, fa_cuda_stream s)
{
    return fa_device_cu_mem_alloc_async(p, n, s, false);
}
static fa_cu_result async_ptsz(fa_cu_ptr *p, size_t n, fa_cuda_stream s)
{
    return fa_device_cu_mem_alloc_async(p, n, s, true);
}
static void *const drv_ours[DRV_COUNT] = {(void *)fa_device_cu_mem_alloc, (void *)fa_device_cu_mem_create,
                                          (void *)async_legacy, (void *)async_ptsz,
                                          (void *)fa_device_cu_get_proc_address};

void *fa_device_driver_function(const char *sym, void *fn, int version, unsigned long long flags)
{
    if (!fn || !sym)
        return fn;
    bool ptsz = (flags & FA_CU_PER_THREAD_STREAM) && strcmp(sym, "cuMemAllocAsync") == 0;
    for (int i = 0; i < DRV_COUNT; i++) {
        if (strcmp(sym, drv_fn[i].entry) != 0 || drv_fn[i].ptsz != ptsz)
            continue;
        if (version && version < drv_fn[i].since)
            return fn; /* an older ABI than the pool's function */
        /* The first one found serves: every one of the slot implements its
         * API at this ABI (libcuda's by name, or what a lookup gives). */
        void *none = NULL;
        __atomic_compare_exchange_n(&drv_real[i], &none, fn, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        return drv_ours[i];
    }
    return fn;
}

fa_cu_result fa_device_cu_get_proc_address(const char *sym, void **fn, int version, fa_cu_u64 flags,
                                           fa_cu_proc_status *st)
{
    fa_cu_result (*real)(const char *, void **, int, fa_cu_u64, fa_cu_proc_status *) =
        (fa_cu_result(*)(const char *, void **, int, fa_cu_u64, fa_cu_proc_status *))real_of(DRV_PROC);
    if (!real)
        return FA_CU_ERROR_NOT_FOUND;
    fa_cu_result r = real(sym, fn, version, flags, st);
    if (r == 0 && fn)
        *fn = fa_device_driver_function(sym, *fn, version, flags);
    return r;
}
