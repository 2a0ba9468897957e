/* stats.h - exact per-thread allocation counters.
 *
 * Each thread counts into its own record with plain stores: no lock and no
 * atomic read-modify-write.  The fast paths (host/fastpath.h) make one add
 * per count: malloc, calloc and operator new below 4 KiB add one to the
 * counter of their slot of sizes and their size to a byte total, from
 * which a snapshot derives their calls and histogram exactly; free and
 * delete step a countdown that is also their exact count.  Records live in a registry (allocated with mmap,
 * never with malloc) and are never unlinked: a thread that exits hands its
 * record, counts included, to the next new thread.  A snapshot is the sum
 * over all records plus one shared record that takes atomic adds from
 * threads past their exit destructor, so no count is ever lost or counted
 * twice. */
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

/* The bit length of n (branch-free: clz(n | 1) is defined for 0 too, and
 * 63 ^ clz is one bsr), capped at the last bucket. */
static inline unsigned fa_hist_bucket(size_t n)
{
    unsigned b = (63u ^ (unsigned)__builtin_clzll((unsigned long long)n | 1u)) + (n != 0);
    return b < FA_HIST_BUCKETS - 1 ? b : FA_HIST_BUCKETS - 1;
}

/* The numbers a snapshot shows (the sum over every record). */
typedef struct fa_host_counts {
    uint64_t calls[FA_CALL_COUNT];
    uint64_t bytes_requested; /* bytes asked of allocating calls (calloc: n*size) */
    uint64_t large_allocs;    /* allocations at or above FORGEALLOC_LARGE_ALLOC_REPORT */
    uint64_t hist[FA_HIST_BUCKETS];
} fa_host_counts;

/* malloc, calloc and operator new of up to FA_SMALL_MAX-1 bytes count one
 * counter per slot of sizes, and their size in one byte total: a slot per
 * size below FA_SMALL_MIN, then one per power of two, the histogram's own
 * buckets.  A snapshot makes their calls (the sum of the slots) and their
 * histogram exactly from the table; a kind's slots take three cache lines. */
#define FA_SMALL_MIN 16
#define FA_SMALL_MAX 4096
#define FA_SMALL_POW (FA_SMALL_MIN - 4) /* the slot of sizes 2^b to 2^(b+1)-1 (b >= 4) is FA_SMALL_POW + b */
#define FA_SMALL_SLOTS (FA_SMALL_POW + 12)
enum fa_small_kind { FA_SMALL_malloc, FA_SMALL_calloc, FA_SMALL_new, FA_SMALL_KINDS };
static const enum fa_call fa_small_call[FA_SMALL_KINDS] = {FA_CALL_malloc, FA_CALL_calloc, FA_CALL_new};
#ifndef __cplusplus
_Static_assert(FA_SMALL_MIN == 1 << 4 && FA_SMALL_MAX == 1 << 12, "sizes 2^4 to 2^12-1 take the slots by power");
#endif

/* The exponent of the power of two at or below n > 0: one `bsr`, whose
 * 64-bit result lets the compiler fold a slot's offset into the add. */
static inline size_t fa_small_log2(size_t n)
{
#if defined(__x86_64__)
    size_t b;
    __asm__("bsr %1, %0" : "=r"(b) : "rm"(n) : "cc");
    return b;
#else
    return (size_t)(63u ^ (unsigned)__builtin_clzll((unsigned long long)n));
#endif
}

/* The slot of a size n < FA_SMALL_MAX, and the smallest size of slot i. */
static inline size_t fa_small_slot(size_t n) { return n < FA_SMALL_MIN ? n : FA_SMALL_POW + fa_small_log2(n); }
static inline size_t fa_small_slot_size(size_t i)
{
    return i < FA_SMALL_MIN ? i : (size_t)1 << (i - FA_SMALL_POW);
}

