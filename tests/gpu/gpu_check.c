/* gpu_check.c - device allocation checks that run the same way natively and
 * under LD_PRELOAD=libforgealloc.so; run.py compares the two runs.  Built
 * twice: against a real libcudart with kernels.cu (the `gpu` tests), and
 * against the stand-in runtime of tests/device with fake_backend.c.
 *
 *   gpu_check CHECK [ARGS...]
 *
 * Prints `key value` lines on stdout (what run.py compares) and one line per
 * broken invariant on stderr.  Exit 0: every invariant held; 1: one broke;
 * 77: no usable CUDA device (ctest reports the test as skipped); 2: usage. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_check.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static int failures;
#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "gpu_check: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
            __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);             \
        }                                                                   \
    } while (0)

static void put(const char *key, long long v) { printf("%s %lld\n", key, v); }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Sizes from 1 B to max, spread evenly over their orders of magnitude. */
static size_t log_size(uint64_t *s, size_t max)
{
    unsigned bits = 0;
    while (((size_t)1 << (bits + 1)) <= max)
        bits++;
    size_t hi = (size_t)1 << (rnd(s) % (bits + 1));
    size_t n = hi + rnd(s) % hi;
    return n > max ? max : n;
}

/* cudaMalloc failed for lack of memory: the error a caller such as PyTorch
 * clears before going on. */
static bool out_of_memory(cudaError_t r)
{
    if (r != cudaErrorMemoryAllocation)
        return false;
    cudaGetLastError();
    return true;
}

static size_t mem_free(void)
{
    size_t f = 0, t = 0;
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess, "cudaMemGetInfo");
    return f;
}

/* ---- random: sizes 1 B to MAX_MIB, random frees, contents kept -------------------------------------- */

struct block {
    void *p;
    size_t n;
    uint64_t seed;
};

static int check_random(int argc, char **argv)
{
    size_t max = (argc > 0 ? strtoull(argv[0], NULL, 0) : 512) * MiB;
    long ops = argc > 1 ? atol(argv[1]) : 4000;
    uint64_t s = argc > 2 ? strtoull(argv[2], NULL, 0) : 42;
    size_t budget = mem_free() / 2; /* live bytes at most: leave the card to others */
    enum { LIVE = 256 };
    struct block live[LIVE] = {{0}};
    int nlive = 0;
    size_t held = 0;
    long long bad = 0, overlaps = 0, allocs = 0, ooms = 0;
    for (long op = 0; op < ops; op++) {
        bool alloc = nlive == 0 || (nlive < LIVE && rnd(&s) % 100 < 55);
        if (alloc) {
            size_t n = log_size(&s, max);
            if (held + n > budget)
                alloc = false;
            else {
                struct block b = {NULL, n, rnd(&s)};
                cudaError_t r = cudaMalloc(&b.p, n);
                if (out_of_memory(r)) {
                    ooms++;
                    alloc = false;
                } else {
                    CHECK(r == cudaSuccess, "cudaMalloc(%zu) = %d", n, (int)r);
                    if (r != cudaSuccess)
                        break;
                    CHECK(((uintptr_t)b.p & 255) == 0, "cudaMalloc(%zu) = %p is not 256-byte aligned", n, b.p);
                    for (int i = 0; i < nlive; i++) {
                        uintptr_t a = (uintptr_t)b.p, c = (uintptr_t)live[i].p;
                        if (a < c + live[i].n && c < a + n)
                            overlaps++;
                    }
                    CHECK(gc_fill(b.p, n, b.seed, 0) == cudaSuccess, "fill");
                    live[nlive++] = b;
                    held += n;
                    allocs++;
                }
            }
        }
        if (!alloc && nlive > 0) {
            int i = (int)(rnd(&s) % (uint64_t)nlive);
            long long v = gc_verify(live[i].p, live[i].n, live[i].seed, 0, 0);
            CHECK(v == 0, "block of %zu bytes at %p: %lld words changed", live[i].n, live[i].p, v);
            bad += v;
            CHECK(cudaFree(live[i].p) == cudaSuccess, "cudaFree");
            held -= live[i].n;
            live[i] = live[--nlive];
        }
    }
    for (int i = 0; i < nlive; i++) {
        long long v = gc_verify(live[i].p, live[i].n, live[i].seed, 0, 0);
        CHECK(v == 0, "block of %zu bytes: %lld words changed", live[i].n, v);
        bad += v;
        CHECK(cudaFree(live[i].p) == cudaSuccess, "cudaFree");
    }
    CHECK(overlaps == 0, "%lld live blocks overlapped", overlaps);
    CHECK(cudaGetLastError() == cudaSuccess, "an error was left pending");
    put("allocs", allocs);
    put("out_of_memory", ooms);
    put("overlaps", overlaps);
    put("bad_words", bad);
    return failures;
}

