/* test_stats.c - per-thread counters: exact sums with live and exited
 * threads, record reuse, and fork giving the child its own counts (also a
 * fork that runs no fork handlers); the fast paths' forms of a count (the
 * per-size counters of small blocks, the countdowns of frees and deletes)
 * sum to the same numbers. */
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
    fa_host_counts s;
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
    fa_host_counts before, after;
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
        fa_host_counts s;
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
    fa_host_counts before, after;
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

enum { NO_SLAB_THREADS = 130 }; /* more than a slab's 128 records */
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

/* The countdown of frees and deletes reads as the exact count after every
 * step, the moment between the wrap and the refill included, and runs out
 * every FA_COUNTDOWN_PERIOD-th step, the first time at the PERIOD-th. */
static void test_countdown_exact(void **state)
{
    (void)state;
    fa_countdown c = {0};
    assert_int_equal(fa_countdown_count(c.word), 0);
    fa_countdown_start(&c);
    assert_int_equal(fa_countdown_count(c.word), 0);
    unsigned ran_out = 0;
    for (uint64_t i = 1; i <= 5 * FA_COUNTDOWN_PERIOD + 3; i++) {
        if (fa_countdown_tick(&c)) {
            assert_int_equal(fa_countdown_count(c.word), i); /* wrapped, not refilled yet */
            assert_int_equal(i % FA_COUNTDOWN_PERIOD, 0);
            fa_countdown_refill(&c);
            ran_out++;
        }
        assert_int_equal(fa_countdown_count(c.word), i);
    }
    assert_int_equal(ran_out, 5);
    fa_countdown_start(&c); /* started once only */
    uint64_t n = 5 * FA_COUNTDOWN_PERIOD + 3;
    assert_int_equal(fa_countdown_count(c.word), n);
    /* A signal handler on the owner thread that counts between a wrap and
     * its refill: every count in between and after stays exact. */
    while (!fa_countdown_tick(&c))
        n++;
    n++;
    for (int extra = 0; extra < 200; extra++) {
        assert_false(fa_countdown_tick(&c));
        assert_int_equal(fa_countdown_count(c.word), ++n);
    }
    fa_countdown_refill(&c);
    assert_int_equal(fa_countdown_count(c.word), n);
    assert_false(fa_countdown_tick(&c));
    assert_int_equal(fa_countdown_count(c.word), n + 1);
}

/* A zeroed record (new, or wiped in a forked child): its first look comes
 * at its 256th free, as every later one, and each kind counts apart. */
static void test_first_look_at_period(void **state)
{
    (void)state;
    static fa_tstats r;
    for (int i = 1; i < FA_COUNTDOWN_PERIOD; i++)
        assert_false(fa_stats_free_into(&r, FA_CALL_free));
    assert_true(fa_stats_free_into(&r, FA_CALL_free));
    assert_false(fa_stats_free_into(&r, FA_CALL_delete));
    assert_int_equal(fa_countdown_count(r.frees.word), FA_COUNTDOWN_PERIOD);
    assert_int_equal(fa_countdown_count(r.deletes.word), 1);
}

static void *small_and_frees(void *arg)
{
    (void)arg;
    fa_stats_alloc(FA_CALL_malloc, 24); /* takes the thread's record */
    fa_tstats *t = fa_tls_stats;
    for (size_t n = 0; n < FA_SMALL_MAX; n++) {
        fa_stats_small_into(t, FA_SMALL_malloc, n);
        fa_stats_small_into(t, FA_SMALL_new, n);
        fa_stats_small_into(t, FA_SMALL_new, n);
        fa_stats_small_into(t, FA_SMALL_calloc, n);
    }
    unsigned due = 0;
    for (int i = 0; i < 1000; i++)
        due += fa_stats_free(FA_CALL_free);
    for (int i = 0; i < 300; i++)
        due += fa_stats_free(FA_CALL_delete);
    return (void *)(uintptr_t)due;
}

/* What the fast paths count (a counter per slot of sizes and a byte total,
 * the countdowns) sums to calls, bytes and histogram as if each call had
 * been counted whole: every size below 4 KiB, of malloc, calloc and new. */
