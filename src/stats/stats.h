/* stats.h - exact per-thread allocation counters.
 *
 * Each thread counts into its own record with plain (relaxed) stores: no
 * lock and no atomic read-modify-write on the malloc fast path.  Records
 * live in a registry (allocated with mmap, never with malloc) and are never
 * unlinked: a thread that exits hands its record, counts included, to the
 * next new thread.  A snapshot is the sum over all records plus one shared
 * record that takes atomic adds from threads past their exit destructor, so
 * no count is ever lost or counted twice. */
#ifndef FA_STATS_H
#define FA_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Calls that entered the shim: the JSON keys host.calls.* (a documented interface).
 * new = every operator new/new[] variant; delete = every operator
 * delete/delete[] variant; free = free, cfree, free_sized, free_aligned_sized. */
#define FA_HOST_CALLS(X)                                                                                  \
    X(malloc) X(calloc) X(realloc) X(reallocarray) X(free) X(memalign) X(posix_memalign) X(aligned_alloc) \
    X(valloc) X(pvalloc) X(new) X(delete)

enum fa_call {
#define FA_CALL_ENUM(name) FA_CALL_##name,
    FA_HOST_CALLS(FA_CALL_ENUM)
#undef FA_CALL_ENUM
    FA_CALL_COUNT
};
extern const char *const fa_call_names[FA_CALL_COUNT];

/* Size histogram: bucket 0 counts size 0, bucket b (1..46) sizes in
 * [2^(b-1), 2^b), bucket 47 everything from 2^46 up. */
#define FA_HIST_BUCKETS 48

/* The bucket of a size below 2^46, without the cap: the bit length of n,
 * branch-free (clz(n | 1) is defined for 0 too, and 63 ^ clz is one bsr). */
static inline unsigned fa_hist_bucket_uncapped(size_t n)
{
    return (63u ^ (unsigned)__builtin_clzll((unsigned long long)n | 1u)) + (n != 0);
}

static inline unsigned fa_hist_bucket(size_t n)
{
    unsigned b = fa_hist_bucket_uncapped(n);
    return b < FA_HIST_BUCKETS - 1 ? b : FA_HIST_BUCKETS - 1;
}

typedef struct fa_tstats {
    /* Not a count: frees and deletes of this thread until the release
     * policy's next look at what small frees left (host.c); kept here, in
     * the line the free path writes anyway.  Neither summed nor zeroed. */
    unsigned char free_countdown;
    uint64_t calls[FA_CALL_COUNT];
    uint64_t bytes_requested; /* bytes asked of allocating calls (calloc: n*size) */
    uint64_t large_allocs;    /* allocations at or above FORGEALLOC_LARGE_ALLOC_REPORT */
    uint64_t hist[FA_HIST_BUCKETS];
} __attribute__((aligned(64))) fa_tstats;

/* The calling thread's record; NULL until its first counted call, and
 * again once its exit destructor has run. */
extern __thread fa_tstats *fa_tls_stats __attribute__((tls_model("initial-exec")));

void fa_stats_count_slow(enum fa_call c, size_t n, bool alloc);

/* The owner thread is the only writer of its record; snapshots read it
 * concurrently.  Aligned 64-bit stores do not tear on the targets we
 * build for, so plain adds are used (one instruction each); under
 * ThreadSanitizer they become relaxed atomics so the reads are not
 * reported as races. */
#if defined(__SANITIZE_THREAD__)
#define FA_RELAXED_ADD(field, v)                                              \
    ({                                                                        \
        __typeof__(field) fa_v_ = __atomic_load_n(&(field), __ATOMIC_RELAXED) + (v); \
        __atomic_store_n(&(field), fa_v_, __ATOMIC_RELAXED);                  \
        fa_v_;                                                                \
    })
#else
#define FA_RELAXED_ADD(field, v) ((field) += (v))
#endif

/* Count one allocating call of n bytes into the record t (not NULL).
 * Returns the thread's count of calls of this kind so far (callers use it
 * to do rare work every 2^k calls). */
static inline uint64_t fa_stats_alloc_into(fa_tstats *t, enum fa_call c, size_t n)
{
    FA_RELAXED_ADD(t->bytes_requested, n);
    FA_RELAXED_ADD(t->hist[fa_hist_bucket(n)], 1);
    return FA_RELAXED_ADD(t->calls[c], 1);
}

/* fa_stats_alloc_into for a size known to be below 2^46 (the hot paths,
 * which see only sizes below the large-allocation size): five instructions
 * fewer. */
static inline uint64_t fa_stats_alloc_small_into(fa_tstats *t, enum fa_call c, size_t n)
{
    FA_RELAXED_ADD(t->bytes_requested, n);
    FA_RELAXED_ADD(t->hist[fa_hist_bucket_uncapped(n)], 1);
    return FA_RELAXED_ADD(t->calls[c], 1);
}

/* Count one allocating call of n bytes (any thread state). */
static inline uint64_t fa_stats_alloc(enum fa_call c, size_t n)
{
    fa_tstats *t = fa_tls_stats;
    if (__builtin_expect(t == NULL, 0)) {
        fa_stats_count_slow(c, n, true);
        return 1;
    }
    return fa_stats_alloc_into(t, c, n);
}

/* Count one releasing call (free, delete). */
static inline void fa_stats_free(enum fa_call c)
{
    fa_tstats *t = fa_tls_stats;
    if (__builtin_expect(t == NULL, 0)) {
        fa_stats_count_slow(c, 0, false);
        return;
    }
    FA_RELAXED_ADD(t->calls[c], 1);
}

/* Count one releasing call in the shared record, without giving the
 * thread one: for frees on a thread with no record that may come after its
 * exit destructor ran (a record taken then is never handed back). */
void fa_stats_free_shared(enum fa_call c);

/* Count one large allocation (rare: the slow path only). */
void fa_stats_large(void);

/* Sum of every record plus the shared one, into *out. */
void fa_stats_sum(fa_tstats *out);

/* Registry lifecycle. fa_stats_init creates the thread-exit key and the
 * shared record (idempotent, called from the first counted call); the fork
 * hooks keep the registry consistent across fork and give the child
 * counters of its own.  The counters live in memory the kernel zeroes in
 * the child of any fork (MADV_WIPEONFORK): a child of a fork that runs no
 * fork handlers (_Fork, the fork or clone system call) counts its own from
 * the fork on, too. */
void fa_stats_init(void);
void fa_stats_fork_prepare(void);
void fa_stats_fork_parent(void);
void fa_stats_fork_child(void);
/* Records ever made (bounded by the peak number of live threads). */
size_t fa_stats_records(void);

#endif
