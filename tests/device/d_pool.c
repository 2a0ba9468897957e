/* d_pool.c - the device pool under LD_PRELOAD=libforgealloc.so, against the
 * stand-in libcudart (fakecudart.c): device memory is host memory here, so
 * contents can be checked directly.  One mode per behaviour; exit 0 when
 * every check holds.  run.py sets the environment of each mode. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakecuda.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static int failures;
static void sleep_s(double s);
static cudaStream_t cc_stream; /* the capture another thread begins (cc_hook, cc_check) */
static void cc_hook(void);
static void cc_check(const char *what);
#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "d_pool: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);                \
        }                                                                      \
    } while (0)

static uint64_t stat_of(const char *key)
{
    static int (*fn)(const char *, uint64_t *);
    if (!fn)
        fn = (int (*)(const char *, uint64_t *))dlsym(RTLD_DEFAULT, "forgealloc_stat");
    uint64_t v = 0;
    if (!fn || fn(key, &v) != 0) {
        fprintf(stderr, "d_pool: no stat %s (is the shim preloaded?)\n", key);
        exit(1);
    }
    return v;
}

/* The pool in use: pieces behind reserved address space, or chunks. */
static bool vmm(void) { return stat_of("device.0.vmm") == 1; }
/* What run.py asked the stand-in for (FAKECUDA_VMM unset: supported). */
static bool vmm_expected(void)
{
    const char *e = getenv("FAKECUDA_VMM");
    return !e || strcmp(e, "1") == 0;
}

static unsigned long vm_calls(void)
{
    return fakecuda_calls("cuMemCreate") + fakecuda_calls("cuMemMap") + fakecuda_calls("cuMemSetAccess") +
           fakecuda_calls("cuMemUnmap") + fakecuda_calls("cuMemRelease");
}

/* PyTorch's protocol: before each cudaMalloc the last error must be clear. */
static void *dmalloc(size_t n)
{
    CHECK(cudaGetLastError() == cudaSuccess);
    void *p = NULL;
    cudaError_t r = cudaMalloc(&p, n);
    if (r != cudaSuccess) {
        fprintf(stderr, "d_pool: cudaMalloc(%zu) = %d\n", n, (int)r);
        failures++;
        return NULL;
    }
    CHECK(((uintptr_t)p & 511) == 0); /* at least cudaMalloc's alignment */
    return p;
}

/* Mark a block: a tag byte at the start of every 4 KiB and at the end. */
static void tag(unsigned char *p, size_t n, unsigned char t)
{
    for (size_t i = 0; i < n; i += 4096)
        p[i] = t;
    p[n - 1] = t;
}
static bool tagged(const unsigned char *p, size_t n, unsigned char t)
{
    for (size_t i = 0; i < n; i += 4096)
        if (p[i] != t)
            return false;
    return p[n - 1] == t;
}

/* ---- churn: many sizes, many threads, contents intact ------------------------- */

static size_t pick_size(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    unsigned r = (*seed >> 8) % 100;
    *seed = *seed * 1103515245u + 12345u;
    if (r < 60)
        return 512 + (*seed >> 4) % (64 * KiB); /* small tensors of programs without a cache */
    if (r < 85)
        return 2 * MiB; /* PyTorch: small segments */
    if (r < 95)
        return 20 * MiB; /* PyTorch: medium segments */
    return (size_t)(6 + (*seed >> 4) % 20) * 2 * MiB; /* PyTorch: large, 2 MiB multiples */
}

struct churn_arg {
    int id, ops;
    uint64_t calls;
};

static void *churn_thread(void *p)
{
    struct churn_arg *a = p;
    enum { SLOTS = 24 };
    struct {
        unsigned char *p;
        size_t n;
        unsigned char t;
    } live[SLOTS] = {{0}};
    unsigned seed = 1234u + (unsigned)a->id;
    for (int op = 0; op < a->ops; op++) {
        seed = seed * 1103515245u + 12345u;
        int i = (int)((seed >> 8) % SLOTS);
        if (live[i].p) {
            CHECK(tagged(live[i].p, live[i].n, live[i].t)); /* no other block overlapped it */
            CHECK(cudaFree(live[i].p) == cudaSuccess);
            live[i].p = NULL;
        } else {
            size_t n = pick_size(&seed);
            live[i].p = dmalloc(n);
            live[i].n = n;
            live[i].t = (unsigned char)(a->id * 31 + op);
            if (live[i].p)
                tag(live[i].p, n, live[i].t);
        }
        a->calls++;
    }
    for (int i = 0; i < SLOTS; i++)
        if (live[i].p) {
            CHECK(tagged(live[i].p, live[i].n, live[i].t));
            CHECK(cudaFree(live[i].p) == cudaSuccess);
            a->calls++;
        }
    return NULL;
}

static int churn(int threads, int ops)
{
    pthread_t t[16];
    struct churn_arg args[16];
    fakecuda_reset_counters();
    for (int i = 0; i < threads; i++) {
        args[i] = (struct churn_arg){i, ops, 0};
        pthread_create(&t[i], NULL, churn_thread, &args[i]);
    }
    uint64_t calls = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        calls += args[i].calls;
    }
    uint64_t mallocs = fakecuda_calls("cudaMalloc"), frees = fakecuda_calls("cudaFree"),
             syncs = fakecuda_calls("cudaDeviceSynchronize");
    /* Exact accounting: the shim's driver counters are the calls the
     * runtime received. */
    CHECK(stat_of("device.0.driver_malloc_calls") == mallocs);
    CHECK(stat_of("device.0.driver_free_calls") == frees);
    CHECK(stat_of("device.0.driver_vm_calls") == vm_calls());
    CHECK(stat_of("device.0.device_syncs") == syncs);
    CHECK(stat_of("device.0.allocs") == stat_of("device.0.pool_allocs") + stat_of("device.0.fallback_allocs"));
    CHECK(stat_of("device.0.allocs") == stat_of("device.0.frees"));
    CHECK(stat_of("device.0.in_use_bytes") == 0);
    printf("client_calls %llu driver_malloc %llu driver_free %llu syncs %llu per_1000 %.2f vm_per_1000 %.2f "
           "peak_waste %llu requested_peak %llu vmm %d\n",
           (unsigned long long)calls, (unsigned long long)mallocs, (unsigned long long)frees, (unsigned long long)syncs,
           1000.0 * (double)(mallocs + frees) / (double)calls, 1000.0 * (double)vm_calls() / (double)calls,
           (unsigned long long)stat_of("device.0.peak_waste_bytes"),
           (unsigned long long)stat_of("device.0.peak_in_use_bytes"), (int)vmm());
    return failures;
}

/* Snapshots taken while two threads allocate and free add up:
 * allocs = pool_allocs + fallback_allocs, peaks at or above their values. */
static volatile int sums_stop;
static void *sums_worker(void *arg)
{
    (void)arg;
    void *p[8] = {0};
    for (unsigned i = 0; !sums_stop; i++) {
        unsigned k = i % 8;
        if (p[k])
            cudaFree(p[k]);
        p[k] = NULL;
        cudaMalloc(&p[k], (size_t)4096 << (i % 10));
    }
    for (int k = 0; k < 8; k++)
        if (p[k])
            cudaFree(p[k]);
    return NULL;
}

static long json_num(const char *from, const char *key)
{
    const char *q = strstr(from, key);
    return q ? atol(q + strlen(key)) : -1;
}

static int live_sums(void)
{
    size_t (*json)(char *, size_t) = (size_t(*)(char *, size_t))dlsym(RTLD_DEFAULT, "forgealloc_stats_json");
    CHECK(json != NULL);
    if (!json)
        return failures;
    void *first = NULL;
    CHECK(cudaMalloc(&first, 4096) == cudaSuccess);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, sums_worker, NULL);
    static char doc[1 << 18];
    int bad = 0, n;
    for (n = 0; n < 3000; n++) {
        json(doc, sizeof doc);
        const char *d = strstr(doc, "\"devices\":[");
        CHECK(d != NULL);
        if (!d)
            break;
        long a = json_num(d, "\"allocs\":"), pa = json_num(d, "\"pool_allocs\":"),
             fb = json_num(d, "\"fallback_allocs\":"), in_use = json_num(d, "\"in_use_bytes\":"),
             peak = json_num(d, "\"peak_in_use_bytes\":"), waste = json_num(d, "\"waste_bytes\":"),
             peak_waste = json_num(d, "\"peak_waste_bytes\":");
        bad += a != pa + fb || peak < in_use || peak_waste < waste;
    }
    sums_stop = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    cudaFree(first);
    printf("snapshots %d inconsistent %d\n", n, bad);
    CHECK(bad == 0);
    return failures;
}

/* ---- the reuse hazard ------------------------------------------------------------ */

static int hazard(void)
{
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    /* 1. A write queued before cudaFree must not land in the next owner. */
    unsigned char *a = dmalloc(4 * MiB);
    CHECK(fakecuda_enqueue_fill(s, a, 0xAA, 4 * MiB) == cudaSuccess);
    CHECK(cudaFree(a) == cudaSuccess);
    CHECK(fakecuda_pending(0) == 1); /* the pooled free did not synchronise */
    unsigned char *b = dmalloc(4 * MiB);
    memset(b, 0x55, 4 * MiB); /* the new owner writes its data */
    CHECK(cudaStreamSynchronize(s) == cudaSuccess); /* the queued write lands now */
    size_t bad = 0;
    for (size_t i = 0; i < 4 * MiB; i++)
        bad += b[i] != 0x55;
    CHECK(bad == 0);
    CHECK(b != a); /* quarantined: not handed out before a sync */
    CHECK(cudaFree(b) == cudaSuccess);

    /* 2. When only the quarantined block can serve, the shim syncs once
     * first: the queued write lands before the block changes hands. */
    uint64_t syncs = stat_of("device.0.device_syncs");
    CHECK(cudaDeviceSynchronize() == cudaSuccess); /* the application's sync frees the quarantine too */
    CHECK(stat_of("device.0.quarantine_bytes") == 0);
    unsigned char *c = dmalloc(64 * MiB); /* the whole pool */
    CHECK(fakecuda_enqueue_fill(s, c, 0xAA, 64 * MiB) == cudaSuccess);
    CHECK(cudaFree(c) == cudaSuccess);
    unsigned char *d = dmalloc(64 * MiB);
    CHECK(d == c);                                   /* reused, after a sync */
    CHECK(fakecuda_pending(0) == 0);                 /* the write landed before d was handed out */
    CHECK(stat_of("device.0.device_syncs") == syncs + 1);
    memset(d, 0x55, 64 * MiB);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    bad = 0;
    for (size_t i = 0; i < 64 * MiB; i += 512)
        bad += d[i] != 0x55;
    CHECK(bad == 0);
    CHECK(cudaFree(d) == cudaSuccess);
    CHECK(stat_of("device.0.fallback_allocs") == 0);
    cudaStreamDestroy(s);
    return failures;
}

/* A program that frees without ever synchronising: the pool synchronises
 * once the quarantine holds 1024 blocks (device.c: QUARANTINE_MAX_BLOCKS),
 * not before, and the work queued on the freed blocks has landed then.
 * Run with room for every block (FAKECUDA_MEM=1G, a 256 MiB pool). */
static int qcap(void)
{
    enum { CAP = 1024, N = 4 * KiB };
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    for (int round = 1; round <= 2; round++) {
        for (int i = 0; i < CAP; i++) {
            unsigned char *b = dmalloc(N);
            CHECK(fakecuda_enqueue_fill(s, b, 0xAA, N) == cudaSuccess);
            CHECK(cudaFree(b) == cudaSuccess);
            if (i == CAP - 2) {
                CHECK(stat_of("device.0.device_syncs") == (uint64_t)round - 1);
                CHECK(fakecuda_pending(0) == CAP - 1);
                CHECK(stat_of("device.0.quarantine_bytes") == (CAP - 1) * N);
            }
        }
        CHECK(stat_of("device.0.device_syncs") == (uint64_t)round);
        CHECK(fakecuda_pending(0) == 0);
        CHECK(stat_of("device.0.quarantine_bytes") == 0);
        CHECK(cudaGetLastError() == cudaSuccess);
    }
    CHECK(stat_of("device.0.fallback_allocs") == 0);
    cudaStreamDestroy(s);
    return failures;
}

/* A thread on a device the pool does not serve (the 17th) frees device
 * 0's blocks past the quarantine's bound: the pool synchronises device 0
 * and the thread is back on its own device after it. */
static int qcap_highdev(void)
{
    enum { CAP = 1024 };
    void *b[CAP];
    for (int i = 0; i < CAP; i++)
        b[i] = dmalloc(4 * KiB);
    CHECK(cudaSetDevice(16) == cudaSuccess);
    for (int i = 0; i < CAP; i++)
        CHECK(cudaFree(b[i]) == cudaSuccess);
    CHECK(stat_of("device.0.device_syncs") == 1);
    int dev = -1;
    CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 16);
    return failures;
}

