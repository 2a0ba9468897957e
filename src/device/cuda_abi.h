/* cuda_abi.h - the slice of the CUDA runtime ABI forgealloc uses.
 *
 * The library never includes the CUDA toolkit's headers (a user's machine
 * has none) and never links libcudart: these declarations are all it
 * needs.  Values and prototypes match CUDA 12 and 13; when the toolkit is
 * present, the build also compiles the CUDA sources with
 * FA_CUDA_ABI_CHECK against the real headers (target forgealloc_cuda_abi):
 * a different prototype or value fails the build.  The stand-in runtime in
 * tests/device/ implements the same declarations. */
#ifndef FA_CUDA_ABI_H
#define FA_CUDA_ABI_H

#include <stddef.h>

#ifdef FA_CUDA_ABI_CHECK
/* The check build takes the real types from the toolkit. */
#include <cuda_runtime_api.h>
typedef cudaError_t fa_cuda_error;
typedef cudaStream_t fa_cuda_stream;
typedef cudaGraph_t fa_cuda_graph;
typedef cudaGraphNode_t fa_cuda_graph_node;
typedef cudaIpcMemHandle_t fa_cuda_ipc_handle;
typedef enum cudaStreamCaptureMode fa_cuda_capture_mode;
typedef struct cudaGraphEdgeData_st fa_cuda_edge_data;
#else
typedef int fa_cuda_error;                    /* enum cudaError */
typedef struct CUstream_st *fa_cuda_stream;   /* cudaStream_t */
typedef struct CUgraph_st *fa_cuda_graph;     /* cudaGraph_t */
typedef struct CUgraphNode_st *fa_cuda_graph_node;
typedef struct fa_cuda_ipc_handle {
    char reserved[64];
} fa_cuda_ipc_handle;                         /* cudaIpcMemHandle_t */
typedef int fa_cuda_capture_mode;             /* enum cudaStreamCaptureMode */
typedef struct fa_cuda_edge_data fa_cuda_edge_data; /* cudaGraphEdgeData (opaque here) */
#endif

#define FA_CUDA_SUCCESS ((fa_cuda_error)0) /* cudaSuccess */
#define FA_CUDA_ERROR_INVALID_VALUE ((fa_cuda_error)1) /* cudaErrorInvalidValue */
#define FA_CUDA_ERROR_MEMORY_ALLOCATION ((fa_cuda_error)2) /* cudaErrorMemoryAllocation */
#define FA_CUDA_ERROR_INITIALIZATION ((fa_cuda_error)3) /* cudaErrorInitializationError */
#define FA_CUDA_ERROR_INVALID_DEVICE ((fa_cuda_error)101) /* cudaErrorInvalidDevice */
#define FA_CUDA_ERROR_NOT_SUPPORTED ((fa_cuda_error)801) /* cudaErrorNotSupported */
#define FA_CUDA_ERROR_CAPTURE_UNSUPPORTED ((fa_cuda_error)900) /* cudaErrorStreamCaptureUnsupported */
#define FA_CUDA_ERROR_CAPTURE_INVALIDATED ((fa_cuda_error)901) /* cudaErrorStreamCaptureInvalidated */