/* ---- frag: the largest block that fits after a fragmenting pattern of frees ---------------------------- */

/* The largest cudaMalloc that succeeds, to `step` bytes, below hi. */
static size_t largest_fit(size_t hi, size_t step)
{
    size_t lo = 0; /* lo fits (0 trivially), hi does not */
    hi = (hi / step + 1) * step;
    while (hi - lo > step) {
        size_t mid = lo + (hi - lo) / 2 / step * step;
        void *p = NULL;
        cudaError_t r = cudaMalloc(&p, mid);
        if (r == cudaSuccess) {
            CHECK(cudaFree(p) == cudaSuccess, "cudaFree");
            lo = mid;
        } else {
            CHECK(out_of_memory(r), "cudaMalloc(%zu) = %d", mid, (int)r);
            hi = mid;
        }
    }
    return lo;
}

static int check_frag(int argc, char **argv)
{
    size_t piece = (argc > 0 ? strtoull(argv[0], NULL, 0) : 2) * MiB;
    long keep = argc > 1 ? atol(argv[1]) : 32;
    size_t cap = mem_free() / piece + 64;
    void **p = calloc(cap, sizeof *p);
    size_t n = 0;
    cudaError_t r = cudaSuccess;
    while (n < cap && (r = cudaMalloc(&p[n], piece)) == cudaSuccess)
        n++;
    CHECK(out_of_memory(r), "filling the card ended with %d, not cudaErrorMemoryAllocation", (int)r);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % (size_t)keep == 0)
            kept++;
        else
            CHECK(cudaFree(p[i]) == cudaSuccess, "cudaFree");
    }
    size_t f = 0, t = 0;
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess, "cudaMemGetInfo");
    size_t big = largest_fit(f + piece, MiB);
    size_t f2 = mem_free();
    CHECK(big <= f, "a block of %zu bytes fit but cudaMemGetInfo said %zu free", big, f);
    for (size_t i = 0; i < n; i += (size_t)keep)
        CHECK(cudaFree(p[i]) == cudaSuccess, "cudaFree");
    free(p);
    size_t after = largest_fit(t, 64 * MiB);
    put("pieces", (long long)n);
    put("kept", (long long)kept);
    put("free_bytes", (long long)f);
    put("free_bytes_after_search", (long long)f2);
    put("largest_bytes", (long long)big);
    put("largest_bytes_all_freed", (long long)after);
    put("total_bytes", (long long)t);
    return failures;
}

/* ---- hazard: a block freed while a kernel still writes it -------------------------------------------- */