/* Many threads freeing past the bound while a synchronisation takes long
 * (FAKECUDA_SYNC_DELAY_MS, as a GPU with work queued): one of them syncs
 * for the bound, the others go on freeing, so the pool makes about one
 * sync per QUARANTINE_MAX_BLOCKS frees, not one per thread that freed
 * meanwhile.  Every block's last queued write lands before the block
 * changes hands: each thread marks its block, checks the mark as it frees
 * it and queues a write on it first.  Run with FAKECUDA_MEM=1G and a
 * 256 MiB pool. */
enum { QH_THREADS = 8, QH_FREES = 8192, QH_BLOCK = 4 * KiB };

static void *qcap_herd_thread(void *arg)
{
    unsigned long *stale = arg;
    static const unsigned char mark[QH_BLOCK] = {[0 ... QH_BLOCK - 1] = 0x55};
    unsigned char *a = dmalloc(QH_BLOCK);
    if (!a)
        return NULL;
    memset(a, 0x55, QH_BLOCK);
    for (int i = 0; i < QH_FREES; i++) {
        unsigned char *b = dmalloc(QH_BLOCK);
        if (!b)
            return NULL;
        memset(b, 0x55, QH_BLOCK);
        *stale += memcmp(a, mark, QH_BLOCK) != 0; /* an earlier owner's write landed on it */
        CHECK(fakecuda_enqueue_fill(NULL, a, 0xAA, QH_BLOCK) == cudaSuccess);
        CHECK(cudaFree(a) == cudaSuccess);
        a = b;
    }
    CHECK(cudaFree(a) == cudaSuccess);
    return NULL;
}

static int qcap_herd(void)
{
    pthread_t t[QH_THREADS];
    unsigned long stale[QH_THREADS] = {0};
    for (int i = 0; i < QH_THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, qcap_herd_thread, &stale[i]) == 0);
    for (int i = 0; i < QH_THREADS; i++)
        pthread_join(t[i], NULL);
    uint64_t frees = stat_of("device.0.frees"), syncs = stat_of("device.0.device_syncs");
    printf("qcap_herd: %d threads, %llu frees, %llu device syncs (%llu for one per 1024 frees)\n", QH_THREADS,
           (unsigned long long)frees, (unsigned long long)syncs, (unsigned long long)(frees / 1024));
    CHECK(frees == (uint64_t)QH_THREADS * (QH_FREES + 1));
    CHECK(syncs >= 1);
    CHECK(syncs <= frees / 1024 + QH_THREADS);
    unsigned long bad = 0;
    for (int i = 0; i < QH_THREADS; i++)
        bad += stale[i];
    CHECK(bad == 0);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(fakecuda_faults(0) == 0);
    CHECK(stat_of("device.0.quarantine_bytes") == 0);
    CHECK(stat_of("device.0.fallback_allocs") == 0);
    CHECK(cudaGetLastError() == cudaSuccess);
    return failures;
}

/* Eight threads make their first cudaMalloc at once while the stand-in's
 * reservation calls are slow (FAKECUDA_DELAY_MS): the threads that find
 * the pool being reserved wait for it, none goes to the driver. */
enum { FR_THREADS = 8 };
static pthread_barrier_t fr_start;

static void *first_race_thread(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&fr_start);
    void *p = dmalloc(MiB);
    CHECK(p != NULL);
    CHECK(cudaFree(p) == cudaSuccess);
    return NULL;
}

static int first_race(void)
{
    pthread_t t[FR_THREADS];
    pthread_barrier_init(&fr_start, NULL, FR_THREADS);
    for (int i = 0; i < FR_THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, first_race_thread, NULL) == 0);
    for (int i = 0; i < FR_THREADS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&fr_start);
    printf("first_race: %llu pool allocations, %llu driver allocations\n",
           (unsigned long long)stat_of("device.0.pool_allocs"), (unsigned long long)stat_of("device.0.fallback_allocs"));
    CHECK(stat_of("device.0.pool_allocs") == FR_THREADS);
    CHECK(stat_of("device.0.fallback_allocs") == 0);
    CHECK(cudaGetLastError() == cudaSuccess);
    return failures;
}

/* The bound's synchronisation fails (a sticky error): the pool tries again
 * after another QUARANTINE_MAX_BLOCKS frees, not on every free, and reuses
 * nothing meanwhile; once a sync succeeds the bound is 1024 again. */
static int qcap_fail(void)
{
    enum { CAP = 1024, N = 4 * KiB, FREES = 4 * CAP };
    fakecuda_set_sync_error(cudaErrorUnknown);
    for (int i = 0; i < FREES; i++) {
        unsigned char *b = dmalloc(N);
        CHECK(b != NULL);
        CHECK(fakecuda_enqueue_fill(NULL, b, 0xAA, N) == cudaSuccess);
        CHECK(cudaFree(b) == cudaSuccess);
        CHECK(cudaGetLastError() == cudaSuccess); /* the failed sync leaves no error behind */
    }
    uint64_t tries = stat_of("device.0.device_syncs");
    printf("qcap_fail: %d frees, %llu failed device syncs\n", FREES, (unsigned long long)tries);
    CHECK(tries >= 1 && tries <= FREES / CAP);
    CHECK(fakecuda_pending(0) == FREES);                       /* nothing landed */
    CHECK(stat_of("device.0.quarantine_bytes") == FREES * N); /* so nothing left the quarantine */
    fakecuda_set_sync_error(0);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(fakecuda_pending(0) == 0);
    CHECK(stat_of("device.0.quarantine_bytes") == 0);
    for (int i = 0; i < CAP; i++) {
        unsigned char *b = dmalloc(N);
        CHECK(fakecuda_enqueue_fill(NULL, b, 0xAA, N) == cudaSuccess);
        CHECK(cudaFree(b) == cudaSuccess);
    }
    CHECK(stat_of("device.0.device_syncs") == tries + 1); /* the 1024th free synchronised */
    CHECK(fakecuda_pending(0) == 0);
    CHECK(stat_of("device.0.quarantine_bytes") == 0);
    CHECK(fakecuda_faults(0) == 0);
    CHECK(stat_of("device.0.fallback_allocs") == 0);
    return failures;
}

/* ---- out of memory ------------------------------------------------------------------ */

/* Run with FAKECUDA_MEM=1G and a 512 MiB pool of 2 MiB pieces: the pool
 * creates what it uses, and gives idle pieces back when the driver runs
 * short, after a sync when freed blocks hold them. */
static int oom_vmm(void)
{
    void *small = dmalloc(MiB);
    void *q = dmalloc(60 * MiB);
    CHECK(stat_of("device.0.pool_bytes") == 62 * MiB);
    CHECK(cudaFree(q) == cudaSuccess); /* quarantined: its pieces stay until a sync */
    void *big = dmalloc(950 * MiB);    /* a piece of its own, from what the driver has left */
    CHECK(big != NULL && stat_of("device.0.pool_allocs") == 3);
    CHECK(stat_of("device.0.device_syncs") == 0);
    CHECK(cudaGetLastError() == cudaSuccess);
    /* Beyond what the driver has free and the pool could give back (12 MiB
     * free, q's 60 MiB): exactly the driver's error, and the driver's last
     * error, with no sync and nothing given back, which could not help. */
    void *p = NULL;
    CHECK(cudaMalloc(&p, 100 * MiB) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(stat_of("device.0.failed_allocs") == 1);
    CHECK(stat_of("device.0.device_syncs") == 0);
    CHECK(stat_of("device.0.pieces_released") == 0);
    CHECK(stat_of("device.0.pool_bytes") == 1012 * MiB);
    CHECK(fakecuda_pieces(0) == 1012 * MiB);
    /* What is left serves. */
    void *s2 = dmalloc(8 * MiB);
    CHECK(s2 != NULL && stat_of("device.0.pool_allocs") == 4);
    CHECK(cudaFree(big) == cudaSuccess && cudaFree(small) == cudaSuccess && cudaFree(s2) == cudaSuccess);
    void *again1 = dmalloc(60 * MiB), *again2 = dmalloc(60 * MiB);
    CHECK(again1 && again2 && stat_of("device.0.pool_allocs") == 6 && stat_of("device.0.fallback_allocs") == 0);
    CHECK(cudaFree(again1) == cudaSuccess && cudaFree(again2) == cudaSuccess);
    return failures;
}

static int oom(void)
{
    if (vmm_expected())
        return oom_vmm();
    /* Run with FAKECUDA_MEM=1G and a 512 MiB pool of 64 MiB chunks. */
    void *small = dmalloc(MiB); /* reserves the pool: 512 MiB of 1 GiB; lands in the first chunk */
    CHECK(stat_of("device.0.pool_bytes") == 512 * MiB);
    void *q = dmalloc(60 * MiB); /* needs a whole chunk: the second */
    CHECK(cudaFree(q) == cudaSuccess); /* quarantined: it pins that chunk until a sync */
    /* A request the driver can serve only once every idle chunk is back,
     * the quarantined one included: the driver alone would have served it,
     * so must we. */
    void *big = dmalloc(950 * MiB);
    CHECK(big != NULL);
    CHECK(cudaGetLastError() == cudaSuccess); /* no error left from the retries */
    CHECK(stat_of("device.0.chunks_returned") == 7);
    CHECK(stat_of("device.0.device_syncs") == 1);
    CHECK(stat_of("device.0.pool_bytes") == 64 * MiB);
    /* Beyond the device: exactly the driver's error, and the driver's last error. */
    void *p = NULL;
    CHECK(cudaMalloc(&p, 100 * MiB) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(stat_of("device.0.failed_allocs") == 1);
    /* What is left in the pool still serves small requests. */
    void *s2 = dmalloc(8 * MiB);
    CHECK(s2 != NULL && stat_of("device.0.pool_allocs") == 3);
    CHECK(cudaFree(big) == cudaSuccess);
    CHECK(cudaFree(small) == cudaSuccess);
    CHECK(cudaFree(s2) == cudaSuccess);
    /* The pool grows back when the driver has room again, before it waits
     * for the freed blocks in the chunk it kept. */
    uint64_t syncs = stat_of("device.0.device_syncs");
    void *again1 = dmalloc(60 * MiB); /* a chunk reserved anew */
    void *again2 = dmalloc(60 * MiB); /* and another */
    CHECK(stat_of("device.0.pool_bytes") == 192 * MiB && stat_of("device.0.pool_allocs") == 5);
    CHECK(stat_of("device.0.device_syncs") == syncs);
    CHECK(cudaFree(again1) == cudaSuccess && cudaFree(again2) == cudaSuccess);
    return failures;
}

/* ---- honest free memory --------------------------------------------------------------- */

static int meminfo(void)
{
    size_t f0, t0, f, t;
    CHECK(cudaMemGetInfo(&f0, &t0) == cudaSuccess);
    void *p = dmalloc(2 * MiB); /* reserves the pool */
    CHECK(stat_of("device.0.pool_bytes") > 0);
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess);
    CHECK(t == t0);
    /* What the driver alone would report; with chunks, the whole chunk
     * that holds the block is missing: its free space serves no request
     * larger than itself. */
    CHECK(f == f0 - (vmm() ? 2 * MiB : 64 * MiB));
    CHECK(f <= t);
    CHECK(cudaFree(p) == cudaSuccess);
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess);
    CHECK(f == f0); /* an idle pool is invisible */
    return failures;
}

/* ---- two devices, reset, threads ---------------------------------------------------------- */

static int twodev(void)
{
    CHECK(cudaSetDevice(0) == cudaSuccess);
    void *a0 = dmalloc(MiB);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    void *a1 = dmalloc(MiB);
    CHECK(fakecuda_device_of(a0) == -1 || fakecuda_device_of(a0) == 0); /* inside device 0's pool chunk */
    CHECK(stat_of("device.devices") == 2);
    CHECK(stat_of("device.0.device") == 0 && stat_of("device.1.device") == 1);
    CHECK(stat_of("device.0.pool_bytes") > 0 && stat_of("device.1.pool_bytes") > 0);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaFree(a1) == cudaSuccess); /* freed while device 0 is current */
    CHECK(stat_of("device.1.frees") == 1 && stat_of("device.0.frees") == 0);
    CHECK(cudaFree(a0) == cudaSuccess);
    CHECK(stat_of("device.0.frees") == 1);
    return failures;
}

/* A capture on device 1 goes on through device 0's reset: device 1's pool
 * still never synchronises during it (which would invalidate it).  Run
 * with two devices of 128 MiB and 64 MiB pools. */
