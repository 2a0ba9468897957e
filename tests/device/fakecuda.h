/* fakecuda.h - the stand-in CUDA runtime (libcudart.so.13) used by the tests.
 *
 * Test programs include this instead of the CUDA toolkit's headers: it gives
 * the runtime functions the stand-in exports, with the real prototypes (enum
 * parameters are plain int, which has the same ABI), the constants the tests
 * need under their real names and values, and the fakecuda_* test hooks.
 * What the stand-in models, and what it does not, is described at the top of
 * fakecudart.c. */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stddef.h>
#include <stdint.h>

#include "../../src/device/cuda_abi.h"

#ifdef FA_CUDA_ABI_CHECK
#error "fakecuda.h stands in for the CUDA headers: do not combine it with them"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FAKECUDA_API __attribute__((visibility("default")))

/* ---- types -------------------------------------------------------------- */

typedef fa_cuda_error cudaError_t;
typedef fa_cuda_stream cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef fa_cuda_graph cudaGraph_t;
typedef fa_cuda_graph_node cudaGraphNode_t;
typedef fa_cuda_edge_data cudaGraphEdgeData;
typedef fa_cuda_ipc_handle cudaIpcMemHandle_t;

/* struct cudaPointerAttributes, as in CUDA 11 and later. */
struct cudaPointerAttributes {
    int type;            /* cudaMemoryType* */
    int device;
    void *devicePointer;
    void *hostPointer;
    long reserved[8];
};

/* ---- constants (real values) -------------------------------------------- */

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorPeerAccessAlreadyEnabled = 704,
    cudaErrorNotSupported = 801,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorUnknown = 999,
};

enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3,
};

enum {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};

