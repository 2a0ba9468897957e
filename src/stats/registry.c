/* registry.c - the per-thread record registry behind stats.h.
 *
 * Records come from mmap'd slabs, never from malloc, because they are
 * created inside malloc.  Thread exit is seen through a pthread key
 * destructor; pthread_setspecific on a key created this early uses the
 * thread's static slots and does not allocate.  If it ever did, the nested
 * malloc would count into the shared record (see `acquiring`).
 *
 * A slab holds the counters of SLAB_RECORDS records in pages the kernel
 * zeroes in the child of any fork (MADV_WIPEONFORK), and after them one
 * node per record that it copies: the links that chain every record and
 * the free ones, which the child needs as they were.  So a child's counts
 * start at zero at the fork itself, also where no fork handler runs (and a
 * zeroed record has its gates closed: the thread's next call reopens them).
 * A record is about 1 KiB, most of it the counters of small sizes. */
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

fa_tstats fa_stats_closed;
__thread fa_tstats *fa_tls_stats __attribute__((tls_model("initial-exec"))) = &fa_stats_closed;
/* Set once the thread's exit destructor ran, or while it is acquiring a
 * record: its calls then count atomically into `shared`. */
static __thread unsigned char tls_dead __attribute__((tls_model("initial-exec")));
static __thread unsigned char tls_acquiring __attribute__((tls_model("initial-exec")));

/* A record's links, beside its counters. */
typedef struct node {
    fa_tstats *counts;
    struct node *next;      /* every record ever made, never unlinked */
    struct node *next_free; /* the records waiting for a new thread */
    bool slab_first;        /* counts is the start of its slab */
} node;

#define SLAB_RECORDS 128
#define COUNTS_BYTES (SLAB_RECORDS * sizeof(fa_tstats)) /* whole pages: wiped on fork */
#define SLAB_BYTES (COUNTS_BYTES + SLAB_RECORDS * sizeof(node))
_Static_assert(COUNTS_BYTES % 4096 == 0, "the wiped counters end on a page");

/* Where no slab can be had, and until fa_stats_init: `shared` is this. */
static fa_host_counts shared_static;
static fa_host_counts *shared = &shared_static;
static node *shared_node; /* the slab record `shared` is part of, once it is */
static node *all_records;  /* newest first (atomic head) */
static node *free_records; /* under `lock` */
static size_t record_count; /* written under `lock`, read anywhere */
static char *slab;          /* the current slab */
static unsigned slab_used;  /* records taken from it */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t exit_key;
static int key_state; /* 0 none, 1 creating, 2 ready, 3 failed */

static void thread_exit(void *arg);

/* Pre: `lock` held, or no other thread can be here (fa_stats_init's
 * creator).  A new record (counters zero) linked into all_records, or NULL
 * when mmap fails (the caller then counts into `shared`).  Where the
 * kernel does not wipe memory on fork (before Linux 4.14) the counters are
 * only zeroed by the fork handler. */
static node *new_record_locked(void)
{
    if (slab == NULL || slab_used == SLAB_RECORDS) {
        int saved = errno; /* a failure here is ours: the caller's malloc or free still succeeds */
        void *m = mmap(NULL, SLAB_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED)
            madvise(m, COUNTS_BYTES, MADV_WIPEONFORK);
        errno = saved;
        if (m == MAP_FAILED)
            return NULL;
        slab = m;
        slab_used = 0;
    }
    node *n = (node *)(slab + COUNTS_BYTES) + slab_used;
    n->counts = (fa_tstats *)slab + slab_used;
    n->slab_first = slab_used == 0;
    slab_used++;
    n->next = __atomic_load_n(&all_records, __ATOMIC_RELAXED);
    __atomic_store_n(&all_records, n, __ATOMIC_RELEASE);
    __atomic_store_n(&record_count, record_count + 1, __ATOMIC_RELAXED);
    return n;
}

