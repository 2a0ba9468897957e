/* devstate.h - what the files of the device layer share: one device's
 * pool and numbers (devstate), the table of them, the runtime and the
 * thread's last error, and each file's entry points for the others.
 * Internal to src/device/ (device.h is the layer's face). */
#ifndef FA_DEVSTATE_H
#define FA_DEVSTATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "../stats/snapshot.h"
#include "cudart.h"
#include "pool.h"
#include "ptrmap.h"
#include "vmpool.h"

/* RESERVING and RESETTING: a thread makes driver calls for the pool
 * without the lock; no other thread reserves or resets meanwhile. */
enum pool_state { UNTOUCHED, RESERVING, READY, PASSTHROUGH, RESETTING };
enum pool_kind { KIND_NONE, KIND_CHUNKS, KIND_VMM };

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
    unsigned reach_async;    /* bit p: device p's streams freed blocks of this pool (cudaFreeAsync) */
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
    uint64_t synced_ns;      /* spent in syncs since pieces were last timed */
    bool retime;             /* the next pieces timed replace piece_ns (sync_pays found it stale) */
    fa_cuda_stream probe;    /* a stream of the pool's own, for asking about a sticky error (NULL: none) */
    bool rdma;               /* pieces are created GPUDirect RDMA capable (the device supports it) */
    fa_cuda_error sticky;    /* the context's sticky error once known (0: none known); read atomically */
    int used;                /* some cudaMalloc/cudaFree reached this device */
    unsigned generation;     /* resets so far: a pool is the same pool only within one */
    bool bound_sync;         /* a sync for FA_QUARANTINE_MAX_BLOCKS is under way (pool_free) */
    uint32_t bound_retry;    /* after one failed: quarantine length of the next try (0: none failed) */
    uint32_t cov[FA_MAX_DEVICES]; /* per device: the last epoch one of its syncs covered */
    unsigned covered;        /* bit p: cov[p] holds one */
    fa_device_stats st __attribute__((aligned(64))); /* written under `lock`, read without it */
} devstate;

extern devstate fa_devs[FA_MAX_DEVICES];

#define ST_ADD(d, field, v) __atomic_fetch_add(&(d)->st.field, (v), __ATOMIC_RELAXED)
#define ST_SET(d, field, v) __atomic_store_n(&(d)->st.field, (v), __ATOMIC_RELAXED)

static inline uint64_t fa_dev_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int fa_dev_kind(devstate *d) { return __atomic_load_n(&d->kind, __ATOMIC_ACQUIRE); }
static inline int fa_dev_state(devstate *d) { return __atomic_load_n(&d->state, __ATOMIC_ACQUIRE); }

/* Around an internal call whose failure we handle: the thread's last
 * error before it, and after it that error again, the program's own (see
 * fa_cudart_error_restore; a no-op when nothing failed). */
static inline fa_cuda_error fa_err_peek(const fa_cudart *rt) { return fa_cudart_error_peek(rt); }
static inline void fa_err_absorb(const fa_cudart *rt, fa_cuda_error before) { fa_cudart_error_restore(rt, before); }

/* A running mean that follows the latest values (weight 1/2). */
static inline uint64_t fa_dev_follow(uint64_t mean, uint64_t v) { return mean ? mean / 2 + v / 2 : v; }

/* ---- device.c: the table, the entry points, the pool's own memory ---------- */

/* Pre: d->lock held.  Mirror the pool's numbers into the stats. */
void fa_dev_sync_stats(devstate *d);
/* The thread's device as the runtime numbers it (-1 if unknown), also
 * beyond the devices the pool serves: what a switch must restore. */
int fa_dev_thread_device(const fa_cudart *rt);
/* The thread's device if the pool can serve it (< FA_MAX_DEVICES), else -1. */
int fa_dev_current_device(const fa_cudart *rt);
/* The device stream s belongs to (-1 if unknown); s must not be capturing
 * (asking then invalidates the capture). */
int fa_dev_stream_device(const fa_cudart *rt, fa_cuda_stream s);
/* The thread's device, when its pool is ready; -1 otherwise. */
int fa_dev_pool_device(const fa_cudart *rt);
/* cudaMalloc, and cudaFree (or with `async` cudaFreeAsync on stream s),
 * of the driver: timed and counted in d's stats. */
