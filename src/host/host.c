/* host.c - the host-memory core (see host.h).
 *
 * Fast path of every allocating call: count into the thread's record,
 * compare the size with one threshold (`slow_size`, covering large-
 * allocation reports, the release policy and, while it is still 0,
 * first-use initialisation ahead of tcmalloc's start), then tail-call
 * tcmalloc.  Nothing is kept across the tcmalloc call, so the shim adds no
 * stack frame to it.  Only tc_* functions are called, never malloc, so it
 * does not matter which definition wins symbol lookup.
 *
 * Compiled with -fexceptions: std::bad_alloc thrown by tc_new passes
 * through these frames to the caller of operator new. */
#define _GNU_SOURCE
#include "host.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <gperftools/malloc_extension_c.h>
#include <gperftools/tcmalloc.h>
#include <gnu/libc-version.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../core/log.h"
#include "../core/options.h"
#include "../core/owner.h"
#include "../core/sys.h"
#include "../core/fmt.h"
#include "../stats/snapshot.h"
#include "../stats/stats.h"
#include "fastpath.h"
#include "grown.h"
#include "loader.h"
#include "release.h"
#include "served.h"
#include "startfill.h"
#include "tcprop.h"
#include "zeropages.h"

/* tcmalloc's C++ entry points (gperftools/tcmalloc.h declares them for C++
 * only), with their C ABI: std::align_val_t is a size_t and a
 * const std::nothrow_t& a pointer. */
void *tc_new(size_t size);
void *tc_new_aligned(size_t size, size_t align);
void tc_delete(void *p);
void tc_delete_sized(void *p, size_t size);
void tc_delete_aligned(void *p, size_t align);
void tc_delete_sized_aligned(void *p, size_t size, size_t align);

/* tcmalloc's release-rate flag.  TCMALLOC_RELEASE_RATE is read once, at
 * load, but the flag is re-read at every scavenge, so writing it takes
 * effect at once (gperftools 2.10 has no API for it).  Weak:
 * another tcmalloc build without the symbol leaves it NULL. */
extern double fa_tc_release_rate __asm__(
    "_ZN62FLAG__namespace_do_not_use_directly_use_DECLARE_double_instead27FLAGS_tcmalloc_release_rateE")
    __attribute__((weak));

/* glibc aligns every block to 16 bytes; tcmalloc's smallest size class
 * (up to 8 bytes) only to 8.  Such a request takes the next class, which
 * costs 16 bytes where glibc takes 32, and a sized delete names the same
 * class (tcmalloc takes the size as the hint of the class). */
static inline size_t tc_size(size_t n) { return n < FA_FAST_MIN ? FA_FAST_MIN : n; }

/* 0 until initialised: every call then takes the slow path, which loads
 * the settings.  Afterwards min(report threshold, FA_RELEASE_MIN). */
static size_t slow_size;
static size_t slow_size_set; /* slow_size as the settings make it */
static int soon_due;          /* slow_size is 1 until an allocation runs fa_release_nudge */
static size_t report_size; /* 0 = reports off */
static struct timespec start_time;
#ifndef CALLOC_SPARSE_MIN
#define CALLOC_SPARSE_MIN ((size_t)4 << 20)
#endif
/* Large callocs clear only the pages that hold something: 0 when turned off
 * or when tcmalloc's heap may not be private anonymous memory (its hugetlbfs
 * allocator). */
static size_t calloc_sparse_min;

static void host_init(void)
{
    (void)fa_opt(FA_OPT_LOG); /* loads every setting */
    fa_stats_init();
    if (start_time.tv_sec == 0)
        clock_gettime(CLOCK_MONOTONIC, &start_time);
    const char *memfs = getenv("TCMALLOC_MEMFS_MALLOC_PATH");
    calloc_sparse_min = (memfs && *memfs) || !fa_opt_u64(FA_OPT_SPARSE_CALLOC) ? 0 : CALLOC_SPARSE_MIN;
    uint64_t r = fa_opt_u64(FA_OPT_LARGE_ALLOC_REPORT);
    report_size = (size_t)r;
    size_t s = FA_RELEASE_MIN;
    if (r && r < s)
        s = (size_t)r;
    __atomic_store_n(&slow_size_set, s, __ATOMIC_RELAXED);
    __atomic_store_n(&slow_size, s, __ATOMIC_RELEASE);
}

/* The release policy's hook (fa_release_set_soon): every allocation takes
 * the slow path until one, not made by the dynamic loader, nudges the
 * policy (starts its thread). */
static void gates_close_alloc(void);

static void host_soon(void)
{
    if (__atomic_load_n(&slow_size, __ATOMIC_ACQUIRE) == 0)
        return; /* not initialised: the first call runs host_init anyway */
    __atomic_store_n(&soon_due, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&slow_size, 1, __ATOMIC_RELEASE);
    gates_close_alloc();
}

static __attribute__((noinline)) void soon_run(void *caller)
{
    if (fa_from_loader(caller) || !__atomic_exchange_n(&soon_due, 0, __ATOMIC_ACQ_REL))
        return;
    __atomic_store_n(&slow_size, __atomic_load_n(&slow_size_set, __ATOMIC_RELAXED), __ATOMIC_RELEASE);
    fa_release_nudge();
}

/* The process's first allocating call, ahead of tcmalloc's start: that
 * start clears its page map through fa_start_fill (startfill.h) until the
 * constructor (fa_host_start) puts tcmalloc's memset back. */
static __attribute__((noinline)) void host_first_use(void)
{
    static bool fill_begun;
    if (!__atomic_exchange_n(&fill_begun, true, __ATOMIC_ACQ_REL))
        fa_start_fill_begin((const void *)tc_malloc);
    host_init();
}

