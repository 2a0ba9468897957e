/* gpu_check.h - the device work gpu_check.c needs besides the CUDA runtime
 * API.  kernels.cu does it with real kernels on a GPU; fake_backend.c does it
 * with the stand-in runtime of tests/device (device memory is host memory
 * there), so the same checks also run on a machine without a GPU. */
#ifndef GPU_CHECK_H
#define GPU_CHECK_H

#include <stddef.h>
#include <stdint.h>

#ifdef FA_GPU_FAKE
#include "../device/fakecuda.h"
typedef int gc_capture_mode;
typedef int gc_capture_status;
#else
#include <cuda_runtime_api.h>
typedef enum cudaStreamCaptureMode gc_capture_mode;
typedef enum cudaStreamCaptureStatus gc_capture_status;
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Verification slots: threads checking at once each use their own. */
#define GC_SLOTS 64

/* One line naming the backend and the device, e.g. "cuda NVIDIA H100 80GB HBM3 (sm_90)". */
void gc_describe(char *out, size_t n);

/* Queue on s a fill of [p, p+n) with the pattern of seed: every 8-byte word
 * a hash of seed and its index, the tail bytes of it too.  On a capturing
 * stream the fill is captured. */
cudaError_t gc_fill(void *p, size_t n, uint64_t seed, cudaStream_t s);

/* Wait for s, then count the 8-byte words (and tail) of [p, p+n) that differ
 * from the pattern of seed; -1 after a CUDA error.  slot < GC_SLOTS. */
long long gc_verify(const void *p, size_t n, uint64_t seed, cudaStream_t s, int slot);

/* Queue on s work that runs for about ms milliseconds and then fills
 * [p, p+n) with the pattern of seed (a kernel still writing when it ends). */
cudaError_t gc_late_fill(void *p, size_t n, uint64_t seed, double ms, cudaStream_t s);

/* Queue on s a kernel that writes an illegal address: once it runs the
 * context is in a sticky error (cudaErrorIllegalAddress). */
cudaError_t gc_fault(cudaStream_t s);

/* Instantiate g, launch it on s and wait for it; cudaErrorNotSupported where
 * graphs do not run (the stand-in). */
cudaError_t gc_graph_run(cudaGraph_t g, cudaStream_t s);
void gc_graph_destroy(cudaGraph_t g);

/* The pattern itself: the same function on the host (the stand-in's
 * backend) and in the kernels. */
#ifdef __CUDACC__
#define GC_HOST_DEVICE __host__ __device__
#else
#define GC_HOST_DEVICE
#endif
static inline GC_HOST_DEVICE uint64_t gc_word(uint64_t seed, uint64_t i)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + i + 1;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return x;
}

#ifdef __cplusplus
}
#endif

#endif
