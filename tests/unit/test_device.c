/* test_device.c - device.c driven directly (no preload) against the
 * stand-in runtime, from several threads at once: the pool's locking is
 * what this test is for, under TSan in particular. */
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>
#include <stdlib.h>
#include <time.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/core/options.h"
#include "../../src/device/devstate.h"
#include "../../src/device/device.h"
#include "../device/fakecuda.h"

#define MiB ((size_t)1 << 20)
enum { THREADS = 4, OPS = 3000, SLOTS = 16 };

static int stop_syncing;

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    struct {
        unsigned char *p;
        size_t n;
    } live[SLOTS] = {{0}};
    unsigned seed = 99u + (unsigned)id;
    int bad = 0;
    for (int op = 0; op < OPS; op++) {
        seed = seed * 1103515245u + 12345u;
        int i = (int)((seed >> 8) % SLOTS);
        if (live[i].p) {
            bad += live[i].p[0] != (unsigned char)(id + i) || live[i].p[live[i].n - 1] != (unsigned char)(id + i);
            bad += fa_device_free(live[i].p) != 0;
            live[i].p = NULL;
        } else {
            size_t n = (seed >> 4) % 2 ? 2 * MiB : (size_t)((seed >> 6) % 1000 + 1) * 1024;
            void *p = NULL;
            bad += fa_device_malloc(&p, n) != 0;
            live[i].p = p;
            live[i].n = n;
            if (p) {
                live[i].p[0] = (unsigned char)(id + i);
                live[i].p[n - 1] = (unsigned char)(id + i);
            }
        }
    }
    for (int i = 0; i < SLOTS; i++)
        if (live[i].p)
            bad += fa_device_free(live[i].p) != 0;
    return (void *)(intptr_t)bad;
}

static void *syncer(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&stop_syncing, __ATOMIC_ACQUIRE)) {
        fa_device_synchronize();
        size_t f, t;
        fa_device_mem_get_info(&f, &t);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t t[THREADS], s;
    pthread_create(&s, NULL, syncer, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    int bad = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (int)(intptr_t)r;
    }
    __atomic_store_n(&stop_syncing, 1, __ATOMIC_RELEASE);
    pthread_join(s, NULL);
    assert_int_equal(bad, 0);
    fa_snapshot snap;
    memset(&snap, 0, sizeof snap);
    fa_device_fill(&snap);
    assert_int_equal(snap.ndevices, 1);
    assert_int_equal(snap.dev[0].allocs, snap.dev[0].frees);
    assert_int_equal(snap.dev[0].allocs, snap.dev[0].pool_allocs + snap.dev[0].fallback_allocs);
    assert_int_equal(snap.dev[0].in_use_bytes, 0);
    assert_int_equal(snap.dev[0].driver_malloc_calls, fakecuda_calls("cudaMalloc"));
}

static uint64_t stat0(fa_snapshot *snap)
{
    memset(snap, 0, sizeof *snap);
    fa_device_fill(snap);
    assert_int_equal(snap->ndevices, 1);
    return 0;
}

/* The process's address space in bytes (VmSize). */
static uint64_t vm_size(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    return (uint64_t)pages * (uint64_t)sysconf(_SC_PAGESIZE);
}