/* A count that is also a countdown: frees and deletes of a thread, with a
 * look of the release policy every FA_COUNTDOWN_PERIOD-th of them, in one
 * 16-bit decrement on the fast path.  `left` is the low 16 bits of `word`
 * (little-endian), the high 48 bits count the periods begun.  A record's
 * countdown starts (fa_countdown_start) at one period begun and PERIOD-1
 * left; `left` counts down to 0, the next decrement wraps it to 0xffff,
 * and then fa_countdown_refill adds PERIOD to the whole word, which makes
 * `left` PERIOD-1 again and begins the next period.  So a single read of
 * `word` gives the exact count at any time, between the wrap and the
 * refill too (fa_countdown_count), a zeroed word (a countdown not started:
 * its record's gates are closed) counts 0, and the first look comes at the
 * PERIOD-th call, as every later one. */
#define FA_COUNTDOWN_PERIOD 256
#define FA_COUNTDOWN_START (((uint64_t)1 << 16) | (FA_COUNTDOWN_PERIOD - 1))
typedef union fa_countdown {
    uint64_t word;
    uint16_t left;
} fa_countdown;
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fa_countdown needs `left` to be the low bits of `word`"
#endif

/* Settled, `left` is below PERIOD; wrapped and not refilled yet, it is
 * 0xffff, or lower if a signal handler on the owner thread counted more
 * calls before the refill (up to PERIOD-1 of them the refill still
 * carries into the periods). */
static inline uint64_t fa_countdown_count(uint64_t word)
{
    uint64_t periods = word >> 16, left = word & 0xffff;
    if (word == 0)
        return 0;
    if (left >= FA_COUNTDOWN_PERIOD)
        return periods * FA_COUNTDOWN_PERIOD + (0x10000 - left) - 1;
    return periods * FA_COUNTDOWN_PERIOD - left - 1;
}

/* Before the first decrement of a record's countdown (a no-op after). */
static inline void fa_countdown_start(fa_countdown *c)
{
    if (__atomic_load_n(&c->word, __ATOMIC_RELAXED) == 0)
        __atomic_store_n(&c->word, FA_COUNTDOWN_START, __ATOMIC_RELAXED);
}

/* The owner's decrement: true when `left` wrapped (the call then runs
 * fa_countdown_refill).  The fast paths do the same in one instruction
 * (host/fastpath.h). */
static inline bool fa_countdown_tick(fa_countdown *c)
{
#if defined(__SANITIZE_THREAD__)
    return __atomic_fetch_sub(&c->left, 1, __ATOMIC_RELAXED) == 0;
#else
    uint16_t v = c->left;
    c->left = (uint16_t)(v - 1);
    return v == 0;
#endif
}

static inline void fa_countdown_refill(fa_countdown *c)
{
#if defined(__SANITIZE_THREAD__)
    __atomic_fetch_add(&c->word, FA_COUNTDOWN_PERIOD, __ATOMIC_RELAXED);
#else
    c->word += FA_COUNTDOWN_PERIOD;
#endif
}

/* One thread's record.  The first line is what the fast paths read: the
 * gates, which the host core sets (host.c) and which say which calls may
 * take the fast path, and the two countdowns.  A zeroed record (a new one,
 * or one the kernel wiped in a forked child) has every gate closed; before
 * it opens one, the host core calls fa_stats_ready. */
typedef struct fa_tstats {
    size_t malloc_limit;   /* malloc's fast path takes n when n - 16 < malloc_limit (unsigned); 0: closed */
    size_t new_limit;      /* the same for operator new and new[] */
    uintptr_t free_mask;   /* free's fast path takes p when p & free_mask != 0; 0: closed */
    uintptr_t delete_mask; /* the same for operator delete and delete[] */
    fa_countdown frees;    /* free calls of this record (counts.calls[free] holds none) */
    fa_countdown deletes;  /* delete calls (counts.calls[delete] holds none) */
    uint64_t small_bytes;  /* bytes of the calls counted in `small` */
    fa_host_counts counts; /* every other call, and every call of the shared record */
    uint64_t small[FA_SMALL_KINDS][FA_SMALL_SLOTS];
} __attribute__((aligned(64))) fa_tstats;
#ifndef __cplusplus
_Static_assert(offsetof(fa_tstats, counts) <= 64, "the fast paths read one line of the record");
#endif

