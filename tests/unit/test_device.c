/* test_device.c - device.c driven directly (no preload) against the
 * stand-in runtime, from several threads at once: the pool's locking is
 * what this test is for, under TSan in particular. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../../src/core/options.h"
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

int main(void)
{
    char *env[] = {"FORGEALLOC_DEVICE_POOL_SIZE=256M", NULL};
    fa_options_load(env);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_threads)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
