/* release.h - when freed host memory goes back to the OS.
 *
 * tcmalloc 2.10 keeps freed pages forever in practice (its release rate
 * counts page-heap activity, not time), while returning every large free at
 * once makes repeated large allocations pay page faults each time.  The
 * policy: count the bytes of large blocks freed beyond what large
 * allocations took back since the last check; when that exceeds
 * FORGEALLOC_RELEASE_THRESHOLD the heap is shrinking, not churning, so ask
 * tcmalloc how much it holds free and return all but half the threshold. */
#ifndef FA_RELEASE_H
#define FA_RELEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Requests above tcmalloc's largest size class (256 KiB) are served from
 * the page heap directly; only those move the policy. */
#define FA_RELEASE_MIN ((size_t)256 * 1024)

/* A large block (n >= FA_RELEASE_MIN) was allocated at p: remember it, so
 * its free is recognised without asking tcmalloc, and move the policy. */
void fa_release_on_alloc(void *p, size_t n);
/* p is being freed: if it is a remembered large block, forget it and
 * return its size (0 otherwise).  Call fa_release_on_free(size) after the
 * block went back to tcmalloc. */
size_t fa_release_forget(void *p);
void fa_release_on_free(size_t n);
/* True once any large block was seen: before that no free can be large. */
static inline bool fa_release_tracking(void)
{
    extern int fa_release_seen_large;
    return __atomic_load_n(&fa_release_seen_large, __ATOMIC_RELAXED);
}
/* Large blocks of at least this size get transparent huge pages. */
#define FA_HUGEPAGE_MIN ((size_t)4 << 20)

/* Ask for transparent huge pages on the 2 MiB-aligned interior of a large
 * block (FORGEALLOC_HUGEPAGES), when the kernel's THP mode is "madvise". */
void fa_release_advise_huge(void *p, size_t n);

/* Return everything free (malloc_trim, forgealloc_release). */
size_t fa_release_all(void);
void fa_release_totals(uint64_t *releases, uint64_t *bytes);
void fa_release_fork_child(void);

#endif
