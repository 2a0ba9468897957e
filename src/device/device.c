/* device.c - cudaMalloc and cudaFree served from a pool per GPU.
 *
 * Where the driver supports virtual-memory management the pool is made of
 * 2 MiB physical pieces (cuMemCreate) mapped into address space reserved
 * once per device (vmpool.c decides which); elsewhere, of chunks taken with
 * cudaMalloc (pool.c).  The rules that keep it as safe as the driver:
 *  - a freed block is quarantined until a device synchronisation that
 *    began after the free (the real cudaFree synchronises; we synchronise
 *    only when nothing else serves a request, or ride on the application's
 *    own cudaDeviceSynchronize).  Pieces are unmapped and released only
 *    when idle, i.e. after that synchronisation: cuMemUnmap does not wait
 *    for queued work;
 *  - grow before waiting: when ready memory cannot serve, idle pieces are
 *    moved and new ones created while the driver has room; what was grown
 *    beyond FORGEALLOC_DEVICE_POOL_SIZE goes back after an idle spell
 *    (fa_device_background) and at once when the driver runs short.  The
 *    chunk pool grows only back to its size (chunks it gave back), then
 *    waits: it has no way to give back growth but a whole idle chunk's
 *    synchronising cudaFree, and never holds more than its size;
 *  - no synchronisation and no driver call of the pool's while a stream
 *    capture is in progress (a sync would invalidate the capture):
 *    requests that ready memory cannot serve go to the driver; a capture
 *    begins only after the pool's syncs and background calls under way
 *    have returned (sections);
 *  - a free the runtime would refuse for a cudaMalloc block is refused
 *    alike, with its error, and the block stays allocated: cudaFree during
 *    a stream capture where the capture mode prohibits it, cudaFreeAsync on
 *    a stream the runtime does not know or one being captured;
 *  - when the driver runs out of memory, idle pieces or chunks go back to
 *    it and the request is retried; the final error is the driver's own;
 *  - internal calls that fail leave the thread's last error as the program
 *    left it: no error for cudaGetLastError (PyTorch throws on any pending
 *    error other than cudaErrorMemoryAllocation), or the program's own;
 *  - cudaMemGetInfo counts as free what the pool would give back to the
 *    driver: idle pieces and those the next synchronisation makes idle, or
 *    chunks holding no live block, with what is quarantined there (never
 *    free space a live block pins).
 * Locks: one per device (its pool and numbers), one for the map of
 * driver-served blocks; never both, never across a synchronisation. */
#define _GNU_SOURCE
#include "device.h"

#include <errno.h>
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
#include "vmpool.h"

/* A synchronisation's epoch in the pool of one generation (see devstate). */
typedef struct {
    uint32_t epoch;
    unsigned generation;
} epoch;

/* RESERVING and RESETTING: a thread makes driver calls for the pool
 * without the lock; no other thread reserves or resets meanwhile. */
enum pool_state { UNTOUCHED, RESERVING, READY, PASSTHROUGH, RESETTING };
enum pool_kind { KIND_NONE, KIND_CHUNKS, KIND_VMM };

#define IDLE_SPELL_MS 10000 /* grown pieces go back after this long without growth */
#define RESERVE_WAIT_S 2     /* the longest a first call waits for another thread's reservation */
/* A program that frees without ever synchronising gets a synchronisation
 * from the pool once this many blocks wait in quarantine (the driver's own
 * cudaFree synchronises on every call).  Without it the quarantine of a
 * large pool holds tens of thousands of blocks spread over the whole
 * reservation, and each one's record costs a cache and TLB miss when it
 * comes out: the cost per cudaMalloc would follow the pool's size.
 * One such synchronisation runs at a time per device: it lasts as long as
 * the device's queued work, and every free meanwhile still sees the full
 * quarantine; were each to start its own, all the freeing threads would
 * wait in a sync.  The bound is then exceeded by the frees made during one
 * sync.  One that fails (a sticky error) is tried again only after as many
 * frees again, or once some other sync succeeded: its blocks stay
 * quarantined meanwhile, never reused. */
#define QUARANTINE_MAX_BLOCKS 1024

/* Laid out in cache lines by who writes them: the fields every thread's
 * cudaFree reads (to find the owning device) change only at reservation
 * and reset; the lock and the pool change with every call on this device;
 * the stats are written on every call too.  A thread working on one device
 * then never writes a line another device's thread reads. */
typedef struct __attribute__((aligned(64))) devstate {
    /* under `lock`, and read atomically without it */
    int state;
    int kind;
    uintptr_t vm_base;       /* the reservation, 0 when none */
    size_t vm_bytes;
    unsigned peers;          /* bit p: device p may access this pool (cudaDeviceEnablePeerAccess) */
    /* everything here; adaptive: it is held for a few hundred nanoseconds,
     * so a second thread spins briefly instead of sleeping in the kernel
     * (two threads on one device: 0.6-0.7x the time per pair) */
    pthread_mutex_t lock __attribute__((aligned(64)));
    pthread_cond_t settled;  /* broadcast when state leaves RESERVING or RESETTING */
    fa_pool pool;            /* KIND_CHUNKS */
    fa_vm vm;                /* KIND_VMM */
    uint64_t target;         /* pool bytes wanted (kept once used) */
    uint64_t fallback_bytes; /* requested bytes of live driver allocations */
    uint64_t last_grow_ms;   /* CLOCK_MONOTONIC */
    uint64_t grow_ns;        /* spent creating and moving pieces since the last sync */
    uint64_t piece_ns;       /* what a piece created or moved costs (running mean; 0: none yet) */
    uint64_t sync_ns;        /* what a sync that freed the quarantine cost (running mean; 0: none yet) */
    int used;                /* some cudaMalloc/cudaFree reached this device */
    unsigned generation;     /* resets so far: a pool is the same pool only within one */
    bool bound_sync;         /* a sync for QUARANTINE_MAX_BLOCKS is under way (fa_device_free) */
    uint32_t bound_retry;    /* after one failed: quarantine length of the next try (0: none failed) */
    fa_device_stats st __attribute__((aligned(64))); /* written under `lock`, read without it */
} devstate;

static devstate devs[FA_MAX_DEVICES] = {
    [0 ... FA_MAX_DEVICES - 1] = {.lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP, .settled = PTHREAD_COND_INITIALIZER}};
static fa_ptrmap fallback;
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER; /* fallback */
static uint64_t passthrough[FA_PT_COUNT];
static int captures;    /* stream captures in progress, process-wide */
static int cuda_seen;
static int blind_state;          /* 0 not decided yet, 1 not blind, 2 blind */
static const char *blind_reason; /* set before blind_state becomes 2 */
static int warned_missing, warned_ipc, warned_chunk;
static int background_wanted; /* some pool grew beyond its size */
static bool (*waker)(void);

void fa_device_set_waker(bool (*wake)(void)) { __atomic_store_n(&waker, wake, __ATOMIC_RELEASE); }

#define ST_ADD(d, field, v) __atomic_fetch_add(&(d)->st.field, (v), __ATOMIC_RELAXED)
#define ST_SET(d, field, v) __atomic_store_n(&(d)->st.field, (v), __ATOMIC_RELAXED)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int kind_of(devstate *d) { return __atomic_load_n(&d->kind, __ATOMIC_ACQUIRE); }
static int state_of(devstate *d) { return __atomic_load_n(&d->state, __ATOMIC_ACQUIRE); }