static int check_hazard(int argc, char **argv)
{
    size_t n = (argc > 0 ? strtoull(argv[0], NULL, 0) : 64) * MiB;
    double ms = argc > 1 ? atof(argv[1]) : 300;
    int tries = argc > 2 ? atoi(argv[2]) : 8;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    void *x = NULL;
    CHECK(cudaMalloc(&x, n) == cudaSuccess, "cudaMalloc");
    CHECK(gc_late_fill(x, n, 0xdead, ms, s) == cudaSuccess, "late fill");
    double t0 = now_s();
    CHECK(cudaFree(x) == cudaSuccess, "cudaFree"); /* the kernel is still running */
    double free_s = now_s() - t0;
    /* Blocks of the same size, taken at once: none may be x while the kernel
     * runs, and their contents must survive it. */
    void *y[64];
    long long early = 0, bad = 0;
    if (tries > 64)
        tries = 64;
    for (int i = 0; i < tries; i++) {
        CHECK(cudaMalloc(&y[i], n) == cudaSuccess, "cudaMalloc");
        uintptr_t a = (uintptr_t)y[i], b = (uintptr_t)x;
        if (a < b + n && b < a + n && cudaStreamQuery(s) == cudaErrorNotReady)
            early++;
        cudaGetLastError();
        CHECK(gc_fill(y[i], n, 1000 + (uint64_t)i, 0) == cudaSuccess, "fill");
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
    for (int i = 0; i < tries; i++) {
        long long v = gc_verify(y[i], n, 1000 + (uint64_t)i, 0, 0);
        CHECK(v == 0, "block %d: %lld words written by the kernel that ran on the freed block", i, v);
        bad += v;
        CHECK(cudaFree(y[i]) == cudaSuccess, "cudaFree");
    }
    CHECK(early == 0, "%lld blocks overlapped the freed one while its kernel still ran", early);
    cudaStreamDestroy(s);
    put("reused_while_running", early);
    put("bad_words", bad);
    put("free_ms", (long long)(free_s * 1000));
    return failures;
}

/* ---- threads: allocating, writing and checking at once ------------------------------------------------ */

struct worker {
    int slot;
    long iters;
    size_t max;
    long long bad;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");
    uint64_t seed = 0x1234567 + (uint64_t)w->slot * 7919;
    void *keep[4] = {0};
    size_t keep_n[4] = {0};
    uint64_t keep_seed[4] = {0};
    for (long i = 0; i < w->iters; i++) {
        size_t n = 512 + rnd(&seed) % w->max;
        uint64_t sd = rnd(&seed);
        void *p = NULL;
        cudaError_t r = cudaMalloc(&p, n);
        CHECK(r == cudaSuccess, "thread %d: cudaMalloc(%zu) = %d", w->slot, n, (int)r);
        if (r != cudaSuccess)
            break;
        CHECK(gc_fill(p, n, sd, s) == cudaSuccess, "fill");
        long long v = gc_verify(p, n, sd, s, w->slot);
        CHECK(v == 0, "thread %d: %lld words of a fresh block changed", w->slot, v);
        w->bad += v;
        /* A few blocks live longer, across other threads' frees. */
        int k = (int)(i % 4);
        if (keep[k]) {
            v = gc_verify(keep[k], keep_n[k], keep_seed[k], s, w->slot);
            CHECK(v == 0, "thread %d: %lld words of a kept block changed", w->slot, v);
            w->bad += v;
            CHECK(cudaFree(keep[k]) == cudaSuccess, "cudaFree");
        }
        keep[k] = p;
        keep_n[k] = n;
        keep_seed[k] = sd;
    }
    for (int k = 0; k < 4; k++)
        if (keep[k])
            CHECK(cudaFree(keep[k]) == cudaSuccess, "cudaFree");
    cudaStreamDestroy(s);
    return NULL;
}

static int check_threads(int argc, char **argv)
{
    int nt = argc > 0 ? atoi(argv[0]) : 8;
    long iters = argc > 1 ? atol(argv[1]) : 3000;
    size_t max = (argc > 2 ? strtoull(argv[2], NULL, 0) : 4) * MiB;
    if (nt < 1 || nt > GC_SLOTS)
        nt = 8;
    pthread_t th[GC_SLOTS];
    struct worker w[GC_SLOTS];
    double t0 = now_s();
    for (int i = 0; i < nt; i++) {
        w[i] = (struct worker){i, iters, max, 0};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    long long bad = 0;
    for (int i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        bad += w[i].bad;
    }
    put("threads", nt);
    put("bad_words", bad);
    put("ms", (long long)((now_s() - t0) * 1000));
    return failures;
}

/* ---- oom: exhaustion, its error and what is left pending --------------------------------------------- */

static int check_oom(int argc, char **argv)
{
    size_t big = (argc > 0 ? strtoull(argv[0], NULL, 0) : 256) * MiB;
    size_t small = (argc > 1 ? strtoull(argv[1], NULL, 0) : 2) * MiB;
    size_t f = mem_free();
    size_t cap = f / small + 64;
    void **p = calloc(cap, sizeof *p);
    size_t n = 0, nbig = 0, nsmall = 0;
    cudaError_t rb = cudaSuccess, rs = cudaSuccess;
    while (n < cap && (rb = cudaMalloc(&p[n], big)) == cudaSuccess)
        n++, nbig++;
    int peek_big = (int)cudaPeekAtLastError();
    int last_big = (int)cudaGetLastError();
    int last_big2 = (int)cudaGetLastError();
    while (n < cap && (rs = cudaMalloc(&p[n], small)) == cudaSuccess)
        n++, nsmall++;
    int last_small = (int)cudaGetLastError();
    /* A request far beyond the card. */
    void *q = NULL;
    int huge = (int)cudaMalloc(&q, (size_t)1 << 50);
    int last_huge = (int)cudaGetLastError();
    for (size_t i = 0; i < n; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess, "cudaFree");
    free(p);
    /* Everything can be had again. */
    void *again = NULL;
    size_t most = nbig * big;
    cudaError_t ra = most ? cudaMalloc(&again, most) : cudaSuccess;
    CHECK(ra == cudaSuccess, "after freeing everything, cudaMalloc(%zu) = %d", most, (int)ra);
    if (ra == cudaSuccess && again)
        cudaFree(again);
    cudaGetLastError();
    put("big_blocks", (long long)nbig);
    put("small_blocks", (long long)nsmall);
    put("total_bytes", (long long)(nbig * big + nsmall * small));
    put("error_big", (int)rb);
    put("peek_after_big", peek_big);
    put("last_after_big", last_big);
    put("last_after_big_again", last_big2);
    put("error_small", (int)rs);
    put("last_after_small", last_small);
    put("error_huge", huge);
    put("last_after_huge", last_huge);
    put("realloc_all", (int)ra);
    return failures;
}

/* ---- meminfo: cudaMemGetInfo around the pool -------------------------------------------------------- */

static int check_meminfo(int argc, char **argv)
{
    size_t n = (argc > 0 ? strtoull(argv[0], NULL, 0) : 512) * MiB;
    CHECK(cudaFree(NULL) == cudaSuccess, "cudaFree(NULL) creates the context");
    size_t f0 = 0, t0 = 0, f;
    CHECK(cudaMemGetInfo(&f0, &t0) == cudaSuccess, "cudaMemGetInfo");
    void *small = NULL, *x = NULL;
    CHECK(cudaMalloc(&small, MiB) == cudaSuccess, "cudaMalloc");
    size_t f1 = mem_free();
    CHECK(cudaMalloc(&x, n) == cudaSuccess, "cudaMalloc");
    size_t f2 = mem_free();
    CHECK(cudaFree(x) == cudaSuccess, "cudaFree");
    size_t f3 = mem_free();
    CHECK(cudaFree(small) == cudaSuccess, "cudaFree");
    f = mem_free();
    put("total", (long long)t0);
    put("free_start", (long long)f0);
    put("drop_small", (long long)f0 - (long long)f1);
    put("drop_big", (long long)f1 - (long long)f2);
    put("back_big", (long long)f3 - (long long)f2);
    put("free_end", (long long)f);
    return failures;
}

/* ---- capture: allocation inside a stream capture, graph launch ------------------------------------- */

static int check_capture(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    size_t n = 8 * MiB;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    /* Warm the pool and leave a freed block in it, as a running program has. */
    void *w = NULL;
    CHECK(cudaMalloc(&w, n) == cudaSuccess && cudaFree(w) == cudaSuccess, "warm-up");

    /* PyTorch's way: capture in global mode, allocate in relaxed mode. */
    cudaGraph_t g = NULL;
    void *p = NULL;
    int begin = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    gc_capture_mode m = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&m);
    int relaxed = (int)cudaMalloc(&p, n);
    cudaThreadExchangeStreamCaptureMode(&m);
    int fill = relaxed == cudaSuccess ? (int)gc_fill(p, n, 77, s) : -1;
    int end = (int)cudaStreamEndCapture(s, &g);
    int run = end == cudaSuccess ? (int)gc_graph_run(g, s) : -1;
    long long bad = -1;
    if (run == cudaSuccess) {
        bad = gc_verify(p, n, 77, s, 0);
        CHECK(bad == 0, "the graph's fill: %lld words differ", bad);
    }
    if (g)
        gc_graph_destroy(g);
    if (p)
        CHECK(cudaFree(p) == cudaSuccess, "cudaFree");

    /* A cudaMalloc the runtime forbids during a global-mode capture. */
    cudaGraph_t g2 = NULL;
    void *q = NULL;
    int begin2 = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    int global = (int)cudaMalloc(&q, n);
    int end2 = (int)cudaStreamEndCapture(s, &g2);
    int last2 = (int)cudaGetLastError();
    if (g2)
        gc_graph_destroy(g2);
    if (global == cudaSuccess && q)
        cudaFree(q);
    cudaGetLastError();

    /* And allocation works as before afterwards. */
    void *r = NULL;
    int after = (int)cudaMalloc(&r, n);
    if (after == cudaSuccess) {
        CHECK(gc_fill(r, n, 5, 0) == cudaSuccess, "fill");
        long long v = gc_verify(r, n, 5, 0, 0);
        CHECK(v == 0, "after the captures: %lld words differ", v);
        cudaFree(r);
    }
    cudaStreamDestroy(s);
    put("begin", begin);
    put("relaxed_malloc", relaxed);
    put("captured_fill", fill);
    put("end", end);
    put("graph_run", run);
    put("graph_bad_words", bad);
    put("begin_global", begin2);
    put("global_malloc", global);
    put("end_global", end2);
    put("last_error_global", last2);
    put("malloc_after", after);
    return failures;
}

/* ---- capture_free: cudaFree of a cudaMalloc block during a stream capture -------------------------- */

/* In each combination of the capture's mode and the thread's: what cudaFree
 * returns, the last error, what became of the capture, and, where the free
 * was refused, whether the block is still allocated with its contents. */
static int check_capture_free(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    size_t n = 4 * MiB;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    static const struct {
        const char *name;
        gc_capture_mode capture, thread;
    } cases[] = {
        {"global", cudaStreamCaptureModeGlobal, cudaStreamCaptureModeGlobal},
        {"thread_local", cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal},
        {"relaxed_capture", cudaStreamCaptureModeRelaxed, cudaStreamCaptureModeGlobal},
        {"relaxed_thread", cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t seed = 41 + i;
        void *p = NULL;
        CHECK(cudaMalloc(&p, n) == cudaSuccess, "cudaMalloc");
        CHECK(gc_fill(p, n, seed, 0) == cudaSuccess && gc_verify(p, n, seed, 0, 0) == 0, "fill");
        int begin = (int)cudaStreamBeginCapture(s, cases[i].capture);
        gc_capture_mode m = cases[i].thread;
        cudaThreadExchangeStreamCaptureMode(&m);
        int freed = (int)cudaFree(p);
        cudaThreadExchangeStreamCaptureMode(&m);
        int last = (int)cudaGetLastError();
        gc_capture_status st = cudaStreamCaptureStatusNone;
        int status = cudaStreamIsCapturing(s, &st) == cudaSuccess ? (int)st : -1;
        cudaGraph_t g = NULL;
        int end = (int)cudaStreamEndCapture(s, &g);
        int last_end = (int)cudaGetLastError();
        if (g)
            gc_graph_destroy(g);
        long long bad = -1;
        if (freed != cudaSuccess) { /* refused: still allocated, never reused meanwhile */
            void *q = NULL;
            CHECK(cudaMalloc(&q, n) == cudaSuccess && q != p, "another block");
            if (q)
                CHECK(gc_fill(q, n, 7, 0) == cudaSuccess && cudaFree(q) == cudaSuccess, "another block");
            bad = gc_verify(p, n, seed, 0, 0);
            CHECK(cudaFree(p) == cudaSuccess, "cudaFree after the capture");
        }
        char key[64];
#define PUT(what, v) (snprintf(key, sizeof key, "%s_%s", cases[i].name, what), put(key, v))
        PUT("begin", begin);
        PUT("free", freed);
        PUT("last_error", last);
        PUT("status", status);
        PUT("end", end);
        PUT("last_error_end", last_end);
        PUT("kept_bad_words", bad);
#undef PUT
    }
    cudaStreamDestroy(s);
    return failures;
}

/* ---- capture_room: a relaxed capture's request the driver alone would serve ------------------------ */

static int capture_status(cudaStream_t s)
{
    gc_capture_status st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &st) == cudaSuccess ? (int)st : -1;
}

/* Blocks of 2 MiB until fail (at most max): how many bytes were had; all
 * freed again. */
static size_t take_all(size_t max)
{
    size_t cap = max / (2 * MiB) + 1, n = 0;
    void **p = calloc(cap, sizeof *p);
    while (p && n < cap && cudaMalloc(&p[n], 2 * MiB) == cudaSuccess)
        n++;
    cudaGetLastError();
    for (size_t i = 0; i < n; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess, "cudaFree");
    free(p);
    return n * 2 * MiB;
}

/* 80% of the free memory in 2 MiB blocks, freed and synchronised (under
 * the shim the pool holds it idle); then, in a global capture with this
 * thread in relaxed mode (PyTorch's way), a block of 70% of it, and what
 * cudaMemGetInfo calls free during the capture, in 2 MiB blocks. */
#define SLACK (64 * MiB)
static int check_capture_room(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    size_t f0 = mem_free();
    size_t had = take_all(f0 * 8 / 10);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    int begin = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    gc_capture_mode m = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&m);
    void *big = NULL;
    int big_rc = (int)cudaMalloc(&big, f0 * 7 / 10);
    size_t f = 0, t = 0;
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess, "cudaMemGetInfo");
    size_t got = take_all(f + 64 * MiB);
    cudaThreadExchangeStreamCaptureMode(&m);
    int status = capture_status(s);
    cudaGraph_t g = NULL;
    int end = (int)cudaStreamEndCapture(s, &g);
    if (g)
        gc_graph_destroy(g);
    if (big)
        CHECK(cudaFree(big) == cudaSuccess, "cudaFree");
    cudaGetLastError();
    cudaStreamDestroy(s);
    /* The driver itself counts a few MiB it cannot give in 2 MiB blocks (an
     * H200, natively: 3.1 MiB of 42.8 GiB); a pool that counted its idle
     * memory it cannot move during a capture would be off by far more. */
    CHECK(got + SLACK >= f, "cudaMemGetInfo said %zu bytes free during the capture, %zu could be had", f, got);
    put("filled", had > 0);
    put("begin", begin);
    put("big_malloc", big_rc);
    put("free_during_capture_can_be_had", got + SLACK >= f);
    put("status", status);
    put("end", end);
    return failures;
}

