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
#include <stdint.h>

#ifdef FA_CUDA_ABI_CHECK
/* The check build takes the real types from the toolkit. */
#include <cuda_runtime_api.h>
typedef cudaError_t fa_cuda_error;
typedef cudaStream_t fa_cuda_stream;
typedef cudaGraph_t fa_cuda_graph;
typedef cudaGraphNode_t fa_cuda_graph_node;
typedef cudaIpcMemHandle_t fa_cuda_ipc_handle;
typedef enum cudaStreamCaptureMode fa_cuda_capture_mode;
typedef enum cudaStreamCaptureStatus fa_cuda_capture_status;
typedef struct cudaGraphEdgeData_st fa_cuda_edge_data;
typedef enum cudaDriverEntryPointQueryResult fa_cuda_entry_status;
#else
typedef int fa_cuda_error;                    /* enum cudaError */
typedef struct CUstream_st *fa_cuda_stream;   /* cudaStream_t */
typedef struct CUgraph_st *fa_cuda_graph;     /* cudaGraph_t */
typedef struct CUgraphNode_st *fa_cuda_graph_node;
typedef struct fa_cuda_ipc_handle {
    char reserved[64];
} fa_cuda_ipc_handle;                         /* cudaIpcMemHandle_t */
typedef int fa_cuda_capture_mode;             /* enum cudaStreamCaptureMode */
typedef int fa_cuda_capture_status;           /* enum cudaStreamCaptureStatus */
typedef struct fa_cuda_edge_data fa_cuda_edge_data; /* cudaGraphEdgeData (opaque here) */
typedef int fa_cuda_entry_status;             /* enum cudaDriverEntryPointQueryResult */
#endif

#define FA_CUDA_SUCCESS ((fa_cuda_error)0) /* cudaSuccess */
#define FA_CUDA_ERROR_INVALID_VALUE ((fa_cuda_error)1) /* cudaErrorInvalidValue */
#define FA_CUDA_ERROR_MEMORY_ALLOCATION ((fa_cuda_error)2) /* cudaErrorMemoryAllocation */
#define FA_CUDA_ERROR_INITIALIZATION ((fa_cuda_error)3) /* cudaErrorInitializationError */
#define FA_CUDA_ERROR_INVALID_DEVICE ((fa_cuda_error)101) /* cudaErrorInvalidDevice */
#define FA_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ((fa_cuda_error)704) /* cudaErrorPeerAccessAlreadyEnabled */
#define FA_CUDA_ERROR_NOT_SUPPORTED ((fa_cuda_error)801) /* cudaErrorNotSupported */
#define FA_CUDA_ERROR_CAPTURE_UNSUPPORTED ((fa_cuda_error)900) /* cudaErrorStreamCaptureUnsupported */
#define FA_CUDA_ERROR_CAPTURE_INVALIDATED ((fa_cuda_error)901) /* cudaErrorStreamCaptureInvalidated */
#define FA_CUDA_ERROR_ILLEGAL_ADDRESS ((fa_cuda_error)700) /* cudaErrorIllegalAddress */
#define FA_CUDA_CAPTURE_MODE_RELAXED ((fa_cuda_capture_mode)2)   /* cudaStreamCaptureModeRelaxed */
#define FA_CUDA_STREAM_NON_BLOCKING 0x01u                         /* cudaStreamNonBlocking */
#define FA_CUDA_CAPTURE_STATUS_NONE ((fa_cuda_capture_status)0)  /* cudaStreamCaptureStatusNone */
#define FA_CUDA_STREAM_PER_THREAD ((fa_cuda_stream)0x2)            /* cudaStreamPerThread (a macro in CUDA) */