enum {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaMemAttachGlobal 0x01
#define cudaMemAttachHost 0x02
#define cudaInvalidDeviceId ((int)-2)

/* ---- the runtime functions ------------------------------------------------
 * Every one of these is exported with symbol version libcudart.so.13 and
 * counts its calls (fakecuda_calls).  X(name) for each, in header order. */
#define FAKECUDA_FUNCS(X)                   \
    X(cudaGetDeviceCount)                   \
    X(cudaGetDevice)                        \
    X(cudaSetDevice)                        \
    X(cudaMalloc)                           \
    X(cudaFree)                             \
    X(cudaMemGetInfo)                       \
    X(cudaDeviceReset)                      \
    X(cudaDeviceSynchronize)                \
    X(cudaStreamCreate)                     \
    X(cudaStreamCreateWithFlags)            \
    X(cudaStreamDestroy)                    \
    X(cudaStreamSynchronize)                \
    X(cudaStreamSynchronize_ptsz)           \
    X(cudaStreamQuery)                      \
    X(cudaEventCreate)                      \
    X(cudaEventRecord)                      \
    X(cudaEventSynchronize)                 \
    X(cudaEventQuery)                       \
    X(cudaEventDestroy)                     \
    X(cudaGetLastError)                     \
    X(cudaPeekAtLastError)                  \
    X(cudaGetErrorString)                   \
    X(cudaGetErrorName)                     \
    X(cudaPointerGetAttributes)             \
    X(cudaMemcpy)                           \
    X(cudaMemcpyAsync)                      \
    X(cudaMemset)                           \
    X(cudaMemsetAsync)                      \
    X(cudaMallocAsync)                      \
    X(cudaMallocAsync_ptsz)                 \
    X(cudaFreeAsync)                        \
    X(cudaFreeAsync_ptsz)                   \
    X(cudaMallocHost)                       \
    X(cudaHostAlloc)                        \
    X(cudaFreeHost)                         \
    X(cudaMallocManaged)                    \
    X(cudaMallocPitch)                      \
    X(cudaIpcGetMemHandle)                  \
    X(cudaStreamBeginCapture)               \
    X(cudaStreamBeginCapture_ptsz)          \
    X(cudaStreamBeginCaptureToGraph)        \
    X(cudaStreamBeginCaptureToGraph_ptsz)   \
    X(cudaStreamEndCapture)                 \
    X(cudaStreamEndCapture_ptsz)            \
    X(cudaStreamGetDevice)                  \
    X(cudaStreamIsCapturing)                \
    X(cudaThreadExchangeStreamCaptureMode)  \
    X(cudaRuntimeGetVersion)                \
    X(cudaDriverGetVersion)                 \
    X(cudaDeviceEnablePeerAccess)           \
    X(cudaGetDriverEntryPoint)              \
    X(cudaGetDriverEntryPointByVersion)

/* The driver functions the stand-in plays: the virtual-memory API,
 * cuMemGetAddressRange (CUresult (CUdeviceptr *base, size_t *size,
 * CUdeviceptr p): the allocation holding p: a cudaMalloc's, or for mapped
 * memory the mapping of the physical piece, as the real driver answers;
 * CUDA_ERROR_NOT_FOUND (500) elsewhere), the allocations cuMemAlloc (its
 * _v2 ABI: CUdeviceptr *, size_t), cuMemFree and cuMemAllocAsync (device
 * memory on the context's device, as cudaMalloc, cudaFree and
 * cudaMallocAsync make it; CUDA_ERROR_OUT_OF_MEMORY = 2), and
 * cuGetProcAddress (its _v2 ABI: the same lookup as
 * cudaGetDriverEntryPoint, status in *symbolStatus).  Like NVIDIA's they
 * are not exported by libcudart: a program gets them from
 * cudaGetDriverEntryPoint[ByVersion], or from libcuda.so.1 (the stand-in's
 * is fakecudadrv.c).  Counted by fakecuda_calls too. */
#define FAKECUDA_DRIVER_FUNCS(X)            \
    X(cuDeviceGetAttribute)                 \
    X(cuMemGetAllocationGranularity)        \
    X(cuMemAddressReserve)                  \
    X(cuMemAddressFree)                     \
    X(cuMemCreate)                          \
    X(cuMemRelease)                         \
    X(cuMemMap)                             \
    X(cuMemUnmap)                           \
    X(cuMemSetAccess)                       \
    X(cuMemGetAddressRange)                 \
    X(cuMemAlloc)                           \
    X(cuMemFree)                            \
    X(cuMemAllocAsync)                      \
    X(cuGetProcAddress)

FAKECUDA_API cudaError_t cudaGetDeviceCount(int *count);
FAKECUDA_API cudaError_t cudaGetDevice(int *device);
FAKECUDA_API cudaError_t cudaSetDevice(int device);
FAKECUDA_API cudaError_t cudaMalloc(void **devPtr, size_t size);
FAKECUDA_API cudaError_t cudaFree(void *devPtr);
FAKECUDA_API cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
FAKECUDA_API cudaError_t cudaDeviceReset(void);
FAKECUDA_API cudaError_t cudaDeviceSynchronize(void);
FAKECUDA_API cudaError_t cudaStreamCreate(cudaStream_t *pStream);
FAKECUDA_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
FAKECUDA_API cudaError_t cudaStreamDestroy(cudaStream_t stream);
FAKECUDA_API cudaError_t cudaStreamSynchronize(cudaStream_t stream);
FAKECUDA_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream);
FAKECUDA_API cudaError_t cudaStreamQuery(cudaStream_t stream);
FAKECUDA_API cudaError_t cudaEventCreate(cudaEvent_t *event);
FAKECUDA_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
FAKECUDA_API cudaError_t cudaEventSynchronize(cudaEvent_t event);
FAKECUDA_API cudaError_t cudaEventQuery(cudaEvent_t event);
FAKECUDA_API cudaError_t cudaEventDestroy(cudaEvent_t event);
FAKECUDA_API cudaError_t cudaGetLastError(void);
FAKECUDA_API cudaError_t cudaPeekAtLastError(void);
FAKECUDA_API const char *cudaGetErrorString(cudaError_t error);
FAKECUDA_API const char *cudaGetErrorName(cudaError_t error);
FAKECUDA_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr);
FAKECUDA_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind);
FAKECUDA_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t stream);
FAKECUDA_API cudaError_t cudaMemset(void *devPtr, int value, size_t count);
FAKECUDA_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);
FAKECUDA_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
FAKECUDA_API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
FAKECUDA_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream);
FAKECUDA_API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
FAKECUDA_API cudaError_t cudaMallocHost(void **ptr, size_t size);
FAKECUDA_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
FAKECUDA_API cudaError_t cudaFreeHost(void *ptr);
FAKECUDA_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
FAKECUDA_API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
FAKECUDA_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr);
FAKECUDA_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, fa_cuda_capture_mode mode);
FAKECUDA_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream, fa_cuda_capture_mode mode);
FAKECUDA_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                                       const cudaGraphNode_t *dependencies,
                                                       const cudaGraphEdgeData *dependencyData,
                                                       size_t numDependencies, fa_cuda_capture_mode mode);