static uint64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* 48 pairs of 20 MiB, each freed with work still queued on it, through a
 * 256 MiB pool on a 2 GiB device whose syncs wait 200 ms while work is
 * queued: the pool grows instead of waiting (at most one device sync, the
 * one that shows syncs wait now: the pool starts out knowing syncs as
 * instant, as an idle device's are), and the
 * background gives the growth back after an idle spell - not before -
 * once the queued work is done (a sync there), so no piece it releases
 * is touched later.  The clock is the caller's. */
static void test_grow_then_give_back(void **state)
{
    (void)state;
    fa_snapshot snap;
    stat0(&snap);
    if (!snap.dev[0].vmm)
        skip(); /* the chunk pool waits instead: its own tests cover it */
    fa_device_synchronize();
    /* What the earlier test taught the pool depends on the machine's load
     * (its syncs took milliseconds under a parallel test run, and then the
     * pool rightly grows first and syncs later): start from instant. */
    pthread_mutex_lock(&fa_devs[0].lock);
    fa_devs[0].sync_ns = 1000;
    fa_devs[0].grow_ns = 0;
    pthread_mutex_unlock(&fa_devs[0].lock);
    fakecuda_set_busy_sync_ms(200);
    uint64_t syncs = fakecuda_calls("cudaDeviceSynchronize");
    for (int i = 0; i < 48; i++) {
        void *p = NULL;
        assert_int_equal(fa_device_malloc(&p, 20 * MiB), 0);
        assert_int_equal(fakecuda_enqueue_fill(NULL, p, 0x11, 20 * MiB), 0);
        assert_int_equal(fa_device_free(p), 0);
    }
    stat0(&snap);
    assert_true(fakecuda_calls("cudaDeviceSynchronize") - syncs <= 1);
    assert_true(fakecuda_pending(0) > 0);
    assert_true(snap.dev[0].pool_bytes >= 46 * 20 * MiB);
    assert_true(snap.dev[0].pieces_grown > 0);
    assert_true(fa_device_background_wanted());

    uint64_t now = monotonic_ms();
    fa_device_background(now + 5000); /* too early: nothing goes */
    stat0(&snap);
    assert_true(snap.dev[0].pool_bytes >= 46 * 20 * MiB);
    assert_int_equal(snap.dev[0].pieces_given_back, 0);
    assert_true(fa_device_background_wanted());

    fa_device_background(now + 15000);
    stat0(&snap);
    assert_int_equal(snap.dev[0].pool_bytes, 256 * MiB); /* back to its size */
    assert_true(snap.dev[0].pieces_given_back > 0);
    assert_int_equal(fakecuda_pending(0), 0); /* the queued work landed first... */
    assert_int_equal(fakecuda_faults(0), 0);  /* ...so none of it hit a released piece */
    assert_int_equal(fakecuda_mapped(0), 256 * MiB);
    assert_false(fa_device_background_wanted()); /* nothing more to give back */
    fa_device_background(now + 30000);           /* and cheap to call */
    stat0(&snap);
    assert_int_equal(snap.dev[0].pool_bytes, 256 * MiB);
    fakecuda_set_busy_sync_ms(0);
}

static void *first_malloc(void *arg)
{
    (void)arg;
    void *p = NULL;
    return (void *)(intptr_t)(fa_device_malloc(&p, MiB) != 0 || fa_device_free(p) != 0);
}

/* `test_device reserving`, with FAKECUDA_DELAY_MS: while one thread's first
 * cudaMalloc reserves the pool (slow driver calls), another's cudaFree
 * and cudaMalloc read the pool's state without the lock, cudaFree before
 * any call of the runtime's.  Every write of the state is atomic: a
 * ThreadSanitizer build fails on a plain one. */
static void test_malloc_while_reserving(void **state)
{
    (void)state;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, first_malloc, NULL), 0);
    while (fakecuda_calls("cudaMalloc") + fakecuda_calls("cuMemAddressReserve") == 0) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    int host;
    assert_int_equal(fa_device_free(&host), cudaErrorInvalidValue); /* not device memory: the driver's answer */
    assert_int_equal(fakecuda_calls("cudaFree"), 1);
    void *p = NULL;
    assert_int_equal(fa_device_malloc(&p, MiB), 0);
    assert_int_equal(fa_device_free(p), 0);
    void *bad;
    assert_int_equal(pthread_join(t, &bad), 0);
    assert_null(bad);
    fa_snapshot snap;
    stat0(&snap);
    assert_int_equal(snap.dev[0].allocs, 2);
    assert_int_equal(snap.dev[0].frees, 2);
    assert_int_equal(snap.dev[0].in_use_bytes, 0);
}

/* `test_device untracked`, pool off: a driver-served block whose record
 * cannot be kept (no memory for the map's growth: the address space is
 * limited just before it) is not counted, so the counts stay exact: after
 * every block is freed nothing is in use and allocs equal frees. */
static void test_untracked(void **state)
{
    (void)state;
    enum { N = 4097 }; /* the map of 8192 slots grows at its 4097th record */
    static void *p[N];
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    print_message("skipped: a sanitizer's runtime needs address space of its own under the limit this test sets\n");
    skip();
#endif
    mallopt(M_MMAP_THRESHOLD, 128 << 10); /* the map's 384 KiB growth needs memory of its own */
    for (int i = 0; i < N - 1; i++)
        assert_int_equal(fa_device_malloc(&p[i], 512), 0);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
    lim = old;
    lim.rlim_cur = vm_size() + (256 << 10);
    assert_int_equal(setrlimit(RLIMIT_AS, &lim), 0);
    assert_int_equal(fa_device_malloc(&p[N - 1], 512), 0); /* the driver serves it; the record cannot grow */
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
    fa_snapshot snap;
    stat0(&snap);
    assert_int_equal(snap.dev[0].fallback_allocs, N - 1);
    assert_int_equal(snap.dev[0].in_use_bytes, (uint64_t)(N - 1) * 512);
    for (int i = 0; i < N; i++)
        assert_int_equal(fa_device_free(p[i]), 0);
    stat0(&snap);
    assert_int_equal(snap.dev[0].in_use_bytes, 0);
    assert_int_equal(snap.dev[0].allocs, snap.dev[0].frees);
}

int main(int argc, char **argv)
{
    char *env[] = {"FORGEALLOC_DEVICE_POOL_SIZE=256M", NULL};
    fa_options_load(env);
    setenv("FAKECUDA_MEM", "2G", 0); /* read by the stand-in at its first call */
    if (argc > 1 && strcmp(argv[1], "untracked") == 0) {
        char *off[] = {"FORGEALLOC_DEVICE_POOL_SIZE=0", NULL};
        fa_options_load(off);
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_untracked)};
        return cmocka_run_group_tests(tests, NULL, NULL);
    }
    if (argc > 1 && strcmp(argv[1], "reserving") == 0) {
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_malloc_while_reserving)};
        return cmocka_run_group_tests(tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads), cmocka_unit_test(test_grow_then_give_back)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