void fa_stats_init(void)
{
    int expect = 0;
    if (__atomic_load_n(&key_state, __ATOMIC_ACQUIRE) >= 2)
        return;
    if (!__atomic_compare_exchange_n(&key_state, &expect, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return; /* another thread is creating it */
    /* The shared record is a slab's too (wiped on fork), kept off the
     * free list; what was counted into the static one stays counted. */
    pthread_mutex_lock(&lock);
    node *n = new_record_locked();
    if (n) {
        shared_node = n;
        __atomic_store_n(&shared, &n->counts->counts, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
    int ok = pthread_key_create(&exit_key, thread_exit) == 0;
    __atomic_store_n(&key_state, ok ? 2 : 3, __ATOMIC_RELEASE);
}

static void add_shared(enum fa_call c, size_t n, bool alloc)
{
    fa_host_counts *s = __atomic_load_n(&shared, __ATOMIC_ACQUIRE);
    __atomic_fetch_add(&s->calls[c], 1, __ATOMIC_RELAXED);
    if (alloc) {
        __atomic_fetch_add(&s->bytes_requested, n, __ATOMIC_RELAXED);
        __atomic_fetch_add(&s->hist[fa_hist_bucket(n)], 1, __ATOMIC_RELAXED);
    }
}

void fa_stats_free_shared(enum fa_call c) { add_shared(c, 0, false); }

bool fa_stats_count_slow(enum fa_call c, size_t n, bool alloc)
{
    if (tls_dead || tls_acquiring) {
        add_shared(c, n, alloc);
        return false;
    }
    tls_acquiring = 1;
    fa_stats_init();
    node *r = NULL;
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
        return false;
    }
    fa_tls_stats = r->counts;
    if (!alloc)
        return fa_stats_free_into(r->counts, c);
    fa_stats_alloc_into(r->counts, c, n);
    return false;
}

static void thread_exit(void *arg)
{
    node *r = arg;
    /* Later calls on this thread (other destructors, glibc's own cleanup)
     * count into `shared`; the record and its counts go to the next thread. */
    tls_dead = 1;
    fa_tls_stats = &fa_stats_closed;
    pthread_mutex_lock(&lock);
    r->next_free = free_records;
    free_records = r;
    pthread_mutex_unlock(&lock);
}

void fa_stats_large(void)
{
    fa_tstats *t = fa_tls_stats;
    if (fa_stats_mine(t))
        FA_RELAXED_ADD(t->counts.large_allocs, 1);
    else
        __atomic_fetch_add(&__atomic_load_n(&shared, __ATOMIC_ACQUIRE)->large_allocs, 1, __ATOMIC_RELAXED);
}

static void add_counts(fa_host_counts *out, const fa_host_counts *c)
{
    for (int i = 0; i < FA_CALL_COUNT; i++)
        out->calls[i] += __atomic_load_n(&c->calls[i], __ATOMIC_RELAXED);
    out->bytes_requested += __atomic_load_n(&c->bytes_requested, __ATOMIC_RELAXED);
    out->large_allocs += __atomic_load_n(&c->large_allocs, __ATOMIC_RELAXED);
    for (int i = 0; i < FA_HIST_BUCKETS; i++)
        out->hist[i] += __atomic_load_n(&c->hist[i], __ATOMIC_RELAXED);
}

/* A thread record: its other counts, its countdowns, and its slots of
 * small sizes, which make calls and histogram. */
static void add_record(fa_host_counts *out, const fa_tstats *r)
{
    add_counts(out, &r->counts);
    out->calls[FA_CALL_free] += fa_countdown_count(__atomic_load_n(&r->frees.word, __ATOMIC_RELAXED));
    out->calls[FA_CALL_delete] += fa_countdown_count(__atomic_load_n(&r->deletes.word, __ATOMIC_RELAXED));
    out->bytes_requested += __atomic_load_n(&r->small_bytes, __ATOMIC_RELAXED);
    for (int k = 0; k < FA_SMALL_KINDS; k++) {
        for (size_t i = 0; i < FA_SMALL_SLOTS; i++) {
            uint64_t v = __atomic_load_n(&r->small[k][i], __ATOMIC_RELAXED);
            out->calls[fa_small_call[k]] += v;
            out->hist[fa_hist_bucket(fa_small_slot_size(i))] += v;
        }
    }
}

void fa_stats_sum(fa_host_counts *out)
{
    memset(out, 0, sizeof *out);
    /* Lock-free: safe from a signal handler that interrupted a thread
     * holding `lock`.  Records are only ever added at the head. */
    for (node *r = __atomic_load_n(&all_records, __ATOMIC_ACQUIRE); r; r = r->next)
        add_record(out, r->counts); /* `shared` among them, once it is a slab's */
    add_counts(out, &shared_static);
}

void fa_stats_each(void (*fn)(fa_tstats *, void *), void *arg)
{
    node *skip = __atomic_load_n(&shared, __ATOMIC_ACQUIRE) != &shared_static ? shared_node : NULL;
    for (node *r = __atomic_load_n(&all_records, __ATOMIC_ACQUIRE); r; r = r->next)
        if (r != skip)
            fn(r->counts, arg);
}

size_t fa_stats_records(void)
{
    size_t n = __atomic_load_n(&record_count, __ATOMIC_RELAXED);
    return __atomic_load_n(&shared, __ATOMIC_RELAXED) != &shared_static ? n - 1 : n; /* threads' records only */
}

void fa_stats_fork_prepare(void) { pthread_mutex_lock(&lock); }

void fa_stats_fork_parent(void) { pthread_mutex_unlock(&lock); }

void fa_stats_fork_child(void)
{
    /* Only the forking thread lives on: every other record is free again,
     * and all counts restart so the child reports its own numbers.  Each
     * slab's counters are dropped whole (they read as zeros again), which
     * the kernel did already where it wipes them at the fork; the gates of
     * the forking thread's record close with them. */
    pthread_mutex_init(&lock, NULL);
    free_records = NULL;
    for (node *r = all_records; r; r = r->next) {
        if (r->slab_first) {
            int saved = errno;
            if (madvise(r->counts, COUNTS_BYTES, MADV_DONTNEED) != 0)
                memset(r->counts, 0, COUNTS_BYTES);
            errno = saved;
        }
        if (r->counts != fa_tls_stats && r != shared_node) {
            r->next_free = free_records;
            free_records = r;
        }
    }
    memset(&shared_static, 0, sizeof shared_static);
}
