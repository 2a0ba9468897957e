/* room.c - when the driver runs out of memory, idle pieces or chunks go
 * back to it and the request is retried; the final error is the driver's
 * own.  During a stream capture too: giving back needs no synchronisation
 * (what a sync would free stays until the capture is over).  For the program's cudaMalloc that the pool passes on, and for the
 * device allocations the runtime serves itself (cudaMallocAsync,
 * cudaMallocPitch, cudaMallocManaged): memory cudaMemGetInfo counts free
 * serves them too. */
#include "devstate.h"
#include "device.h"

#include "../core/log.h"

/* The program's call is made in its own capture mode: the runtime refuses
 * it, and invalidates captures, as it would without the pool.  One it
 * answered out of memory was allowed; the pool's retries are that call
 * again and run in relaxed mode, so a capture another thread begins
 * meanwhile is not invalidated by them (nor the retries refused). */
fa_cuda_error fa_room_driver_alloc(const fa_cudart *rt, devstate *d, int dev, void **out, size_t n)
{
    fa_cuda_error before = fa_err_peek(rt);
    fa_cuda_error r = fa_dev_drv_malloc(rt, d, out, n);
    fa_cudart_mode mode = {0, false};
    bool relaxed = false, pooled = false;
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
    if (r == 0 && *out && !fa_dev_track(*out, dev, n))
        fa_debug("no memory to track a driver allocation; its cudaFree will not be counted");
    pthread_mutex_lock(&d->lock);
    if (r == 0 && *out) {
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
    fa_device_room room = {fa_err_peek(fa_cudart_get()), false, false, 0};
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
    int dev = fa_dev_pool_device(rt);
    if (dev < 0)
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