static void test_fast_forms_sum(void **state)
{
    (void)state;
    fa_host_counts before, after;
    fa_stats_sum(&before);
    pthread_t t;
    void *due;
    pthread_create(&t, NULL, small_and_frees, NULL);
    pthread_join(t, &due);
    fa_stats_sum(&after);
    uint64_t n = FA_SMALL_MAX, bytes = n * (n - 1) / 2;
    assert_int_equal(after.calls[FA_CALL_malloc] - before.calls[FA_CALL_malloc], n + 1);
    assert_int_equal(after.calls[FA_CALL_new] - before.calls[FA_CALL_new], 2 * n);
    assert_int_equal(after.calls[FA_CALL_calloc] - before.calls[FA_CALL_calloc], n);
    assert_int_equal(after.bytes_requested - before.bytes_requested, 4 * bytes + 24);
    for (unsigned b = 0; b < FA_HIST_BUCKETS; b++) {
        uint64_t want = 0;
        for (size_t k = 0; k < FA_SMALL_MAX; k++)
            want += fa_hist_bucket(k) == b ? 4 : 0;
        want += fa_hist_bucket(24) == b;
        assert_int_equal(after.hist[b] - before.hist[b], want);
    }
    assert_int_equal(after.calls[FA_CALL_free] - before.calls[FA_CALL_free], 1000);
    assert_int_equal(after.calls[FA_CALL_delete] - before.calls[FA_CALL_delete], 300);
    /* The thread's record may be an earlier thread's, its countdowns part
     * way through: 1000 frees and 300 deletes run out 3-4 and 1-2 times. */
    assert_in_range((uintptr_t)due, 4, 6);
}

/* A thread starts on the closed record, every gate shut (0), and a record
 * it takes has its gates shut until the host core opens them. */
static void *gates_of_new_thread(void *arg)
{
    (void)arg;
    fa_tstats *t = fa_tls_stats;
    if (t != &fa_stats_closed || t->malloc_limit || t->new_limit || t->free_mask || t->delete_mask)
        return (void *)1;
    fa_stats_alloc(FA_CALL_malloc, 8);
    t = fa_tls_stats;
    if (!fa_stats_mine(t))
        return (void *)2;
    t->free_mask = 4095; /* as the host core would; the next thread gets the record as it is */
    return NULL;
}

static void count_record(fa_tstats *t, void *arg)
{
    (void)t;
    ++*(unsigned *)arg;
}

static void test_closed_record_and_each(void **state)
{
    (void)state;
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, gates_of_new_thread, NULL);
    pthread_join(t, &r);
    assert_null(r);
    assert_true(fa_stats_closed.malloc_limit == 0 && fa_stats_closed.free_mask == 0);
    unsigned records = 0;
    fa_stats_each(count_record, &records);
    assert_int_equal(records, fa_stats_records()); /* every thread record, not the shared one */
}

/* A forked child's counts restart, the fast paths' forms too, and the
 * forking thread's gates close with them. */
static void test_fork_child_fast_forms(void **state)
{
    (void)state;
    fa_stats_alloc(FA_CALL_malloc, 1);
    fa_tstats *t = fa_tls_stats;
    fa_stats_small_into(t, FA_SMALL_new, 100);
    fa_stats_free(FA_CALL_delete);
    t->malloc_limit = 1000;
    fa_stats_fork_prepare();
    pid_t pid = fork();
    if (pid == 0) {
        fa_stats_fork_child();
        fa_host_counts s;
        fa_stats_sum(&s);
        _exit(s.calls[FA_CALL_new] || s.calls[FA_CALL_delete] || s.bytes_requested || t->malloc_limit ? 1 : 0);
    }
    fa_stats_fork_parent();
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(t->malloc_limit, 1000);
    t->malloc_limit = 0;
}

int main(void)
{
    fa_stats_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_four_threads_exact),  cmocka_unit_test(test_live_threads_counted),
        cmocka_unit_test(test_records_reused),       cmocka_unit_test(test_fork_child_counts_its_own),
        cmocka_unit_test(test_fork_without_handlers_counts_its_own),
        cmocka_unit_test(test_histogram_buckets),    cmocka_unit_test(test_no_slab),
        cmocka_unit_test(test_countdown_exact),      cmocka_unit_test(test_first_look_at_period),
        cmocka_unit_test(test_fast_forms_sum),
        cmocka_unit_test(test_closed_record_and_each), cmocka_unit_test(test_fork_child_fast_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