FAKECUDA_API cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
                                                            const cudaGraphNode_t *dependencies,
                                                            const cudaGraphEdgeData *dependencyData,
                                                            size_t numDependencies, fa_cuda_capture_mode mode);
FAKECUDA_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph);
FAKECUDA_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph);
FAKECUDA_API cudaError_t cudaStreamGetDevice(cudaStream_t stream, int *device);
FAKECUDA_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, int *pCaptureStatus);
FAKECUDA_API cudaError_t cudaThreadExchangeStreamCaptureMode(fa_cuda_capture_mode *mode);
FAKECUDA_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
FAKECUDA_API cudaError_t cudaDriverGetVersion(int *driverVersion);
FAKECUDA_API cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags);
FAKECUDA_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                                 fa_cuda_entry_status *driverStatus);
FAKECUDA_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                          unsigned long long flags, fa_cuda_entry_status *driverStatus);

/* The stand-in libcuda.so.1's exports (fakecudadrv.c): the driver functions
 * as a program linked with libcuda calls them (cuda.h maps cuMemAlloc to
 * cuMemAlloc_v2 and cuGetProcAddress to cuGetProcAddress_v2). */
fa_cu_result cuMemAlloc_v2(fa_cu_ptr *p, size_t n);
fa_cu_result cuMemFree_v2(fa_cu_ptr p);
fa_cu_result cuMemAllocAsync(fa_cu_ptr *p, size_t n, cudaStream_t s);
fa_cu_result cuMemAllocAsync_ptsz(fa_cu_ptr *p, size_t n, cudaStream_t s);
fa_cu_result cuMemCreate(fa_cu_handle *h, size_t n, const fa_cu_alloc_prop *prop, unsigned long long flags);
fa_cu_result cuMemRelease(fa_cu_handle h);
fa_cu_result cuGetProcAddress_v2(const char *sym, void **fn, int version, fa_cu_u64 flags, fa_cu_proc_status *st);

/* ---- test hooks -------------------------------------------------------------
 * Not CUDA functions: they are neither counted nor traced.  Passing a device
 * ordinal outside [0, device count) is a bug in the test: the hook prints a
 * message and aborts. */

/* Queue a "kernel" on stream s (NULL: the legacy stream of the calling
 * thread's current device) that writes len bytes of byte at dst when the
 * stream's work lands.  Returns cudaSuccess, cudaErrorInvalidValue if
 * [dst, dst+len) is not inside the memory region of the stream's device,
 * cudaErrorInvalidResourceHandle for an unknown stream, or
 * cudaErrorStreamCaptureInvalidated on a stream whose capture was
 * invalidated, or cudaErrorInitializationError in a forked child (see
 * fakecudart.c).  On a capturing stream it is recorded and never runs.  A
 * failure sets the thread's last error, as a failed kernel launch does. */
FAKECUDA_API int fakecuda_enqueue_fill(cudaStream_t s, void *dst, int byte, size_t len);

/* Queue on stream s a "kernel" that faults with an illegal address when
 * the stream's work lands: from then on the context of the stream's
 * device is in a sticky error (cudaErrorIllegalAddress), as on a GPU:
 * the call that lands it and every later call that needs the context
 * return the error (cudaMalloc without making it the thread's last error),
 * except those a GPU still answered (cudaGetDevice, cudaSetDevice,
 * cudaGetDeviceCount, cudaThreadExchangeStreamCaptureMode,
 * cudaPointerGetAttributes, the error and version queries, the driver
 * lookups and virtual-memory calls) and cudaDeviceReset, which does not
 * end it.  Returns as fakecuda_enqueue_fill does. */