/* ---- capture_race: the pool's own calls while another thread captures ---------------------------- */

static int race_done;
static long long race_made;

/* Relaxed mode (legal during any capture): pairs of sizes that make the
 * pool grow, reuse, give back. */
static void *race_pairs(void *arg)
{
    long long *failed = arg;
    gc_capture_mode m = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&m);
    static const size_t sizes[] = {2 * MiB, 20 * MiB, 200 * MiB, 64 * KiB};
    for (unsigned i = 0; !__atomic_load_n(&race_done, __ATOMIC_ACQUIRE); i++) {
        void *p = NULL;
        cudaError_t r = cudaMalloc(&p, sizes[i % 4]);
        if (r == cudaSuccess)
            r = cudaFree(p);
        if (r != cudaSuccess) {
            cudaGetLastError();
            ++*failed;
        }
        __atomic_add_fetch(&race_made, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static int check_capture_race(int argc, char **argv)
{
    int n = argc > 0 ? atoi(argv[0]) : 2000;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    long long failed = 0;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, race_pairs, &failed) == 0, "thread");
    while (__atomic_load_n(&race_made, __ATOMIC_ACQUIRE) < 8) /* the pairs are under way */
        ;
    int invalidated = 0;
    for (int i = 0; i < n; i++) {
        cudaGraph_t g = NULL;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin");
        if (cudaStreamEndCapture(s, &g) != cudaSuccess)
            invalidated++;
        if (g)
            gc_graph_destroy(g);
    }
    __atomic_store_n(&race_done, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    cudaGetLastError();
    cudaStreamDestroy(s);
    put("captures", n);
    put("pairs_made", race_made > 0);
    put("invalidated", invalidated);
    put("pairs_failed", failed);
    CHECK(invalidated == 0, "%d of %d captures invalidated", invalidated, n);
    return failures;
}

/* ---- capture_refuse: calls that fail during a capture of this thread's ----------------------------- */

/* cudaIpcGetMemHandle of a cudaMalloc block, and cudaMalloc(NULL, 1) (how
 * the pool leaves cudaErrorInvalidValue as the last error), during this
 * thread's global-mode capture: what they return and what becomes of the
 * capture. */
static int check_capture_refuse(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    void *p = NULL;
    CHECK(cudaMalloc(&p, 4 * MiB) == cudaSuccess, "cudaMalloc");
    cudaIpcMemHandle_t h;
    cudaGraph_t g = NULL;
    int begin = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    int ipc = (int)cudaIpcGetMemHandle(&h, p);
    int ipc_status = capture_status(s);
    int ipc_end = (int)cudaStreamEndCapture(s, &g);
    cudaGetLastError();
    int begin2 = (int)cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    int null_malloc = (int)cudaMalloc(NULL, 1);
    int null_status = capture_status(s);
    int null_end = (int)cudaStreamEndCapture(s, &g);
    cudaGetLastError();
    CHECK(cudaFree(p) == cudaSuccess, "cudaFree");
    cudaStreamDestroy(s);
    put("begin", begin);
    put("ipc", ipc);
    put("ipc_status", ipc_status);
    put("ipc_end", ipc_end);
    put("begin2", begin2);
    put("null_malloc", null_malloc);
    put("null_status", null_status);
    put("null_end", null_end);
    return failures;
}

/* ---- sticky: after a kernel's illegal address ---------------------------------------------------------- */

static void *sticky_thread(void *arg)
{
    void *p = NULL;
    *(int *)arg = (int)cudaMalloc(&p, MiB);
    return NULL;
}

/* What cudaMalloc and cudaFree return after the fault: on a new thread's
 * first call, within 64 calls of this thread's (which did not read the
 * error), after the error was read; and the last error they leave. */
static int check_sticky(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    void *a = NULL, *b = NULL, *p = NULL;
    CHECK(cudaMalloc(&a, 4 * MiB) == cudaSuccess && cudaMalloc(&b, 4 * MiB) == cudaSuccess, "cudaMalloc");
    CHECK(cudaFree(b) == cudaSuccess, "cudaFree");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    int launch = (int)gc_fault(s);
    int sync = (int)cudaStreamSynchronize(s);
    int other = -1;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sticky_thread, &other) == 0, "thread");
    pthread_join(t, NULL);
    int within = 0, r = 0;
    for (int i = 0; i < 64 && !within; i++) {
        r = (int)cudaMalloc(&p, MiB);
        within = r != cudaSuccess;
    }
    int read = (int)cudaGetLastError();
    int after_read = (int)cudaMalloc(&p, MiB);
    int peek_after = (int)cudaPeekAtLastError();
    int free_rc = (int)cudaFree(a);
    int last_free = (int)cudaGetLastError();
    put("launch", launch);
    put("sync", sync);
    put("new_thread_malloc", other);
    put("failed_within_64", within);
    put("malloc_error", r);
    put("read", read);
    put("malloc_after_read", after_read);
    put("peek_after_malloc", peek_after);
    put("free", free_rc);
    put("last_error_after_free", last_free);
    return failures;
}

