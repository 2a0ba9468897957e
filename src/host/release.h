/* release.h - when freed host memory goes back to the OS.
 *
 * tcmalloc 2.10 keeps freed pages forever in practice (its release rate
 * counts page-heap activity, not time), while returning every large free at
 * once makes repeated large allocations pay page faults each time.  The
 * policy remembers demand instead: the bytes tcmalloc holds free are
 * sampled after every large allocation and at each tick of the background
 * thread, and only what stayed free through the last
 * FORGEALLOC_RELEASE_DELAY (decay.h) goes back, beyond the
 * FORGEALLOC_RELEASE_THRESHOLD kept at all times.  A steady churn of large
 * blocks dips into its free memory all the time, so it keeps it; a process
 * that unloaded a model and sits still gets its RSS back within the delay,
 * with no call of its own.  When the free memory held is more than half of
 * what the memory cgroup (or the machine) can still give, it all goes back
 * at once (pressure.h).  FORGEALLOC_RELEASE_DELAY=0 keeps the older rule:
 * when large frees run the threshold ahead of large allocations, return all
 * but half the threshold at once. */
#ifndef FA_RELEASE_H
#define FA_RELEASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../stats/snapshot.h"

/* Requests above tcmalloc's largest size class (256 KiB) are served from
 * the page heap directly; only those move the policy. */
#define FA_RELEASE_MIN ((size_t)256 * 1024 + 1)

/* A large block (n >= FA_RELEASE_MIN) was allocated at p: remember it, so
 * its free is recognised without asking tcmalloc, and move the policy. */
void fa_release_on_alloc(void *p, size_t n);
/* p is being freed: if it is a remembered large block, forget it and
 * return its size, with FA_RELEASE_MAPPED set for a block in a mapping of
 * its own (0 otherwise).  Call fa_release_on_free(size) after the
 * block went back to tcmalloc. */
size_t fa_release_forget(void *p);
/* Put back a block fa_release_forget took out (a realloc that failed, or
 * one that shrank it in place below FA_RELEASE_MIN). */
void fa_release_remember(void *p, size_t n);
/* A block of n bytes in a mapping of its own (grown.h), not tcmalloc's:
 * the table holds n | FA_RELEASE_MAPPED, and fa_release_forget and
 * fa_release_lookup return it so.  Returns false where the table has no
 * slot for p (the block must then stay tcmalloc's). */
#define FA_RELEASE_MAPPED ((size_t)1 << 63)
bool fa_release_remember_mapped(void *p, size_t n);
/* What the table holds for p (0: not a remembered block); p stays in it. */
size_t fa_release_lookup(const void *p);
/* The remembered block p now holds n (flag included); false if p is not
 * remembered. */
bool fa_release_resize(const void *p, size_t n);
/* may_start: false where this call must not start the background thread
 * (a free by the dynamic loader, loader.h); the policy then runs on this
 * call and the thread starts at the next allocation. */
void fa_release_on_free(size_t n, bool may_start);
/* Every FA_RELEASE_CHECK_FREES-th free or delete of a thread (of any
 * size): free memory that small blocks left in tcmalloc's page heap moves
 * the policy too, once past the threshold. */
#define FA_RELEASE_CHECK_FREES 256
void fa_release_check_free(bool may_start);
/* For tests: bytes mapped for the table of live large blocks (64 KiB for
 * the first level, 1 MiB more once the second is mapped), and the count of
 * large blocks that found no slot in it. */
size_t fa_release_table_bytes(void);
uint64_t fa_release_untracked(void);

/* Run the policy at `now_ms` (CLOCK_MONOTONIC_COARSE): sample, return what
 * was idle for the whole delay, or everything under pressure.  Returns when
 * to look again, or 0 when nothing is held that needs watching (until the
 * next wake).  Called by the background thread; never waits for a lock
 * held across an allocation. */
uint64_t fa_release_tick(uint64_t now_ms);
/* While the free memory held is close to a limited cgroup's room, look
 * this often. */
#define FA_RELEASE_PRESSURE_POLL_MS 100

/* The background thread: `wake(true)` starts it on first use and wakes it
 * when it sleeps; it returns false where no thread can run, and the policy
 * then runs on the allocating calls themselves.  `wake(false)` only wakes
 * a thread that runs. */
void fa_release_set_waker(bool (*wake)(bool start));
/* The host's hook that makes its next allocating call run
 * fa_release_nudge (how a start this call may not make is made soon). */
void fa_release_set_soon(void (*soon)(void));
/* At an allocator call that checks (every 2^16 calls of a thread): wake
 * the background if fa_release_start_soon asked for it. */
void fa_release_nudge(void);
/* Start the thread at the next allocating call (not ld.so's), through the
 * host's hook; else at the next nudge.  How a forked child starts the
 * thread for its periodic dumps. */
void fa_release_start_soon(void);
/* Look at tcmalloc's numbers on every tick even without seeing frees (when
 * another preload serves malloc from the same tcmalloc). */
void fa_release_set_polling(bool on);
bool fa_release_polling(void);
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
/* Whether the kernel's THP mode is "madvise" (huge pages only where asked). */
bool fa_release_thp_advised(void);

/* Return everything free (malloc_trim, forgealloc_release). */
size_t fa_release_all(void);
/* Returns to the OS so far: count, and bytes by reason (snapshot.h). */
void fa_release_totals(uint64_t *releases, uint64_t by_reason[FA_REL_COUNT]);
/* How long free memory must stay unused, while the program makes no large
 * allocation, before it goes back: the delay times what was learnt from
 * regret (0 with FORGEALLOC_RELEASE_DELAY=0). */
uint64_t fa_release_hold_ms(void);
/* True while the background thread runs the policy. */
bool fa_release_in_background(void);
void fa_release_fork_child(void);
/* fa_release_fork_child for the child of a fork that ran no fork handlers
 * (core/owner.h): async-signal-safe, no call into tcmalloc. */
void fa_release_adopt(void);
/* Before a fork, once the background thread stopped for it: the policy
 * looks once more and returns what its windows call unused; the rest
 * stays (a program that forks per task would fault it in again after
 * every fork), and the next allocator call that checks starts the thread
 * again. */
void fa_release_before_fork(void);

#endif
