/* device.h - the device side's entry points: the CUDA calls forgealloc
 * takes over (forwarded from override_cuda.c), stats for reports and the
 * fork hooks. */
#ifndef FA_DEVICE_H
#define FA_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "../stats/snapshot.h"
#include "cuda_abi.h"

struct fa_cudart;

fa_cuda_error fa_device_malloc(void **p, size_t n);
fa_cuda_error fa_device_free(void *p);
/* cudaFreeAsync (ptsz: its per-thread default stream name): pool blocks
 * are the pool's to free, everything else goes to the runtime. */
fa_cuda_error fa_device_free_async(void *p, fa_cuda_stream s, bool ptsz);
fa_cuda_error fa_device_mem_get_info(size_t *free_b, size_t *total_b);
fa_cuda_error fa_device_reset(void);
fa_cuda_error fa_device_synchronize(void);
fa_cuda_error fa_device_ipc_get_handle(fa_cuda_ipc_handle *h, void *p);
fa_cuda_error fa_device_enable_peer_access(int peer, unsigned flags);

/* Giving back what a piece pool grew beyond FORGEALLOC_DEVICE_POOL_SIZE,
 * from the process's background thread.  wanted: true while some pool may
 * have something to give back (an atomic load).  fa_device_background
 * (now_ms from CLOCK_MONOTONIC in ms): pieces idle beyond the pool's size
 * go back once no growth happened for 10 s, after a device
 * synchronisation if freed blocks still hold them.  Returns when to call
 * again (CLOCK_MONOTONIC ms), or 0: not until the waker is called (a pool
 * grew, or a free left something to give back).  Takes the device locks
 * itself; the caller holds none of ours and is not a signal handler.
 * Cheap when there is nothing to do. */
bool fa_device_background_wanted(void);
uint64_t fa_device_background(uint64_t now_ms);
/* `wake` starts or wakes the background thread when a pool asks; false
 * when no thread can run (then the pool asks again later). */
void fa_device_set_waker(bool (*wake)(void));

/* A device allocation the runtime serves itself (cudaMallocAsync,
 * cudaMallocPitch, cudaMallocManaged): begin before the call; after each
 * failure for want of memory, make_room gives back what the pool holds
 * idle on the thread's device (after one synchronisation if freed blocks
 * pin it and no stream capture forbids it) and says whether to try again;
 * end after the last try.  After a failure retried past, the thread's
 * last error is what it was before the call.  The retries run in relaxed
 * capture mode: the runtime allowed the call (it answered out of memory),
 * and a capture begun since must not be invalidated by its repetition. */
typedef struct fa_device_room {
    int dev;              /* the device whose pool makes room (-1: the thread's) */
    fa_cuda_error before; /* the thread's last error before the call */
    bool synced;
    bool relaxed;              /* the thread is in relaxed mode for the retries */
    fa_cuda_capture_mode mode; /* its mode before */
} fa_device_room;
fa_device_room fa_device_room_begin(void);
bool fa_device_room_make(fa_device_room *room);
/* r: what the last try returned. */
void fa_device_room_end(fa_device_room *room, fa_cuda_error r);

/* The driver API's allocations (cuMemAlloc, its _v2 ABI; cuMemCreate;
 * cuMemAllocAsync and its per-thread-stream variant), called by name or
 * through a function pointer the program looked up: the driver's answer,
 * after the pool gave back what it holds idle and the call was retried
 * where the driver was out of memory (CUDA_ERROR_OUT_OF_MEMORY). */
fa_cu_result fa_device_cu_mem_alloc(fa_cu_ptr *p, size_t n);
fa_cu_result fa_device_cu_mem_create(fa_cu_handle *h, size_t n, const fa_cu_alloc_prop *prop, unsigned long long flags);
fa_cu_result fa_device_cu_mem_alloc_async(fa_cu_ptr *p, size_t n, fa_cuda_stream s, bool ptsz);
/* cuGetProcAddress_v2 as the program called it by name. */
fa_cu_result fa_device_cu_get_proc_address(const char *sym, void **fn, int version, fa_cu_u64 flags,
                                           fa_cu_proc_status *st);
/* A driver function a lookup found for the program (cuGetProcAddress,
 * cudaGetDriverEntryPoint[ByVersion]): for the allocations above (and
 * cuGetProcAddress itself), the pool's function in its place, ABI and
 * stream variant kept (version: the CUDA version asked for, 0: the
 * runtime's own; flags: the lookup's). */
void *fa_device_driver_function(const char *sym, void *fn, int version, unsigned long long flags);

/* An error the runtime returned to the program (a call passed through, or
 * the thread's last error it read), returned unchanged: a sticky one makes
 * the pool's own answers for that device the same error. */
fa_cuda_error fa_device_error_seen(fa_cuda_error e);

/* Calls counted and passed through unchanged. */
void fa_device_count(enum fa_cuda_pt which);
/* The real runtime (members NULL when missing; one error line then). */
const struct fa_cudart *fa_device_runtime(const char *fn);
/* Stream captures: no synchronisation while one is in progress.  Before
 * a capture on s begins, the thread's device is synchronised if blocks
 * freed before it wait for one (the driver's cudaFree would have
 * synchronised): allocations during the capture can reuse them.  It
 * returns s's device, asked then: asking once the capture runs would
 * invalidate it.  The after-hooks get what the before-hook returned. */
int fa_device_capture_before_begun(fa_cuda_stream s);
static inline int fa_device_capture_before_ended(fa_cuda_stream s)
{
    (void)s;
    return -1;
}
void fa_device_capture_begun(fa_cuda_stream s, fa_cuda_error r, int dev);
void fa_device_capture_ended(fa_cuda_stream s, fa_cuda_error r, int unused);
/* Before cudaStreamDestroy(s). */
void fa_device_stream_destroying(fa_cuda_stream s);

/* Fill the device part of a snapshot without taking locks (signal-safe). */
void fa_device_fill(struct fa_snapshot *s);
/* In the child after fork (nothing is taken before it: see device.c). */
void fa_device_fork_child(void);

#endif