/* The calling thread's record: fa_stats_closed (every gate closed, never
 * written) until its first counted call, and again once its exit
 * destructor has run. */
extern fa_tstats fa_stats_closed;
extern __thread fa_tstats *fa_tls_stats __attribute__((tls_model("initial-exec")));

/* Whether t is a thread's own record (not fa_stats_closed). */
static inline bool fa_stats_mine(const fa_tstats *t) { return t != &fa_stats_closed; }

/* For a thread without a record: take one (or count into the shared record
 * where the thread is past its exit destructor, or no record can be had).
 * Returns what fa_stats_free returns. */
bool fa_stats_count_slow(enum fa_call c, size_t n, bool alloc);

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

/* Count one allocating call of n bytes into the thread's own record t. */
static inline void fa_stats_alloc_into(fa_tstats *t, enum fa_call c, size_t n)
{
    FA_RELAXED_ADD(t->counts.bytes_requested, n);
    FA_RELAXED_ADD(t->counts.hist[fa_hist_bucket(n)], 1);
    FA_RELAXED_ADD(t->counts.calls[c], 1);
}

/* Start t's countdowns: the fast paths only decrement them. */
static inline void fa_stats_ready(fa_tstats *t)
{
    fa_countdown_start(&t->frees);
    fa_countdown_start(&t->deletes);
}

/* Count one malloc, calloc or operator new of n < FA_SMALL_MAX bytes into
 * t, as the fast paths do. */
static inline void fa_stats_small_into(fa_tstats *t, enum fa_small_kind k, size_t n)
{
    FA_RELAXED_ADD(t->small[k][fa_small_slot(n)], 1);
    FA_RELAXED_ADD(t->small_bytes, n);
}

/* Count one allocating call of n bytes (any thread state). */
static inline void fa_stats_alloc(enum fa_call c, size_t n)
{
    fa_tstats *t = fa_tls_stats;
    if (__builtin_expect(!fa_stats_mine(t), 0))
        fa_stats_count_slow(c, n, true);
    else
        fa_stats_alloc_into(t, c, n);
}

/* Count one free or delete (c is FA_CALL_free or FA_CALL_delete) into the
 * thread's own record t.  Returns true every FA_COUNTDOWN_PERIOD-th call of
 * the record (the release policy's look is then due: host.c). */
static inline bool fa_stats_free_into(fa_tstats *t, enum fa_call c)
{
    fa_countdown *d = c == FA_CALL_delete ? &t->deletes : &t->frees;
    fa_countdown_start(d);
    if (__builtin_expect(!fa_countdown_tick(d), 1))
        return false;
    fa_countdown_refill(d);
    return true;
}

/* Count one releasing call (free, delete; any thread state).  Returns what
 * fa_stats_free_into returns (false when counted in the shared record). */
static inline bool fa_stats_free(enum fa_call c)
{
    fa_tstats *t = fa_tls_stats;
    if (__builtin_expect(!fa_stats_mine(t), 0))
        return fa_stats_count_slow(c, 0, false);
    return fa_stats_free_into(t, c);
}

/* Count one releasing call in the shared record, without giving the
 * thread one: for frees on a thread with no record that may come after its
 * exit destructor ran (a record taken then is never handed back). */
void fa_stats_free_shared(enum fa_call c);

/* Count one large allocation (rare: the slow path only). */
void fa_stats_large(void);

/* Sum of every record plus the shared one, into *out. */
void fa_stats_sum(fa_host_counts *out);

/* fn(record, arg) for every thread record ever made (live or waiting for
 * a new thread; not the shared one), lock-free: how the host core closes
 * the gates of every thread at once. */
void fa_stats_each(void (*fn)(fa_tstats *, void *), void *arg);

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
