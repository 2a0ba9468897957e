/* release.c - the release policy described in release.h. */
#include "release.h"

#include <errno.h>
#include <gperftools/malloc_extension_c.h>
#include <gperftools/tcmalloc.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>

#include "../core/log.h"
#include "../core/options.h"

/* Net bytes of large blocks freed since the last check (never negative). */
static uint64_t shrink;

/* Live large blocks, by address: an open-addressing table with short
 * probes, written with compare-and-swap (large allocations are rare).  A
 * block that finds no slot is counted in `untracked`; while that is
 * non-zero, page-aligned frees that miss the table ask tcmalloc. */
#define TABLE_SLOTS ((size_t)1 << 16)
#define PROBES 8
typedef struct {
    uintptr_t p;
    size_t n;
} large_slot;
static large_slot *table;
static uint64_t untracked;
int fa_release_seen_large;
static int busy;
static uint64_t releases, released_bytes;

static size_t property(const char *name)
{
    size_t v = 0;
    MallocExtension_GetNumericProperty(name, &v);
    return v;
}

static size_t slot_of(uintptr_t p) { return (size_t)((p >> 12) * 0x9E3779B97F4A7C15ull >> 48) & (TABLE_SLOTS - 1); }

static large_slot *get_table(void)
{
    large_slot *t = __atomic_load_n(&table, __ATOMIC_ACQUIRE);
    if (t)
        return t;
    void *m = mmap(NULL, TABLE_SLOTS * sizeof *t, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    large_slot *expect = NULL;
    if (!__atomic_compare_exchange_n(&table, &expect, (large_slot *)m, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        munmap(m, TABLE_SLOTS * sizeof *t); /* another thread won */
        return expect;
    }
    return (large_slot *)m;
}

static void remember(void *p, size_t n)
{
    large_slot *t = get_table();
    __atomic_store_n(&fa_release_seen_large, 1, __ATOMIC_RELAXED);
    if (t) {
        size_t i = slot_of((uintptr_t)p);
        for (int k = 0; k < PROBES; k++, i = (i + 1) & (TABLE_SLOTS - 1)) {
            uintptr_t empty = 0;
            if (__atomic_compare_exchange_n(&t[i].p, &empty, (uintptr_t)p, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED)) {
                __atomic_store_n(&t[i].n, n, __ATOMIC_RELEASE);
                return;
            }
        }
    }
    __atomic_fetch_add(&untracked, 1, __ATOMIC_RELAXED);
}

size_t fa_release_forget(void *p)
{
    large_slot *t = __atomic_load_n(&table, __ATOMIC_ACQUIRE);
    if (t) {
        size_t i = slot_of((uintptr_t)p);
        for (int k = 0; k < PROBES; k++, i = (i + 1) & (TABLE_SLOTS - 1)) {
            if (__atomic_load_n(&t[i].p, __ATOMIC_ACQUIRE) != (uintptr_t)p)
                continue;
            size_t n = __atomic_load_n(&t[i].n, __ATOMIC_ACQUIRE);
            __atomic_store_n(&t[i].p, 0, __ATOMIC_RELEASE); /* a block is freed once */
            return n;
        }
    }
    if (__atomic_load_n(&untracked, __ATOMIC_RELAXED) == 0)
        return 0;
    size_t n = tc_malloc_size(p); /* rare: the table was full around p */
    if (n < FA_RELEASE_MIN)
        return 0;
    __atomic_fetch_sub(&untracked, 1, __ATOMIC_RELAXED);
    return n;
}

void fa_release_on_alloc(void *p, size_t n)
{
    remember(p, n);
    uint64_t old = __atomic_load_n(&shrink, __ATOMIC_RELAXED), next;
    do {
        next = old > n ? old - n : 0;
    } while (old != next && !__atomic_compare_exchange_n(&shrink, &old, next, true, __ATOMIC_RELAXED,
                                                          __ATOMIC_RELAXED));
}

/* Ask tcmalloc to release `want` bytes; returns the bytes it unmapped. */
static size_t release_and_count(size_t want)
{
    size_t before = property("tcmalloc.pageheap_unmapped_bytes");
    if (want == SIZE_MAX)
        MallocExtension_ReleaseFreeMemory();
    else
        MallocExtension_ReleaseToSystem(want);
    size_t after = property("tcmalloc.pageheap_unmapped_bytes");
    size_t got = after > before ? after - before : 0;
    __atomic_fetch_add(&releases, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&released_bytes, got, __ATOMIC_RELAXED);
    return got;
}

void fa_release_on_free(size_t n)
{
    uint64_t threshold = fa_opt_u64(FA_OPT_RELEASE_THRESHOLD);
    if (__atomic_add_fetch(&shrink, n, __ATOMIC_RELAXED) <= threshold)
        return;
    if (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE))
        return; /* another thread is checking right now */
    int saved = errno; /* free() must keep errno; madvise may set it */
    __atomic_store_n(&shrink, 0, __ATOMIC_RELAXED);
    /* tcmalloc releases whole spans and remembers any excess as credit
     * against later requests (extra_bytes_released_), so one call may
     * release nothing; a few rounds settle it. */
    for (int round = 0; round < 4; round++) {
        size_t free_bytes = property("tcmalloc.pageheap_free_bytes");
        /* Hysteresis: past the threshold, release down to half of it. */
        uint64_t keep = threshold / 2;
        if (free_bytes <= keep)
            break;
        release_and_count(free_bytes - keep);
    }
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    errno = saved;
}

/* 0 unknown, 1 madvise mode (advise), 2 always/never/absent (do nothing). */
static int thp_mode;

static int read_thp_mode(void)
{
    char buf[128];
    fa_read_file("/sys/kernel/mm/transparent_hugepage/enabled", buf, sizeof buf);
    return strstr(buf, "[madvise]") ? 1 : 2;
}

void fa_release_advise_huge(void *p, size_t n)
{
    int mode = __atomic_load_n(&thp_mode, __ATOMIC_RELAXED);
    if (mode == 0) {
        mode = read_thp_mode();
        __atomic_store_n(&thp_mode, mode, __ATOMIC_RELAXED);
    }
    if (mode != 1)
        return;
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t a = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~(huge - 1);
    if (e > a) {
        int saved = errno;
        madvise((void *)a, e - a, MADV_HUGEPAGE);
        errno = saved;
    }
}

size_t fa_release_all(void)
{
    int saved = errno;
    size_t got = release_and_count(SIZE_MAX);
    __atomic_store_n(&shrink, 0, __ATOMIC_RELAXED);
    errno = saved;
    return got;
}

void fa_release_totals(uint64_t *r, uint64_t *b)
{
    *r = __atomic_load_n(&releases, __ATOMIC_RELAXED);
    *b = __atomic_load_n(&released_bytes, __ATOMIC_RELAXED);
}

void fa_release_fork_child(void)
{
    /* The table stays: the child inherits the parent's live blocks. */
    shrink = 0;
    busy = 0;
    releases = 0;
    released_bytes = 0;
}
