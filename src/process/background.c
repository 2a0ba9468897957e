/* background.c - the one helper thread (background.h).
 *
 * The thread sleeps on a futex word until the earliest of: the release
 * policy's next tick, the next periodic dump, the device pools' next look
 * at what they grew; with none due it sleeps until woken.  Waking costs a
 * system call only while it sleeps without a deadline or with one further
 * than WAKE_SLACK_MS away.  It holds no lock of ours while it calls into
 * tcmalloc, so tcmalloc's own fork handlers (which take every tcmalloc
 * lock) never wait on us, and fork needs nothing from it: the child simply
 * has no thread.
 *
 * With nothing due at all it exits, and the next wake starts it again: a
 * process that settled is single-threaded again, as it was (unshare(2) of
 * a user namespace, Python's warning on fork in a threaded process, a
 * program counting its threads).  Every wake bumps the word before it
 * looks at the state, and the thread leaves the state before it looks at
 * the word: either the thread sees the bump and stays, or the waker sees
 * the thread gone and starts another. */
#define _GNU_SOURCE
#include "background.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../core/log.h"
#include "../core/options.h"
#include "../core/owner.h"
#include "../device/device.h"
#include "../host/release.h"
#include "../host/served.h"
#include "../host/tcwatch.h"
#include "report.h"

extern char **environ;

enum { IDLE, STARTING, RUNNING, UNAVAILABLE };
static int state;
static unsigned word;    /* futex: bumped by every wake */
/* While it waits: its deadline (UINT64_MAX: none); 0 while awake. */
static uint64_t wake_at;
/* A wake is worth a system call when the thread would sleep longer. */
#define WAKE_SLACK_MS 100
static int stopping;     /* exit under way */
static int pausing;      /* a fork is under way: the thread leaves, none starts */
/* After a fork (in the parent, where the thread left for it), no thread
 * starts for the release policy before this (CLOCK_MONOTONIC_COARSE ms):
 * see wake(). */
static uint64_t no_start_before;
#define FORK_QUIET_MS 100
static int working;      /* inside a tick or a dump */
static pid_t thread_tid; /* the running thread's kernel id */
static uint64_t interval_ms, next_dump_ms;

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void futex_wait(unsigned seen, uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, seen, ms ? &ts : NULL, NULL, 0);
}