static int capture_twodev(void)
{
    CHECK(cudaSetDevice(0) == cudaSuccess);
    void *z = dmalloc(MiB);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    void *u = dmalloc(60 * MiB), *w = dmalloc(60 * MiB); /* device 1 is nearly full */
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    int mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(cudaFree(u) == cudaSuccess); /* its memory waits for a sync the capture forbids */
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaDeviceReset() == cudaSuccess);
    (void)z;
    CHECK(cudaSetDevice(1) == cudaSuccess);
    uint64_t syncs = stat_of("device.1.device_syncs");
    void *p = NULL;
    CHECK(cudaMalloc(&p, 60 * MiB) == cudaErrorMemoryAllocation); /* no sync: the driver's answer */
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(stat_of("device.1.device_syncs") == syncs);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess); /* not invalidated */
    CHECK(cudaFree(w) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    return failures;
}

/* cudaDeviceReset while streams of both devices capture: the captures on
 * the reset device's streams end with the streams, and no call of the
 * shim names those streams afterwards (a destroyed handle: undefined
 * behaviour in CUDA, and it may name a new stream by then).  A stream
 * belongs to the device it was created on, whichever device is current
 * when its capture begins.  Device 1's capture goes on: its pool never
 * synchronises during it, and once it ends the pools synchronise again
 * (no capture of the reset device is left counted).  Run with two devices
 * of 128 MiB and 64 MiB pools. */
static int capture_reset(void)
{
    CHECK(cudaSetDevice(1) == cudaSuccess);
    cudaStream_t s1;
    CHECK(cudaStreamCreateWithFlags(&s1, 1) == cudaSuccess);
    void *u = dmalloc(60 * MiB), *w = dmalloc(60 * MiB); /* device 1 is nearly full */
    CHECK(cudaSetDevice(0) == cudaSuccess);
    cudaStream_t s0, t0;
    CHECK(cudaStreamCreateWithFlags(&s0, 1) == cudaSuccess && cudaStreamCreateWithFlags(&t0, 1) == cudaSuccess);
    void *a = dmalloc(MiB);
    CHECK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeRelaxed) == cudaSuccess); /* device 0 current */
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(t0, cudaStreamCaptureModeRelaxed) == cudaSuccess); /* device 1 current */
    CHECK(cudaFree(u) == cudaSuccess); /* its memory waits for a sync the capture forbids */
    CHECK(cudaSetDevice(0) == cudaSuccess);
    unsigned long stale = fakecuda_stale_stream_uses();
    CHECK(cudaDeviceReset() == cudaSuccess);
    CHECK(fakecuda_stale_stream_uses() == stale);
    CHECK(cudaGetLastError() == cudaSuccess);
    (void)a; /* gone with the reset */
    CHECK(cudaSetDevice(1) == cudaSuccess);
    uint64_t syncs = stat_of("device.1.device_syncs"), fallback = stat_of("device.1.fallback_allocs");
    void *p = NULL;
    CHECK(cudaMalloc(&p, 60 * MiB) == cudaErrorMemoryAllocation); /* no sync: the driver's answer */
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(stat_of("device.1.device_syncs") == syncs);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s1, &g) == cudaSuccess); /* not invalidated */
    p = dmalloc(60 * MiB); /* u's memory, after a sync */
    CHECK(p != NULL && stat_of("device.1.device_syncs") > syncs && stat_of("device.1.fallback_allocs") == fallback);
    CHECK(cudaFree(p) == cudaSuccess && cudaFree(w) == cudaSuccess);
    CHECK(cudaStreamDestroy(s1) == cudaSuccess);
    CHECK(fakecuda_stale_stream_uses() == stale);
    return failures;
}

/* Two devices whose queues drain separately: a block of device 0 that
 * device 1's queued work still writes (peer access, or a copy queued on
 * device 1's stream that then freed it with cudaFreeAsync) leaves the
 * quarantine only once device 1 caught up too, whatever device 0 did:
 * the next block of device 0 keeps what is written to it.  The copy part
 * runs on the chunk pool only: device 1 cannot reach device 0's mapped
 * pieces without peer access (the stand-in counts it a fault). */
static bool reused_intact(int how)
{
    CHECK(cudaSetDevice(0) == cudaSuccess);
    unsigned char *a = dmalloc(2 * MiB);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    cudaStream_t s1;
    CHECK(cudaStreamCreateWithFlags(&s1, 1 /* non-blocking */) == cudaSuccess);
    static unsigned char host[2 * MiB];
    memset(host, 0x11, sizeof host);
    if (how == 0) {
        CHECK(fakecuda_enqueue_fill(s1, a, 0x11, 2 * MiB) == cudaSuccess); /* a kernel of device 1 writing a */
        CHECK(cudaSetDevice(0) == cudaSuccess);
        CHECK(cudaFree(a) == cudaSuccess);
    } else {
        CHECK(cudaMemcpyAsync(a, host, 2 * MiB, cudaMemcpyHostToDevice, s1) == cudaSuccess);
        CHECK(cudaFreeAsync(a, s1) == cudaSuccess); /* ordered after the copy on s1 */
        CHECK(cudaSetDevice(0) == cudaSuccess);
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess); /* device 0 only */
    unsigned char *b = dmalloc(2 * MiB);
    if (b)
        memset(b, 0x22, 2 * MiB);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess); /* device 1's work lands */
    bool intact = b && b[0] == 0x22 && b[2 * MiB - 1] == 0x22;
    printf("%s reused %d intact %d\n", how == 0 ? "peer_write" : "async_free", (int)(b == a), (int)intact);
    CHECK(cudaStreamDestroy(s1) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(b && cudaFree(b) == cudaSuccess);
    CHECK(fakecuda_faults(1) == 0);
    return intact;
}

static int twodev_quarantine(void)
{
    if (!vmm_expected())
        CHECK(reused_intact(1));
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaDeviceEnablePeerAccess(0, 0) == cudaSuccess); /* device 1 may reach device 0's memory */
    CHECK(reused_intact(0));
    return failures;
}

/* cudaDeviceReset of device 0 while another thread captures on device 1:
 * the pool cannot synchronise first (the capture forbids it), and its
 * pieces must stay mapped until the reset has let the queued work land:
 * no fault, and the capture ends valid.  Run with two devices. */
static int reset_capture(void)
{
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&cc_stream, 1 /* non-blocking */) == cudaSuccess);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    unsigned char *a = dmalloc(4 * MiB);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1) == cudaSuccess);
    CHECK(fakecuda_enqueue_fill(s, a, 0x33, 4 * MiB) == cudaSuccess);
    cc_hook(); /* another thread begins a global capture on device 1's stream */
    CHECK(cudaDeviceReset() == cudaSuccess);
    printf("faults %lu\n", fakecuda_faults(0));
    CHECK(fakecuda_faults(0) == 0);
    CHECK(cudaGetLastError() == cudaSuccess);
    cc_check("reset");
    void *b = dmalloc(MiB); /* a new pool */
    CHECK(b != NULL && cudaFree(b) == cudaSuccess);
    return failures;
}

static int reset(void)
{
    void *a = dmalloc(MiB);
    CHECK(stat_of("device.0.pool_bytes") > 0);
    /* Work queued before the reset completes, as the driver waits for it:
     * the pool's memory stays mapped until then. */
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    static unsigned char host[4096];
    CHECK(fakecuda_enqueue_fill(s, a, 0x5A, MiB) == cudaSuccess);
    CHECK(cudaMemcpyAsync(host, (unsigned char *)a + MiB - sizeof host, sizeof host, cudaMemcpyDeviceToHost, s) ==
          cudaSuccess);
    CHECK(cudaDeviceReset() == cudaSuccess);
    CHECK(fakecuda_faults(0) == 0);
    CHECK(host[0] == 0x5A && host[sizeof host - 1] == 0x5A);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(stat_of("device.0.pool_bytes") == 0);
    CHECK(fakecuda_used(0) == 0);
    CHECK(cudaFree(a) == cudaErrorInvalidValue); /* gone with the reset: the driver's answer */
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    void *b = dmalloc(MiB); /* a new pool */
    CHECK(b != NULL && stat_of("device.0.pool_bytes") > 0);
    CHECK(cudaFree(b) == cudaSuccess);
    return failures;
}

/* ---- a reset while the pool is being reserved ---------------------------------------------------- */

static void *first_malloc(void *arg)
{
    void *p;
    (void)arg;
    cudaMalloc(&p, MiB);
    return NULL;
}

/* Run with FAKECUDA_DELAY_MS: another thread's first cudaMalloc reserves
 * the pool with slow driver calls (chunks, or the address space of the
 * pieces); this thread resets the device once the first of them took
 * effect, and allocates at once.  The pool then holds exactly what the
 * driver has allocated for it, and serves from memory the reset left. */
static int reset_race(void)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, first_malloc, NULL) == 0);
    while (fakecuda_calls("cudaMalloc") + fakecuda_calls("cuMemAddressReserve") == 0) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    printf("pool_bytes_at_reset %llu\n", (unsigned long long)stat_of("device.0.pool_bytes"));
    CHECK(cudaDeviceReset() == cudaSuccess);
    unsigned char *b = dmalloc(MiB);
    pthread_join(t, NULL);
    /* The other thread's block came from the pool the reset tore down, or
     * from the driver (then it may outlive the reset), or not at all (the
     * old pool filled the driver until its reset): it is left alone. */
    uint64_t pool = stat_of("device.0.pool_bytes");
    size_t used = fakecuda_used(0);
    bool from_driver = stat_of("device.0.fallback_allocs") == 1;
    printf("pool_bytes %llu driver_used %zu other_from_driver %d\n", (unsigned long long)pool, used, (int)from_driver);
    CHECK(pool > 0 && (used == pool || (from_driver && used == pool + MiB)));
    if (!vmm())
        CHECK(fakecuda_device_of(b) == 0); /* inside a live chunk */
    if (b) {
        tag(b, MiB, 0x5A);
        void *c = dmalloc(MiB);
        CHECK(c != NULL && c != b);
        if (c)
            memset(c, 0xA5, MiB);
        CHECK(tagged(b, MiB, 0x5A));
        CHECK(c == NULL || cudaFree(c) == cudaSuccess);
        CHECK(cudaFree(b) == cudaSuccess);
    }
    /* A reset with nothing in flight leaves nothing, and the next pool is
     * whole again. */
    CHECK(cudaDeviceReset() == cudaSuccess);
    CHECK(stat_of("device.0.pool_bytes") == 0 && fakecuda_used(0) == 0);
    /* The pieces' address space: one reservation per pool, each freed by the reset that tore its pool down. */
    CHECK(fakecuda_calls("cuMemAddressReserve") == fakecuda_calls("cuMemAddressFree"));
    void *d = dmalloc(MiB);
    CHECK(d != NULL && stat_of("device.0.pool_bytes") > 0 && stat_of("device.0.pool_bytes") == fakecuda_used(0));
    CHECK(cudaFree(d) == cudaSuccess);
    return failures;
}

/* ---- errors and IPC --------------------------------------------------------------------------- */

static int errors(void)
{
    CHECK(cudaFree(NULL) == cudaSuccess);
    int x;
    CHECK(cudaFree(&x) == cudaErrorInvalidValue); /* unknown: the driver's answer, and its last error */
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    unsigned char *a = dmalloc(3 * MiB);
    unsigned char *b = dmalloc(MiB);
    memset(b, 7, MiB);
    CHECK(cudaFree(a + 512) == cudaErrorInvalidValue); /* interior pointer */
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);  /* left as the driver's refusal leaves it */
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaFree(a) == cudaSuccess);
    CHECK(cudaFree(a) == cudaErrorInvalidValue); /* double free: refused, the chunk survives */
    CHECK(fakecuda_used(0) >= stat_of("device.0.pool_bytes"));
    CHECK(b[0] == 7 && b[MiB - 1] == 7);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
    void *z = (void *)1;
    CHECK(cudaMalloc(&z, 0) == cudaSuccess && z == NULL); /* size 0: the driver's answer */
    CHECK(cudaMalloc(NULL, 100) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    /* IPC: pooled memory refuses with one line; driver memory works. */
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, b) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    void *large = dmalloc(100 * MiB); /* larger than a chunk: the driver's; a piece of the pool's otherwise */
    CHECK(cudaIpcGetMemHandle(&h, large) == (vmm() ? cudaErrorInvalidValue : cudaSuccess));
    CHECK(cudaFree(large) == cudaSuccess);
    CHECK(cudaFree(b) == cudaSuccess);
    return failures;
}

/* The pool refuses cudaIpcGetMemHandle of its blocks, leaving
 * cudaErrorInvalidValue as the last error as the runtime's refusal would:
 * during this thread's global-mode capture that must not invalidate the
 * capture (the call raising the error runs in relaxed mode). */
static int refuse_capture(void)
{
    void *b = dmalloc(MiB);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, b) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    int st = -1;
    CHECK(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
    CHECK(cudaFree(b) == cudaSuccess && cudaStreamDestroy(s) == cudaSuccess);
    return failures;
}

/* ---- sticky errors ------------------------------------------------------------------------------- */