fa_cuda_error fa_dev_drv_malloc(const fa_cudart *rt, devstate *d, void **p, size_t n);
fa_cuda_error fa_dev_drv_free(const fa_cudart *rt, devstate *d, void *p, fa_cuda_error (*async)(void *, fa_cuda_stream),
                              fa_cuda_stream s);
/* Ready pool memory only: no driver call. */
bool fa_dev_pool_alloc(devstate *d, int dev, size_t n, void **out);
/* Remember a block the driver served for the program (its cudaFree is
 * then counted); false if there was no memory to remember it. */
bool fa_dev_track(void *p, int dev, size_t n);

/* ---- capture.c: stream captures and sections ---------------------------------- */

/* A stream capture is in progress (as begun through the shim). */
bool fa_capturing(void);
/* Sections: the pool's own synchronisations, which a capture must not
 * overlap.  enter: false (nothing entered) while a capture runs or is
 * about to begin. */
bool fa_section_enter(void);
void fa_section_leave(void);
/* Whether the pool may serve this thread's cudaMalloc without the runtime. */
bool fa_capture_may_serve(const fa_cudart *rt);
/* After cudaDeviceReset of device dev (-1: unknown): its captures are over. */
void fa_captures_forget(int dev);
void fa_capture_fork_child(void);

/* ---- quarantine.c: freed blocks wait for a synchronisation --------------------- */

/* A program that frees without ever synchronising gets a synchronisation
 * from the pool once this many blocks wait in quarantine (see quarantine.c). */
#define FA_QUARANTINE_MAX_BLOCKS 1024

/* A synchronisation of one device: the epoch it covers in each pool the
 * device reaches (of the pool's generation then). */
typedef struct fa_sync_mark {
    uint32_t epoch[FA_MAX_DEVICES];
    unsigned generation[FA_MAX_DEVICES];
    unsigned pools; /* bit d: pool d is marked */
} fa_sync_mark;
/* Device p's synchronisation is starting: marks every pool p reaches;
 * true if one of them has quarantined blocks. */
bool fa_quar_begin(int p, fa_sync_mark *m);
/* It succeeded, after `waited` ns (0: not timed): each marked pool's
 * blocks that every device of its reach has now covered are free. */
void fa_quar_end(int p, const fa_sync_mark *m, uint64_t waited);
/* Device dev's streams freed pool d's blocks (cudaFreeAsync): dev joins
 * the devices d's quarantine waits for. */
void fa_quar_reach_add(devstate *d, int dev);
/* Synchronise every device that reaches pool d (of device `dev`) and free
 * what was quarantined before.  False if there was nothing to free, a
 * capture is running, or a sync failed.  Leaves the thread's last error
 * and device as they were. */
bool fa_quar_sync(const fa_cudart *rt, devstate *d, int dev);
/* cudaDeviceSynchronize on the thread's current device, timed and counted
 * in d's stats. */
fa_cuda_error fa_quar_drv_sync(const fa_cudart *rt, devstate *d);
/* The sync pool_free asked for (FA_QUARANTINE_MAX_BLOCKS) is over. */
void fa_quar_bound_done(devstate *d, bool synced);

/* ---- growth.c: growing before waiting, giving back what was grown ---------------- */

/* The piece pool serves n bytes (ready memory, a sync, growth, giving
 * back): false if none of that serves and the driver must answer. */
bool fa_grow_vm_alloc(const fa_cudart *rt, devstate *d, int dev, size_t n, void **out);
/* Reserve one more chunk when the chunk pool gave some back earlier. */
bool fa_grow_chunk(const fa_cudart *rt, devstate *d);
/* Pre: d->lock held.  Release idle pieces while more than `keep` bytes
 * are mapped (small_too: 2 MiB pieces too).  Returns how many went. */
uint32_t fa_grow_release_idle(devstate *d, int dev, uint64_t keep, bool small_too);
/* Give something back to the driver that is short of memory: an idle
 * chunk, or every idle piece.  False if there was nothing. */
