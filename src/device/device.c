/* device.c - cudaMalloc and cudaFree served from a pool per GPU.
 *
 * The pool of each device is reserved from the driver at the first
 * cudaMalloc on that device (never at load), in chunks that can be given
 * back one by one.  The rules that keep it as safe as the driver:
 *  - a freed block is quarantined until a device synchronisation that
 *    began after the free (the real cudaFree synchronises; we synchronise
 *    once, only when ready blocks cannot serve a request, or ride on the
 *    application's own cudaDeviceSynchronize);
 *  - no synchronisation while a stream capture is in progress (it would
 *    invalidate the capture): requests are served by the driver instead;
 *  - when the driver runs out of memory, idle chunks go back to it and the
 *    request is retried; the final error is the driver's own;
 *  - internal calls that fail leave no error for cudaGetLastError (PyTorch
 *    throws on any pending error other than cudaErrorMemoryAllocation);
 *  - cudaMemGetInfo counts the pool's idle bytes as free.
 * The pool itself (pool.c, buddy.c) is pure C; all CUDA calls are here. */
#define _GNU_SOURCE
#include "device.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/fmt.h"
#include "../core/log.h"
#include "../core/options.h"
#include "../stats/snapshot.h"
#include "cudart.h"
#include "pool.h"
#include "ptrmap.h"

enum pool_state { UNTOUCHED, RESERVING, READY, PASSTHROUGH };

typedef struct devstate {
    fa_pool pool;
    int state;
    uint64_t target;         /* pool bytes wanted */
    uint64_t fallback_bytes; /* requested bytes of live driver allocations */
    int used;                /* some cudaMalloc/cudaFree reached this device */
    fa_device_stats st;      /* written under `lock`, read without it */
} devstate;

static devstate devs[FA_MAX_DEVICES];
static fa_ptrmap fallback;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t passthrough[FA_PT_COUNT];
static int captures;    /* stream captures in progress, process-wide */
static int cuda_seen;
static int blind_state;          /* 0 not decided yet, 1 not blind, 2 blind */
static const char *blind_reason; /* set before blind_state becomes 2 */
static int warned_missing, warned_ipc, warned_chunk;

#define ST_ADD(d, field, v) __atomic_fetch_add(&(d)->st.field, (v), __ATOMIC_RELAXED)
#define ST_SET(d, field, v) __atomic_store_n(&(d)->st.field, (v), __ATOMIC_RELAXED)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Pre: `lock` held.  Mirror the pool's numbers into the stats. */
static void sync_stats(devstate *d)
{
    uint64_t in_use = d->pool.requested + d->fallback_bytes;
    uint64_t waste = d->pool.in_use - d->pool.requested;
    ST_SET(d, pool_bytes, d->pool.bytes);
    ST_SET(d, pool_chunks, (uint64_t)d->pool.nchunks);
    ST_SET(d, in_use_bytes, in_use);
    ST_SET(d, pool_in_use_bytes, d->pool.in_use);
    ST_SET(d, requested_bytes, d->pool.requested);
    ST_SET(d, quarantine_bytes, d->pool.quarantined);
    ST_SET(d, waste_bytes, waste);
    if (in_use > d->st.peak_in_use_bytes)
        ST_SET(d, peak_in_use_bytes, in_use);
    if (waste > d->st.peak_waste_bytes)
        ST_SET(d, peak_waste_bytes, waste);
}

/* ---- the runtime and its errors ------------------------------------------- */

static const fa_cudart *runtime(const char *fn)
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

/* Before an internal call whose failure we absorb: was the thread's last
 * error clear?  After the failure, clear it again only if it was. */
static bool error_clear(const fa_cudart *rt) { return !rt->cudaPeekAtLastError || rt->cudaPeekAtLastError() == 0; }
static void absorb(const fa_cudart *rt, bool was_clear)
{
    if (was_clear && rt->cudaGetLastError)
        rt->cudaGetLastError();
}

