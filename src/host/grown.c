/* grown.c - large blocks that realloc grows, in mappings of their own
 * (grown.h). */
#define _GNU_SOURCE
#include "grown.h"

#include <errno.h>
#include <gperftools/tcmalloc.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../core/sys.h"
#include "release.h"

static uint64_t live_bytes;

size_t fa_grown_usable(size_t n) { return (n + fa_page_size() - 1) & ~(fa_page_size() - 1); }

/* tcmalloc exports mmap, mremap and munmap (its hooks): the kernel's are
 * called directly.  Each returns MAP_FAILED on failure. */
static void *sys_map(size_t len)
{
    return (void *)syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}
static void *sys_remap(void *p, size_t from, size_t to, int flags, void *at)
{
    return (void *)syscall(SYS_mremap, p, from, to, flags, at);
}
static void sys_unmap(void *p, size_t len) { syscall(SYS_munmap, p, len); }

static void count(size_t add, size_t sub)
{
    if (add)
        __atomic_fetch_add(&live_bytes, add, __ATOMIC_RELAXED);
    if (sub)
        __atomic_fetch_sub(&live_bytes, sub, __ATOMIC_RELAXED);
}

void *fa_grown_adopt(const void *p, size_t keep, size_t n)
{
    size_t len = fa_grown_usable(n);
    if (len < n)
        return NULL;
    int saved = errno;
    void *q = sys_map(len);
    errno = saved;
    if (q == MAP_FAILED)
        return NULL;
    if (!fa_release_remember_mapped(q, n)) {
        sys_unmap(q, len);
        return NULL;
    }
    memcpy(q, p, keep < n ? keep : n);
    count(len, 0);
    return q;
}

void *fa_grown_realloc(void *p, size_t old, size_t n, bool *to_tc)
{
    *to_tc = false;
    size_t from = fa_grown_usable(old), to = fa_grown_usable(n);
    if (to < n) {
        errno = ENOMEM;
        return NULL;
    }
    int saved = errno;
    /* In place: shrinking works, growing where the addresses after the
     * mapping are free and it is still one mapping (a program that
     * changed the protection of part of it splits it). */
    if (to == from || sys_remap(p, from, to, 0, NULL) != MAP_FAILED) {
        errno = saved;
        fa_release_resize(p, n | FA_RELEASE_MAPPED);
        count(to > from ? to - from : 0, from > to ? from - to : 0);
        return p;
    }
    /* Elsewhere: reserve the new range and its slot in the table first;
     * a failure until then leaves p as it was. */
    void *q = sys_map(to);
    if (q == MAP_FAILED) {
        errno = ENOMEM;
        return NULL;
    }
    if (!fa_release_remember_mapped(q, n)) {
        sys_unmap(q, to);
        errno = saved;
        /* No slot: a tcmalloc block instead, which the table need not hold. */
        void *t = tc_malloc(n);
        if (!t) {
            errno = ENOMEM;
            return NULL;
        }
        memcpy(t, p, from < n ? from : n);
        fa_release_forget(p);
        sys_unmap(p, from);
        count(0, from);
        *to_tc = true;
        return t;
    }
    /* p leaves the table before its addresses are given up: another
     * thread's block may be mapped there at once.  The kernel moves the
     * pages; where it cannot (p is several mappings), they are copied. */
    fa_release_forget(p);
    if (sys_remap(p, from, to, MREMAP_MAYMOVE | MREMAP_FIXED, q) == MAP_FAILED) {
        memcpy(q, p, from < to ? from : to);
        sys_unmap(p, from);
    }
    errno = saved;
    count(to, from);
    return q;
}

void fa_grown_advise_huge(void *p, size_t n)
{
    /* The whole mapping: advising part of it would split it in two or
     * three, which mremap cannot resize. */
    if (fa_release_thp_advised()) {
        int saved = errno;
        madvise(p, fa_grown_usable(n), MADV_HUGEPAGE);
        errno = saved;
    }
}

void fa_grown_free(void *p, size_t n)
{
    int saved = errno; /* free() keeps errno */
    size_t len = fa_grown_usable(n);
    sys_unmap(p, len);
    count(0, len);
    errno = saved;
}

uint64_t fa_grown_bytes(void) { return __atomic_load_n(&live_bytes, __ATOMIC_RELAXED); }