/* Pre: d->lock held.  Mirror the pool's numbers into the stats. */
static void sync_stats(devstate *d)
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

/* Around an internal call whose failure we handle: the thread's last
 * error before it, and after it that error again, the program's own (see
 * fa_cudart_error_restore; a no-op when nothing failed). */
static fa_cuda_error error_peek(const fa_cudart *rt) { return fa_cudart_error_peek(rt); }
static void absorb(const fa_cudart *rt, fa_cuda_error before) { fa_cudart_error_restore(rt, before); }

static fa_cuda_error drv_malloc(const fa_cudart *rt, devstate *d, void **p, size_t n)
{
    uint64_t t0 = now_ns();
    fa_cuda_error r = rt->cudaMalloc(p, n);
    ST_ADD(d, driver_ns, now_ns() - t0);
    ST_ADD(d, driver_malloc_calls, 1);
    return r;
}

/* cudaDeviceSynchronize on the thread's current device, timed and counted. */
static fa_cuda_error drv_sync(const fa_cudart *rt, devstate *d)
{
    uint64_t t0 = now_ns();
    fa_cuda_error r = rt->cudaDeviceSynchronize();
    ST_ADD(d, driver_ns, now_ns() - t0);
    ST_ADD(d, device_syncs, 1);
    return r;
}

/* cudaFree, or with `async` cudaFreeAsync on stream s. */
static fa_cuda_error drv_free(const fa_cudart *rt, devstate *d, void *p, fa_cuda_error (*async)(void *, fa_cuda_stream),
                              fa_cuda_stream s)
{
    uint64_t t0 = now_ns();
    fa_cuda_error r = async ? async(p, s) : rt->cudaFree(p);
    ST_ADD(d, driver_ns, now_ns() - t0);
    ST_ADD(d, driver_free_calls, 1);
    return r;
}

static bool capturing(void) { return __atomic_load_n(&captures, __ATOMIC_ACQUIRE) > 0; }

/* Sections: the pool's own synchronisations and background driver calls,
 * which a capture must not overlap (a sync during a capture invalidates
 * it, on whichever thread it runs).  A section is entered only while no
 * capture runs or is about to begin, and a capture begins only once the
 * sections entered before it was announced have left: the check and the
 * calls after it cannot straddle the capture's begin.  Each side writes
 * its counter before it reads the other's (sequentially consistent), so
 * at least one of them sees the other. */
static int sections;

static bool section_enter(void)
{
    __atomic_fetch_add(&sections, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&captures, __ATOMIC_SEQ_CST) == 0)
        return true;
    __atomic_fetch_sub(&sections, 1, __ATOMIC_SEQ_CST);
    return false;
}

static void section_leave(void) { __atomic_fetch_sub(&sections, 1, __ATOMIC_RELEASE); }

/* A capture is about to begin: counted from now (no section enters), then
 * wait for the sections under way (a sync may take as long as the queued
 * work). */
static void capture_announce(void)
{
    __atomic_fetch_add(&captures, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&sections, __ATOMIC_SEQ_CST) > 0) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

/* Streams in capture, as begun through the shim.  A capture is over when
 * the runtime says so after its cudaStreamEndCapture (whatever that
 * returned), when its stream is destroyed, and at a cudaDeviceReset of its
 * stream's device: a capture ended any of these ways must not keep the
 * pool from ever synchronising again.  More captures at once than slots
 * are counted (capture_unslotted) and end with their cudaStreamEndCapture. */
#define CAPTURE_SLOTS 16
static fa_cuda_stream capture_stream[CAPTURE_SLOTS];
static int capture_device[CAPTURE_SLOTS]; /* the stream's device, -1 if unknown */
static bool capture_used[CAPTURE_SLOTS];
static int capture_unslotted; /* begun when every slot was taken */
static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;

static void capture_drop(int i)
{
    capture_used[i] = false;
    __atomic_fetch_sub(&captures, 1, __ATOMIC_ACQ_REL);
}

static int thread_device(const fa_cudart *rt);

/* The device stream s belongs to (-1 if unknown), asked while s exists (a
 * cudaDeviceReset destroys the streams of one device) and before its
 * capture begins: asking a capturing stream invalidates its capture (seen
 * on CUDA 13.0).  The runtime says where it can (cudaStreamGetDevice, CUDA
 * 12.8 and later); else the thread's device, which is that of NULL and the
 * per-thread stream, and of a created stream when it is captured with its
 * device current, as programs do (work is launched into it there). */
static int stream_device(const fa_cudart *rt, fa_cuda_stream s)
{
    int dev = -1;
    fa_cuda_error before = error_peek(rt);
    if (!rt->cudaStreamGetDevice || rt->cudaStreamGetDevice(s, &dev) != 0)
        dev = thread_device(rt);
    absorb(rt, before);
    return dev;
}

/* After the capture's begin (announced by fa_device_capture_before_begun):
 * counted from the announcement on, and no longer if it failed. */
void fa_device_capture_begun(fa_cuda_stream s, fa_cuda_error r, int dev)
{
    if (r != 0) {
        __atomic_fetch_sub(&captures, 1, __ATOMIC_ACQ_REL);
        return;
    }
    pthread_mutex_lock(&capture_lock);
    int i = 0;
    while (i < CAPTURE_SLOTS && capture_used[i])
        i++;
    if (i < CAPTURE_SLOTS) {
        capture_used[i] = true;
        capture_stream[i] = s;
        capture_device[i] = dev;
    } else {
        capture_unslotted++;
    }
    pthread_mutex_unlock(&capture_lock);
}