static fa_cuda_error drv_malloc(const fa_cudart *rt, devstate *d, void **p, size_t n)
{
    uint64_t t0 = now_ns();
    fa_cuda_error r = rt->cudaMalloc(p, n);
    ST_ADD(d, driver_ns, now_ns() - t0);
    ST_ADD(d, driver_malloc_calls, 1);
    return r;
}

static fa_cuda_error drv_free(const fa_cudart *rt, devstate *d, void *p)
{
    uint64_t t0 = now_ns();
    fa_cuda_error r = rt->cudaFree(p);
    ST_ADD(d, driver_ns, now_ns() - t0);
    ST_ADD(d, driver_free_calls, 1);
    return r;
}

static bool capturing(void) { return __atomic_load_n(&captures, __ATOMIC_ACQUIRE) > 0; }

static int current_device(const fa_cudart *rt)
{
    int dev = -1;
    if (!rt->cudaGetDevice || rt->cudaGetDevice(&dev) != 0 || dev < 0 || dev >= FA_MAX_DEVICES)
        return -1;
    return dev;
}

/* ---- blind spots ------------------------------------------------------------ */

/* The value of the last `key:value` item of a PyTorch allocator setting
 * (later items override earlier ones; spaces around tokens are ignored)
 * equals `value`, case-insensitively. */
static bool conf_says(const char *conf, const char *key, const char *value)
{
    bool says = false;
    size_t klen = strlen(key), vlen = strlen(value);
    for (const char *c = conf; (c = strstr(c, key)); c++) {
        if (c != conf && c[-1] != ',' && c[-1] != ' ')
            continue;
        const char *v = c + klen;
        while (*v == ' ')
            v++;
        if (*v++ != ':')
            continue;
        while (*v == ' ')
            v++;
        size_t n = strcspn(v, ", ");
        says = n == vlen && strncasecmp(v, value, n) == 0;
    }
    return says;
}

#define FA_BLIND_REASON(var, what) var " asks for " what ", so PyTorch allocates without cudaMalloc"

/* Whether the environment configures PyTorch to allocate device memory
 * without cudaMalloc (expandable segments map memory with cuMemCreate;
 * the cudaMallocAsync backend uses stream-ordered pools), and why.
 * PyTorch 2.9 and later read PYTORCH_ALLOC_CONF, falling back to the
 * older PYTORCH_CUDA_ALLOC_CONF; earlier versions read only the latter.
 * The version is not known here, so either one counts.  Reads the
 * environment as it is now (programs often set these from Python before
 * importing torch); no allocation, no lock, no output: safe on the dump
 * and signal paths. */