/* After a kernel's illegal address the runtime's cudaMalloc and cudaFree
 * return cudaErrorIllegalAddress (sticky: every call that needs the
 * context does); the pool's answers are the same: at once once the
 * program read the error, at a thread's first call, and within 64 calls
 * otherwise.  Both set it as the thread's last error (an H200 with CUDA
 * 13.0: cudaGetLastError clears it, every call that returns it sets it
 * again); a block whose cudaFree failed stays allocated. */
static void *sticky_thread(void *arg)
{
    void *p = NULL;
    *(cudaError_t *)arg = cudaMalloc(&p, MiB);
    return NULL;
}

static int sticky(void)
{
    void *a = dmalloc(MiB), *b = dmalloc(MiB), *p = NULL;
    CHECK(cudaFree(b) == cudaSuccess);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
    CHECK(fakecuda_enqueue_fault(s) == cudaSuccess);
    /* A call the shim does not see meets it; the program does not read
     * the last error: the pool finds out within 64 of this thread's calls. */
    CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
    int served = 0;
    cudaError_t r = cudaSuccess;
    while (served < 64 && (r = cudaMalloc(&p, MiB)) == cudaSuccess)
        served++;
    printf("served_after_fault %d then %d\n", served, (int)r);
    CHECK(r == cudaErrorIllegalAddress);
    cudaError_t other = cudaSuccess;
    pthread_t t; /* another thread: at its first call */
    CHECK(pthread_create(&t, NULL, sticky_thread, &other) == 0);
    pthread_join(t, NULL);
    CHECK(other == cudaErrorIllegalAddress);
    CHECK(cudaPeekAtLastError() == cudaErrorIllegalAddress); /* the stream sync's */
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(cudaMalloc(&p, MiB) == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress); /* set again */
    uint64_t frees = stat_of("device.0.frees");
    CHECK(cudaFree(a) == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(stat_of("device.0.frees") == frees); /* not freed */
    return failures;
}

/* The program reads the error through cudaGetLastError right after the
 * fault (as PyTorch does after each launch): the pool's next answer is
 * the error already. */
static int sticky_read(void)
{
    void *a = dmalloc(MiB), *p = NULL;
    CHECK(cudaFree(a) == cudaSuccess);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
    CHECK(fakecuda_enqueue_fault(s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(cudaMalloc(&p, MiB) == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
    CHECK(cudaGetLastError() == cudaSuccess);
    return failures;
}

/* ---- stream capture ------------------------------------------------------------------------------ */

static int capture(void)
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
    void *a = dmalloc(32 * MiB);
    void *b = dmalloc(32 * MiB); /* the 64 MiB pool is full */
    CHECK(cudaFree(a) == cudaSuccess); /* quarantined */
    /* A capture begins with the sync the driver's cudaFree of `a` would
     * have made: PyTorch's allocation during the capture (relaxed mode)
     * reuses a's memory, where a sync then would invalidate the capture. */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(stat_of("device.0.device_syncs") == 1);
    int mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    void *c = NULL;
    CHECK(cudaMalloc(&c, 32 * MiB) == cudaSuccess);
    CHECK(stat_of("device.0.pool_allocs") == 3 && stat_of("device.0.fallback_allocs") == 0);
    /* The pool is full and neither syncs nor grows during a capture (what
     * it grew would wait in quarantine until the capture ends, where the
     * driver's block goes back at its cudaFree): the driver serves (and is
     * full after it). */
    uint64_t fallback = 1;
    void *x = NULL;
    CHECK(cudaMalloc(&x, 32 * MiB) == cudaSuccess);
    CHECK(stat_of("device.0.fallback_allocs") == fallback);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess); /* not invalidated */
    CHECK(stat_of("device.0.device_syncs") == 1);
    /* After the capture the pool syncs again when it must. */
    CHECK(cudaFree(c) == cudaSuccess);
    void *d = dmalloc(32 * MiB);
    CHECK(stat_of("device.0.device_syncs") == 2 && stat_of("device.0.pool_allocs") == 4);
    cudaStreamDestroy(s);
    /* A capture that ends with its stream destroyed, not with
     * cudaStreamEndCapture: the pool syncs again when it must. */
    cudaStream_t t;
    CHECK(cudaStreamCreateWithFlags(&t, 1) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(t, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(cudaFree(b) == cudaSuccess && cudaFree(d) == cudaSuccess); /* quarantined during the capture */
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(cudaStreamDestroy(t) == cudaSuccess);
    uint64_t syncs = stat_of("device.0.device_syncs");
    void *e = dmalloc(32 * MiB), *f = dmalloc(32 * MiB); /* the quarantined b and d, after a sync */
    CHECK(stat_of("device.0.device_syncs") > syncs && stat_of("device.0.fallback_allocs") == fallback);
    CHECK(cudaFree(e) == cudaSuccess && cudaFree(f) == cudaSuccess && cudaFree(x) == cudaSuccess);
    /* One that ends with cudaDeviceReset: the pool is built again after it. */
    CHECK(cudaStreamCreateWithFlags(&t, 1) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(t, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaDeviceReset() == cudaSuccess);
    void *k = dmalloc(MiB);
    CHECK(stat_of("device.0.pool_bytes") > 0 && stat_of("device.0.fallback_allocs") == fallback);
    CHECK(cudaFree(k) == cudaSuccess);
    return failures;
}

/* cudaFree of a pool block during a stream capture, where the runtime
 * refuses cudaFree of a cudaMalloc block (the modes that prohibit
 * potentially unsafe calls: this thread's capture unless begun in relaxed
 * mode; in global mode another thread's global capture too): refused with
 * its error, left as the last error, the capture invalidated as by the
 * runtime's refusal, and the block stays allocated, never handed out
 * again.  Where the runtime allows it (relaxed mode, a thread-local mode
 * thread during another thread's capture) the block is quarantined as
 * ever, and the pool does not synchronise during the capture.  Run with a
 * 64 MiB pool on a 96 MiB device. */
struct free_arg {
    int mode;
    void *p;
    cudaError_t rc, last;
};

static void *free_in_thread(void *arg)
{
    struct free_arg *f = arg;
    int mode = f->mode;
    cudaThreadExchangeStreamCaptureMode(&mode);
    f->rc = cudaFree(f->p);
    f->last = cudaGetLastError();
    return NULL;
}

static cudaError_t free_from_thread(int mode, void *p, cudaError_t *last)
{
    struct free_arg f = {mode, p, -1, -1};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, free_in_thread, &f) == 0);
    pthread_join(t, NULL);
    *last = f.last;
    return f.rc;
}

static int capture_status(cudaStream_t s)
{
    int st = -1;
    CHECK(cudaStreamIsCapturing(s, &st) == cudaSuccess);
    return st;
}

static int capture_free(void)
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
    unsigned char *a = dmalloc(MiB), *b = dmalloc(MiB);
    memset(a, 5, MiB);
    memset(b, 6, MiB);
    uint64_t frees = stat_of("device.0.frees"), in_use = stat_of("device.0.in_use_bytes");
    cudaGraph_t g = NULL;
    cudaError_t last = cudaSuccess;

    /* Refused: this thread's own capture, global and thread-local. */
    static const int refusing[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal};
    for (int i = 0; i < 2; i++) {
        CHECK(cudaStreamBeginCapture(s, refusing[i]) == cudaSuccess);
        CHECK(cudaFree(a) == cudaErrorStreamCaptureUnsupported);
        CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnsupported);
        CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated);
        CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
        CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
    }
    /* Another thread in global mode during a global capture: refused;
     * in thread-local mode: freed. */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(free_from_thread(cudaStreamCaptureModeThreadLocal, b, &last) == cudaSuccess && last == cudaSuccess);
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
    CHECK(free_from_thread(cudaStreamCaptureModeGlobal, a, &last) == cudaErrorStreamCaptureUnsupported &&
          last == cudaErrorStreamCaptureUnsupported);
    CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
    CHECK(stat_of("device.0.frees") == frees + 1 && stat_of("device.0.in_use_bytes") == in_use - MiB);

    /* Relaxed mode: freed into the quarantine; no sync meanwhile. */
    unsigned char *c = dmalloc(MiB);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess); /* after a sync for b */
    uint64_t syncs = stat_of("device.0.device_syncs");
    int mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(cudaFree(c) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
    CHECK(stat_of("device.0.device_syncs") == syncs && stat_of("device.0.frees") == frees + 2);

    /* a was never freed: after a sync, new blocks are elsewhere and its
     * contents are intact; it frees normally now. */
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    unsigned char *n[8];
    for (int i = 0; i < 8; i++) {
        n[i] = dmalloc(MiB);
        CHECK(n[i] != a);
        if (n[i])
            memset(n[i], 9, MiB);
    }
    CHECK(a[0] == 5 && a[MiB - 1] == 5);
    CHECK(cudaFree(a) == cudaSuccess);
    for (int i = 0; i < 8; i++)
        CHECK(cudaFree(n[i]) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(stat_of("device.0.in_use_bytes") == 0);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    return failures;
}

/* A relaxed-mode request during a stream capture that the driver alone
 * would serve is served: the pool gives back idle memory then, without a
 * synchronisation (the virtual-memory calls, and the chunk pool's
 * cudaFree in relaxed mode, neither are refused nor invalidate a capture),
 * and what cudaMemGetInfo calls free during a capture can be had: memory
 * that only a synchronisation would free is not counted then.  Run with
 * FAKECUDA_MEM=2G and a 1 GiB pool. */
static int capture_room(void)
{
    enum { N = 900 };
    static void *p[N];
    for (int i = 0; i < N; i++)
        p[i] = dmalloc(2 * MiB);
    for (int i = 0; i < N; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    size_t f = 0, t = 0;
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess && f == t); /* all of it, as without the pool */
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    int mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    void *big = NULL, *q = NULL;
    cudaError_t rc = cudaMalloc(&big, 1500 * MiB);
    printf("capture_malloc_1500M %d\n", (int)rc);
    CHECK(rc == cudaSuccess);
    CHECK(cudaMalloc(&q, 64 * MiB) == cudaSuccess && cudaFree(q) == cudaSuccess); /* quarantined */
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess);
    /* What it calls free, in 2 MiB blocks (the stand-in places a larger
     * block only where that much is contiguous). */
    size_t got = 0;
    int nb = 0;
    while (nb < N && cudaMalloc(&p[nb], 2 * MiB) == cudaSuccess)
        got += 2 * MiB, nb++;
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    printf("capture_free_bytes %zu allocated %zu\n", f, got);
    CHECK(got + 2 * MiB >= f);
    while (nb > 0)
        CHECK(cudaFree(p[--nb]) == cudaSuccess);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaFree(big) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    void *after = dmalloc(8 * MiB); /* the pool serves as before */
    CHECK(after != NULL && cudaFree(after) == cudaSuccess);
    CHECK(stat_of("device.0.in_use_bytes") == 0);
    return failures;
}

/* The pool's own driver calls (reserving, growing back, giving back)
 * while another thread begins a global-mode capture: held up on their way
 * into the runtime (the stand-in's entry hook), the capture begins, and
 * the call must neither be refused nor invalidate it, as the program's
 * calls, made before the capture began, would not.  Run with a 128 MiB
 * pool on a 256 MiB device. */
static int cc_hooked, cc_begun, cc_end; /* the hook ran; the capture began; its end is asked for */
static cudaError_t cc_begin_rc, cc_end_rc;

static void *cc_capturer(void *arg)
{
    (void)arg;
    cc_begin_rc = cudaStreamBeginCapture(cc_stream, cudaStreamCaptureModeGlobal);
    __atomic_store_n(&cc_begun, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&cc_end, __ATOMIC_ACQUIRE))
        sleep_s(0.001);
    cudaGraph_t g = NULL;
    cc_end_rc = cudaStreamEndCapture(cc_stream, &g);
    cudaGetLastError();
    return NULL;
}

static pthread_t cc_thread;

/* The entry hook: another thread begins a capture, given 200 ms to. */
static void cc_hook(void)
{
    __atomic_store_n(&cc_hooked, 1, __ATOMIC_RELEASE);
    CHECK(pthread_create(&cc_thread, NULL, cc_capturer, NULL) == 0);
    for (int i = 0; i < 200 && !__atomic_load_n(&cc_begun, __ATOMIC_ACQUIRE); i++)
        sleep_s(0.001);
}

/* After the call that ran the hook: the capture began and ends valid. */
static void cc_check(const char *what)
{
    bool ran = __atomic_load_n(&cc_hooked, __ATOMIC_ACQUIRE);
    CHECK(ran);
    if (!ran)
        return;
    __atomic_store_n(&cc_end, 1, __ATOMIC_RELEASE);
    pthread_join(cc_thread, NULL);
    printf("%s begin %d end %d\n", what, (int)cc_begin_rc, (int)cc_end_rc);
    CHECK(cc_begin_rc == cudaSuccess && cc_end_rc == cudaSuccess);
    cc_hooked = cc_begun = cc_end = 0;
}

