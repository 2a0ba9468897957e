/* errors.c - the pool answers with the runtime's errors.  After a sticky
 * error (an illegal address in a kernel: the context is unusable, every
 * call that needs it returns the error) a pool-served cudaMalloc or
 * cudaFree returns it too, as the runtime's would.  A free the
 * runtime would refuse for a cudaMalloc block is refused alike, with its
 * error, and the block stays allocated: cudaFree during a stream capture
 * where the capture mode prohibits it, cudaFreeAsync on a stream the
 * runtime does not know or one being captured, a pointer that is no live
 * block.  The pool's own internal calls that fail leave the thread's last
 * error as the program left it (devstate.h: fa_err_peek, fa_err_absorb):
 * no error for cudaGetLastError (PyTorch throws on any pending error other
 * than cudaErrorMemoryAllocation), or the program's own. */
#include "devstate.h"
#include "device.h"

/* A pointer inside the pool that is no live block (double free, interior
 * pointer) is refused with cudaErrorInvalidValue, and that error is left
 * as the runtime's last error, as the driver's refusal would be, by a call
 * in relaxed capture mode (during a capture the thread's own mode could
 * make that call invalidate it). */
fa_cuda_error fa_err_refuse(const fa_cudart *rt)
{
    fa_cudart_error_raise(rt, FA_CUDA_ERROR_INVALID_VALUE);
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
fa_cuda_error fa_err_async_free_refused(const fa_cudart *rt, fa_cuda_stream s, bool ptsz)
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
fa_cuda_error fa_err_free_refused(const fa_cudart *rt) { return rt->cudaFree ? rt->cudaFree(NULL) : 0; }

/* ---- sticky errors -------------------------------------------------------------------------
 * On an H200 (CUDA 13.0) after a kernel's illegal address, cudaMalloc,
 * cudaFree, cudaMemGetInfo, cudaDeviceSynchronize, cudaStreamIsCapturing
 * and others returned 700 and set it as the thread's last error, each
 * time (cudaGetLastError clears it; the next such call sets it again);
 * cudaGetDevice, cudaSetDevice, the capture-mode exchange and the
 * virtual-memory calls still returned 0.  The thread's last error is no
 * test (a new thread's is 0, cudaGetLastError clears it): the pool asks cudaStreamIsCapturing about a stream of its own
 * (90 ns on that GPU, legal during captures), once in FA_STICKY_EVERY of
 * its calls per thread, and notes what the calls the shim makes or passes
 * on return. */

__thread unsigned fa_err_calls __attribute__((tls_model("initial-exec")));

static void note(devstate *d, fa_cuda_error e)
{
    fa_cuda_error none = 0;
    __atomic_compare_exchange_n(&d->sticky, &none, e, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

fa_cuda_error fa_err_sticky_ask(const fa_cudart *rt, devstate *d)
{
    if (!rt->cudaStreamIsCapturing)
        return 0;
    fa_cuda_error before = fa_err_peek(rt), r = 0;
    fa_cuda_capture_status status;
    pthread_mutex_lock(&d->lock); /* a reset destroys the stream: it clears probe under the lock first */
    if (d->state == READY && d->probe)
        r = rt->cudaStreamIsCapturing(d->probe, &status);
    pthread_mutex_unlock(&d->lock);
    fa_err_absorb(rt, before); /* a healthy answer leaves the last error as the program left it */
    if (!fa_cuda_sticky(r))
        return 0;
    note(d, r);
    return r;
}

void fa_err_note(const fa_cudart *rt, int dev, fa_cuda_error e)
{
    if (!fa_cuda_sticky(e))
        return;
    if (dev < 0)
        dev = fa_dev_current_device(rt);
    if (dev >= 0)
        note(&fa_devs[dev], e);
}

fa_cuda_error fa_device_error_seen(fa_cuda_error e)
{
    if (fa_cuda_sticky(e))
        fa_err_note(fa_cudart_get(), -1, e);
    return e;
}

void fa_err_raise_sticky(const fa_cudart *rt, devstate *d)
{
    fa_cuda_capture_status status;
    pthread_mutex_lock(&d->lock);
    if (rt->cudaStreamIsCapturing && d->probe)
        rt->cudaStreamIsCapturing(d->probe, &status); /* fails with it, and sets it */
    pthread_mutex_unlock(&d->lock);
}