FAKECUDA_API int fakecuda_enqueue_fault(cudaStream_t s);

/* The stand-in's driver function of that name (FAKECUDA_DRIVER_FUNCS), or
 * NULL: what the stand-in libcuda.so.1 (fakecudadrv.c) forwards to,
 * without a runtime call a shim could see. */
FAKECUDA_API void *fakecuda_driver_function(const char *name);

/* Calls made to the runtime function called fn (e.g. "cudaMalloc"), 0 for
 * an unknown name; and setting every counter back to 0. */
FAKECUDA_API unsigned long fakecuda_calls(const char *fn);
FAKECUDA_API void fakecuda_reset_counters(void);

/* Bytes allocated on a device (rounded sizes, counting allocations whose
 * cudaFreeAsync has not landed yet), and operations queued on the device's
 * streams that have not landed. */
FAKECUDA_API size_t fakecuda_used(int device);
FAKECUDA_API size_t fakecuda_pending(int device);

/* Change a device's capacity (what cudaMemGetInfo reports as total, and the
 * limit cudaMalloc works within).  Shrinking is always possible (existing
 * allocations stay).  Growing beyond the memory already mapped for the
 * device is only possible while the device has no allocations and nothing
 * is queued on any stream; otherwise this aborts. */
FAKECUDA_API void fakecuda_set_capacity(int device, size_t bytes);

/* Device owning the live device allocation that contains p, or -1. */
FAKECUDA_API int fakecuda_device_of(const void *p);

/* Queued operations of the device's streams that landed on memory the
 * device could not reach any more (unmapped, or mapped without access for
 * it): a real GPU raises an illegal-address fault there.  They write nothing. */
FAKECUDA_API unsigned long fakecuda_faults(int device);

/* Whether device memory at p can be registered for GPUDirect RDMA (by
 * UCX, NCCL's network plugins): cudaMalloc memory can, mapped memory only
 * where its piece was created with allocFlags.gpuDirectRDMACapable. */
FAKECUDA_API int fakecuda_rdma_capable(const void *p);

/* Bytes of the device's physical pieces (cuMemCreate) not yet freed, and
 * how many of those bytes are mapped somewhere. */
FAKECUDA_API size_t fakecuda_pieces(int device);
FAKECUDA_API size_t fakecuda_mapped(int device);

/* Calls (of any stream function) that named a stream destroyed before,
 * by cudaStreamDestroy or with its device by cudaDeviceReset: undefined
 * behaviour in CUDA.  They fail with cudaErrorInvalidResourceHandle here;
 * destroyed handles are never given to new streams. */
FAKECUDA_API unsigned long fakecuda_stale_stream_uses(void);

/* Make every cudaDeviceSynchronize fail with err and land nothing (a
 * sticky error, as far as synchronisation goes) until called with 0. */
FAKECUDA_API void fakecuda_set_sync_error(int err);

/* Make a cudaDeviceSynchronize that finds work queued on the device wait
 * ms first (a GPU busy with that much), until called with 0; with nothing
 * queued it returns at once. */
FAKECUDA_API void fakecuda_set_busy_sync_ms(unsigned ms);

/* Run hook once, on the thread of the next call of the runtime or driver
 * function named fn (e.g. "cudaDeviceSynchronize"), as that call enters
 * and before it does anything (the stand-in's lock not held): a thread
 * held up between deciding to make the call and the call, while other
 * threads go on.  An unknown name aborts. */
FAKECUDA_API void fakecuda_set_entry_hook(const char *fn, void (*hook)(void));

/* The bytes of an IPC handle from cudaIpcGetMemHandle: this struct at the
 * start of the 64-byte handle, the rest zero. */
struct fakecuda_ipc_payload {
    char magic[8];       /* "fakecuda", not NUL-terminated */
    int32_t device;
    uint32_t zero;
    uint64_t base;       /* (uintptr_t) of the allocation's base */
};

#ifdef __cplusplus
}
#endif

#endif