static int capture_calls(void)
{
    bool pieces = vmm_expected();
    CHECK(cudaStreamCreateWithFlags(&cc_stream, 1 /* non-blocking */) == cudaSuccess);
    /* The first cudaMalloc reserves the pool. */
    fakecuda_set_entry_hook(pieces ? "cuMemAddressReserve" : "cudaMalloc", cc_hook);
    void *a = dmalloc(MiB);
    cc_check("reserve");
    CHECK(a != NULL && cudaFree(a) == cudaSuccess);
    void *fill[60];
    for (int i = 0; i < 60; i++)
        fill[i] = dmalloc(2 * MiB);
    for (int i = 0; i < 60; i++)
        CHECK(cudaFree(fill[i]) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    /* A request beyond what the driver has free: the pool gives its idle
     * memory back. */
    fakecuda_set_entry_hook(pieces ? "cuMemUnmap" : "cudaFree", cc_hook);
    void *x = dmalloc(200 * MiB);
    cc_check("give_back");
    CHECK(x != NULL && cudaFree(x) == cudaSuccess);
    /* The chunk pool grows back to its size; the piece pool creates. */
    fakecuda_set_entry_hook(pieces ? "cuMemCreate" : "cudaMalloc", cc_hook);
    void *b = dmalloc(MiB);
    cc_check("grow");
    CHECK(b != NULL && cudaFree(b) == cudaSuccess);
    CHECK(cudaStreamDestroy(cc_stream) == cudaSuccess);
    return failures;
}

/* ---- the driver API's allocations ------------------------------------------------------------------ */

/* 512 MiB of 2 MiB blocks allocated and freed, then a sync: the pool holds
 * that much idle (run with a 512 MiB pool on a 1 GiB device). */
static void fill_pool(void)
{
    static void *p[256];
    for (int i = 0; i < 256; i++)
        p[i] = dmalloc(2 * MiB);
    for (int i = 0; i < 256; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

/* Memory the pool holds idle, which cudaMemGetInfo counts free, serves
 * the driver API's allocations as it would without the pool: called by
 * name (libcuda.so.1), or through cuGetProcAddress,
 * cudaGetDriverEntryPoint[ByVersion]; each is the driver's answer after
 * the pool gave back. */
static int driver_api(void)
{
    fa_cu_ptr p = 0;
    fill_pool();
    CHECK(cuMemAlloc_v2(&p, 600 * MiB) == 0);
    CHECK(cuMemFree_v2(p) == 0);
    fill_pool();
    uint64_t creates = 0; /* where the device supports the virtual-memory calls */
    if (vmm_expected()) {
        fa_cu_alloc_prop prop = {.type = FA_CU_ALLOCATION_TYPE_PINNED, .location = {FA_CU_LOCATION_TYPE_DEVICE, 0}};
        fa_cu_handle h = 0;
        CHECK(cuMemCreate(&h, 600 * MiB, &prop, 0) == 0);
        CHECK(cuMemRelease(h) == 0);
        fill_pool();
        fa_cu_result (*create)(fa_cu_handle *, size_t, const fa_cu_alloc_prop *, unsigned long long) = NULL;
        CHECK(cudaGetDriverEntryPoint("cuMemCreate", (void **)&create, 0, NULL) == cudaSuccess && create);
        CHECK(create && create(&h, 600 * MiB, &prop, 0) == 0);
        CHECK(cuMemRelease(h) == 0);
        fill_pool();
        creates = 2;
    }
    fa_cu_result (*async)(fa_cu_ptr *, size_t, cudaStream_t) = NULL;
    fa_cu_proc_status st = 1;
    CHECK(cuGetProcAddress_v2("cuMemAllocAsync", (void **)&async, 12000, 0, &st) == 0 && async && st == 0);
    CHECK(async && async(&p, 600 * MiB, NULL) == 0);
    CHECK(cuMemFree_v2(p) == 0);
    fill_pool();
    fa_cu_result (*alloc)(fa_cu_ptr *, size_t) = NULL;
    CHECK(cudaGetDriverEntryPointByVersion("cuMemAlloc", (void **)&alloc, 12000, 0, NULL) == cudaSuccess && alloc);
    CHECK(alloc && alloc(&p, 600 * MiB) == 0);
    CHECK(cuMemFree_v2(p) == 0);
    /* Beyond the device: the driver's own error. */
    CHECK(cuMemAlloc_v2(&p, 2048 * MiB) == 2 /* CUDA_ERROR_OUT_OF_MEMORY */);
    CHECK(cudaGetLastError() == cudaSuccess); /* the driver API leaves the runtime's last error */
    printf("counted cuMemAlloc %llu cuMemCreate %llu cuMemAllocAsync %llu\n",
           (unsigned long long)stat_of("device.passthrough.cuMemAlloc"),
           (unsigned long long)stat_of("device.passthrough.cuMemCreate"),
           (unsigned long long)stat_of("device.passthrough.cuMemAllocAsync"));
    CHECK(stat_of("device.passthrough.cuMemAlloc") == 3 && stat_of("device.passthrough.cuMemCreate") == creates &&
          stat_of("device.passthrough.cuMemAllocAsync") == 1);
    void *a = dmalloc(MiB); /* the pool serves again */
    CHECK(a != NULL && cudaFree(a) == cudaSuccess);
    return failures;
}

/* ---- device memory the runtime serves itself ----------------------------------------------------- */

/* Memory the pool holds idle, which cudaMemGetInfo counts free, serves the
 * device allocations the runtime serves itself (cudaMallocAsync,
 * cudaMallocPitch) as it would without the pool: the pool gives it back,
 * after a sync when a freed block pins it, and no error is left behind.
 * Run with FAKECUDA_MEM=1G and a 512 MiB pool. */
static int room(void)
{
    /* Pieces: a 500 MiB block freed and waiting for a sync.  Chunks: the
     * whole 512 MiB pool, a freed 1 MiB block in its first chunk. */
    size_t held = vmm_expected() ? 500 * MiB : MiB;
    void *a = dmalloc(held);
    CHECK(cudaFree(a) == cudaSuccess);
    void *p = NULL;
    CHECK(cudaMallocAsync(&p, 700 * MiB, NULL) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaFreeAsync(p, NULL) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess);
    a = dmalloc(held);
    CHECK(cudaFree(a) == cudaSuccess);
    size_t pitch = 0;
    CHECK(cudaMallocPitch(&p, &pitch, 700 * MiB, 1) == cudaSuccess && pitch >= 700 * MiB);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);
    CHECK(stat_of("device.passthrough.cudaMallocAsync") == 1 && stat_of("device.passthrough.cudaMallocPitch") == 1);
    /* Beyond the device: the runtime's own error, left as the last error. */
    CHECK(cudaMallocAsync(&p, 2048 * MiB, NULL) == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess);
    /* The pool serves again afterwards. */
    a = dmalloc(MiB);
    CHECK(a != NULL && cudaFree(a) == cudaSuccess);
    return failures;
}

/* ---- the program's pending error survives the pool's own failed calls ----------------------------- */

/* A program that left an error pending (it did not call cudaGetLastError
 * yet) reads that same error after a call the pool served with the help
 * of internal calls that failed and were handled.  Without the pool the
 * call would have succeeded and left the error alone.  Run with
 * FAKECUDA_MEM=1G and a 512 MiB pool; "reserve" with FAKECUDA_MEM=256M.
 *  room:    cudaMallocAsync retried after the pool gave memory back;
 *  malloc:  a cudaMalloc beyond the chunk, retried likewise (chunks);
 *  reset:   cudaDeviceReset during a capture, with the pool's calls around it;
 *  reserve: the chunk pool's first reservation gets fewer chunks than it
 *           wants (the driver refused the rest). */
static int pending_error(const char *what)
{
    if (strcmp(what, "room") == 0) {
        void *a = dmalloc(vmm_expected() ? 500 * MiB : MiB), *p = NULL;
        CHECK(cudaFree(a) == cudaSuccess);
        CHECK(cudaMemset(NULL, 0, 1) == cudaErrorInvalidValue); /* pending now */
        CHECK(cudaMallocAsync(&p, 700 * MiB, NULL) == cudaSuccess);
        CHECK(cudaGetLastError() == cudaErrorInvalidValue);
        CHECK(cudaFreeAsync(p, NULL) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess);
    } else if (strcmp(what, "malloc") == 0) {
        void *a = dmalloc(MiB), *p = NULL;
        CHECK(cudaFree(a) == cudaSuccess);
        CHECK(cudaSetDevice(99) == cudaErrorInvalidDevice);
        CHECK(cudaMalloc(&p, 700 * MiB) == cudaSuccess);
        CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
        CHECK(cudaFree(p) == cudaSuccess);
    } else if (strcmp(what, "reset") == 0) {
        void *a = dmalloc(MiB), *p = NULL;
        CHECK(cudaMalloc(&p, (size_t)4 << 30) == cudaErrorMemoryAllocation);
        cudaStream_t s;
        CHECK(cudaStreamCreateWithFlags(&s, 1) == cudaSuccess);
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
        CHECK(cudaDeviceReset() == cudaSuccess);
        CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
        (void)a; /* gone with the reset */
    } else if (strcmp(what, "reserve") == 0) {
        void *p = NULL;
        CHECK(cudaMemset(NULL, 0, 1) == cudaErrorInvalidValue);
        CHECK(cudaMalloc(&p, MiB) == cudaSuccess); /* the first: the pool is reserved */
        CHECK(cudaGetLastError() == cudaErrorInvalidValue);
        CHECK(stat_of("device.0.pool_bytes") > 0);
        CHECK(cudaFree(p) == cudaSuccess);
    } else {
        fprintf(stderr, "d_pool: pending_error room|malloc|reset|reserve\n");
        return 1;
    }
    CHECK(cudaGetLastError() == cudaSuccess);
    return failures;
}

/* ---- calls that are only counted ------------------------------------------------------------------ */

static int passthrough(void)
{
    void *p;
    size_t pitch;
    CHECK(cudaMallocHost(&p, 4096) == cudaSuccess && cudaFreeHost(p) == cudaSuccess);
    CHECK(cudaHostAlloc(&p, 4096, 0) == cudaSuccess && cudaFreeHost(p) == cudaSuccess);
    CHECK(cudaMallocManaged(&p, 4096, 1) == cudaSuccess && cudaFree(p) == cudaSuccess);
    CHECK(cudaMallocPitch(&p, &pitch, 1000, 10) == cudaSuccess && pitch >= 1000 && cudaFree(p) == cudaSuccess);
    CHECK(cudaMallocAsync(&p, 4096, NULL) == cudaSuccess && cudaFreeAsync(p, NULL) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(stat_of("device.passthrough.cudaMallocHost") == 1);
    CHECK(stat_of("device.passthrough.cudaHostAlloc") == 1);
    CHECK(stat_of("device.passthrough.cudaFreeHost") == 2);
    CHECK(stat_of("device.passthrough.cudaMallocManaged") == 1);
    CHECK(stat_of("device.passthrough.cudaMallocPitch") == 1);
    CHECK(stat_of("device.passthrough.cudaMallocAsync") == 1);
    CHECK(stat_of("device.passthrough.cudaFreeAsync") == 1);
    return failures;
}

/* ---- cudaFreeAsync of cudaMalloc's memory ---------------------------------------------------------- */

/* CUDA takes cudaFreeAsync for memory from cudaMalloc too.  A pool block
 * is the pool's to free: handed to the driver it would free a whole chunk
 * under its neighbours (or be refused).  Work queued on the stream before
 * the free still lands in the block, never in its next owner's data. */
static int free_async(void)
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
    unsigned char *a = dmalloc(MiB);
    unsigned char *b = dmalloc(MiB);
    memset(b, 7, MiB);
    CHECK(fakecuda_enqueue_fill(s, a, 1, MiB) == cudaSuccess);
    CHECK(cudaFreeAsync(a, s) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(b[0] == 7 && b[MiB - 1] == 7); /* the neighbour is intact */
    unsigned char *c[8];
    for (int i = 0; i < 8; i++) {
        c[i] = dmalloc(MiB);
        memset(c[i], 9, MiB);
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    bool reused = false; /* after a sync of the pool's (one that pays: a slow machine's pieces cost more) */
    for (int i = 0; i < 8; i++) {
        CHECK(c[i][0] == 9 && c[i][MiB - 1] == 9); /* not the freed block's queued fill */
        reused |= c[i] == a;
    }
    if (!reused) {
        CHECK(cudaFreeAsync(a, s) == cudaErrorInvalidValue); /* freed twice: refused, as by cudaFree */
        CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    }
    /* Larger than a chunk: the driver's block in the chunk pool, a piece of
     * the pool's otherwise; either way it is freed and forgotten. */
    void *big = dmalloc(100 * MiB);
    uint64_t frees = stat_of("device.0.frees");
    CHECK(cudaFreeAsync(big, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(stat_of("device.0.frees") == frees + 1);
    CHECK(stat_of("device.0.in_use_bytes") == 9 * MiB);
    CHECK(cudaFreeAsync(NULL, s) == cudaSuccess);
    CHECK(stat_of("device.passthrough.cudaFreeAsync") == 1); /* only the NULL went to the runtime unchanged */
    for (int i = 0; i < 8; i++)
        CHECK(cudaFree(c[i]) == cudaSuccess);
    CHECK(cudaFree(b) == cudaSuccess);
    cudaStreamDestroy(s);
    return failures;
}

/* cudaFreeAsync of a pool block is refused, and the block stays allocated
 * and untouched, where the runtime refuses it for a cudaMalloc block: a
 * stream it does not know (cudaErrorInvalidResourceHandle), and a stream
 * being captured, where the free would be a free node of the graph and
 * must name a graph allocation (cudaErrorInvalidValue).  The captured
 * graph may use the block whenever it is launched: the block is never
 * handed out again meanwhile.  The per-thread stream's NULL is a stream. */
static int free_async_refused(void)
{
    cudaStream_t s, gone;
    CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&gone, 1) == cudaSuccess);
    CHECK(cudaStreamDestroy(gone) == cudaSuccess);
    unsigned char *a = dmalloc(MiB), *b = dmalloc(MiB);
    void *big = dmalloc(100 * MiB); /* the driver's block in the chunk pool, a piece of the pool's otherwise */
    memset(a, 5, MiB);
    memset(b, 6, MiB);
    uint64_t frees = stat_of("device.0.frees"), in_use = stat_of("device.0.in_use_bytes");
    CHECK(cudaFreeAsync(a, (cudaStream_t)(uintptr_t)0xdead000) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    CHECK(cudaFreeAsync(a, gone) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    CHECK(cudaFreeAsync_ptsz(a, (cudaStream_t)(uintptr_t)0xdead000) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    CHECK(stat_of("device.0.frees") == frees && stat_of("device.0.in_use_bytes") == in_use);

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaFreeAsync(b, s) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaFreeAsync(big, s) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(stat_of("device.0.frees") == frees && stat_of("device.0.in_use_bytes") == in_use);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);

    /* Nothing was freed: after a sync, new blocks are elsewhere and the
     * contents are intact. */
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    unsigned char *c[8];
    for (int i = 0; i < 8; i++) {
        c[i] = dmalloc(MiB);
        CHECK(c[i] != a && c[i] != b);
        if (c[i])
            memset(c[i], 9, MiB);
    }
    CHECK(a[0] == 5 && a[MiB - 1] == 5 && b[0] == 6 && b[MiB - 1] == 6);
    /* They free normally now, on the per-thread default stream too. */
    CHECK(cudaFreeAsync_ptsz(a, NULL) == cudaSuccess);
    CHECK(cudaFreeAsync(b, s) == cudaSuccess);
    CHECK(cudaFreeAsync(big, s) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(stat_of("device.0.frees") == frees + 3);
    for (int i = 0; i < 8; i++)
        CHECK(cudaFree(c[i]) == cudaSuccess);
    CHECK(stat_of("device.0.in_use_bytes") == 0);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    return failures;
}

/* ---- what a program learns about a pool block ------------------------------------------------------ */

/* cudaPointerGetAttributes answers for a pool block as for a cudaMalloc
 * block (device memory of this device, the pointer itself), interior
 * pointers too, so the shim leaves it alone; the runtime has no range
 * query.  The driver's cuMemGetAddressRange, which the shim does not take
 * (programs reach it through libcuda or cudaGetDriverEntryPoint), names
 * the allocation that holds the block, not the block: the chunk with
 * chunks, the 2 MiB piece of a small block with pieces; a large block of
 * the pieces pool is its own piece (its run of 2 MiB, as a cudaMalloc of
 * that size would be), and so is a driver-served block. */
static int ranges(void)
{
    fa_cu_result (*range)(fa_cu_ptr *, size_t *, fa_cu_ptr) = NULL;
    CHECK(cudaGetDriverEntryPoint("cuMemGetAddressRange", (void **)&range, 0, NULL) == cudaSuccess && range);
    unsigned char *small = dmalloc(MiB), *large = dmalloc(100 * MiB);
    if (!range || !small || !large)
        return failures + 1;
    const void *probe[] = {small, small + 4096, small + MiB - 1, large, large + 99 * MiB};
    for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++) {
        struct cudaPointerAttributes at;
        CHECK(cudaPointerGetAttributes(&at, probe[i]) == cudaSuccess);
        CHECK(at.type == cudaMemoryTypeDevice && at.device == 0 && at.devicePointer == probe[i] &&
              at.hostPointer == NULL);
    }
    fa_cu_ptr base = 0;
    size_t size = 0;
    CHECK(range(&base, &size, (fa_cu_ptr)(uintptr_t)(small + 4096)) == 0);
    printf("small block %p: range %#llx + %zu\n", (void *)small, base, size);
    if (vmm())
        CHECK(base == ((uintptr_t)small & ~(2 * MiB - 1)) && size == 2 * MiB); /* its piece */
    else
        CHECK(size == 64 * MiB && base <= (uintptr_t)small && (uintptr_t)small + MiB <= base + size); /* its chunk */
    CHECK(range(&base, &size, (fa_cu_ptr)(uintptr_t)(large + 4096)) == 0);
    printf("large block %p: range %#llx + %zu\n", (void *)large, base, size);
    CHECK(base == (uintptr_t)large && size == 100 * MiB);
    CHECK(cudaFree(small) == cudaSuccess && cudaFree(large) == cudaSuccess);
    return failures;
}

/* ---- blind: PyTorch settings that bypass cudaMalloc ----------------------------------------------- */

static int blind(void)
{
    fakecuda_reset_counters();
    void *a = dmalloc(MiB);
    CHECK(fakecuda_calls("cudaMalloc") == 1); /* no pool was reserved */
    CHECK(stat_of("device.0.pool_bytes") == 0 && stat_of("device.0.fallback_allocs") == 1);
    CHECK(cudaFree(a) == cudaSuccess && fakecuda_calls("cudaFree") == 1);
    return failures;
}

/* blind_nomalloc [none|info] [VAR=VALUE]: PyTorch under those settings never
 * calls cudaMalloc.  Optionally set VAR the way a Python program sets
 * os.environ before importing torch, then make no CUDA call at all (none)
 * or only the calls such a program still makes through the runtime (info);
 * run.py reads the verdict from the exit dump. */
static int blind_nomalloc(const char *calls, const char *assign)
{
    if (assign) {
        char var[64];
        const char *eq = strchr(assign, '=');
        CHECK(eq && (size_t)(eq - assign) < sizeof var);
        if (!eq || (size_t)(eq - assign) >= sizeof var)
            return failures;
        memcpy(var, assign, (size_t)(eq - assign));
        var[eq - assign] = '\0';
        CHECK(setenv(var, eq + 1, 1) == 0);
    }
    if (strcmp(calls, "info") == 0) {
        size_t f = 0, t = 0;
        CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess && f <= t && t > 0);
        CHECK(cudaDeviceSynchronize() == cudaSuccess);
    }
    CHECK(fakecuda_calls("cudaMalloc") == 0);
    return failures;
}

/* ---- fragmentation pins nothing (pieces pool) ----------------------------------------------------- */

/* Largest multiple of 2 MiB that cudaMalloc gives now (binary search). */
static size_t largest_fit(size_t total)
{
    size_t lo = 0, hi = total / (2 * MiB);
    while (lo < hi) {
        size_t mid = (lo + hi + 1) / 2;
        void *p = NULL;
        if (cudaMalloc(&p, mid * 2 * MiB) == cudaSuccess) {
            CHECK(cudaFree(p) == cudaSuccess);
            lo = mid;
        } else {
            CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
            hi = mid - 1;
        }
    }
    return lo * 2 * MiB;
}

/* Fill the device with 2 MiB blocks, keep one in 32, free the rest: the
 * largest block that then fits is what the driver has free (a GPU pages
 * its memory: natively that is the free byte count), within one piece,
 * and cudaMemGetInfo says the same. */
static int frag(void)
{
    size_t f0, total;
    CHECK(cudaMemGetInfo(&f0, &total) == cudaSuccess);
    size_t max = total / (2 * MiB) + 1, n = 0, kept = 0;
    void **blocks = calloc(max, sizeof *blocks);
    void *p = NULL;
    while (n < max && cudaMalloc(&p, 2 * MiB) == cudaSuccess)
        blocks[n++] = p;
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(n == total / (2 * MiB)); /* the pool can fill the device */
    for (size_t i = 0; i < n; i++) {
        if (i % 32)
            CHECK(cudaFree(blocks[i]) == cudaSuccess);
        else
            kept++;
    }
    size_t native = total - kept * 2 * MiB;
    size_t largest = largest_fit(total);
    size_t f, t;
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess);
    printf("total %zu kept %zu native_free %zu largest %zu meminfo_free %zu pool_bytes %llu\n", total, kept, native,
           largest, f, (unsigned long long)stat_of("device.0.pool_bytes"));
    CHECK(largest + 2 * MiB >= native && largest <= native);
    CHECK(f <= largest + 2 * MiB && f + 2 * MiB >= largest); /* cudaMemGetInfo agrees */
    CHECK(fakecuda_faults(0) == 0);
    for (size_t i = 0; i < n; i += 32)
        CHECK(cudaFree(blocks[i]) == cudaSuccess);
    free(blocks);
    return failures;
}

/* ---- packing, and what cudaMemGetInfo says is free -------------------------------------------------- */

/* What cudaMemGetInfo calls free can be had: a cudaMalloc of all of it succeeds. */
static void free_count_holds(const char *when)
{
    size_t f, t;
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess);
    void *p = NULL;
    cudaError_t r = f ? cudaMalloc(&p, f) : cudaSuccess;
    printf("%s: meminfo_free %zu\n", when, f);
    if (r != cudaSuccess) {
        fprintf(stderr, "d_pool: %s: cudaMemGetInfo said %zu MiB free; cudaMalloc of that = %d\n", when, f >> 20, (int)r);
        failures++;
        cudaGetLastError();
    } else if (p) {
        CHECK(cudaFree(p) == cudaSuccess);
    }
}

/* Pieces: a freed small block counts as free in cudaMemGetInfo only with
 * the whole 2 MiB granule it lies in, which a live neighbour pins (the
 * pool can give back only whole pieces); and a granule it shares with
 * nothing live counts whole.  What it says can be had.  Run with
 * FAKECUDA_MEM=256M. */
static int meminfo_pinned(void)
{
    size_t f0, f, t;
    CHECK(cudaMemGetInfo(&f0, &t) == cudaSuccess);
    unsigned char *a = dmalloc(MiB), *b = dmalloc(MiB);
    CHECK(((uintptr_t)a >> 21) == ((uintptr_t)b >> 21)); /* one granule */
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess && f == f0 - 2 * MiB);
    CHECK(cudaFree(a) == cudaSuccess);
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess);
    printf("a freed, b live: meminfo_free %zu (device %zu)\n", f, f0);
    CHECK(f == f0 - 2 * MiB); /* b pins a's granule */
    free_count_holds("a freed, b live");
    CHECK(cudaFree(b) == cudaSuccess);
    CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess);
    printf("both freed: meminfo_free %zu\n", f);
    CHECK(f == f0); /* nothing live in the granule: all of it */
    free_count_holds("both freed");
    CHECK(fakecuda_faults(0) == 0);
    return failures;
}