/* ---- driver_alloc: the driver API's allocations ------------------------------------------------------- */

typedef int (*cu_alloc_fn)(unsigned long long *, size_t);
typedef int (*cu_free_fn)(unsigned long long);

/* 60% of the free memory in 2 MiB blocks, freed and synchronised (under
 * the shim the pool holds it idle); then cuMemAlloc, found through
 * cudaGetDriverEntryPointByVersion, of 70% of it. */
static int check_driver_alloc(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    cu_alloc_fn alloc = NULL;
    cu_free_fn release = NULL;
    CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", (void **)&alloc, 12000, 0, NULL) == cudaSuccess && alloc,
          "cuMemAlloc");
    CHECK(cudaGetDriverEntryPointByVersion("cuMemFree", (void **)&release, 12000, 0, NULL) == cudaSuccess &&
              release,
          "cuMemFree");
    size_t f0 = mem_free();
    take_all(f0 * 6 / 10);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
    unsigned long long d = 0;
    int r = alloc && release ? alloc(&d, f0 * 7 / 10) : -1;
    if (r == 0)
        CHECK(release(d) == 0, "cuMemFree");
    int last = (int)cudaGetLastError();
    put("cu_mem_alloc", r);
    put("last_error", last);
    return failures;
}

/* ---- reset: cudaDeviceReset with blocks live ----------------------------------------------------- */

