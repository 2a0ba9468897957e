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
 * quarantined meanwhile, never reused.
 *
 * Several devices: a pool's memory is reached by its own device, by every
 * device the program enabled peer access for, and by the devices whose
 * streams freed its blocks with cudaFreeAsync (the pool's reach).  A block
 * leaves the quarantine once every device of the reach has synchronised
 * after its free; the pool's own syncs synchronise each of them, and the
 * application's cudaDeviceSynchronize counts for the device it waited
 * for.  Each pool notes, per device, the last epoch such a sync covered. */
#include "devstate.h"
#include "device.h"

/* The devices that can reach pool d (index dev): its own and the others. */
static unsigned reach_of(devstate *d, int dev)
{
    return 1u << dev | __atomic_load_n(&d->peers, __ATOMIC_ACQUIRE) | __atomic_load_n(&d->reach_async, __ATOMIC_ACQUIRE);
}

void fa_quar_reach_add(devstate *d, int dev)
{
    if (dev >= 0 && dev < FA_MAX_DEVICES && !((__atomic_load_n(&d->reach_async, __ATOMIC_ACQUIRE) >> dev) & 1))
        __atomic_fetch_or(&d->reach_async, 1u << dev, __ATOMIC_ACQ_REL);
}

/* Pre: d->lock held, d ready.  Whether blocks wait in its quarantine. */
static bool has_quarantine(const devstate *d)
{
    return d->kind == KIND_VMM ? d->vm.quarantined > 0 : d->kind == KIND_CHUNKS && d->pool.quarantined > 0;
}

bool fa_quar_begin(int p, fa_sync_mark *m)
{
    bool any = false;
    m->pools = 0;
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &fa_devs[dev];
        if (fa_dev_state(d) != READY || !((reach_of(d, dev) >> p) & 1))
            continue;
        pthread_mutex_lock(&d->lock);
        if (d->state == READY && (d->kind == KIND_VMM || d->kind == KIND_CHUNKS)) {
            m->generation[dev] = d->generation;
            m->epoch[dev] = d->kind == KIND_VMM ? fa_vm_sync_begin(&d->vm) : fa_pool_sync_begin(&d->pool);
            m->pools |= 1u << dev;
            any |= has_quarantine(d);
        }
        pthread_mutex_unlock(&d->lock);
    }
    return any;
}

/* Pre: d->lock held, d ready.  Release what every device of the reach has
 * covered: the oldest of their covered epochs (wrap-safe: the farthest
 * back from the current one). */
static void release_covered(devstate *d, int dev)
{
    unsigned reach = reach_of(d, dev);
    if ((d->covered & reach) != reach)
        return;
    uint32_t now = d->kind == KIND_VMM ? d->vm.epoch : d->pool.epoch, back = 0;
    for (int q = 0; q < FA_MAX_DEVICES; q++)
        if ((reach >> q) & 1 && now - d->cov[q] > back)
            back = now - d->cov[q];
    if (d->kind == KIND_VMM)
        fa_vm_sync_end(&d->vm, now - back);
    else
        fa_pool_sync_end(&d->pool, now - back);
}

/* A reset in between made a new pool, whose epochs are its own: only the
 * same pool takes the mark. */
void fa_quar_end(int p, const fa_sync_mark *m, uint64_t waited)
{
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        if (!((m->pools >> dev) & 1))
            continue;
        devstate *d = &fa_devs[dev];
        pthread_mutex_lock(&d->lock);
        if (d->generation == m->generation[dev] && d->state == READY &&
            (d->kind == KIND_VMM || d->kind == KIND_CHUNKS)) {
            d->cov[p] = m->epoch[dev];
            d->covered |= 1u << p;
            d->bound_retry = 0; /* the device synchronises again */
            d->grow_ns = 0;
            d->synced_ns += waited;
            if (waited)
                d->sync_ns = fa_dev_follow(d->sync_ns, waited);
            release_covered(d, dev);
            fa_dev_sync_stats(d);
        }
        pthread_mutex_unlock(&d->lock);
    }
}

/* cudaDeviceSynchronize on the thread's current device, timed and counted. */
fa_cuda_error fa_quar_drv_sync(const fa_cudart *rt, devstate *d)
{
    uint64_t t0 = fa_dev_now_ns();
    fa_cuda_error r = rt->cudaDeviceSynchronize();
    ST_ADD(d, driver_ns, fa_dev_now_ns() - t0);
    ST_ADD(d, device_syncs, 1);
    fa_err_note(rt, -1, r);
    return r;
}

/* Every device of the reach, each made current in turn; the thread's
 * device and last error are put back. */
bool fa_quar_sync(const fa_cudart *rt, devstate *d, int dev)
{
    if (!rt->cudaDeviceSynchronize || !fa_section_enter())
        return false;
    pthread_mutex_lock(&d->lock);
    bool any = d->state == READY && has_quarantine(d);
    pthread_mutex_unlock(&d->lock);
    if (!any) {
        fa_section_leave();
        return false;
    }
    fa_cuda_error before = fa_err_peek(rt);
    int cur = fa_dev_thread_device(rt), now = cur;
    unsigned reach = reach_of(d, dev);
    bool ok = true;
    for (int q = 0; q < FA_MAX_DEVICES && ok; q++) {
        if (!((reach >> q) & 1))
            continue;
        if (now != q && (!rt->cudaSetDevice || rt->cudaSetDevice(q) != 0)) {
            ok = false; /* the sync would wait for the wrong device */
            break;
        }
        now = q;
        fa_sync_mark m;
        fa_quar_begin(q, &m);
        uint64_t t0 = fa_dev_now_ns();
        ok = fa_quar_drv_sync(rt, d) == 0;
        uint64_t waited = fa_dev_now_ns() - t0;
        if (ok)
            fa_quar_end(q, &m, waited ? waited : 1);
    }
    if (cur >= 0 && now != cur)
        rt->cudaSetDevice(cur);
    fa_err_absorb(rt, before);
    fa_section_leave();
    return ok;
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

/* The application's own cudaDeviceSynchronize covers the quarantines its
 * device reaches. */
fa_cuda_error fa_device_synchronize(void)
{
    const fa_cudart *rt = fa_device_runtime("cudaDeviceSynchronize");
    if (!rt->cudaDeviceSynchronize)
        return FA_CUDA_ERROR_INITIALIZATION;
    int dev = fa_dev_current_device(rt);
    fa_sync_mark m = {.pools = 0};
    bool any = dev >= 0 && fa_quar_begin(dev, &m);
    fa_cuda_error r = rt->cudaDeviceSynchronize();
    if (r == 0 && any)
        fa_quar_end(dev, &m, 0);
    fa_err_note(rt, dev, r);
    return r;
}
