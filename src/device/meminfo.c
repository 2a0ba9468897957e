/* meminfo.c - what the driver could have.  cudaMemGetInfo counts as free
 * what the pool would give back to the driver: idle pieces and those the
 * next synchronisation makes idle, or chunks holding no live block, with
 * what is quarantined there (never free space a live block pins).  During
 * a stream capture, which forbids the synchronisation, only what goes back
 * without one: idle pieces, chunks holding nothing live or quarantined.
 * The same reckoning tells the pool when a request is beyond anything a
 * sync or giving back could serve. */
#include "devstate.h"
#include "device.h"

uint64_t fa_meminfo_reach(const devstate *d)
{
    /* Idle pieces, and what the quarantine holds (the pieces a sync makes
     * idle, or its bytes if more); idle chunks and quarantined bytes. */
    bool sync = !fa_capturing();
    if (d->state == READY && d->kind == KIND_VMM)
        return d->vm.idle + (!sync                                  ? 0
                             : d->vm.reclaimable > d->vm.quarantined ? d->vm.reclaimable
                                                                     : d->vm.quarantined);
    if (d->state == READY && d->kind == KIND_CHUNKS)
        return sync ? fa_pool_idle(&d->pool) + d->pool.quarantined : fa_pool_idle_now(&d->pool);
    return 0;
}

/* Then neither a sync nor giving memory back can serve the request; they
 * would only cost a wait and the pieces released (created again by the
 * next requests): a request larger than the device, or a program probing
 * for the largest block that fits.  False when the driver cannot say. */
bool fa_meminfo_beyond(const fa_cudart *rt, size_t n, uint64_t reach)
{
    size_t f = 0, t = 0;
    fa_cuda_error before = fa_err_peek(rt);
    bool known = rt->cudaMemGetInfo && rt->cudaMemGetInfo(&f, &t) == 0;
    fa_err_absorb(rt, before);
    return known && n > (uint64_t)f + reach;
}

fa_cuda_error fa_device_mem_get_info(size_t *free_b, size_t *total_b)
{
    const fa_cudart *rt = fa_device_runtime("cudaMemGetInfo");
    if (!rt->cudaMemGetInfo)
        return FA_CUDA_ERROR_INITIALIZATION;
    fa_cuda_error r = rt->cudaMemGetInfo(free_b, total_b);
    fa_err_note(rt, -1, r);
    int dev = r == 0 && free_b && total_b ? fa_dev_current_device(rt) : -1;
    if (dev >= 0) {
        devstate *d = &fa_devs[dev];
        uint64_t idle = 0;
        pthread_mutex_lock(&d->lock);
        bool sync = !fa_capturing();
        if (d->state == READY && d->kind == KIND_VMM) /* whole idle pieces, and those a sync makes idle */
            idle = d->vm.idle + (sync ? d->vm.reclaimable : 0);
        else if (d->state == READY && d->kind == KIND_CHUNKS)
            idle = sync ? fa_pool_idle(&d->pool) : fa_pool_idle_now(&d->pool);
        pthread_mutex_unlock(&d->lock);
        uint64_t f = (uint64_t)*free_b + idle;
        *free_b = (size_t)(f > *total_b ? *total_b : f);
    }
    return r;
}
