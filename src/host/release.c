/* release.c - the release policy described in release.h. */
#include "release.h"

#include <errno.h>
#include <gperftools/malloc_extension_c.h>
#include <stdbool.h>

#include "../core/options.h"

/* Net bytes of large blocks freed since the last check (never negative). */
static uint64_t shrink;
static int busy;
static uint64_t releases, released_bytes;

static size_t property(const char *name)
{
    size_t v = 0;
    MallocExtension_GetNumericProperty(name, &v);
    return v;
}

void fa_release_on_alloc(size_t n)
{
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
    uint64_t keep = fa_opt_u64(FA_OPT_RELEASE_THRESHOLD);
    if (__atomic_add_fetch(&shrink, n, __ATOMIC_RELAXED) <= keep)
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
        if (free_bytes <= keep)
            break;
        release_and_count(free_bytes - keep);
    }
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    errno = saved;
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
    shrink = 0;
    busy = 0;
    releases = 0;
    released_bytes = 0;
}