static void futex_wake(void)
{
    __atomic_add_fetch(&word, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static uint64_t earliest(uint64_t a, uint64_t b) { return a == 0 ? b : b == 0 ? a : a < b ? a : b; }

/* Nothing is due: leave the state IDLE for the next wake to start a new
 * thread.  False if a wake came since `seen` and this thread takes it. */
static bool retire(unsigned seen)
{
    int expect = RUNNING;
    if (!__atomic_compare_exchange_n(&state, &expect, IDLE, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        return false;
    if (__atomic_load_n(&word, __ATOMIC_SEQ_CST) == seen)
        return true;
    expect = IDLE; /* a wake came: stay for it, unless it already started a thread */
    return !__atomic_compare_exchange_n(&state, &expect, RUNNING, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

static void *thread_main(void *arg)
{
    (void)arg;
    /* Named by itself: glibc names another thread through a file in /proc,
     * which would open a descriptor in the program for a moment (one a
     * concurrent fork could carry into its child). */
    pthread_setname_np(pthread_self(), "forgealloc");
    __atomic_store_n(&thread_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    /* Running from here: a first tick that finds nothing due may retire
     * before the starter is back from pthread_create. */
    int expect = STARTING;
    __atomic_compare_exchange_n(&state, &expect, RUNNING, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    for (;;) {
        unsigned seen = __atomic_load_n(&word, __ATOMIC_ACQUIRE);
        /* working before stopping, as fa_background_stop does the reverse:
         * either it waits for this tick, or this tick sees it and stops
         * (no interval dump over the exit dump). */
        __atomic_store_n(&working, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&stopping, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(&working, 0, __ATOMIC_RELEASE);
            break;
        }
        if (__atomic_load_n(&pausing, __ATOMIC_SEQ_CST)) {
            __atomic_store_n(&working, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&state, IDLE, __ATOMIC_SEQ_CST);
            break;
        }
        uint64_t now = mono_ms();
        uint64_t next = fa_release_tick(now);
        if (fa_device_background_wanted()) {
            /* A device pool grew beyond its size: give back after its idle
             * spell, at the time it names (none: until a pool asks again). */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            next = earliest(next, fa_device_background((uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u));
        }
        if (interval_ms) {
            if (now >= next_dump_ms) {
                fa_report_configured("interval", false);
                next_dump_ms = now + interval_ms;
            }
            next = earliest(next, next_dump_ms);
        }
        __atomic_store_n(&working, 0, __ATOMIC_RELEASE);
        if (__atomic_load_n(&stopping, __ATOMIC_ACQUIRE))
            break;
        if (next == 0 && retire(seen))
            break;
        now = mono_ms();
        if (next == 0 || next > now) {
            __atomic_store_n(&wake_at, next ? next : UINT64_MAX, __ATOMIC_SEQ_CST);
            futex_wait(seen, next ? next - now : 0);
            __atomic_store_n(&wake_at, 0, __ATOMIC_RELEASE);
        }
    }
    return NULL;
}

static int start_error;      /* pthread_create's error, once it failed */
static uint64_t retry_at_ms; /* UNAVAILABLE: a wake from then on tries again */
/* A failed start (a container's pids limit reached for a moment) is tried
 * again by a wake this long after it. */
#define START_RETRY_MS 1000

static const char *start_failure(void)
{
    return start_error == EAGAIN ? "thread limit reached" : "pthread_create failed";
}

static bool start_thread(void)
{
    /* A vfork child before its exec: its thread would die with it and
     * leave the parent's state saying one runs. */
    if (!fa_owner_mine())
        return false;
    int expect = IDLE;
    if (!__atomic_compare_exchange_n(&state, &expect, STARTING, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return expect == RUNNING || expect == STARTING;
    int saved = errno;
    /* Every signal blocked, so signals reach the program's own threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 128 * 1024);
    pthread_t t;
    __atomic_store_n(&thread_tid, 0, __ATOMIC_RELEASE); /* the new thread sets its own */
    int err = pthread_create(&t, &attr, thread_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    bool first_failure = err && !start_error;
    if (err)
        start_error = err;
    if (err) {
        __atomic_store_n(&retry_at_ms, mono_ms() + START_RETRY_MS, __ATOMIC_RELAXED);
        __atomic_store_n(&state, UNAVAILABLE, __ATOMIC_RELEASE);
    } else { /* unless the thread got there first (and may have retired since) */
        expect = STARTING;
        __atomic_compare_exchange_n(&state, &expect, RUNNING, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    errno = saved;
    if (first_failure)
        fa_info("cannot start the background thread (%s); it is tried again on later calls, and meanwhile freed "
                "memory is returned on allocator calls and FORGEALLOC_STATS_INTERVAL dumps wait",
                start_failure());
    return err == 0;
}

/* start: start the thread when none runs (else only wake one that runs);
 * soon_after_fork: that start may be one within FORK_QUIET_MS of a fork. */
static bool wake_thread(bool start, bool soon_after_fork)
{
    fa_owner_adopt(); /* a child of a fork without handlers: the state says the parent's thread runs */
    if (__atomic_load_n(&stopping, __ATOMIC_ACQUIRE) || __atomic_load_n(&pausing, __ATOMIC_ACQUIRE))
        return false;
    /* The bump alone makes a wait about to begin return at once, and a
     * thread about to retire stay; the system call wakes a wait under way. */
    __atomic_add_fetch(&word, 1, __ATOMIC_SEQ_CST);
    switch (__atomic_load_n(&state, __ATOMIC_SEQ_CST)) {
    case RUNNING: {
        uint64_t at = __atomic_load_n(&wake_at, __ATOMIC_SEQ_CST);
        if (at && at > mono_ms() + WAKE_SLACK_MS)
            syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        return true;
    }
    case STARTING:
        return true;
    case UNAVAILABLE: /* started again a while after it failed */
        if (!start || mono_ms() < __atomic_load_n(&retry_at_ms, __ATOMIC_RELAXED))
            return false;
        {
            int expect = UNAVAILABLE;
            __atomic_compare_exchange_n(&state, &expect, IDLE, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        }
        return start_thread();
    default:
        if (!start)
            return false;
        /* Too soon after a fork: a later call asks again. */
        if (!soon_after_fork && mono_ms() < __atomic_load_n(&no_start_before, __ATOMIC_RELAXED))
            return false;
        return start_thread();
    }
}

/* The release policy's wake: a thread it needs only to watch free memory
 * starts no sooner than FORK_QUIET_MS after a fork, in the parent and in
 * the child alike: Python 3.12 counts the parent's threads right after
 * fork() returns, and a child that inherited free memory may unshare(2)
 * or exec before it allocates much. */
static bool wake(bool start) { return wake_thread(start, false); }

/* Periodic dumps, polling and the device pools: at once. */
bool fa_background_wake(void) { return wake_thread(true, true); }

static void want_interval(void)
{
    interval_ms = 0;
    uint64_t ms = fa_opt_u64(FA_OPT_STATS_INTERVAL);
    if (ms == 0 || getauxval(AT_SECURE))
        return; /* setuid/setgid: no file paths from the environment, and stderr is not for periodic dumps */
    if (fa_opt_u64(FA_OPT_STATS) == FA_STATS_OFF) {
        /* Stats left unset, not turned off: the interval was meant to do
         * something. */
        if (fa_opt(FA_OPT_STATS)->src == FA_SRC_DEFAULT) {
            static const char *const names[] = {"FORGEALLOC_STATS_INTERVAL", "FORGEALLOC_STATS"};
            fa_warn_tree(environ, names, 2, "FORGEALLOC_STATS_INTERVAL needs FORGEALLOC_STATS set (json, text or "
                                            "prometheus) and FORGEALLOC_STATS_FILE; periodic dumps are off");
        }
        return;
    }
    const char *path = fa_opt(FA_OPT_STATS_FILE)->s;
    if (!path || strcmp(path, "-") == 0) {
        static const char *const names[] = {"FORGEALLOC_STATS_INTERVAL", "FORGEALLOC_STATS", "FORGEALLOC_STATS_FILE"};
        fa_warn_tree(environ, names, 3, "FORGEALLOC_STATS_INTERVAL needs FORGEALLOC_STATS_FILE set to a path; "
                                        "periodic dumps are off");
        return;
    }
    interval_ms = ms;
    next_dump_ms = mono_ms() + ms;
}

/* From then on until exit: a free reaches no call of ours to start it
 * again. */
static void start_polling(void)
{
    fa_release_set_polling(true); /* before the thread's first tick */
    if (!fa_background_wake())
        fa_release_set_polling(false);
}

void fa_background_start(void)
{
    fa_release_set_waker(wake);
    fa_device_set_waker(fa_background_wake);
    /* The same tcmalloc serves malloc ahead of us (a start script preloaded
     * it first): no free reaches us, so once its heap is large enough to
     * hold free memory beyond the threshold, the thread watches tcmalloc's
     * own numbers, and the release policy still holds. */
    if (fa_host_served_by_same_tcmalloc()) {
        uint64_t threshold = fa_opt_u64(FA_OPT_RELEASE_THRESHOLD);
        fa_tcwatch_start(threshold > FA_RELEASE_MIN ? threshold : FA_RELEASE_MIN, start_polling);
    }
    want_interval();
    if (interval_ms && !fa_background_wake())
        fa_warn("cannot start the thread for FORGEALLOC_STATS_INTERVAL (%s), so periodic dumps are off; raise the "
                "process's thread limit (ulimit -u, the container's pids limit) or unset FORGEALLOC_STATS_INTERVAL",
                start_failure());
}

/* Wait up to steps x 0.1 ms for the thread to be gone: once the kernel no
 * longer knows its id (0 until a thread just created has told it). */
static void wait_gone(int steps)
{
    pid_t pid = getpid();
    for (int i = 0; i < steps; i++) {
        pid_t tid = __atomic_load_n(&thread_tid, __ATOMIC_ACQUIRE);
        if (tid > 0 && syscall(SYS_tgkill, pid, tid, 0) != 0)
            break;
        struct timespec ts = {0, 100000L};
        nanosleep(&ts, NULL);
    }
}

/* At exit: the thread leaves before the process does.  A process whose
 * helper thread is still alive at exit_group takes longer to end (800 MB
 * resident: about 20 ms more, on the machine the benchmarks run on). */
void fa_background_stop(void)
{
    __atomic_store_n(&stopping, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) != RUNNING)
        return;
    futex_wake();
    /* A release under way finishes first (at most a few milliseconds of
     * munmap); never wait long for a thread that may be stuck elsewhere. */
    for (int i = 0; i < 2000 && __atomic_load_n(&working, __ATOMIC_SEQ_CST); i++) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    int saved = errno;
    wait_gone(500);
    errno = saved;
}

/* Python 3.12 and later warn on os.fork() in a process with more than one
 * thread, and unshare(2) of a user namespace fails in one.  When the
 * thread runs only for the release policy, it leaves before the fork: the
 * process forks single-threaded (the kernel's count, /proc's, is down once
 * the thread is reaped).  The free memory it watched stays; the parent
 * starts the thread again at an allocator call FORK_QUIET_MS after the
 * fork at the earliest (Python counts threads right after fork() returns).
 * Runs before tcmalloc's prepare handler (registered first, run last), so
 * the thread can still finish a call into tcmalloc.  With periodic dumps,
 * polling or a device pool to shrink, the thread stays. */
static int left_for_fork;

void fa_background_fork_prepare(void)
{
    if (__atomic_load_n(&state, __ATOMIC_SEQ_CST) != RUNNING || interval_ms || fa_release_polling() ||
        fa_device_background_wanted())
        return;
    int saved = errno;
    __atomic_store_n(&pausing, 1, __ATOMIC_SEQ_CST);
    futex_wake();
    /* A release under way finishes first.  Never wait long for a thread
     * stuck elsewhere. */
    wait_gone(5000);
    fa_release_before_fork();
    left_for_fork = 1;
    errno = saved;
}

void fa_background_fork_parent(void)
{
    if (left_for_fork) {
        __atomic_store_n(&no_start_before, mono_ms() + FORK_QUIET_MS, __ATOMIC_RELAXED);
        left_for_fork = 0;
    }
    __atomic_store_n(&pausing, 0, __ATOMIC_SEQ_CST);
}

/* The child has no thread.  Periodic dumps go on in it, due an interval
 * after the fork. */
static void reset_child(void)
{
    pausing = 0;
    left_for_fork = 0;
    /* With periodic dumps or polling the thread runs from the fork on. */
    no_start_before = interval_ms || fa_release_polling() ? 0 : mono_ms() + FORK_QUIET_MS;
    thread_tid = 0;
    state = IDLE;
    word = 0;
    wake_at = 0;
    working = 0;
    if (interval_ms)
        next_dump_ms = mono_ms() + interval_ms;
}

/* No thread can start here: it starts at the child's next allocating
 * call. */
void fa_background_adopt(void)
{
    reset_child();
    if (interval_ms || fa_release_polling())
        fa_release_start_soon();
}

void fa_background_fork_child(void)
{
    reset_child();
    /* Periodic dumps: the thread starts now, as it does at the start of a
     * process with them, so a child that makes no allocator call (a worker
     * waiting for its first task, a child that sleeps) still writes them.
     * A child that execs soon after loses it unused: its program starts
     * its own.  Where it cannot start, start_thread says so (at
     * FORGEALLOC_LOG=info: not a line in every child of a process at its
     * thread limit). */
    if (interval_ms)
        fa_background_wake();
    /* Polling (tcmalloc serves malloc ahead of us) with a heap the parent
     * found large: no call of the child reaches us to start one later.
     * This handler runs last, after tcmalloc's (registered at its first
     * malloc) and all of ours.  With a heap still small, the watch the
     * child inherited goes on. */
    if (fa_release_polling() && !fa_background_wake())
        fa_release_set_polling(false);
}