/* ---- the gates of the fast paths (fastpath.h) -------------------------------
 *
 * Each thread's record says which of its calls may take a fast path: a
 * malloc or operator new of n bytes when n - 16 < its limit (16 bytes up
 * to the smaller of 4 KiB and slow_size), a free or delete of p when
 * p & its mask is not 0.  The mask is ~0 (only NULL goes out of line)
 * until the first large block, then 4095 (page-aligned blocks go out of
 * line too: large ones start on a page).  0 closes a gate: a thread's
 * record starts so, and the kernel zeroes it in a forked child.  A thread
 * opens its own gates on its out-of-line path; what closes them for all
 * threads at once (the release policy's `soon`, the first large block, the
 * C++ forms left to the program) changes a flag, then walks every record.
 * Opening stores, then reads the flags again after a full fence, and
 * closing sets its flag, then walks after a full fence: each sees the
 * other's stores, so no thread keeps a gate open that was closed. */
static int gate_large;    /* a large block may exist: page-aligned frees go out of line */
static int gate_cxx_shut; /* operator new and delete go out of line (override_cxx.cc) */

#define MASK_SMALL (~(uintptr_t)0)
#define MASK_LARGE ((uintptr_t)4095)

/* The gates as the flags make them now. */
static void gates_now(size_t *limit, uintptr_t *mask, bool *cxx)
{
    size_t s = __atomic_load_n(&slow_size, __ATOMIC_RELAXED); /* 0 and 1 (soon) close */
    size_t top = s < FA_SMALL_MAX ? s : FA_SMALL_MAX;
    *limit = top > FA_FAST_MIN ? top - FA_FAST_MIN : 0;
    *mask = __atomic_load_n(&gate_large, __ATOMIC_RELAXED) ? MASK_LARGE : MASK_SMALL;
    *cxx = !__atomic_load_n(&gate_cxx_shut, __ATOMIC_RELAXED);
}

static void gates_store(fa_tstats *t, size_t limit, uintptr_t mask, bool cxx)
{
    __atomic_store_n(&t->malloc_limit, limit, __ATOMIC_RELAXED);
    __atomic_store_n(&t->new_limit, cxx ? limit : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&t->free_mask, mask, __ATOMIC_RELAXED);
    __atomic_store_n(&t->delete_mask, cxx ? mask : 0, __ATOMIC_RELAXED);
}

/* The calling thread's own record t: open its gates as far as the flags
 * allow (nothing before host_init).  A record the kernel zeroed at a fork
 * that ran no fork handlers comes here at the child's first call: the
 * child takes the state over now (owner.h). */
static void gates_open(fa_tstats *t)
{
    if (!fa_stats_mine(t) || __atomic_load_n(&slow_size, __ATOMIC_ACQUIRE) == 0)
        return;
    fa_owner_adopt();
    size_t limit;
    uintptr_t mask;
    bool cxx;
    fa_stats_ready(t);
    gates_now(&limit, &mask, &cxx);
    gates_store(t, limit, mask, cxx);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    size_t limit2;
    uintptr_t mask2;
    bool cxx2;
    gates_now(&limit2, &mask2, &cxx2);
    if (limit2 != limit || mask2 != mask || cxx2 != cxx)
        gates_store(t, limit2 < limit ? limit2 : limit, mask2 != mask ? MASK_LARGE : mask, cxx && cxx2);
}

/* The thread's own record, if its gates are closed (its first call, or a
 * forked child whose records the kernel zeroed): open them. */
static inline void gates_check(fa_tstats *t)
{
    if (__builtin_expect(fa_stats_mine(t) && (t->free_mask == 0 || t->malloc_limit == 0), 0))
        gates_open(t);
}

static void close_alloc(fa_tstats *t, void *arg)
{
    (void)arg;
    __atomic_store_n(&t->malloc_limit, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&t->new_limit, 0, __ATOMIC_RELAXED);
}

static void close_cxx(fa_tstats *t, void *arg)
{
    (void)arg;
    __atomic_store_n(&t->new_limit, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&t->delete_mask, 0, __ATOMIC_RELAXED);
}

/* An open mask of small blocks becomes the mask of large ones; a closed
 * one stays closed. */
static void mask_large(fa_tstats *t, void *arg)
{
    (void)arg;
    uintptr_t *masks[2] = {&t->free_mask, &t->delete_mask};
    for (int i = 0; i < 2; i++) {
        uintptr_t m = MASK_SMALL;
        __atomic_compare_exchange_n(masks[i], &m, MASK_LARGE, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    }
}

/* After slow_size fell to 1 (soon): every malloc and new goes out of line. */
static void gates_close_alloc(void)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    fa_stats_each(close_alloc, NULL);
}

/* Before the first large block is handed out: from then on, a free of a
 * page-aligned block goes out of line in every thread. */
static void gates_large(void)
{
    if (__atomic_load_n(&gate_large, __ATOMIC_ACQUIRE) || __atomic_exchange_n(&gate_large, 1, __ATOMIC_ACQ_REL))
        return;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    fa_stats_each(mask_large, NULL);
}

