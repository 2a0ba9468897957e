/* quarantine.c - a freed block is quarantined until a device
 * synchronisation that began after the free: work queued before its
 * cudaFree may still touch it (the real cudaFree synchronises).  The pool
 * synchronises only when nothing else serves a request, or rides on the
 * application's own cudaDeviceSynchronize; pieces are unmapped and released
 * only once idle, i.e. after that synchronisation (cuMemUnmap does not
 * wait for queued work).
 *
 * A program that frees without ever synchronising gets a synchronisation
 * from the pool once FA_QUARANTINE_MAX_BLOCKS blocks wait in quarantine
 * (the driver's own cudaFree synchronises on every call).  Without it the
 * quarantine of a large pool holds tens of thousands of blocks spread over
 * the whole reservation, and each one's record costs a cache and TLB miss
 * when it comes out: the cost per cudaMalloc would follow the pool's size.
 * One such synchronisation runs at a time per device: it lasts as long as
 * the device's queued work, and every free meanwhile still sees the full
 * quarantine; were each to start its own, all the freeing threads would
 * wait in a sync.  The bound is then exceeded by the frees made during one
 * sync.  One that fails (a sticky error) is tried again only after as many
 * frees again, or once some other sync succeeded: its blocks stay
 * quarantined meanwhile, never reused. */
#include "devstate.h"
#include "device.h"

bool fa_quar_begin(devstate *d, fa_epoch *e)
{
    pthread_mutex_lock(&d->lock);
    bool any = false;
    e->generation = d->generation;
    if (d->state == READY && d->kind == KIND_VMM && d->vm.quarantined > 0) {
        e->epoch = fa_vm_sync_begin(&d->vm);
        any = true;
    } else if (d->state == READY && d->kind == KIND_CHUNKS && d->pool.quarantined > 0) {
        e->epoch = fa_pool_sync_begin(&d->pool);
        any = true;
    }
    pthread_mutex_unlock(&d->lock);
    return any;
}

/* Blocks of the same pool only: a reset in between made a new one, whose
 * epochs are its own. */
void fa_quar_end(devstate *d, fa_epoch e, uint64_t waited)
{
    pthread_mutex_lock(&d->lock);
    d->bound_retry = 0; /* the device synchronises again */
    d->grow_ns = 0;
    if (waited)
        d->sync_ns = fa_dev_follow(d->sync_ns, waited);
    if (d->generation == e.generation && d->state == READY && d->kind == KIND_VMM)
        fa_vm_sync_end(&d->vm, e.epoch);
    else if (d->generation == e.generation && d->state == READY && d->kind == KIND_CHUNKS)
        fa_pool_sync_end(&d->pool, e.epoch);
    fa_dev_sync_stats(d);
    pthread_mutex_unlock(&d->lock);
}

fa_cuda_error fa_quar_drv_sync(const fa_cudart *rt, devstate *d)
{
    uint64_t t0 = fa_dev_now_ns();
    fa_cuda_error r = rt->cudaDeviceSynchronize();
    ST_ADD(d, driver_ns, fa_dev_now_ns() - t0);
    ST_ADD(d, device_syncs, 1);
    return r;
}

bool fa_quar_sync(const fa_cudart *rt, devstate *d, int dev)
{
    fa_epoch e;
    if (!rt->cudaDeviceSynchronize || !fa_section_enter())
        return false;
    if (!fa_quar_begin(d, &e)) {
        fa_section_leave();
        return false;
    }
    fa_cuda_error before = fa_err_peek(rt);
    int cur = fa_dev_thread_device(rt);
    if (cur != dev && (!rt->cudaSetDevice || rt->cudaSetDevice(dev) != 0)) {
        fa_err_absorb(rt, before);
        fa_section_leave();
        return false; /* the sync would wait for the wrong device */
    }
    uint64_t t0 = fa_dev_now_ns();
    fa_cuda_error r = fa_quar_drv_sync(rt, d);
    uint64_t waited = fa_dev_now_ns() - t0;
    if (cur >= 0 && cur != dev)
        rt->cudaSetDevice(cur);
    fa_err_absorb(rt, before);
    fa_section_leave();
    if (r != 0)
        return false;
    fa_quar_end(d, e, waited ? waited : 1);
    return true;
}

/* The next free may ask again; if it failed (or a capture kept it from
 * running), not before FA_QUARANTINE_MAX_BLOCKS more blocks wait
 * (fa_quar_end lifts that once any sync succeeds). */
void fa_quar_bound_done(devstate *d, bool synced)
{
    pthread_mutex_lock(&d->lock);
    d->bound_sync = false;
    /* Below the bound: another sync freed the blocks meanwhile, no wait. */
    if (!synced && d->state == READY && d->kind == KIND_VMM && d->vm.quarantined_blocks >= FA_QUARANTINE_MAX_BLOCKS)
        d->bound_retry = d->vm.quarantined_blocks + FA_QUARANTINE_MAX_BLOCKS;
    pthread_mutex_unlock(&d->lock);
}

/* The application's own cudaDeviceSynchronize frees our quarantine too. */
fa_cuda_error fa_device_synchronize(void)
{
    const fa_cudart *rt = fa_device_runtime("cudaDeviceSynchronize");
    if (!rt->cudaDeviceSynchronize)
        return FA_CUDA_ERROR_INITIALIZATION;
    int dev = fa_dev_current_device(rt);
    devstate *d = dev >= 0 ? &fa_devs[dev] : NULL;
    fa_epoch e = {0, 0};
    bool any = d && fa_quar_begin(d, &e);
    fa_cuda_error r = rt->cudaDeviceSynchronize();
    if (r == 0 && any)
        fa_quar_end(d, e, 0);
    return r;
}