#ifdef FA_CUDA_ABI_CHECK
_Static_assert((int)FA_CUDA_SUCCESS == (int)cudaSuccess, "cudaSuccess");
_Static_assert((int)FA_CUDA_ERROR_INVALID_VALUE == (int)cudaErrorInvalidValue, "cudaErrorInvalidValue");
_Static_assert((int)FA_CUDA_ERROR_MEMORY_ALLOCATION == (int)cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation");
_Static_assert((int)FA_CUDA_ERROR_INITIALIZATION == (int)cudaErrorInitializationError, "cudaErrorInitializationError");
_Static_assert((int)FA_CUDA_ERROR_INVALID_DEVICE == (int)cudaErrorInvalidDevice, "cudaErrorInvalidDevice");
_Static_assert((int)FA_CUDA_ERROR_NOT_SUPPORTED == (int)cudaErrorNotSupported, "cudaErrorNotSupported");
_Static_assert((int)FA_CUDA_ERROR_CAPTURE_UNSUPPORTED == (int)cudaErrorStreamCaptureUnsupported, "capture unsupported");
_Static_assert((int)FA_CUDA_ERROR_CAPTURE_INVALIDATED == (int)cudaErrorStreamCaptureInvalidated, "capture invalidated");
_Static_assert(sizeof(fa_cuda_error) == sizeof(int), "cudaError_t is an int-sized enum");
#endif

/* The real runtime's functions that forgealloc calls or forwards to,
 * looked up at run time (cudart.c).  X(name, return, params, args). */
#define FA_CUDART_FUNCS(X)                                                                                      \
    X(cudaMalloc, fa_cuda_error, (void **p, size_t n), (p, n))                                                  \
    X(cudaFree, fa_cuda_error, (void *p), (p))                                                                  \
    X(cudaMemGetInfo, fa_cuda_error, (size_t *free_b, size_t *total_b), (free_b, total_b))                     \
    X(cudaDeviceReset, fa_cuda_error, (void), ())                                                               \
    X(cudaDeviceSynchronize, fa_cuda_error, (void), ())                                                         \
    X(cudaGetDevice, fa_cuda_error, (int *d), (d))                                                              \
    X(cudaSetDevice, fa_cuda_error, (int d), (d))                                                               \
    X(cudaGetLastError, fa_cuda_error, (void), ())                                                              \
    X(cudaPeekAtLastError, fa_cuda_error, (void), ())                                                           \
    X(cudaIpcGetMemHandle, fa_cuda_error, (fa_cuda_ipc_handle * h, void *p), (h, p))                           \
    X(cudaMallocAsync, fa_cuda_error, (void **p, size_t n, fa_cuda_stream s), (p, n, s))                        \
    X(cudaMallocAsync_ptsz, fa_cuda_error, (void **p, size_t n, fa_cuda_stream s), (p, n, s))                   \
    X(cudaFreeAsync, fa_cuda_error, (void *p, fa_cuda_stream s), (p, s))                                        \
    X(cudaFreeAsync_ptsz, fa_cuda_error, (void *p, fa_cuda_stream s), (p, s))                                   \
    X(cudaMallocHost, fa_cuda_error, (void **p, size_t n), (p, n))                                              \
    X(cudaHostAlloc, fa_cuda_error, (void **p, size_t n, unsigned flags), (p, n, flags))                        \
    X(cudaFreeHost, fa_cuda_error, (void *p), (p))                                                              \
    X(cudaMallocManaged, fa_cuda_error, (void **p, size_t n, unsigned flags), (p, n, flags))                    \
    X(cudaMallocPitch, fa_cuda_error, (void **p, size_t *pitch, size_t w, size_t h), (p, pitch, w, h))          \
    X(cudaStreamBeginCapture, fa_cuda_error, (fa_cuda_stream s, fa_cuda_capture_mode m), (s, m))                \
    X(cudaStreamBeginCapture_ptsz, fa_cuda_error, (fa_cuda_stream s, fa_cuda_capture_mode m), (s, m))           \
    X(cudaStreamBeginCaptureToGraph, fa_cuda_error,                                                            \
      (fa_cuda_stream s, fa_cuda_graph g, const fa_cuda_graph_node *deps, const fa_cuda_edge_data *ed, size_t n, \
       fa_cuda_capture_mode m),                                                                                 \
      (s, g, deps, ed, n, m))                                                                                   \
    X(cudaStreamBeginCaptureToGraph_ptsz, fa_cuda_error,                                                       \
      (fa_cuda_stream s, fa_cuda_graph g, const fa_cuda_graph_node *deps, const fa_cuda_edge_data *ed, size_t n, \
       fa_cuda_capture_mode m),                                                                                 \
      (s, g, deps, ed, n, m))                                                                                   \
    X(cudaStreamEndCapture, fa_cuda_error, (fa_cuda_stream s, fa_cuda_graph * g), (s, g))                       \
    X(cudaStreamEndCapture_ptsz, fa_cuda_error, (fa_cuda_stream s, fa_cuda_graph * g), (s, g))

#endif