/* 20 MiB blocks (PyTorch's segments for 1-10 MiB tensors) fill the device:
 * all of it with pieces, three to a 64 MiB chunk with chunks. */
static int packing(void)
{
    size_t f0, total;
    CHECK(cudaMemGetInfo(&f0, &total) == cudaSuccess);
    enum { MAXB = 256 };
    void *b[MAXB];
    size_t n = 0;
    while (n < MAXB && cudaMalloc(&b[n], 20 * MiB) == cudaSuccess)
        n++;
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    size_t want = vmm() ? total / (20 * MiB) : total / (64 * MiB) * 3;
    printf("blocks %zu want %zu pool_allocs %llu\n", n, want, (unsigned long long)stat_of("device.0.pool_allocs"));
    CHECK(n >= want);
    free_count_holds("full");
    for (size_t i = 1; i < n; i += 3) /* one in three: every chunk still holds a live block */
        CHECK(cudaFree(b[i]) == cudaSuccess);
    free_count_holds("one in three freed");
    for (size_t i = 0; i < n; i += 3) /* two in three */
        CHECK(cudaFree(b[i]) == cudaSuccess);
    free_count_holds("two in three freed");
    for (size_t i = 2; i < n; i += 3)
        CHECK(cudaFree(b[i]) == cudaSuccess);
    free_count_holds("all freed");
    CHECK(fakecuda_faults(0) == 0);
    return failures;
}

/* ---- memory given back under pressure receives no queued work ------------------------------------ */