#ifdef FA_CUDA_ABI_CHECK
_Static_assert((int)FA_CUDA_SUCCESS == (int)cudaSuccess, "cudaSuccess");
_Static_assert((int)FA_CUDA_ERROR_INVALID_VALUE == (int)cudaErrorInvalidValue, "cudaErrorInvalidValue");
_Static_assert((int)FA_CUDA_ERROR_MEMORY_ALLOCATION == (int)cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation");
_Static_assert((int)FA_CUDA_ERROR_INITIALIZATION == (int)cudaErrorInitializationError, "cudaErrorInitializationError");
_Static_assert((int)FA_CUDA_ERROR_INVALID_DEVICE == (int)cudaErrorInvalidDevice, "cudaErrorInvalidDevice");
_Static_assert((int)FA_CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED == (int)cudaErrorPeerAccessAlreadyEnabled, "peer");
_Static_assert((int)FA_CUDA_ERROR_NOT_SUPPORTED == (int)cudaErrorNotSupported, "cudaErrorNotSupported");
_Static_assert((int)FA_CUDA_ERROR_CAPTURE_UNSUPPORTED == (int)cudaErrorStreamCaptureUnsupported, "capture unsupported");
_Static_assert((int)FA_CUDA_ERROR_CAPTURE_INVALIDATED == (int)cudaErrorStreamCaptureInvalidated, "capture invalidated");
_Static_assert((int)FA_CUDA_CAPTURE_MODE_RELAXED == (int)cudaStreamCaptureModeRelaxed, "relaxed capture mode");
_Static_assert((int)FA_CUDA_CAPTURE_STATUS_NONE == (int)cudaStreamCaptureStatusNone, "no capture");
_Static_assert(sizeof(fa_cuda_error) == sizeof(int), "cudaError_t is an int-sized enum");
_Static_assert((int)FA_CUDA_ERROR_ILLEGAL_ADDRESS == (int)cudaErrorIllegalAddress, "cudaErrorIllegalAddress");
_Static_assert(FA_CUDA_STREAM_NON_BLOCKING == cudaStreamNonBlocking, "cudaStreamNonBlocking");
_Static_assert(cudaErrorContained == 226 && cudaErrorLaunchTimeout == 702 && cudaErrorAssert == 710 &&
                   cudaErrorHardwareStackError == 714 && cudaErrorIllegalInstruction == 715 &&
                   cudaErrorMisalignedAddress == 716 && cudaErrorInvalidAddressSpace == 717 &&
                   cudaErrorInvalidPc == 718 && cudaErrorLaunchFailure == 719 && cudaErrorTensorMemoryLeak == 721 &&
                   cudaErrorMpsClientTerminated == 810 && cudaErrorExternalDevice == 911,
               "the sticky errors");
#endif

/* The errors after which, as CUDA documents them, the process is "in an
 * inconsistent state and any further CUDA work will return the same
 * error": cudaErrorContained, IllegalAddress, LaunchTimeout, Assert,
 * HardwareStackError, IllegalInstruction, MisalignedAddress,
 * InvalidAddressSpace, InvalidPc, LaunchFailure, TensorMemoryLeak,
 * MpsClientTerminated, ExternalDevice. */
static inline int fa_cuda_sticky(fa_cuda_error e)
{
    switch ((int)e) {
    case 226: case 700: case 702: case 710: case 714: case 715: case 716: case 717: case 718: case 719: case 721:
    case 810: case 911:
        return 1;
    default:
        return 0;
    }
}

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
    X(cudaStreamEndCapture_ptsz, fa_cuda_error, (fa_cuda_stream s, fa_cuda_graph * g), (s, g))                 \
    X(cudaStreamIsCapturing, fa_cuda_error, (fa_cuda_stream s, fa_cuda_capture_status * st), (s, st))          \
    X(cudaStreamGetDevice, fa_cuda_error, (fa_cuda_stream s, int *d), (s, d))                                   \
    X(cudaThreadExchangeStreamCaptureMode, fa_cuda_error, (fa_cuda_capture_mode * m), (m))                      \
    X(cudaStreamDestroy, fa_cuda_error, (fa_cuda_stream s), (s))                                                \
    X(cudaStreamCreateWithFlags, fa_cuda_error, (fa_cuda_stream * s, unsigned flags), (s, flags))               \
    X(cudaDeviceEnablePeerAccess, fa_cuda_error, (int peer, unsigned flags), (peer, flags))                     \
    X(cudaGetDriverEntryPoint, fa_cuda_error,                                                                   \
      (const char *sym, void **fn, unsigned long long flags, fa_cuda_entry_status *st), (sym, fn, flags, st))   \
    X(cudaGetDriverEntryPointByVersion, fa_cuda_error,                                                          \
      (const char *sym, void **fn, unsigned ver, unsigned long long flags, fa_cuda_entry_status *st),           \
      (sym, fn, ver, flags, st))

/* ---- the driver API slice of the pool of physical pieces (cuda.h) -------
 * Found through cudaGetDriverEntryPointByVersion of the loaded runtime,
 * never by linking libcuda.  The check build compares every type, value
 * and prototype with cuda.h. */
#ifdef FA_CUDA_ABI_CHECK
#include <cuda.h>
typedef CUresult fa_cu_result;
typedef CUdeviceptr fa_cu_ptr;
typedef CUmemGenericAllocationHandle fa_cu_handle;
typedef CUmemLocation fa_cu_location;
typedef CUmemAllocationProp fa_cu_alloc_prop;
typedef CUmemAccessDesc fa_cu_access_desc;
typedef CUdevice_attribute fa_cu_attr;
typedef CUmemAllocationGranularity_flags fa_cu_gran_flags;
typedef CUmemAccess_flags fa_cu_access_flags;
typedef cuuint64_t fa_cu_u64;
typedef CUdriverProcAddressQueryResult fa_cu_proc_status;
#else
typedef int fa_cu_result;                /* CUresult */
typedef unsigned long long fa_cu_ptr;    /* CUdeviceptr (64-bit) */
typedef unsigned long long fa_cu_handle; /* CUmemGenericAllocationHandle */
typedef int fa_cu_attr;                  /* CUdevice_attribute */
typedef int fa_cu_gran_flags;            /* CUmemAllocationGranularity_flags */
typedef int fa_cu_access_flags;          /* CUmemAccess_flags */
typedef uint64_t fa_cu_u64;              /* cuuint64_t */
typedef int fa_cu_proc_status;           /* CUdriverProcAddressQueryResult */
typedef struct fa_cu_location {
    int type; /* CUmemLocationType */
    int id;
} fa_cu_location; /* CUmemLocation */
typedef struct fa_cu_alloc_prop {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    fa_cu_location location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} fa_cu_alloc_prop; /* CUmemAllocationProp */
typedef struct fa_cu_access_desc {
    fa_cu_location location;
    fa_cu_access_flags flags;
} fa_cu_access_desc; /* CUmemAccessDesc */
#endif
/* The layouts cuda.h has (the check build compiles these against it). */
_Static_assert(sizeof(fa_cu_alloc_prop) == 32 && sizeof(fa_cu_access_desc) == 12, "CUDA driver struct sizes");

#define FA_CU_SUCCESS 0                /* CUDA_SUCCESS */
#define FA_CU_ERROR_OUT_OF_MEMORY 2    /* CUDA_ERROR_OUT_OF_MEMORY */
#define FA_CU_ATTR_VMM_SUPPORTED 102   /* CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED */
#define FA_CU_ATTR_GDR_VMM_SUPPORTED 110 /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED */
#define FA_CU_ALLOCATION_TYPE_PINNED 1 /* CU_MEM_ALLOCATION_TYPE_PINNED */
#define FA_CU_LOCATION_TYPE_DEVICE 1   /* CU_MEM_LOCATION_TYPE_DEVICE */
#define FA_CU_ACCESS_READWRITE 3       /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
#define FA_CU_GRANULARITY_MINIMUM 0    /* CU_MEM_ALLOC_GRANULARITY_MINIMUM */
#define FA_CUDA_ENTRY_POINT_SUCCESS 0  /* cudaDriverEntryPointSuccess */
#define FA_CUDA_ENABLE_DEFAULT 0ull    /* cudaEnableDefault */
#define FA_CU_ENTRY_VERSION 12000      /* the CUDA version whose prototypes these are */

#ifdef FA_CUDA_ABI_CHECK
_Static_assert(FA_CU_SUCCESS == CUDA_SUCCESS, "CUDA_SUCCESS");
_Static_assert(FA_CU_ERROR_OUT_OF_MEMORY == CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY");
_Static_assert(FA_CU_ATTR_VMM_SUPPORTED == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, "VMM attribute");
_Static_assert(FA_CU_ATTR_GDR_VMM_SUPPORTED == CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, "GDR attr");
_Static_assert(FA_CU_ALLOCATION_TYPE_PINNED == CU_MEM_ALLOCATION_TYPE_PINNED, "pinned");
_Static_assert(FA_CU_LOCATION_TYPE_DEVICE == CU_MEM_LOCATION_TYPE_DEVICE, "location device");
_Static_assert(FA_CU_ACCESS_READWRITE == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "read-write");
_Static_assert(FA_CU_GRANULARITY_MINIMUM == CU_MEM_ALLOC_GRANULARITY_MINIMUM, "granularity");
_Static_assert(FA_CUDA_ENTRY_POINT_SUCCESS == cudaDriverEntryPointSuccess, "entry point success");
_Static_assert(FA_CUDA_ENABLE_DEFAULT == cudaEnableDefault, "cudaEnableDefault");
_Static_assert(sizeof(CUdeviceptr) == 8, "64-bit device pointers");
#endif

/* X(name, params): the driver functions, all returning CUresult. */
#define FA_CU_FUNCS(X)                                                                                       \
    X(cuDeviceGetAttribute, (int *v, fa_cu_attr a, int dev))                                                 \
    X(cuMemGetAllocationGranularity, (size_t * g, const fa_cu_alloc_prop *p, fa_cu_gran_flags f))           \
    X(cuMemAddressReserve, (fa_cu_ptr * p, size_t size, size_t align, fa_cu_ptr addr, unsigned long long f)) \
    X(cuMemAddressFree, (fa_cu_ptr p, size_t size))                                                          \
    X(cuMemCreate, (fa_cu_handle * h, size_t size, const fa_cu_alloc_prop *p, unsigned long long f))        \
    X(cuMemRelease, (fa_cu_handle h))                                                                        \
    X(cuMemMap, (fa_cu_ptr p, size_t size, size_t off, fa_cu_handle h, unsigned long long f))               \
    X(cuMemUnmap, (fa_cu_ptr p, size_t size))                                                                \
    X(cuMemSetAccess, (fa_cu_ptr p, size_t size, const fa_cu_access_desc *d, size_t n))

#ifdef FA_CUDA_ABI_CHECK
#define FA_CU_CHECK(name, params) \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&name), fa_cu_result(*) params), #name);
FA_CU_FUNCS(FA_CU_CHECK)
#undef FA_CU_CHECK
#endif

#endif
