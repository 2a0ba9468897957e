// kernels.cu - gpu_check.h on a real GPU: pattern fills and checks as
// kernels, a kernel that writes late, graph launch.  Built by nvcc with
// -cudart shared, so the runtime is the shared libcudart a preloaded
// forgealloc can intercept.  Nothing here calls cudaMalloc: the checks'
// own allocations are the only ones the pool sees.
#include <cstdio>

#include "gpu_check.h"

__device__ unsigned long long gc_bad[GC_SLOTS];

__device__ static unsigned long long now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Byte-wise for the tail, word-wise for the body (cudaMalloc blocks are
// 256-byte aligned; a block of any size still starts at a word boundary).
__global__ void fill_kernel(unsigned char *p, size_t n, uint64_t seed, unsigned long long delay_ns)
{
    if (delay_ns) {
        unsigned long long end = now_ns() + delay_ns;
        while (now_ns() < end)
            __nanosleep(100000);
    }
    size_t words = n / 8;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        reinterpret_cast<uint64_t *>(p)[i] = gc_word(seed, i);
    if (blockIdx.x == 0 && threadIdx.x < n % 8) {
        uint64_t w = gc_word(seed, words);
        p[8 * words + threadIdx.x] = reinterpret_cast<unsigned char *>(&w)[threadIdx.x];
    }
}

__global__ void verify_kernel(const unsigned char *p, size_t n, uint64_t seed, int slot)
{
    size_t words = n / 8;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned long long bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        bad += reinterpret_cast<const uint64_t *>(p)[i] != gc_word(seed, i);
    if (blockIdx.x == 0 && threadIdx.x == 0 && n % 8) {
        uint64_t w = gc_word(seed, words);
        for (size_t k = 0; k < n % 8; k++)
            bad += p[8 * words + k] != reinterpret_cast<unsigned char *>(&w)[k];
    }
    if (bad)
        atomicAdd(&gc_bad[slot], bad);
}

static unsigned blocks_for(size_t n)
{
    size_t b = (n / 8 + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 4096 ? 4096 : b);
}

extern "C" void gc_describe(char *out, size_t n)
{
    int dev = 0, rt = 0, drv = 0;
    cudaDeviceProp p;
    cudaGetDevice(&dev);
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
        snprintf(out, n, "cuda device %d (no properties)", dev);
        return;
    }
    snprintf(out, n, "cuda %s (sm_%d%d, %zu MiB), runtime %d, driver %d", p.name, p.major, p.minor,
             p.totalGlobalMem >> 20, rt, drv);
}

extern "C" cudaError_t gc_fill(void *p, size_t n, uint64_t seed, cudaStream_t s)
{
    fill_kernel<<<blocks_for(n), 256, 0, s>>>(static_cast<unsigned char *>(p), n, seed, 0);
    return cudaPeekAtLastError();
}

extern "C" cudaError_t gc_late_fill(void *p, size_t n, uint64_t seed, double ms, cudaStream_t s)
{
    fill_kernel<<<blocks_for(n), 256, 0, s>>>(static_cast<unsigned char *>(p), n, seed,
                                               (unsigned long long)(ms * 1e6));
    return cudaPeekAtLastError();
}

extern "C" long long gc_verify(const void *p, size_t n, uint64_t seed, cudaStream_t s, int slot)
{
    unsigned long long zero = 0, bad = 0;
    size_t off = (size_t)slot * sizeof zero;
    if (cudaMemcpyToSymbolAsync(gc_bad, &zero, sizeof zero, off, cudaMemcpyHostToDevice, s) != cudaSuccess)
        return -1;
    verify_kernel<<<blocks_for(n), 256, 0, s>>>(static_cast<const unsigned char *>(p), n, seed, slot);
    if (cudaPeekAtLastError() != cudaSuccess)
        return -1;
    if (cudaMemcpyFromSymbolAsync(&bad, gc_bad, sizeof bad, off, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess)
        return -1;
    return (long long)bad;
}

extern "C" cudaError_t gc_graph_run(cudaGraph_t g, cudaStream_t s)
{
    cudaGraphExec_t e;
    cudaError_t r = cudaGraphInstantiate(&e, g, 0);
    if (r != cudaSuccess)
        return r;
    r = cudaGraphLaunch(e, s);
    if (r == cudaSuccess)
        r = cudaStreamSynchronize(s);
    cudaGraphExecDestroy(e);
    return r;
}

extern "C" void gc_graph_destroy(cudaGraph_t g) { cudaGraphDestroy(g); }

__global__ void fault_kernel(int *p) { *(volatile int *)(p + (1ll << 40)) = 1; }

extern "C" cudaError_t gc_fault(cudaStream_t s)
{
    fault_kernel<<<1, 1, 0, s>>>(nullptr);
    return cudaPeekAtLastError();
}