static int pressure(void)
{
    /* FAKECUDA_MEM=256M, a 64 MiB pool. */
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    enum { N = 64 };
    void *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = dmalloc(2 * MiB);
        CHECK(fakecuda_enqueue_fill(s, b[i], 0xAA, 2 * MiB) == cudaSuccess);
        CHECK(cudaFree(b[i]) == cudaSuccess); /* quarantined, work still queued */
    }
    CHECK(fakecuda_pending(0) == N);
    CHECK(stat_of("device.0.device_syncs") == 0); /* grown, not waited */
    unsigned char *big = dmalloc(200 * MiB); /* needs the quarantined pieces back from the driver */
    CHECK(big != NULL);
    CHECK(fakecuda_pending(0) == 0);  /* the pool waited for the work... */
    CHECK(fakecuda_faults(0) == 0);   /* ...before unmapping what it touches */
    CHECK(stat_of("device.0.device_syncs") == 1);
    CHECK(stat_of("device.0.pieces_released") > 0);
    CHECK(stat_of("device.0.fallback_allocs") == 0);
    memset(big, 0x55, 200 * MiB);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    size_t bad = 0;
    for (size_t i = 0; i < 200 * MiB; i += 4096)
        bad += big[i] != 0x55;
    CHECK(bad == 0);
    CHECK(cudaFree(big) == cudaSuccess);
    cudaStreamDestroy(s);
    return failures;
}

/* ---- peer access reaches the pool ----------------------------------------------------------------- */

static int peer(void)
{
    CHECK(cudaSetDevice(0) == cudaSuccess);
    unsigned char *a = dmalloc(2 * MiB);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    cudaStream_t s; /* a stream of device 1 */
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    CHECK(fakecuda_enqueue_fill(s, a, 1, 4096) == cudaErrorInvalidValue); /* no access yet */
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaDeviceEnablePeerAccess(0, 0) == cudaSuccess);
    CHECK(fakecuda_enqueue_fill(s, a, 7, 4096) == cudaSuccess); /* mapped before */
    CHECK(cudaSetDevice(0) == cudaSuccess);
    unsigned char *b = dmalloc(6 * MiB), *c = dmalloc(70 * MiB); /* mapped after */
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(fakecuda_enqueue_fill(s, b, 8, 6 * MiB) == cudaSuccess);
    CHECK(fakecuda_enqueue_fill(s, c, 9, 70 * MiB) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(a[0] == 7 && a[4095] == 7 && b[0] == 8 && b[6 * MiB - 1] == 8 && c[0] == 9 && c[70 * MiB - 1] == 9);
    CHECK(fakecuda_faults(1) == 0);
    CHECK(cudaDeviceEnablePeerAccess(0, 0) == cudaErrorPeerAccessAlreadyEnabled);
    CHECK(cudaGetLastError() == cudaErrorPeerAccessAlreadyEnabled);
    CHECK(cudaSetDevice(0) == cudaSuccess);
    CHECK(cudaFree(a) == cudaSuccess && cudaFree(b) == cudaSuccess && cudaFree(c) == cudaSuccess);
    cudaStreamDestroy(s);
    return failures;
}

/* ---- large blocks (pieces pool) -------------------------------------------------------------------- */

static int large(void)
{
    void *a = dmalloc(300 * MiB); /* above the 64 MiB chunk of the chunk pool */
    CHECK(fakecuda_calls("cuMemCreate") == 1); /* one piece of its own */
    CHECK(stat_of("device.0.pool_allocs") == 1 && stat_of("device.0.fallback_allocs") == 0);
    CHECK(cudaFree(a) == cudaSuccess);
    CHECK(fakecuda_calls("cudaFree") == 0); /* no driver call, no sync */
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    unsigned long before = vm_calls();
    void *b = dmalloc(300 * MiB);
    CHECK(b == a && vm_calls() == before); /* the same piece again */
    CHECK(cudaFree(b) == cudaSuccess);
    return failures;
}

/* ---- growth given back by the background thread (pieces pool) ------------------------------------ */

/* 48 blocks of 20 MiB on a 256 MiB pool: the pool grows instead of
 * synchronising; all freed, then the program sits still: the process's
 * background thread gives the growth back after the idle spell. */
static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* capture: a stream capture is under way while the program waits, and ends
 * then: the pool gives back during it, and the capture stays valid. */
static int giveback(double wait_s, bool capture)
{
    void *p[48];
    for (int i = 0; i < 48; i++)
        p[i] = dmalloc(20 * MiB);
    CHECK(stat_of("device.0.device_syncs") == 0);
    CHECK(stat_of("device.0.pool_bytes") > 256 * MiB);
    for (int i = 0; i < 48; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess); /* the frees leave the quarantine */
    cudaStream_t s = NULL;
    unsigned long calls = vm_calls();
    if (capture) {
        CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    }
    sleep_s(wait_s);
    if (capture) {
        printf("during_capture pool_bytes %llu vm_calls %lu\n", (unsigned long long)stat_of("device.0.pool_bytes"),
               vm_calls() - calls);
        int st = -1;
        CHECK(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive);
        cudaGraph_t g = NULL;
        CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
        CHECK(cudaStreamDestroy(s) == cudaSuccess);
    }
    printf("pool_bytes %llu\n", (unsigned long long)stat_of("device.0.pool_bytes"));
    return failures;
}

/* The helper thread's wake-ups: each time it ran, counted from the
 * context switches of the threads named "forgealloc" (a thread that left
 * and one started since count as they are seen). */
static unsigned long helper_switches(pid_t *tid)
{
    unsigned long n = 0;
    *tid = 0;
    DIR *dir = opendir("/proc/self/task");
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
        char path[300], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        bool helper = f && fgets(line, sizeof line, f) && strcmp(line, "forgealloc\n") == 0;
        if (f)
            fclose(f);
        if (!helper)
            continue;
        *tid = (pid_t)atoi(e->d_name);
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        while (fgets(line, sizeof line, f)) {
            unsigned long v;
            if (sscanf(line, "voluntary_ctxt_switches: %lu", &v) == 1 ||
                sscanf(line, "nonvoluntary_ctxt_switches: %lu", &v) == 1)
                n += v;
        }
        fclose(f);
    }
    if (dir)
        closedir(dir);
    return n;
}

/* The live blocks stay above the pool's size, then the program sits
 * still for 10 s: nothing can be given back, so the helper thread sleeps
 * (or leaves) instead of looking every second.  Then the blocks are freed:
 * what was grown goes back after the idle spell.  Run with a 256 MiB pool
 * on a 1 GiB device. */
static int idle_helper(void)
{
    void *p[24];
    for (int i = 0; i < 24; i++)
        p[i] = dmalloc(16 * MiB); /* 384 MiB live */
    CHECK(stat_of("device.0.pool_bytes") > 256 * MiB);
    sleep_s(0.2); /* the thread started by the growth looks once */
    pid_t tid, was;
    unsigned long base = helper_switches(&was), wakeups = 0, sets = fakecuda_calls("cudaSetDevice");
    for (int i = 0; i < 100; i++) { /* 10 s */
        sleep_s(0.1);
        unsigned long n = helper_switches(&tid);
        if (tid && tid != was)
            wakeups++, base = 0; /* a new thread */
        else if (n > base)
            wakeups += n - base;
        if (tid)
            base = n, was = tid;
    }
    sets = fakecuda_calls("cudaSetDevice") - sets;
    printf("idle_wakeups %lu set_device_calls %lu\n", wakeups, sets);
    CHECK(wakeups <= 3);
    for (int i = 0; i < 24; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess);
    sleep_s(11);
    printf("pool_bytes_after_frees %llu\n", (unsigned long long)stat_of("device.0.pool_bytes"));
    CHECK(stat_of("device.0.pool_bytes") <= 256 * MiB);
    return failures;
}

/* pthread_create, made to fail (as at a container's pids limit) while
 * fail_starts is set; d_pool exports it, so the preloaded library's calls
 * come here. */
static int fail_starts;
__attribute__((visibility("default"))) int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *),
                                                      void *arg)
{
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (__atomic_load_n(&fail_starts, __ATOMIC_ACQUIRE))
        return EAGAIN;
    if (!real)
        real = (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))dlsym(RTLD_NEXT,
                                                                                               "pthread_create");
    return real(t, a, fn, arg);
}

/* The helper thread cannot start when the pool grows: it is started later,
 * and what was grown still goes back.  Run with a 256 MiB pool on a 1 GiB
 * device. */