static int check_reset(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    size_t n = 16 * MiB;
    void *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, n) == cudaSuccess && cudaMalloc(&b, 3 * MiB) == cudaSuccess, "cudaMalloc");
    CHECK(cudaFree(b) == cudaSuccess, "cudaFree");
    int reset = (int)cudaDeviceReset();
    /* a and b died with the context; new blocks work. */
    long long bad = 0;
    int allocs_ok = 1;
    void *c[4];
    for (int i = 0; i < 4; i++) {
        cudaError_t r = cudaMalloc(&c[i], n);
        allocs_ok &= r == cudaSuccess;
        CHECK(r == cudaSuccess, "cudaMalloc after reset = %d", (int)r);
        if (r == cudaSuccess)
            CHECK(gc_fill(c[i], n, 9 + (uint64_t)i, 0) == cudaSuccess, "fill");
        else
            c[i] = NULL;
    }
    for (int i = 0; i < 4; i++) {
        if (!c[i])
            continue;
        long long v = gc_verify(c[i], n, 9 + (uint64_t)i, 0, 0);
        CHECK(v == 0, "block %d after reset: %lld words differ", i, v);
        bad += v;
        CHECK(cudaFree(c[i]) == cudaSuccess, "cudaFree");
    }
    int last = (int)cudaGetLastError();
    put("reset", reset);
    put("allocs_after_reset_ok", allocs_ok);
    put("bad_words", bad);
    put("last_error", last);
    return failures;
}