static const char *blind_env(void)
{
    static const struct {
        const char *var, *key, *value, *reason;
    } rules[] = {
        {"PYTORCH_ALLOC_CONF", "expandable_segments", "true",
         FA_BLIND_REASON("PYTORCH_ALLOC_CONF", "expandable_segments:True")},
        {"PYTORCH_ALLOC_CONF", "backend", "cudaMallocAsync",
         FA_BLIND_REASON("PYTORCH_ALLOC_CONF", "backend:cudaMallocAsync")},
        {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments", "true",
         FA_BLIND_REASON("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")},
        {"PYTORCH_CUDA_ALLOC_CONF", "backend", "cudaMallocAsync",
         FA_BLIND_REASON("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        const char *conf = getenv(rules[i].var);
        if (conf && conf_says(conf, rules[i].key, rules[i].value))
            return rules[i].reason;
    }
    return NULL;
}

/* Decided once, when the first pool is sized: the pool then stays as it
 * was made, and the decision is logged. */
static bool blind(void)
{
    if (__atomic_load_n(&blind_state, __ATOMIC_ACQUIRE))
        return blind_state == 2;
    const char *why = blind_env();
    if (why) {
        __atomic_store_n(&blind_reason, why, __ATOMIC_RELAXED);
        fa_info("device pool off: %s", why);
    }
    __atomic_store_n(&blind_state, why ? 2 : 1, __ATOMIC_RELEASE);
    return why != NULL;
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
    bool clear = error_clear(rt);
    if (!rt->cudaMemGetInfo || rt->cudaMemGetInfo(&f, &t) != 0) {
        absorb(rt, clear);
        return 0;
    }
    return (uint64_t)((double)t * v->d / 100.0);
}

/* Reserve the pool of device `dev` if it is still untouched.  Driver calls
 * are made without the lock; meanwhile other threads use the driver. */
static void ensure_pool(const fa_cudart *rt, devstate *d, int dev)
{
    int st = __atomic_load_n(&d->state, __ATOMIC_ACQUIRE);
    if (st == READY || st == PASSTHROUGH)
        return;
    pthread_mutex_lock(&lock);
    if (d->state != UNTOUCHED || capturing()) { /* during a capture: try again later */
        pthread_mutex_unlock(&lock);
        return;
    }
    d->state = RESERVING;
    pthread_mutex_unlock(&lock);

    uint64_t target = blind() ? 0 : pool_target(rt);
    size_t chunk = chunk_bytes();
    while (chunk > target && chunk > (1u << 20))
        chunk >>= 1;
    size_t want = chunk && target >= chunk ? (size_t)(target / chunk) : 0;
    if (want > FA_POOL_MAX_CHUNKS)
        want = FA_POOL_MAX_CHUNKS;
    void **got = want ? calloc(want, sizeof *got) : NULL;
    size_t n = 0;
    bool clear = error_clear(rt);
    while (got && n < want) {
        if (drv_malloc(rt, d, &got[n], chunk) != 0) {
            absorb(rt, clear); /* the driver has less than the pool wants */
            break;
        }
        n++;
    }
    pthread_mutex_lock(&lock);
    fa_pool_init(&d->pool, chunk);
    d->target = (uint64_t)want * chunk;
    size_t added = 0;
    for (size_t i = 0; i < n; i++) {
        if (fa_pool_add_chunk(&d->pool, (uintptr_t)got[i]))
            added++;
        else
            drv_free(rt, d, got[i]);
    }
    __atomic_store_n(&d->state, added ? READY : PASSTHROUGH, __ATOMIC_RELEASE);
    sync_stats(d);
    pthread_mutex_unlock(&lock);
    free(got);
    if (want)
        fa_info("device %d: pool of %zu MiB in %zu chunks (%zu MiB wanted)", dev, added * (chunk >> 20), added,
                want * (chunk >> 20));
}

/* Reserve one more chunk when the pool gave some back earlier. */
static bool grow_pool(const fa_cudart *rt, devstate *d)
{
    pthread_mutex_lock(&lock);
    bool may = d->state == READY && d->pool.bytes < d->target && !capturing();
    size_t chunk = d->pool.chunk_size;
    pthread_mutex_unlock(&lock);
    if (!may)
        return false;
    void *p = NULL;
    bool clear = error_clear(rt);
    if (drv_malloc(rt, d, &p, chunk) != 0) {
        absorb(rt, clear);
        return false;
    }
    pthread_mutex_lock(&lock);
    bool ok = d->state == READY && fa_pool_add_chunk(&d->pool, (uintptr_t)p);
    sync_stats(d);
    pthread_mutex_unlock(&lock);
    if (!ok)
        drv_free(rt, d, p);
    return ok;
}

/* ---- allocation ------------------------------------------------------------------ */

static bool pool_alloc(devstate *d, size_t n, void **out)
{
    uintptr_t a;
    pthread_mutex_lock(&lock);
    bool ok = d->state == READY && fa_pool_alloc(&d->pool, n, &a);
    if (ok) {
        ST_ADD(d, allocs, 1);
        ST_ADD(d, pool_allocs, 1);
        sync_stats(d);
        *out = (void *)a;
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

/* Synchronise device `dev` and free what was quarantined before.  False if
 * there was nothing to free, a capture is running, or the sync failed. */
/* A device synchronisation is starting: if d has quarantined blocks, true
 * and *e, the epoch whose blocks it will make safe to reuse. */
static bool epoch_begin(devstate *d, uint32_t *e)
{
    pthread_mutex_lock(&lock);
    bool any = d->state == READY && d->pool.quarantined > 0;
    if (any)
        *e = fa_pool_sync_begin(&d->pool);
    pthread_mutex_unlock(&lock);
    return any;
}

/* The synchronisation begun at epoch e succeeded: release its blocks. */
static void epoch_end(devstate *d, uint32_t e)
{
    pthread_mutex_lock(&lock);
    if (d->state == READY)
        fa_pool_sync_end(&d->pool, e);
    sync_stats(d);
    pthread_mutex_unlock(&lock);
}

static bool sync_device(const fa_cudart *rt, devstate *d, int dev)
{
    uint32_t e;
    if (capturing() || !rt->cudaDeviceSynchronize || !epoch_begin(d, &e))
        return false;
    bool clear = error_clear(rt);
    int cur = current_device(rt);
    if (cur != dev && rt->cudaSetDevice)
        rt->cudaSetDevice(dev);
    uint64_t t0 = now_ns();
    fa_cuda_error r = rt->cudaDeviceSynchronize();
    ST_ADD(d, driver_ns, now_ns() - t0);
    ST_ADD(d, device_syncs, 1);
    if (cur >= 0 && cur != dev)
        rt->cudaSetDevice(cur);
    if (r != 0) {
        absorb(rt, clear);
        return false;
    }
    epoch_end(d, e);
    return true;
}

/* The driver serves the request; if it is out of memory, the pool gives
 * back what it can (after a sync if freed blocks pin a chunk) and the
 * request is retried.  The last answer is the driver's. */
static fa_cuda_error driver_alloc(const fa_cudart *rt, devstate *d, int dev, void **out, size_t n)
{
    bool clear = error_clear(rt);
    fa_cuda_error r;
    for (;;) {
        r = drv_malloc(rt, d, out, n);
        if (r != FA_CUDA_ERROR_MEMORY_ALLOCATION || capturing())
            break;
        if (sync_device(rt, d, dev) && pool_alloc(d, n, out)) {
            absorb(rt, clear); /* served after all: no error remains */
            return 0;
        }
        uintptr_t base;
        pthread_mutex_lock(&lock);
        bool got = d->state == READY && fa_pool_take_idle_chunk(&d->pool, &base);
        if (got) {
            ST_ADD(d, chunks_returned, 1);
            sync_stats(d);
        }
        pthread_mutex_unlock(&lock);
        if (!got)
            break;
        drv_free(rt, d, (void *)base);
        absorb(rt, clear); /* the error we are retrying past */
    }
    pthread_mutex_lock(&lock);
    if (r == 0 && *out) {
        if (!fa_ptrmap_put(&fallback, (uintptr_t)*out, dev, n))
            fa_debug("no memory to track a driver allocation; its cudaFree will not be counted");
        d->fallback_bytes += n;
        ST_ADD(d, allocs, 1);
        ST_ADD(d, fallback_allocs, 1);
        sync_stats(d);
    } else if (r != 0) {
        ST_ADD(d, failed_allocs, 1);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

fa_cuda_error fa_device_malloc(void **out, size_t n)
{
    const fa_cudart *rt = runtime("cudaMalloc");
    if (!rt->cudaMalloc)
        return FA_CUDA_ERROR_INITIALIZATION;
    int dev = current_device(rt);
    if (!out || dev < 0)
        return rt->cudaMalloc(out, n); /* nothing we could do better: the driver answers */
    devstate *d = &devs[dev];
    __atomic_store_n(&d->used, 1, __ATOMIC_RELAXED);
    if (n > 0) {
        ensure_pool(rt, d, dev);
        if (n <= __atomic_load_n(&d->pool.chunk_size, __ATOMIC_ACQUIRE) &&
            (pool_alloc(d, n, out) || (sync_device(rt, d, dev) && pool_alloc(d, n, out)) ||
             (grow_pool(rt, d) && pool_alloc(d, n, out))))
            return 0;
    }
    return driver_alloc(rt, d, dev, out, n);
}

fa_cuda_error fa_device_free(void *p)
{
    const fa_cudart *rt = runtime("cudaFree");
    if (!rt->cudaFree)
        return FA_CUDA_ERROR_INITIALIZATION;
    if (!p)
        return rt->cudaFree(p); /* cudaFree(NULL) creates the context: the driver's business */
    pthread_mutex_lock(&lock);
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &devs[dev];
        if (d->state != READY)
            continue;
        size_t taken, requested;
        fa_pool_free_result res = fa_pool_free(&d->pool, (uintptr_t)p, &taken, &requested);
        if (res == FA_POOL_NOT_OURS)
            continue;
        if (res == FA_POOL_FREED) {
            ST_ADD(d, frees, 1);
            sync_stats(d);
        }
        pthread_mutex_unlock(&lock);
        /* Inside a chunk but not a live block (double free, interior
         * pointer): the driver must never see it, it would free the chunk. */
        return res == FA_POOL_FREED ? 0 : FA_CUDA_ERROR_INVALID_VALUE;
    }
    int dev;
    size_t size;
    bool ours = fa_ptrmap_take(&fallback, (uintptr_t)p, &dev, &size);
    pthread_mutex_unlock(&lock);
    if (!ours)
        return rt->cudaFree(p); /* not from cudaMalloc through us: unchanged */
    devstate *d = &devs[dev];
    fa_cuda_error r = drv_free(rt, d, p);
    pthread_mutex_lock(&lock);
    if (r == 0) {
        d->fallback_bytes -= size;
        ST_ADD(d, frees, 1);
        sync_stats(d);
    } else {
        fa_ptrmap_put(&fallback, (uintptr_t)p, dev, size);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

fa_cuda_error fa_device_mem_get_info(size_t *free_b, size_t *total_b)
{
    const fa_cudart *rt = runtime("cudaMemGetInfo");
    if (!rt->cudaMemGetInfo)
        return FA_CUDA_ERROR_INITIALIZATION;
    fa_cuda_error r = rt->cudaMemGetInfo(free_b, total_b);
    int dev = r == 0 && free_b && total_b ? current_device(rt) : -1;
    if (dev >= 0) {
        pthread_mutex_lock(&lock);
        uint64_t idle = devs[dev].state == READY ? fa_pool_idle(&devs[dev].pool) : 0;
        pthread_mutex_unlock(&lock);
        uint64_t f = (uint64_t)*free_b + idle;
        *free_b = (size_t)(f > *total_b ? *total_b : f);
    }
    return r;
}

fa_cuda_error fa_device_reset(void)
{
    const fa_cudart *rt = runtime("cudaDeviceReset");
    if (!rt->cudaDeviceReset)
        return FA_CUDA_ERROR_INITIALIZATION;
    int dev = current_device(rt);
    if (dev >= 0) {
        /* The reset frees every allocation of the device, chunks included. */
        devstate *d = &devs[dev];
        pthread_mutex_lock(&lock);
        fa_pool_clear(&d->pool);
        fa_ptrmap_drop_device(&fallback, dev);
        d->fallback_bytes = 0;
        __atomic_store_n(&d->state, UNTOUCHED, __ATOMIC_RELEASE);
        sync_stats(d);
        pthread_mutex_unlock(&lock);
    }
    return rt->cudaDeviceReset();
}

fa_cuda_error fa_device_synchronize(void)
{
    const fa_cudart *rt = runtime("cudaDeviceSynchronize");
    if (!rt->cudaDeviceSynchronize)
        return FA_CUDA_ERROR_INITIALIZATION;
    int dev = current_device(rt);
    devstate *d = dev >= 0 ? &devs[dev] : NULL;
    uint32_t e = 0;
    bool any = d && epoch_begin(d, &e);
    fa_cuda_error r = rt->cudaDeviceSynchronize();
    if (r == 0 && any) /* the application's sync frees our quarantine too */
        epoch_end(d, e);
    return r;
}

fa_cuda_error fa_device_ipc_get_handle(fa_cuda_ipc_handle *h, void *p)
{
    const fa_cudart *rt = runtime("cudaIpcGetMemHandle");
    if (!rt->cudaIpcGetMemHandle)
        return FA_CUDA_ERROR_INITIALIZATION;
    bool pooled = false;
    pthread_mutex_lock(&lock);
    for (int dev = 0; dev < FA_MAX_DEVICES && !pooled; dev++)
        pooled = devs[dev].state == READY && fa_pool_owns(&devs[dev].pool, (uintptr_t)p);
    pthread_mutex_unlock(&lock);
    if (!pooled)
        return rt->cudaIpcGetMemHandle(h, p);
    /* A handle names a whole driver allocation; the receiver would map our
     * chunk, not this block. */
    if (!__atomic_exchange_n(&warned_ipc, 1, __ATOMIC_RELAXED))
        fa_warn("cudaIpcGetMemHandle cannot share memory from the device pool between processes; set "
                "FORGEALLOC_DEVICE_POOL_SIZE=0 for programs that do (e.g. torch.multiprocessing with CUDA tensors)");
    return FA_CUDA_ERROR_INVALID_VALUE;
}

/* ---- pass-through and capture tracking ------------------------------------------------ */

void fa_device_count(enum fa_cuda_pt which) { __atomic_fetch_add(&passthrough[which], 1, __ATOMIC_RELAXED); }

const struct fa_cudart *fa_device_runtime(const char *fn) { return runtime(fn); }

void fa_device_capture_begun(fa_cuda_error r)
{
    if (r == 0)
        __atomic_fetch_add(&captures, 1, __ATOMIC_ACQ_REL);
}

void fa_device_capture_ended(fa_cuda_error r)
{
    /* The capture is over whether it succeeded or was invalidated. */
    if (r != 0 && r != FA_CUDA_ERROR_CAPTURE_INVALIDATED)
        return;
    int c = __atomic_load_n(&captures, __ATOMIC_ACQUIRE);
    while (c > 0 && !__atomic_compare_exchange_n(&captures, &c, c - 1, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        ;
}

/* ---- reports and fork ------------------------------------------------------------------ */

void fa_device_fill(struct fa_snapshot *s)
{
    s->cuda_seen = __atomic_load_n(&cuda_seen, __ATOMIC_RELAXED);
    /* Blind as decided when the pool was sized; before any cudaMalloc
     * (PyTorch under these settings never calls it), as the environment
     * says now. */
    int bs = __atomic_load_n(&blind_state, __ATOMIC_ACQUIRE);
    s->blind_reason = bs == 2 ? __atomic_load_n(&blind_reason, __ATOMIC_RELAXED) : bs == 1 ? NULL : blind_env();
    s->device_blind = s->blind_reason != NULL;
    for (int i = 0; i < FA_PT_COUNT; i++)
        s->passthrough[i] = __atomic_load_n(&passthrough[i], __ATOMIC_RELAXED);
    s->ndevices = 0;
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &devs[dev];
        if (!__atomic_load_n(&d->used, __ATOMIC_RELAXED))
            continue;
        fa_device_stats *o = &s->dev[s->ndevices++];
        o->device = dev;
#define FA_DEV_COPY(name, unit, doc) o->name = __atomic_load_n(&d->st.name, __ATOMIC_RELAXED);
        FA_DEVICE_FIELDS(FA_DEV_COPY)
#undef FA_DEV_COPY
    }
}

void fa_device_fork_prepare(void) { pthread_mutex_lock(&lock); }

void fa_device_fork_parent(void) { pthread_mutex_unlock(&lock); }

void fa_device_fork_child(void)
{
    /* CUDA contexts do not survive fork: the child starts with no pools
     * and counts its own calls. */
    pthread_mutex_init(&lock, NULL);
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &devs[dev];
        if (!d->used && d->state == UNTOUCHED)
            continue; /* never touched: nothing to reset (and no page to fault in) */
        fa_pool_clear(&d->pool);
        d->state = UNTOUCHED;
        d->target = d->fallback_bytes = 0;
        d->used = 0;
        memset(&d->st, 0, sizeof d->st);
    }
    fa_ptrmap_clear(&fallback);
    memset(passthrough, 0, sizeof passthrough);
    captures = 0;
    cuda_seen = 0;
}
