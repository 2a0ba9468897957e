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

/* The driver API's allocations, called by name (libcuda.so.1's symbols; a
 * program built with --default-stream per-thread calls the _ptsz one), or
 * found through a lookup: when the driver is out of memory, the pool gives
 * back what it holds idle and the call is tried again. */
FA_EXPORT fa_cu_result cuMemAlloc_v2(fa_cu_ptr *p, size_t n) { return fa_device_cu_mem_alloc(p, n); }
FA_EXPORT fa_cu_result cuMemCreate(fa_cu_handle *h, size_t n, const fa_cu_alloc_prop *prop, unsigned long long flags)
{
    return fa_device_cu_mem_create(h, n, prop, flags);
}
FA_EXPORT fa_cu_result cuMemAllocAsync(fa_cu_ptr *p, size_t n, fa_cuda_stream s)
{
    return fa_device_cu_mem_alloc_async(p, n, s, false);
}
FA_EXPORT fa_cu_result cuMemAllocAsync_ptsz(fa_cu_ptr *p, size_t n, fa_cuda_stream s)
{
    return fa_device_cu_mem_alloc_async(p, n, s, true);
}
FA_EXPORT fa_cu_result cuGetProcAddress_v2(const char *sym, void **fn, int version, fa_cu_u64 flags,
                                           fa_cu_proc_status *st)
{
    return fa_device_cu_get_proc_address(sym, fn, version, flags, st);
}
FA_EXPORT fa_cuda_error cudaGetDriverEntryPoint(const char *sym, void **fn, unsigned long long flags,
                                                fa_cuda_entry_status *st)
{
    const fa_cudart *rt = fa_device_runtime("cudaGetDriverEntryPoint");
    fa_cuda_error r = rt->cudaGetDriverEntryPoint ? rt->cudaGetDriverEntryPoint(sym, fn, flags, st)
                                                  : FA_CUDA_ERROR_INITIALIZATION;
    if (r == 0 && fn)
        *fn = fa_device_driver_function(sym, *fn, 0, flags);
    return r;
}
FA_EXPORT fa_cuda_error cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned version,
                                                         unsigned long long flags, fa_cuda_entry_status *st)
{
    const fa_cudart *rt = fa_device_runtime("cudaGetDriverEntryPointByVersion");
    fa_cuda_error r = rt->cudaGetDriverEntryPointByVersion
                          ? rt->cudaGetDriverEntryPointByVersion(sym, fn, version, flags, st)
                          : FA_CUDA_ERROR_INITIALIZATION;
    if (r == 0 && fn)
        *fn = fa_device_driver_function(sym, *fn, (int)version, flags);
    return r;
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