bool fa_grow_give_back(const fa_cudart *rt, devstate *d, int dev);
/* A free left a piece pool beyond its size with something to give back
 * (idle pieces, or pieces a sync would make idle): the background looks. */
void fa_grow_freed(void);
void fa_grow_fork_child(void);

/* ---- meminfo.c: what the driver could have ------------------------------------------ */

/* Pre: d->lock held.  The most a sync and giving back could add to what
 * the driver has free. */
uint64_t fa_meminfo_reach(const devstate *d);
/* Whether n bytes are beyond what the driver has free plus `reach`. */
bool fa_meminfo_beyond(const fa_cudart *rt, size_t n, uint64_t reach);

/* ---- room.c: the driver runs short ---------------------------------------------------- */

/* The driver serves the request; if it is out of memory, the pool gives
 * back what it can and the request is retried.  The last answer is the
 * driver's.  late: a capture began after the program's call entered. */
fa_cuda_error fa_room_driver_alloc(const fa_cudart *rt, devstate *d, int dev, void **out, size_t n, bool late);

/* ---- errors.c: refusals as the runtime makes them, sticky errors ------------------------ */

/* A pool-served call asks the runtime about a sticky error at a thread's
 * first call and once in this many after it (fa_err_sticky); in between
 * it knows what the calls the shim sees or makes have returned. */
#define FA_STICKY_EVERY 64
extern __thread unsigned fa_err_calls __attribute__((tls_model("initial-exec")));
/* Pre: d is ready.  Asks the runtime now (d's lock taken inside). */
fa_cuda_error fa_err_sticky_ask(const fa_cudart *rt, devstate *d);
/* The sticky error of pool d's context (0: none known), as a pool-served
 * call must return it. */
static inline fa_cuda_error fa_err_sticky(const fa_cudart *rt, devstate *d)
{
    fa_cuda_error e = __atomic_load_n(&d->sticky, __ATOMIC_RELAXED);
    if (e || fa_err_calls++ % FA_STICKY_EVERY) /* a thread's first call asks */
        return e;
    return fa_err_sticky_ask(rt, d);
}
/* A runtime call for device dev returned e: a sticky error sticks to its
 * pool (dev -1: the thread's device). */
void fa_err_note(const fa_cudart *rt, int dev, fa_cuda_error e);
/* Leave pool d's sticky error as the thread's last error, as the
 * runtime's calls that return it do. */
void fa_err_raise_sticky(const fa_cudart *rt, devstate *d);

/* A pointer inside the pool that is no live block: cudaErrorInvalidValue,
 * left as the last error. */
fa_cuda_error fa_err_refuse(const fa_cudart *rt);
/* Whether the runtime would refuse a cudaFree now (a capture under way). */
fa_cuda_error fa_err_free_refused(const fa_cudart *rt);
/* Whether the runtime would refuse a cudaFreeAsync on stream s. */
fa_cuda_error fa_err_async_free_refused(const fa_cudart *rt, fa_cuda_stream s, bool ptsz);

/* ---- pieces.c: the driver's virtual-memory calls -------------------------------------- */

typedef struct fa_vmctx {
    const fa_cudrv *drv;
    devstate *d;
    int dev;
} fa_vmctx;
/* The callbacks vmpool.c calls, with a fa_vmctx. */
extern const fa_vm_driver fa_pieces_driver;
/* Unmap and release every piece of v, free its address space, forget it. */
void fa_pieces_teardown(fa_vmctx *x, fa_vm *v);
/* Reserve the address space of device dev's piece pool: false (and one
 * info line) where the driver cannot, and the chunk pool serves. */
bool fa_pieces_reserve(const fa_cudart *rt, devstate *d, int dev);
/* Make the device's context current on this thread (once per thread and
 * device): driver calls need it. */
void fa_pieces_bind(const fa_cudart *rt, int dev);

/* ---- blind.c: settings under which PyTorch never calls cudaMalloc ---------------------- */

/* Decided once, when the first pool is sized (one info line then). */
bool fa_blind(void);
/* For reports: why the pool sees nothing (NULL: it sees the program's
 * calls), as decided, or before any decision as the environment says. */
const char *fa_blind_reason(void);

#endif
