/* test_release_thread.c - the release policy (release.c) and the background
 * thread (background.c) against a stand-in for tcmalloc's page heap: an
 * idle heap settles with no call from the program, a churning one keeps its
 * memory, the thread starts only when needed, stops at exit while busy,
 * and many threads can allocate and free while it runs (the sanitizer
 * builds run this too). */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"
#include "../../src/core/options.h"
#include "../../src/host/pressure.h"
#include "../../src/host/release.h"
#include "../../src/process/background.h"

#define MB ((uint64_t)1 << 20)

/* ---- a page heap: free, returned, committed and reserved bytes ---------- */

static uint64_t heap_free, heap_unmapped, heap_commit, heap_reserve, release_calls;
static int slow_release; /* ms each release takes: to catch exit mid-release */

int MallocExtension_GetNumericProperty(const char *name, size_t *value)
{
    if (strcmp(name, "tcmalloc.pageheap_free_bytes") == 0)
        *value = __atomic_load_n(&heap_free, __ATOMIC_RELAXED);
    else if (strcmp(name, "tcmalloc.pageheap_unmapped_bytes") == 0)
        *value = __atomic_load_n(&heap_unmapped, __ATOMIC_RELAXED);
    else if (strcmp(name, "tcmalloc.pageheap_total_commit_bytes") == 0)
        *value = __atomic_load_n(&heap_commit, __ATOMIC_RELAXED);
    else if (strcmp(name, "tcmalloc.pageheap_total_reserve_bytes") == 0)
        *value = __atomic_load_n(&heap_reserve, __ATOMIC_RELAXED);
    else
        return 0;
    return 1;
}

