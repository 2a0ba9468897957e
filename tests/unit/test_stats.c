/* test_stats.c - per-thread counters: exact sums with live and exited
 * threads, record reuse, and fork giving the child its own counts (also a
 * fork that runs no fork handlers). */
#define _GNU_SOURCE /* _Fork */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "stats.h"

static uint64_t total(enum fa_call c)
{
    fa_tstats s;
    fa_stats_sum(&s);
    return s.calls[c];
}

static void *make_250(void *arg)
{
    (void)arg;
    for (int i = 0; i < 250; i++)
        fa_stats_alloc(FA_CALL_malloc, 100);
    return NULL;
}

static void test_four_threads_exact(void **state)
{
    (void)state;
    fa_tstats before, after;
    fa_stats_sum(&before);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, make_250, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    fa_stats_sum(&after);
    assert_int_equal(after.calls[FA_CALL_malloc] - before.calls[FA_CALL_malloc], 1000);
    assert_int_equal(after.bytes_requested - before.bytes_requested, 100000);
    assert_int_equal(after.hist[fa_hist_bucket(100)] - before.hist[fa_hist_bucket(100)], 1000);
}

static volatile int hold;
static void *count_and_wait(void *arg)
{
    (void)arg;
    fa_stats_alloc(FA_CALL_calloc, 8);
    fa_stats_free(FA_CALL_free);
    while (__atomic_load_n(&hold, __ATOMIC_ACQUIRE))
        usleep(1000);
    return NULL;
}

static void test_live_threads_counted(void **state)
{
    (void)state;
    uint64_t before = total(FA_CALL_calloc);
    hold = 1;
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, count_and_wait, NULL);
    /* Wait until all eight have counted, while they are still alive. */
    for (int spin = 0; spin < 5000 && total(FA_CALL_calloc) - before < 8; spin++)
        usleep(1000);
    assert_int_equal(total(FA_CALL_calloc) - before, 8);
    __atomic_store_n(&hold, 0, __ATOMIC_RELEASE);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(total(FA_CALL_calloc) - before, 8); /* not lost, not doubled at exit */
}

static void *one_call(void *arg)
{
    (void)arg;
    fa_stats_alloc(FA_CALL_valloc, 1);
    return NULL;
}

static void test_records_reused(void **state)
{
    (void)state;
    uint64_t before = total(FA_CALL_valloc);
    pthread_t t;
    pthread_create(&t, NULL, one_call, NULL);
    pthread_join(t, NULL);
    size_t records = fa_stats_records();
    for (int i = 0; i < 2000; i++) {
        pthread_create(&t, NULL, one_call, NULL);
        pthread_join(t, NULL);
    }
    assert_int_equal(total(FA_CALL_valloc) - before, 2001);
    assert_true(fa_stats_records() <= records + 1); /* sequential threads share records */
}

static void test_fork_child_counts_its_own(void **state)
{
    (void)state;
    for (int i = 0; i < 10; i++)
        fa_stats_alloc(FA_CALL_pvalloc, 1);
    fa_stats_fork_prepare();
    pid_t pid = fork();
    if (pid == 0) {
        fa_stats_fork_child();
        if (total(FA_CALL_pvalloc) != 0)
            _exit(1);
        for (int i = 0; i < 3; i++)
            fa_stats_alloc(FA_CALL_pvalloc, 1);
        _exit(total(FA_CALL_pvalloc) == 3 ? 0 : 2);
    }
    fa_stats_fork_parent();
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(total(FA_CALL_pvalloc) >= 10);
}

/* glibc's _Fork runs no fork handlers: the kernel zeroed the child's
 * counters at the fork, those of live threads' records, exited ones' and
 * the shared record alike. */
static void test_fork_without_handlers_counts_its_own(void **state)
{
    (void)state;
    for (int i = 0; i < 10; i++)
        fa_stats_alloc(FA_CALL_pvalloc, 1);
    fa_stats_free_shared(FA_CALL_free);
    pthread_t t;
    pthread_create(&t, NULL, one_call, NULL);
    pthread_join(t, NULL);
    pid_t pid = _Fork();
    if (pid == 0) {
        fa_tstats s;
        fa_stats_sum(&s);
        uint64_t calls = 0;
        for (int c = 0; c < FA_CALL_COUNT; c++)
            calls += s.calls[c];
        if (calls != 0 || s.bytes_requested != 0)
            _exit(1);
        for (int i = 0; i < 3; i++)
            fa_stats_alloc(FA_CALL_pvalloc, 1);
        _exit(total(FA_CALL_pvalloc) == 3 ? 0 : 2);
    }
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(total(FA_CALL_pvalloc) >= 10);
}