void fa_device_capture_ended(fa_cuda_stream s, fa_cuda_error r, int unused)
{
    (void)unused;
    const fa_cudart *rt = runtime("cudaStreamEndCapture");
    pthread_mutex_lock(&capture_lock);
    int i = 0;
    while (i < CAPTURE_SLOTS && !(capture_used[i] && capture_stream[i] == s))
        i++;
    if (i < CAPTURE_SLOTS) {
        fa_cuda_capture_status status = 0; /* cudaStreamCaptureStatusNone */
        fa_cuda_error before = error_peek(rt);
        if (!rt->cudaStreamIsCapturing || rt->cudaStreamIsCapturing(s, &status) != 0 || status == 0)
            capture_drop(i);
        absorb(rt, before); /* the call's own error is cudaStreamEndCapture's */
    } else if ((r == 0 || r == FA_CUDA_ERROR_CAPTURE_INVALIDATED) && capture_unslotted > 0) {
        capture_unslotted--;
        __atomic_fetch_sub(&captures, 1, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&capture_lock);
}

/* Before cudaStreamDestroy: its capture, if any, ends with it (and the
 * handle may name a new stream once destroyed). */
void fa_device_stream_destroying(fa_cuda_stream s)
{
    pthread_mutex_lock(&capture_lock);
    for (int i = 0; i < CAPTURE_SLOTS; i++)
        if (capture_used[i] && capture_stream[i] == s)
            capture_drop(i);
    pthread_mutex_unlock(&capture_lock);
}

/* After cudaDeviceReset of device dev (-1: unknown): the captures on its
 * streams ended with them; another device's go on.  Each capture's device
 * was noted when it began: the reset's streams are destroyed, and one
 * named now (a destroyed handle) is undefined behaviour in CUDA and may
 * name a new stream by then, so none is asked about.  A capture that
 * cannot be placed (its device or the reset's unknown) is forgotten, as
 * are the uncounted ones: one kept after its end would keep the pool from
 * ever synchronising again. */
static void captures_forget(int dev)
{
    pthread_mutex_lock(&capture_lock);
    for (int i = 0; i < CAPTURE_SLOTS; i++)
        if (capture_used[i] && (dev < 0 || capture_device[i] < 0 || capture_device[i] == dev))
            capture_drop(i);
    __atomic_fetch_sub(&captures, capture_unslotted, __ATOMIC_ACQ_REL);
    capture_unslotted = 0;
    pthread_mutex_unlock(&capture_lock);
}

/* Whether the pool may serve this thread's cudaMalloc without the
 * runtime: always outside captures; during one only in relaxed mode (as
 * PyTorch allocates).  In the other modes the runtime decides: it refuses
 * a cudaMalloc the capture prohibits and invalidates the capture, as it
 * would without the pool. */
static bool pool_may_serve(const fa_cudart *rt)
{
    if (!capturing())
        return true;
    fa_cuda_capture_mode mode = FA_CUDA_CAPTURE_MODE_RELAXED;
    if (!rt->cudaThreadExchangeStreamCaptureMode || rt->cudaThreadExchangeStreamCaptureMode(&mode) != 0)
        return false;
    fa_cuda_capture_mode back = mode;
    rt->cudaThreadExchangeStreamCaptureMode(&back);
    return mode == FA_CUDA_CAPTURE_MODE_RELAXED;
}

/* The thread's device as the runtime numbers it (-1 if unknown), also
 * beyond the devices the pool serves: what a switch must restore. */
static int thread_device(const fa_cudart *rt)
{
    int dev = -1;
    if (!rt->cudaGetDevice || rt->cudaGetDevice(&dev) != 0)
        return -1;
    return dev;
}

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

/* ---- the driver's virtual-memory calls, for vmpool.c ---------------------------- */

typedef struct vmctx {
    const fa_cudrv *drv;
    devstate *d;
    int dev;
} vmctx;

static void vm_call_done(devstate *d, uint64_t t0)
{
    ST_ADD(d, driver_ns, now_ns() - t0);
    ST_ADD(d, driver_vm_calls, 1);
}

static int vm_create(void *c, size_t bytes, uint64_t *handle)
{
    vmctx *x = c;
    fa_cu_alloc_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = FA_CU_ALLOCATION_TYPE_PINNED;
    prop.location.type = FA_CU_LOCATION_TYPE_DEVICE;
    prop.location.id = x->dev;
    fa_cu_handle h = 0;
    uint64_t t0 = now_ns();
    int r = x->drv->cuMemCreate(&h, bytes, &prop, 0);
    vm_call_done(x->d, t0);
    if (r == 0) {
        *handle = h;
        ST_ADD(x->d, pieces_created, 1);
    }
    return r;
}

static int vm_release(void *c, uint64_t handle)
{
    vmctx *x = c;
    uint64_t t0 = now_ns();
    int r = x->drv->cuMemRelease((fa_cu_handle)handle);
    vm_call_done(x->d, t0);
    return r;
}

static int vm_map(void *c, uintptr_t addr, size_t bytes, uint64_t handle)
{
    vmctx *x = c;
    uint64_t t0 = now_ns();
    int r = x->drv->cuMemMap((fa_cu_ptr)addr, bytes, 0, (fa_cu_handle)handle, 0);
    vm_call_done(x->d, t0);
    return r;
}

static int vm_unmap(void *c, uintptr_t addr, size_t bytes)
{
    vmctx *x = c;
    uint64_t t0 = now_ns();
    int r = x->drv->cuMemUnmap((fa_cu_ptr)addr, bytes);
    vm_call_done(x->d, t0);
    return r;
}

/* cudaDeviceEnablePeerAccess does not reach mapped pieces: every device
 * the program enabled is named here, with the owner. */
static int vm_set_access(void *c, uintptr_t addr, size_t bytes)
{
    vmctx *x = c;
    fa_cu_access_desc desc[FA_MAX_DEVICES];
    unsigned mask = (1u << x->dev) | __atomic_load_n(&x->d->peers, __ATOMIC_ACQUIRE);
    size_t n = 0;
    for (int p = 0; p < FA_MAX_DEVICES; p++) {
        if (!((mask >> p) & 1))
            continue;
        memset(&desc[n], 0, sizeof desc[n]);
        desc[n].location.type = FA_CU_LOCATION_TYPE_DEVICE;
        desc[n].location.id = p;
        desc[n].flags = FA_CU_ACCESS_READWRITE;
        n++;
    }
    uint64_t t0 = now_ns();
    int r = x->drv->cuMemSetAccess((fa_cu_ptr)addr, bytes, desc, n);
    vm_call_done(x->d, t0);
    return r;
}

static const fa_vm_driver vm_driver = {vm_create, vm_release, vm_map, vm_unmap, vm_set_access};

/* Driver calls need the device's context current on the calling thread:
 * cudaSetDevice makes it so (once per thread and device). */
static __thread unsigned bound_devices;
static void bind_device(const fa_cudart *rt, int dev)
{
    if ((bound_devices >> dev) & 1 || !rt->cudaSetDevice)
        return;
    fa_cuda_error before = error_peek(rt);
    if (rt->cudaSetDevice(dev) == 0)
        bound_devices |= 1u << dev;
    else
        absorb(rt, before);
}

/* Reserve the address space of device dev's piece pool: false (and one
 * info line) where the driver cannot, and the chunk pool serves. */
static bool vm_reserve(const fa_cudart *rt, devstate *d, int dev)
{
    const char *why = NULL;
    const fa_cudrv *drv = NULL;
    int supported = 0;
    size_t gran = 0, f = 0, t = 0;
    fa_cu_ptr base = 0;
    fa_cu_alloc_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = FA_CU_ALLOCATION_TYPE_PINNED;
    prop.location.type = FA_CU_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    fa_cuda_error before = error_peek(rt);
    if (!fa_opt_u64(FA_OPT_DEVICE_VMM))
        why = "FORGEALLOC_DEVICE_VMM=0";
    else if (!rt->cudaMemGetInfo || rt->cudaMemGetInfo(&f, &t) != 0) /* also makes the context current */
        why = "cudaMemGetInfo failed";
    else if (!(drv = fa_cudrv_get(rt)))
        why = "the runtime gives no driver entry points for cuMemCreate and friends";
    else if (drv->cuDeviceGetAttribute(&supported, FA_CU_ATTR_VMM_SUPPORTED, dev) != 0 || supported != 1)
        why = "the device reports no virtual-memory management support";
    else if (drv->cuMemGetAllocationGranularity(&gran, &prop, FA_CU_GRANULARITY_MINIMUM) != 0 || !gran ||
             FA_VM_GRANULE % gran != 0)
        why = "the allocation granularity does not divide 2 MiB";
    else if (drv->cuMemAddressReserve(&base, 2 * fa_vm_zone_for(t), FA_VM_GRANULE, 0, 0) != 0)
        why = "no address space could be reserved";
    else if (!fa_vm_init(&d->vm, (uintptr_t)base, fa_vm_zone_for(t))) {
        drv->cuMemAddressFree(base, 2 * fa_vm_zone_for(t));
        why = "no memory for the pool's tables";
    }
    absorb(rt, before);
    if (why) {
        fa_info("device %d: chunk pool, not physical pieces: %s", dev, why);
        return false;
    }
    bound_devices |= 1u << dev;
    fa_info("device %d: pool of 2 MiB physical pieces in %zu GiB of reserved address space", dev,
            (size_t)(d->vm.zone >> 29));
    return true;
}

/* A running mean that follows the latest values (weight 1/2). */
static uint64_t follow(uint64_t mean, uint64_t v) { return mean ? mean / 2 + v / 2 : v; }

/* Pre: d->lock held, d a ready piece pool.  One try at n bytes: calls says
 * whether driver calls are allowed (growing included); what creating and
 * moving pieces took is counted (grow_ns, piece_ns). */
static bool vm_try(devstate *d, int dev, size_t n, bool calls, void **out)
{
    vmctx x = {fa_cudrv_get(fa_cudart_get()), d, dev};
    uintptr_t a = 0;
    unsigned created = 0;
    uint64_t stolen = d->vm.stolen, t0 = calls ? now_ns() : 0;
    fa_vm_result r = fa_vm_alloc(&d->vm, n, calls, calls && x.drv ? &vm_driver : NULL, &x, &a, &created);
    uint64_t moved = d->vm.stolen - stolen;
    ST_ADD(d, pieces_reused, moved);
    if (created + moved) {
        uint64_t spent = now_ns() - t0;
        d->grow_ns += spent;
        d->piece_ns = follow(d->piece_ns, spent / (created + moved));
    }
    if (created && d->vm.mapped > d->target) {
        ST_ADD(d, pieces_grown, created);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        d->last_grow_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
        if (!__atomic_exchange_n(&background_wanted, 1, __ATOMIC_ACQ_REL)) {
            bool (*w)(void) = __atomic_load_n(&waker, __ATOMIC_ACQUIRE);
            if (w)
                w();
        }
    }
    if (r != FA_VM_OK)
        return false;
    ST_ADD(d, pool_allocs, 1);
    *out = (void *)a;
    return true;
}

/* Pre: d->lock held.  Release every idle piece (none can receive queued
 * work: they passed the quarantine).  Returns how many went. */
static uint32_t vm_release_idle(devstate *d, int dev, uint64_t keep, bool small_too)
{
    vmctx x = {fa_cudrv_get(fa_cudart_get()), d, dev};
    return x.drv ? fa_vm_release_idle(&d->vm, keep, small_too, &vm_driver, &x) : 0;
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
    fa_cuda_error before = error_peek(rt);
    if (!rt->cudaMemGetInfo || rt->cudaMemGetInfo(&f, &t) != 0) {
        absorb(rt, before);
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
    fa_cuda_error before = error_peek(rt);
    while (got && n < want) {
        if (drv_malloc(rt, d, &got[n], chunk) != 0) {
            absorb(rt, before); /* the driver has less than the pool wants */
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
            drv_free(rt, d, got[i], NULL, NULL);
    }
    pthread_mutex_unlock(&d->lock);
    absorb(rt, before);
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
    int st = state_of(d);
    if (st == READY || st == PASSTHROUGH)
        return;
    pthread_mutex_lock(&d->lock);
    if (d->state == RESERVING && !capturing()) {
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
    if (d->state != UNTOUCHED || capturing()) { /* during a capture: try again later */
        pthread_mutex_unlock(&d->lock);
        return;
    }
    __atomic_store_n(&d->state, RESERVING, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&d->lock);

    uint64_t target = blind() ? 0 : pool_target(rt);
    int kind = KIND_NONE;
    if (target && vm_reserve(rt, d, dev))
        kind = KIND_VMM;
    else if (target && chunks_reserve(rt, d, dev, target))
        kind = KIND_CHUNKS;
    pthread_mutex_lock(&d->lock);
    if (kind == KIND_VMM) {
        d->target = target;
        __atomic_store_n(&d->vm_bytes, 2 * d->vm.zone, __ATOMIC_RELEASE);
        __atomic_store_n(&d->vm_base, d->vm.base, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&d->kind, kind, __ATOMIC_RELEASE);
    __atomic_store_n(&d->state, kind != KIND_NONE ? READY : PASSTHROUGH, __ATOMIC_RELEASE);
    sync_stats(d);
    pthread_cond_broadcast(&d->settled);
    pthread_mutex_unlock(&d->lock);
}

/* Reserve one more chunk when the chunk pool gave some back earlier. */
static bool grow_pool(const fa_cudart *rt, devstate *d)
{
    pthread_mutex_lock(&d->lock);
    bool may = d->state == READY && d->kind == KIND_CHUNKS && d->pool.bytes < d->target && !capturing();
    size_t chunk = d->pool.chunk_size;
    unsigned generation = d->generation;
    pthread_mutex_unlock(&d->lock);
    if (!may)
        return false;
    void *p = NULL;
    fa_cuda_error before = error_peek(rt);
    if (drv_malloc(rt, d, &p, chunk) != 0) {
        absorb(rt, before);
        return false;
    }
    /* A reset while the driver was asked (and perhaps a new pool since)
     * freed p or made it another pool's: only the same pool takes it. */
    pthread_mutex_lock(&d->lock);
    bool same = d->generation == generation && d->state == READY && d->kind == KIND_CHUNKS;
    bool ok = same && fa_pool_add_chunk(&d->pool, (uintptr_t)p);
    sync_stats(d);
    pthread_mutex_unlock(&d->lock);
    if (!ok) {
        before = error_peek(rt);
        if (drv_free(rt, d, p, NULL, NULL) != 0)
            absorb(rt, before); /* already gone with the reset */
    }
    return ok;
}

/* ---- allocation ------------------------------------------------------------------ */

/* Ready pool memory only: no driver call. */
static bool pool_alloc(devstate *d, int dev, size_t n, void **out)
{
    uintptr_t a;
    pthread_mutex_lock(&d->lock);
    bool ok = false;
    if (d->state == READY && d->kind == KIND_VMM) {
        ok = vm_try(d, dev, n, false, out);
    } else if (d->state == READY && d->kind == KIND_CHUNKS && fa_pool_alloc(&d->pool, n, &a)) {
        ST_ADD(d, pool_allocs, 1);
        *out = (void *)a;
        ok = true;
    }
    if (ok)
        sync_stats(d);
    pthread_mutex_unlock(&d->lock);
    return ok;
}

/* A device synchronisation is starting: if d has quarantined blocks, true
 * and *e, the epoch whose blocks it will make safe to reuse. */
static bool epoch_begin(devstate *d, epoch *e)
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

/* The synchronisation begun at e succeeded, after `waited` ns (0: not
 * timed): release its blocks (those of the same pool: a reset in between
 * made a new one, whose epochs are its own). */
static void epoch_end(devstate *d, epoch e, uint64_t waited)
{
    pthread_mutex_lock(&d->lock);
    d->bound_retry = 0; /* the device synchronises again */
    d->grow_ns = 0;
    if (waited)
        d->sync_ns = follow(d->sync_ns, waited);
    if (d->generation == e.generation && d->state == READY && d->kind == KIND_VMM)
        fa_vm_sync_end(&d->vm, e.epoch);
    else if (d->generation == e.generation && d->state == READY && d->kind == KIND_CHUNKS)
        fa_pool_sync_end(&d->pool, e.epoch);
    sync_stats(d);
    pthread_mutex_unlock(&d->lock);
}

/* Synchronise device `dev` and free what was quarantined before.  False if
 * there was nothing to free, a capture is running, or the sync failed. */
static bool sync_device(const fa_cudart *rt, devstate *d, int dev)
{
    epoch e;
    if (!rt->cudaDeviceSynchronize || !section_enter())
        return false;
    if (!epoch_begin(d, &e)) {
        section_leave();
        return false;
    }
    fa_cuda_error before = error_peek(rt);
    int cur = thread_device(rt);
    if (cur != dev && (!rt->cudaSetDevice || rt->cudaSetDevice(dev) != 0)) {
        absorb(rt, before);
        section_leave();
        return false; /* the sync would wait for the wrong device */
    }
    uint64_t t0 = now_ns();
    fa_cuda_error r = drv_sync(rt, d);
    uint64_t waited = now_ns() - t0;
    if (cur >= 0 && cur != dev)
        rt->cudaSetDevice(cur);
    absorb(rt, before);
    section_leave();
    if (r != 0)
        return false;
    epoch_end(d, e, waited ? waited : 1);
    return true;
}

/* The thread's device, when its pool is ready and no capture forbids the
 * pool's driver calls; -1 otherwise. */
static int pool_device(const fa_cudart *rt)
{
    int dev = capturing() ? -1 : current_device(rt);
    return dev >= 0 && state_of(&devs[dev]) == READY ? dev : -1;
}

int fa_device_capture_before_begun(fa_cuda_stream s)
{
    const fa_cudart *rt = fa_cudart_get();
    int dev = pool_device(rt);
    if (dev >= 0)
        sync_device(rt, &devs[dev], dev); /* none when nothing waits; leaves no error */
    int sdev = stream_device(rt, s);
    capture_announce();
    return sdev;
}

/* Pre: d->lock held.  The most a sync and giving back could add to what
 * the driver has free: idle pieces, and what the quarantine holds (the
 * pieces a sync makes idle, or its bytes if more); idle chunks and
 * quarantined bytes. */
static uint64_t reach_locked(const devstate *d)
{
    if (d->state == READY && d->kind == KIND_VMM)
        return d->vm.idle + (d->vm.reclaimable > d->vm.quarantined ? d->vm.reclaimable : d->vm.quarantined);
    if (d->state == READY && d->kind == KIND_CHUNKS)
        return fa_pool_idle(&d->pool) + d->pool.quarantined;
    return 0;
}

/* Whether n bytes are beyond what the driver has free on the thread's
 * device plus `reach`: then neither a sync nor giving memory back can
 * serve the request; they would only cost a wait and the pieces released
 * (created again by the next requests): a request larger than the device,
 * or a program probing for the largest block that fits.  False when the
 * driver cannot say. */
static bool beyond_reach(const fa_cudart *rt, size_t n, uint64_t reach)
{
    size_t f = 0, t = 0;
    fa_cuda_error before = error_peek(rt);
    bool known = rt->cudaMemGetInfo && rt->cudaMemGetInfo(&f, &t) == 0;
    absorb(rt, before);
    return known && n > (uint64_t)f + reach;
}

/* What a sync is taken to cost before one was timed: about a kernel's
 * worth of queued work. */
#define SYNC_GUESS_NS 1000000u

/* Pre: d->lock held.  Whether to synchronise (making the quarantined
 * blocks reusable) rather than grow for n bytes.  Growing maps pieces,
 * tens of microseconds each on a GPU (cuMemCreate, cuMemMap and
 * cuMemSetAccess); a sync waits for the queued work: microseconds on an
 * idle device, milliseconds behind a kernel.  The pool grows while what
 * growing cost since the last sync, this request included, stays below
 * what syncs cost lately, then syncs: never more than about twice the
 * cheaper way, an idle device reuses the blocks it freed instead of
 * taking the whole device, and a busy one grows a bounded amount between
 * syncs.  Nothing to go on (no piece grown yet): grow. */
static bool sync_pays(const devstate *d, size_t n)
{
    if (d->vm.quarantined < n || !d->piece_ns)
        return false;
    /* A large block is one piece of its own size, which costs about what a
     * 2 MiB piece does; a smaller one takes a piece per 2 MiB granule. */
    uint64_t pieces = n > FA_VM_GRANULE && n < FA_VM_LARGE_MIN ? (n + FA_VM_GRANULE - 1) / FA_VM_GRANULE : 1;
    return d->grow_ns + pieces * d->piece_ns >= (d->sync_ns ? d->sync_ns : SYNC_GUESS_NS);
}

/* The piece pool serves n bytes: ready memory, else (when a sync is the
 * cheaper way: sync_pays) the quarantined blocks after a synchronisation,
 * else idle pieces moved and new ones created, else every idle piece
 * released and created again (the driver ran short), else the same after
 * a synchronisation.  False if none of that serves: the driver answers. */
static bool vm_alloc(const fa_cudart *rt, devstate *d, int dev, size_t n, void **out)
{
    bool waited = false;  /* the sync chosen over growing was made */
    bool last_sync = false; /* the sync made when nothing else served */
    for (;;) {
        bool calls = !capturing();
        if (calls)
            bind_device(rt, dev);
        pthread_mutex_lock(&d->lock);
        if (d->state != READY || d->kind != KIND_VMM) {
            pthread_mutex_unlock(&d->lock);
            return false;
        }
        bool ok = vm_try(d, dev, n, false, out); /* ready memory: no driver call */
        bool wait = !ok && calls && !waited && sync_pays(d, n);
        bool hopeless = false;
        if (!ok && calls && !wait) {
            ok = vm_try(d, dev, n, true, out);
            hopeless = !ok && beyond_reach(rt, n, reach_locked(d));
            if (!ok && !hopeless) {
                /* A small block moves idle 2 MiB pieces itself; releasing
                 * them helps only a large one, or once freed blocks are back. */
                uint32_t released = vm_release_idle(d, dev, 0, n >= FA_VM_LARGE_MIN || last_sync);
                ST_ADD(d, pieces_released, released);
                ok = released && vm_try(d, dev, n, true, out);
            }
        }
        bool quarantined = d->vm.quarantined > 0 && !hopeless;
        sync_stats(d);
        pthread_mutex_unlock(&d->lock);
        if (ok)
            return true;
        if (wait) {
            waited = true; /* whatever it gave, growing comes next */
            sync_device(rt, d, dev);
            continue;
        }
        if (!calls || !quarantined || last_sync || !sync_device(rt, d, dev))
            return false;
        last_sync = true;
    }
}

/* Give something back to the driver that is short of memory: an idle
 * chunk, or every idle piece.  False if there was nothing. */
static bool give_back(const fa_cudart *rt, devstate *d, int dev)
{
    uintptr_t base;
    pthread_mutex_lock(&d->lock);
    bool chunk = false, any = false;
    if (d->state == READY && d->kind == KIND_CHUNKS && fa_pool_take_idle_chunk(&d->pool, &base)) {
        ST_ADD(d, chunks_returned, 1);
        chunk = any = true;
    } else if (d->state == READY && d->kind == KIND_VMM) {
        uint32_t released = vm_release_idle(d, dev, 0, true);
        ST_ADD(d, pieces_released, released);
        any = released > 0;
    }
    sync_stats(d);
    pthread_mutex_unlock(&d->lock);
    if (chunk) {
        fa_cuda_error before = error_peek(rt);
        drv_free(rt, d, (void *)base, NULL, NULL);
        absorb(rt, before);
    }
    return any;
}

/* The driver serves the request; if it is out of memory, the pool gives
 * back what it can (after a sync if freed blocks pin it) and the request
 * is retried.  The last answer is the driver's. */
static fa_cuda_error driver_alloc(const fa_cudart *rt, devstate *d, int dev, void **out, size_t n)
{
    fa_cuda_error before = error_peek(rt);
    fa_cuda_error r;
    for (;;) {
        r = drv_malloc(rt, d, out, n);
        if (r != FA_CUDA_ERROR_MEMORY_ALLOCATION || capturing())
            break;
        pthread_mutex_lock(&d->lock);
        uint64_t reach = reach_locked(d);
        pthread_mutex_unlock(&d->lock);
        if (beyond_reach(rt, n, reach))
            break;
        if (sync_device(rt, d, dev) && pool_alloc(d, dev, n, out)) {
            absorb(rt, before); /* served after all: no error remains */
            return 0;
        }
        if (!give_back(rt, d, dev))
            break;
        absorb(rt, before); /* the error we are retrying past */
    }
    if (r == 0 && *out) {
        pthread_mutex_lock(&map_lock);
        if (!fa_ptrmap_put(&fallback, (uintptr_t)*out, dev, n))
            fa_debug("no memory to track a driver allocation; its cudaFree will not be counted");
        pthread_mutex_unlock(&map_lock);
    }
    pthread_mutex_lock(&d->lock);
    if (r == 0 && *out) {
        d->fallback_bytes += n;
        ST_ADD(d, fallback_allocs, 1);
        sync_stats(d);
    } else if (r != 0) {
        ST_ADD(d, failed_allocs, 1);
    }
    pthread_mutex_unlock(&d->lock);
    return r;
}

fa_device_room fa_device_room_begin(void)
{
    fa_device_room room = {error_peek(fa_cudart_get()), false};
    return room;
}

bool fa_device_room_make(fa_device_room *room)
{
    const fa_cudart *rt = fa_cudart_get();
    int dev = pool_device(rt);
    if (dev < 0)
        return false;
    devstate *d = &devs[dev];
    bool more = give_back(rt, d, dev);
    if (!more && !room->synced) {
        room->synced = true;
        more = sync_device(rt, d, dev) && give_back(rt, d, dev);
    }
    if (more)
        absorb(rt, room->before);
    return more;
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
    if (!__atomic_load_n(&d->used, __ATOMIC_RELAXED))
        __atomic_store_n(&d->used, 1, __ATOMIC_RELAXED);
    if (n > 0 && pool_may_serve(rt)) {
        ensure_pool(rt, d, dev);
        int kind = state_of(d) == READY ? kind_of(d) : KIND_NONE;
        if (kind == KIND_VMM && vm_alloc(rt, d, dev, n, out))
            return 0;
        /* The chunk pool grows back to its size (chunks it gave back)
         * before it waits for its freed blocks.  Beyond its size it waits:
         * a block from the driver would cost a synchronising cudaFree each. */
        if (kind == KIND_CHUNKS && n <= __atomic_load_n(&d->pool.chunk_size, __ATOMIC_ACQUIRE) &&
            (pool_alloc(d, dev, n, out) || (grow_pool(rt, d) && pool_alloc(d, dev, n, out)) ||
             (sync_device(rt, d, dev) && pool_alloc(d, dev, n, out))))
            return 0;
    }
    return driver_alloc(rt, d, dev, out, n);
}

/* Quarantine p if a pool owns it: FA_VM_FREED / FA_VM_BAD_POINTER, or
 * FA_VM_NOT_OURS.  *full: the device whose quarantine reached
 * QUARANTINE_MAX_BLOCKS with this free, and no sync for it is under way
 * (-1: none); the caller syncs it, then calls bound_sync_done. */
static int pool_free(uintptr_t p, int *full)
{
    *full = -1;
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &devs[dev];
        if (state_of(d) != READY)
            continue;
        int kind = kind_of(d);
        if (kind == KIND_VMM && p - __atomic_load_n(&d->vm_base, __ATOMIC_ACQUIRE) >=
                                    __atomic_load_n(&d->vm_bytes, __ATOMIC_ACQUIRE))
            continue; /* a range check, no lock: cudaFree costs the same with many devices */
        size_t taken, requested;
        int res = FA_VM_NOT_OURS;
        pthread_mutex_lock(&d->lock);
        if (d->state == READY && d->kind == KIND_VMM) {
            res = fa_vm_free(&d->vm, p, &taken, &requested);
            uint32_t q = d->vm.quarantined_blocks;
            if (res == FA_VM_FREED && q >= QUARANTINE_MAX_BLOCKS && q >= d->bound_retry && !d->bound_sync) {
                d->bound_sync = true;
                *full = dev;
            }
        } else if (d->state == READY && d->kind == KIND_CHUNKS) {
            fa_pool_free_result c = fa_pool_free(&d->pool, p, &taken, &requested);
            res = c == FA_POOL_FREED ? FA_VM_FREED : c == FA_POOL_NOT_OURS ? FA_VM_NOT_OURS : FA_VM_BAD_POINTER;
        }
        if (res == FA_VM_FREED) {
            ST_ADD(d, frees, 1);
            sync_stats(d);
        }
        pthread_mutex_unlock(&d->lock);
        if (res != FA_VM_NOT_OURS)
            return res;
    }
    return FA_VM_NOT_OURS;
}

/* The sync pool_free asked for is over: the next free may ask again; if it
 * failed (or a capture kept it from running), not before
 * QUARANTINE_MAX_BLOCKS more blocks wait (epoch_end lifts that once any
 * sync succeeds). */
static void bound_sync_done(devstate *d, bool synced)
{
    pthread_mutex_lock(&d->lock);
    d->bound_sync = false;
    /* Below the bound: another sync freed the blocks meanwhile, no wait. */
    if (!synced && d->state == READY && d->kind == KIND_VMM && d->vm.quarantined_blocks >= QUARANTINE_MAX_BLOCKS)
        d->bound_retry = d->vm.quarantined_blocks + QUARANTINE_MAX_BLOCKS;
    pthread_mutex_unlock(&d->lock);
}

/* Whether p lies inside some device's pool (a block of it or not). */
static bool in_a_pool(uintptr_t p)
{
    bool pooled = false;
    for (int dev = 0; dev < FA_MAX_DEVICES && !pooled; dev++) {
        devstate *d = &devs[dev];
        if (state_of(d) != READY)
            continue;
        pthread_mutex_lock(&d->lock);
        pooled = d->state == READY && (d->kind == KIND_VMM ? fa_vm_contains(&d->vm, p) : fa_pool_owns(&d->pool, p));
        pthread_mutex_unlock(&d->lock);
    }
    return pooled;
}

/* A pointer inside the pool that is no live block (double free, interior
 * pointer) is refused with cudaErrorInvalidValue, and that error is left
 * as the runtime's last error, as the driver's refusal would be: a
 * cudaMalloc with no place for the pointer fails just so and does nothing. */
static fa_cuda_error refuse(const fa_cudart *rt)
{
    if (rt->cudaMalloc)
        rt->cudaMalloc(NULL, 1);
    return FA_CUDA_ERROR_INVALID_VALUE;
}

/* Whether the runtime's cudaFreeAsync on stream s (ptsz: its per-thread
 * name) would accept a block from cudaMalloc: 0, or the error it returns,
 * left as the thread's last error as its refusal leaves it; the block is
 * then not freed.
 *  - A stream the runtime does not know (a bogus or destroyed handle): its
 *    answer to cudaStreamIsCapturing (cudaErrorInvalidResourceHandle).
 *  - A stream being captured: the free would become a free node of the
 *    graph, and CUDA takes only graph allocations (cudaMallocAsync during a
 *    capture) there; a cudaMalloc block is refused with
 *    cudaErrorInvalidValue and stays allocated.  The pool refuses alike:
 *    quarantined, the block would be reused after the next synchronisation
 *    while the graph, launched any time later, still uses it.  (Whether
 *    the runtime's refusal also invalidates the capture is not known here;
 *    the pool's leaves it as it was.)
 * cudaStreamIsCapturing is legal during a capture.  On the legacy stream
 * while a blocking stream captures it answers
 * cudaErrorStreamCaptureImplicit, the error a cudaFreeAsync there meets
 * too (the pool's refusal leaves the capture as it was). */
static fa_cuda_error async_free_refused(const fa_cudart *rt, fa_cuda_stream s, bool ptsz)
{
    if (!rt->cudaStreamIsCapturing)
        return 0;
    if (ptsz && !s)
        s = FA_CUDA_STREAM_PER_THREAD; /* the non-ptsz function reads NULL as the legacy stream */
    fa_cuda_capture_status status = FA_CUDA_CAPTURE_STATUS_NONE;
    fa_cuda_error r = rt->cudaStreamIsCapturing(s, &status);
    if (r != 0 || status == FA_CUDA_CAPTURE_STATUS_NONE)
        return r;
    /* Active or invalidated: refused, cudaErrorInvalidValue left as the
     * last error by a call that fails just so during a capture. */
    rt->cudaStreamIsCapturing(s, NULL);
    return FA_CUDA_ERROR_INVALID_VALUE;
}

/* Whether the runtime's cudaFree of a block from cudaMalloc would be
 * refused now, a stream capture being under way: 0, or its error, left as
 * the thread's last error, with what the refusal does to the captures
 * (they are invalidated); the block is then not freed.  During a capture
 * cudaFree is one of the potentially unsafe calls, as cudaMalloc: refused
 * in the modes that prohibit them (this thread's own capture not begun in
 * relaxed mode; in global mode, also another thread's global capture),
 * allowed in relaxed mode.  The runtime applies that rule to cudaFree(NULL)
 * too, which frees nothing: its answer, and what it does to the captures,
 * are the runtime's own, not the pool's guess at them.  No other call is
 * made (nor a synchronisation, which a capture forbids). */
static fa_cuda_error free_refused(const fa_cudart *rt)
{
    return rt->cudaFree ? rt->cudaFree(NULL) : 0;
}

/* cudaFree (async NULL) or cudaFreeAsync of p (not NULL).  A pool block
 * waits in quarantine until the next device synchronisation, which covers
 * the work any stream queued before the free, so both are served alike
 * (a cudaFreeAsync once its stream passed async_free_refused, a cudaFree
 * during a capture once it passed free_refused). */
static fa_cuda_error free_block(const fa_cudart *rt, void *p, fa_cuda_error (*async)(void *, fa_cuda_stream),
                                fa_cuda_stream s)
{
    if (async && in_a_pool((uintptr_t)p)) {
        fa_cuda_error r = async_free_refused(rt, s, async == rt->cudaFreeAsync_ptsz);
        if (r != 0)
            return r;
    } else if (!async && capturing() && in_a_pool((uintptr_t)p)) {
        fa_cuda_error r = free_refused(rt);
        if (r != 0)
            return r;
    }
    int full;
    int res = pool_free((uintptr_t)p, &full);
    if (full >= 0) /* leaves no error behind, succeeds or not */
        bound_sync_done(&devs[full], sync_device(rt, &devs[full], full));
    /* Inside the pool but not a live block: the driver must never see it,
     * it would free a chunk or refuse. */
    if (res != FA_VM_NOT_OURS)
        return res == FA_VM_FREED ? 0 : refuse(rt);
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
    devstate *d = &devs[dev];
    fa_cuda_error r = drv_free(rt, d, p, async, s);
    if (r != 0) {
        pthread_mutex_lock(&map_lock);
        fa_ptrmap_put(&fallback, (uintptr_t)p, dev, size);
        pthread_mutex_unlock(&map_lock);
        return r;
    }
    pthread_mutex_lock(&d->lock);
    d->fallback_bytes -= size;
    ST_ADD(d, frees, 1);
    sync_stats(d);
    pthread_mutex_unlock(&d->lock);
    return r;
}

fa_cuda_error fa_device_free(void *p)
{
    const fa_cudart *rt = runtime("cudaFree");
    if (!rt->cudaFree)
        return FA_CUDA_ERROR_INITIALIZATION;
    if (!p)
        return rt->cudaFree(p); /* cudaFree(NULL) creates the context: the driver's business */
    return free_block(rt, p, NULL, NULL);
}

fa_cuda_error fa_device_free_async(void *p, fa_cuda_stream s, bool ptsz)
{
    const fa_cudart *rt = runtime(ptsz ? "cudaFreeAsync_ptsz" : "cudaFreeAsync");
    fa_cuda_error (*async)(void *, fa_cuda_stream) = ptsz ? rt->cudaFreeAsync_ptsz : rt->cudaFreeAsync;
    if (!async)
        return FA_CUDA_ERROR_INITIALIZATION;
    if (!p) {
        fa_device_count(FA_PT_cudaFreeAsync);
        return async(p, s);
    }
    return free_block(rt, p, async, s);
}

fa_cuda_error fa_device_mem_get_info(size_t *free_b, size_t *total_b)
{
    const fa_cudart *rt = runtime("cudaMemGetInfo");
    if (!rt->cudaMemGetInfo)
        return FA_CUDA_ERROR_INITIALIZATION;
    fa_cuda_error r = rt->cudaMemGetInfo(free_b, total_b);
    int dev = r == 0 && free_b && total_b ? current_device(rt) : -1;
    if (dev >= 0) {
        devstate *d = &devs[dev];
        uint64_t idle = 0;
        pthread_mutex_lock(&d->lock);
        if (d->state == READY && d->kind == KIND_VMM)
            idle = d->vm.idle + d->vm.reclaimable; /* whole idle pieces, and those a sync makes idle */
        else if (d->state == READY && d->kind == KIND_CHUNKS)
            idle = fa_pool_idle(&d->pool);
        pthread_mutex_unlock(&d->lock);
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
    int cur = thread_device(rt); /* the device reset, also beyond those the pool serves */
    int dev = cur < FA_MAX_DEVICES ? cur : -1;
    if (dev < 0) {
        fa_cuda_error r = rt->cudaDeviceReset();
        captures_forget(cur);
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
    devstate *d = &devs[dev];
    /* The driver's reset waits for the device's queued work; unmapping the
     * pieces does not: the work lands first, as it would without the pool.
     * A failed sync (a sticky error) is the reset's to clear.  Not while
     * another device's stream captures: a sync would invalidate that. */
    if (state_of(d) == READY && __atomic_load_n(&d->kind, __ATOMIC_ACQUIRE) == KIND_VMM &&
        rt->cudaDeviceSynchronize && section_enter()) {
        fa_cuda_error before = error_peek(rt);
        if (drv_sync(rt, d) != 0)
            absorb(rt, before);
        section_leave();
    }
    pthread_mutex_lock(&d->lock);
    while (d->state == RESERVING || d->state == RESETTING)
        pthread_cond_wait(&d->settled, &d->lock);
    if (d->state == READY && d->kind == KIND_VMM) {
        vmctx x = {fa_cudrv_get(rt), d, dev};
        if (x.drv) {
            fa_vm_release_all(&d->vm, &vm_driver, &x);
            x.drv->cuMemAddressFree((fa_cu_ptr)d->vm.base, 2 * d->vm.zone);
        }
        fa_vm_destroy(&d->vm);
        __atomic_store_n(&d->vm_base, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&d->vm_bytes, 0, __ATOMIC_RELEASE);
    } else if (d->kind == KIND_CHUNKS) {
        fa_pool_clear(&d->pool);
    }
    d->fallback_bytes = 0;
    d->bound_retry = 0; /* the new pool's quarantine starts empty (bound_sync is its syncing thread's) */
    d->generation++;
    __atomic_store_n(&d->kind, KIND_NONE, __ATOMIC_RELEASE);
    __atomic_store_n(&d->state, RESETTING, __ATOMIC_RELEASE);
    sync_stats(d);
    pthread_mutex_unlock(&d->lock);
    pthread_mutex_lock(&map_lock);
    fa_ptrmap_drop_device(&fallback, dev);
    pthread_mutex_unlock(&map_lock);
    fa_cuda_error r = rt->cudaDeviceReset(); /* its only documented errors are earlier launches' */
    captures_forget(dev);
    pthread_mutex_lock(&d->lock);
    __atomic_store_n(&d->state, UNTOUCHED, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&d->settled);
    pthread_mutex_unlock(&d->lock);
    return r;
}

fa_cuda_error fa_device_synchronize(void)
{
    const fa_cudart *rt = runtime("cudaDeviceSynchronize");
    if (!rt->cudaDeviceSynchronize)
        return FA_CUDA_ERROR_INITIALIZATION;
    int dev = current_device(rt);
    devstate *d = dev >= 0 ? &devs[dev] : NULL;
    epoch e = {0, 0};
    bool any = d && epoch_begin(d, &e);
    fa_cuda_error r = rt->cudaDeviceSynchronize();
    if (r == 0 && any) /* the application's sync frees our quarantine too */
        epoch_end(d, e, 0);
    return r;
}

fa_cuda_error fa_device_ipc_get_handle(fa_cuda_ipc_handle *h, void *p)
{
    const fa_cudart *rt = runtime("cudaIpcGetMemHandle");
    if (!rt->cudaIpcGetMemHandle)
        return FA_CUDA_ERROR_INITIALIZATION;
    if (!in_a_pool((uintptr_t)p))
        return rt->cudaIpcGetMemHandle(h, p);
    /* A handle names a whole driver allocation; the receiver would map our
     * chunk or nothing, not this block. */
    if (!__atomic_exchange_n(&warned_ipc, 1, __ATOMIC_RELAXED))
        fa_warn("cudaIpcGetMemHandle cannot share memory from the device pool between processes; set "
                "FORGEALLOC_DEVICE_POOL_SIZE=0 for programs that do (e.g. torch.multiprocessing with CUDA tensors)");
    return refuse(rt); /* the thread's last error says so too, as the runtime's refusal would */
}

/* The current device may now access `peer`'s memory.  The driver grants
 * that for cudaMalloc memory only: the peer's mapped pieces get it from
 * cuMemSetAccess, now for those mapped and at mapping time for the rest. */
fa_cuda_error fa_device_enable_peer_access(int peer, unsigned flags)
{
    const fa_cudart *rt = runtime("cudaDeviceEnablePeerAccess");
    if (!rt->cudaDeviceEnablePeerAccess)
        return FA_CUDA_ERROR_INITIALIZATION;
    fa_cuda_error r = rt->cudaDeviceEnablePeerAccess(peer, flags);
    int cur = current_device(rt);
    if ((r != 0 && r != FA_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) || cur < 0 || peer < 0 || peer >= FA_MAX_DEVICES)
        return r;
    devstate *d = &devs[peer];
    unsigned bit = 1u << cur;
    if (__atomic_fetch_or(&d->peers, bit, __ATOMIC_ACQ_REL) & bit)
        return r;
    pthread_mutex_lock(&d->lock);
    if (d->state == READY && d->kind == KIND_VMM) {
        vmctx x = {fa_cudrv_get(rt), d, peer};
        if (x.drv && fa_vm_grant_all(&d->vm, &vm_driver, &x))
            fa_warn("device %d: access to the pool's memory could not be granted to device %d; blocks may fault "
                    "there; set FORGEALLOC_DEVICE_VMM=0 to use the chunk pool",
                    peer, cur);
    }
    pthread_mutex_unlock(&d->lock);
    return r;
}

/* ---- giving back what was grown ----------------------------------------------------- */

bool fa_device_background_wanted(void) { return __atomic_load_n(&background_wanted, __ATOMIC_ACQUIRE); }

void fa_device_background(uint64_t now_ms)
{
    if (!__atomic_exchange_n(&background_wanted, 0, __ATOMIC_ACQ_REL))
        return;
    if (!section_enter()) { /* no driver call of the pool's during a capture: look again after it */
        __atomic_store_n(&background_wanted, 1, __ATOMIC_RELEASE);
        return;
    }
    const fa_cudart *rt = fa_cudart_get();
    bool again = false;
    int cur = -1;
    for (int dev = 0; dev < FA_MAX_DEVICES; dev++) {
        devstate *d = &devs[dev];
        if (state_of(d) != READY || kind_of(d) != KIND_VMM)
            continue;
        for (int round = 0; round < 2; round++) {
            pthread_mutex_lock(&d->lock);
            bool excess = d->state == READY && d->kind == KIND_VMM && d->vm.mapped > d->target;
            bool waiting = excess && now_ms < d->last_grow_ms + IDLE_SPELL_MS;
            if (excess && !waiting) {
                /* The driver calls need the device's context on this thread. */
                if (cur < 0)
                    cur = thread_device(rt);
                fa_cuda_error before = error_peek(rt);
                if (rt->cudaSetDevice && rt->cudaSetDevice(dev) != 0)
                    absorb(rt, before);
                ST_ADD(d, pieces_given_back, vm_release_idle(d, dev, d->target, true));
                sync_stats(d);
            }
            bool sync = excess && !waiting && d->vm.mapped > d->target && d->vm.quarantined > 0;
            again |= waiting || (excess && d->vm.mapped > d->target && !sync);
            pthread_mutex_unlock(&d->lock);
            /* Freed blocks keep their pieces until the device caught up. */
            if (!sync || round == 1 || !sync_device(rt, d, dev))
                break;
        }
    }
    if (cur >= 0 && rt->cudaSetDevice)
        rt->cudaSetDevice(cur); /* the thread's device as it was */
    section_leave();
    if (again)
        __atomic_store_n(&background_wanted, 1, __ATOMIC_RELEASE);
}

/* ---- pass-through and capture tracking ------------------------------------------------ */

void fa_device_count(enum fa_cuda_pt which) { __atomic_fetch_add(&passthrough[which], 1, __ATOMIC_RELAXED); }

const struct fa_cudart *fa_device_runtime(const char *fn) { return runtime(fn); }

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
        devstate *d = &devs[dev];
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
        d->peers = 0;
        d->used = 0;
        d->bound_sync = false; /* its syncing thread was the parent's */
        d->bound_retry = 0;
        memset(&d->st, 0, sizeof d->st);
    }
    fallback = (fa_ptrmap){0};
    memset(passthrough, 0, sizeof passthrough);
    captures = sections = 0;
    capture_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    memset(capture_used, 0, sizeof capture_used);
    capture_unslotted = 0;
    cuda_seen = 0;
    background_wanted = 0;
}
