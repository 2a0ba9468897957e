/* fake_backend.c - gpu_check.h over the stand-in runtime of tests/device:
 * device memory is host memory, so fills and checks are host loops once the
 * stream's queued work has landed; a late fill is the stand-in's queued fill
 * (it lands at the next synchronisation, like a kernel that ends late). */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "gpu_check.h"

void gc_describe(char *out, size_t n)
{
    int count = 0;
    cudaGetDeviceCount(&count);
    snprintf(out, n, "stand-in libcudart (tests/device), %d devices", count);
}

static int capturing(cudaStream_t s)
{
    int st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

static void host_fill(unsigned char *p, size_t n, uint64_t seed)
{
    size_t words = n / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w = gc_word(seed, i);
        memcpy(p + 8 * i, &w, 8);
    }
    uint64_t w = gc_word(seed, words);
    memcpy(p + 8 * words, &w, n % 8);
}

cudaError_t gc_fill(void *p, size_t n, uint64_t seed, cudaStream_t s)
{
    if (capturing(s)) /* recorded in the capture (the stand-in never runs graphs) */
        return (cudaError_t)fakecuda_enqueue_fill(s, p, (int)(seed & 0xff), n);
    cudaError_t r = cudaStreamSynchronize(s);
    if (r == cudaSuccess)
        host_fill(p, n, seed);
    return r;
}

long long gc_verify(const void *p, size_t n, uint64_t seed, cudaStream_t s, int slot)
{
    (void)slot;
    if (cudaStreamSynchronize(s) != cudaSuccess)
        return -1;
    const unsigned char *b = p;
    long long bad = 0;
    size_t words = n / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w = gc_word(seed, i);
        bad += memcmp(b + 8 * i, &w, 8) != 0;
    }
    uint64_t w = gc_word(seed, words);
    bad += memcmp(b + 8 * words, &w, n % 8) != 0;
    return bad;
}

cudaError_t gc_late_fill(void *p, size_t n, uint64_t seed, double ms, cudaStream_t s)
{
    (void)ms;
    return (cudaError_t)fakecuda_enqueue_fill(s, p, (int)(seed & 0xff) | 1, n);
}

cudaError_t gc_graph_run(cudaGraph_t g, cudaStream_t s)
{
    (void)g;
    (void)s;
    return cudaErrorNotSupported;
}

cudaError_t gc_fault(cudaStream_t s) { return (cudaError_t)fakecuda_enqueue_fault(s); }

/* The stand-in's graphs are handles it never frees. */
void gc_graph_destroy(cudaGraph_t g) { (void)g; }