static int thread_retry(void)
{
    __atomic_store_n(&fail_starts, 1, __ATOMIC_RELEASE);
    void *p[24];
    for (int i = 0; i < 24; i++)
        p[i] = dmalloc(16 * MiB);
    pid_t tid;
    helper_switches(&tid);
    CHECK(tid == 0); /* none could start */
    __atomic_store_n(&fail_starts, 0, __ATOMIC_RELEASE);
    sleep_s(1.5);
    for (int i = 0; i < 24; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    sleep_s(11);
    printf("pool_bytes_after_frees %llu\n", (unsigned long long)stat_of("device.0.pool_bytes"));
    CHECK(stat_of("device.0.pool_bytes") <= 256 * MiB);
    return failures;
}

/* ---- a capture begins while another thread's pool synchronises ------------------------------------- */

/* A thread in relaxed capture mode (the runtime allows its cudaMalloc and
 * cudaFree during any capture) makes requests that the pool serves after a
 * sync of its own; another thread begins and ends captures in global mode.
 * Outside captures the pool syncs, during them it must not: a sync that
 * found no capture just before one began would invalidate it.  Run with
 * a 64 MiB pool and pieces as costly to map as on an H100, where a sync
 * is the cheaper way to serve what was just freed. */
static cudaStream_t race_stream;
static int race_begun; /* the other thread's cudaStreamBeginCapture returned */
static cudaError_t race_begin_rc;

static void *race_begin_thread(void *arg)
{
    (void)arg;
    race_begin_rc = cudaStreamBeginCapture(race_stream, cudaStreamCaptureModeGlobal);
    __atomic_store_n(&race_begun, 1, __ATOMIC_RELEASE);
    return NULL;
}

static pthread_t race_thread;

/* The pool's sync, held up on its way in: another thread begins a
 * capture, given 200 ms to do so. */
static void race_hook(void)
{
    CHECK(pthread_create(&race_thread, NULL, race_begin_thread, NULL) == 0);
    for (int i = 0; i < 200 && !__atomic_load_n(&race_begun, __ATOMIC_ACQUIRE); i++)
        sleep_s(0.001);
}

static int race_done;

static void *race_pairs_thread(void *arg)
{
    unsigned long *pairs = arg;
    int mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    while (!__atomic_load_n(&race_done, __ATOMIC_ACQUIRE)) {
        void *p = NULL;
        cudaError_t m = cudaMalloc(&p, 20 * MiB), f = m ? cudaSuccess : cudaFree(p);
        if (m || f)
            fprintf(stderr, "d_pool: pair %lu: cudaMalloc %d cudaFree %d pool_bytes %llu\n", *pairs, (int)m, (int)f,
                    (unsigned long long)stat_of("device.0.pool_bytes"));
        CHECK(m == cudaSuccess && f == cudaSuccess);
        ++*pairs;
    }
    return NULL;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* First the sync held up while a capture begins; then n captures, each
 * after a gap of 0-30 us, while the other thread makes 20 MiB pairs. */
static int capture_race(int n)
{
    CHECK(cudaStreamCreateWithFlags(&race_stream, 1 /* non-blocking */) == cudaSuccess);
    int mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    void *a = dmalloc(32 * MiB), *b = dmalloc(32 * MiB); /* the pool is full */
    CHECK(cudaFree(a) == cudaSuccess);                   /* quarantined */
    uint64_t syncs = stat_of("device.0.device_syncs");
    fakecuda_set_entry_hook("cudaDeviceSynchronize", race_hook);
    void *c = NULL;
    CHECK(cudaMalloc(&c, 32 * MiB) == cudaSuccess); /* served after the pool's sync */
    CHECK(stat_of("device.0.device_syncs") > syncs);
    pthread_join(race_thread, NULL);
    CHECK(race_begin_rc == cudaSuccess);
    cudaGraph_t g = NULL;
    cudaError_t end = cudaStreamEndCapture(race_stream, &g);
    printf("held_up_sync end_capture %d\n", (int)end);
    CHECK(end == cudaSuccess); /* not invalidated */
    cudaGetLastError();
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(cudaFree(b) == cudaSuccess && cudaFree(c) == cudaSuccess);

    pthread_t t;
    unsigned long pairs = 0;
    CHECK(pthread_create(&t, NULL, race_pairs_thread, &pairs) == 0);
    int invalidated = 0;
    unsigned seed = 1;
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        double until = mono_s() + (double)((seed >> 8) % 30) * 1e-6;
        while (mono_s() < until)
            ;
        CHECK(cudaStreamBeginCapture(race_stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
        if (cudaStreamEndCapture(race_stream, &g) != cudaSuccess)
            invalidated++;
    }
    __atomic_store_n(&race_done, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    cudaGetLastError();
    CHECK(cudaStreamDestroy(race_stream) == cudaSuccess);
    printf("captures %d invalidated %d pairs %lu syncs %llu\n", n, invalidated, pairs,
           (unsigned long long)stat_of("device.0.device_syncs"));
    CHECK(invalidated == 0);
    return failures;
}

/* ---- dear syncs, then a capture: the quarantine leaves the driver room ---------------------------- */

/* Syncs that take 50 ms make growing the cheaper way for a long while:
 * 20 MiB blocks freed between syncs would have the pool map the whole
 * device.  A capture begins after a sync, with all of it ready, but the
 * blocks its relaxed-mode calls free wait in quarantine until it ends: a
 * capture that frees and allocates more than the pool holds is served by
 * the driver, which then has nothing left.  The pool syncs before its
 * quarantine outgrows the driver's room.  Run with a 1 GiB device, a
 * 64 MiB pool, pieces as costly as on an H100 and syncs of 50 ms. */
static int capture_crowd(void)
{
    size_t f = 0, t = 0, least = SIZE_MAX;
    uint64_t most = 0;
    for (int i = 0; i < 120; i++) {
        void *p = dmalloc(20 * MiB);
        CHECK(cudaFree(p) == cudaSuccess);
        CHECK(cudaMemGetInfo(&f, &t) == cudaSuccess); /* counts the quarantine as free: the driver's own below */
        uint64_t q = stat_of("device.0.quarantine_bytes"), pool = stat_of("device.0.pool_bytes");
        size_t driver = t - (size_t)pool;
        least = driver < least ? driver : least;
        most = q > most ? q : most;
    }
    printf("syncs %llu most_quarantined %llu least_driver_room %zu pool_bytes %llu\n",
           (unsigned long long)stat_of("device.0.device_syncs"), (unsigned long long)most, least,
           (unsigned long long)stat_of("device.0.pool_bytes"));
    CHECK(stat_of("device.0.device_syncs") >= 1);
    CHECK(least + 20 * MiB >= most); /* never more quarantined than the driver had left, give or take a block */

    /* A capture whose thread, in relaxed mode, makes 2 GiB of 20 MiB pairs. */
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, 1 /* non-blocking */) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    int mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    int served = 0;
    for (int i = 0; i < 100; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, 20 * MiB) != cudaSuccess)
            break;
        CHECK(cudaFree(p) == cudaSuccess);
        served++;
    }
    cudaError_t last = cudaGetLastError();
    printf("pairs_in_capture %d\n", served);
    CHECK(served == 100 && last == cudaSuccess);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    cudaGraph_t g = NULL;
    CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    return failures;
}

/* ---- out of address space ----------------------------------------------------------------------------- */

/* A block the pool's address space cannot place is not one the driver
 * cannot serve: it goes to the driver without the pool releasing its idle
 * pieces or synchronising (neither gives address space, the freed block
 * waiting lies in the other zone).  The device grows past what its pool's
 * address space was reserved for: run with FAKECUDA_MEM=256M (512 MiB
 * zones) and a 128 MiB pool. */
static int no_space(void)
{
    void *p[10], *large[4];
    for (int i = 0; i < 10; i++)
        p[i] = dmalloc(2 * MiB);
    for (int i = 0; i < 10; i++)
        CHECK(cudaFree(p[i]) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess); /* idle pieces */
    fakecuda_set_capacity(0, (size_t)4 << 30);
    void *q = dmalloc(MiB);
    CHECK(cudaFree(q) == cudaSuccess); /* waiting in quarantine */
    for (int i = 0; i < 4; i++) /* 70 MiB blocks take 128 MiB of address space each */
        large[i] = dmalloc(70 * MiB);
    uint64_t syncs = stat_of("device.0.device_syncs"), released = stat_of("device.0.pieces_released");
    uint64_t idle = stat_of("device.0.pieces_idle");
    void *e = dmalloc(70 * MiB); /* no place left for it */
    printf("fallback %llu syncs %llu released %llu idle_pieces %llu (before %llu)\n",
           (unsigned long long)stat_of("device.0.fallback_allocs"),
           (unsigned long long)(stat_of("device.0.device_syncs") - syncs),
           (unsigned long long)(stat_of("device.0.pieces_released") - released),
           (unsigned long long)stat_of("device.0.pieces_idle"), (unsigned long long)idle);
    CHECK(e != NULL && stat_of("device.0.fallback_allocs") == 1);
    CHECK(stat_of("device.0.device_syncs") == syncs && stat_of("device.0.pieces_released") == released);
    CHECK(stat_of("device.0.pieces_idle") == idle);
    CHECK(cudaFree(e) == cudaSuccess);
    for (int i = 0; i < 4; i++)
        CHECK(cudaFree(large[i]) == cudaSuccess);
    return failures;
}

/* ---- GPUDirect RDMA ----------------------------------------------------------------------------------- */

/* UCX and NCCL register device memory for GPUDirect RDMA: a pool block can
 * be, as a cudaMalloc block can, where the device supports it with mapped
 * memory (FAKECUDA_GDR=1, the stand-in's default); where it does not, the
 * pool still works (pieces created without the flag). */
static int rdma(bool supported)
{
    void *a = dmalloc(2 * MiB), *b = dmalloc(100 * MiB);
    CHECK(a && b);
    printf("rdma_capable %d %d\n", fakecuda_rdma_capable(a), fakecuda_rdma_capable(b));
    CHECK(fakecuda_rdma_capable(a) == (int)supported && fakecuda_rdma_capable(b) == (int)supported);
    CHECK(cudaFree(a) == cudaSuccess && cudaFree(b) == cudaSuccess);
    return failures;
}

/* ---- which pool serves ------------------------------------------------------------------------------ */

static int kind(int want_vmm)
{
    void *a = dmalloc(MiB);
    CHECK(stat_of("device.0.pool_allocs") == 1);
    CHECK((int)stat_of("device.0.vmm") == want_vmm);
    CHECK(cudaFree(a) == cudaSuccess);
    return failures;
}

/* Pairs of cudaMalloc and cudaFree of one size and nothing else, as a
 * program without PyTorch's cache makes: run.py sets what mapping a piece
 * and synchronising cost.  Prints the pool's counts. */
static int pairs(size_t size, int n)
{
    for (int i = 0; i < n; i++) {
        void *p = dmalloc(size);
        CHECK(p != NULL && cudaFree(p) == cudaSuccess);
    }
    printf("syncs %llu pieces_created %llu pool_bytes %llu fallback %llu\n",
           (unsigned long long)stat_of("device.0.device_syncs"), (unsigned long long)stat_of("device.0.pieces_created"),
           (unsigned long long)stat_of("device.0.pool_bytes"), (unsigned long long)stat_of("device.0.fallback_allocs"));
    return failures;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "pairs") == 0)
        return pairs((size_t)atoi(argc > 2 ? argv[2] : "20") * MiB, argc > 3 ? atoi(argv[3]) : 200) ? 1 : 0;
    if (strcmp(mode, "churn") == 0)
        return churn(argc > 2 ? atoi(argv[2]) : 1, argc > 3 ? atoi(argv[3]) : 20000) ? 1 : 0;
    if (strcmp(mode, "live_sums") == 0)
        return live_sums();
    if (strcmp(mode, "hazard") == 0)
        return hazard() ? 1 : 0;
    if (strcmp(mode, "oom") == 0)
        return oom() ? 1 : 0;
    if (strcmp(mode, "room") == 0)
        return room() ? 1 : 0;
    if (strcmp(mode, "qcap") == 0)
        return qcap() ? 1 : 0;
    if (strcmp(mode, "qcap_highdev") == 0)
        return qcap_highdev() ? 1 : 0;
    if (strcmp(mode, "qcap_herd") == 0)
        return qcap_herd() ? 1 : 0;
    if (strcmp(mode, "first_race") == 0)
        return first_race() ? 1 : 0;
    if (strcmp(mode, "qcap_fail") == 0)
        return qcap_fail() ? 1 : 0;
    if (strcmp(mode, "meminfo") == 0)
        return meminfo() ? 1 : 0;
    if (strcmp(mode, "twodev") == 0)
        return twodev() ? 1 : 0;
    if (strcmp(mode, "capture_twodev") == 0)
        return capture_twodev() ? 1 : 0;
    if (strcmp(mode, "capture_reset") == 0)
        return capture_reset() ? 1 : 0;
    if (strcmp(mode, "reset") == 0)
        return reset() ? 1 : 0;
    if (strcmp(mode, "reset_race") == 0)
        return reset_race() ? 1 : 0;
    if (strcmp(mode, "errors") == 0)
        return errors() ? 1 : 0;
    if (strcmp(mode, "capture") == 0)
        return capture() ? 1 : 0;
    if (strcmp(mode, "twodev_quarantine") == 0)
        return twodev_quarantine() ? 1 : 0;
    if (strcmp(mode, "reset_capture") == 0)
        return reset_capture() ? 1 : 0;
    if (strcmp(mode, "idle_helper") == 0)
        return idle_helper() ? 1 : 0;
    if (strcmp(mode, "thread_retry") == 0)
        return thread_retry() ? 1 : 0;
    if (strcmp(mode, "no_space") == 0)
        return no_space() ? 1 : 0;
    if (strcmp(mode, "rdma") == 0)
        return rdma(argc > 2 && strcmp(argv[2], "1") == 0) ? 1 : 0;
    if (strcmp(mode, "driver_api") == 0)
        return driver_api() ? 1 : 0;
    if (strcmp(mode, "sticky") == 0)
        return sticky() ? 1 : 0;
    if (strcmp(mode, "sticky_read") == 0)
        return sticky_read() ? 1 : 0;
    if (strcmp(mode, "refuse_capture") == 0)
        return refuse_capture() ? 1 : 0;
    if (strcmp(mode, "capture_room") == 0)
        return capture_room() ? 1 : 0;
    if (strcmp(mode, "capture_calls") == 0)
        return capture_calls() ? 1 : 0;
    if (strcmp(mode, "capture_free") == 0)
        return capture_free() ? 1 : 0;
    if (strcmp(mode, "capture_crowd") == 0)
        return capture_crowd() ? 1 : 0;
    if (strcmp(mode, "capture_race") == 0)
        return capture_race(argc > 2 ? atoi(argv[2]) : 1000) ? 1 : 0;
    if (strcmp(mode, "free_async_refused") == 0)
        return free_async_refused() ? 1 : 0;
    if (strcmp(mode, "pending_error") == 0)
        return pending_error(argc > 2 ? argv[2] : "") ? 1 : 0;
    if (strcmp(mode, "ranges") == 0)
        return ranges() ? 1 : 0;
    if (strcmp(mode, "passthrough") == 0)
        return passthrough() ? 1 : 0;
    if (strcmp(mode, "free_async") == 0)
        return free_async() ? 1 : 0;
    if (strcmp(mode, "blind") == 0)
        return blind() ? 1 : 0;
    if (strcmp(mode, "blind_nomalloc") == 0)
        return blind_nomalloc(argc > 2 ? argv[2] : "none", argc > 3 ? argv[3] : NULL) ? 1 : 0;
    if (strcmp(mode, "frag") == 0)
        return frag() ? 1 : 0;
    if (strcmp(mode, "packing") == 0)
        return packing() ? 1 : 0;
    if (strcmp(mode, "meminfo_pinned") == 0)
        return meminfo_pinned() ? 1 : 0;
    if (strcmp(mode, "pressure") == 0)
        return pressure() ? 1 : 0;
    if (strcmp(mode, "peer") == 0)
        return peer() ? 1 : 0;
    if (strcmp(mode, "large") == 0)
        return large() ? 1 : 0;
    if (strcmp(mode, "giveback") == 0)
        return giveback(argc > 2 ? atof(argv[2]) : 15, argc > 3 && strcmp(argv[3], "capture") == 0) ? 1 : 0;
    if (strcmp(mode, "kind") == 0)
        return kind(argc > 2 ? atoi(argv[2]) : 1) ? 1 : 0;
    fprintf(stderr, "usage: d_pool churn [THREADS [OPS]]|hazard|qcap|qcap_herd|qcap_fail|oom|meminfo|twodev|capture_twodev|capture_reset|reset"
                    "|reset_race|errors|capture|capture_room|capture_calls|refuse_capture|idle_helper|thread_retry|twodev_quarantine|reset_capture|sticky|sticky_read|driver_api|rdma 0|1|no_space|capture_free|capture_race [N]|capture_crowd|passthrough|free_async|free_async_refused|ranges|blind|frag|packing|meminfo_pinned|pressure|peer|large|kind|giveback [S [capture]]\n"
                    "       d_pool blind_nomalloc [none|info] [VAR=VALUE]\n"
                    "       d_pool pending_error room|malloc|reset|reserve\n");
    return 2;
}