static void test_histogram_buckets(void **state)
{
    (void)state;
    assert_int_equal(fa_hist_bucket(0), 0);
    assert_int_equal(fa_hist_bucket(1), 1);
    assert_int_equal(fa_hist_bucket(2), 2);
    assert_int_equal(fa_hist_bucket(3), 2);
    assert_int_equal(fa_hist_bucket(4), 3);
    assert_int_equal(fa_hist_bucket(4096), 13);
    assert_int_equal(fa_hist_bucket(SIZE_MAX), FA_HIST_BUCKETS - 1);
    assert_int_equal(fa_hist_bucket((size_t)1 << 46), FA_HIST_BUCKETS - 1);
    assert_int_equal(fa_hist_bucket(((size_t)1 << 46) - 1), FA_HIST_BUCKETS - 2);
    /* The hot paths' bucket agrees below 2^46: at every power of two, one
     * below and one above it. */
    for (unsigned b = 0; b < 46; b++)
        for (size_t n = ((size_t)1 << b) - 1; n <= ((size_t)1 << b) + 1; n++)
            assert_int_equal(fa_hist_bucket_uncapped(n), fa_hist_bucket(n));
    fa_tstats before, after;
    fa_stats_sum(&before);
    fa_stats_large();
    fa_stats_sum(&after);
    assert_int_equal(after.large_allocs - before.large_allocs, 1);
}

/* The registry's slabs come from mmap: linked with --wrap=mmap, so a
 * test can make that mmap fail (ENOMEM), as a full address space would. */
static int fail_mmap;
void *__real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off);
void *__wrap_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    if (__atomic_load_n(&fail_mmap, __ATOMIC_RELAXED)) {
        errno = ENOMEM;
        return MAP_FAILED;
    }
    return __real_mmap(addr, len, prot, flags, fd, off);
}

enum { NO_SLAB_THREADS = 64 * 1024 / sizeof(fa_tstats) + 2 }; /* more than one slab holds */
static pthread_barrier_t no_slab_barrier;

static void *count_keeping_errno(void *arg)
{
    errno = 4242;
    fa_stats_alloc(FA_CALL_malloc, 16);
    fa_stats_free(FA_CALL_free);
    *(int *)arg = errno;
    pthread_barrier_wait(&no_slab_barrier); /* every record stays taken until all have counted */
    return NULL;
}

/* A thread whose record needs a new slab when mmap fails still counts
 * (into the shared record), and errno is the caller's: a successful
 * malloc or free never changes it. */
static void test_no_slab(void **state)
{
    (void)state;
    uint64_t before = total(FA_CALL_malloc);
    pthread_t t[NO_SLAB_THREADS];
    int err[NO_SLAB_THREADS];
    pthread_barrier_init(&no_slab_barrier, NULL, NO_SLAB_THREADS + 1);
    __atomic_store_n(&fail_mmap, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < NO_SLAB_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, count_keeping_errno, &err[i]), 0);
    pthread_barrier_wait(&no_slab_barrier);
    for (int i = 0; i < NO_SLAB_THREADS; i++)
        pthread_join(t[i], NULL);
    __atomic_store_n(&fail_mmap, 0, __ATOMIC_RELAXED);
    pthread_barrier_destroy(&no_slab_barrier);
    for (int i = 0; i < NO_SLAB_THREADS; i++)
        assert_int_equal(err[i], 4242);
    assert_int_equal(total(FA_CALL_malloc) - before, NO_SLAB_THREADS);
}

int main(void)
{
    fa_stats_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_four_threads_exact),  cmocka_unit_test(test_live_threads_counted),
        cmocka_unit_test(test_records_reused),       cmocka_unit_test(test_fork_child_counts_its_own),
        cmocka_unit_test(test_fork_without_handlers_counts_its_own),
        cmocka_unit_test(test_histogram_buckets),    cmocka_unit_test(test_no_slab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