void MallocExtension_ReleaseToSystem(size_t n)
{
    __atomic_fetch_add(&release_calls, 1, __ATOMIC_RELAXED);
    int slow = __atomic_load_n(&slow_release, __ATOMIC_RELAXED);
    if (slow) {
        struct timespec ts = {0, slow * 1000000L};
        nanosleep(&ts, NULL);
    }
    uint64_t f = __atomic_load_n(&heap_free, __ATOMIC_RELAXED), take;
    do {
        take = n < f ? n : f;
    } while (!__atomic_compare_exchange_n(&heap_free, &f, f - take, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    __atomic_fetch_add(&heap_unmapped, take, __ATOMIC_RELAXED);
}

void MallocExtension_ReleaseFreeMemory(void) { MallocExtension_ReleaseToSystem(SIZE_MAX); }

/* tcmalloc's hooks (tcwatch.c): this test's tcmalloc never serves malloc
 * ahead of forgealloc, so none is ever added. */
int MallocHook_AddNewHook(void (*h)(const void *, size_t)) { return h == NULL; }
int MallocHook_RemoveNewHook(void (*h)(const void *, size_t)) { return h == NULL; }
int MallocHook_AddMmapHook(void (*h)(const void *, const void *, size_t, int, int, int, off_t)) { return h == NULL; }
int MallocHook_RemoveMmapHook(void (*h)(const void *, const void *, size_t, int, int, int, off_t)) { return h == NULL; }
int MallocHook_AddSbrkHook(void (*h)(const void *, ptrdiff_t)) { return h == NULL; }
int MallocHook_RemoveSbrkHook(void (*h)(const void *, ptrdiff_t)) { return h == NULL; }

void *tc_malloc(size_t n) /* named by served.c, never called here */
{
    (void)n;
    return NULL;
}

size_t tc_malloc_size(void *p)
{
    (void)p;
    return 0;
}

void fa_report_configured(const char *reason, bool in_signal)
{
    (void)reason;
    (void)in_signal;
}

/* The heap grows by n bytes: committed and reserved anew. */
static void grow(uint64_t n)
{
    __atomic_fetch_add(&heap_commit, n, __ATOMIC_RELAXED);
    __atomic_fetch_add(&heap_reserve, n, __ATOMIC_RELAXED);
}

/* A large allocation as host.c reports it: served from free memory, then
 * from returned memory (committed again), and the heap grows for the rest,
 * as tcmalloc's page heap does. */
static void large_alloc(uintptr_t addr, size_t n)
{
    uint64_t f = __atomic_load_n(&heap_free, __ATOMIC_RELAXED), take;
    do {
        take = n < f ? n : f;
    } while (!__atomic_compare_exchange_n(&heap_free, &f, f - take, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    uint64_t u = __atomic_load_n(&heap_unmapped, __ATOMIC_RELAXED), back;
    do {
        back = n - take < u ? n - take : u;
    } while (!__atomic_compare_exchange_n(&heap_unmapped, &u, u - back, false, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    __atomic_fetch_add(&heap_commit, back, __ATOMIC_RELAXED);
    grow(n - take - back);
    fa_release_on_alloc((void *)addr, n);
}

/* A large allocation that none of the free or returned spans fits (larger
 * than any of them): the heap grows by all of it. */
static void large_alloc_new(uintptr_t addr, size_t n)
{
    grow(n);
    fa_release_on_alloc((void *)addr, n);
}

static void large_free(uintptr_t addr)
{
    size_t n = fa_release_forget((void *)addr);
    assert_true(n > 0);
    __atomic_fetch_add(&heap_free, n, __ATOMIC_RELAXED);
    fa_release_on_free(n, true);
}

/* 50 blocks of 4 MiB allocated, then freed: 200 MB held free. */
static void hold_freed_200mb(void)
{
    for (uintptr_t i = 0; i < 50; i++)
        large_alloc((i + 1) << 36, 4 * MB);
    for (uintptr_t i = 0; i < 50; i++)
        large_free((i + 1) << 36);
}

/* Threads of this process named "forgealloc"; with `tid`, the kernel id of
 * one of them (0: none). */
static int helper_scan(pid_t *tid)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL) {
        char path[300], comm[32] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(comm, sizeof comm, f) && strcmp(comm, "forgealloc\n") == 0) {
            n++;
            if (tid)
                *tid = (pid_t)atoi(e->d_name);
        }
        fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

static int helper_threads(void) { return helper_scan(NULL); }

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* helper_threads() once it is `want` (a new thread names itself as it
 * starts), or after a second. */
static int helper_threads_become(int want)
{
    int n = helper_threads();
    for (int ms = 0; ms < 1000 && n != want; ms += 5) {
        sleep_ms(5);
        n = helper_threads();
    }
    return n;
}

static void load(const char *delay, const char *threshold)
{
    char d[64], t[64];
    snprintf(d, sizeof d, "FORGEALLOC_RELEASE_DELAY=%s", delay);
    snprintf(t, sizeof t, "FORGEALLOC_RELEASE_THRESHOLD=%s", threshold);
    char *env[] = {d, t, "FORGEALLOC_RELEASE_PRESSURE=0", NULL};
    fa_options_load(env);
}

static uint64_t released(enum fa_release_reason why)
{
    uint64_t count, bytes[FA_REL_COUNT];
    fa_release_totals(&count, bytes);
    return bytes[why];
}

/* 800 MB freed, then nothing: the thread returns it within the delay. */
static void test_idle_settles(void **state)
{
    (void)state;
    load("300ms", "32M");
    fa_background_start();
    assert_int_equal(helper_threads(), 0); /* nothing freed yet: no thread */
    for (uintptr_t i = 0; i < 200; i++)
        large_alloc((i + 1) << 32, 4 * MB);
    assert_int_equal(helper_threads(), 0);
    for (uintptr_t i = 0; i < 200; i++)
        large_free((i + 1) << 32);
    assert_int_equal(__atomic_load_n(&heap_free, __ATOMIC_RELAXED), 800 * MB);
    assert_int_equal(helper_threads_become(1), 1);
    assert_true(fa_release_in_background());
    for (int ms = 0; ms < 2000 && __atomic_load_n(&heap_free, __ATOMIC_RELAXED) > 32 * MB; ms += 20)
        sleep_ms(20);
    assert_true(released(FA_REL_delay) >= 760 * MB);
    assert_int_equal(helper_threads(), 1);
    /* Quiet for twice the delay: the threshold kept goes back too. */
    for (int ms = 0; ms < 3000 && __atomic_load_n(&heap_free, __ATOMIC_RELAXED) > 2 * MB; ms += 20)
        sleep_ms(20);
    assert_true(__atomic_load_n(&heap_free, __ATOMIC_RELAXED) <= 2 * MB);
}

/* A working set replaced piece by piece keeps its memory: no return while
 * the churn goes on for many windows. */
static void test_churn_keeps(void **state)
{
    (void)state;
    uint64_t before = released(FA_REL_delay);
    uintptr_t base = (uintptr_t)1 << 44;
    for (int i = 0; i < 16; i++)
        large_alloc(base + ((uintptr_t)i << 32), 16 * MB);
    for (int step = 0; step < 300; step++) { /* 300 x 5 ms = 5 delays */
        uintptr_t slot = base + ((uintptr_t)(step % 16) << 32);
        large_free(slot);
        large_alloc(slot, 16 * MB);
        sleep_ms(5);
    }
    assert_int_equal(released(FA_REL_delay), before);
    for (int i = 0; i < 16; i++)
        large_free(base + ((uintptr_t)i << 32));
}

/* Several threads allocate and free while the background ticks. */
static void *churner(void *arg)
{
    uintptr_t base = (uintptr_t)arg << 40;
    for (int round = 0; round < 200; round++) {
        for (uintptr_t i = 0; i < 8; i++)
            large_alloc(base + ((i + 1) << 32), (size_t)(1 + (round + i) % 8) * MB);
        for (uintptr_t i = 0; i < 8; i++)
            large_free(base + ((i + 1) << 32));
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, churner, (void *)(i + 0x100));
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    for (int ms = 0; ms < 2000 && __atomic_load_n(&heap_free, __ATOMIC_RELAXED) > 32 * MB; ms += 20)
        sleep_ms(20);
    assert_true(__atomic_load_n(&heap_free, __ATOMIC_RELAXED) <= 32 * MB);
}

/* Once nothing is held or left to judge the thread exits; the next large
 * frees start it again, whenever they come: just before it exits, while
 * it exits, or after.  A wake lost in between would leave the memory held
 * with no thread and no further call: the waits below would time out. */
static void test_retire_and_restart(void **state)
{
    (void)state;
    /* A process of its own (see main): the settings are loaded before any
     * thread runs. */
    load("100ms", "32M");
    fa_background_start();
    uintptr_t base = (uintptr_t)7 << 44;
    unsigned seed = 12345;
    int exited = 0;
    for (int round = 0; round < 10; round++) {
        /* New heap each round, never the memory returned before: the
         * rounds are no demand coming back, so the hold stays one delay
         * (a regret would stretch it past the waits below). */
        for (uintptr_t i = 0; i < 16; i++)
            large_alloc_new(base + ((i + 1) << 32), 4 * MB);
        for (uintptr_t i = 0; i < 16; i++)
            large_free(base + ((i + 1) << 32));
        int ms = 0;
        for (; ms < 5000 && __atomic_load_n(&heap_free, __ATOMIC_RELAXED) > 2 * MB; ms += 10)
            sleep_ms(10);
        assert_true(ms < 5000);
        /* The next round's frees land at a varying moment around the exit. */
        seed = seed * 1103515245u + 12345u;
        sleep_ms((long)(seed >> 16) % 2000);
        exited += helper_threads() == 0;
    }
    assert_true(exited > 0); /* some rounds found the thread gone and started it again */
    int ms = 0;
    for (; ms < 8000 && helper_threads() > 0; ms += 20)
        sleep_ms(20);
    assert_int_equal(helper_threads(), 0);
}

/* pthread_create as the thread sees it (linked with --wrap): with
 * `slow_creator` set, the creator is slow to come back, and the memory
 * freed was taken again meanwhile (by another of the program's threads), so
 * the new thread's first tick finds nothing to watch. */
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
static int slow_creator;
/* With `slow_exit` set, a thread created takes 20 ms to leave once its
 * function returned (as tcmalloc's thread cache going back can). */
static int slow_exit;
static void *(*slow_fn)(void *);

static void *slow_to_leave(void *arg)
{
    void *r = slow_fn(arg);
    sleep_ms(20);
    return r;
}

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
    if (__atomic_load_n(&slow_exit, __ATOMIC_RELAXED)) {
        slow_fn = fn;
        return __real_pthread_create(t, a, slow_to_leave, arg);
    }
    if (!__atomic_load_n(&slow_creator, __ATOMIC_RELAXED))
        return __real_pthread_create(t, a, fn, arg);
    __atomic_store_n(&heap_free, 0, __ATOMIC_RELAXED);
    int err = __real_pthread_create(t, a, fn, arg);
    sleep_ms(300);
    return err;
}

/* A thread with nothing to do from its first tick retires even while its
 * creator is still inside pthread_create; it does not sleep on with no
 * deadline, holding a thread of the program. */
static void test_retire_before_creator_returns(void **state)
{
    (void)state;
    load("300ms", "32M");
    fa_background_start();
    __atomic_store_n(&slow_creator, 1, __ATOMIC_RELAXED);
    hold_freed_200mb();
    __atomic_store_n(&slow_creator, 0, __ATOMIC_RELAXED);
    assert_int_equal(helper_threads_become(0), 0);
    /* The next frees start a thread again, and it does its work. */
    __atomic_store_n(&heap_free, 200 * MB, __ATOMIC_RELAXED);
    fa_release_on_free(200 * MB, true);
    for (int ms = 0; ms < 3000 && __atomic_load_n(&heap_free, __ATOMIC_RELAXED) > 32 * MB; ms += 20)
        sleep_ms(20);
    assert_true(__atomic_load_n(&heap_free, __ATOMIC_RELAXED) <= 32 * MB);
}

/* One cycle of a working set of n 4 MB blocks at base: allocated, freed,
 * then `sleep` ms asleep.  Returns what the delay returned meanwhile. */
static uint64_t cycle_of(uintptr_t base, uintptr_t n, long sleep)
{
    uint64_t before = released(FA_REL_delay);
    for (uintptr_t i = 0; i < n; i++)
        large_alloc(base + (i << 32), 4 * MB);
    for (uintptr_t i = 0; i < n; i++)
        large_free(base + (i << 32));
    sleep_ms(sleep);
    return released(FA_REL_delay) - before;
}

/* A program that frees a large working set, sits still a while and needs
 * it again (a text encoder moved to the host for each prompt): the first
 * cycles pay for a return, then the hold grows past the cycle and the
 * memory stays; once the cycles stop, it still goes back. */
static void test_regret_stretches_hold(void **state)
{
    (void)state;
    /* A process of its own (see main): nothing learnt yet. */
    load("300ms", "32M");
    fa_background_start();
    uintptr_t base = (uintptr_t)5 << 44;
    uint64_t hold0 = fa_release_hold_ms(), returned[8];
    for (int cycle = 0; cycle < 8; cycle++)
        returned[cycle] = cycle_of(base, 50, 900); /* 3x the 300 ms delay: quiet by the first hold */
    assert_true(returned[0] >= 150 * MB);    /* the first gap looked idle */
    assert_true(fa_release_hold_ms() > 900); /* the hold outgrew the gap */
    assert_true(fa_release_hold_ms() > hold0);
    /* One return teaches it: the hold now covers the spell (a cycle of
     * slack for a loaded machine), and nothing went back since. */
    for (int cycle = 3; cycle < 8; cycle++)
        assert_int_equal(returned[cycle], 0);
    /* The cycles stop: it all goes back after the learnt hold. */
    for (int ms = 0; ms < 15000 && __atomic_load_n(&heap_free, __ATOMIC_RELAXED) > 2 * MB; ms += 50)
        sleep_ms(50);
    assert_true(__atomic_load_n(&heap_free, __ATOMIC_RELAXED) <= 2 * MB);
    fa_background_stop();
}

/* The same after loading left a large free block behind (a model built on
 * the host, then moved to the GPU): the first return takes it together
 * with the working set, and the working set coming back is a regret
 * although it is much less than half of what went back.  So the second
 * gap already keeps it. */
static void test_regret_after_leftover(void **state)
{
    (void)state;
    load("300ms", "32M");
    fa_background_start();
    uintptr_t base = (uintptr_t)6 << 44;
    cycle_of(base, 250, 0); /* the leftover: 1,000 MB */
    uint64_t returned[6];
    for (int cycle = 0; cycle < 6; cycle++)
        returned[cycle] = cycle_of(base, 50, 900);
    assert_true(returned[0] >= 900 * MB); /* the leftover and the working set */
    for (int cycle = 1; cycle < 6; cycle++)
        assert_int_equal(returned[cycle], 0);
    fa_background_stop();
}

/* Exit while a release is under way: stop waits for it, briefly.  Alone:
 * what earlier tests taught the policy would hold the memory longer. */
static void test_stop_while_releasing(void **state)
{
    (void)state;
    load("300ms", "32M");
    fa_background_start();
    __atomic_store_n(&slow_release, 150, __ATOMIC_RELAXED);
    hold_freed_200mb();
    uint64_t calls = __atomic_load_n(&release_calls, __ATOMIC_RELAXED);
    for (int ms = 0; ms < 2000 && __atomic_load_n(&release_calls, __ATOMIC_RELAXED) == calls; ms += 1)
        sleep_ms(1);
    assert_true(__atomic_load_n(&release_calls, __ATOMIC_RELAXED) > calls); /* a release is in progress */
    fa_background_stop();
    /* After stop the thread makes no further call, and wakes are refused. */
    calls = __atomic_load_n(&release_calls, __ATOMIC_RELAXED);
    assert_false(fa_background_wake());
    sleep_ms(400);
    assert_int_equal(__atomic_load_n(&release_calls, __ATOMIC_RELAXED), calls);
    __atomic_store_n(&slow_release, 0, __ATOMIC_RELAXED);
}

/* Exit with the thread waiting for its next look, a thread slow to leave:
 * stop returns once it is gone, so the process ends on its own (a helper
 * thread still alive at exit_group makes the end of a process with much
 * memory slower).  Alone: a process whose thread is this test's. */
static void test_stop_waits_for_thread(void **state)
{
    (void)state;
    load("2s", "32M");
    fa_background_start();
    __atomic_store_n(&slow_exit, 1, __ATOMIC_RELAXED);
    hold_freed_200mb();
    assert_int_equal(helper_threads_become(1), 1);
    pid_t tid = 0;
    assert_int_equal(helper_scan(&tid), 1);
    assert_true(tid > 0);
    sleep_ms(50); /* asleep until its next look, a delay away */
    fa_background_stop();
    errno = 0;
    assert_int_equal(syscall(SYS_tgkill, getpid(), tid, 0), -1);
    assert_int_equal(errno, ESRCH);
}

/* Where no thread can run, the allocator calls run the policy: memory
 * idle for the delay goes back at the next large allocation. */
static bool no_thread(bool start) { return (void)start, false; }

static void test_no_thread_falls_back_to_calls(void **state)
{
    (void)state;
    fa_background_stop(); /* the earlier tests' thread */
    fa_release_fork_child(); /* a process of its own: no background yet */
    fa_release_set_waker(no_thread);
    uint64_t before = released(FA_REL_delay);
    uintptr_t base = (uintptr_t)3 << 44;
    for (uintptr_t i = 0; i < 50; i++)
        large_alloc(base + (i << 32), 4 * MB);
    for (uintptr_t i = 0; i < 50; i++)
        large_free(base + (i << 32));
    assert_false(fa_release_in_background());
    sleep_ms(700); /* past the 300 ms delay, with no call at all */
    assert_int_equal(released(FA_REL_delay), before);
    large_alloc(base, 1 * MB);
    assert_true(released(FA_REL_delay) > before);
    large_free(base);
}

/* A thread's large frees reach the policy in batches of at most 4 MiB (an
 * eighth of the threshold when that is less): with FORGEALLOC_RELEASE_DELAY=0
 * the return comes once the frees pass the threshold, neither before nor
 * more than a batch after; with a threshold of 0, at the first free. */
static void test_frees_seen_in_batches(void **state)
{
    (void)state;
    load("0", "32M");
    uintptr_t base = (uintptr_t)9 << 44;
    for (uintptr_t i = 0; i < 40; i++)
        large_alloc(base + (i << 32), 1 * MB);
    uint64_t calls = __atomic_load_n(&release_calls, __ATOMIC_RELAXED);
    uintptr_t i = 0;
    for (; i < 40 && __atomic_load_n(&release_calls, __ATOMIC_RELAXED) == calls; i++)
        large_free(base + (i << 32));
    assert_true(i > 32);     /* not before the threshold */
    assert_true(i <= 32 + 4); /* at most a batch late */
    while (i < 40)
        large_free(base + (i++ << 32));
    /* A small threshold batches less: an eighth of it. */
    load("0", "4M");
    for (i = 0; i < 8; i++)
        large_alloc(base + (i << 32), 1 * MB);
    calls = __atomic_load_n(&release_calls, __ATOMIC_RELAXED);
    for (i = 0; i < 8 && __atomic_load_n(&release_calls, __ATOMIC_RELAXED) == calls; i++)
        large_free(base + (i << 32));
    assert_int_equal(i, 5); /* past 4 MiB: the fifth free, not a batch later */
    while (i < 8)
        large_free(base + (i++ << 32));
    load("0", "0");
    large_alloc(base, 1 * MB);
    calls = __atomic_load_n(&release_calls, __ATOMIC_RELAXED);
    large_free(base);
    assert_true(__atomic_load_n(&release_calls, __ATOMIC_RELAXED) > calls);
}

/* Free memory that small frees left (no large free announced it) is
 * looked at from the free path: past 2 MiB the thread starts and returns
 * it once unused for the delay; below, no thread. */
static void test_small_frees_watched(void **state)
{
    (void)state;
    load("300ms", "32M");
    fa_background_start();
    __atomic_store_n(&heap_free, 1 * MB, __ATOMIC_RELAXED);
    fa_release_check_free(true);
    sleep_ms(50);
    assert_int_equal(helper_threads(), 0);
    __atomic_store_n(&heap_free, 300 * MB, __ATOMIC_RELAXED);
    fa_release_check_free(true); /* within the same tick of the coarse clock: not looked at */
    for (int ms = 0; ms < 10 && helper_threads() == 0; ms++) {
        sleep_ms(5);
        fa_release_check_free(true);
    }
    assert_int_equal(helper_threads_become(1), 1);
    for (int ms = 0; ms < 3000 && __atomic_load_n(&heap_free, __ATOMIC_RELAXED) > 2 * MB; ms += 20)
        sleep_ms(20);
    assert_true(__atomic_load_n(&heap_free, __ATOMIC_RELAXED) <= 2 * MB);
    assert_true(released(FA_REL_delay) >= 290 * MB);
}

/* A person's pace: the working set comes back after a spell 40 times the
 * delay, far past what a return was once judged over (16 delays).  The
 * first spell pays for a return, the second's demand is judged a regret
 * when it comes back, and from then on the hold covers the spell. */
static void test_regret_at_human_pace(void **state)
{
    (void)state;
    load("50ms", "32M");
    fa_background_start();
    uintptr_t base = (uintptr_t)10 << 44;
    uint64_t returned[5];
    for (int cycle = 0; cycle < 5; cycle++)
        returned[cycle] = cycle_of(base, 50, 2000);
    assert_true(returned[0] >= 150 * MB);
    assert_true(fa_release_hold_ms() >= 2000);
    for (int cycle = 2; cycle < 5; cycle++)
        assert_int_equal(returned[cycle], 0);
    fa_background_stop();
}

/* Memory the heap grew by after an idle return is new demand, not the
 * return coming back: however much of it, the hold stays as it was. */
static void test_growth_is_not_regret(void **state)
{
    (void)state;
    load("100ms", "32M");
    fa_background_start();
    uintptr_t base = (uintptr_t)11 << 44;
    assert_true(cycle_of(base, 50, 600) >= 150 * MB); /* an idle return of 200 MB */
    uint64_t hold = fa_release_hold_ms();
    /* 300 MB in one block: no returned span fits it, the heap grows. */
    large_alloc_new(base, 300 * MB);
    sleep_ms(50);
    large_free(base); /* wakes the thread: the return is judged */
    sleep_ms(50);
    assert_int_equal(fa_release_hold_ms(), hold);
    fa_background_stop();
}

/* A program whose working set is small blocks: no large call ever, its
 * allocations take 150 MB of spans from the page heap every 100 ms and
 * give them back.  The small frees' looks see the dips (the first one of
 * each freeing sees the heap still low): nothing goes back.  The ticks
 * alone would see the heap between the dips and return it each time. */
static void test_small_block_demand(void **state)
{
    (void)state;
    load("300ms", "32M");
    fa_background_start();
    for (int cycle = 0; cycle < 30; cycle++) {
        __atomic_store_n(&heap_free, 10 * MB, __ATOMIC_RELAXED); /* the spans taken */
        fa_release_check_free(true);                             /* the first frees look */
        sleep_ms(6);
        __atomic_store_n(&heap_free, 160 * MB, __ATOMIC_RELAXED); /* all given back */
        fa_release_check_free(true);
        sleep_ms(94);
    }
    assert_int_equal(released(FA_REL_delay), 0);
    /* The churn stops: the memory goes back within the busy window. */
    for (int ms = 0; ms < 5000 && __atomic_load_n(&heap_free, __ATOMIC_RELAXED) > 2 * MB; ms += 20)
        sleep_ms(20);
    assert_true(__atomic_load_n(&heap_free, __ATOMIC_RELAXED) <= 32 * MB);
    fa_background_stop();
}

/* ---- memory pressure, against a cgroup of files the test writes -------- */

static char cg_top[64];

static void cg_write(const char *name, uint64_t v)
{
    char path[128];
    snprintf(path, sizeof path, "%s/fa/%s", cg_top, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%llu\n", (unsigned long long)v);
    fclose(f);
}

/* The stand-in cgroup's files go when the process ends, the test failed or not. */
static void cg_remove(void) { fa_remove_tree(cg_top); }

/* A v2 cgroup with memory.max `limit` whose usage the test sets. */
static void cg_make(uint64_t limit)
{
    strcpy(cg_top, "/tmp/fa-cg-XXXXXX");
    assert_non_null(mkdtemp(cg_top));
    atexit(cg_remove);
    char path[128], line[256];
    snprintf(path, sizeof path, "%s/fa", cg_top);
    assert_int_equal(mkdir(path, 0700), 0);
    cg_write("memory.max", limit);
    cg_write("memory.current", 0);
    snprintf(path, sizeof path, "%s/fa/memory.stat", cg_top);
    FILE *f = fopen(path, "w");
    fputs("anon 0\ninactive_file 0\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/cgroup", cg_top);
    f = fopen(path, "w");
    fputs("0::/fa\n", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/mountinfo", cg_top);
    f = fopen(path, "w");
    snprintf(line, sizeof line, "30 1 0:26 / %s rw - cgroup2 cgroup2 rw\n", cg_top);
    fputs(line, f);
    fclose(f);
    static char cg[96], mi[96]; /* read at the policy's looks, long after this returns */
    snprintf(cg, sizeof cg, "%s/cgroup", cg_top);
    snprintf(mi, sizeof mi, "%s/mountinfo", cg_top);
    fa_pressure_use_sources(cg, mi);
}

/* What the cgroup is charged: the live bytes plus what the heap holds
 * committed (free bytes included: they are resident). */
static uint64_t cg_live;
static void cg_charge(uint64_t in_use)
{
    cg_write("memory.current", cg_live + in_use + __atomic_load_n(&heap_free, __ATOMIC_RELAXED));
}

static void load_pressure(const char *delay)
{
    char d[64];
    snprintf(d, sizeof d, "FORGEALLOC_RELEASE_DELAY=%s", delay);
    char *env[] = {d, "FORGEALLOC_RELEASE_THRESHOLD=32M", "FORGEALLOC_RELEASE_PRESSURE=1", NULL};
    fa_options_load(env);
}

/* A job with 6.5 GiB live under an 8 GiB limit and 600 MiB of transient
 * buffers per step: the buffers fit, so they are not returned and faulted
 * in again on every step (the free memory held is more than half the room
 * left, which once returned all of it at every look).  Then a model
 * unloaded: 1 GiB more free, more than the steps take, and it goes back at
 * once.  Then something else takes the last of the room: all of it goes. */
static void test_pressure_keeps_demand(void **state)
{
    (void)state;
    load_pressure("2s");
    cg_make((uint64_t)8 << 30);
    cg_live = (uint64_t)6656 << 20;
    cg_charge(0);
    fa_background_start();
    uintptr_t base = (uintptr_t)12 << 44;
    for (int step = 0; step < 60; step++) { /* 60 x 25 ms: 15 looks at 100 ms */
        for (uintptr_t i = 0; i < 150; i++)
            large_alloc(base + (i << 32), 4 * MB);
        cg_charge(600 * MB);
        sleep_ms(5);
        for (uintptr_t i = 0; i < 150; i++)
            large_free(base + (i << 32));
        cg_charge(0);
        sleep_ms(20);
    }
    /* At most the first step's buffers: the heap grew for them, which
     * shows no demand until they are taken again. */
    assert_true(released(FA_REL_pressure) <= 600 * MB);
    assert_true(__atomic_load_n(&heap_free, __ATOMIC_RELAXED) >= 590 * MB);
    /* The unload: 1 GiB more free; within a few looks it is back. */
    uint64_t before = released(FA_REL_pressure);
    cg_live -= 1024 * MB;
    __atomic_fetch_add(&heap_free, 1024 * MB, __ATOMIC_RELAXED);
    cg_charge(0);
    fa_release_on_free(1024 * MB, true);
    for (int ms = 0; ms < 1000 && released(FA_REL_pressure) - before < 1000 * MB; ms += 10)
        sleep_ms(10);
    assert_true(released(FA_REL_pressure) - before >= 1000 * MB);
    assert_true(__atomic_load_n(&heap_free, __ATOMIC_RELAXED) >= 590 * MB); /* the steps' share stays */
    /* Another process takes the room down to less than a quarter of what
     * is held: everything goes. */
    cg_live = ((uint64_t)8 << 30) - __atomic_load_n(&heap_free, __ATOMIC_RELAXED) - 100 * MB;
    cg_charge(0);
    for (int ms = 0; ms < 1000 && __atomic_load_n(&heap_free, __ATOMIC_RELAXED) > 2 * MB; ms += 10)
        sleep_ms(10);
    assert_true(__atomic_load_n(&heap_free, __ATOMIC_RELAXED) <= 2 * MB);
    fa_background_stop();
}

/* Tests whose state must be the process's own (what the policy learnt,
 * whether a thread ever ran, the settings loaded before any thread) run
 * alone, by name: `test_release_thread learn` and so on. */
static const struct CMUnitTest alone[] = {
    cmocka_unit_test(test_regret_stretches_hold),       /* learn */
    cmocka_unit_test(test_regret_after_leftover),       /* leftover */
    cmocka_unit_test(test_retire_and_restart),          /* retire */
    cmocka_unit_test(test_small_frees_watched),         /* small */
    cmocka_unit_test(test_frees_seen_in_batches),       /* batch */
    cmocka_unit_test(test_retire_before_creator_returns), /* starting */
    cmocka_unit_test(test_stop_while_releasing),        /* stop */
    cmocka_unit_test(test_stop_waits_for_thread),       /* exit */
    cmocka_unit_test(test_regret_at_human_pace),        /* pace */
    cmocka_unit_test(test_growth_is_not_regret),        /* growth */
    cmocka_unit_test(test_small_block_demand),          /* smalldemand */
    cmocka_unit_test(test_pressure_keeps_demand),       /* pressure */
};
static const char *const alone_names[] = {"learn", "leftover", "retire", "small", "batch", "starting", "stop",
                                          "exit", "pace", "growth", "smalldemand", "pressure"};
_Static_assert(sizeof alone / sizeof alone[0] == sizeof alone_names / sizeof alone_names[0], "a name per test");

int main(int argc, char **argv)
{
    for (size_t i = 0; argc > 1 && i < sizeof alone / sizeof alone[0]; i++)
        if (strcmp(argv[1], alone_names[i]) == 0)
            return _cmocka_run_group_tests(alone_names[i], &alone[i], 1, NULL, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_settles),
        cmocka_unit_test(test_churn_keeps),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_no_thread_falls_back_to_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
