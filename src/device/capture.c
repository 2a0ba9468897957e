/* capture.c - stream captures and the pool.  A synchronisation during a
 * capture invalidates it, in every capture mode and on whichever thread it
 * runs: the pool makes none while a capture is in progress, and a capture
 * begins only after the pool's syncs under way have returned (sections).
 * The pool's other driver calls go on during one, as an H200 with CUDA
 * 13.0 allows: the virtual-memory calls and cudaMemGetInfo in any mode, its
 * own cudaMalloc and cudaFree in relaxed mode (fa_cudart_relax).  Which
 * requests the pool may serve during one is decided here too. */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "devstate.h"
#include "device.h"

static int captures; /* stream captures in progress, process-wide */

bool fa_capturing(void) { return __atomic_load_n(&captures, __ATOMIC_ACQUIRE) > 0; }

/* Sections: a section is entered only while no capture runs or is about
 * to begin, and a capture begins only once the sections entered before it
 * was announced have left: the check and the calls after it cannot
 * straddle the capture's begin.  Each side writes its counter before it
 * reads the other's (sequentially consistent), so at least one of them
 * sees the other. */
static int sections;

bool fa_section_enter(void)
{
    __atomic_fetch_add(&sections, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&captures, __ATOMIC_SEQ_CST) == 0)
        return true;
    __atomic_fetch_sub(&sections, 1, __ATOMIC_SEQ_CST);
    return false;
}

void fa_section_leave(void) { __atomic_fetch_sub(&sections, 1, __ATOMIC_RELEASE); }

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

int fa_device_capture_before_begun(fa_cuda_stream s)
{
    const fa_cudart *rt = fa_cudart_get();
    int dev = fa_dev_pool_device(rt);
    if (dev >= 0)
        fa_quar_sync(rt, &fa_devs[dev], dev); /* none when nothing waits; leaves no error */
    int sdev = fa_dev_stream_device(rt, s);
    capture_announce();
    return sdev;
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
    const fa_cudart *rt = fa_device_runtime("cudaStreamEndCapture");
    pthread_mutex_lock(&capture_lock);
    int i = 0;
    while (i < CAPTURE_SLOTS && !(capture_used[i] && capture_stream[i] == s))
        i++;
    if (i < CAPTURE_SLOTS) {
        fa_cuda_capture_status status = 0; /* cudaStreamCaptureStatusNone */
        fa_cuda_error before = fa_err_peek(rt);
        if (!rt->cudaStreamIsCapturing || rt->cudaStreamIsCapturing(s, &status) != 0 || status == 0)
            capture_drop(i);
        fa_err_absorb(rt, before); /* the call's own error is cudaStreamEndCapture's */
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

/* Each capture's device was noted when it began: the reset's streams are
 * destroyed, and one named now (a destroyed handle) is undefined behaviour
 * in CUDA and may name a new stream by then, so none is asked about.  A
 * capture that cannot be placed (its device or the reset's unknown) is
 * forgotten, as are the uncounted ones: one kept after its end would keep
 * the pool from ever synchronising again. */
void fa_captures_forget(int dev)
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
bool fa_capture_may_serve(const fa_cudart *rt)
{
    if (!fa_capturing())
        return true;
    fa_cuda_capture_mode mode = FA_CUDA_CAPTURE_MODE_RELAXED;
    if (!rt->cudaThreadExchangeStreamCaptureMode || rt->cudaThreadExchangeStreamCaptureMode(&mode) != 0)
        return false;
    fa_cuda_capture_mode back = mode;
    rt->cudaThreadExchangeStreamCaptureMode(&back);
    return mode == FA_CUDA_CAPTURE_MODE_RELAXED;
}

void fa_capture_fork_child(void)
{
    captures = sections = 0;
    capture_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    for (int i = 0; i < CAPTURE_SLOTS; i++)
        capture_used[i] = false;
    capture_unslotted = 0;
}