void fa_host_cxx_gates(bool open)
{
    __atomic_store_n(&gate_cxx_shut, !open, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (!open)
        fa_stats_each(close_cxx, NULL);
}

/* Before the first call into tcmalloc of every allocating path. */
#define HOST_READY()                                   \
    do {                                               \
        if (__builtin_expect(slow_size == 0, 0))       \
            host_first_use();                          \
    } while (0)

/* ---- large allocations -------------------------------------------------- */

static uint64_t report_tokens_ms; /* token bucket: one report per second, bursts of 5 */
static uint64_t reports_suppressed;

static uint64_t now_ms(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static bool report_allowed(void)
{
    const uint64_t period = 1000, burst = 5 * period;
    uint64_t now = now_ms(CLOCK_MONOTONIC_COARSE) + burst; /* +burst: the first ones pass */
    uint64_t t = __atomic_load_n(&report_tokens_ms, __ATOMIC_RELAXED);
    for (;;) {
        uint64_t base = t + burst < now ? now - burst : t; /* refill, capped at the burst */
        if (base + period > now)
            return false;
        if (__atomic_compare_exchange_n(&report_tokens_ms, &t, base + period, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return true;
    }
}

static void report_large(size_t n, const char *fn, void *caller)
{
    fa_stats_large();
    if (!fa_log_enabled(FA_LOG_WARN))
        return;
    if (!report_allowed()) {
        __atomic_fetch_add(&reports_suppressed, 1, __ATOMIC_RELAXED);
        return;
    }
    char where[400], size[32], sup[64];
    fa_buf w, sz, su;
    fa_buf_init(&w, where, sizeof where);
    fa_buf_init(&sz, size, sizeof size);
    fa_buf_init(&su, sup, sizeof sup);
    fa_buf_bytes(&sz, n);
    Dl_info info;
    if (caller && dladdr(caller, &info) && info.dli_fname) {
        fa_buf_printf(&w, "%s+0x%lx", info.dli_fname, (unsigned long)((char *)caller - (char *)info.dli_fbase));
        if (info.dli_sname)
            fa_buf_printf(&w, " (%s+0x%lx)", info.dli_sname,
                          (unsigned long)((char *)caller - (char *)info.dli_saddr));
    } else {
        fa_buf_printf(&w, "%p", caller);
    }
    uint64_t missed = __atomic_exchange_n(&reports_suppressed, 0, __ATOMIC_RELAXED);
    if (missed)
        fa_buf_printf(&su, "; %llu earlier reports suppressed", (unsigned long long)missed);
    fa_warn("large allocation of %s (%zu bytes) by %s from %s%s; FORGEALLOC_LARGE_ALLOC_REPORT sets the threshold "
            "(0 = off)",
            size, n, fn, where, sup);
}

void fa_host_stop(void)
{
    uint64_t missed = __atomic_exchange_n(&reports_suppressed, 0, __ATOMIC_RELAXED);
    if (!missed || !fa_log_enabled(FA_LOG_WARN))
        return;
    char size[32];
    fa_buf sz;
    fa_buf_init(&sz, size, sizeof size);
    fa_buf_bytes(&sz, fa_opt_u64(FA_OPT_LARGE_ALLOC_REPORT));
    fa_warn("%llu more large allocations of %s or more were not reported (at most 5 lines a second); "
            "host.large_allocs in the stats dump (FORGEALLOC_STATS) counts them all",
            (unsigned long long)missed, size);
}

/* The rare end of an allocating call (n >= slow_size), out of line: the
 * report and the release policy.  Returns p. */
static __attribute__((noinline)) void *large_seen(void *p, size_t n, const char *fn, void *caller)
{
    fa_owner_adopt(); /* a child of a fork without handlers: the policy's state is the parent's */
    if (__builtin_expect(__atomic_load_n(&soon_due, __ATOMIC_RELAXED), 0))
        soon_run(caller);
    if (p && report_size && n >= report_size)
        report_large(n, fn, caller);
    if (p && n >= FA_RELEASE_MIN) {
        gates_large();
        fa_release_on_alloc(p, n);
    }
    return p;
}

/* large_seen, and huge pages for the block.  Not for calloc: a block it
 * leaves untouched is faulted in page by page as the program writes it,
 * and a huge page would put 2 MiB in the RSS for each sparse write. */
static __attribute__((noinline)) void *large_done(void *p, size_t n, const char *fn, void *caller)
{
    large_seen(p, n, fn, caller);
    if (p && n >= FA_HUGEPAGE_MIN && fa_opt_u64(FA_OPT_HUGEPAGES))
        fa_release_advise_huge(p, n);
    return p;
}

#define AFTER_ALLOC(p, n, fn, caller) \
    (__builtin_expect((n) >= slow_size, 0) ? large_done((p), (n), (fn), (caller)) : (p))

/* A freed block can be large only if it starts on a page; the release
 * policy's table of large blocks says whether it is (a lookup, no call). */
static inline bool maybe_large(const void *p) { return ((uintptr_t)p & 4095) == 0 && p && fa_release_tracking(); }

/* tcmalloc's numbers for reports made in a signal handler, which must not
 * call into tcmalloc (the thread it interrupted may hold tcmalloc's
 * locks).  Refreshed by ordinary reports and every 2^16 malloc or new
 * calls of a thread.  Two copies, each under a sequence lock, written in
 * turn by one writer at a time: while one is being written (even by the
 * thread a signal interrupted) the other is whole. */
static struct tc_copy {
    unsigned seq; /* odd while being written */
    uint64_t when_ms;
    uint64_t tc[FA_TC_COUNT];
} tc_cache[2];
static unsigned tc_cache_writes; /* copies written so far; the next goes to [writes & 1] */
static int tc_cache_busy;

static void tc_read(uint64_t out[FA_TC_COUNT])
{
    for (int i = 0; i < FA_TC_COUNT; i++)
        out[i] = fa_tc_prop(fa_tc_props[i]);
}

static void tc_cache_store(const uint64_t v[FA_TC_COUNT])
{
    if (__atomic_exchange_n(&tc_cache_busy, 1, __ATOMIC_ACQUIRE))
        return;
    unsigned n = __atomic_load_n(&tc_cache_writes, __ATOMIC_RELAXED);
    struct tc_copy *c = &tc_cache[n & 1];
    __atomic_store_n(&c->seq, c->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    for (int i = 0; i < FA_TC_COUNT; i++)
        __atomic_store_n(&c->tc[i], v[i], __ATOMIC_RELAXED);
    __atomic_store_n(&c->when_ms, now_ms(CLOCK_MONOTONIC_COARSE), __ATOMIC_RELAXED);
    __atomic_store_n(&c->seq, c->seq + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&tc_cache_writes, n + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&tc_cache_busy, 0, __ATOMIC_RELEASE);
}

/* One copy, if it is whole and stays so while it is read. */
static bool tc_copy_load(const struct tc_copy *c, uint64_t out[FA_TC_COUNT], uint64_t *when)
{
    unsigned a = __atomic_load_n(&c->seq, __ATOMIC_ACQUIRE);
    if (a == 0 || (a & 1))
        return false;
    for (int i = 0; i < FA_TC_COUNT; i++)
        out[i] = __atomic_load_n(&c->tc[i], __ATOMIC_RELAXED);
    *when = __atomic_load_n(&c->when_ms, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&c->seq, __ATOMIC_RELAXED) == a;
}

/* Signal-safe, never waits: the newest whole copy.  Both copies change
 * under a read only when other threads write twice meanwhile; then it
 * tries again, a bounded number of times.  False if there is no copy. */
static bool tc_cache_load(uint64_t out[FA_TC_COUNT], uint64_t *when)
{
    for (int tries = 0; tries < 100; tries++) {
        unsigned n = __atomic_load_n(&tc_cache_writes, __ATOMIC_ACQUIRE);
        if (n == 0)
            return false;
        if (tc_copy_load(&tc_cache[(n - 1) & 1], out, when) || tc_copy_load(&tc_cache[n & 1], out, when))
            return true;
    }
    return false;
}

static void tc_cache_update(void)
{
    uint64_t v[FA_TC_COUNT];
    tc_read(v);
    tc_cache_store(v);
}

/* How old the copy may grow before the calls refresh it.  A refresh
 * reads five numbers that each walk all of tcmalloc's caches under their
 * locks (16 us together), and the other threads wait for those locks
 * meanwhile: made at every 65,536th free of a thread, a millisecond apart
 * in a loop of small frees, it cost that loop 2-3% of its CPU time, more
 * where a thread holding the locks is preempted (docs/performance.md,
 * small-object churn). */
#define TC_CACHE_MS 100

/* Whether the newest copy is younger than TC_CACHE_MS. */
static bool tc_cache_fresh(void)
{
    uint64_t v[FA_TC_COUNT], when;
    return tc_cache_load(v, &when) && now_ms(CLOCK_MONOTONIC_COARSE) - when < TC_CACHE_MS;
}

static __attribute__((noinline)) void tc_cache_refresh(void)
{
    fa_owner_adopt(); /* a child of a fork without handlers that makes no large allocation */
    fa_release_nudge();
    if (!tc_cache_fresh())
        tc_cache_update();
}

/* size 0: unsized; align 0: default alignment.  A sized delete must get
 * the real size (tcmalloc takes it as the size-class hint). */
static inline void tc_delete_any(void *p, size_t size, size_t align)
{
    if (align)
        size ? tc_delete_sized_aligned(p, tc_size(size), align) : tc_delete_aligned(p, align);
    else
        size ? tc_delete_sized(p, tc_size(size)) : tc_delete(p);
}

/* free or delete of a block that may be large: forget it before tcmalloc
 * gets it back, tell the release policy after (which may start the
 * background thread, unless ld.so is the caller: loader.h). */
static __attribute__((noinline)) void release_maybe_large(void *p, size_t size, size_t align, void *caller)
{
    size_t n = fa_release_forget(p);
    if (n & FA_RELEASE_MAPPED) {
        fa_grown_free(p, n & ~FA_RELEASE_MAPPED); /* a block realloc grew (grown.h) */
        return;
    }
    tc_delete_any(p, size, align);
    if (n)
        fa_release_on_free(n, !fa_from_loader(caller));
}

/* ---- the malloc family ---------------------------------------------------- */

/* Every 256th look of a thread's frees (or deletes): every 65,536th call,
 * the copy of tcmalloc's numbers that signal-time reports use is
 * refreshed, once it is TC_CACHE_MS old. */
#define TC_CACHE_DUE(word) __builtin_expect((((word) >> 16) & 0xff) == 0, 0)

/* The out-of-line malloc: the thread's first call (or one after its exit
 * destructor), sizes at or above slow_size, and everything while the
 * release policy waits for an allocation (soon). */
static __attribute__((noinline)) void *malloc_slow(size_t n, void *caller)
{
    HOST_READY();
    fa_stats_alloc(FA_CALL_malloc, n);
    void *p = AFTER_ALLOC(tc_malloc(tc_size(n)), n, "malloc", caller);
    gates_check(fa_tls_stats); /* after a `soon` the allocation above ran */
    return p;
}

/* malloc or new on the thread's record t with its gate open (the record
 * counts, no `soon` pending): sizes below 16 bytes, from 4 KiB, and large
 * ones.  slow_size is above 16 while the gate is open. */
static inline __attribute__((always_inline)) void *alloc_other(fa_tstats *t, size_t n, enum fa_small_kind kind,
                                                              void *(*tc)(size_t), const char *fn, void *caller)
{
    if (n < FA_FAST_MIN) {
        fa_stats_small_into(t, kind, n);
        return tc(FA_FAST_MIN);
    }
    fa_stats_alloc_into(t, fa_small_call[kind], n);
    if (__builtin_expect(n < slow_size, 1))
        return tc(n);
    return large_done(tc(n), n, fn, caller);
}

__attribute__((noinline)) void *fa_host_malloc_other(size_t n, void *caller)
{
    fa_tstats *t = fa_tls_stats;
    if (__builtin_expect(t->malloc_limit == 0, 0))
        return malloc_slow(n, caller);
    return alloc_other(t, n, FA_SMALL_malloc, tc_malloc, "malloc", caller);
}

/* tcmalloc's calloc clears the whole block, faulting in fresh memory that
 * reads as zeros already; a large one is cleared where it holds something. */
static __attribute__((noinline)) void *calloc_large(size_t total)
{
    if (!calloc_sparse_min || total < calloc_sparse_min)
        return tc_calloc(1, total);
    void *p = tc_malloc(total);
    if (p)
        fa_clear_anonymous(p, total);
    return p;
}

static __attribute__((noinline)) void *calloc_slow(size_t n, size_t size, void *caller)
{
    HOST_READY();
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        fa_stats_alloc(FA_CALL_calloc, 0); /* counted, but nothing was requested */
        errno = ENOMEM; /* tcmalloc returns NULL without setting errno */
        return NULL;
    }
    fa_stats_alloc(FA_CALL_calloc, total);
    if (__builtin_expect(total >= slow_size, 0))
        return large_seen(calloc_large(total), total, "calloc", caller);
    return tc_calloc(1, tc_size(total));
}

/* What fa_fast_calloc did not take.  With the thread's gate open and a
 * product that neither overflows nor is large (below 16 bytes, from
 * 4 KiB), without a frame. */
__attribute__((noinline)) void *fa_host_calloc(size_t n, size_t size, void *caller)
{
    fa_tstats *t = fa_tls_stats;
    size_t total;
    if (__builtin_expect(!__builtin_mul_overflow(n, size, &total) && t->malloc_limit != 0 && total < slow_size, 1)) {
        if (total < FA_FAST_MIN)
            fa_stats_small_into(t, FA_SMALL_calloc, total);
        else
            fa_stats_alloc_into(t, FA_CALL_calloc, total);
        return tc_calloc(1, tc_size(total));
    }
    return calloc_slow(n, size, caller);
}

/* A grown block (grown.h) is done with: its report and huge pages, as
 * large_done gives a new one, for a block the table already holds. */
static void *grown_done(void *q, size_t n, const char *fn, void *caller)
{
    if (report_size && n >= report_size)
        report_large(n, fn, caller);
    if (n >= FA_HUGEPAGE_MIN && fa_opt_u64(FA_OPT_HUGEPAGES))
        fa_grown_advise_huge(q, n);
    return q;
}

/* realloc of a block realloc grew before (grown.h): resized by the
 * kernel; realloc(p, 0) frees it. */
static __attribute__((noinline)) void *realloc_grown(void *p, size_t old, size_t n, const char *fn, void *caller)
{
    if (n == 0) {
        fa_release_forget(p);
        fa_grown_free(p, old);
        return NULL;
    }
    bool to_tc;
    void *q = fa_grown_realloc(p, old, n, &to_tc);
    if (!q)
        return NULL;
    return to_tc ? AFTER_ALLOC(q, n, fn, caller) : grown_done(q, n, fn, caller);
}

static void *realloc_counted(void *p, size_t n, const char *fn, void *caller)
{
    /* realloc(NULL, n) allocates; realloc(p, 0) frees, as glibc's.  A large
     * p is forgotten before tcmalloc may hand its address to another
     * thread, as free does, and remembered again if realloc fails.  Resized
     * in place (tcmalloc keeps a block whose span the new size fits, down
     * to about half of it), p still holds its whole span: nothing was freed
     * or allocated, it stays remembered (at the larger size), and its free
     * is the one that counts.  Grown to FA_GROWN_MIN or more beyond its
     * span, it leaves tcmalloc for a mapping of its own (grown.h). */
    HOST_READY();
    size_t old = 0;
    if (maybe_large(p)) {
        size_t held = fa_release_lookup(p);
        if (held & FA_RELEASE_MAPPED)
            return realloc_grown(p, held & ~FA_RELEASE_MAPPED, n, fn, caller);
        old = fa_release_forget(p);
    }
    if (old && n >= FA_GROWN_MIN && n > old) {
        size_t cap = tc_malloc_size(p);
        void *q = n > cap ? fa_grown_adopt(p, cap, n) : NULL;
        if (q) {
            tc_free(p);
            fa_release_on_free(old, !fa_from_loader(caller));
            return grown_done(q, n, fn, caller);
        }
    }
    void *q = tc_realloc(p, n || !p ? tc_size(n) : 0); /* realloc(p, 0) frees */
    if (old) {
        if (q == p) {
            fa_release_remember(p, n > old ? n : old);
            if (report_size && n >= report_size)
                report_large(n, fn, caller);
            return q;
        }
        if (q == NULL && n != 0)
            fa_release_remember(p, old);
        else
            fa_release_on_free(old, !fa_from_loader(caller));
    }
    return AFTER_ALLOC(q, n, fn, caller);
}

static __attribute__((noinline)) void *realloc_slow(void *p, size_t n, void *caller)
{
    fa_stats_alloc(FA_CALL_realloc, n);
    return realloc_counted(p, n, "realloc", caller);
}

void *fa_host_realloc(void *p, size_t n, void *caller)
{
    /* The common case, without a frame: the thread's gates open (its
     * record counts, no `soon` pending), p a block free's gate lets through
     * (not NULL, not one that may be large), n neither 0 (a free) nor
     * large: tcmalloc's realloc, whose result is small too. */
    fa_tstats *t = fa_tls_stats;
    if (__builtin_expect(t->malloc_limit != 0 && ((uintptr_t)p & t->free_mask) != 0 && n - 1 < slow_size - 1, 1)) {
        fa_stats_alloc_into(t, FA_CALL_realloc, n);
        return tc_realloc(p, tc_size(n));
    }
    return realloc_slow(p, n, caller);
}

void *fa_host_reallocarray(void *p, size_t n, size_t size, void *caller)
{
    size_t total;
    if (__builtin_mul_overflow(n, size, &total)) {
        fa_stats_alloc(FA_CALL_reallocarray, 0);
        errno = ENOMEM;
        return NULL;
    }
    /* Another allocator serves malloc, without a reallocarray of its own:
     * like glibc's, this one reaches its realloc.  `realloc` here is what
     * the process's calls reach: the loader filled this reference in
     * before any constructor ran, so this holds in a library's constructor
     * that runs before ours too. */
    void *(*global)(void *, size_t) = realloc;
    if (fa_realloc_self && global != fa_realloc_self)
        return global(p, total);
    fa_stats_alloc(FA_CALL_reallocarray, total);
    return realloc_counted(p, total, "reallocarray", caller);
}

static inline void free_counted(void *p, void *caller)
{
    if (__builtin_expect(maybe_large(p), 0))
        release_maybe_large(p, 0, 0, caller); /* tc_delete(p) is tc_free(p) in tcmalloc */
    else
        tc_free(p);
}

void fa_host_free_sized(void *p, void *caller)
{
    /* Another allocator serves malloc without sized frees of its own
     * (jemalloc 5.3 has none): its free gets the block, as glibc's
     * free_sized hands it to free.  The size is not passed on to
     * tcmalloc's sized free: a block realloc shrank in place keeps the
     * size class of its old size. */
    void (*global)(void *) = free;
    if (fa_free_self && global != fa_free_self) {
        global(p);
        return;
    }
    fa_host_free(p, caller);
}

/* Every FA_RELEASE_CHECK_FREES-th free or delete of a thread (its
 * countdown ran out), the release policy looks at what small frees left
 * free (release.h). */
_Static_assert(FA_RELEASE_CHECK_FREES == FA_COUNTDOWN_PERIOD, "the countdown paces the policy's look");

static void free_look(uint64_t word, bool may_start)
{
    fa_release_check_free(may_start);
    if (TC_CACHE_DUE(word))
        tc_cache_refresh();
}

/* A free on a thread whose gate is closed: its first counted call (or one
 * after its exit destructor), or a forked child's first. */
static __attribute__((noinline)) void free_closed(void *p, void *caller)
{
    fa_tstats *t = fa_tls_stats;
    bool due;
    if (fa_stats_mine(t)) {
        due = fa_stats_free_into(t, FA_CALL_free);
    } else if (!p || fa_from_loader(caller)) {
        /* A thread with no record, as it ends, after its key destructors
         * ran (a record taken now would never be handed back): glibc's
         * free(NULL)s of the thread's libc buffers it never used, and ld.so
         * freeing other ended threads' TLS.  Counted in the shared record. */
        fa_stats_free_shared(FA_CALL_free);
        due = false;
    } else {
        due = fa_stats_free(FA_CALL_free); /* the thread's first counted call */
        t = fa_tls_stats;
    }
    gates_check(t);
    free_counted(p, caller);
    if (__builtin_expect(due, 0))
        free_look(t->frees.word, !fa_from_loader(caller));
}

/* With the gate open: NULL and page-aligned blocks (large ones among
 * them once there are any). */
__attribute__((noinline)) void fa_host_free(void *p, void *caller)
{
    fa_tstats *t = fa_tls_stats;
    if (__builtin_expect(t->free_mask == 0, 0)) {
        free_closed(p, caller);
        return;
    }
    bool due = fa_countdown_tick(&t->frees); /* started: the gate is open */
    free_counted(p, caller);
    if (__builtin_expect(due, 0)) {
        fa_countdown_refill(&t->frees);
        free_look(t->frees.word, !fa_from_loader(caller));
    }
}

__attribute__((noinline)) void fa_host_free_due(void *p, void *caller)
{
    fa_tstats *t = fa_tls_stats;
    fa_countdown_refill(&t->frees);
    free_counted(p, caller);
    free_look(t->frees.word, !fa_from_loader(caller));
}

static void *aligned(enum fa_call c, const char *fn, size_t align, size_t n, void *caller)
{
    HOST_READY();
    fa_stats_alloc(c, n);
    void *p = tc_memalign(align, tc_size(n));
    if (!p)
        errno = ENOMEM;
    return AFTER_ALLOC(p, n, fn, caller);
}

static bool power_of_two(size_t a) { return a && (a & (a - 1)) == 0; }

/* glibc's memalign: an alignment that is not a power of two is rounded up
 * to one; above SIZE_MAX/2+1 there is none (left as it is: EINVAL). */
static size_t memalign_alignment(size_t align)
{
    if (align > SIZE_MAX / 2 + 1)
        return align;
    while (!power_of_two(align))
        align = align ? align + (align & -align) : 1;
    return align;
}

void *fa_host_memalign(size_t align, size_t n, void *caller)
{
    align = memalign_alignment(align);
    if (!power_of_two(align)) {
        fa_stats_alloc(FA_CALL_memalign, 0); /* counted, but nothing was requested */
        errno = EINVAL;
        return NULL;
    }
    return aligned(FA_CALL_memalign, "memalign", align, n, caller);
}

/* glibc's aligned_alloc rules: from 2.38 (C17, DR 460) the alignment must
 * be a power of two; before, aligned_alloc was memalign.  The program gets
 * the rules of the glibc it runs on. */
static bool strict_aligned_alloc(void)
{
    static int strict; /* 0 not known yet, 1 no, 2 yes */
    int s = __atomic_load_n(&strict, __ATOMIC_RELAXED);
    if (s == 0) {
        const char *v = gnu_get_libc_version();
        unsigned major = 0, minor = 0;
        for (; *v >= '0' && *v <= '9'; v++)
            major = major * 10 + (unsigned)(*v - '0');
        if (*v == '.')
            for (v++; *v >= '0' && *v <= '9'; v++)
                minor = minor * 10 + (unsigned)(*v - '0');
        s = major > 2 || (major == 2 && minor >= 38) ? 2 : 1;
        __atomic_store_n(&strict, s, __ATOMIC_RELAXED);
    }
    return s == 2;
}

void *fa_host_aligned_alloc(size_t align, size_t n, void *caller)
{
    if (!strict_aligned_alloc())
        align = memalign_alignment(align);
    if (!power_of_two(align)) {
        fa_stats_alloc(FA_CALL_aligned_alloc, 0); /* counted, but nothing was requested */
        errno = EINVAL;
        return NULL;
    }
    return aligned(FA_CALL_aligned_alloc, "aligned_alloc", align, n, caller);
}

int fa_host_posix_memalign(void **out, size_t align, size_t n, void *caller)
{
    if (!power_of_two(align) || align % sizeof(void *) != 0) {
        fa_stats_alloc(FA_CALL_posix_memalign, 0); /* counted, but nothing was requested */
        return EINVAL;
    }
    fa_stats_alloc(FA_CALL_posix_memalign, n);
    HOST_READY();
    int saved = errno;
    void *p = tc_memalign(align, tc_size(n));
    errno = saved; /* posix_memalign reports through its result */
    if (!p) {
        errno = ENOMEM; /* and glibc's sets errno too when memory runs out */
        return ENOMEM;
    }
    *out = AFTER_ALLOC(p, n, "posix_memalign", caller);
    return 0;
}

void *fa_host_valloc(size_t n, void *caller)
{
    HOST_READY();
    return aligned(FA_CALL_valloc, "valloc", fa_page_size(), n, caller);
}

void *fa_host_pvalloc(size_t n, void *caller)
{
    HOST_READY();
    size_t rounded;
    if (__builtin_add_overflow(n, fa_page_size() - 1, &rounded)) {
        fa_stats_alloc(FA_CALL_pvalloc, n);
        errno = ENOMEM;
        return NULL;
    }
    rounded &= ~(fa_page_size() - 1);
    if (rounded == 0)
        rounded = fa_page_size(); /* pvalloc(0) gives one page, as tcmalloc's (glibc's: a minimum block on a page) */
    fa_stats_alloc(FA_CALL_pvalloc, n);
    void *p = tc_memalign(fa_page_size(), rounded);
    if (!p)
        errno = ENOMEM;
    return AFTER_ALLOC(p, rounded, "pvalloc", caller);
}

size_t fa_host_usable_size(void *p)
{
    if (!p)
        return 0;
    if (maybe_large(p)) {
        size_t held = fa_release_lookup(p);
        if (held & FA_RELEASE_MAPPED)
            return fa_grown_usable(held & ~FA_RELEASE_MAPPED);
    }
    return tc_malloc_size(p);
}

/* ---- operator new / delete ------------------------------------------------ */

/* tcmalloc's tc_new family calls the new-handler until it gives up, then
 * throws std::bad_alloc.  The nothrow forms (override_cxx.cc) call this
 * inside a catch-all, as libstdc++'s do: an exception of any type from the
 * new-handler gives nullptr there, where tcmalloc's own nothrow forms let
 * all but std::bad_alloc end the program. */
static inline void *tc_new_any(size_t n, size_t align)
{
    if (align == 0)
        return tc_new(tc_size(n));
    /* An alignment that is not a power of two gets no block, as from
     * libstdc++ (std::bad_alloc and no new-handler); tcmalloc would return
     * one. */
    if (__builtin_expect(align & (align - 1), 0)) {
        if (fa_host_cxx_bad_alloc)
            fa_host_cxx_bad_alloc();
        return NULL;
    }
    return tc_new_aligned(tc_size(n), align);
}

static __attribute__((noinline)) void *new_slow(size_t n, size_t align, void *caller)
{
    HOST_READY();
    fa_stats_alloc(FA_CALL_new, n);
    void *p = AFTER_ALLOC(tc_new_any(n, align), n, "operator new", caller);
    gates_check(fa_tls_stats); /* after a `soon` the allocation above ran */
    return p;
}

/* As fa_host_malloc_other.  The thread's malloc gate says whether its
 * record counts and no `soon` is pending: new's own gate may be shut while
 * the forms left to forgealloc are served here. */
__attribute__((noinline)) void *fa_host_new_other(size_t n, void *caller)
{
    fa_tstats *t = fa_tls_stats;
    if (__builtin_expect(t->malloc_limit == 0, 0))
        return new_slow(n, 0, caller);
    return alloc_other(t, n, FA_SMALL_new, tc_new, "operator new", caller);
}

void *fa_host_new(size_t n, size_t align, void *caller)
{
    if (align == 0)
        return fa_host_new_other(n, caller);
    fa_tstats *t = fa_tls_stats;
    if (__builtin_expect(t->malloc_limit == 0 || n >= slow_size, 0))
        return new_slow(n, align, caller);
    fa_stats_alloc_into(t, FA_CALL_new, n);
    return tc_new_any(n, align);
}

static inline void delete_counted(void *p, size_t size, size_t align)
{
    if (__builtin_expect(maybe_large(p), 0))
        release_maybe_large(p, size, align, NULL);
    else
        tc_delete_any(p, size, align);
}

__attribute__((noinline)) void fa_host_delete(void *p, size_t size, size_t align)
{
    bool due = fa_stats_free(FA_CALL_delete); /* a thread without a record takes one */
    fa_tstats *t = fa_tls_stats;
    gates_check(t);
    delete_counted(p, size, align);
    if (__builtin_expect(due, 0))
        free_look(t->deletes.word, true);
}

__attribute__((noinline)) void fa_host_delete_due(void *p, size_t n)
{
    fa_tstats *t = fa_tls_stats;
    fa_countdown_refill(&t->deletes);
    delete_counted(p, n, 0);
    free_look(t->deletes.word, true);
}

/* ---- introspection -------------------------------------------------------- */

void fa_host_mallinfo2(struct mallinfo2 *m)
{
    memset(m, 0, sizeof *m);
    size_t heap = fa_tc_prop("generic.heap_size");
    size_t used = fa_tc_prop("generic.current_allocated_bytes");
    size_t pfree = fa_tc_prop("tcmalloc.pageheap_free_bytes");
    size_t unmapped = fa_tc_prop("tcmalloc.pageheap_unmapped_bytes");
    size_t cached = fa_tc_prop("tcmalloc.central_cache_free_bytes") + fa_tc_prop("tcmalloc.transfer_cache_free_bytes") +
                    fa_tc_prop("tcmalloc.thread_cache_free_bytes");
    m->arena = heap > unmapped ? heap - unmapped : 0; /* mapped, not returned */
    m->uordblks = used;                          /* in use by the program */
    m->fordblks = pfree + cached;                /* free, kept by tcmalloc */
    m->fsmblks = cached;                         /* free small objects in caches */
    m->keepcost = pfree;                         /* what malloc_trim could return */
    m->hblkhd = fa_grown_bytes();                /* blocks realloc grew, mapped apart as glibc's mmapped chunks */
}

int fa_host_trim(size_t pad)
{
    (void)pad; /* tcmalloc keeps no "top of heap" to pad */
    return fa_release_all() > 0;
}

size_t fa_host_release_all(void) { return fa_release_all(); }

int fa_host_malloc_info(int options, FILE *fp)
{
    if (options != 0 || fp == NULL)
        return EINVAL; /* glibc's answer, errno untouched */
    struct mallinfo2 m;
    fa_host_mallinfo2(&m);
    char out[1024];
    fa_buf b;
    fa_buf_init(&b, out, sizeof out);
    fa_buf_str(&b, "<malloc version=\"1\" allocator=\"forgealloc+tcmalloc\">\n<heap nr=\"0\">\n<sizes>\n</sizes>\n");
    fa_buf_printf(&b, "<total type=\"fast\" count=\"0\" size=\"%zu\"/>\n", m.fsmblks);
    fa_buf_printf(&b, "<total type=\"rest\" count=\"0\" size=\"%zu\"/>\n", m.fordblks - m.fsmblks);
    fa_buf_printf(&b, "<system type=\"current\" size=\"%zu\"/>\n<system type=\"max\" size=\"%zu\"/>\n", m.arena,
                  m.arena);
    fa_buf_printf(&b, "<aspace type=\"total\" size=\"%zu\"/>\n<aspace type=\"mprotect\" size=\"%zu\"/>\n</heap>\n",
                  m.arena, m.arena);
    fa_buf_printf(&b, "<total type=\"fast\" count=\"0\" size=\"%zu\"/>\n", m.fsmblks);
    fa_buf_printf(&b, "<total type=\"rest\" count=\"0\" size=\"%zu\"/>\n", m.fordblks - m.fsmblks);
    fa_buf_printf(&b, "<total type=\"mmap\" count=\"0\" size=\"0\"/>\n<system type=\"current\" size=\"%zu\"/>\n",
                  m.arena);
    fa_buf_printf(&b, "<system type=\"max\" size=\"%zu\"/>\n<aspace type=\"total\" size=\"%zu\"/>\n", m.arena,
                  m.arena);
    fa_buf_printf(&b, "<aspace type=\"mprotect\" size=\"%zu\"/>\n</malloc>\n", m.arena);
    return fputs(out, fp) < 0 ? -1 : 0;
}

/* ---- snapshot --------------------------------------------------------------- */

static uint64_t read_rss(void)
{
    char buf[128];
    if (fa_read_file("/proc/self/statm", buf, sizeof buf) <= 0)
        return 0;
    const char *c = strchr(buf, ' '); /* "size resident ..." */
    if (!c)
        return 0;
    uint64_t pages = 0;
    for (c++; *c >= '0' && *c <= '9'; c++)
        pages = pages * 10 + (uint64_t)(*c - '0');
    return pages * fa_page_size();
}

void fa_host_fill(fa_snapshot *s)
{
    int saved = errno;
    if (slow_size == 0)
        host_init();
    fa_stats_sum(&s->host);
    s->stat_records = fa_stats_records();
    s->rss_bytes = read_rss();
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        s->peak_rss_bytes = (uint64_t)ru.ru_maxrss * 1024u;
    if (s->peak_rss_bytes < s->rss_bytes)
        s->peak_rss_bytes = s->rss_bytes;
    fa_release_totals(&s->releases, s->released_by);
    s->released_bytes = 0;
    for (int i = 0; i < FA_REL_COUNT; i++)
        s->released_bytes += s->released_by[i];
    s->release_background = fa_release_in_background();
    s->release_hold_ms = fa_release_hold_ms();
    s->grown_bytes = fa_grown_bytes();
    s->release_rate = &fa_tc_release_rate ? fa_tc_release_rate : -1.0;
    if (s->in_signal) {
        uint64_t when = 0;
        s->tc_valid = tc_cache_load(s->tc, &when);
        uint64_t now = now_ms(CLOCK_MONOTONIC_COARSE);
        s->tc_age_ms = s->tc_valid && now > when ? now - when : 0;
    } else {
        tc_read(s->tc);
        tc_cache_store(s->tc);
        s->tc_valid = true;
        s->tc_age_ms = 0;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    s->uptime_ms = (uint64_t)(now.tv_sec - start_time.tv_sec) * 1000u +
                   (uint64_t)((now.tv_nsec - start_time.tv_nsec) / 1000000);
    s->time_unix_ms = now_ms(CLOCK_REALTIME);
    fa_host_served_fill(s);
    errno = saved;
}

/* ---- lifecycle --------------------------------------------------------------- */

void fa_host_start(void)
{
    fa_start_fill_end(); /* tcmalloc has started: its own memset again */
    fa_loader_init();
    fa_release_set_soon(host_soon);
    if (slow_size == 0)
        host_init();
    tc_cache_refresh(); /* a signal-time report has tcmalloc's numbers from the start */
    double rate = fa_opt(FA_OPT_RELEASE_RATE)->d;
    if (&fa_tc_release_rate)
        fa_tc_release_rate = rate;
    else
        fa_info("this tcmalloc does not export its release-rate flag; FORGEALLOC_RELEASE_RATE has no effect");
}

void fa_host_start_pages(void)
{
    /* Only when tcmalloc serves the process from its start: loaded later
     * (dlopen), the heap is another allocator's and the process may have
     * writers a thread count does not show. */
    if (fa_host_malloc_server() == FA_SERVER_OTHER)
        return;
    size_t left = fa_start_fill_left();
    if (left) { /* tcmalloc's start never faulted them in: nothing to give back */
        fa_debug("%zu KiB of pages tcmalloc cleared at start left untouched", left >> 10);
        return;
    }
    size_t zero = fa_zero_pages_at_start((const void *)tc_malloc);
    fa_debug("%zu KiB of pages tcmalloc cleared at start and holds only zeros given back", zero >> 10);
}

/* A fork while another thread wrote a copy: that copy stays half written
 * and the writer flag set in the child, whose signal-time reports would
 * show the parent's numbers from before the fork for good. */
static void reset_child(void)
{
    for (int i = 0; i < 2; i++)
        if (tc_cache[i].seq & 1)
            tc_cache[i].seq = 0;
    tc_cache_busy = 0;
    clock_gettime(CLOCK_MONOTONIC, &start_time);
    report_tokens_ms = 0;
    reports_suppressed = 0;
}

void fa_host_fork_child(void)
{
    reset_child();
    fa_release_fork_child();
    tc_cache_update(); /* the child's own numbers, now: tcmalloc's handlers ran */
}

void fa_host_adopt(void)
{
    reset_child();
    fa_release_adopt();
}