/* ---- probe ---------------------------------------------------------------------------------------------- */

static int probe(void)
{
    int count = 0;
    cudaError_t r = cudaGetDeviceCount(&count);
    if (r != cudaSuccess || count < 1) {
        printf("no CUDA device: cudaGetDeviceCount = %d (%s), %d devices\n", (int)r, cudaGetErrorName(r), count);
        return 77;
    }
    char what[256];
    gc_describe(what, sizeof what);
    printf("device %s\n", what);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    static const struct {
        const char *name;
        int (*fn)(int, char **);
        const char *args;
    } checks[] = {
        {"random", check_random, "[MAX_MIB=512 [OPS=4000 [SEED]]]"},
        {"frag", check_frag, "[PIECE_MIB=2 [KEEP_ONE_IN=32]]"},
        {"hazard", check_hazard, "[MIB=64 [KERNEL_MS=300 [BLOCKS=8]]]"},
        {"threads", check_threads, "[THREADS=8 [ITERS=3000 [MAX_MIB=4]]]"},
        {"oom", check_oom, "[BIG_MIB=256 [SMALL_MIB=2]]"},
        {"meminfo", check_meminfo, "[MIB=512]"},
        {"capture", check_capture, ""},
        {"capture_free", check_capture_free, ""},
        {"reset", check_reset, ""},
        {"capture_room", check_capture_room, ""},
        {"capture_race", check_capture_race, "[CAPTURES=2000]"},
        {"capture_refuse", check_capture_refuse, ""},
        {"sticky", check_sticky, ""},
        {"driver_alloc", check_driver_alloc, ""},
    };
    if (argc < 2) {
        fprintf(stderr, "usage: gpu_check probe\n");
        for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
            fprintf(stderr, "       gpu_check %s %s\n", checks[i].name, checks[i].args);
        return 2;
    }
    if (strcmp(argv[1], "probe") == 0)
        return probe();
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        if (strcmp(argv[1], checks[i].name) != 0)
            continue;
        int count = 0;
        cudaError_t r = cudaGetDeviceCount(&count);
        if (r != cudaSuccess || count < 1) {
            fprintf(stderr, "gpu_check: no CUDA device (cudaGetDeviceCount = %d)\n", (int)r);
            return 77;
        }
        double t0 = now_s();
        int bad = checks[i].fn(argc - 2, argv + 2);
        printf("seconds %.3f\n", now_s() - t0);
        return bad ? 1 : 0;
    }
    fprintf(stderr, "gpu_check: unknown check '%s' (run without arguments for the list)\n", argv[1]);
    return 2;
}
