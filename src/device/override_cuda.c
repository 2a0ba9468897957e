/* override_cuda.c - the CUDA runtime names forgealloc defines, each a
 * forward to device.c or, for the calls it only counts or watches, to the
 * real runtime.  This is the only file that defines CUDA names.
 *
 * An unversioned definition in a preloaded object also takes calls bound
 * to libcudart.so.13's versioned symbols, including from libraries loaded
 * with dlopen(RTLD_LOCAL): the dynamic linker binds a versioned
 * reference to an unversioned definition found first in the search
 * order.  The *_ptsz names are what code built with --default-stream
 * per-thread calls. */
#include "../core/export.h"
#include "cudart.h"
#include "device.h"

FA_EXPORT fa_cuda_error cudaMalloc(void **p, size_t n) { return fa_device_malloc(p, n); }
FA_EXPORT fa_cuda_error cudaFree(void *p) { return fa_device_free(p); }
FA_EXPORT fa_cuda_error cudaFreeAsync(void *p, fa_cuda_stream s) { return fa_device_free_async(p, s, false); }
FA_EXPORT fa_cuda_error cudaFreeAsync_ptsz(void *p, fa_cuda_stream s) { return fa_device_free_async(p, s, true); }
FA_EXPORT fa_cuda_error cudaStreamDestroy(fa_cuda_stream s)
{
    const fa_cudart *rt = fa_device_runtime("cudaStreamDestroy");
    fa_device_stream_destroying(s);
    return rt->cudaStreamDestroy ? rt->cudaStreamDestroy(s) : FA_CUDA_ERROR_INITIALIZATION;
}
FA_EXPORT fa_cuda_error cudaMemGetInfo(size_t *free_b, size_t *total_b) { return fa_device_mem_get_info(free_b, total_b); }
FA_EXPORT fa_cuda_error cudaDeviceReset(void) { return fa_device_reset(); }
FA_EXPORT fa_cuda_error cudaDeviceSynchronize(void) { return fa_device_synchronize(); }
FA_EXPORT fa_cuda_error cudaIpcGetMemHandle(fa_cuda_ipc_handle *h, void *p) { return fa_device_ipc_get_handle(h, p); }
/* Peer access granted by the driver does not reach memory mapped with
 * cuMemMap: the pool grants it to its pieces too. */
FA_EXPORT fa_cuda_error cudaDeviceEnablePeerAccess(int peer, unsigned flags)
{
    return fa_device_enable_peer_access(peer, flags);
}

/* Read for a sticky error (an illegal address in a kernel): after one the
 * pool's cudaMalloc and cudaFree return it too, as the runtime's do. */
FA_EXPORT fa_cuda_error cudaGetLastError(void)
{
    const fa_cudart *rt = fa_device_runtime("cudaGetLastError");
    return rt->cudaGetLastError ? fa_device_error_seen(rt->cudaGetLastError()) : FA_CUDA_ERROR_INITIALIZATION;
}
FA_EXPORT fa_cuda_error cudaPeekAtLastError(void)
{
    const fa_cudart *rt = fa_device_runtime("cudaPeekAtLastError");
    return rt->cudaPeekAtLastError ? fa_device_error_seen(rt->cudaPeekAtLastError()) : FA_CUDA_ERROR_INITIALIZATION;
}

/* Counted, then passed to the runtime unchanged. */
#define FA_PASS(counter, name, params, args)                                  \
    FA_EXPORT fa_cuda_error name params                                       \
    {                                                                         \
        const fa_cudart *rt = fa_device_runtime(#name);                      \
        fa_device_count(counter);                                             \
        return rt->name ? rt->name args : FA_CUDA_ERROR_INITIALIZATION;       \
    }
FA_PASS(FA_PT_cudaMallocHost, cudaMallocHost, (void **p, size_t n), (p, n))
FA_PASS(FA_PT_cudaHostAlloc, cudaHostAlloc, (void **p, size_t n, unsigned flags), (p, n, flags))
FA_PASS(FA_PT_cudaFreeHost, cudaFreeHost, (void *p), (p))

/* Device memory the runtime serves itself, counted; when the device is
 * out of memory, the pool gives back what it holds idle and the call is
 * tried again: memory cudaMemGetInfo counts free serves these too. */
#define FA_PASS_DEVICE(counter, name, params, args)                           \
    FA_EXPORT fa_cuda_error name params                                       \
    {                                                                         \
        const fa_cudart *rt = fa_device_runtime(#name);                      \
        fa_device_count(counter);                                             \
        if (!rt->name)                                                        \
            return FA_CUDA_ERROR_INITIALIZATION;                              \
        fa_device_room room = fa_device_room_begin();                         \
        fa_cuda_error r;                                                      \
        while ((r = rt->name args) == FA_CUDA_ERROR_MEMORY_ALLOCATION &&      \
               fa_device_room_make(&room))                                    \
            ;                                                                 \
        fa_device_room_end(&room, r);                                         \
        return r;                                                             \
    }
FA_PASS_DEVICE(FA_PT_cudaMallocAsync, cudaMallocAsync, (void **p, size_t n, fa_cuda_stream s), (p, n, s))
FA_PASS_DEVICE(FA_PT_cudaMallocAsync, cudaMallocAsync_ptsz, (void **p, size_t n, fa_cuda_stream s), (p, n, s))
FA_PASS_DEVICE(FA_PT_cudaMallocManaged, cudaMallocManaged, (void **p, size_t n, unsigned flags), (p, n, flags))
FA_PASS_DEVICE(FA_PT_cudaMallocPitch, cudaMallocPitch, (void **p, size_t *pitch, size_t w, size_t h),
               (p, pitch, w, h))

/* Watched, so the pool never synchronises during a capture; one about to
 * begin first makes the blocks freed before it reusable. */
#define FA_CAPTURE(event, name, params, args)                                         \
    FA_EXPORT fa_cuda_error name params                                               \
    {                                                                                 \
        const fa_cudart *rt = fa_device_runtime(#name);                              \
        int before = fa_device_capture_before_##event(s);                             \
        fa_cuda_error r = rt->name ? rt->name args : FA_CUDA_ERROR_INITIALIZATION;    \
        fa_device_capture_##event(s, r, before);                                      \
        return r;                                                                     \
    }
FA_CAPTURE(begun, cudaStreamBeginCapture, (fa_cuda_stream s, fa_cuda_capture_mode m), (s, m))
FA_CAPTURE(begun, cudaStreamBeginCapture_ptsz, (fa_cuda_stream s, fa_cuda_capture_mode m), (s, m))
FA_CAPTURE(begun, cudaStreamBeginCaptureToGraph,
           (fa_cuda_stream s, fa_cuda_graph g, const fa_cuda_graph_node *deps, const fa_cuda_edge_data *ed, size_t n,
            fa_cuda_capture_mode m),
           (s, g, deps, ed, n, m))
FA_CAPTURE(begun, cudaStreamBeginCaptureToGraph_ptsz,
           (fa_cuda_stream s, fa_cuda_graph g, const fa_cuda_graph_node *deps, const fa_cuda_edge_data *ed, size_t n,
            fa_cuda_capture_mode m),
           (s, g, deps, ed, n, m))
FA_CAPTURE(ended, cudaStreamEndCapture, (fa_cuda_stream s, fa_cuda_graph *g), (s, g))
FA_CAPTURE(ended, cudaStreamEndCapture_ptsz, (fa_cuda_stream s, fa_cuda_graph *g), (s, g))
