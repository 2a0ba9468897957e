/* registry.c - the per-thread record registry behind stats.h.
 *
 * Records come from mmap'd slabs, never from malloc, because they are
 * created inside malloc.  Thread exit is seen through a pthread key
 * destructor; pthread_setspecific on a key created this early uses the
 * thread's static slots and does not allocate.  If it ever did, the nested
 * malloc would count into the shared record (see `acquiring`). */
#include "stats.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

const char *const fa_call_names[FA_CALL_COUNT] = {
#define FA_CALL_NAME(name) #name,
    FA_HOST_CALLS(FA_CALL_NAME)
#undef FA_CALL_NAME
};

__thread fa_tstats *fa_tls_stats __attribute__((tls_model("initial-exec")));
/* Set once the thread's exit destructor ran, or while it is acquiring a
 * record: its calls then count atomically into `shared`. */
static __thread unsigned char tls_dead __attribute__((tls_model("initial-exec")));
static __thread unsigned char tls_acquiring __attribute__((tls_model("initial-exec")));

static fa_tstats shared;
static fa_tstats *all_records;  /* every record, newest first (atomic head) */
static fa_tstats *free_records; /* under `lock` */
static size_t record_count;     /* written under `lock`, read anywhere */
static fa_tstats *slab_next, *slab_end; /* unused part of the current slab */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t exit_key;
static int key_state; /* 0 none, 1 creating, 2 ready, 3 failed */

#define SLAB_BYTES (64 * 1024)

static void thread_exit(void *arg);

void fa_stats_init(void)
{
    int expect = 0;
    if (__atomic_load_n(&key_state, __ATOMIC_ACQUIRE) >= 2)
        return;
    if (!__atomic_compare_exchange_n(&key_state, &expect, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return; /* another thread is creating it */
    int ok = pthread_key_create(&exit_key, thread_exit) == 0;
    __atomic_store_n(&key_state, ok ? 2 : 3, __ATOMIC_RELEASE);
}

/* Pre: `lock` held.  Returns a zeroed record linked into all_records, or
 * NULL when mmap fails (the caller then counts into `shared`). */
static fa_tstats *new_record_locked(void)
{
    if (slab_next == NULL || slab_next + 1 > slab_end) {
        int saved = errno; /* a failure here is ours: the caller's malloc or free still succeeds */
        void *m = mmap(NULL, SLAB_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        errno = saved;
        if (m == MAP_FAILED)
            return NULL;
        slab_next = (fa_tstats *)m;
        slab_end = (fa_tstats *)((char *)m + SLAB_BYTES);
    }
    fa_tstats *r = slab_next++;
    r->next = __atomic_load_n(&all_records, __ATOMIC_RELAXED);
    __atomic_store_n(&all_records, r, __ATOMIC_RELEASE);
    __atomic_store_n(&record_count, record_count + 1, __ATOMIC_RELAXED);
    return r;
}

static void add_shared(enum fa_call c, size_t n, bool alloc)
{
    __atomic_fetch_add(&shared.calls[c], 1, __ATOMIC_RELAXED);
    if (alloc) {
        __atomic_fetch_add(&shared.bytes_requested, n, __ATOMIC_RELAXED);
        __atomic_fetch_add(&shared.hist[fa_hist_bucket(n)], 1, __ATOMIC_RELAXED);
    }
}

void fa_stats_free_shared(enum fa_call c) { add_shared(c, 0, false); }

void fa_stats_count_slow(enum fa_call c, size_t n, bool alloc)
{
    if (tls_dead || tls_acquiring) {
        add_shared(c, n, alloc);
        return;
    }
    tls_acquiring = 1;
    fa_stats_init();
    fa_tstats *r = NULL;
    pthread_mutex_lock(&lock);
    if (free_records) {
        r = free_records;
        free_records = r->next_free;
    } else {
        r = new_record_locked();
    }
    pthread_mutex_unlock(&lock);
    if (r && __atomic_load_n(&key_state, __ATOMIC_ACQUIRE) == 2)
        pthread_setspecific(exit_key, r);
    /* Without the key (creation failed) the record is simply never reused. */
    tls_acquiring = 0;
    if (!r) {
        add_shared(c, n, alloc);
        return;
    }
    fa_tls_stats = r;
    if (alloc)
        fa_stats_alloc(c, n);
    else
        fa_stats_free(c);
}

static void thread_exit(void *arg)
{
    fa_tstats *r = arg;
    /* Later calls on this thread (other destructors, glibc's own cleanup)
     * count into `shared`; the record and its counts go to the next thread. */
    tls_dead = 1;
    fa_tls_stats = NULL;
    pthread_mutex_lock(&lock);
    r->next_free = free_records;
    free_records = r;
    pthread_mutex_unlock(&lock);
}

void fa_stats_large(void)
{
    fa_tstats *t = fa_tls_stats;
    if (t)
        FA_RELAXED_ADD(t->large_allocs, 1);
    else
        __atomic_fetch_add(&shared.large_allocs, 1, __ATOMIC_RELAXED);
}

static void add_record(fa_tstats *out, fa_tstats *r)
{
    for (int i = 0; i < FA_CALL_COUNT; i++)
        out->calls[i] += __atomic_load_n(&r->calls[i], __ATOMIC_RELAXED);
    out->bytes_requested += __atomic_load_n(&r->bytes_requested, __ATOMIC_RELAXED);
    out->large_allocs += __atomic_load_n(&r->large_allocs, __ATOMIC_RELAXED);
    for (int i = 0; i < FA_HIST_BUCKETS; i++)
        out->hist[i] += __atomic_load_n(&r->hist[i], __ATOMIC_RELAXED);
}

void fa_stats_sum(fa_tstats *out)
{
    memset(out, 0, sizeof *out);
    /* Lock-free: safe from a signal handler that interrupted a thread
     * holding `lock`.  Records are only ever added at the head. */
    for (fa_tstats *r = __atomic_load_n(&all_records, __ATOMIC_ACQUIRE); r; r = r->next)
        add_record(out, r);
    add_record(out, &shared);
}

size_t fa_stats_records(void) { return __atomic_load_n(&record_count, __ATOMIC_RELAXED); }

void fa_stats_fork_prepare(void) { pthread_mutex_lock(&lock); }

void fa_stats_fork_parent(void) { pthread_mutex_unlock(&lock); }

static void zero_counts(fa_tstats *r)
{
    memset(r->calls, 0, sizeof r->calls);
    r->bytes_requested = 0;
    r->large_allocs = 0;
    memset(r->hist, 0, sizeof r->hist);
}

void fa_stats_fork_child(void)
{
    /* Only the forking thread lives on: every other record is free again,
     * and all counts restart so the child reports its own numbers. */
    pthread_mutex_init(&lock, NULL);
    free_records = NULL;
    for (fa_tstats *r = all_records; r; r = r->next) {
        zero_counts(r);
        if (r != fa_tls_stats) {
            r->next_free = free_records;
            free_records = r;
        }
    }
    zero_counts(&shared);
}
