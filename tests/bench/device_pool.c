/* device_pool.c - the device pool against the stand-in CUDA runtime
 * (tests/device/fakecudart.c): what PyTorch's cache misses and programs
 * without a cache cost, with and without the shim.
 *
 * Phase 1: each thread keeps 8 live blocks of PyTorch's segment sizes
 * (2 MiB, 20 MiB, 512 KiB, 64 KiB) and replaces a random one PAIRS times:
 * CPU time per cudaMalloc+cudaFree pair, and the calls the runtime received
 * (cudaMalloc, cudaFree, cudaDeviceSynchronize) per 1000 client calls.
 * Phase 1b: the same with a cudaDeviceSynchronize after every 64 pairs,
 * as a training or inference loop has: ns per pair, the sync included.
 * Phase 2: a PyTorch-like segment trace (2 MiB segments for requests up to
 * 1 MiB, 20 MiB for 1-10 MiB, larger ones rounded up to 2 MiB) until 700
 * MiB are live: the pool's waste over what was requested.
 *
 * Without the shim the numbers are the stand-in's own, a host-memory
 * allocator: a real driver's cudaMalloc and cudaFree cost far more, which
 * is not measured here (no GPU).
 *
 * With FA_BENCH_DEVICES=N in the environment, thread t works on device
 * t % N (the stand-in makes FAKECUDA_DEVICES of them).
 *
 * usage: device_pool THREADS PAIRS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "fakecuda.h"

#define MiB ((size_t)1 << 20)
#define LIVE 8
#define MAX_THREADS 16
#define TRACE_BYTES (700 * MiB)

static const size_t segment_sizes[] = {2 * MiB, 20 * MiB, 512 * 1024, 64 * 1024};

struct worker {
    pthread_t tid;
    long pairs;
    unsigned seed;
    int sync_every; /* 0: never */
    int device;
    double cpu_s;
    int failed;
};

static double thread_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *churn(void *arg)
{
    struct worker *w = arg;
    void *live[LIVE] = {0};
    if (cudaSetDevice(w->device) != cudaSuccess)
        w->failed = 1;
    unsigned seed = w->seed; /* a local: the workers' structs share cache lines */
    double t0 = thread_cpu();
    for (long i = 0; i < w->pairs; i++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 8) % LIVE);
        size_t n = segment_sizes[(seed >> 16) % (sizeof segment_sizes / sizeof segment_sizes[0])];
        if (live[k] && cudaFree(live[k]) != cudaSuccess)
            w->failed = 1;
        if (cudaMalloc(&live[k], n) != cudaSuccess)
            w->failed = 1;
        if (w->sync_every && i % w->sync_every == w->sync_every - 1 && cudaDeviceSynchronize() != cudaSuccess)
            w->failed = 1;
    }
    w->cpu_s = thread_cpu() - t0;
    w->seed = seed;
    for (int k = 0; k < LIVE; k++)
        if (live[k])
            cudaFree(live[k]);
    return NULL;
}

/* PyTorch's segment for a tensor of `want` bytes. */
static size_t segment_for(size_t want)
{
    if (want <= MiB)
        return 2 * MiB;
    if (want <= 10 * MiB)
        return 20 * MiB;
    return (want + 2 * MiB - 1) / (2 * MiB) * (2 * MiB);
}

static double trace_waste_pct(void)
{
    int (*stat)(const char *, uint64_t *) = (int (*)(const char *, uint64_t *))dlsym(RTLD_DEFAULT, "forgealloc_stat");
    void *blocks[1024];
    int n = 0;
    size_t requested = 0, taken_by_runtime = 0;
    unsigned seed = 42;
    while (requested < TRACE_BYTES && n < 1024) {
        seed = seed * 1103515245u + 12345u;
        size_t seg = segment_for((size_t)(seed >> 8) % (40 * MiB) + 1);
        if (cudaMalloc(&blocks[n], seg) != cudaSuccess)
            break;
        requested += seg;
        taken_by_runtime += (seg + 511) / 512 * 512; /* the stand-in's own granularity */
        n++;
    }
    double pct = 100.0 * (double)(taken_by_runtime - requested) / (double)requested;
    uint64_t waste, req;
    if (stat && stat("device.0.waste_bytes", &waste) == 0 && stat("device.0.requested_bytes", &req) == 0 && req)
        pct = 100.0 * (double)waste / (double)req; /* what the pool took beyond the requests */
    for (int i = 0; i < n; i++)
        cudaFree(blocks[i]);
    return pct;
}

int main(int argc, char **argv)
{
    long threads = argc > 1 ? atol(argv[1]) : 1, pairs = argc > 2 ? atol(argv[2]) : 100000;
    if (threads < 1 || threads > MAX_THREADS || pairs < 1) {
        fprintf(stderr, "usage: device_pool THREADS(1-%d) PAIRS\n", MAX_THREADS);
        return 2;
    }
    const char *dv = getenv("FA_BENCH_DEVICES");
    int devices = dv && atoi(dv) > 0 ? atoi(dv) : 1;
    for (int d = 0; d < devices; d++) {
        void *warm;
        cudaSetDevice(d);
        cudaMalloc(&warm, 4096); /* context and, under the shim, the pool */
        cudaFree(warm);
    }
    cudaSetDevice(0);
    fakecuda_reset_counters();
    struct worker w[MAX_THREADS];
    for (long t = 0; t < threads; t++) {
        w[t] = (struct worker){.pairs = pairs, .seed = 7u + (unsigned)t, .device = (int)(t % devices)};
        pthread_create(&w[t].tid, NULL, churn, &w[t]);
    }
    double cpu = 0;
    int failed = 0;
    for (long t = 0; t < threads; t++) {
        pthread_join(w[t].tid, NULL);
        cpu += w[t].cpu_s;
        failed |= w[t].failed;
    }
    double client = 2.0 * (double)threads * (double)pairs;
    double driver = (double)(fakecuda_calls("cudaMalloc") + fakecuda_calls("cudaFree"));
    double syncs = (double)fakecuda_calls("cudaDeviceSynchronize");
    /* Phase 1b: the program synchronises now and then. */
    for (long t = 0; t < threads; t++) {
        w[t] = (struct worker){.pairs = pairs, .seed = 11u + (unsigned)t, .sync_every = 64, .device = (int)(t % devices)};
        pthread_create(&w[t].tid, NULL, churn, &w[t]);
    }
    double cpu_synced = 0;
    for (long t = 0; t < threads; t++) {
        pthread_join(w[t].tid, NULL);
        cpu_synced += w[t].cpu_s;
        failed |= w[t].failed;
    }
    double waste = trace_waste_pct();
    printf("{\"ops\": %.0f, \"ns_per_pair\": %.1f, \"ns_per_pair_synced\": %.1f, \"driver_calls_per_1000\": %.2f, "
           "\"syncs_per_1000\": %.2f, \"waste_pct\": %.3f, \"failed\": %d}\n",
           client, 1e9 * cpu / (client / 2), 1e9 * cpu_synced / (client / 2), 1000.0 * driver / client,
           1000.0 * syncs / client, waste, failed);
    return failed;
}
